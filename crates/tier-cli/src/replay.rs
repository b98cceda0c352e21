//! Driving a trace through a hierarchy: per request, `exists` on its blocks, `get` the
//! reusable prefix, `put` the rest; then the report.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use tier_core::{Bytes, Lookup, Page, PageKey, ReadSlot, StorageTier, TierError};
use tier_hierarchy::{Hierarchy, TierState};

use crate::sim::{self, Curve, Ratio};
use crate::trace::Request;

/// What a replay measured.
pub struct Report {
    /// Blocks reused (read back from a tier) over blocks requested.
    pub ratio: Ratio,
    /// Reused pages whose bytes were not the ones written.
    pub corrupt: u64,
    /// Requests replayed.
    pub requests: usize,
    /// Wall time.
    pub elapsed: Duration,
    /// Per-request latencies, sorted.
    pub latencies: Vec<Duration>,
    /// Cumulative hit ratio after each request, for plots.
    pub curve: Curve,
    /// Per tier, its name and the cumulative share of requested blocks it served after each
    /// request.
    pub tier_curves: Vec<(String, Curve)>,
    /// Errors seen (puts or gets that failed).
    pub errors: u64,
    /// Reused blocks this process never stored: another process stored them in a tier they
    /// share.
    pub reused_from_others: u64,
}

/// The key of block `id`.
pub fn key(id: u64) -> PageKey {
    // 16 hex digits of the id, padded like a chain hash: always a valid key.
    PageKey::new(format!("{:048x}{id:016x}", 0))
        .unwrap_or_else(|_| unreachable!("hex keys are valid"))
}

/// The content of block `id`: its id in every 8-byte word, so a read is checkable.
fn content(id: u64, len: usize) -> Bytes {
    let word = id.to_le_bytes();
    Bytes::from((0..len).map(|i| word[i % 8]).collect::<Vec<u8>>())
}

fn intact(id: u64, buf: &[u8]) -> bool {
    let word = id.to_le_bytes();
    buf.iter().enumerate().all(|(i, b)| *b == word[i % 8])
}

/// Replays `trace` through `hierarchy` with pages of `page_bytes`.
pub async fn replay(
    hierarchy: &Hierarchy,
    trace: &[Request],
    page_bytes: usize,
    mut progress: impl FnMut(usize),
) -> Result<Report, TierError> {
    let mut ratio = Ratio::default();
    let (mut corrupt, mut errors) = (0u64, 0u64);
    let mut latencies = Vec::with_capacity(trace.len());
    let mut curve = Vec::with_capacity(trace.len());
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    let mut stored_here = HashSet::new();
    let mut reused_from_others = 0;
    let served = |h: &Hierarchy| -> Vec<u64> {
        h.hierarchy_stats()
            .levels
            .iter()
            .map(|l| l.served)
            .collect()
    };
    let served_before = served(hierarchy);
    let mut tier_curves: Vec<(String, Curve)> = hierarchy
        .tiers()
        .iter()
        .map(|t| (t.info().name, Vec::with_capacity(trace.len())))
        .collect();
    let started = Instant::now();
    for (n, request) in trace.iter().enumerate() {
        let t = Instant::now();
        let keys: Vec<PageKey> = request.hash_ids.iter().map(|id| key(*id)).collect();
        let present = hierarchy.exists(&keys).await?;
        if bufs.len() < present {
            bufs.resize_with(present, || vec![0u8; page_bytes]);
        }
        let mut slots: Vec<ReadSlot<'_>> = keys[..present]
            .iter()
            .zip(bufs.iter_mut())
            .map(|(k, b)| ReadSlot::new(k.clone(), b))
            .collect();
        let results = hierarchy.get(&mut slots).await;
        // The reusable prefix ends at the first page that could not be read.
        let mut reused = 0;
        for ((slot, result), id) in slots.iter().zip(&results).zip(&request.hash_ids) {
            match result {
                Ok(Lookup::Hit) if intact(*id, &slot.buf.to_vec()) => reused += 1,
                Ok(Lookup::Hit) => {
                    corrupt += 1;
                    break;
                }
                Ok(Lookup::Miss) => break,
                Err(_) => {
                    errors += 1;
                    break;
                }
            }
        }
        drop(slots);
        let others = request.hash_ids[..reused].iter();
        reused_from_others += others.filter(|id| !stored_here.contains(*id)).count() as u64;
        let pages: Vec<Page<'static>> = keys[reused..]
            .iter()
            .zip(&request.hash_ids[reused..])
            .map(|(k, id)| Page::new(k.clone(), content(*id, page_bytes)))
            .collect();
        let put = hierarchy.put(&pages).await;
        for (id, r) in request.hash_ids[reused..].iter().zip(&put) {
            match r {
                Ok(()) => drop(stored_here.insert(*id)),
                Err(_) => errors += 1,
            }
        }
        ratio.reused += reused as u64;
        ratio.requested += keys.len() as u64;
        latencies.push(t.elapsed());
        curve.push(ratio.value());
        let requested = ratio.requested.max(1) as f64;
        for ((_, c), (now, before)) in tier_curves
            .iter_mut()
            .zip(served(hierarchy).iter().zip(&served_before))
        {
            c.push((now - before) as f64 / requested);
        }
        progress(n + 1);
    }
    hierarchy.flush().await?;
    latencies.sort();
    Ok(Report {
        ratio,
        corrupt,
        requests: trace.len(),
        elapsed: started.elapsed(),
        latencies,
        curve,
        tier_curves,
        errors,
        reused_from_others,
    })
}

/// Tiers that failed and never stored a byte: a replay through them measured nothing, and
/// says so with its exit status.
pub fn failed_tiers(hierarchy: &Hierarchy) -> Vec<String> {
    hierarchy
        .hierarchy_stats()
        .levels
        .iter()
        .filter(|l| {
            (l.stats.errors > 0 || l.health.writes_skipped > 0) && l.stats.bytes_written == 0
        })
        .map(|l| match l.health.state {
            TierState::Down => format!(
                "{} ({} errors, {} page writes skipped: down, {})",
                l.info.name, l.stats.errors, l.health.writes_skipped, l.health.reason
            ),
            _ => format!("{} ({} errors)", l.info.name, l.stats.errors),
        })
        .collect()
}

/// What a reused block saves: the prefill of its tokens on the stated model and GPU.
#[derive(Debug, Clone, Copy)]
pub struct Prefill {
    /// Tokens a block (a trace's hash id) holds.
    pub block_tokens: u64,
    /// Prefill throughput of the model on its GPU, tokens per second.
    pub tokens_per_sec: f64,
}

/// Each tier's state line (for tiers not up or that changed state), and the load-or-recompute
/// lines: the time loading the blocks each tier served would take by its fitted estimate (a
/// call per request plus the bytes at its bandwidth) beside the prefill those blocks save.
fn health_and_seconds(
    stats: &tier_hierarchy::HierarchyStats,
    report: &Report,
    page_bytes: usize,
    prefill: Prefill,
) -> String {
    let mut out = String::new();
    for level in &stats.levels {
        let h = &level.health;
        if h.state != TierState::Up || h.transitions > 0 {
            out += &format!(
                "tier {}: {} for {:.1?} ({} state changes; {} page reads and {} writes skipped){}\n",
                level.info.name,
                h.state.as_str(),
                h.for_how_long,
                h.transitions,
                h.reads_skipped,
                h.writes_skipped,
                if h.reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", h.reason)
                }
            );
        }
    }
    let mut load = 0.0;
    let mut parts = Vec::new();
    for level in stats.levels.iter().filter(|l| l.served > 0) {
        let h = &level.health;
        match (h.read_latency, h.read_bandwidth) {
            (Some(latency), Some(bandwidth)) => {
                let secs = report.requests as f64 * latency.as_secs_f64()
                    + (level.served * page_bytes as u64) as f64 / bandwidth.max(1.0);
                load += secs;
                parts.push(format!("{} {:.3} s", level.info.name, secs));
            }
            _ => parts.push(format!("{} (no estimate)", level.info.name)),
        }
    }
    let served: u64 = stats.levels.iter().map(|l| l.served).sum();
    let saved = (served * prefill.block_tokens) as f64 / prefill.tokens_per_sec.max(1.0);
    out += &format!(
        "load or recompute: loading the {served} reused blocks takes {load:.3} s by the tiers' estimates ({}); recomputing them ({} tokens a block at {:.0} tokens/s of prefill) would take {saved:.1} s: {:.1} s saved\n",
        if parts.is_empty() { "none served".to_string() } else { parts.join(", ") },
        prefill.block_tokens,
        prefill.tokens_per_sec,
        saved - load
    );
    out
}

/// One tier's part of a replay, for `--json`.
#[derive(serde::Serialize)]
pub struct TierSummary {
    pub name: String,
    pub kind: String,
    /// Blocks this tier served for the replay.
    pub served: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Bytes written per byte the replay reused.
    pub written_per_reused: f64,
    pub evictions: u64,
    pub errors: u64,
}

/// The whole report, for `--json`.
#[derive(serde::Serialize)]
pub struct Summary {
    pub requests: usize,
    pub blocks_requested: u64,
    pub blocks_reused: u64,
    /// Reused blocks another process stored (in a tier they share).
    pub blocks_reused_from_others: u64,
    pub prefix_hit_ratio: f64,
    pub corrupt: u64,
    pub errors: u64,
    pub seconds: f64,
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
    pub tiers: Vec<TierSummary>,
    pub served_in_flight: u64,
    pub promotions: u64,
    pub copied_down: u64,
    pub demotions: u64,
    pub demotions_dropped: u64,
    pub not_admitted: u64,
    pub lower_errors: u64,
}

/// The report as data.
pub fn summary(hierarchy: &Hierarchy, report: &Report, page_bytes: usize) -> Summary {
    let stats = hierarchy.hierarchy_stats();
    let reused_bytes = (report.ratio.reused * page_bytes as u64).max(1) as f64;
    let pct = |p: f64| {
        report
            .latencies
            .get(((report.latencies.len() as f64 - 1.0) * p) as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1e6)
    };
    Summary {
        requests: report.requests,
        blocks_requested: report.ratio.requested,
        blocks_reused: report.ratio.reused,
        blocks_reused_from_others: report.reused_from_others,
        prefix_hit_ratio: report.ratio.value(),
        corrupt: report.corrupt,
        errors: report.errors,
        seconds: report.elapsed.as_secs_f64(),
        latency_p50_us: pct(0.50),
        latency_p99_us: pct(0.99),
        tiers: stats
            .levels
            .iter()
            .map(|l| TierSummary {
                name: l.info.name.clone(),
                kind: l.info.kind.clone(),
                served: l.served,
                bytes_read: l.stats.bytes_read,
                bytes_written: l.stats.bytes_written,
                written_per_reused: l.stats.bytes_written as f64 / reused_bytes,
                evictions: l.stats.evictions,
                errors: l.stats.errors,
            })
            .collect(),
        served_in_flight: stats.served_in_flight,
        promotions: stats.promotions,
        copied_down: stats.copied_down,
        demotions: stats.demotions,
        demotions_dropped: stats.demotions_dropped,
        not_admitted: stats.not_admitted,
        lower_errors: stats.lower_errors,
    }
}

/// How many pages of `page_bytes` the top tier holds, if it is bounded.
pub fn top_pages(hierarchy: &Hierarchy, page_bytes: usize) -> Option<usize> {
    let top = hierarchy.tiers().first()?.info().capacity_bytes?;
    // Entries of the DRAM tier weigh their key too.
    Some((top / (page_bytes as u64 + 64)).max(1) as usize)
}

/// The report as text: per tier, in total, and beside the offline simulations.
pub fn render(
    hierarchy: &Hierarchy,
    trace: &[Request],
    report: &Report,
    page_bytes: usize,
    top_policy: Option<tier_policy::PolicyKind>,
    prefill: Prefill,
) -> String {
    let mut out = String::new();
    let stats = hierarchy.hierarchy_stats();
    let requested = report.ratio.requested.max(1) as f64;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    out += &format!(
        "replayed {} requests, {} blocks requested, {} KiB pages, in {:.2?}\n\n",
        report.requests,
        report.ratio.requested,
        page_bytes >> 10,
        report.elapsed
    );
    // Write amplification: bytes a tier wrote per byte the replay reused.
    let reused_bytes = (report.ratio.reused * page_bytes as u64).max(1) as f64;
    out += &format!(
        "{:<12} {:<11} {:>9} {:>9} {:>11} {:>11} {:>13} {:>10} {:>7}\n",
        "tier",
        "kind",
        "served",
        "hit %",
        "read MiB",
        "written MiB",
        "written/reuse",
        "evictions",
        "errors"
    );
    for level in &stats.levels {
        out += &format!(
            "{:<12} {:<11} {:>9} {:>8.2}% {:>11.1} {:>11.1} {:>13.2} {:>10} {:>7}\n",
            level.info.name,
            level.info.kind,
            level.served,
            100.0 * level.served as f64 / requested,
            mib(level.stats.bytes_read),
            mib(level.stats.bytes_written),
            level.stats.bytes_written as f64 / reused_bytes,
            level.stats.evictions,
            level.stats.errors
        );
    }
    out += &format!(
        "{:<12} {:<11} {:>9} {:>8.2}%\n",
        "(in flight)",
        "queue",
        stats.served_in_flight,
        100.0 * stats.served_in_flight as f64 / requested
    );
    let total_served: u64 =
        stats.levels.iter().map(|l| l.served).sum::<u64>() + stats.served_in_flight;
    out += &format!(
        "{:<12} {:<11} {:>9} {:>8.2}%\n\n",
        "total",
        "",
        total_served,
        100.0 * total_served as f64 / requested
    );
    out += &format!(
        "prefix-hit ratio (reused / requested blocks): {:.2}%   corrupt pages: {}   errors: {}\n",
        100.0 * report.ratio.value(),
        report.corrupt,
        report.errors
    );
    let secs = report.elapsed.as_secs_f64().max(1e-9);
    let pct = |p: f64| {
        report
            .latencies
            .get(((report.latencies.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or_default()
    };
    out += &format!(
        "throughput: {:.0} pages/s ({:.0} requests/s); request latency p50 {:.2?}, p99 {:.2?}\n",
        report.ratio.requested as f64 / secs,
        report.requests as f64 / secs,
        pct(0.50),
        pct(0.99)
    );
    out += &format!(
        "moved between tiers: {:.1} MiB (promotions {}, copies down {}, demotions {}, dropped {}, not admitted {})\n",
        mib(stats.bytes_moved),
        stats.promotions,
        stats.copied_down,
        stats.demotions,
        stats.demotions_dropped,
        stats.not_admitted
    );
    out += &health_and_seconds(&stats, report, page_bytes, prefill);
    if let Some(pages) = top_pages(hierarchy, page_bytes) {
        let (lru, next_use, bound, all) = (
            sim::lru(trace, pages),
            sim::belady(trace, pages),
            sim::belady_blocks(trace, pages),
            sim::unbounded(trace),
        );
        out += &format!(
            "\ntop tier ({} pages): served {:.2}% | offline at that size: LRU {:.2}%, Belady's next-use rule {:.2}% (a heuristic under prefix reuse), Belady's block-hit bound {:.2}% (no policy exceeds it) | unbounded cache {:.2}%\n",
            pages,
            100.0 * stats.levels[0].served as f64 / requested,
            100.0 * lru.value(),
            100.0 * next_use.value(),
            100.0 * bound.value(),
            100.0 * all.value()
        );
        if let Some((kind, own)) = top_policy.and_then(|k| Some((k, sim::policy(trace, pages, k)?)))
        {
            out += &format!(
                "top tier's own policy ({kind}) simulated alone at that size: {:.2}%\n",
                100.0 * own.value()
            );
        }
    }
    out
}

/// The eviction policy of a config's top tier, as its kind resolves it: the one named, else
/// `lru` for a DRAM tier with an expiry, else the default.
pub fn top_policy(
    config: &tier_hierarchy::config::HierarchyConfig,
) -> Option<tier_policy::PolicyKind> {
    let top = config.tiers.first()?;
    match top.params.get("policy") {
        Some(serde_json::Value::String(name)) => name.parse().ok(),
        Some(_) => None,
        None if top.kind == "mem" && ["ttl", "tti"].iter().any(|f| top.params.contains_key(*f)) => {
            Some(tier_policy::PolicyKind::Lru)
        }
        None => Some(tier_policy::PolicyKind::default()),
    }
}

/// The replay as an SVG picture (drawn with plotters): left, the cumulative prefix-hit ratio
/// over requests, in total and per tier, beside the offline references at the top tier's size
/// (`top_pages`: LRU simulated, Belady's block-hit bound) and an unbounded cache; right, the
/// distribution of request latencies.
pub fn svg(report: &Report, trace: &[Request], top_pages: Option<usize>) -> Result<String, String> {
    use plotters::prelude::*;
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (1300, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let (left, right) = root.split_horizontally(800);
        let n = report.curve.len().max(1);
        let mut references: Vec<(String, Curve, RGBColor)> = Vec::new();
        let mut unbounded = Curve::new();
        sim::unbounded_curve(trace, &mut unbounded);
        if let Some(pages) = top_pages {
            let (mut lru, mut bound) = (Curve::new(), Curve::new());
            sim::lru_curve(trace, pages, &mut lru);
            sim::belady_blocks_curve(trace, pages, &mut bound);
            references.push((format!("LRU simulated ({pages} pages)"), lru, BLACK));
            references.push((
                format!("Belady block-hit bound ({pages} pages)"),
                bound,
                RED,
            ));
        }
        references.push(("unbounded cache".into(), unbounded, RGBColor(120, 120, 120)));
        let mut chart = ChartBuilder::on(&left)
            .caption(
                "prefix-hit ratio over requests (cumulative)",
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0..n, 0.0..100.0)
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc("requests")
            .y_desc("% of requested blocks reused")
            .draw()
            .map_err(|x| e(&x))?;
        let mut lines: Vec<(String, &Curve, RGBColor, u32)> =
            vec![("replay, all tiers".into(), &report.curve, BLUE, 3)];
        for (i, (name, c)) in report.tier_curves.iter().enumerate() {
            let color = Palette99::pick(i + 3).to_rgba();
            let color = RGBColor(color.0, color.1, color.2);
            lines.push((format!("served by {name}"), c, color, 2));
        }
        for (name, c, color) in &references {
            lines.push((name.clone(), c, *color, 1));
        }
        for (name, curve, color, width) in lines {
            chart
                .draw_series(LineSeries::new(
                    curve.iter().enumerate().map(|(i, v)| (i, 100.0 * v)),
                    color.stroke_width(width),
                ))
                .map_err(|x| e(&x))?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(width))
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(|x| e(&x))?;
        // Latency CDF, microseconds on a log axis.
        let micros: Vec<f64> = report
            .latencies
            .iter()
            .map(|d| (d.as_secs_f64() * 1e6).max(1.0))
            .collect();
        let lo = micros.first().copied().unwrap_or(1.0);
        let hi = micros.last().copied().unwrap_or(10.0).max(lo * 10.0);
        let mut cdf = ChartBuilder::on(&right)
            .caption("request latency (CDF)", ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d((lo..hi).log_scale(), 0.0..100.0)
            .map_err(|x| e(&x))?;
        cdf.configure_mesh()
            .x_desc("latency per request, microseconds")
            .y_desc("% of requests at most")
            .draw()
            .map_err(|x| e(&x))?;
        let count = micros.len().max(1) as f64;
        cdf.draw_series(LineSeries::new(
            micros
                .iter()
                .enumerate()
                .map(|(i, v)| (*v, 100.0 * (i + 1) as f64 / count)),
            BLUE.stroke_width(2),
        ))
        .map_err(|x| e(&x))?;
        root.present().map_err(|x| e(&x))?;
    }
    Ok(out)
}
