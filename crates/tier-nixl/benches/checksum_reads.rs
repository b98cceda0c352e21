//! What page checksums cost a batch read: each engine (NIXL, syscalls) with CRC-32C verified
//! once per file version (the default: repeat reads of unchanged files skip it) and on every
//! read, and with the keyed MAC of `integrity` (BLAKE3, checksums off under it), beside itself
//! with checksums off, on the same page size and batch (32 pages of 2 MiB by default,
//! LMCache's L2 batch), from the page cache, rounds interleaved, medians quoted.
//!
//! `cargo bench -p tier-nixl --bench checksum_reads` (rounds: `$KVTIER_BENCH_ROUNDS`, default
//! 101; pages: `$KVTIER_BENCH_PAGES`, default 32; page size in KiB: `$KVTIER_BENCH_PAGE_KIB`,
//! default 2048; `KVTIER_BENCH_FROM_DISK=1` drops the pages' files from the page cache before
//! every read, so reads come from the disk).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::Workload;
use tier_core::StorageTier;
use tier_hierarchy::sealed::Sealed;
use tier_nixl::{FileEngine, NixlFileConfig, NixlFileTier, PageChecksum, VerifyReads};

/// Drops `tier`'s files of `w`'s pages from the page cache (they are clean: written, synced).
fn evict(tier: &NixlFileTier, w: &Workload) {
    use std::os::unix::io::AsRawFd;
    for key in &w.keys {
        let file = std::fs::File::open(tier.page_path(key).unwrap()).unwrap();
        // SAFETY: plain syscall on an open fd.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds = env("KVTIER_BENCH_ROUNDS", 101);
    let pages = env("KVTIER_BENCH_PAGES", 32);
    let page = env("KVTIER_BENCH_PAGE_KIB", 2048) << 10;
    let tmp = tempfile::tempdir().unwrap();
    let w = Workload::new(page, pages * page, 1);
    // (name, the file tier, what reads go through: the tier, or a sealed tier over it).
    let mut tiers: Vec<(String, Arc<NixlFileTier>, Arc<dyn StorageTier>)> = Vec::new();
    for engine in [FileEngine::Nixl, FileEngine::Syscalls] {
        for (what, check, verify, sealed) in [
            ("crc32c", PageChecksum::Crc32c, VerifyReads::Once, false),
            (
                "crc32c-every",
                PageChecksum::Crc32c,
                VerifyReads::EveryRead,
                false,
            ),
            ("mac", PageChecksum::Off, VerifyReads::Once, true),
            ("off", PageChecksum::Off, VerifyReads::Once, false),
        ] {
            let name = format!("{engine:?} {what}").to_lowercase();
            let mut config = NixlFileConfig::new([tmp.path().join(name.replace(' ', "-"))]);
            config.engine = engine;
            config.page_checksum = check;
            config.verify = verify;
            let tier = Arc::new(NixlFileTier::open(config).await.unwrap());
            let reader: Arc<dyn StorageTier> = if sealed {
                Arc::new(Sealed::new(
                    tier.clone(),
                    *b"kvtier bench MAC key, 32 bytes!!",
                ))
            } else {
                tier.clone()
            };
            common::put_batches(reader.as_ref(), &w, pages).await;
            tiers.push((name, tier, reader));
        }
    }
    let from_disk = env("KVTIER_BENCH_FROM_DISK", 0) == 1;
    if from_disk {
        // SAFETY: plain syscall: writes the pages out, so dropping them from the cache works.
        unsafe { libc::sync() };
    }
    let mut bufs = common::buffers(&w, pages);
    let mut times: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    for _ in 0..rounds {
        for (name, tier, reader) in &tiers {
            if from_disk {
                evict(tier, &w);
            }
            let t = Instant::now();
            common::get_batches(reader.as_ref(), &w, &mut bufs).await;
            times.entry(name).or_default().push(t.elapsed());
        }
    }
    let med: BTreeMap<&str, Duration> = times
        .into_iter()
        .map(|(k, mut v)| {
            v.sort();
            (k, v[v.len() / 2])
        })
        .collect();
    println!(
        "Batch reads of {pages} pages of {} KiB from the {}, medians of {rounds} interleaved rounds",
        page >> 10,
        if from_disk { "disk" } else { "page cache" }
    );
    for (name, _, _) in &tiers {
        let t = med[name.as_str()];
        let engine = name.split(' ').next().unwrap_or_default();
        let off = med[format!("{engine} off").as_str()];
        println!(
            "{name:<18} {:>8.0} MiB/s  {:.2} x checksums off",
            (pages * page) as f64 / t.as_secs_f64() / (1 << 20) as f64,
            off.as_secs_f64() / t.as_secs_f64()
        );
    }
}
