//! Shared prefixes on the S3 server across real processes.

use std::time::{Duration, Instant};

use tier_object::ObjectTier;
use tier_tests::s3::S3Server;

use crate::watch::*;
use crate::worker::*;

#[test]
fn four_processes_share_one_prefix_on_s3_under_one_capacity() {
    const WORKERS: u64 = 4;
    const ROUNDS: u64 = 60;
    let server = S3Server::shared();
    let spec = s3_spec(&server);
    let prefix_dir = server.data_dir().join(&server.bucket).join(PREFIX);
    let tmp = tempfile::tempdir().unwrap();
    let written = (WORKERS * ROUNDS * 4 + COMMON) * PAGE as u64;
    let capacity = written / 3;
    let step = capacity - (capacity as f64 * LOW_WATERMARK) as u64;
    let workers: Vec<Worker> = (0..WORKERS)
        .map(|id| {
            spawn_worker_on(
                tmp.path(),
                &[("KVTIER_FLEET_S3", &spec)],
                id,
                WORKERS,
                ROUNDS,
                capacity,
                5_000,
            )
        })
        .collect();
    for w in &workers {
        w.ready();
    }
    let sampled = prefix_dir.clone();
    let sampler = Sampler::start_with(move || prefix_bytes(&sampled));
    let results: Vec<_> = workers.into_iter().map(Worker::finish).collect();
    let (peak, samples) = sampler.stop();
    // Other nodes' puts are seen at the next listing: one more step of slack.
    check_shared_run(
        "4 processes, one shared prefix on s3s-fs",
        &results,
        (peak, samples),
        (capacity, step),
        2,
        // s3s-fs checks a conditional write's ETag apart from the write: two racing claims of
        // the lease can both succeed, and the read-back and the renewal before each DELETE
        // stop the loser only if its write landed in time (one overlap in 16 runs in a CI run
        // before the renewal covered the first DELETE). AWS S3 and MinIO check atomically.
        Evictors::MostlyOne,
    );
    let left = prefix_bytes(&prefix_dir);
    assert!(
        left <= capacity + step,
        "{left} bytes left under the prefix"
    );
}

#[test]
fn an_evictor_of_a_shared_prefix_killed_holding_the_lease_is_taken_over() {
    const WORKERS: u64 = 3;
    const ROUNDS: u64 = 150;
    const LEASE_MS: u64 = 1_000;
    let server = S3Server::shared();
    let spec = s3_spec(&server);
    // The lease object, as the server keeps it on disk.
    let lease = server
        .data_dir()
        .join(&server.bucket)
        .join(PREFIX)
        .join(".kvtier-lease");
    let tmp = tempfile::tempdir().unwrap();
    let capacity = 100 * PAGE as u64;
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|id| {
            spawn_worker_on(
                tmp.path(),
                &[("KVTIER_FLEET_S3", &spec)],
                id,
                WORKERS,
                ROUNDS,
                capacity,
                LEASE_MS,
            )
        })
        .collect();
    for w in &workers {
        w.ready();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let dead = loop {
        assert!(
            Instant::now() < deadline,
            "no worker held the lease within 60 s"
        );
        let Some(pid) = lease_holder_in(&lease) else {
            continue;
        };
        let Some(i) = workers.iter().position(|w| w.child.id() == pid) else {
            continue;
        };
        kill(&mut workers[i].child);
        let caught = lease_holder_in(&lease) == Some(pid);
        workers.remove(i);
        if caught {
            break pid;
        }
        assert!(!workers.is_empty(), "the lease was never caught held");
    };
    let killed_at = Instant::now();
    let taken_over = loop {
        match lease_holder_in(&lease) {
            Some(pid) if pid != dead => break killed_at.elapsed(),
            _ if killed_at.elapsed() > Duration::from_secs(30) => {
                panic!("no process took the prefix's lease over within 30 s")
            }
            _ => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    let survivors: Vec<_> = workers.into_iter().map(Worker::finish).collect();
    let sum = |name: &str| survivors.iter().map(|r| r.count(name)).sum::<u64>();
    println!(
        "shared prefix: evictor killed holding the lease, taken over after {taken_over:?} \
         (lease {LEASE_MS} ms), {} takeover(s) counted by the survivors",
        sum("takeovers")
    );
    assert!(
        taken_over < Duration::from_millis(LEASE_MS) * 2 + Duration::from_secs(2),
        "the lease was taken over within its expiry (took {taken_over:?})"
    );
    // (Two survivors racing for the expired lease may both read back the other's and count
    // nothing; the lease object naming a survivor is the proof.)
    assert_eq!(sum("bad_hits"), 0, "no torn or foreign bytes were served");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let tier = ObjectTier::open(
            s3_store(&spec),
            object_config(capacity, Duration::from_secs(5)),
        )
        .unwrap();
        let found = verify_all(&tier, WORKERS, ROUNDS * 4).await;
        assert!(found > 0, "pages are still there, each whole");
    });
}
