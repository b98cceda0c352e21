//! [`Hierarchy`]: tiers in order, fastest first, composed into one [`StorageTier`].
//!
//! - `exists`: the leading run of keys present in *any* tier.
//! - `get`: each key from the fastest tier holding it; a hit below the top is promoted into
//!   every tier above (if `promote` is set). A failing lower tier never fails a key an upper
//!   tier serves; its errors are counted.
//! - `put`: to the top tier, then, by [`WritePolicy`], either write-through (to every lower
//!   tier, in the background, through a bounded queue that applies backpressure) or write-back
//!   (a page goes down only when the tier above evicts it, through [`DemotionQueue`]).
//! - `flush` waits for queued writes (bounded by `flush_timeout`); `close` drains and stops.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::{
    EvictedPage, EvictionListener, GetResult, Lookup, Page, PageData, PageKey, PutResult, ReadSlot,
    RemoveResult, StatsRecorder, StorageTier, TierError, TierInfo, TierStats,
};

/// How pages reach the lower tiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// Jobs the background queue holds (a write-through job is one put batch, a demotion one
    /// page) before `put` waits (write-through) or demotions are dropped (write-back).
    pub queue_jobs: usize,
    /// Bound on `flush` and `close`.
    pub flush_timeout: Duration,
}

impl Default for HierarchyPolicy {
    fn default() -> Self {
        Self {
            write: WritePolicy::WriteThrough,
            promote: true,
            queue_jobs: 1024,
            flush_timeout: Duration::from_secs(60),
        }
    }
}

/// Background work: write `pages` into tiers `targets`.
struct Job {
    targets: std::ops::Range<usize>,
    pages: Vec<Page<'static>>,
    demotion: bool,
}

/// Pages on their way down, readable until they land: `exists` and `get` see them, so a page
/// the top tier evicted before its copy reached the tier below is never lost to a reader.
#[derive(Default)]
struct InFlight {
    pages: Mutex<std::collections::HashMap<PageKey, (PageData<'static>, u32)>>,
}

impl InFlight {
    fn map(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<PageKey, (PageData<'static>, u32)>>
    {
        self.pages.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn add(&self, pages: &[Page<'static>]) {
        let mut map = self.map();
        for p in pages {
            let entry = map
                .entry(p.key.clone())
                .or_insert_with(|| (p.data.clone(), 0));
            entry.0 = p.data.clone();
            entry.1 += 1;
        }
    }
    fn done(&self, pages: &[Page<'_>]) {
        let mut map = self.map();
        for p in pages {
            if let Some(entry) = map.get_mut(&p.key) {
                entry.1 -= 1;
                if entry.1 == 0 {
                    map.remove(&p.key);
                }
            }
        }
    }
    fn get(&self, key: &PageKey) -> Option<PageData<'static>> {
        self.map().get(key).map(|(data, _)| data.clone())
    }
    fn leading(&self, keys: &[PageKey]) -> usize {
        let map = self.map();
        keys.iter().take_while(|k| map.contains_key(*k)).count()
    }
}

/// Pages queued for lower tiers, and a way to wait for none.
#[derive(Default)]
struct Backlog {
    pages: AtomicUsize,
    drained: Notify,
}

impl Backlog {
    fn add(&self, n: usize) {
        self.pages.fetch_add(n, Relaxed);
    }
    fn done(&self, n: usize) {
        if self.pages.fetch_sub(n, Relaxed) == n {
            self.drained.notify_waiters();
        }
    }
}

/// The queue that carries evicted pages down one tier (write-back). Create it first, hand
/// [`DemotionQueue::listener`] to each tier's eviction hook, then give it to
/// [`Hierarchy::new`].
pub struct DemotionQueue {
    tx: mpsc::Sender<Job>,
    rx: Mutex<Option<mpsc::Receiver<Job>>>,
    backlog: Arc<Backlog>,
    inflight: Arc<InFlight>,
    dropped: Arc<AtomicU64>,
}

impl DemotionQueue {
    /// A queue holding at most `jobs` jobs (1 to [`crate::config::MAX_QUEUE_JOBS`]).
    pub fn new(jobs: usize) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(jobs.clamp(1, crate::config::MAX_QUEUE_JOBS));
        Arc::new(Self {
            tx,
            rx: Mutex::new(Some(rx)),
            backlog: Arc::default(),
            inflight: Arc::default(),
            dropped: Arc::default(),
        })
    }

    /// The eviction hook for tier `level`: its evicted pages go to tier `level + 1`. It never
    /// blocks; when the queue is full the page is dropped and counted.
    pub fn listener(&self, level: usize) -> EvictionListener {
        let (tx, backlog, dropped) = (
            self.tx.clone(),
            Arc::clone(&self.backlog),
            Arc::clone(&self.dropped),
        );
        Arc::new(move |page: EvictedPage| {
            backlog.add(1);
            let job = Job {
                targets: level + 1..level + 2,
                pages: vec![Page::new(page.key, page.data)],
                demotion: true,
            };
            if tx.try_send(job).is_err() {
                backlog.done(1);
                dropped.fetch_add(1, Relaxed);
            }
        })
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
    /// Evicted pages dropped because the demotion queue was full.
    pub demotions_dropped: u64,
    /// Pages waiting in the background queue now.
    pub queue_depth: usize,
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
    inner: Arc<Inner>,
    policy: HierarchyPolicy,
    stats: StatsRecorder,
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    backlog: Arc<Backlog>,
    inflight: Arc<InFlight>,
    served_in_flight: AtomicU64,
    dropped: Arc<AtomicU64>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl Hierarchy {
    /// Composes `tiers` (fastest first). With [`WritePolicy::WriteBack`], pass the
    /// [`DemotionQueue`] whose listeners the tiers were built with. Must run inside a tokio
    /// runtime (it starts the background writer).
    pub fn new(
        name: impl Into<String>,
        tiers: Vec<Arc<dyn StorageTier>>,
        policy: HierarchyPolicy,
        demotions: Option<Arc<DemotionQueue>>,
    ) -> Result<Self, TierError> {
        if tiers.is_empty() {
            return Err(TierError::config(
                "tiers",
                "a hierarchy needs at least one tier",
            ));
        }
        if !(1..=crate::config::MAX_QUEUE_JOBS).contains(&policy.queue_jobs) {
            return Err(TierError::config(
                "queue_jobs",
                format!("must be 1 to {}", crate::config::MAX_QUEUE_JOBS),
            ));
        }
        let queue = demotions.unwrap_or_else(|| DemotionQueue::new(policy.queue_jobs));
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
        let inner = Arc::new(Inner {
            levels: tiers
                .into_iter()
                .map(|tier| Level {
                    tier,
                    served: AtomicU64::new(0),
                })
                .collect(),
            counters: Counters::default(),
        });
        let worker = tokio::spawn(background_writer(
            Arc::clone(&inner),
            rx,
            Arc::clone(&queue.backlog),
            Arc::clone(&queue.inflight),
        ));
        Ok(Self {
            name: name.into(),
            inner,
            policy,
            stats: StatsRecorder::default(),
            tx: Mutex::new(Some(queue.tx.clone())),
            backlog: Arc::clone(&queue.backlog),
            inflight: Arc::clone(&queue.inflight),
            served_in_flight: AtomicU64::new(0),
            dropped: Arc::clone(&queue.dropped),
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
            queue_depth: self.backlog.pages.load(Relaxed),
            served_in_flight: self.served_in_flight.load(Relaxed),
            bytes_moved: c.bytes_moved.load(Relaxed),
            lower_errors: c.lower_errors.load(Relaxed),
        }
    }

    /// Waits until every queued page has been written below, at most `flush_timeout`.
    pub async fn flush(&self) -> Result<(), TierError> {
        let wait = async {
            loop {
                let drained = self.backlog.drained.notified();
                if self.backlog.pages.load(Relaxed) == 0 {
                    return;
                }
                drained.await;
            }
        };
        tokio::time::timeout(self.policy.flush_timeout, wait)
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

    fn sender(&self) -> Option<mpsc::Sender<Job>> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for Hierarchy {
    fn drop(&mut self) {
        if let Some(worker) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            worker.abort();
        }
    }
}

async fn background_writer(
    inner: Arc<Inner>,
    mut rx: mpsc::Receiver<Job>,
    backlog: Arc<Backlog>,
    inflight: Arc<InFlight>,
) {
    while let Some(job) = rx.recv().await {
        let n = job.pages.len();
        let bytes: u64 = job.pages.iter().map(|p| p.data.len() as u64).sum();
        for level in job.targets.clone() {
            let Some(target) = inner.levels.get(level) else {
                continue;
            };
            let results = target.tier.put(&job.pages).await;
            let failed = results.iter().filter(|r| r.is_err()).count();
            let c = &inner.counters;
            c.lower_errors.fetch_add(failed as u64, Relaxed);
            c.copied_down.fetch_add((n - failed) as u64, Relaxed);
            c.bytes_moved.fetch_add(bytes, Relaxed);
            if job.demotion {
                c.demotions.fetch_add((n - failed) as u64, Relaxed);
            }
        }
        inflight.done(&job.pages);
        backlog.done(n);
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
        // Every tier must be able to take the page, not just the top one.
        let limit = self.info().max_page_bytes;
        let mut results: Vec<PutResult> = pages.iter().map(|p| p.check_len(limit)).collect();
        let valid: Vec<usize> = (0..pages.len()).filter(|&i| results[i].is_ok()).collect();
        let sender = match self.policy.write {
            WritePolicy::WriteThrough if self.inner.levels.len() > 1 => self.sender(),
            _ => None,
        };
        let Some(tx) = sender else {
            let top: Vec<Page<'_>> = valid.iter().map(|&i| pages[i].clone()).collect();
            self.put_top(&top, &valid, &mut results).await;
            self.count_puts(pages, &results);
            return results;
        };
        // The queue keeps the pages past this call: take shared content once (lent regions
        // are copied here, once) and give the same pages to the top tier.
        let shared: Vec<Page<'static>> = valid.iter().map(|&i| pages[i].to_shared()).collect();
        self.put_top(&shared, &valid, &mut results).await;
        self.count_puts(pages, &results);
        let stored: Vec<Page<'static>> = shared
            .into_iter()
            .zip(&valid)
            .filter(|(_, &i)| results[i].is_ok())
            .map(|(p, _)| p)
            .collect();
        if !stored.is_empty() {
            let n = stored.len();
            self.backlog.add(n);
            self.inflight.add(&stored);
            let job = Job {
                targets: 1..self.inner.levels.len(),
                pages: stored,
                demotion: false,
            };
            // Backpressure: waits while the queue is full.
            if let Err(mpsc::error::SendError(job)) = tx.send(job).await {
                self.inflight.done(&job.pages);
                self.backlog.done(n);
            }
        }
        results
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
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
                match r {
                    Ok(Lookup::Hit) => {
                        level.served.fetch_add(1, Relaxed);
                        results[i] = Some(Ok(Lookup::Hit));
                        if depth > 0 && self.policy.promote {
                            promote.push(Page::new(slots[i].key.clone(), slots[i].buf.to_vec()));
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
                self.promote(depth, &promote).await;
            }
            if depth == 0 {
                // Pages on their way down are served before the lower tiers are asked.
                still.retain(|&i| {
                    let slot = &mut slots[i];
                    match self.inflight.get(&slot.key) {
                        Some(data) if data.len() == slot.buf.len() => {
                            slot.buf.fill_from_page(&data);
                            self.served_in_flight.fetch_add(1, Relaxed);
                            results[i] = Some(Ok(Lookup::Hit));
                            first_error[i] = None;
                            false
                        }
                        _ => true,
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

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        let mut at = 0;
        while at < keys.len() {
            let mut best = self.inflight.leading(&keys[at..]);
            for (depth, level) in self.inner.levels.iter().enumerate() {
                match level.tier.exists(&keys[at..]).await {
                    Ok(n) => best = best.max(n),
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

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        // Queued copies could re-create removed pages below: let them land first.
        let _ = self.flush().await;
        let mut results: Vec<RemoveResult> = keys.iter().map(|_| Ok(false)).collect();
        for level in &self.inner.levels {
            for (r, lr) in results.iter_mut().zip(level.tier.remove(keys).await) {
                match (lr, &r) {
                    (Ok(true), _) => *r = Ok(true),
                    (Err(e), Ok(false)) => *r = Err(e),
                    _ => {}
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

    async fn clear(&self) -> Result<(), TierError> {
        let _ = self.flush().await;
        let mut first = Ok(());
        for level in &self.inner.levels {
            if let Err(e) = level.tier.clear().await {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

impl Hierarchy {
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
        for (page, r) in pages.iter().zip(results) {
            match r {
                Ok(()) => self.stats.put(page.data.len()),
                Err(_) => self.stats.errors(1),
            }
        }
    }

    async fn promote(&self, found_at: usize, pages: &[Page<'static>]) {
        let bytes: u64 = pages.iter().map(|p| p.data.len() as u64).sum();
        for level in &self.inner.levels[..found_at] {
            let results = level.tier.put(pages).await;
            let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
            let c = &self.inner.counters;
            c.promotions.fetch_add(ok, Relaxed);
            c.bytes_moved.fetch_add(bytes, Relaxed);
            c.lower_errors.fetch_add(results.len() as u64 - ok, Relaxed);
        }
    }
}
