//! The parent's side of the fleet tests: starting and reading the children, sampling the
//! folders' and prefixes' bytes, reading the leases, checking every page left.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tier_core::{Lookup, PageKey, ReadSlot, StorageTier};
use tier_tests::content;
use tier_tests::s3::S3Server;

use crate::worker::{common_key, own_key, BATCH, COMMON, FAILURE_LINE, PAGE};

/// A running child and what it printed.
pub struct Worker {
    pub child: Child,
    lines: mpsc::Receiver<String>,
}

pub fn spawn_worker(
    dir: &Path,
    id: u64,
    workers: u64,
    rounds: u64,
    capacity: u64,
    lease_ms: u64,
) -> Worker {
    spawn_worker_on(dir, &[], id, workers, rounds, capacity, lease_ms)
}

/// A worker on `dir`, with `env` set: `KVTIER_FLEET_S3` (endpoint, bucket, keys: on the S3
/// server's prefix instead), `KVTIER_FLEET_LOCKS` (`none`: a shared folder without locks).
pub fn spawn_worker_on(
    dir: &Path,
    env: &[(&str, &str)],
    id: u64,
    workers: u64,
    rounds: u64,
    capacity: u64,
    lease_ms: u64,
) -> Worker {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.envs(env.iter().copied());
    let mut child = command
        .args([
            "fleet_worker",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KVTIER_FLEET_DIR", dir)
        .env("KVTIER_FLEET_ID", id.to_string())
        .env("KVTIER_FLEET_WORKERS", workers.to_string())
        .env("KVTIER_FLEET_ROUNDS", rounds.to_string())
        .env("KVTIER_FLEET_CAPACITY", capacity.to_string())
        .env("KVTIER_FLEET_LEASE_MS", lease_ms.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    Worker { child, lines }
}

impl Worker {
    /// Waits until the child has opened its tier.
    pub fn ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            match self.lines.recv_timeout(Duration::from_millis(100)) {
                Ok(line) if line.contains("kvtier-fleet-ready") => return,
                _ => {}
            }
        }
        panic!("a worker did not open its tier within 60 s");
    }

    /// Waits for the child's end; returns its counts and its evictions' (began, ended) times.
    pub fn finish(mut self) -> WorkerResult {
        let status = wait_bounded(&mut self.child, Duration::from_secs(240));
        assert!(status.success(), "a worker failed: {status}");
        let mut counts = HashMap::new();
        let mut runs = Vec::new();
        let mut failures = Vec::new();
        let mut began = None;
        for line in self.lines.try_iter() {
            if let Some(rest) = line.strip_prefix(FAILURE_LINE) {
                failures.push(rest.to_string());
            } else if let Some(rest) = line.strip_prefix("kvtier-fleet-result ") {
                for pair in rest.split_whitespace() {
                    let (k, v) = pair.split_once('=').unwrap();
                    counts.insert(k.to_string(), v.parse().unwrap());
                }
            } else if let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) {
                let fields = &event["fields"];
                let at = fields["at_ns"].as_u64();
                match (fields["message"].as_str(), at) {
                    (Some("shared eviction began"), Some(at)) => began = Some(at),
                    (Some("shared eviction ended"), Some(at)) => {
                        runs.push((began.take().expect("an eviction ends after it began"), at))
                    }
                    _ => {}
                }
            }
        }
        assert!(!counts.is_empty(), "a worker printed no result");
        WorkerResult {
            counts,
            runs,
            failures,
        }
    }
}

pub fn wait_bounded(child: &mut Child, bound: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("a worker ran for over {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Bytes of every file in the folders' buckets (pages and writes in flight), and the temp
/// files among them.
pub fn folder_bytes(dir: &Path) -> (u64, Vec<PathBuf>) {
    let mut bytes = 0;
    let mut temps = Vec::new();
    for top in ["a", "b"] {
        let Ok(buckets) = std::fs::read_dir(dir.join(top)) else {
            continue;
        };
        for bucket in buckets.flatten().filter(|b| b.path().is_dir()) {
            let Ok(files) = std::fs::read_dir(bucket.path()) else {
                continue;
            };
            for file in files.flatten() {
                if let Ok(meta) = file.metadata() {
                    bytes += meta.len();
                }
                if file.file_name().to_string_lossy().starts_with(".tmp-") {
                    temps.push(file.path());
                }
            }
        }
    }
    (bytes, temps)
}

/// Samples the folders' bytes every few milliseconds until stopped; returns the peak.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    samples: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Sampler {
    pub fn start(dir: &Path) -> Self {
        let dir = dir.to_path_buf();
        Self::start_with(move || folder_bytes(&dir).0)
    }

    /// Samples what `bytes` measures.
    pub fn start_with(bytes: impl Fn() -> u64 + Send + 'static) -> Self {
        let (stop, peak, samples): (Arc<AtomicBool>, Arc<AtomicU64>, Arc<AtomicU64>) =
            Default::default();
        let (s, p, n) = (Arc::clone(&stop), Arc::clone(&peak), Arc::clone(&samples));
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let bytes = bytes();
                p.fetch_max(bytes, Ordering::Relaxed);
                n.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Self {
            stop,
            peak,
            samples,
            thread,
        }
    }

    pub fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        (
            self.peak.load(Ordering::Relaxed),
            self.samples.load(Ordering::Relaxed),
        )
    }
}

/// Reads every page of the key space the tier finds; each must be byte-exact. Returns how
/// many were found.
pub async fn verify_all(tier: &dyn StorageTier, workers: u64, own_per_worker: u64) -> usize {
    let keys: Vec<PageKey> = (0..workers)
        .flat_map(|w| (0..own_per_worker).map(move |n| own_key(w, n)))
        .chain((0..COMMON).map(common_key))
        .collect();
    let mut found = 0;
    for chunk in keys.chunks(64) {
        let mut bufs = vec![vec![0u8; PAGE]; chunk.len()];
        let mut slots: Vec<ReadSlot<'_>> = chunk
            .iter()
            .zip(bufs.iter_mut())
            .map(|(k, b)| ReadSlot::new(k.clone(), b))
            .collect();
        let results = tier.get(&mut slots).await;
        drop(slots);
        for ((k, r), buf) in chunk.iter().zip(results).zip(&bufs) {
            if r.expect("a read works") == Lookup::Hit {
                content::verify(k, 1, buf).unwrap_or_else(|e| panic!("{k}: {e}"));
                found += 1;
            }
        }
    }
    found
}

/// Page bytes of the objects in the shared prefix's buckets (each less its trailer, as the
/// capacity counts them), read from the S3 server's data folder (a folder per bucket).
pub fn prefix_bytes(prefix_dir: &Path) -> u64 {
    let Ok(buckets) = std::fs::read_dir(prefix_dir) else {
        return 0;
    };
    buckets
        .flatten()
        .filter(|b| b.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|b| std::fs::read_dir(b.path()).ok())
        .flat_map(|files| files.flatten())
        .filter(|f| !f.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|f| f.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len().saturating_sub(tier_format::TRAILER))
        .sum()
}

/// The lease file's holder process, if the lease is held.
pub fn lease_holder(dir: &Path) -> Option<u32> {
    lease_holder_in(&dir.join("a").join(".kvtier.lease"))
}

/// The holder process a lease file or object names, if the lease is held.
pub fn lease_holder_in(lease: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(lease).ok()?;
    let holder = text.split_whitespace().next()?;
    holder.split(':').nth(1)?.parse().ok()
}

pub fn kill(child: &mut Child) {
    // SAFETY: plain kill(2) of a child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
}

/// What a worker printed.
pub struct WorkerResult {
    /// Its counts by name.
    pub counts: HashMap<String, u64>,
    /// Its eviction runs' (began, ended) times.
    pub runs: Vec<(u64, u64)>,
    /// What each of its failed or wrong calls said (key: error).
    pub failures: Vec<String>,
}

impl WorkerResult {
    /// The count of `name` (0 if it never happened).
    pub fn count(&self, name: &str) -> u64 {
        self.counts.get(name).copied().unwrap_or(0)
    }
}

/// What the failed calls of all `results` said, for an assertion's message.
pub fn failures(results: &[WorkerResult]) -> String {
    let all: Vec<&str> = results
        .iter()
        .flat_map(|r| r.failures.iter().map(String::as_str))
        .collect();
    all.join("; ")
}

/// Prints what the sharing workers did under `title` and checks it: every hit byte-exact, no
/// call failed, each worker read pages the others stored, they evicted, the storage was
/// sampled, its peak stayed within the capacity plus `steps` eviction steps plus the writes in
/// flight (a batch per worker: the samples count temp files), and that eviction runs
/// overlapped no more than `evictors` allows (their overlaps are counted and printed).
pub fn check_shared_run(
    title: &str,
    results: &[WorkerResult],
    (peak, samples): (u64, u64),
    (capacity, step): (u64, u64),
    steps: u64,
    evictors: Evictors,
) {
    let total = |name: &str| results.iter().map(|r| r.count(name)).sum::<u64>();
    println!(
        "{title}: {} hits checked ({} of other processes' pages), {} misses, \
         {} evictions in {} runs, {} spared, peak {} of capacity {} + step {} ({samples} samples)",
        total("hits_checked"),
        total("hits_of_others"),
        total("misses"),
        total("evicted"),
        total("eviction_runs"),
        total("spared"),
        peak,
        capacity,
        step,
    );
    assert_eq!(
        total("bad_hits"),
        0,
        "every hit is byte-exact: {}",
        failures(results)
    );
    assert_eq!(
        total("get_errors") + total("put_errors"),
        0,
        "no call failed: {}",
        failures(results)
    );
    for (i, r) in results.iter().enumerate() {
        assert!(
            r.count("hits_of_others") > 0,
            "worker {i} read pages the others stored: {:?}",
            r.counts
        );
    }
    assert!(
        total("evicted") > 0,
        "the capacity made the processes evict"
    );
    assert!(
        samples > 10,
        "the storage was sampled while the processes ran"
    );
    // The processes wrote three times the capacity: a sampler that saw far less read the
    // wrong place.
    assert!(
        peak >= capacity / 2,
        "the samples saw the storage fill: peak {peak} of capacity {capacity}"
    );
    let in_flight = results.len() as u64 * BATCH * (PAGE as u64 + tier_nixl::PAGE_TRAILER);
    assert!(
        peak <= capacity + steps * step + in_flight,
        "the storage held {peak} bytes at a sample: over the capacity {capacity} plus {steps} \
         step(s) of {step} plus {in_flight} in flight"
    );
    let mut runs: Vec<(u64, u64)> = results
        .iter()
        .flat_map(|r| r.runs.iter().copied())
        .collect();
    runs.sort();
    assert!(!runs.is_empty(), "the workers logged their evictions");
    let overlaps = runs.windows(2).filter(|p| p[1].0 < p[0].1).count();
    println!(
        "{title}: {overlaps} of {} eviction runs overlapped another",
        runs.len()
    );
    match evictors {
        Evictors::One => {
            for pair in runs.windows(2) {
                assert!(pair[1].0 >= pair[0].1, "two evictions overlapped: {pair:?}");
            }
        }
        Evictors::MostlyOne => assert!(
            overlaps * 4 <= runs.len(),
            "{overlaps} of {} eviction runs overlapped another: the lease excluded too little",
            runs.len()
        ),
        Evictors::Any => {}
    }
}

/// How exclusive a run's evictions must have been.
#[derive(Debug, Clone, Copy)]
pub enum Evictors {
    /// One at a time: the lease is a lock that excludes (`flock` on one kernel).
    One,
    /// At most a quarter of the runs overlapped another: the lease excludes as well as the
    /// storage lets it (a store whose conditional writes are not atomic with their check, a
    /// filesystem's client caches), and a lease that did not exclude at all would overlap
    /// most runs.
    MostlyOne,
    /// Any overlap: no lock at all (usage updates and evictions race by design).
    Any,
}

/// The S3 server as a worker takes it: endpoint, bucket and keys.
pub fn s3_spec(server: &S3Server) -> String {
    format!(
        "{} {} {} {}",
        server.endpoint(),
        server.bucket,
        server.access_key,
        server.secret_key
    )
}
