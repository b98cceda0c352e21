//! The exposition: a hierarchy's live call families and a snapshot of the counters it and its
//! tiers keep, encoded when scraped.

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::{CallFamilies, HierarchyLabels, TierLabels};
use crate::{HierarchyStats, LevelStats, TierState};

/// The counters a hierarchy and its tiers keep, as they were when scraped.
#[derive(Debug)]
struct Snapshot {
    hierarchy: String,
    stats: HierarchyStats,
}

type LevelValue = fn(&LevelStats) -> u64;

impl Collector for Snapshot {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let per_tier: [(&str, &str, Shape, LevelValue); 15] = [
            (
                "tier_hits",
                "Reads that found their page",
                Shape::Counter,
                |l| l.stats.hits,
            ),
            ("tier_misses", "Reads that did not", Shape::Counter, |l| {
                l.stats.misses
            }),
            ("tier_stored_pages", "Pages stored", Shape::Counter, |l| {
                l.stats.puts
            }),
            (
                "tier_removed_pages",
                "Pages removed on request",
                Shape::Counter,
                |l| l.stats.removes,
            ),
            (
                "tier_read_bytes",
                "Bytes returned by hits",
                Shape::Counter,
                |l| l.stats.bytes_read,
            ),
            ("tier_written_bytes", "Bytes stored", Shape::Counter, |l| {
                l.stats.bytes_written
            }),
            (
                "tier_errors",
                "Per-page or per-call failures",
                Shape::Counter,
                |l| l.stats.errors,
            ),
            (
                "tier_evictions",
                "Pages the tier let go on its own (capacity, expiry)",
                Shape::Counter,
                |l| l.stats.evictions,
            ),
            (
                "tier_served_pages",
                "Pages this tier served for the hierarchy",
                Shape::Counter,
                |l| l.served,
            ),
            (
                "tier_resident_bytes",
                "Bytes the tier holds now, where it tracks them",
                Shape::Gauge,
                |l| l.stats.resident_bytes.unwrap_or(0),
            ),
            (
                "tier_up",
                "1 while the tier answers (up or slow), 0 while it is down and skipped",
                Shape::Gauge,
                |l| u64::from(l.health.state != TierState::Down),
            ),
            (
                "tier_slow",
                "1 while the tier's recent calls are over its slow bound",
                Shape::Gauge,
                |l| u64::from(l.health.state == TierState::Slow),
            ),
            (
                "tier_state_transitions",
                "Changes of the tier's state (up, slow, down)",
                Shape::Counter,
                |l| l.health.transitions,
            ),
            (
                "tier_skipped_reads",
                "Pages answered as misses at once because the tier was down or too slow",
                Shape::Counter,
                |l| l.health.reads_skipped,
            ),
            (
                "tier_skipped_writes",
                "Pages not written (or removed) because the tier was down",
                Shape::Counter,
                |l| l.health.writes_skipped,
            ),
        ];
        for (name, help, kind, value) in per_tier {
            let mut family = encoder.encode_descriptor(name, help, None, kind.metric_type())?;
            for level in &self.stats.levels {
                if name == "tier_resident_bytes" && level.stats.resident_bytes.is_none() {
                    continue;
                }
                let labels = TierLabels {
                    hierarchy: self.hierarchy.clone(),
                    tier: level.info.name.clone(),
                    kind: level.info.kind.clone(),
                };
                let metric = family.encode_family(&labels)?;
                encode_value(kind, value(level), metric)?;
            }
        }
        let s = &self.stats;
        let whole: [(&str, &str, Shape, u64); 11] = [
            (
                "hierarchy_promotions",
                "Pages copied up after a lower hit",
                Shape::Counter,
                s.promotions,
            ),
            (
                "hierarchy_copied_down",
                "Pages the background queue wrote below",
                Shape::Counter,
                s.copied_down,
            ),
            (
                "hierarchy_demotions",
                "Evicted pages demoted one tier down",
                Shape::Counter,
                s.demotions,
            ),
            (
                "hierarchy_demotions_dropped",
                "Evicted pages not carried down (queue full)",
                Shape::Counter,
                s.demotions_dropped,
            ),
            (
                "hierarchy_not_admitted",
                "Pages not written below (requested fewer than admit_after times)",
                Shape::Counter,
                s.not_admitted,
            ),
            (
                "hierarchy_served_in_flight",
                "Reads served from pages on their way down",
                Shape::Counter,
                s.served_in_flight,
            ),
            (
                "hierarchy_moved_bytes",
                "Bytes moved between tiers",
                Shape::Counter,
                s.bytes_moved,
            ),
            (
                "hierarchy_lower_errors",
                "Failures of lower tiers",
                Shape::Counter,
                s.lower_errors,
            ),
            (
                "hierarchy_queue_pages",
                "Pages waiting in the background queue",
                Shape::Gauge,
                s.queue_depth as u64,
            ),
            (
                "hierarchy_queue_bytes",
                "Bytes of pages in motion (queued, held in memory)",
                Shape::Gauge,
                s.queue_bytes,
            ),
            (
                "hierarchy_stale_below_keys",
                "Keys only the top tier serves after a failed copy down",
                Shape::Gauge,
                s.stale_below as u64,
            ),
        ];
        let labels = HierarchyLabels {
            hierarchy: self.hierarchy.clone(),
        };
        for (name, help, kind, value) in whole {
            let mut family = encoder.encode_descriptor(name, help, None, kind.metric_type())?;
            encode_value(kind, value, family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// How a snapshot value is exposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Counter,
    Gauge,
}

impl Shape {
    fn metric_type(self) -> MetricType {
        match self {
            Shape::Counter => MetricType::Counter,
            Shape::Gauge => MetricType::Gauge,
        }
    }
}

fn encode_value(
    kind: Shape,
    value: u64,
    metric: prometheus_client::encoding::MetricEncoder<'_>,
) -> Result<(), fmt::Error> {
    if kind == Shape::Gauge {
        ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX)).encode(metric)
    } else {
        ConstCounter::new(value).encode(metric)
    }
}

/// The exposition of one hierarchy: its live call families and a snapshot of its counters.
pub(crate) fn encode(families: &CallFamilies, stats: HierarchyStats) -> String {
    let mut registry = Registry::with_prefix("kvtier");
    families.register(&mut registry);
    registry.register_collector(Box::new(Snapshot {
        hierarchy: families.hierarchy.clone(),
        stats,
    }));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}
