//! Loads against the limit of this machine: the same pages copied by `memcpy`, read by a plain
//! `pread` loop from the page cache (one thread, and as many threads as the tier has lanes),
//! read with `O_DIRECT` (the device, in rounds of its own), and got through the FILE tier on each engine (default
//! settings: checksums on, verified once per file version; buffered, in place). Rounds are
//! interleaved and medians quoted; every row reads as a fraction of `memcpy` and of the `pread`
//! loop on the tier's threads.
//!
//! `cargo bench -p tier-nixl --bench limit` (folder: `$KVTIER_BENCH_DIR` or a temp folder under
//! the system temp folder; rounds: `$KVTIER_BENCH_ROUNDS`, default 7). `$KVTIER_BENCH_ONLY`
//! (rows' names, as `tier nixl,pread 2 threads`) times those rows alone, for a profiler.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod common;

use common::Workload;
use tier_core::StorageTier;
use tier_nixl::{FileEngine, NixlFileConfig, NixlFileTier};

/// The tier's lanes (its default `staging_buffers`): the threads a big batch runs on.
const LANES: usize = 2;

/// A buffer aligned for `O_DIRECT`.
struct Aligned {
    ptr: *mut u8,
    layout: Layout,
}

impl Aligned {
    fn new(len: usize) -> Self {
        let layout = Layout::from_size_align(len, 4096).expect("a layout");
        // SAFETY: a non-zero size and a valid alignment.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "allocation failed");
        Self { ptr, layout }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds `layout.size()` zeroed bytes owned by self; `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

// SAFETY: plain memory owned by the value.
unsafe impl Send for Aligned {}

/// Runs `work` on each of `bufs` split over `threads` threads; the time it took.
fn on_threads<B: Send>(
    bufs: &mut [B],
    threads: usize,
    work: impl Fn(usize, &mut B) + Sync,
) -> Duration {
    let per = bufs.len().div_ceil(threads);
    let t = Instant::now();
    std::thread::scope(|s| {
        for (part, chunk) in bufs.chunks_mut(per).enumerate() {
            let work = &work;
            s.spawn(move || {
                for (i, buf) in chunk.iter_mut().enumerate() {
                    work(part * per + i, buf);
                }
            });
        }
    });
    t.elapsed()
}

fn memcpy(w: &Workload, bufs: &mut [Vec<u8>], threads: usize) -> Duration {
    on_threads(bufs, threads, |i, buf| buf.copy_from_slice(&w.data[i]))
}

fn pread(paths: &[PathBuf], bufs: &mut [Vec<u8>], threads: usize) -> Duration {
    on_threads(bufs, threads, |i, buf| {
        let file = File::open(&paths[i]).expect("a page file");
        file.read_exact_at(buf, 0).expect("a whole page");
    })
}

fn direct(paths: &[PathBuf], bufs: &mut [Aligned], threads: usize) -> Duration {
    on_threads(bufs, threads, |i, buf| {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&paths[i])
            .expect("a page file opened O_DIRECT");
        file.read_exact_at(buf.as_mut_slice(), 0)
            .expect("a whole page");
    })
}

async fn tier_get(tier: &NixlFileTier, w: &Workload, bufs: &mut [Vec<u8>]) -> Duration {
    let t = Instant::now();
    common::get_batches(tier, w, bufs).await;
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn run(root: &Path, page: usize, pages: usize, rounds: usize) {
    let w = Workload::new(page, page * pages, page as u64);
    let plain = root.join(format!("plain-{page}"));
    fs::create_dir_all(&plain).expect("a folder");
    let paths: Vec<PathBuf> = w.keys.iter().map(|k| plain.join(k.as_str())).collect();
    for (path, data) in paths.iter().zip(&w.data) {
        File::create(path)
            .and_then(|mut f| f.write_all(data))
            .expect("a plain page file");
    }
    let mut tiers = Vec::new();
    for (label, engine) in [
        ("tier nixl", FileEngine::Nixl),
        ("tier syscalls", FileEngine::Syscalls),
    ] {
        let mut config = NixlFileConfig::new([root.join(format!("{label}-{page}"))]);
        config.engine = engine;
        let tier = NixlFileTier::open(config).await.expect("the tier opens");
        common::put_batches(&tier, &w, pages).await;
        tiers.push((label, tier));
    }
    let mut bufs = common::buffers(&w, pages);
    let mut aligned: Vec<Aligned> = (0..pages).map(|_| Aligned::new(page)).collect();
    let only = std::env::var("KVTIER_BENCH_ONLY").ok();
    let timed = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|o| o == name))
    };
    let mut times: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    for _ in 0..rounds {
        let mut time = |name, work: &mut dyn FnMut() -> Duration| {
            if timed(name) {
                times.entry(name).or_default().push(work());
            }
        };
        time("memcpy 1 thread", &mut || memcpy(&w, &mut bufs, 1));
        time("memcpy 2 threads", &mut || memcpy(&w, &mut bufs, LANES));
        time("pread 1 thread", &mut || pread(&paths, &mut bufs, 1));
        time("pread 2 threads", &mut || pread(&paths, &mut bufs, LANES));
        for (label, tier) in &tiers {
            if timed(label) {
                let t = tier_get(tier, &w, &mut bufs).await;
                times.entry(label).or_default().push(t);
            }
        }
    }
    // Apart: on this VM, reads from the device in the same rounds slowed every other row
    // (the tier's gets to about 0.7x, the pread loop to 0.9x), even after a pause.
    for _ in 0..rounds {
        if timed("O_DIRECT 2 threads") {
            let t = direct(&paths, &mut aligned, LANES);
            times.entry("O_DIRECT 2 threads").or_default().push(t);
        }
    }
    let med: BTreeMap<&str, Duration> = times.into_iter().map(|(k, v)| (k, median(v))).collect();
    if only.is_some() {
        for (name, t) in &med {
            let rate = (page * pages) as f64 / t.as_secs_f64() / 1e9;
            println!("{:>5} KiB x {pages:<4} {name}: {rate:.2} GB/s", page >> 10);
        }
        return;
    }
    let bytes = (page * pages) as f64;
    for name in [
        "memcpy 1 thread",
        "memcpy 2 threads",
        "pread 1 thread",
        "pread 2 threads",
        "O_DIRECT 2 threads",
        "tier nixl",
        "tier syscalls",
    ] {
        let t = med[name].as_secs_f64();
        println!(
            "{:>5} KiB x {pages:<4} {name:<19} {:>6.2} GB/s  {:>5.2} x memcpy  {:>5.2} x pread on {LANES} threads",
            page >> 10,
            bytes / t / 1e9,
            med["memcpy 2 threads"].as_secs_f64() / t,
            med["pread 2 threads"].as_secs_f64() / t,
        );
    }
    for (_, tier) in &tiers {
        tier.clear().await.expect("cleared");
    }
    let _ = fs::remove_dir_all(&plain);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let tmp = tempfile::tempdir_in(
        std::env::var_os("KVTIER_BENCH_DIR").unwrap_or_else(|| std::env::temp_dir().into()),
    )
    .expect("a bench folder");
    let rounds = std::env::var("KVTIER_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(7);
    println!(
        "Loads against the limit: one batch of every page, medians of {rounds} interleaved rounds"
    );
    run(tmp.path(), 2 << 20, 32, rounds).await;
    run(tmp.path(), 512 << 10, 128, rounds).await;
}
