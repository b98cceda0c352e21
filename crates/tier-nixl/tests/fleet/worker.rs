//! The child process of the fleet tests: stores, reads and removes pages of a shared folder or
//! prefix, checking every hit, and prints what it counted.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier};
use tier_nixl::{FileAccess, NixlFileConfig, NixlFileTier, PageChecksum, SharedLocks};
use tier_object::{ObjectTier, ObjectTierConfig, PrefixAccess, S3Settings};
use tier_tests::content;
use tier_tests::rng::Rng;

pub const PAGE: usize = 64 << 10;
/// Pages a worker puts in one call: its own four and four common ones.
pub const BATCH: u64 = 8;
/// Pages every process writes under the same keys (chain hashes of a common prefix).
pub const COMMON: u64 = 96;
pub const LOW_WATERMARK: f64 = 0.9;
/// How a worker's line reporting a failed or wrong call begins.
pub const FAILURE_LINE: &str = "kvtier-fleet-failure ";

pub fn own_key(worker: u64, n: u64) -> PageKey {
    PageKey::new(format!(
        "w{worker}-{n:06}-{:048x}",
        (n + 1) * 0x9e37_79b9 + worker
    ))
    .unwrap()
}

pub fn common_key(n: u64) -> PageKey {
    PageKey::new(format!("common-{n:04}-{:048x}", (n + 7) * 0x2545_f491)).unwrap()
}

pub fn config(dir: &Path, capacity: u64, lease: Duration) -> NixlFileConfig {
    let mut c = NixlFileConfig::new([dir.join("a"), dir.join("b")]);
    c.access = FileAccess::Shared;
    c.capacity_bytes = Some(capacity);
    c.shared.lease = lease;
    c.shared.low_watermark = LOW_WATERMARK;
    c.shared.touch_interval = Duration::from_millis(200);
    if std::env::var("KVTIER_FLEET_LOCKS").is_ok_and(|l| l == "none") {
        c.shared.locks = SharedLocks::None;
    }
    if std::env::var("KVTIER_FLEET_CHECKSUM").is_ok_and(|l| l == "off") {
        c.page_checksum = PageChecksum::Off;
    }
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
pub enum Target {
    File(NixlFileTier),
    Object(ObjectTier),
}

/// The shared prefix of the object tests.
pub const PREFIX: &str = "fleet";

pub fn object_config(capacity: u64, lease: Duration) -> ObjectTierConfig {
    let mut c = ObjectTierConfig::new(PREFIX);
    c.access = PrefixAccess::Shared;
    c.capacity_bytes = Some(capacity);
    c.shared.lease = lease;
    c.shared.low_watermark = LOW_WATERMARK;
    c.shared.relist = Duration::from_millis(50);
    c
}

pub fn s3_store(spec: &str) -> Arc<dyn object_store::ObjectStore> {
    let parts: Vec<&str> = spec.split_whitespace().collect();
    S3Settings::endpoint(parts[0], parts[1], parts[2], parts[3])
        .build()
        .unwrap()
}

impl Target {
    pub async fn open(dir: &str, capacity: u64, lease: Duration) -> Self {
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

    pub fn counts(&self) -> Vec<(&'static str, u64)> {
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

/// Reads a setting the parent may leave out.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).map_or(default, |_| env(name))
}

/// The child: `KVTIER_FLEET_ROUNDS` rounds of a put of 4 own and 4 common pages, a get of 8
/// pages of any process, and now and then a remove of an own page; then prints its counts.
/// With `KVTIER_FLEET_LANES` (default 1) it runs that many such lanes at once, each on a
/// thread of its own with keys of its own; with `KVTIER_FLEET_CLEAR_EVERY` its first lane
/// clears the tier every that many rounds.
pub async fn run(dir: String) {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter("tier_nixl=debug,tier_folder=debug,tier_object=debug")
        .with_writer(std::io::stdout)
        .init();
    let capacity: u64 = env("KVTIER_FLEET_CAPACITY");
    let lease = Duration::from_millis(env("KVTIER_FLEET_LEASE_MS"));
    let tier = Arc::new(Target::open(&dir, capacity, lease).await);
    println!("kvtier-fleet-ready");
    let lanes: u64 = env_or("KVTIER_FLEET_LANES", 1);
    let running: Vec<_> = (0..lanes)
        .map(|lane| tokio::spawn(run_lane(Arc::clone(&tier), lane, lanes)))
        .collect();
    let mut counts = HashMap::<&str, u64>::new();
    for lane in running {
        for (name, n) in lane.await.expect("a lane ends") {
            *counts.entry(name).or_default() += n;
        }
    }
    // As an engine closing its hierarchy does: what the puts left to the background is done.
    tier.flush().await.expect("a flush settles the shared tier");
    for (name, n) in tier.counts() {
        counts.insert(name, n);
    }
    let line: Vec<String> = counts.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("kvtier-fleet-result {}", line.join(" "));
}

/// One lane of a worker (see [`run`]): its own keys are those of worker `id + workers * lane`.
async fn run_lane(tier: Arc<Target>, lane: u64, lanes: u64) -> HashMap<&'static str, u64> {
    let (id, workers, rounds): (u64, u64, u64) = (
        env("KVTIER_FLEET_ID"),
        env("KVTIER_FLEET_WORKERS"),
        env("KVTIER_FLEET_ROUNDS"),
    );
    let clear_every: u64 = env_or("KVTIER_FLEET_CLEAR_EVERY", 0);
    let me = id + workers * lane;
    let mut rng = Rng::new(0xf1ee7 + me);
    let mut counts = HashMap::<&str, u64>::new();
    for round in 0..rounds {
        let mut batch: Vec<Page<'static>> = (0..BATCH / 2)
            .map(|j| {
                let k = own_key(me, round * 4 + j);
                Page::new(k.clone(), content::page(&k, 1, PAGE))
            })
            .collect();
        batch.extend((0..BATCH / 2).map(|_| {
            let k = common_key(rng.below(COMMON));
            Page::new(k.clone(), content::page(&k, 1, PAGE))
        }));
        for (page, r) in batch.iter().zip(tier.put(&batch).await) {
            match r {
                Ok(()) => *counts.entry("puts").or_default() += 1,
                Err(e) => {
                    *counts.entry("put_errors").or_default() += 1;
                    println!("{FAILURE_LINE}{}: put failed: {e}", page.key);
                }
            }
        }
        // Reads: pages any process may have stored by now.
        let wanted: Vec<(PageKey, bool)> = (0..8)
            .map(|j| {
                if j % 4 == 3 {
                    (common_key(rng.below(COMMON)), false)
                } else {
                    let w = rng.below(workers * lanes);
                    let n = rng.below((round + 1) * 4);
                    (own_key(w, n), w % workers != id)
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
                        println!("{FAILURE_LINE}{k}: wrong bytes: {e}");
                    }
                }
                Ok(Lookup::Miss) => *counts.entry("misses").or_default() += 1,
                Err(e) => {
                    *counts.entry("get_errors").or_default() += 1;
                    println!("{FAILURE_LINE}{k}: get failed: {e}");
                }
            }
        }
        if round % 5 == 4 {
            let gone = own_key(me, rng.below((round + 1) * 4));
            for r in tier.remove(&[gone]).await {
                if r.expect("a remove works") {
                    *counts.entry("removed").or_default() += 1;
                }
            }
        }
        if lane == 0 && clear_every > 0 && round % clear_every == clear_every - 1 {
            match tier.clear().await {
                Ok(()) => *counts.entry("clears").or_default() += 1,
                Err(e) => {
                    *counts.entry("clear_errors").or_default() += 1;
                    println!("{FAILURE_LINE}clear failed: {e}");
                }
            }
        }
    }
    counts
}
