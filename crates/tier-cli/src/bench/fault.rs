//! `kvtier bench --fault freeze-after=N`: per-call latency of gets before, during and after an
//! outage of one lower tier. The tier is frozen as a store that stops answering is: every call
//! waits, and fails once its own bound (`timeout`) passes, for `for` seconds; the hierarchy's
//! breaker, deadlines and probes act as they would on a real outage.

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tier_core::{
    async_trait, Bytes, GetResult, Lookup, Page, PageKey, PutResult, ReadSlot, RemoveResult,
    StorageTier, TierError, TierInfo, TierStats,
};
use tier_hierarchy::config::{HierarchyConfig, Registry};
use tier_hierarchy::{Hierarchy, TierState};

use super::{page_data, Percentiles, Settings};

/// What `--fault` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpec {
    /// Gets before the outage.
    pub freeze_after: usize,
    /// How long the tier stays frozen.
    pub lasts: Duration,
    /// The frozen tier's own bound: a call there fails after it (a store's request timeout).
    pub timeout: Duration,
    /// The level frozen (default: the last).
    pub tier: Option<usize>,
}

impl FromStr for FaultSpec {
    type Err = String;

    /// `freeze-after=N[,for=SECS][,timeout=SECS][,tier=LEVEL]`.
    fn from_str(text: &str) -> Result<Self, String> {
        let mut spec = FaultSpec {
            freeze_after: 0,
            lasts: Duration::from_secs(5),
            timeout: Duration::from_secs(1),
            tier: None,
        };
        let mut freeze_after = None;
        for part in text.split(',') {
            let (name, value) = part.split_once('=').ok_or_else(|| {
                format!("--fault: {part:?} is not name=value (freeze-after=N[,for=SECS][,timeout=SECS][,tier=LEVEL])")
            })?;
            let count = || {
                value
                    .parse::<usize>()
                    .map_err(|_| format!("--fault: {name}={value:?} is not a whole number"))
            };
            let secs = || match value.trim_end_matches('s').parse::<f64>() {
                Ok(s) if s > 0.0 && s <= 3600.0 => Ok(Duration::from_secs_f64(s)),
                _ => Err(format!(
                    "--fault: {name}={value:?} is not a number of seconds above 0, at most 3600"
                )),
            };
            match name {
                "freeze-after" => freeze_after = Some(count()?),
                "for" => spec.lasts = secs()?,
                "timeout" => spec.timeout = secs()?,
                "tier" => spec.tier = Some(count()?),
                other => {
                    return Err(format!(
                        "--fault: unknown {other:?}; known: freeze-after, for, timeout, tier"
                    ))
                }
            }
        }
        spec.freeze_after =
            freeze_after.ok_or("--fault needs freeze-after=N (gets before the outage)")?;
        Ok(spec)
    }
}

/// When a frozen tier answers again (`None`: it is not frozen).
#[derive(Default)]
struct Switch {
    thaw_at: Mutex<Option<Instant>>,
}

impl Switch {
    fn freeze(&self, lasts: Duration) {
        *self.thaw_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + lasts);
    }

    fn thaw_at(&self) -> Option<Instant> {
        let thaw_at = *self.thaw_at.lock().unwrap_or_else(|e| e.into_inner());
        thaw_at.filter(|t| *t > Instant::now())
    }
}

/// A tier that stops answering while its switch says so.
struct Freezable {
    inner: Arc<dyn StorageTier>,
    switch: Arc<Switch>,
    timeout: Duration,
}

impl Freezable {
    /// Waits while frozen: until the thaw (`true`), or until the tier's own bound passes
    /// first (`false`: the call fails with a timeout).
    async fn answers(&self) -> bool {
        let Some(thaw_at) = self.switch.thaw_at() else {
            return true;
        };
        let bound = Instant::now() + self.timeout;
        tokio::time::sleep_until(thaw_at.min(bound).into()).await;
        thaw_at <= bound
    }

    fn timed_out(&self, op: &'static str) -> TierError {
        TierError::Timeout {
            op,
            after: self.timeout,
        }
    }

    fn each_timed_out<T>(&self, op: &'static str, n: usize) -> Vec<Result<T, TierError>> {
        (0..n).map(|_| Err(self.timed_out(op))).collect()
    }
}

#[async_trait]
impl StorageTier for Freezable {
    fn info(&self) -> TierInfo {
        self.inner.info()
    }

    fn stats(&self) -> TierStats {
        self.inner.stats()
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        match self.answers().await {
            true => self.inner.put(pages).await,
            false => self.each_timed_out("frozen put", pages.len()),
        }
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        match self.answers().await {
            true => self.inner.get(slots).await,
            false => self.each_timed_out("frozen get", slots.len()),
        }
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        match self.answers().await {
            true => self.inner.exists(keys).await,
            false => Err(self.timed_out("frozen exists")),
        }
    }

    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        self.inner.touch(keys).await
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        match self.answers().await {
            true => self.inner.remove(keys).await,
            false => self.each_timed_out("frozen remove", keys.len()),
        }
    }

    async fn clear(&self) -> Result<(), TierError> {
        match self.answers().await {
            true => self.inner.clear().await,
            false => Err(self.timed_out("frozen clear")),
        }
    }

    async fn flush(&self) -> Result<(), TierError> {
        match self.answers().await {
            true => self.inner.flush().await,
            false => Err(self.timed_out("frozen flush")),
        }
    }
}

/// The pause between gets while the tier is down (requests arrive at a rate, not in a spin).
const PACE: Duration = Duration::from_millis(10);

/// One phase's gets.
#[derive(Debug, Serialize)]
pub struct Phase {
    pub name: &'static str,
    pub calls: usize,
    /// Pages found, of pages asked for.
    pub hits: usize,
    pub pages: usize,
    pub latency_us: Percentiles,
    pub max_us: f64,
    /// The first calls' latencies, microseconds.
    pub first_us: Vec<f64>,
}

/// What `--fault` measured.
#[derive(Debug, Serialize)]
pub struct FaultReport {
    pub tier: String,
    pub level: usize,
    pub freeze_after: usize,
    pub lasts_s: f64,
    pub timeout_s: f64,
    pub phases: Vec<Phase>,
    /// From the thaw to the tier up again, if it came back during the run.
    pub back_up_after_thaw_s: Option<f64>,
    /// The hierarchy's health metrics at the end.
    pub metrics: Vec<String>,
}

/// Gets of one batch: latency and hits.
async fn get_batch(h: &Hierarchy, keys: &[PageKey], bufs: &mut [Vec<u8>]) -> (Duration, usize) {
    let started = Instant::now();
    let mut slots = super::read_slots(keys, bufs);
    let results = h.get(&mut slots).await;
    let hits = results
        .iter()
        .filter(|r| matches!(r, Ok(Lookup::Hit)))
        .count();
    (started.elapsed(), hits)
}

fn phase(name: &'static str, calls: &[(Duration, usize)], batch: usize) -> Phase {
    let us = |d: &Duration| d.as_secs_f64() * 1e6;
    Phase {
        name,
        calls: calls.len(),
        hits: calls.iter().map(|c| c.1).sum(),
        pages: calls.len() * batch,
        latency_us: Percentiles::of(calls.iter().map(|c| c.0).collect()),
        max_us: calls.iter().map(|c| us(&c.0)).fold(0.0, f64::max),
        first_us: calls.iter().take(6).map(|c| us(&c.0)).collect(),
    }
}

/// Stores `--pages` pages, then gets them a batch at a time, cycling: `freeze_after` gets,
/// the tier frozen for `for` seconds while gets go on, then gets until the tier has been up
/// for `freeze_after` more.
pub async fn run(
    registry: &Registry,
    config: &HierarchyConfig,
    s: &Settings,
    fault: &FaultSpec,
) -> Result<FaultReport, String> {
    let levels = config.tiers.len();
    if levels < 2 {
        return Err(
            "--fault freezes a tier below the top, and this config has only one tier".into(),
        );
    }
    let level = fault.tier.unwrap_or(levels - 1);
    if level == 0 || level >= levels {
        return Err(format!(
            "--fault tier={level}: the level frozen must be below the top (1 to {}); this config has {levels} tier(s)",
            levels - 1
        ));
    }
    let switch = Arc::new(Switch::default());
    let wrap_switch = Arc::clone(&switch);
    let timeout = fault.timeout;
    let h = registry
        .build_with(config, move |i, tier| {
            if i != level {
                return tier;
            }
            Arc::new(Freezable {
                inner: tier,
                switch: Arc::clone(&wrap_switch),
                timeout,
            })
        })
        .await
        .map_err(|e| e.to_string())?;
    let data: Bytes = page_data(s.page_bytes);
    let keys: Vec<PageKey> = (0..s.pages)
        .map(|i| PageKey::new(format!("fault-{i:08}")).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    for batch in keys.chunks(s.batch) {
        let pages: Vec<Page<'static>> = batch
            .iter()
            .map(|k| Page::new(k.clone(), data.clone()))
            .collect();
        if let Some(e) = h.put(&pages).await.into_iter().find_map(Result::err) {
            return Err(format!("storing the pages: {e}"));
        }
    }
    h.flush().await.map_err(|e| e.to_string())?;
    let mut bufs: Vec<Vec<u8>> = (0..s.batch).map(|_| vec![0u8; s.page_bytes]).collect();
    let batches: Vec<&[PageKey]> = keys.chunks(s.batch).collect();
    let mut next = 0;
    let mut call = || {
        let batch = batches[next % batches.len()];
        next += 1;
        batch
    };
    let mut before = Vec::new();
    for _ in 0..fault.freeze_after {
        let batch = call();
        before.push(get_batch(&h, batch, &mut bufs[..batch.len()]).await);
    }
    switch.freeze(fault.lasts);
    let thaw_at = Instant::now() + fault.lasts;
    let mut during = Vec::new();
    while Instant::now() < thaw_at {
        let batch = call();
        during.push(get_batch(&h, batch, &mut bufs[..batch.len()]).await);
        tokio::time::sleep(PACE).await;
    }
    let mut after = Vec::new();
    let mut back_up = None;
    let give_up = Instant::now() + fault.lasts.max(Duration::from_secs(30));
    let mut up_calls = 0;
    while up_calls < fault.freeze_after.max(1) && Instant::now() < give_up {
        let batch = call();
        after.push(get_batch(&h, batch, &mut bufs[..batch.len()]).await);
        if h.health()[level].state == TierState::Up {
            back_up.get_or_insert(thaw_at.elapsed());
            up_calls += 1;
        } else {
            tokio::time::sleep(PACE).await;
        }
    }
    let metrics = h.health_metrics();
    let tier = config.tiers[level]
        .name
        .clone()
        .unwrap_or_else(|| config.tiers[level].kind.clone());
    h.close().await.map_err(|e| e.to_string())?;
    Ok(FaultReport {
        tier,
        level,
        freeze_after: fault.freeze_after,
        lasts_s: fault.lasts.as_secs_f64(),
        timeout_s: fault.timeout.as_secs_f64(),
        phases: vec![
            phase("before", &before, s.batch),
            phase("during", &during, s.batch),
            phase("after", &after, s.batch),
        ],
        back_up_after_thaw_s: back_up.map(|d| d.as_secs_f64()),
        metrics,
    })
}

/// The report as a table.
pub fn render(r: &FaultReport, s: &Settings) -> String {
    let mut out = format!(
        "fault: tier {} (level {}) frozen after {} get(s) for {:.1} s, its calls failing after {:.1} s; gets of {} pages of {} bytes, cycling over {} pages\n",
        r.tier, r.level, r.freeze_after, r.lasts_s, r.timeout_s, s.batch, s.page_bytes, s.pages
    );
    out += &format!(
        "{:<7} {:>6} {:>13} {:>10} {:>10} {:>10} {:>10}  first calls (ms)\n",
        "phase", "calls", "hits/pages", "p50 ms", "p90 ms", "p99 ms", "max ms"
    );
    for p in &r.phases {
        let first: Vec<String> = p
            .first_us
            .iter()
            .map(|us| format!("{:.3}", us / 1e3))
            .collect();
        out += &format!(
            "{:<7} {:>6} {:>13} {:>10.3} {:>10.3} {:>10.3} {:>10.3}  {}\n",
            p.name,
            p.calls,
            format!("{}/{}", p.hits, p.pages),
            p.latency_us.p50 / 1e3,
            p.latency_us.p90 / 1e3,
            p.latency_us.p99 / 1e3,
            p.max_us / 1e3,
            first.join(" ")
        );
    }
    out += &match r.back_up_after_thaw_s {
        Some(s) => format!("back up {:.3} s after the thaw\n", s),
        None => "not back up by the end of the run\n".into(),
    };
    for line in &r.metrics {
        out += line;
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_spec_parses_and_a_wrong_one_is_named() {
        let spec: FaultSpec = "freeze-after=7,for=2.5s,timeout=0.5,tier=1"
            .parse()
            .unwrap();
        assert_eq!(
            spec,
            FaultSpec {
                freeze_after: 7,
                lasts: Duration::from_millis(2500),
                timeout: Duration::from_millis(500),
                tier: Some(1),
            }
        );
        let defaults: FaultSpec = "freeze-after=3".parse().unwrap();
        assert_eq!(
            (defaults.lasts, defaults.timeout),
            (Duration::from_secs(5), Duration::from_secs(1))
        );
        for (wrong, names) in [
            ("for=3", "freeze-after=N"),
            ("freeze-after=x", "freeze-after=\"x\""),
            ("freeze-after=3,for=0", "for=\"0\""),
            ("freeze-after=3,for=nan", "for=\"nan\""),
            ("freeze-after=3,speed=9", "unknown \"speed\""),
            ("freeze-after", "not name=value"),
        ] {
            let e = wrong.parse::<FaultSpec>().unwrap_err();
            assert!(e.contains(names), "{wrong}: {e}");
        }
    }

    /// DRAM of 8 pages over a lower tier frozen for a second whose calls fail after 300 ms:
    /// before, every page is found; during, the breaker trips at the first timed-out call and
    /// the other gets take no time; after, the tier is back up and every page is found.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_outage_is_measured_before_during_and_after() {
        let settings = Settings {
            page_bytes: 4096,
            batch: 4,
            pages: 64,
            concurrency: 1,
            ops: Vec::new(),
            rounds: 1,
            duration: None,
            fault: None,
        };
        let config = HierarchyConfig::from_toml(
            "[hierarchy.health]\nprobe_backoff = \"100ms\"\nprobe_backoff_max = \"200ms\"\n\
             [[tiers]]\nkind = \"mem\"\npolicy = \"lru\"\ncapacity = \"40KiB\"\n\
             [[tiers]]\nkind = \"mem\"\nname = \"lower\"\ncapacity = \"16MiB\"\n",
        )
        .unwrap();
        let fault: FaultSpec = "freeze-after=16,for=1,timeout=0.3".parse().unwrap();
        let r = run(&crate::registry(), &config, &settings, &fault)
            .await
            .unwrap();
        let [before, during, after] = &r.phases[..] else {
            panic!("{r:?}")
        };
        assert_eq!((before.calls, before.hits), (16, 64), "{r:?}");
        assert!(
            during.max_us < 600_000.0,
            "a frozen call outlasted its bound: {r:?}"
        );
        assert!(
            during.latency_us.p90 < 50_000.0,
            "gets while down were not skipped: {r:?}"
        );
        assert!(during.hits < during.pages, "{r:?}");
        assert!(r.back_up_after_thaw_s.is_some(), "{r:?}");
        assert!(after.hits >= 64, "{r:?}");
        assert!(
            r.metrics
                .iter()
                .any(|l| l.starts_with("kvtier_tier_skipped_reads_total{")
                    && l.contains("tier=\"lower\"")
                    && !l.ends_with(" 0")),
            "{r:?}"
        );
        println!("{}", render(&r, &settings));
    }
}
