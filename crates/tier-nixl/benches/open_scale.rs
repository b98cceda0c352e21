//! What a folder of many pages costs to fill, to open and to hold: a NIXL FILE folder is filled
//! with N pages of 4 KiB through the tier (`access = "owner"`), printing the put rate of each
//! tenth of the fill beside the raw file I/O baseline of the same tenth (the same pages as
//! plain files, each written to a temp file and renamed into one of 256 bucket folders, in a
//! folder of their own: what the filesystem alone does as it fills); then, in interleaved rounds, it is reopened as an owner and as a sharer,
//! printing when `open` returned, when the first call (an `exists` of a stored page) was
//! answered, and when the work the open left to the background was done (the owner's index
//! built, the sharer's scan done), beside the raw file I/O baseline of the same process and
//! rounds: listing and `stat`ing every page file once (what an open that reads every page's
//! metadata pays before its first call). Also the resident memory per page held, owner and
//! sharer (first round: the process's RSS once the open's background work is done, less
//! before the open; and the same less what an open of an empty folder grew it by, a cost that
//! does not grow with the pages) and `exists` latency once loaded (p50/p99, one key per call). Last, the
//! full folder given a capacity a little above what it holds, owner and sharer: single-page
//! puts timed, those during which the tier evicted apart from those it did not (p50/p99), and
//! the folder's bytes at the end against its capacity (listed and summed).
//!
//! `cargo bench -p tier-nixl --bench open_scale` (pages: `$KVTIER_BENCH_PAGES`, default 100000;
//! rounds: `$KVTIER_BENCH_ROUNDS`, default 3; the owner's policy: `$KVTIER_BENCH_POLICY`, default
//! the tier's).

use std::path::Path;
use std::time::{Duration, Instant};

use tier_core::{Page, PageKey, StorageTier};
use tier_nixl::{FileAccess, FileEngine, NixlFileConfig, NixlFileTier, PAGE_TRAILER};

const PAGE: usize = 4096;
const BATCH: usize = 1024;

fn key(i: usize) -> PageKey {
    PageKey::new(format!("{i:064x}")).unwrap()
}

fn config(dir: &Path, access: FileAccess) -> NixlFileConfig {
    let mut config = NixlFileConfig::new([dir.to_path_buf()]);
    config.access = access;
    if let Ok(policy) = std::env::var("KVTIER_BENCH_POLICY") {
        config.policy = policy.parse().expect("KVTIER_BENCH_POLICY names a policy");
    }
    config.engine = FileEngine::Syscalls;
    config.transfer_timeout = Duration::from_secs(600);
    config
}

/// The process's resident set, the allocator's free memory handed back first: memory earlier
/// work freed (a dropped tier's index) would otherwise be counted out of the baseline and
/// reused unseen by the next.
fn rss_bytes() -> u64 {
    // SAFETY: malloc_trim only hands free memory of the allocator's arenas back to the system.
    unsafe {
        libc::malloc_trim(0);
    }
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p) as usize]
}

/// The baseline: every bucket listed and every page file `stat`ed once.
fn list_and_stat(dir: &Path) -> usize {
    let mut n = 0;
    for bucket in std::fs::read_dir(dir).unwrap().flatten() {
        if !bucket.path().is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(bucket.path()).unwrap().flatten() {
            if entry.metadata().is_ok_and(|m| m.is_file()) {
                n += 1;
            }
        }
    }
    n
}

/// The baseline of the fill: pages `range` as plain files, each written to a temp file and
/// renamed into its bucket folder (by the key's first two hex digits of a hash).
fn plain_files(dir: &Path, range: std::ops::Range<usize>) {
    for i in range {
        let k = key(i);
        let bucket = format!("{:02x}", tier_nixl::route_hash(k.as_str().as_bytes()) as u8);
        let path = dir.join(bucket).join(k.as_str());
        let temp = path.with_extension("tmp");
        std::fs::write(&temp, vec![i as u8; PAGE]).unwrap();
        std::fs::rename(&temp, &path).unwrap();
    }
}

/// The bytes of every page file in `dir` and the files counted.
fn folder_bytes(dir: &Path) -> (u64, usize) {
    let (mut bytes, mut n) = (0, 0);
    for bucket in std::fs::read_dir(dir).unwrap().flatten() {
        if !bucket.path().is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(bucket.path()).unwrap().flatten() {
            if let Some(m) = entry.metadata().ok().filter(|m| m.is_file()) {
                bytes += m.len();
                n += 1;
            }
        }
    }
    (bytes, n)
}

/// Puts `extra` single pages, from key `next` on, into the full folder `dir` (of `n` pages)
/// opened for `access` with room for `n + extra / 2` pages: the first half fits, the second
/// evicts. Prints the latency of the puts during which the tier evicted and of the others, and
/// the folder's bytes at the end against the capacity.
async fn puts_at_capacity(dir: &Path, access: FileAccess, n: usize, next: usize, extra: usize) {
    let mut config = config(dir, access);
    // An owner counts pages' bytes; shared folders count files' (page and trailer).
    let per_page = match access {
        FileAccess::Shared => (PAGE + PAGE_TRAILER as usize) as u64,
        _ => PAGE as u64,
    };
    let capacity = (n + extra / 2) as u64 * per_page;
    config.capacity_bytes = Some(capacity);
    let tier = NixlFileTier::open(config).await.unwrap();
    tier.opened().await;
    let (mut evicting, mut plain) = (Vec::new(), Vec::new());
    for i in next..next + extra {
        let page = [Page::new(key(i), vec![i as u8; PAGE])];
        let before = tier.stats().evictions;
        let started = Instant::now();
        assert!(tier.put(&page).await.iter().all(Result::is_ok));
        let took = started.elapsed().as_secs_f64() * 1e3;
        match tier.stats().evictions > before {
            true => evicting.push(took),
            false => plain.push(took),
        }
    }
    drop(tier);
    let (bytes, files) = folder_bytes(dir);
    let ms = |v: &[f64], p: f64| {
        if v.is_empty() {
            "-".to_string()
        } else {
            format!("{:.2}", percentile(v.to_vec(), p))
        }
    };
    println!(
        "| {access:?} | {} | {} / {} ms | {} | {} / {} ms | {:.4} | {files} |",
        plain.len(),
        ms(&plain, 0.5),
        ms(&plain, 0.99),
        evicting.len(),
        ms(&evicting, 0.5),
        ms(&evicting, 0.99),
        bytes as f64 / capacity as f64,
    );
}

/// Opens `dir` for `access`: seconds until `open` returned, the first call was answered, and
/// the open's background work was done; and the RSS grown meanwhile.
async fn reopen(dir: &Path, access: FileAccess, probe: &PageKey) -> ([f64; 3], u64) {
    let rss = rss_bytes();
    let started = Instant::now();
    let tier = NixlFileTier::open(config(dir, access)).await.unwrap();
    let opened = started.elapsed().as_secs_f64();
    assert_eq!(tier.exists(std::slice::from_ref(probe)).await.unwrap(), 1);
    let first = started.elapsed().as_secs_f64();
    tier.opened().await;
    let done = started.elapsed().as_secs_f64();
    let grown = rss_bytes().saturating_sub(rss);
    drop(tier);
    ([opened, first, done], grown)
}

/// The RSS an open of an empty folder for `access` grew by, once its background work was done.
async fn open_empty(access: FileAccess) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let rss = rss_bytes();
    let tier = NixlFileTier::open(config(dir.path(), access))
        .await
        .unwrap();
    assert_eq!(tier.exists(&[key(0)]).await.unwrap(), 0);
    tier.opened().await;
    let grown = rss_bytes().saturating_sub(rss);
    drop(tier);
    grown
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("KVTIER_BENCH_PAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let rounds: usize = std::env::var("KVTIER_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("folder");
    let tier = NixlFileTier::open(config(&dir, FileAccess::Owner))
        .await
        .unwrap();
    println!("{n} pages of {PAGE} B put in batches of {BATCH} into one owned folder\n");
    println!("| tenth of the fill | pages/s | / first tenth | plain files pages/s | / first tenth | kvtier / plain |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let plain = tmp.path().join("plain");
    for b in 0..256 {
        std::fs::create_dir_all(plain.join(format!("{b:02x}"))).unwrap();
    }
    let tenth = n.div_ceil(10);
    let (mut first_rate, mut first_plain) = (0.0, 0.0);
    for t in 0..10 {
        let (from, to) = (t * tenth, ((t + 1) * tenth).min(n));
        let started = Instant::now();
        for first in (from..to).step_by(BATCH) {
            let batch: Vec<_> = (first..(first + BATCH).min(to))
                .map(|i| Page::new(key(i), vec![i as u8; PAGE]))
                .collect();
            assert!(tier.put(&batch).await.iter().all(Result::is_ok));
        }
        let rate = (to - from) as f64 / started.elapsed().as_secs_f64();
        let started = Instant::now();
        plain_files(&plain, from..to);
        let plain_rate = (to - from) as f64 / started.elapsed().as_secs_f64();
        if t == 0 {
            (first_rate, first_plain) = (rate, plain_rate);
        }
        println!(
            "| {} | {rate:.0} | {:.2}x | {plain_rate:.0} | {:.2}x | {:.2}x |",
            t + 1,
            rate / first_rate,
            plain_rate / first_plain,
            rate / plain_rate
        );
    }
    drop(tier);
    std::fs::remove_dir_all(&plain).unwrap();
    // SAFETY: plain syscall: no dirty pages of the fill compete with the timed opens.
    unsafe { libc::sync() };

    let probe = key(n / 2);
    let mut times = [Vec::new(), Vec::new()];
    let mut baseline = Vec::new();
    // Per access, in the first round: the sharer's first, before the owner's index has grown
    // the heap (an allocator keeps what it freed).
    let mut rss_per_page = [None, None];
    // What an open costs whatever the folder holds: an empty folder's, here, after the fill
    // did the process's one-time setup.
    let mut rss_empty = [0u64; 2];
    for (i, access) in [(1, FileAccess::Shared), (0, FileAccess::Owner)] {
        rss_empty[i] = open_empty(access).await;
    }
    for _ in 0..rounds {
        for (i, access) in [(1, FileAccess::Shared), (0, FileAccess::Owner)] {
            let (t, grown) = reopen(&dir, access, &probe).await;
            rss_per_page[i].get_or_insert(grown as f64 / n as f64);
            times[i].push(t);
        }
        let started = Instant::now();
        assert_eq!(list_and_stat(&dir), n);
        baseline.push(started.elapsed().as_secs_f64());
    }
    let base = median(baseline);
    println!(
        "\nreopening it, medians of {rounds} interleaved rounds (seconds since the open began)\n"
    );
    println!("| access | open returned | first call answered | background work done | list + stat every file (baseline) | first call / baseline |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (i, name) in ["owner", "shared"].iter().enumerate() {
        let col = |c: usize| median(times[i].iter().map(|t| t[c]).collect());
        println!(
            "| {name} | {:.3} | {:.3} | {:.2} | {base:.2} | {:.3}x |",
            col(0),
            col(1),
            col(2),
            col(1) / base
        );
    }
    let (owner, shared) = (
        rss_per_page[0].unwrap_or(0.0),
        rss_per_page[1].unwrap_or(0.0),
    );
    println!(
        "\nRSS per page held (first round, background work done): owner {owner:.0} B, shared \
         {shared:.0} B; less an empty folder's open (owner {:.1} MiB, shared {:.1} MiB): owner \
         {:.0} B, shared {:.0} B",
        rss_empty[0] as f64 / (1 << 20) as f64,
        rss_empty[1] as f64 / (1 << 20) as f64,
        owner - rss_empty[0] as f64 / n as f64,
        shared - rss_empty[1] as f64 / n as f64,
    );

    for access in [FileAccess::Owner, FileAccess::Shared] {
        let tier = NixlFileTier::open(config(&dir, access)).await.unwrap();
        tier.opened().await;
        let mut lat = Vec::new();
        for i in 0..2000 {
            let k = key((i * 7919) % n);
            let started = Instant::now();
            assert_eq!(tier.exists(std::slice::from_ref(&k)).await.unwrap(), 1);
            lat.push(started.elapsed().as_secs_f64() * 1e6);
        }
        println!(
            "exists, {access:?}, one key per call: p50 {:.1} us, p99 {:.1} us",
            percentile(lat.clone(), 0.5),
            percentile(lat, 0.99)
        );
    }

    let extra = (n / 20).clamp(1_000, 20_000);
    println!(
        "\n{extra} single-page puts into the full folder given room for {} pages more: \
         the first half fits, the second evicts\n",
        extra / 2
    );
    println!("| access | puts without eviction | p50 / p99 | puts that evicted | p50 / p99 | folder bytes / capacity at the end | page files |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    // Each access starts from the folder as the one before left it: n pages, any over the
    // capacity evicted by the owner first.
    puts_at_capacity(&dir, FileAccess::Owner, n, n, extra).await;
    let (_, held) = folder_bytes(&dir);
    puts_at_capacity(&dir, FileAccess::Shared, held, n + extra, extra).await;
}
