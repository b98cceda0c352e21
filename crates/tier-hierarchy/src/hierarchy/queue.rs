//! The background queue that carries pages down: write-through copies and write-back
//! demotions, one FIFO, one writer task.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::mpsc;

use super::admission::Admission;
use super::motion::Motion;
use super::Inner;
use crate::health::TierState;
use crate::{EvictedPage, EvictionListener, Page, PageData, PageKey, StorageTier};

/// One page (or a tombstone: its copies below are stale) on its way down.
pub(super) struct Moving {
    pub key: PageKey,
    pub data: Option<PageData<'static>>,
    pub seq: u64,
}

impl Moving {
    fn bytes(&self) -> u64 {
        self.data.as_ref().map_or(0, |d| d.len() as u64)
    }
}

/// Background work: write (or remove) `pages` in tiers `targets`.
pub(super) struct Job {
    pub targets: std::ops::Range<usize>,
    pub pages: Vec<Moving>,
    pub demotion: bool,
    /// Times this job was tried already (a failed demotion is tried again).
    pub attempt: u32,
}

/// The queue that carries evicted pages down one tier (write-back). Create it first, hand
/// [`DemotionQueue::listener`] to each tier's eviction hook, then give it to
/// [`Hierarchy::new`](super::Hierarchy::new).
pub struct DemotionQueue {
    pub(super) tx: mpsc::UnboundedSender<Job>,
    pub(super) rx: Mutex<Option<mpsc::UnboundedReceiver<Job>>>,
    pub(super) motion: Arc<Motion>,
    pub(super) dropped: Arc<AtomicU64>,
    pub(super) admission: Arc<Admission>,
    pub(super) not_admitted: Arc<AtomicU64>,
}

impl DemotionQueue {
    /// A queue; its bound in bytes is the hierarchy's `queue_bytes`.
    pub fn new() -> Arc<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        Arc::new(Self {
            tx,
            rx: Mutex::new(Some(rx)),
            motion: Arc::new(Motion::new()),
            dropped: Arc::default(),
            admission: Arc::new(Admission::new()),
            not_admitted: Arc::default(),
        })
    }

    /// The eviction hook for tier `level`: its evicted pages go to tier `level + 1`. It never
    /// blocks. The page is readable through the hierarchy from the moment the hook runs until
    /// it lands. Writers wait for room in the queue before they put (so before they evict);
    /// if the queue still holds four times its bound, the page is not carried: its stale
    /// copies below are removed instead (counted as dropped), never served. So is a page
    /// whose key was requested fewer times than the hierarchy's `admit_after`.
    pub fn listener(&self, level: usize) -> EvictionListener {
        let (tx, motion, dropped, admission, not_admitted) = (
            self.tx.clone(),
            Arc::clone(&self.motion),
            Arc::clone(&self.dropped),
            Arc::clone(&self.admission),
            Arc::clone(&self.not_admitted),
        );
        Arc::new(move |page: EvictedPage| {
            let data = PageData::from(page.data);
            let carried = motion.carry_eviction(&page.key, || {
                if !admission.admits(&page.key) {
                    not_admitted.fetch_add(1, Relaxed);
                    None
                } else if motion.may_queue_eviction(data.len() as u64) {
                    Some(data)
                } else {
                    dropped.fetch_add(1, Relaxed);
                    None
                }
            });
            let Some((seq, data)) = carried else {
                return;
            };
            let moving = Moving {
                key: page.key,
                data,
                seq,
            };
            let job = Job {
                targets: level + 1..level + 2,
                pages: vec![moving],
                demotion: true,
                attempt: 0,
            };
            if let Err(mpsc::error::SendError(job)) = tx.send(job) {
                // The hierarchy is closed: nothing will land.
                for p in &job.pages {
                    motion.done(&p.key, p.seq, p.bytes());
                }
            }
        })
    }
}

/// Tries of a demotion a target fails as a tier while not down (while down: until it is up).
const DEMOTION_ATTEMPTS: u32 = 3;

/// Writes each job's pages that are still current (a newer version or a remove supersedes a
/// queued one) into its target tiers, holding their keys' stripes so a remove waits for it.
pub(super) async fn background_writer(
    tiers: Weak<Inner>,
    mut rx: mpsc::UnboundedReceiver<Job>,
    motion: Arc<Motion>,
) {
    // A demotion the target failed as a tier: tried again (once it is up, if it went down)
    // before anything queued after it.
    let mut retry: Option<Job> = None;
    loop {
        let job = match retry.take() {
            Some(job) => job,
            None => match rx.recv().await {
                Some(job) => job,
                None => return,
            },
        };
        // Held for one job only: a hierarchy dropped lets go of its tiers at once, not once
        // this task has seen its abort.
        let Some(inner) = tiers.upgrade() else {
            return;
        };
        if job.demotion {
            // Write-back: an evicted page waits in the queue (within its bound) while the
            // tier it goes to is down; write-through copies fail at once and are not carried.
            for level in job.targets.clone() {
                if let Some(target) = inner.levels.get(level) {
                    target.tier.wait_up().await;
                }
            }
        }
        let keys: Vec<PageKey> = job.pages.iter().map(|p| p.key.clone()).collect();
        let landing = motion.landing(&keys).await;
        // Positions in `job.pages` of the current pages to write, and of tombstones.
        let (mut written, mut stale) = (Vec::new(), Vec::new());
        for (at, p) in job.pages.iter().enumerate() {
            if !motion.is_current(&p.key, p.seq) {
                continue;
            }
            match &p.data {
                Some(_) => written.push(at),
                None => stale.push(p.key.clone()),
            }
        }
        let pages: Vec<Page<'static>> = written
            .iter()
            .filter_map(|&at| {
                let p = &job.pages[at];
                p.data
                    .as_ref()
                    .map(|data| Page::with_data(p.key.clone(), data.clone()))
            })
            .collect();
        let bytes: u64 = pages.iter().map(|p| p.data.len() as u64).sum();
        let c = &inner.counters;
        // Keys a target failed to take: that target may keep an older version.
        let mut failed_keys: Vec<bool> = vec![false; pages.len()];
        // Demoted pages the target failed as a tier: carried again.
        let mut again: Vec<usize> = Vec::new();
        for level in job.targets.clone() {
            let Some(target) = inner.levels.get(level) else {
                continue;
            };
            if !pages.is_empty() {
                let results = target.tier.put(&pages).await;
                // A demotion is the page's only copy: one the target failed as a tier (not for
                // the page) is carried again, while the target is down or a few times.
                let again_ok = job.demotion
                    && (target.tier.state() == TierState::Down || job.attempt < DEMOTION_ATTEMPTS);
                let mut failed = 0;
                for (i, r) in results.iter().enumerate() {
                    match r {
                        Err(e) if again_ok && e.is_tier_fault() => again.push(i),
                        Err(_) => {
                            failed += 1;
                            failed_keys[i] = true;
                        }
                        Ok(()) => {}
                    }
                }
                let landed = pages.len() - failed - again.len();
                c.lower_errors.fetch_add(failed as u64, Relaxed);
                c.copied_down.fetch_add(landed as u64, Relaxed);
                c.bytes_moved.fetch_add(bytes, Relaxed);
                if job.demotion {
                    c.demotions.fetch_add(landed as u64, Relaxed);
                }
            }
            if !stale.is_empty() {
                let results = target.tier.remove(&stale).await;
                for (key, r) in stale.iter().zip(&results) {
                    if r.is_err() {
                        c.lower_errors.fetch_add(1, Relaxed);
                        motion.set_stale_below(key, true);
                    }
                }
            }
        }
        for (i, (page, failed)) in pages.iter().zip(failed_keys).enumerate() {
            if !again.contains(&i) {
                motion.set_stale_below(&page.key, failed);
            }
        }
        drop(landing);
        let carried_again: Vec<usize> = again.iter().map(|&i| written[i]).collect();
        let mut kept = Vec::new();
        for (at, p) in job.pages.into_iter().enumerate() {
            if carried_again.contains(&at) {
                kept.push(p);
            } else {
                motion.done(&p.key, p.seq, p.bytes());
            }
        }
        if !kept.is_empty() {
            retry = Some(Job {
                targets: job.targets,
                pages: kept,
                demotion: true,
                attempt: job.attempt + 1,
            });
        }
    }
}
