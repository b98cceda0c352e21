//! `kvtier bench`: fio for KV tiers. Puts, gets, exists and removes of fixed-size pages in
//! batches, with a number of batches in flight, on any config; beside each operation a
//! baseline on the same medium measured in the same run, interleaved round by round: a memcpy
//! for a DRAM top tier, a plain file per page in a folder beside a NIXL FILE tier's, a direct
//! object_store loop on an object tier's store. Medians of the rounds.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use tier_core::{Bytes, Lookup, Page, PageKey, ReadSlot, StorageTier};
use tier_hierarchy::config::{HierarchyConfig, Registry};
use tier_hierarchy::Hierarchy;

mod baseline;
pub mod fault;

use baseline::Baseline;

/// One measured operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Store pages.
    Put,
    /// Read pages into buffers.
    Get,
    /// Leading run present.
    Exists,
    /// Remove pages.
    Remove,
}

/// What to run.
#[derive(clap::Args)]
pub struct Settings {
    /// Bytes per page.
    #[arg(long, default_value_t = 64 << 10)]
    pub page_bytes: usize,
    /// Pages per call.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Pages per operation and round.
    #[arg(long, default_value_t = 4096)]
    pub pages: usize,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Operations, in order, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "put,get,exists,remove")]
    pub ops: Vec<Op>,
    /// Rounds (kvtier and baseline interleaved); medians are reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Keep starting rounds until this many seconds have passed (at least `--rounds` run).
    #[arg(long)]
    pub duration: Option<f64>,
    /// An outage instead of rounds: `freeze-after=N[,for=SECS][,timeout=SECS][,tier=LEVEL]`.
    /// Stores `--pages` pages, then gets `--batch` at a time: N gets, then the level (default
    /// the last) stops answering for `for` seconds (5), each of its calls failing after
    /// `timeout` (1, its own bound), then gets until it is back up; prints per-call latency
    /// of each phase.
    #[arg(long)]
    pub fault: Option<fault::FaultSpec>,
}

/// One operation's figures: medians over rounds for rates, all batches for latencies.
#[derive(Debug, Serialize)]
pub struct OpReport {
    pub op: Op,
    /// Rounds the medians are of.
    pub rounds: usize,
    /// Pages a get did not find, or an exists found past the end of its batch's leading run,
    /// over all rounds.
    pub missed: u64,
    pub pages_per_s: f64,
    /// Page bytes moved per second (puts and gets).
    pub gb_per_s: Option<f64>,
    pub latency_us: Percentiles,
    pub cpu_s: f64,
    pub baseline: Option<String>,
    pub baseline_pages_per_s: Option<f64>,
}

/// Batch latencies, microseconds.
#[derive(Debug, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
}

impl Percentiles {
    fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        let at = |q: f64| {
            samples
                .get(((samples.len().saturating_sub(1)) as f64 * q).round() as usize)
                .map_or(0.0, |d| d.as_secs_f64() * 1e6)
        };
        Self {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            p999: at(0.999),
        }
    }
}

/// CPU seconds this process has used (user and system).
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The content every page is put with (a get must read exactly it back).
fn page_data(len: usize) -> Bytes {
    Bytes::from((0..len).map(|i| (i * 31 % 251) as u8).collect::<Vec<u8>>())
}

/// What one operation did to every page: per-batch latencies and the pages it missed.
struct Pass {
    latencies: Vec<Duration>,
    /// Pages a get or an exists did not find (the tier let them go, or never took them).
    missed: usize,
}

/// Runs one operation through the hierarchy on every page. A page that fails (an error) fails
/// the run; a page that is missing is counted. A missed get leaves its buffer empty.
async fn run_tier(
    h: &Hierarchy,
    op: Op,
    s: &Settings,
    keys: &[PageKey],
    data: &Bytes,
    bufs: &mut [Vec<u8>],
) -> Result<Pass, String> {
    let jobs = keys
        .chunks(s.batch)
        .zip(bufs.chunks_mut(s.batch))
        .map(|(keys, bufs)| async move {
            let t = Instant::now();
            let (failed, missed) = match op {
                Op::Put => {
                    let pages: Vec<Page<'static>> = keys
                        .iter()
                        .map(|k| Page::new(k.clone(), data.clone()))
                        .collect();
                    let failed = h.put(&pages).await.iter().filter(|r| r.is_err()).count();
                    (failed, 0)
                }
                Op::Get => {
                    let mut slots = read_slots(keys, bufs);
                    let results = h.get(&mut slots).await;
                    drop(slots);
                    let failed = results.iter().filter(|r| r.is_err()).count();
                    let mut missed = 0;
                    for (r, b) in results.iter().zip(bufs.iter_mut()) {
                        if matches!(r, Ok(Lookup::Miss)) {
                            missed += 1;
                            b.clear();
                        }
                    }
                    (failed, missed)
                }
                Op::Exists => match h.exists(keys).await {
                    Ok(n) => (0, keys.len() - n),
                    Err(_) => (keys.len(), 0),
                },
                Op::Remove => {
                    let failed = h.remove(keys).await.iter().filter(|r| r.is_err()).count();
                    (failed, 0)
                }
            };
            (t.elapsed(), failed, missed)
        });
    let done: Vec<(Duration, usize, usize)> = futures::stream::iter(jobs)
        .buffer_unordered(s.concurrency)
        .collect()
        .await;
    let failed: usize = done.iter().map(|d| d.1).sum();
    if failed > 0 {
        return Err(format!("{op:?}: {failed} of {} pages failed", keys.len()));
    }
    Ok(Pass {
        missed: done.iter().map(|d| d.2).sum(),
        latencies: done.into_iter().map(|d| d.0).collect(),
    })
}

/// Most rounds a `--duration` runs (the latencies of every batch are kept).
const MAX_ROUNDS: usize = 10_000;

/// Runs the benchmark: `rounds` rounds (or more, until `duration`), each every op on kvtier
/// then on the baseline.
pub async fn bench(
    registry: &Registry,
    config: &HierarchyConfig,
    s: &Settings,
    mut progress: impl FnMut(usize),
) -> Result<Vec<OpReport>, String> {
    let h = registry.build(config).await.map_err(|e| e.to_string())?;
    let mut baseline = Baseline::for_config(config).map_err(|e| e.to_string())?;
    let data = page_data(s.page_bytes);
    let mut bufs: Vec<Vec<u8>> = (0..s.pages).map(|_| vec![0u8; s.page_bytes]).collect();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); s.ops.len()];
    let mut base_rates: Vec<Vec<f64>> = vec![Vec::new(); s.ops.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); s.ops.len()];
    let mut latencies: Vec<Vec<Duration>> = vec![Vec::new(); s.ops.len()];
    let mut missed: Vec<u64> = vec![0; s.ops.len()];
    let started = Instant::now();
    let more_time = |round: usize| {
        s.duration
            .is_some_and(|d| started.elapsed() < Duration::from_secs_f64(d))
            && round < MAX_ROUNDS
    };
    let mut round = 0;
    while round < s.rounds || more_time(round) {
        let names: Vec<String> = (0..s.pages)
            .map(|i| format!("bench-{round}-{i:08}"))
            .collect();
        let keys: Vec<PageKey> = names
            .iter()
            .map(|n| PageKey::new(n.as_str()).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        for (n, &op) in s.ops.iter().enumerate() {
            for b in bufs.iter_mut() {
                b.fill(0);
            }
            let (t, c) = (Instant::now(), cpu_seconds());
            let pass = run_tier(&h, op, s, &keys, &data, &mut bufs).await?;
            let secs = t.elapsed().as_secs_f64().max(1e-9);
            cpu[n].push(cpu_seconds() - c);
            rates[n].push(s.pages as f64 / secs);
            latencies[n].extend(pass.latencies);
            missed[n] += pass.missed as u64;
            // A missed page's buffer was emptied; every page found must be the one put.
            if op == Op::Get && bufs.iter().any(|b| !b.is_empty() && b[..] != data[..]) {
                return Err("get: a page read back differs from the one put".into());
            }
            for b in bufs.iter_mut() {
                b.resize(s.page_bytes, 0);
            }
            if let Some(b) = baseline.as_mut() {
                if let Some(d) = b.run(op, s, &names, &data, &mut bufs).await? {
                    base_rates[n].push(s.pages as f64 / d.as_secs_f64().max(1e-9));
                }
            }
        }
        if !s.ops.contains(&Op::Remove) {
            // Untimed: the next round starts from what the tier held before this one.
            h.remove(&keys).await;
            if let Some(b) = baseline.as_mut() {
                b.run(Op::Remove, s, &names, &data, &mut bufs).await?;
            }
        }
        round += 1;
        progress(round);
    }
    h.close().await.map_err(|e| e.to_string())?;
    Ok(s.ops
        .iter()
        .enumerate()
        .map(|(n, &op)| {
            let pages_per_s = median(rates[n].clone());
            OpReport {
                op,
                rounds: rates[n].len(),
                missed: missed[n],
                pages_per_s,
                gb_per_s: matches!(op, Op::Put | Op::Get)
                    .then(|| pages_per_s * s.page_bytes as f64 / 1e9),
                latency_us: Percentiles::of(std::mem::take(&mut latencies[n])),
                cpu_s: median(cpu[n].clone()),
                baseline: (!base_rates[n].is_empty())
                    .then(|| baseline.as_ref().map(|b| b.name().to_string()))
                    .flatten(),
                baseline_pages_per_s: (!base_rates[n].is_empty())
                    .then(|| median(base_rates[n].clone())),
            }
        })
        .collect())
}

/// The report as a table.
pub fn render(reports: &[OpReport], s: &Settings) -> String {
    let mut out = format!(
        "{} pages of {} bytes, batch {}, {} batch(es) in flight, medians of {} interleaved round(s)\n",
        s.pages,
        s.page_bytes,
        s.batch,
        s.concurrency,
        reports.first().map_or(s.rounds, |r| r.rounds)
    );
    out += &format!(
        "{:<7} {:>11} {:>8} {:>10} {:>10} {:>10} {:>10} {:>7} | {:>11} {:>7}  baseline\n",
        "op",
        "pages/s",
        "GB/s",
        "p50 us",
        "p90 us",
        "p99 us",
        "p99.9 us",
        "CPU s",
        "pages/s",
        "ratio"
    );
    for r in reports {
        let l = &r.latency_us;
        out += &format!(
            "{:<7} {:>11.0} {:>8} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>7.2} | ",
            format!("{:?}", r.op).to_lowercase(),
            r.pages_per_s,
            r.gb_per_s.map_or("-".into(), |g| format!("{g:.2}")),
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            r.cpu_s
        );
        out += &match (r.baseline_pages_per_s, &r.baseline) {
            (Some(b), Some(name)) => {
                format!("{b:>11.0} {:>6.2}x  {name}\n", r.pages_per_s / b.max(1e-9))
            }
            _ => format!("{:>11} {:>7}  none\n", "-", "-"),
        };
    }
    for r in reports.iter().filter(|r| r.missed > 0) {
        out += &format!(
            "{}: {} of {} pages missed over {} round(s): the tier did not hold every page (too small a capacity?); its rate counts the misses\n",
            format!("{:?}", r.op).to_lowercase(),
            r.missed,
            s.pages * r.rounds,
            r.rounds
        );
    }
    out
}

#[cfg(test)]
mod tests;

/// A get's slots: each key's page read into its buffer.
fn read_slots<'b>(keys: &[PageKey], bufs: &'b mut [Vec<u8>]) -> Vec<ReadSlot<'b>> {
    keys.iter()
        .zip(bufs.iter_mut())
        .map(|(k, b)| ReadSlot::new(k.clone(), b))
        .collect()
}
