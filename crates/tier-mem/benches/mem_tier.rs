//! DRAM tier throughput beside memcpy of the same bytes, and resident memory of a full tier.
//!
//! `cargo bench -p tier-mem`

use std::hint::black_box;
use std::time::{Duration, Instant};

use tier_core::{Bytes, Page, PageKey, ReadSlot, StorageTier};
use tier_mem::{MemTier, MemTierConfig};

const BATCH: usize = 128;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn keys(n: usize) -> Vec<PageKey> {
    (0..n)
        .map(|i| {
            PageKey::new(format!(
                "{:064x}",
                (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ))
            .unwrap()
        })
        .collect()
}

fn gbps(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

async fn rss_of_full_tier() {
    const CAPACITY: u64 = 1 << 30;
    const PAGE: usize = 64 << 10;
    let before = rss_bytes();
    let tier = MemTier::open(MemTierConfig::new(CAPACITY)).unwrap();
    // Write 1.25x the capacity so the tier is full and evicting.
    let ks = keys((CAPACITY as usize / PAGE) * 5 / 4);
    for chunk in ks.chunks(BATCH) {
        let pages: Vec<Page<'static>> = chunk
            .iter()
            .map(|k| Page::new(k.clone(), vec![k.as_str().as_bytes()[5]; PAGE]))
            .collect();
        tier.put(&pages).await;
    }
    let resident = tier.resident_bytes().await;
    let after = rss_bytes();
    println!(
        "rss: 1 GiB tier of 64 KiB pages holds {:.3} GiB; process RSS grew {:.3} GiB (total {:.3} GiB); overhead {:.1}%",
        resident as f64 / (1u64 << 30) as f64,
        (after - before) as f64 / (1u64 << 30) as f64,
        after as f64 / (1u64 << 30) as f64,
        ((after - before) as f64 / resident as f64 - 1.0) * 100.0
    );
}

async fn throughput(page: usize, total: usize) {
    let n = total / page;
    let ks = keys(n);
    let sources: Vec<Bytes> = ks
        .iter()
        .map(|k| Bytes::from(vec![k.as_str().as_bytes()[7]; page]))
        .collect();
    let tier = MemTier::open(MemTierConfig::new(2 * total as u64)).unwrap();
    let mut dest = vec![vec![0u8; page]; BATCH];

    // Baseline: copy the same source pages into the same destination buffers.
    let t = Instant::now();
    for (i, src) in sources.iter().enumerate() {
        dest[i % BATCH].copy_from_slice(src);
        black_box(&dest[i % BATCH]);
    }
    let memcpy = t.elapsed();

    // Baseline for a copying put: copy every page into a fresh allocation that stays alive,
    // as a cache keeps it (first-touch page faults included).
    let t = Instant::now();
    let kept: Vec<Bytes> = sources.iter().map(|s| Bytes::copy_from_slice(s)).collect();
    let alloc_copy = t.elapsed();
    drop(black_box(kept));

    // put, keeping the caller's bytes (zero-copy).
    let t = Instant::now();
    for (chunk, data) in ks.chunks(BATCH).zip(sources.chunks(BATCH)) {
        let pages: Vec<Page<'static>> = chunk
            .iter()
            .zip(data)
            .map(|(k, d)| Page::new(k.clone(), d.clone()))
            .collect();
        tier.put(&pages).await;
    }
    let put = t.elapsed();
    tier.clear().await.unwrap();

    // put from a borrowed buffer: one copy into a fresh allocation.
    let t = Instant::now();
    for (chunk, data) in ks.chunks(BATCH).zip(sources.chunks(BATCH)) {
        let pages: Vec<Page<'static>> = chunk
            .iter()
            .zip(data)
            .map(|(k, d)| Page::new(k.clone(), Bytes::copy_from_slice(d)))
            .collect();
        tier.put(&pages).await;
    }
    let put_copy = t.elapsed();

    let t = Instant::now();
    for chunk in ks.chunks(BATCH) {
        let mut slots: Vec<ReadSlot<'_>> = chunk
            .iter()
            .zip(dest.iter_mut())
            .map(|(k, b)| ReadSlot::new(k.clone(), b))
            .collect();
        black_box(tier.get(&mut slots).await);
    }
    let get = t.elapsed();
    assert_eq!(tier.stats().hits as usize, n, "every page read back");

    let bytes = n * page;
    let line = |name: &str, t: Duration, base: Duration, base_name: &str| {
        println!(
            "{:>5} KiB  {name:<22} {:>9.0} pages/s {:>8.2} GB/s  {:>6.2} x {base_name}",
            page >> 10,
            n as f64 / t.as_secs_f64(),
            gbps(bytes, t),
            base.as_secs_f64() / t.as_secs_f64()
        );
    };
    line("memcpy (baseline)", memcpy, memcpy, "memcpy");
    line(
        "alloc+copy (baseline)",
        alloc_copy,
        alloc_copy,
        "alloc+copy",
    );
    line("get into buffer", get, memcpy, "memcpy");
    line("put (shared bytes)", put, memcpy, "memcpy");
    line("put (copy + insert)", put_copy, alloc_copy, "alloc+copy");
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    rss_of_full_tier().await;
    throughput(64 << 10, 1 << 30).await;
    throughput(2 << 20, 1 << 30).await;
}
