//! Shared folders across real processes (`access = "shared"`): child processes (this test
//! binary, running the ignored `fleet_worker`) store their own and common pages in one set of
//! folders at the same moment, read each other's, remove some, under a capacity a third of
//! what they write. Every hit must be byte-exact, the folders must stay under the capacity
//! plus one eviction step at every sample, each process must see the others' pages, and at
//! most one process may evict at a time. A second test kills the evictor with SIGKILL while
//! it holds the lease, and a writer in the middle of its writes: another process takes the
//! lease over once it expires, nothing torn is served, and no temp file outlives a restart.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier};
use tier_nixl::{FileAccess, NixlFileConfig, NixlFileTier};
use tier_object::{ObjectTier, ObjectTierConfig, PrefixAccess, S3Settings};
use tier_tests::content;
use tier_tests::rng::Rng;
use tier_tests::s3::S3Server;

const PAGE: usize = 64 << 10;
/// Pages every process writes under the same keys (chain hashes of a common prefix).
const COMMON: u64 = 96;
const LOW_WATERMARK: f64 = 0.9;

fn own_key(worker: u64, n: u64) -> PageKey {
    PageKey::new(format!(
        "w{worker}-{n:06}-{:048x}",
        (n + 1) * 0x9e37_79b9 + worker
    ))
    .unwrap()
}

fn common_key(n: u64) -> PageKey {
    PageKey::new(format!("common-{n:04}-{:048x}", (n + 7) * 0x2545_f491)).unwrap()
}

fn config(dir: &Path, capacity: u64, lease: Duration) -> NixlFileConfig {
    let mut c = NixlFileConfig::new([dir.join("a"), dir.join("b")]);
    c.access = FileAccess::Shared;
    c.capacity_bytes = Some(capacity);
    c.shared.lease = lease;
    c.shared.low_watermark = LOW_WATERMARK;
    c.shared.touch_interval = Duration::from_millis(200);
    c
}

fn env<T: std::str::FromStr>(name: &str) -> T {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is set by the parent"))
        .parse()
        .unwrap_or_else(|_| panic!("{name} parses"))
}

/// What the workers share: a NIXL FILE folder, or (with `KVTIER_FLEET_S3` set) a prefix on
/// the S3 server.
enum Target {
    File(NixlFileTier),
    Object(ObjectTier),
}

/// The shared prefix of the object tests.
const PREFIX: &str = "fleet";

fn object_config(capacity: u64, lease: Duration) -> ObjectTierConfig {
    let mut c = ObjectTierConfig::new(PREFIX);
    c.access = PrefixAccess::Shared;
    c.capacity_bytes = Some(capacity);
    c.shared.lease = lease;
    c.shared.low_watermark = LOW_WATERMARK;
    c.shared.relist = Duration::from_millis(50);
    c
}

fn s3_store(spec: &str) -> Arc<dyn object_store::ObjectStore> {
    let parts: Vec<&str> = spec.split_whitespace().collect();
    S3Settings::endpoint(parts[0], parts[1], parts[2], parts[3])
        .build()
        .unwrap()
}

impl Target {
    async fn open(dir: &str, capacity: u64, lease: Duration) -> Self {
        match std::env::var("KVTIER_FLEET_S3") {
            Ok(spec) => {
                let tier = ObjectTier::open(s3_store(&spec), object_config(capacity, lease))
                    .expect("a shared prefix opens");
                tier.load_catalog().await.expect("the prefix lists");
                Self::Object(tier)
            }
            Err(_) => Self::File(
                NixlFileTier::open(config(Path::new(dir), capacity, lease))
                    .await
                    .expect("a shared tier opens beside the others"),
            ),
        }
    }

    fn counts(&self) -> Vec<(&'static str, u64)> {
        match self {
            Self::File(t) => {
                let f = t.fleet_stats().expect("a shared tier has fleet stats");
                vec![
                    ("evicted", f.evicted),
                    ("eviction_runs", f.eviction_runs),
                    ("takeovers", f.takeovers),
                    ("spared", f.spared),
                    ("temps_removed", f.temps_removed),
                ]
            }
            Self::Object(t) => {
                let f = t.prefix_stats().expect("a shared prefix has stats");
                vec![
                    ("evicted", f.evicted),
                    ("eviction_runs", f.eviction_runs),
                    ("takeovers", f.takeovers),
                    ("spared", f.spared),
                ]
            }
        }
    }
}

impl std::ops::Deref for Target {
    type Target = dyn StorageTier;
    fn deref(&self) -> &Self::Target {
        match self {
            Self::File(t) => t,
            Self::Object(t) => t,
        }
    }
}

/// The child: `KVTIER_FLEET_ROUNDS` rounds of a put of 4 own and 4 common pages, a get of 8
/// pages of any process, and now and then a remove of an own page; then prints its counts.
/// Does nothing unless the parent set `KVTIER_FLEET_DIR`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the fleet tests as their child processes"]
async fn fleet_worker() {
    let Ok(dir) = std::env::var("KVTIER_FLEET_DIR") else {
        return;
    };
    tracing_subscriber::fmt()
        .json()
        .with_env_filter("tier_nixl=debug,tier_object=debug")
        .with_writer(std::io::stdout)
        .init();
    let (id, workers, rounds): (u64, u64, u64) = (
        env("KVTIER_FLEET_ID"),
        env("KVTIER_FLEET_WORKERS"),
        env("KVTIER_FLEET_ROUNDS"),
    );
    let capacity: u64 = env("KVTIER_FLEET_CAPACITY");
    let lease = Duration::from_millis(env("KVTIER_FLEET_LEASE_MS"));
    let tier = Target::open(&dir, capacity, lease).await;
    println!("kvtier-fleet-ready");
    let mut rng = Rng::new(0xf1ee7 + id);
    let mut counts = HashMap::<&str, u64>::new();
    for round in 0..rounds {
        let mut batch: Vec<Page<'static>> = (0..4)
            .map(|j| {
                let k = own_key(id, round * 4 + j);
                Page::new(k.clone(), content::page(&k, 1, PAGE))
            })
            .collect();
        batch.extend((0..4).map(|_| {
            let k = common_key(rng.below(COMMON));
            Page::new(k.clone(), content::page(&k, 1, PAGE))
        }));
        for r in tier.put(&batch).await {
            *counts
                .entry(if r.is_ok() { "puts" } else { "put_errors" })
                .or_default() += 1;
        }
        // Reads: pages any process may have stored by now.
        let wanted: Vec<(PageKey, bool)> = (0..8)
            .map(|j| {
                if j % 4 == 3 {
                    (common_key(rng.below(COMMON)), false)
                } else {
                    let w = rng.below(workers);
                    let n = rng.below((round + 1) * 4);
                    (own_key(w, n), w != id)
                }
            })
            .collect();
        let mut bufs = vec![vec![0u8; PAGE]; wanted.len()];
        let mut slots: Vec<ReadSlot<'_>> = wanted
            .iter()
            .zip(bufs.iter_mut())
            .map(|((k, _), b)| ReadSlot::new(k.clone(), b))
            .collect();
        let results = tier.get(&mut slots).await;
        drop(slots);
        for (((k, others), r), buf) in wanted.iter().zip(results).zip(&bufs) {
            match r {
                Ok(Lookup::Hit) => {
                    *counts.entry("hits_checked").or_default() += 1;
                    if *others {
                        *counts.entry("hits_of_others").or_default() += 1;
                    }
                    if let Err(e) = content::verify(k, 1, buf) {
                        *counts.entry("bad_hits").or_default() += 1;
                        eprintln!("{k}: {e}");
                    }
                }
                Ok(Lookup::Miss) => *counts.entry("misses").or_default() += 1,
                Err(e) => {
                    *counts.entry("get_errors").or_default() += 1;
                    eprintln!("{k}: {e}");
                }
            }
        }
        if round % 5 == 4 {
            let gone = own_key(id, rng.below((round + 1) * 4));
            for r in tier.remove(&[gone]).await {
                if r.expect("a remove works") {
                    *counts.entry("removed").or_default() += 1;
                }
            }
        }
    }
    for (name, n) in tier.counts() {
        counts.insert(name, n);
    }
    let line: Vec<String> = counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("kvtier-fleet-result {}", line.join(" "));
}

/// A running child and what it printed.
struct Worker {
    child: Child,
    lines: mpsc::Receiver<String>,
}

fn spawn_worker(
    dir: &Path,
    id: u64,
    workers: u64,
    rounds: u64,
    capacity: u64,
    lease_ms: u64,
) -> Worker {
    spawn_worker_on(dir, None, id, workers, rounds, capacity, lease_ms)
}

/// A worker on `dir`, or with `s3` (endpoint, bucket, keys) on the S3 server's prefix.
fn spawn_worker_on(
    dir: &Path,
    s3: Option<&str>,
    id: u64,
    workers: u64,
    rounds: u64,
    capacity: u64,
    lease_ms: u64,
) -> Worker {
    let mut command = Command::new(std::env::current_exe().unwrap());
    if let Some(spec) = s3 {
        command.env("KVTIER_FLEET_S3", spec);
    }
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
    fn ready(&self) {
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
    fn finish(mut self) -> (HashMap<String, u64>, Vec<(u64, u64)>) {
        let status = wait_bounded(&mut self.child, Duration::from_secs(240));
        assert!(status.success(), "a worker failed: {status}");
        let mut counts = HashMap::new();
        let mut runs = Vec::new();
        let mut began = None;
        for line in self.lines.try_iter() {
            if let Some(rest) = line.strip_prefix("kvtier-fleet-result ") {
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
        (counts, runs)
    }
}

fn wait_bounded(child: &mut Child, bound: Duration) -> std::process::ExitStatus {
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
fn folder_bytes(dir: &Path) -> (u64, Vec<PathBuf>) {
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
struct Sampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    samples: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Sampler {
    fn start(dir: &Path) -> Self {
        let dir = dir.to_path_buf();
        Self::start_with(move || folder_bytes(&dir).0)
    }

    /// Samples what `bytes` measures.
    fn start_with(bytes: impl Fn() -> u64 + Send + 'static) -> Self {
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

    fn stop(self) -> (u64, u64) {
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
async fn verify_all(tier: &dyn StorageTier, workers: u64, own_per_worker: u64) -> usize {
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

    let total = |name: &str| {
        results
            .iter()
            .map(|(c, _)| c.get(name).copied().unwrap_or(0))
            .sum::<u64>()
    };
    println!(
        "4 processes, one shared folder: {} hits checked ({} of other processes' pages), {} misses, \
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
    assert_eq!(total("bad_hits"), 0, "every hit is byte-exact");
    assert_eq!(
        total("get_errors") + total("put_errors"),
        0,
        "no call failed"
    );
    for (i, (counts, _)) in results.iter().enumerate() {
        assert!(
            counts.get("hits_of_others").copied().unwrap_or(0) > 0,
            "worker {i} read pages the others stored: {counts:?}"
        );
    }
    assert!(
        total("evicted") > 0,
        "the capacity made the processes evict"
    );
    assert!(
        samples > 10,
        "the folders were sampled while the processes ran"
    );
    assert!(
        peak <= capacity + step,
        "the folders held {peak} bytes at a sample: over the capacity {capacity} plus one step {step}"
    );
    // One evictor at a time: no two eviction runs of any processes overlap.
    let mut runs: Vec<(u64, u64)> = results
        .iter()
        .flat_map(|(_, r)| r.iter().copied())
        .collect();
    runs.sort();
    assert!(!runs.is_empty(), "the workers logged their evictions");
    for pair in runs.windows(2) {
        assert!(pair[1].0 >= pair[0].1, "two evictions overlapped: {pair:?}");
    }

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

/// Bytes of the page objects under the shared prefix, read from the S3 server's data folder.
fn prefix_bytes(prefix_dir: &Path) -> u64 {
    let Ok(files) = std::fs::read_dir(prefix_dir) else {
        return 0;
    };
    files
        .flatten()
        .filter(|f| !f.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|f| f.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

#[test]
fn four_processes_share_one_prefix_on_s3_under_one_capacity() {
    const WORKERS: u64 = 4;
    const ROUNDS: u64 = 60;
    let server = S3Server::shared();
    let spec = format!(
        "{} {} {} {}",
        server.endpoint(),
        server.bucket,
        server.access_key,
        server.secret_key
    );
    let prefix_dir = server.data_dir().join(&server.bucket).join(PREFIX);
    let tmp = tempfile::tempdir().unwrap();
    let written = (WORKERS * ROUNDS * 4 + COMMON) * PAGE as u64;
    let capacity = written / 3;
    let step = capacity - (capacity as f64 * LOW_WATERMARK) as u64;
    let workers: Vec<Worker> = (0..WORKERS)
        .map(|id| {
            spawn_worker_on(
                tmp.path(),
                Some(&spec),
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
    let total = |name: &str| {
        results
            .iter()
            .map(|(c, _)| c.get(name).copied().unwrap_or(0))
            .sum::<u64>()
    };
    println!(
        "4 processes, one shared prefix on s3s-fs: {} hits checked ({} of other processes' pages), \
         {} misses, {} evictions in {} runs, {} spared, peak {} of capacity {} + step {} ({samples} samples)",
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
    assert_eq!(total("bad_hits"), 0, "every hit is byte-exact");
    assert_eq!(
        total("get_errors") + total("put_errors"),
        0,
        "no call failed"
    );
    for (i, (counts, _)) in results.iter().enumerate() {
        assert!(
            counts.get("hits_of_others").copied().unwrap_or(0) > 0,
            "worker {i} read pages the others stored: {counts:?}"
        );
    }
    assert!(
        total("evicted") > 0,
        "the capacity made the processes evict"
    );
    assert!(
        samples > 10,
        "the prefix was sampled while the processes ran"
    );
    // Other nodes' puts are seen at the next listing: one more step of slack.
    assert!(
        peak <= capacity + 2 * step,
        "the prefix held {peak} bytes at a sample: over the capacity {capacity} plus two steps"
    );
    let mut runs: Vec<(u64, u64)> = results
        .iter()
        .flat_map(|(_, r)| r.iter().copied())
        .collect();
    runs.sort();
    assert!(!runs.is_empty(), "the workers logged their evictions");
    for pair in runs.windows(2) {
        assert!(pair[1].0 >= pair[0].1, "two evictions overlapped: {pair:?}");
    }
    let left = prefix_bytes(&prefix_dir);
    assert!(
        left <= capacity + step,
        "{left} bytes left under the prefix"
    );
}

/// The lease file's holder process, if the lease is held.
fn lease_holder(dir: &Path) -> Option<u32> {
    lease_holder_in(&dir.join("a").join(".kvtier.lease"))
}

/// The holder process a lease file or object names, if the lease is held.
fn lease_holder_in(lease: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(lease).ok()?;
    let holder = text.split_whitespace().next()?;
    holder.split(':').nth(1)?.parse().ok()
}

fn kill(child: &mut Child) {
    // SAFETY: plain kill(2) of a child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
}

#[test]
fn an_evictor_killed_holding_the_lease_is_taken_over_and_nothing_torn_survives() {
    const WORKERS: u64 = 3;
    const ROUNDS: u64 = 400;
    const LEASE_MS: u64 = 1_000;
    let tmp = tempfile::tempdir().unwrap();
    let capacity = 200 * PAGE as u64;
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|id| spawn_worker(tmp.path(), id, WORKERS, ROUNDS, capacity, LEASE_MS))
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
        let Some(pid) = lease_holder(tmp.path()) else {
            continue;
        };
        let Some(i) = workers.iter().position(|w| w.child.id() == pid) else {
            continue;
        };
        kill(&mut workers[i].child);
        if lease_holder(tmp.path()) == Some(pid) {
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
        match lease_holder(tmp.path()) {
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
        let mut w = spawn_worker(tmp.path(), id, WORKERS, ROUNDS, capacity, LEASE_MS);
        w.ready();
        std::thread::sleep(Duration::from_millis(delay_ms));
        kill(&mut w.child);
        let (_, temps) = folder_bytes(tmp.path());
        let tag = format!("-{}-", w.child.id());
        left += temps
            .iter()
            .filter(|t| t.to_string_lossy().contains(&tag))
            .count();
    }
    let survivors: Vec<_> = workers.into_iter().map(Worker::finish).collect();
    let takeovers: u64 = survivors
        .iter()
        .map(|(c, _)| c.get("takeovers").copied().unwrap_or(0))
        .sum();
    let cleaned: u64 = survivors
        .iter()
        .map(|(c, _)| c.get("temps_removed").copied().unwrap_or(0))
        .sum();
    let bad: u64 = survivors
        .iter()
        .map(|(c, _)| c.get("bad_hits").copied().unwrap_or(0))
        .sum();
    println!(
        "evictor killed holding the lease: taken over after {taken_over:?} (lease {LEASE_MS} ms), \
         {takeovers} takeover(s) counted by the survivors"
    );
    assert!(
        taken_over < Duration::from_millis(LEASE_MS) * 2 + Duration::from_secs(2),
        "the lease was taken over within its expiry (took {taken_over:?})"
    );
    assert_eq!(bad, 0, "no torn or foreign bytes were served");

    // A restart: leftovers of the killed processes go, everything present is whole.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (_, before) = folder_bytes(tmp.path());
        let tier = NixlFileTier::open(config(tmp.path(), capacity, Duration::from_secs(5)))
            .await
            .unwrap();
        let (_, after) = folder_bytes(tmp.path());
        assert!(
            after.is_empty(),
            "temp files outlived the restart: {after:?}"
        );
        let stats = tier.fleet_stats().unwrap();
        assert_eq!(stats.temps_removed as usize, before.len());
        let found = verify_all(&tier, WORKERS, ROUNDS * 4).await;
        println!(
            "killed writers left {left} temp file(s): {cleaned} removed by the survivors' \
             scans, {} by the restart; {found} pages whole after it",
            before.len()
        );
        assert!(
            cleaned + before.len() as u64 >= left as u64,
            "every leftover was removed"
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

#[test]
fn an_evictor_of_a_shared_prefix_killed_holding_the_lease_is_taken_over() {
    const WORKERS: u64 = 3;
    const ROUNDS: u64 = 150;
    const LEASE_MS: u64 = 1_000;
    let server = S3Server::shared();
    let spec = format!(
        "{} {} {} {}",
        server.endpoint(),
        server.bucket,
        server.access_key,
        server.secret_key
    );
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
                Some(&spec),
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
    let sum = |name: &str| {
        survivors
            .iter()
            .map(|(c, _)| c.get(name).copied().unwrap_or(0))
            .sum::<u64>()
    };
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
