//! Builds a DRAM tier, stores and reads pages, and prints what happened.
//!
//! `cargo run --release --example dram_tier`

use std::time::Instant;

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier};
use tier_mem::{MemTier, MemTierConfig};

const PAGE_BYTES: usize = 64 << 10;
const CAPACITY: u64 = 64 << 20;
const PAGES: usize = 1536;
const BATCH: usize = 128;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tier = MemTier::open(MemTierConfig {
        name: "dram".into(),
        ..MemTierConfig::new(CAPACITY)
    })?;
    let keys: Vec<PageKey> = (0..PAGES)
        .map(|i| {
            PageKey::new(format!(
                "{:064x}",
                (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ))
        })
        .collect::<Result<_, _>>()?;

    let started = Instant::now();
    for chunk in keys.chunks(BATCH) {
        let pages: Vec<Page<'static>> = chunk
            .iter()
            .map(|k| Page::new(k.clone(), vec![k.as_bytes_hint(); PAGE_BYTES]))
            .collect();
        for result in tier.put(&pages).await {
            result?;
        }
    }
    let put_time = started.elapsed();

    let started = Instant::now();
    let (mut hits, mut exact) = (0, 0);
    let mut bufs = vec![vec![0u8; PAGE_BYTES]; BATCH];
    for chunk in keys.chunks(BATCH) {
        let mut slots: Vec<ReadSlot<'_>> = chunk
            .iter()
            .zip(bufs.iter_mut())
            .map(|(k, b)| ReadSlot::new(k.clone(), b))
            .collect();
        let results = tier.get(&mut slots).await;
        for (slot, result) in slots.iter().zip(results) {
            if result? == Lookup::Hit {
                hits += 1;
                let hint = slot.key.as_bytes_hint();
                exact += usize::from(slot.buf.regions().flatten().all(|b| *b == hint));
            }
        }
    }
    let get_time = started.elapsed();

    let info = tier.info();
    let stats = tier.stats();
    println!(
        "tier {} ({}), capacity {} MiB",
        info.name,
        info.kind,
        CAPACITY >> 20
    );
    println!(
        "stored {PAGES} pages of {} KiB in {put_time:.2?}; read them back in {get_time:.2?}",
        PAGE_BYTES >> 10
    );
    println!("hits {hits}, byte-exact {exact}, misses {}", PAGES - hits);
    println!(
        "stats: puts {} hits {} misses {} evictions {} errors {} resident {} MiB",
        stats.puts,
        stats.hits,
        stats.misses,
        stats.evictions,
        stats.errors,
        tier.resident_bytes().await >> 20
    );
    println!(
        "prefix of the first 256 keys still cached: {}",
        tier.exists(&keys[..256]).await?
    );
    Ok(())
}

/// A byte derived from the key, so each page's content is checkable.
trait ByteHint {
    fn as_bytes_hint(&self) -> u8;
}

impl ByteHint for PageKey {
    fn as_bytes_hint(&self) -> u8 {
        self.as_str()
            .bytes()
            .fold(0u8, |h, b| h.wrapping_mul(31).wrapping_add(b))
    }
}
