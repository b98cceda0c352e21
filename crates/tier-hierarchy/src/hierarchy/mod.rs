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

pub use builder::HierarchyBuilder;
pub(crate) use queue::DemotionQueue;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::metrics::{CallFamilies, CallMeter, Metered};
use crate::{
    GetResult, Lookup, Page, PageKey, PutResult, ReadSlot, RemoveResult, StatsRecorder,
    StorageTier, TierError, TierInfo, TierStats,
};
use admission::Admission;
use motion::{InMotion, Motion};
use queue::{Job, Moving};

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
}

impl Default for HierarchyPolicy {
    fn default() -> Self {
        Self {
            write: WritePolicy::WriteThrough,
            promote: true,
            queue_bytes: None,
            flush_timeout: Duration::from_secs(60),
            admit_after: 1,
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
    tier: Arc<dyn StorageTier>,
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
                .map(|tier| Level {
                    tier: Arc::new(Metered::new(tier, &families)) as Arc<dyn StorageTier>,
                    served: AtomicU64::new(0),
                })
                .collect(),
            counters: Counters::default(),
        });
        let worker = tokio::spawn(queue::background_writer(
            Arc::clone(&inner),
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
            .map(|l| Arc::clone(&l.tier))
            .collect()
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

    /// Waits until every queued page has been written below, at most `flush_timeout`.
    pub async fn flush(&self) -> Result<(), TierError> {
        tokio::time::timeout(
            self.policy.flush_timeout,
            self.motion.wait_until(|m| m.backlog().0 == 0),
        )
        .await
        .map_err(|_| TierError::Timeout {
            op: "hierarchy flush",
            after: self.policy.flush_timeout,
        })
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

    /// Waits (at most `flush_timeout`) until the queue has room for `bytes`. Holds nothing
    /// while it waits, so a dropped call leaves nothing behind.
    async fn room_for(&self, bytes: u64) {
        let _ = tokio::time::timeout(
            self.policy.flush_timeout,
            self.motion.wait_until(|m| m.has_room(bytes)),
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
            // Queued copies are lost if the hierarchy is dropped unflushed: `close` it to persist.
            persistent: false,
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
        self.meter.put(pages, self.put_unmetered(pages)).await
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let (started, span) = self.meter.getting(slots.len());
        let results = self.get_unmetered(slots).instrument(span).await;
        self.meter.got(started, slots, &results);
        results
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        self.meter.exists(keys, self.exists_unmetered(keys)).await
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        self.meter.remove(keys, self.remove_unmetered(keys)).await
    }

    async fn clear(&self) -> Result<(), TierError> {
        self.meter.clear(self.clear_unmetered()).await
    }
}

/// The calls themselves; the trait's methods above measure them.
impl Hierarchy {
    async fn put_unmetered(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        // Every tier must be able to take the page, not just the top one.
        let limit = self.info().max_page_bytes;
        let mut results: Vec<PutResult> = pages.iter().map(|p| p.check_len(limit)).collect();
        let valid: Vec<usize> = (0..pages.len()).filter(|&i| results[i].is_ok()).collect();
        let keys: Vec<PageKey> = valid.iter().map(|&i| pages[i].key.clone()).collect();
        // Whether a put admits its pages is asked as they are queued (`admits`).
        let _ = self.admission.record(&keys);
        let lower = self.inner.levels.len() > 1;
        let sender = match self.policy.write {
            WritePolicy::WriteThrough if lower => self.sender(),
            _ => None,
        };
        // Room in the queue for what this put sends down (write-through) or may evict there
        // (write-back).
        let bytes: u64 = valid.iter().map(|&i| pages[i].data.len() as u64).sum();
        let _reservation = if lower {
            self.room_for(bytes).await;
            Some(self.motion.reserve(bytes))
        } else {
            None
        };
        let Some(tx) = sender else {
            let mutation = self.motion.writing(&keys).await;
            let top: Vec<Page<'_>> = valid.iter().map(|&i| pages[i].clone()).collect();
            self.put_top(&top, &valid, &mut results).await;
            drop(mutation);
            self.count_puts(pages, &results);
            return results;
        };
        let mutation = self.motion.writing(&keys).await;
        // The queue keeps the pages past this call: take shared content once (lent regions
        // are copied here, once) and give the same pages to the top tier.
        let shared: Vec<Page<'static>> = valid.iter().map(|&i| pages[i].to_shared()).collect();
        self.put_top(&shared, &valid, &mut results).await;
        // From here to the send nothing awaits: a dropped put queues all its stored pages or
        // none, and what it queues is readable until it lands.
        let moving: Vec<Moving> = shared
            .into_iter()
            .zip(&valid)
            .filter(|(_, &i)| results[i].is_ok())
            .map(|(p, _)| {
                // Not admitted: only a tombstone goes down (older copies below are stale).
                let data = if self.admission.admits(&p.key) {
                    Some(p.data)
                } else {
                    self.not_admitted.fetch_add(1, Relaxed);
                    None
                };
                Moving {
                    seq: self.motion.track(&p.key, data.clone()),
                    key: p.key,
                    data,
                }
            })
            .collect();
        if !moving.is_empty() {
            let job = Job {
                targets: 1..self.inner.levels.len(),
                pages: moving,
                demotion: false,
            };
            if let Err(mpsc::error::SendError(job)) = tx.send(job) {
                for p in &job.pages {
                    self.motion
                        .done(&p.key, p.seq, p.data.as_ref().map_or(0, |d| d.len() as u64));
                }
            }
        }
        drop(mutation);
        self.count_puts(pages, &results);
        results
    }

    async fn get_unmetered(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let keys: Vec<PageKey> = slots.iter().map(|s| s.key.clone()).collect();
        let admitted_now = self.admission.record(&keys);
        // What a promotion (or a copy down of a page this read admits) must find unchanged.
        let generations = self.motion.generations(&keys);
        let mut results: Vec<Option<GetResult>> = (0..slots.len()).map(|_| None).collect();
        let mut first_error: Vec<Option<TierError>> = (0..slots.len()).map(|_| None).collect();
        let mut pending: Vec<usize> = (0..slots.len()).collect();
        for (depth, level) in self.inner.levels.iter().enumerate() {
            if pending.is_empty() {
                break;
            }
            let mut wanted = vec![false; slots.len()];
            for &i in &pending {
                wanted[i] = true;
            }
            let mut batch: Vec<ReadSlot<'_>> = slots
                .iter_mut()
                .zip(&wanted)
                .filter(|(_, w)| **w)
                .map(|(s, _)| s.reborrow())
                .collect();
            let level_results = level.tier.get(&mut batch).await;
            drop(batch);
            let mut still = Vec::new();
            let mut promote = Vec::new();
            for (&i, r) in pending.iter().zip(level_results) {
                let found = matches!(r, Ok(Lookup::Hit) | Err(TierError::LengthMismatch { .. }));
                if depth > 0 && found {
                    // The page may have left the top for below while this read ran, or a
                    // copy down failed meanwhile: what is in motion is newer than what was read.
                    match self.motion.lookup(&slots[i].key) {
                        InMotion::Still => {}
                        moving => {
                            results[i] = Some(self.serve_in_motion(&mut slots[i], moving));
                            continue;
                        }
                    }
                }
                match r {
                    Ok(Lookup::Hit) => {
                        level.served.fetch_add(1, Relaxed);
                        results[i] = Some(Ok(Lookup::Hit));
                        if depth > 0 && self.policy.promote {
                            promote
                                .push((i, Page::new(slots[i].key.clone(), slots[i].buf.to_vec())));
                        }
                    }
                    Ok(Lookup::Miss) => still.push(i),
                    // The page is there with another length: the caller's error, final.
                    Err(e @ TierError::LengthMismatch { .. }) => results[i] = Some(Err(e)),
                    Err(e) => {
                        if depth > 0 {
                            self.inner.counters.lower_errors.fetch_add(1, Relaxed);
                        }
                        first_error[i].get_or_insert(e);
                        still.push(i);
                    }
                }
            }
            if !promote.is_empty() {
                self.promote(depth, promote, &generations).await;
            }
            if depth == 0 && self.policy.write == WritePolicy::WriteThrough {
                // A page put before its key was admitted went no further than the top tier:
                // the read that admits it copies it down.
                let admitted: Vec<(usize, Page<'static>)> = (0..slots.len())
                    .filter(|&i| admitted_now.get(i) == Some(&true))
                    .filter(|&i| matches!(results[i], Some(Ok(Lookup::Hit))))
                    .map(|i| (i, Page::new(slots[i].key.clone(), slots[i].buf.to_vec())))
                    .collect();
                if !admitted.is_empty() {
                    self.copy_down_admitted(admitted, &generations);
                }
            }
            if depth == 0 {
                // Pages in motion are served before the lower tiers are asked; a key whose
                // copies below are stale is not asked below at all.
                still.retain(|&i| match self.motion.lookup(&slots[i].key) {
                    InMotion::Still => true,
                    InMotion::StaleBelow => {
                        results[i] = Some(first_error[i].take().map_or(Ok(Lookup::Miss), Err));
                        false
                    }
                    moving => {
                        results[i] = Some(self.serve_in_motion(&mut slots[i], moving));
                        first_error[i] = None;
                        false
                    }
                });
            }
            pending = still;
        }
        for i in pending {
            results[i] = Some(match first_error[i].take() {
                Some(e) => Err(e),
                None => Ok(Lookup::Miss),
            });
        }
        results
            .into_iter()
            .zip(slots.iter())
            .map(|(r, slot)| {
                let r = r.unwrap_or(Ok(Lookup::Miss));
                self.stats.get_result(&r, slot.buf.len());
                r
            })
            .collect()
    }

    async fn exists_unmetered(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        let mut at = 0;
        while at < keys.len() {
            let rest = &keys[at..];
            // Asked in the order a page travels (top, in motion, below), so a page moving down
            // while this runs is seen at one stop or the next, never missed between them.
            let mut best = 0;
            let mut stale_from = rest.len();
            for (depth, level) in self.inner.levels.iter().enumerate() {
                if depth == 1 {
                    best = best.max(self.motion.leading(rest));
                    // Copies below of a key whose demotion was not carried are stale.
                    stale_from = self.motion.first_stale_below(rest);
                }
                match level.tier.exists(rest).await {
                    Ok(n) => best = best.max(n.min(stale_from)),
                    Err(e) if depth == 0 => return Err(e),
                    Err(_) => {
                        self.inner.counters.lower_errors.fetch_add(1, Relaxed);
                    }
                }
            }
            if best == 0 {
                break;
            }
            at += best;
        }
        Ok(at)
    }

    async fn remove_unmetered(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        // Exclusive over the keys: no put, copy down or promotion of them runs meanwhile,
        // their queued copies are forgotten and their evictions not carried, so nothing of
        // them lands after this.
        let removal = self.motion.removing(Some(keys)).await;
        let mut results: Vec<RemoveResult> = removal.in_motion.iter().map(|&m| Ok(m)).collect();
        // A copy a tier failed to remove may still be served: that key's remove failed.
        for level in &self.inner.levels {
            for (r, lr) in results.iter_mut().zip(level.tier.remove(keys).await) {
                // A key a tier cannot store is not there to remove.
                let lr = match lr {
                    Err(TierError::KeyRejected { .. }) => Ok(false),
                    other => other,
                };
                match (lr, &r) {
                    (Err(e), Ok(_)) => *r = Err(e),
                    (Ok(true), Ok(_)) => *r = Ok(true),
                    _ => {}
                }
            }
        }
        // Where a tier failed, older copies than the removed ones may remain below: only the
        // top tier answers for those keys until a later copy down or remove succeeds.
        for (key, r) in keys.iter().zip(&results) {
            if r.is_ok() {
                self.motion.removed(Some(std::slice::from_ref(key)));
            }
        }
        // A page a tier evicted while this ran was there until this removed it.
        for (r, evicted) in results.iter_mut().zip(removal.finish()) {
            if evicted {
                if let Ok(found) = r {
                    *found = true;
                }
            }
        }
        for r in &results {
            if matches!(r, Ok(true)) {
                self.stats.removed();
            }
        }
        results
    }

    async fn clear_unmetered(&self) -> Result<(), TierError> {
        let removal = self.motion.removing(None).await;
        let mut first = Ok(());
        for level in &self.inner.levels {
            if let Err(e) = level.tier.clear().await {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        if first.is_ok() {
            self.motion.removed(None);
        }
        removal.finish();
        first
    }

    /// Puts `top` (the pages at positions `at` of the batch) into the top tier; records each
    /// outcome at its position in `results`.
    async fn put_top(&self, top: &[Page<'_>], at: &[usize], results: &mut [PutResult]) {
        let mut top_results = self.inner.levels[0].tier.put(top).await.into_iter();
        for &i in at {
            results[i] = top_results.next().unwrap_or_else(|| {
                Err(TierError::Unavailable(
                    "the top tier returned too few results".into(),
                ))
            });
        }
    }

    fn count_puts(&self, pages: &[Page<'_>], results: &[PutResult]) {
        let mut bytes = 0;
        for (page, r) in pages.iter().zip(results) {
            match r {
                Ok(()) => {
                    self.stats.put(page.data.len());
                    bytes += page.data.len();
                }
                Err(e) => {
                    self.stats.errors(1);
                    tracing::debug!(hierarchy = %self.name, key = %page.key, error = %e, "put failed");
                }
            }
        }
        tracing::debug!(hierarchy = %self.name, op = "put", pages = pages.len(), bytes, "call");
    }

    /// Answers a read from what is in motion for its key.
    fn serve_in_motion(&self, slot: &mut ReadSlot<'_>, moving: InMotion) -> GetResult {
        match moving {
            InMotion::Page(data) if data.len() == slot.buf.len() => {
                slot.buf.fill_from_page(&data);
                self.served_in_flight.fetch_add(1, Relaxed);
                Ok(Lookup::Hit)
            }
            InMotion::Page(data) => Err(TierError::LengthMismatch {
                key: slot.key.clone(),
                stored: data.len(),
                buffer: slot.buf.len(),
            }),
            InMotion::StaleBelow | InMotion::Still => Ok(Lookup::Miss),
        }
    }

    /// Copies pages read at level `found_at` into every level above, each only if no put,
    /// remove or clear touched its key since the read began (`generations`, by slot).
    /// Queues for every lower tier the pages a read found in the top tier and admitted (see
    /// [`HierarchyPolicy::admit_after`]), those no put or remove touched since the read began
    /// and with nothing in motion, when the queue has room (a copy skipped waits for the page's
    /// next put). Decided and queued under the keys' stripes, so a later put's version is
    /// queued after this one and supersedes it.
    fn copy_down_admitted(&self, candidates: Vec<(usize, Page<'static>)>, generations: &[u64]) {
        let Some(tx) = self.sender().filter(|_| self.inner.levels.len() > 1) else {
            return;
        };
        let mut held = HashMap::new();
        let pages: Vec<Page<'static>> = candidates
            .into_iter()
            .filter(|(i, p)| self.motion.may_promote(&p.key, generations[*i], &mut held))
            .map(|(_, p)| p)
            .collect();
        let bytes: u64 = pages.iter().map(|p| p.data.len() as u64).sum();
        if pages.is_empty() || !self.motion.has_room(bytes) {
            return;
        }
        let moving: Vec<Moving> = pages
            .into_iter()
            .map(|p| Moving {
                seq: self.motion.track(&p.key, Some(p.data.clone())),
                key: p.key,
                data: Some(p.data),
            })
            .collect();
        let job = Job {
            targets: 1..self.inner.levels.len(),
            pages: moving,
            demotion: false,
        };
        if let Err(mpsc::error::SendError(job)) = tx.send(job) {
            for p in &job.pages {
                self.motion
                    .done(&p.key, p.seq, p.data.as_ref().map_or(0, |d| d.len() as u64));
            }
        }
        drop(held);
    }

    async fn promote(
        &self,
        found_at: usize,
        candidates: Vec<(usize, Page<'static>)>,
        generations: &[u64],
    ) {
        let mut held = HashMap::new();
        let pages: Vec<Page<'static>> = candidates
            .into_iter()
            .filter(|(i, p)| self.motion.may_promote(&p.key, generations[*i], &mut held))
            .map(|(_, p)| p)
            .collect();
        let bytes: u64 = pages.iter().map(|p| p.data.len() as u64).sum();
        // In write-back a promotion evicts into the queue: skip it (it is only a copy) rather
        // than overfill the queue.
        let room = self.policy.write == WritePolicy::WriteThrough || self.motion.has_room(bytes);
        if pages.is_empty() || !room {
            return;
        }
        // What the promotion evicts is carried down, never dropped (its copies below would go).
        let _reservation = self.motion.reserve(bytes);
        for level in &self.inner.levels[..found_at] {
            let results = level.tier.put(&pages).await;
            let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
            let c = &self.inner.counters;
            c.promotions.fetch_add(ok, Relaxed);
            c.bytes_moved.fetch_add(bytes, Relaxed);
            c.lower_errors.fetch_add(results.len() as u64 - ok, Relaxed);
        }
        drop(held);
    }
}
