//! The fleet's soak: four processes on two GlusterFS clients, through restarts (one of them a
//! SIGKILL), threads, clears and mixed checksum settings; the usage file must end within one
//! eviction step of the bytes the folders hold.

use std::path::Path;
use std::time::Duration;

use crate::watch::*;
use crate::worker::*;

const WORKERS: u64 = 4;
const LANES: u64 = 2;
const ROUNDS: u64 = 40;
const WAVES: u64 = 3;

/// Three waves of four workers (two through each of two GlusterFS mounts of one volume), each
/// worker two lanes on threads of their own; workers 1 and 3 write without checksums, worker
/// 0 clears the folders now and then in the second wave, and worker 3 is killed (SIGKILL) in
/// the middle of it. Every hit is byte-exact, no call fails, and once the last wave ended the
/// usage file (read past the client's caches) is within one eviction step of the bytes the
/// folders hold (printed).
#[test]
fn a_soak_of_restarts_threads_clears_and_mixed_checksums_keeps_the_usage_count() {
    let (a, b) = tier_tests::gluster::mounts().folder("soak");
    let written = (WORKERS * LANES * ROUNDS * 4 + COMMON) * PAGE as u64;
    let capacity = written / 3;
    let step = capacity - (capacity as f64 * LOW_WATERMARK) as u64;
    let mut totals = std::collections::HashMap::<String, u64>::new();
    for wave in 0..WAVES {
        let workers: Vec<Worker> = (0..WORKERS)
            .map(|id| {
                let dir = if id % 2 == 0 { &a } else { &b };
                let mut env = vec![("KVTIER_FLEET_LANES", LANES.to_string())];
                if id % 2 == 1 {
                    env.push(("KVTIER_FLEET_CHECKSUM", "off".into()));
                }
                if wave == 1 && id == 0 {
                    env.push(("KVTIER_FLEET_CLEAR_EVERY", "15".into()));
                }
                let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
                spawn_worker_on(dir, &env, id, WORKERS, ROUNDS, capacity, 3_000)
            })
            .collect();
        for w in &workers {
            w.ready();
        }
        let mut results = Vec::new();
        for (id, mut w) in workers.into_iter().enumerate() {
            if wave == 1 && id == 3 {
                std::thread::sleep(Duration::from_millis(1500));
                kill(&mut w.child);
                continue;
            }
            results.push(w.finish());
        }
        let total = |name: &str| results.iter().map(|r| r.count(name)).sum::<u64>();
        assert_eq!(
            total("bad_hits"),
            0,
            "every hit is byte-exact: {}",
            failures(&results)
        );
        assert_eq!(
            total("get_errors") + total("put_errors") + total("clear_errors"),
            0,
            "no call failed: {}",
            failures(&results)
        );
        for r in &results {
            for (k, v) in &r.counts {
                *totals.entry(k.clone()).or_default() += v;
            }
        }
    }
    let usage = usage_file(&a.join("a").join(".kvtier.usage"));
    let (bytes, temps) = folder_bytes(&a);
    let apart = usage.abs_diff(bytes);
    let page = PAGE as u64 + tier_nixl::PAGE_TRAILER;
    let total = |name: &str| totals.get(name).copied().unwrap_or(0);
    println!(
        "soak, 4 processes x 2 threads on two GlusterFS clients, {WAVES} waves (one SIGKILL), \
         {} clears, half without checksums: {} puts, {} hits ({} of others), {} evictions; \
         usage file {usage} bytes, folders {bytes} bytes ({} temp files): {apart} bytes apart \
         ({:.1} pages; an eviction step is {step} bytes)",
        total("clears"),
        total("puts"),
        total("hits_checked"),
        total("hits_of_others"),
        total("evicted"),
        temps.len(),
        apart as f64 / page as f64,
    );
    assert!(total("clears") > 0 && total("evicted") > 0, "{totals:?}");
    assert!(
        total("hits_of_others") > 0,
        "the processes read each other's pages, checksummed or not"
    );
    assert!(
        apart <= step,
        "the usage file says {usage} bytes, the folders hold {bytes}: more than a step ({step}) \
         apart"
    );
    let _ = std::fs::remove_dir_all(&a);
}

/// The bytes the usage file at `path` says the folders hold, read past the client's caches
/// (`O_DIRECT`, else buffered).
fn usage_file(path: &Path) -> u64 {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    #[repr(C, align(4096))]
    struct Block([u8; 4096]);
    let mut block = Box::new(Block([0; 4096]));
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path);
    let file = direct.unwrap_or_else(|_| std::fs::File::open(path).expect("the usage file"));
    let n = file.read_at(&mut block.0, 0).expect("the usage file reads");
    assert!(n >= 8, "the usage file holds its bytes: {n} read");
    u64::from_le_bytes(block.0[..8].try_into().unwrap())
}
