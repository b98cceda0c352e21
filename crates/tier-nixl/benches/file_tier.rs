//! NIXL FILE tier throughput in path and fd mode beside plain `std::fs` file-per-page write and
//! read of the same pages on the same folder, measured in one run, interleaved, medians quoted.
//!
//! `cargo bench -p tier-nixl --bench file_tier` (folder: `$KVTIER_BENCH_DIR` or a temp folder
//! under the system temp folder; rounds: `$KVTIER_BENCH_ROUNDS`, default 5).

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;

use common::Workload;
use tier_core::StorageTier;
use tier_nixl::{BoundedIo, NixlFileConfig, NixlFileTier, PathModeChoice};

const BATCH: usize = 128;

fn sync_disk() {
    // SAFETY: plain syscall, flushes dirty pages so each write run starts clean.
    unsafe { libc::sync() };
}

/// Plain baseline: one file per page in 256 bucket folders, like the tier.
fn plain_paths(root: &Path, w: &Workload) -> Vec<PathBuf> {
    for b in 0..256 {
        fs::create_dir_all(root.join(format!("{b:02x}"))).unwrap();
    }
    w.keys
        .iter()
        .enumerate()
        .map(|(i, k)| root.join(format!("{:02x}", i % 256)).join(k.as_str()))
        .collect()
}

fn plain_write(paths: &[PathBuf], w: &Workload) -> Duration {
    sync_disk();
    let t = Instant::now();
    for (p, d) in paths.iter().zip(&w.data) {
        let mut f = fs::File::create(p).unwrap();
        f.write_all(d).unwrap();
    }
    t.elapsed()
}

fn plain_read(paths: &[PathBuf], w: &Workload) -> Duration {
    let mut bufs = vec![vec![0u8; w.page]; BATCH];
    let t = Instant::now();
    for (i, p) in paths.iter().enumerate() {
        let mut f = fs::File::open(p).unwrap();
        f.read_exact(&mut bufs[i % BATCH]).unwrap();
    }
    let el = t.elapsed();
    assert_eq!(
        bufs[(paths.len() - 1) % BATCH][..],
        w.data[paths.len() - 1][..]
    );
    el
}

async fn tier_put(tier: &NixlFileTier, w: &Workload) -> Duration {
    sync_disk();
    let t = Instant::now();
    common::put_batches(tier, w, BATCH).await;
    t.elapsed()
}

async fn tier_get(tier: &NixlFileTier, w: &Workload) -> Duration {
    let mut bufs = common::buffers(w, BATCH);
    let t = Instant::now();
    common::get_batches(tier, w, &mut bufs).await;
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Each round writes fresh files (deleting just before creating would time ext4's
/// recently-deleted inode checks, not the writers), then reads back what it wrote.
async fn run(
    root: &Path,
    page: usize,
    total: usize,
    rounds: usize,
    params: &BTreeMap<String, String>,
) {
    let plain_dir = root.join(format!("plain-{page}"));
    let mut tiers = Vec::new();
    // "bounded": path mode with bounded I/O (reads through staging, as on a network mount).
    for (label, mode, bounded_io) in [
        ("path", PathModeChoice::On, BoundedIo::Off),
        ("fd", PathModeChoice::Off, BoundedIo::Off),
        ("bounded", PathModeChoice::On, BoundedIo::On),
    ] {
        let mut config = NixlFileConfig::new([root.join(format!("{label}-{page}"))]);
        config.path_mode = mode;
        config.bounded_io = bounded_io;
        config.plugin_params = params.clone();
        if let Some(n) = std::env::var("KVTIER_BENCH_INFLIGHT")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            config.staging_buffers = n;
        }
        tiers.push((label, NixlFileTier::open(config).await.unwrap()));
    }
    let mut times: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
    let mut n = 0;
    for round in 0..rounds as u64 {
        let plain = Workload::new(page, total, round * 3);
        n = plain.keys.len();
        let paths = plain_paths(&plain_dir, &plain);
        let per_tier: Vec<Workload> = (1..=tiers.len() as u64)
            .map(|v| Workload::new(page, total, round * 3 + v))
            .collect();
        times
            .entry("plain write".into())
            .or_default()
            .push(plain_write(&paths, &plain));
        for ((label, tier), w) in tiers.iter().zip(&per_tier) {
            times
                .entry(format!("{label} put"))
                .or_default()
                .push(tier_put(tier, w).await);
        }
        times
            .entry("plain read".into())
            .or_default()
            .push(plain_read(&paths, &plain));
        for ((label, tier), w) in tiers.iter().zip(&per_tier) {
            times
                .entry(format!("{label} get"))
                .or_default()
                .push(tier_get(tier, w).await);
        }
    }
    let med: BTreeMap<String, Duration> = times.into_iter().map(|(k, v)| (k, median(v))).collect();
    let row = |name: &str, base: &str| {
        let t = med[name];
        println!(
            "{:>6} KiB  {name:<12} {:>9.0} pages/s {:>6.2} GB/s  {:>5.2} x {base}",
            page >> 10,
            n as f64 / t.as_secs_f64(),
            (n * page) as f64 / t.as_secs_f64() / 1e9,
            med[base].as_secs_f64() / t.as_secs_f64()
        );
    };
    for name in ["plain write", "path put", "fd put", "bounded put"] {
        row(name, "plain write");
    }
    for name in ["plain read", "path get", "fd get", "bounded get"] {
        row(name, "plain read");
    }
    println!(
        "{:>6} KiB  path put / fd put = {:.2}",
        page >> 10,
        med["fd put"].as_secs_f64() / med["path put"].as_secs_f64()
    );
    let _ = fs::remove_dir_all(&plain_dir);
    for (_, tier) in &tiers {
        tier.clear().await.unwrap();
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let tmp = tempfile::tempdir_in(
        std::env::var_os("KVTIER_BENCH_DIR").unwrap_or_else(|| std::env::temp_dir().into()),
    )
    .unwrap();
    let rounds = std::env::var("KVTIER_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let mut params = BTreeMap::new();
    if let Ok(spec) = std::env::var("KVTIER_BENCH_POSIX_PARAMS") {
        for kv in spec.split(',').filter(|s| !s.is_empty()) {
            if let Some((k, v)) = kv.split_once('=') {
                params.insert(k.to_string(), v.to_string());
            }
        }
    }
    println!("NIXL FILE tier vs plain std::fs, {BATCH}-page batches, medians of {rounds} interleaved rounds, POSIX params {params:?}");
    run(tmp.path(), 64 << 10, 256 << 20, rounds, &params).await;
    run(tmp.path(), 2 << 20, 256 << 20, rounds, &params).await;
}
