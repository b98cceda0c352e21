//! Shared NIXL FILE folders across real processes.

use std::time::{Duration, Instant};

use tier_core::StorageTier;
use tier_nixl::{FileAccess, NixlFileConfig, NixlFileTier};

use crate::watch::*;
use crate::worker::*;

#[test]
fn four_processes_share_one_folder_under_one_capacity() {
    const WORKERS: u64 = 4;
    const ROUNDS: u64 = 150;
    let tmp = tempfile::tempdir().unwrap();
    // What they write: own pages, and the common ones once.
    let written = (WORKERS * ROUNDS * 4 + COMMON) * PAGE as u64;
    let capacity = written / 3;
    let step = capacity - (capacity as f64 * LOW_WATERMARK) as u64;
    let workers: Vec<Worker> = (0..WORKERS)
        .map(|id| spawn_worker(tmp.path(), id, WORKERS, ROUNDS, capacity, 5_000))
        .collect();
    for w in &workers {
        w.ready();
    }
    let sampler = Sampler::start(tmp.path());
    let results: Vec<_> = workers.into_iter().map(Worker::finish).collect();
    let (peak, samples) = sampler.stop();

    check_shared_run(
        "4 processes, one shared folder",
        &results,
        (peak, samples),
        (capacity, step),
        1,
        Evictors::One,
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let tier = NixlFileTier::open(config(tmp.path(), capacity, Duration::from_secs(5)))
            .await
            .unwrap();
        let found = verify_all(&tier, WORKERS, ROUNDS * 4).await;
        assert!(found > 0, "pages are still there after the processes ended");
        let usage = tier.fleet_stats().unwrap().usage_bytes;
        let (bytes, temps) = folder_bytes(tmp.path());
        assert!(temps.is_empty(), "no temp file is left: {temps:?}");
        assert_eq!(
            usage, bytes,
            "the usage a restart settles is the folders' bytes"
        );
    });
}

/// The same four processes on a real distributed filesystem: one GlusterFS volume mounted
/// twice (two clients, each with its own caches: two nodes), two processes through each. A
/// page another client shows short for a moment (GlusterFS writes behind) is a miss.
#[test]
fn four_processes_on_two_glusterfs_clients_share_one_folder_under_one_capacity() {
    on_two_glusterfs_clients(
        "4 processes, one shared folder, two GlusterFS clients",
        &[],
        1,
    );
}

/// The same on GlusterFS with the locks off (`locks = "none"`, the case of 3FS, whose client
/// has no `flock`): usage updates may be lost and evictions overlap, which costs capacity
/// accuracy (bounded here by two eviction steps), never a wrong byte or a failed call.
#[test]
fn four_processes_on_two_glusterfs_clients_without_locks_share_one_folder() {
    on_two_glusterfs_clients(
        "4 processes, one shared folder, two GlusterFS clients, no locks",
        &[("KVTIER_FLEET_LOCKS", "none")],
        2,
    );
}

fn on_two_glusterfs_clients(title: &str, env: &[(&str, &str)], steps: u64) {
    const WORKERS: u64 = 4;
    const ROUNDS: u64 = 150;
    let (a, b) = tier_tests::gluster::mounts().folder("fleet");
    let written = (WORKERS * ROUNDS * 4 + COMMON) * PAGE as u64;
    let capacity = written / 3;
    let step = capacity - (capacity as f64 * LOW_WATERMARK) as u64;
    let workers: Vec<Worker> = (0..WORKERS)
        .map(|id| {
            let dir = if id % 2 == 0 { &a } else { &b };
            spawn_worker_on(dir, env, id, WORKERS, ROUNDS, capacity, 5_000)
        })
        .collect();
    for w in &workers {
        w.ready();
    }
    let sampler = Sampler::start(&a);
    let results: Vec<_> = workers.into_iter().map(Worker::finish).collect();
    let (peak, samples) = sampler.stop();
    check_shared_run(
        title,
        &results,
        (peak, samples),
        (capacity, step),
        steps,
        // Its lease excludes as well as the volume's client caches let it: an eviction may
        // now and then overlap another, which costs capacity accuracy, never bytes.
        Evictors::Any,
    );
    let _ = std::fs::remove_dir_all(&a);
}

#[test]
fn an_evictor_killed_holding_the_lease_is_taken_over_and_nothing_torn_survives() {
    let tmp = tempfile::tempdir().unwrap();
    killed_evictor_and_writers(tmp.path(), tmp.path(), 400, 1_000);
}

/// The same with the workers on two GlusterFS clients (mounts) of one volume, fewer rounds
/// (its metadata calls are slower) and a longer lease (with 1 s, evictions outlasted their
/// lease there: 120 takeovers in one run, against 2 on a local disk).
#[test]
fn on_two_glusterfs_clients_an_evictor_killed_holding_the_lease_is_taken_over() {
    let (a, b) = tier_tests::gluster::mounts().folder("killed");
    killed_evictor_and_writers(&a, &b, 150, 3_000);
    let _ = std::fs::remove_dir_all(&a);
}

/// Three workers share the folder seen as `a` and `b` (every other worker through `b`); the one
/// holding the eviction lease is killed with SIGKILL, and so are writers in mid-write: the lease
/// is taken over within its expiry, no torn or foreign byte is served, and a restart leaves
/// no temp file and every page whole.
fn killed_evictor_and_writers(
    a: &std::path::Path,
    b: &std::path::Path,
    rounds: u64,
    lease_ms: u64,
) {
    const WORKERS: u64 = 3;
    let capacity = 200 * PAGE as u64;
    let through = |id: u64| if id.is_multiple_of(2) { a } else { b };
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|id| spawn_worker(through(id), id, WORKERS, rounds, capacity, lease_ms))
        .collect();
    for w in &workers {
        w.ready();
    }
    // Kill whichever worker holds the lease (it is evicting): seen before and after the kill.
    let deadline = Instant::now() + Duration::from_secs(60);
    let victim = loop {
        assert!(
            Instant::now() < deadline,
            "no worker held the lease within 60 s"
        );
        let Some(pid) = lease_holder(a) else {
            continue;
        };
        let Some(i) = workers.iter().position(|w| w.child.id() == pid) else {
            continue;
        };
        kill(&mut workers[i].child);
        if lease_holder(a) == Some(pid) {
            break workers.remove(i);
        }
        // It released the lease just before it died: the next one is caught.
        workers.remove(i);
        assert!(!workers.is_empty(), "the lease was never caught held");
    };
    let killed_at = Instant::now();
    let dead = victim.child.id();
    // Another process takes the lease over once it expires.
    let taken_over = loop {
        match lease_holder(a) {
            Some(pid) if pid != dead => break killed_at.elapsed(),
            _ if killed_at.elapsed() > Duration::from_secs(30) => {
                panic!("no process took the lease over within 30 s")
            }
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    // And writers killed in the middle of their writes, each at another moment; the temp
    // files each left at its death are counted.
    let mut left = 0;
    for (n, delay_ms) in [40u64, 90, 170, 260, 350].into_iter().enumerate() {
        let id = WORKERS + n as u64;
        let mut w = spawn_worker(through(id), id, WORKERS, rounds, capacity, lease_ms);
        w.ready();
        std::thread::sleep(Duration::from_millis(delay_ms));
        kill(&mut w.child);
        let (_, temps) = folder_bytes(a);
        // `.tmp-<host>-<pid>-<seq>-<name>`: the temp files of this writer.
        let pid = w.child.id().to_string();
        left += temps
            .iter()
            .filter(|t| {
                let name = t.file_name().map(|n| n.to_string_lossy().into_owned());
                name.is_some_and(|n| n.split('-').nth(2) == Some(pid.as_str()))
            })
            .count();
    }
    let survivors: Vec<_> = workers.into_iter().map(Worker::finish).collect();
    let takeovers: u64 = survivors.iter().map(|r| r.count("takeovers")).sum();
    let cleaned: u64 = survivors.iter().map(|r| r.count("temps_removed")).sum();
    let bad: u64 = survivors.iter().map(|r| r.count("bad_hits")).sum();
    println!(
        "evictor killed holding the lease: taken over after {taken_over:?} (lease {lease_ms} ms), \
         {takeovers} takeover(s) counted by the survivors"
    );
    assert!(
        taken_over < Duration::from_millis(lease_ms) * 2 + Duration::from_secs(2),
        "the lease was taken over within its expiry (took {taken_over:?})"
    );
    assert_eq!(
        bad,
        0,
        "no torn or foreign bytes were served: {}",
        failures(&survivors)
    );
    // A lease is taken over from a killed process (one evictor, up to five writers), hardly
    // ever from a live evictor: it renews whenever a third of the lease has passed (GlusterFS
    // counted 20 takeovers when it renewed every 64 victims only).
    assert!(
        takeovers <= 10,
        "{takeovers} takeovers: live evictors outlasted their lease"
    );

    // A restart: leftovers of the killed processes go, everything present is whole.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (_, before) = folder_bytes(a);
        let tier = NixlFileTier::open(config(a, capacity, Duration::from_secs(5)))
            .await
            .unwrap();
        tier.opened().await;
        let (_, after) = folder_bytes(a);
        assert!(
            after.is_empty(),
            "temp files outlived the restart: {after:?}"
        );
        let stats = tier.fleet_stats().unwrap();
        assert_eq!(stats.temps_removed as usize, before.len());
        let found = verify_all(&tier, WORKERS, rounds * 4).await;
        // (The later writers' opens remove earlier ones' leftovers too, uncounted here.)
        println!(
            "killed writers left {left} temp file(s): {cleaned} removed by the survivors' \
             scans, {} by the restart; {found} pages whole after it",
            before.len()
        );
        assert!(found > 0);
    });
}

#[tokio::test]
async fn an_owner_and_a_sharer_of_one_folder_are_refused_naming_the_folder_and_the_modes() {
    let tmp = tempfile::tempdir().unwrap();
    let mut owner = NixlFileConfig::new([tmp.path().join("a"), tmp.path().join("b")]);
    owner.access = FileAccess::Owner;
    let shared = config(tmp.path(), 1 << 30, Duration::from_secs(5));

    let first = NixlFileTier::open(shared.clone()).await.unwrap();
    let second = NixlFileTier::open(shared.clone())
        .await
        .expect("sharers open side by side");
    let started = Instant::now();
    let err = NixlFileTier::open(owner.clone())
        .await
        .err()
        .expect("an owner is refused beside sharers");
    let text = err.to_string();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once, not after a wait"
    );
    assert!(
        text.contains("access = \"shared\"") && text.contains("access = \"owner\""),
        "{text}"
    );
    assert!(
        text.contains(
            &tmp.path()
                .join("a")
                .canonicalize()
                .unwrap()
                .display()
                .to_string()
        ),
        "{text}"
    );
    drop((first, second));

    let _owner = NixlFileTier::open(owner).await.unwrap();
    let started = Instant::now();
    let err = NixlFileTier::open(shared)
        .await
        .err()
        .expect("a sharer is refused beside an owner");
    let text = err.to_string();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "a bounded wait"
    );
    assert!(
        text.contains("access = \"shared\"") && text.contains("access = \"owner\""),
        "{text}"
    );
}

/// A process frozen holding the usage file's lock (stopped, or stuck in a sync on a hung
/// client; here `flock(1)` holding it) holds up no other process's puts: they go on at once,
/// their counts kept pending and written once the lock is free, none lost. (Each put waited
/// 5 s for the lock and then failed.)
#[test]
fn a_process_frozen_holding_the_usage_lock_holds_up_no_put() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let capacity = 64 * PAGE as u64;
        let tier = NixlFileTier::open(config(tmp.path(), capacity, Duration::from_secs(5)))
            .await
            .unwrap();
        tier.opened().await;
        let usage = tmp.path().join("a").join(".kvtier.usage");
        assert!(usage.is_file(), "the usage file is {}", usage.display());
        // `--close`: the lock is flock(1)'s alone, let go of when it is killed.
        let mut holder = std::process::Command::new("flock")
            .arg("--close")
            .arg(&usage)
            .args(["sleep", "60"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("flock(1) runs");
        let file = std::fs::File::open(&usage).unwrap();
        let held = Instant::now();
        while try_flock(&file) {
            assert!(
                held.elapsed() < Duration::from_secs(10),
                "flock(1) takes the lock"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let started = Instant::now();
        for i in 0..20 {
            let k = own_key(0, i);
            let page = tier_core::Page::new(k.clone(), tier_tests::content::page(&k, 1, PAGE));
            let put = tokio::time::timeout(Duration::from_secs(20), tier.put(&[page]))
                .await
                .expect("a put returns");
            assert!(put[0].is_ok(), "put {i} failed: {:?}", put[0]);
        }
        let took = started.elapsed();
        kill(&mut holder);
        println!("20 puts with the usage lock held by a frozen process: {took:?}");
        assert!(
            took < Duration::from_secs(5),
            "20 puts took {took:?} while another process held the usage lock"
        );
        tier.flush().await.unwrap();
        let (bytes, _) = folder_bytes(tmp.path());
        assert!(bytes >= 20 * PAGE as u64, "20 pages stored: {bytes} bytes");
        assert_eq!(
            tier.fleet_stats().unwrap().usage_bytes,
            bytes,
            "the counts left pending were written once the lock was free"
        );
    });
}

/// Whether an exclusive `flock` on `file` can be had now (let go of at once).
fn try_flock(file: &std::fs::File) -> bool {
    use std::os::unix::io::AsRawFd;
    // SAFETY: a valid open fd.
    let got = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if got {
        // SAFETY: as above.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
    }
    got
}

/// A page another GlusterFS client just stored again (its file replaced by a rename) is read
/// by this client at once: the name answers `ESTALE` for a moment while this client's caches
/// hold the file it replaced, and the open is tried again until it answers. (Every read of
/// such a page failed: SGLang's two DP groups storing one prefix at the same moment read
/// back 2 of 8 pages.)
#[test]
fn a_page_another_client_just_replaced_is_read_not_failed_as_stale() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (a, on_a, on_b) = rt.block_on(on_both_clients("stale"));
    rt.block_on(async {
        let mut misread = 0;
        for i in 0..8 {
            let k = own_key(9, i);
            let page = |v| tier_core::Page::new(k.clone(), tier_tests::content::page(&k, v, PAGE));
            assert!(on_b.put(&[page(1)]).await[0].is_ok());
            let mut buf = vec![0u8; PAGE];
            let mut slots = [tier_core::ReadSlot::new(k.clone(), &mut buf)];
            assert!(matches!(
                on_b.get(&mut slots).await[0],
                Ok(tier_core::Lookup::Hit)
            ));
            assert!(
                on_a.put(&[page(2)]).await[0].is_ok(),
                "the other client stores it again"
            );
            let mut slots = [tier_core::ReadSlot::new(k.clone(), &mut buf)];
            let got = on_b.get(&mut slots).await.pop().unwrap();
            drop(slots);
            match got {
                Ok(tier_core::Lookup::Hit) => {
                    // Either version, whole (the client may still show the one it cached).
                    let whole = [1, 2]
                        .iter()
                        .any(|&v| tier_tests::content::verify(&k, v, &buf).is_ok());
                    assert!(whole, "page {i}: a hit of neither version");
                }
                other => {
                    println!("page {i}: {other:?}");
                    misread += 1;
                }
            }
        }
        assert_eq!(misread, 0, "pages another client replaced were not read");
    });
    let _ = std::fs::remove_dir_all(&a);
}

/// Pages one GlusterFS client removed, read through the other client that had just read
/// them: misses, never the removed bytes, whatever size (pages under and over the size
/// verified once per version). This client's caches still open, read and `stat` a file the
/// other client unlinked; only the engine's fresh open of the name reaches the server. (The
/// engine reading the file the read held open served every removed page, with the identity
/// after the read taken from that file or from the name.)
#[test]
fn pages_another_client_removed_are_misses_though_this_client_can_still_open_them() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (a, on_a, on_b) = rt.block_on(on_both_clients("removed"));
    rt.block_on(async {
        for (size, len) in [(0, 4096), (1, PAGE)] {
            let keys: Vec<_> = (0..8).map(|i| own_key(10 + size, i)).collect();
            let bytes: Vec<_> = keys
                .iter()
                .map(|k| tier_tests::content::page(k, 1, len))
                .collect();
            let pages: Vec<_> = keys
                .iter()
                .zip(&bytes)
                .map(|(k, b)| tier_core::Page::new(k.clone(), b.clone()))
                .collect();
            assert!(on_a.put(&pages).await.iter().all(Result::is_ok));
            let mut bufs = vec![vec![0u8; len]; keys.len()];
            let got = get_into(&on_b, &keys, &mut bufs).await;
            assert!(
                got.iter().all(|r| matches!(r, Ok(tier_core::Lookup::Hit))),
                "{len} B: pages the other client stored were not read: {got:?}"
            );
            assert!(on_a.remove(&keys).await.iter().all(Result::is_ok));
            let got = get_into(&on_b, &keys, &mut bufs).await;
            let served = got
                .iter()
                .filter(|r| matches!(r, Ok(tier_core::Lookup::Hit)))
                .count();
            assert_eq!(served, 0, "{len} B: removed pages were served: {got:?}");
        }
    });
    let _ = std::fs::remove_dir_all(&a);
}

/// A shared tier on each of the two GlusterFS clients, over the volume's folder `name`; the
/// folder as the first client sees it (to remove at the end).
async fn on_both_clients(name: &str) -> (std::path::PathBuf, NixlFileTier, NixlFileTier) {
    let (a, b) = tier_tests::gluster::mounts().folder(name);
    let open = |dir: &std::path::Path| {
        let mut c = NixlFileConfig::new([dir.join("a")]);
        c.access = FileAccess::Shared;
        NixlFileTier::open(c)
    };
    let on_a = open(&a).await.unwrap();
    let on_b = open(&b).await.unwrap();
    (a, on_a, on_b)
}

/// Reads `keys` from `tier` into `bufs`, a buffer a key.
async fn get_into(
    tier: &NixlFileTier,
    keys: &[tier_core::PageKey],
    bufs: &mut [Vec<u8>],
) -> Vec<tier_core::GetResult> {
    let mut slots: Vec<_> = keys
        .iter()
        .zip(bufs)
        .map(|(k, buf)| tier_core::ReadSlot::new(k.clone(), buf))
        .collect();
    tier.get(&mut slots).await
}
