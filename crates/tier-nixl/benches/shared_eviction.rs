//! What a put costs in a full shared folder as the folder grows: a NIXL FILE tier with
//! `access = "shared"` and a capacity of N pages is filled with N pages of 4 KiB (untimed), then
//! more pages are put in batches of 64, each batch making room by eviction. Beside it, in the
//! same process and rounds interleaved, the raw file I/O baseline: plain files of the same
//! pages (write a temp file, rename it into place) in a folder of their own, nothing evicted.
//! Prints, per folder size, the medians (pages/s), their ratio, the slowest batch of each (the
//! puts that evict), and the page files examined per victim: what one put pays for an eviction
//! does not grow with N.
//!
//! `cargo bench -p tier-nixl --bench shared_eviction` (folder sizes: `$KVTIER_BENCH_SIZES`,
//! default `10000,100000`; rounds: `$KVTIER_BENCH_ROUNDS`, default 400, so that every size evicts
//! in several runs).

use std::path::Path;
use std::time::{Duration, Instant};

use tier_core::{Page, PageKey, StorageTier};
use tier_nixl::{FileAccess, FileEngine, NixlFileConfig, NixlFileTier, PAGE_TRAILER};

const PAGE: usize = 4096;
const BATCH: usize = 64;

fn key(i: usize) -> PageKey {
    PageKey::new(format!("page-{i:012}")).unwrap()
}

fn pages(first: usize, n: usize) -> Vec<Page<'static>> {
    (first..first + n)
        .map(|i| Page::new(key(i), vec![i as u8; PAGE]))
        .collect()
}

/// The baseline: each page written to a temp file and renamed into place.
fn plain_files(dir: &Path, pages: &[Page<'_>]) {
    for page in pages {
        let path = dir.join(page.key.as_str());
        let temp = dir.join(format!(".tmp-{}", page.key.as_str()));
        std::fs::write(&temp, page.data.contiguous()).unwrap();
        std::fs::rename(&temp, &path).unwrap();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sizes: Vec<usize> = std::env::var("KVTIER_BENCH_SIZES")
        .unwrap_or_else(|_| "10000,100000".into())
        .split(',')
        .map(|s| s.trim().parse().expect("a folder size"))
        .collect();
    let rounds: usize = std::env::var("KVTIER_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    println!(
        "pages of {PAGE} B put in batches of {BATCH} into a full shared folder; medians of {rounds} interleaved rounds\n"
    );
    println!("| pages in the folder | kvtier pages/s | plain files pages/s | ratio | slowest batch: kvtier | plain files | examined per victim |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for n in sizes {
        let tmp = tempfile::tempdir().unwrap();
        let plain = tmp.path().join("plain");
        std::fs::create_dir(&plain).unwrap();
        let mut config = NixlFileConfig::new([tmp.path().join("shared")]);
        config.access = FileAccess::Shared;
        config.engine = FileEngine::Syscalls;
        let file_len = (PAGE + PAGE_TRAILER as usize) as u64;
        config.capacity_bytes = Some(n as u64 * file_len);
        config.transfer_timeout = Duration::from_secs(600);
        let tier = NixlFileTier::open(config).await.unwrap();
        let started = Instant::now();
        for first in (0..n).step_by(1024) {
            let batch = pages(first, 1024.min(n - first));
            assert!(tier.put(&batch).await.iter().all(Result::is_ok));
        }
        let filled = started.elapsed();
        // SAFETY: plain syscall. No dirty pages of the fill compete with the timed puts.
        unsafe { libc::sync() };
        let before = tier.fleet_stats().unwrap();
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        let mut next = n;
        for _ in 0..rounds {
            let batch = pages(next, BATCH);
            next += BATCH;
            let t = Instant::now();
            assert!(tier.put(&batch).await.iter().all(Result::is_ok));
            ours.push(BATCH as f64 / t.elapsed().as_secs_f64());
            let t = Instant::now();
            plain_files(&plain, &batch);
            theirs.push(BATCH as f64 / t.elapsed().as_secs_f64());
        }
        let after = tier.fleet_stats().unwrap();
        let victims = (after.evicted + after.spared) - (before.evicted + before.spared);
        let examined = after.examined - before.examined;
        let slowest = |v: &[f64]| BATCH as f64 / v.iter().copied().fold(f64::MAX, f64::min) * 1e3;
        let (our_slowest, their_slowest) = (slowest(&ours), slowest(&theirs));
        let (ours, theirs) = (median(ours), median(theirs));
        println!(
            "| {n} | {ours:.0} | {theirs:.0} | {:.2}x | {our_slowest:.1} ms | {their_slowest:.1} ms | {:.1} |",
            ours / theirs,
            examined as f64 / victims.max(1) as f64
        );
        eprintln!("(filled {n} pages in {:.1} s)", filled.as_secs_f64());
    }
}
