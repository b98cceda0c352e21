//! [`Hierarchy`]: tiers in order, fastest first, composed into one [`StorageTier`].
//!
//! - `exists`: the leading run of keys present in *any* tier.
//! - `get`: each key from the fastest tier holding it; a hit below the top is promoted into
//!   every tier above (if `promote` is set). A failing lower tier never fails a key an upper
//!   tier serves; its errors are counted.
//! - `put`: to the top tier, then, by [`WritePolicy`], either write-through (to every lower
//!   tier, in the background, through a queue bounded in bytes that applies backpressure) or
//!   write-back (a page goes down only when the tier above evicts it, through the demotion
//!   queue the [`HierarchyBuilder`] wires to each tier's eviction hook).
//! - `remove` and `clear` take effect in every tier at once: queued copies of removed pages
//!   never land, a promotion never brings one back.
//! - `flush` waits for queued writes (bounded by `flush_timeout`); `close` drains and stops.
//!
//! Every call may be dropped at any await point: what it did is then done or not, per page,
//! and nothing it held stays held. Pages in motion and key generations have one owner,
//! [`motion::Motion`]; the queue and its writer live in [`queue`].

mod admission;
mod builder;
mod motion;
mod queue;
mod read;
mod write;

pub use builder::HierarchyBuilder;
pub(crate) use queue::DemotionQueue;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::health::{Guarded, HealthPolicy, TierHealth, TierState};
use crate::metrics::{CallFamilies, CallMeter, Metered};
use crate::{
    GetResult, Page, PageKey, PutResult, ReadSlot, RemoveResult, StatsRecorder, StorageTier,
    TierError, TierInfo, TierStats,
};
use admission::Admission;
use motion::Motion;
use queue::Job;

/// How pages reach the lower tiers (in config files, `write-through` or `write-back`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WritePolicy {
    /// Every put goes to all tiers (lower ones asynchronously).
    WriteThrough,
    /// A page goes down one tier when the tier above evicts it.
    WriteBack,
}

/// Hierarchy behaviour.
#[derive(Debug, Clone)]
pub struct HierarchyPolicy {
    /// Write-through or write-back.
    pub write: WritePolicy,
    /// Copy pages found in a lower tier into every tier above.
    pub promote: bool,
    /// Bytes of pages the background queue holds before `put` waits (and, in write-back, an
    /// evicted page is no longer carried down: its stale copies below are removed instead).
    /// `None`: a quarter of the top tier's capacity, or 1 GiB if it has none.
    pub queue_bytes: Option<u64>,
    /// Bound on `flush` and `close`.
    pub flush_timeout: Duration,
    /// Requests of a key (puts and reads through the hierarchy) before its page is written
    /// below: write-through copies it at the read that admits it (if the top tier holds it)
    /// and at every put from then on, write-back demotes it on eviction from then on;
    /// otherwise its copies below are removed (never served stale). 1: every page.
    pub admit_after: u32,
    /// When a tier counts as slow or down (every tier below the top has a breaker).
    pub health: HealthPolicy,
}

impl Default for HierarchyPolicy {
    fn default() -> Self {
        Self {
            write: WritePolicy::WriteThrough,
            promote: true,
            queue_bytes: None,
            flush_timeout: Duration::from_secs(60),
            admit_after: 1,
            health: HealthPolicy::default(),
        }
    }
}

/// Counters of one level.
#[derive(Debug, Clone)]
pub struct LevelStats {
    /// The tier.
    pub info: TierInfo,
    /// Its own counters.
    pub stats: TierStats,
    /// Keys this level served for the hierarchy.
    pub served: u64,
    /// Up, slow or down, and its read estimate.
    pub health: TierHealth,
}

/// Hierarchy-wide counters.
#[derive(Debug, Clone)]
pub struct HierarchyStats {
    /// Each level, fastest first.
    pub levels: Vec<LevelStats>,
    /// Pages copied upward after a lower hit.
    pub promotions: u64,
    /// Pages written below by the background queue (write-through copies and demotions).
    pub copied_down: u64,
    /// Evicted pages demoted one tier down.
    pub demotions: u64,
    /// Evicted pages not carried down because the queue was full (their copies below were
    /// removed, never served stale).
    pub demotions_dropped: u64,
    /// Pages not written below because their key was requested fewer than `admit_after`
    /// times (their copies below removed).
    pub not_admitted: u64,
    /// Pages waiting in the background queue now.
    pub queue_depth: usize,
    /// Bytes of those pages (held in memory until they land).
    pub queue_bytes: u64,
    /// Keys whose copies below may be stale after a failed copy down or remove; only the top
    /// tier serves them until a later copy down or remove succeeds.
    pub stale_below: usize,
    /// A clear failed below: only the top tier serves (and what is in motion) until a clear
    /// succeeds.
    pub stale_below_all: bool,
    /// Reads served from pages still on their way down.
    pub served_in_flight: u64,
    /// Bytes moved between tiers (promotions and background writes).
    pub bytes_moved: u64,
    /// Failures of lower tiers (counted, never surfaced when an upper tier serves).
    pub lower_errors: u64,
}

#[derive(Default)]
struct Counters {
    promotions: AtomicU64,
    copied_down: AtomicU64,
    demotions: AtomicU64,
    bytes_moved: AtomicU64,
    lower_errors: AtomicU64,
}

struct Level {
    tier: Arc<Guarded>,
    served: AtomicU64,
}

struct Inner {
    levels: Vec<Level>,
    counters: Counters,
}

/// Tiers composed fastest first; itself a [`StorageTier`].
pub struct Hierarchy {
    name: String,
    /// Every tier's calls record into these; so do the hierarchy's own, through `meter`.
    families: CallFamilies,
    meter: CallMeter,
    inner: Arc<Inner>,
    policy: HierarchyPolicy,
    stats: StatsRecorder,
    tx: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    motion: Arc<Motion>,
    served_in_flight: AtomicU64,
    dropped: Arc<AtomicU64>,
    admission: Arc<Admission>,
    not_admitted: Arc<AtomicU64>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

/// The queue bound when the policy names none: a quarter of the top tier, at most 1 GiB
/// when the top tier has no byte bound.
const DEFAULT_QUEUE_BYTES: u64 = 1 << 30;

impl Hierarchy {
    /// A builder of a hierarchy named `name` (its metrics' label).
    pub fn builder(name: impl Into<String>) -> HierarchyBuilder {
        HierarchyBuilder::new(name.into())
    }

    /// Composes `tiers` (fastest first), whose eviction hooks, if any, came from `queue`.
    pub(crate) fn compose(
        name: String,
        tiers: Vec<Arc<dyn StorageTier>>,
        policy: HierarchyPolicy,
        queue: Arc<DemotionQueue>,
    ) -> Result<Self, TierError> {
        if tiers.is_empty() {
            return Err(TierError::config(
                "tiers",
                "a hierarchy needs at least one tier",
            ));
        }
        if policy.admit_after == 0 {
            return Err(TierError::config(
                "admit_after",
                "must be at least 1 (1: every page is written below)",
            ));
        }
        if policy.queue_bytes == Some(0) {
            return Err(TierError::config(
                "queue_bytes",
                "the queue must hold at least one byte",
            ));
        }
        policy.health.check()?;
        let rx = queue
            .rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| {
                TierError::config(
                    "demotions",
                    "this demotion queue already serves a hierarchy",
                )
            })?;
        let bound = policy.queue_bytes.unwrap_or_else(|| {
            tiers[0]
                .info()
                .capacity_bytes
                .map_or(DEFAULT_QUEUE_BYTES, |c| c / 4)
        });
        queue.motion.set_bound(bound);
        queue.admission.set_threshold(policy.admit_after);
        let families = CallFamilies::new(&name);
        let inner = Arc::new(Inner {
            levels: tiers
                .into_iter()
                .enumerate()
                .map(|(depth, tier)| Level {
                    tier: Arc::new(Guarded::new(
                        Arc::new(Metered::new(tier, &families)),
                        policy.health.clone(),
                        depth > 0,
                    )),
                    served: AtomicU64::new(0),
                })
                .collect(),
            counters: Counters::default(),
        });
        for level in &inner.levels[1..] {
            level.tier.probe_at_open();
        }
        let worker = tokio::spawn(queue::background_writer(
            Arc::downgrade(&inner),
            rx,
            Arc::clone(&queue.motion),
        ));
        Ok(Self {
            meter: families.meter(&name, "hierarchy"),
            families,
            name,
            inner,
            policy,
            stats: StatsRecorder::default(),
            tx: Mutex::new(Some(queue.tx.clone())),
            motion: Arc::clone(&queue.motion),
            served_in_flight: AtomicU64::new(0),
            dropped: Arc::clone(&queue.dropped),
            admission: Arc::clone(&queue.admission),
            not_admitted: Arc::clone(&queue.not_admitted),
            worker: Mutex::new(Some(worker)),
        })
    }

    /// The tiers, fastest first.
    pub fn tiers(&self) -> Vec<Arc<dyn StorageTier>> {
        self.inner
            .levels
            .iter()
            .map(|l| Arc::clone(&l.tier) as Arc<dyn StorageTier>)
            .collect()
    }

    /// Each tier's health, fastest first: up, slow or down, and its read estimate.
    pub fn health(&self) -> Vec<TierHealth> {
        self.inner.levels.iter().map(|l| l.tier.health()).collect()
    }

    /// Whether some tier below the top is down now.
    fn lower_down(&self) -> bool {
        self.inner.levels[1..]
            .iter()
            .any(|l| l.tier.state() == TierState::Down)
    }

    /// Per-level and hierarchy-wide counters.
    pub fn hierarchy_stats(&self) -> HierarchyStats {
        let c = &self.inner.counters;
        let (queue_depth, queue_bytes) = self.motion.backlog();
        let (stale_below, stale_below_all) = self.motion.stale_below();
        HierarchyStats {
            levels: self
                .inner
                .levels
                .iter()
                .map(|l| LevelStats {
                    info: l.tier.info(),
                    stats: l.tier.stats(),
                    served: l.served.load(Relaxed),
                    health: l.tier.health(),
                })
                .collect(),
            promotions: c.promotions.load(Relaxed),
            copied_down: c.copied_down.load(Relaxed),
            demotions: c.demotions.load(Relaxed),
            demotions_dropped: self.dropped.load(Relaxed),
            not_admitted: self.not_admitted.load(Relaxed),
            queue_depth,
            queue_bytes,
            stale_below,
            stale_below_all,
            served_in_flight: self.served_in_flight.load(Relaxed),
            bytes_moved: c.bytes_moved.load(Relaxed),
            lower_errors: c.lower_errors.load(Relaxed),
        }
    }

    /// Its metrics and its tiers', in the OpenMetrics text format Prometheus scrapes: per
    /// tier and operation, call durations, pages, bytes and errors by kind (the hierarchy's
    /// own calls under tier = its name, kind `hierarchy`); each tier's counters (hits, misses,
    /// bytes, evictions, pages served, resident bytes); the hierarchy's (promotions, copies
    /// down, demotions, the queue). Serve it with [`crate::serve_metrics`].
    pub fn metrics_text(&self) -> String {
        crate::metrics::encode(&self.families, self.hierarchy_stats())
    }

    /// The health lines of [`metrics_text`](Self::metrics_text): per tier, `kvtier_tier_up`,
    /// its state transitions and the reads and writes skipped while it was down.
    pub fn health_metrics(&self) -> Vec<String> {
        const HEALTH: [&str; 3] = [
            "kvtier_tier_up{",
            "kvtier_tier_state_transitions_total{",
            "kvtier_tier_skipped_",
        ];
        self.metrics_text()
            .lines()
            .filter(|l| HEALTH.iter().any(|p| l.starts_with(p)))
            .map(str::to_owned)
            .collect()
    }

    /// Waits until every queued page has been written below, then flushes each tier, at most
    /// `flush_timeout` in all.
    pub async fn flush(&self) -> Result<(), TierError> {
        let drained = async {
            self.motion.wait_until(|m| m.backlog().0 == 0).await;
            for level in &self.inner.levels {
                level.tier.flush().await?;
            }
            Ok(())
        };
        tokio::time::timeout(self.policy.flush_timeout, drained)
            .await
            .map_err(|_| TierError::Timeout {
                op: "hierarchy flush",
                after: self.policy.flush_timeout,
            })?
    }

    /// Drains the queue, then stops the background writer. Later puts still reach the top tier
    /// but no longer go down.
    pub async fn close(&self) -> Result<(), TierError> {
        self.flush().await?;
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        let worker = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(worker) = worker {
            worker.abort();
            let _ = worker.await;
        }
        Ok(())
    }

    fn sender(&self) -> Option<mpsc::UnboundedSender<Job>> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits (at most `flush_timeout`, or until `deadline`) until the queue has room for
    /// `bytes`. Holds nothing while it waits, so a dropped call leaves nothing behind. With a
    /// tier below down it does not wait: what cannot be queued then is not carried down (its
    /// copies below are never served), so a dead tier never slows a put.
    async fn room_for(&self, bytes: u64, deadline: Option<std::time::Instant>) {
        let bound = tokio::time::Instant::now() + self.policy.flush_timeout;
        let until = deadline.map_or(bound, |d| bound.min(d.into()));
        let _ = tokio::time::timeout_at(
            until,
            self.motion
                .wait_until(|m| m.has_room(bytes) || self.lower_down()),
        )
        .await;
    }
}

impl Drop for Hierarchy {
    /// Stops the background writer. Pages still queued for the lower tiers are lost (they
    /// are in the top tier only): their number is logged. [`Hierarchy::close`] first to keep
    /// them.
    fn drop(&mut self) {
        if let Some(worker) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            worker.abort();
        }
        let (pages, bytes) = self.motion.backlog();
        if pages > 0 {
            tracing::warn!(
                hierarchy = %self.name,
                pages,
                bytes,
                "hierarchy dropped with {pages} pages ({bytes} bytes) queued for its lower \
                 tiers and not written there (close it first to keep them)"
            );
        }
    }
}

#[async_trait]
impl StorageTier for Hierarchy {
    fn info(&self) -> TierInfo {
        let infos: Vec<TierInfo> = self.inner.levels.iter().map(|l| l.tier.info()).collect();
        TierInfo {
            name: self.name.clone(),
            kind: "hierarchy".into(),
            capacity_bytes: None,
            max_page_bytes: infos.iter().filter_map(|i| i.max_page_bytes).min(),
            // Its bottom tier's pages survive; queued copies once flushed (see `flush`).
            persistent: infos.last().is_some_and(|i| i.persistent),
        }
    }

    fn stats(&self) -> TierStats {
        let mut s = self.stats.snapshot(None);
        s.errors += self.inner.counters.lower_errors.load(Relaxed);
        s.evictions = self
            .inner
            .levels
            .last()
            .map_or(0, |l| l.tier.stats().evictions);
        s
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        self.meter.put(pages, self.put_unmetered(pages, None)).await
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let (started, span) = self.meter.getting(slots.len());
        let results = self.get_unmetered(slots, None).instrument(span).await;
        self.meter.got(started, slots, &results);
        results
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        self.meter
            .exists(keys, self.exists_unmetered(keys, None))
            .await
    }

    /// Each tier is asked until `deadline`: what faster tiers found is kept, what a slower
    /// one had not returned by then is a miss. A tier that is slow and whose estimate does
    /// not fit in the time left is not asked.
    async fn get_by(
        &self,
        slots: &mut [ReadSlot<'_>],
        deadline: std::time::Instant,
    ) -> Vec<GetResult> {
        let (started, span) = self.meter.getting(slots.len());
        let results = self
            .get_unmetered(slots, Some(deadline))
            .instrument(span)
            .await;
        self.meter.got(started, slots, &results);
        results
    }

    async fn exists_by(
        &self,
        keys: &[PageKey],
        deadline: std::time::Instant,
    ) -> Result<usize, TierError> {
        self.meter
            .exists(keys, self.exists_unmetered(keys, Some(deadline)))
            .await
    }

    async fn put_by(&self, pages: &[Page<'_>], deadline: std::time::Instant) -> Vec<PutResult> {
        self.meter
            .put(pages, self.put_unmetered(pages, Some(deadline)))
            .await
    }

    /// Every tier is told (a page may be held in any): a lower tier's failure is counted, not
    /// returned, as for reads.
    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        for (depth, level) in self.inner.levels.iter().enumerate() {
            match level.tier.touch(keys).await {
                Ok(()) => {}
                Err(e) if depth == 0 => return Err(e),
                Err(_) => {
                    self.inner.counters.lower_errors.fetch_add(1, Relaxed);
                }
            }
        }
        Ok(())
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        self.meter.remove(keys, self.remove_unmetered(keys)).await
    }

    async fn clear(&self) -> Result<(), TierError> {
        self.meter.clear(self.clear_unmetered()).await
    }

    async fn flush(&self) -> Result<(), TierError> {
        Hierarchy::flush(self).await
    }
}
