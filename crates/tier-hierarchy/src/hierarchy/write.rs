//! The write path: puts to the top tier and down by the write policy, copies admitted on
//! reads, and removes and clears that reach every tier at once.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use tokio::sync::mpsc;

use super::queue::{Job, Moving};
use super::{Hierarchy, WritePolicy};
use crate::{Page, PageKey, PutResult, RemoveResult, StorageTier, TierError};

/// The calls themselves; the trait's methods measure them.
impl Hierarchy {
    pub(super) async fn put_unmetered(
        &self,
        pages: &[Page<'_>],
        deadline: Option<Instant>,
    ) -> Vec<PutResult> {
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
            self.room_for(bytes, deadline).await;
            Some(self.motion.reserve(bytes))
        } else {
            None
        };
        let Some(tx) = sender else {
            let mutation = self.motion.writing(&keys).await;
            let top: Vec<Page<'_>> = valid.iter().map(|&i| pages[i].clone()).collect();
            self.put_top(&top, &valid, &mut results, deadline).await;
            drop(mutation);
            self.count_puts(pages, &results);
            return results;
        };
        let mutation = self.motion.writing(&keys).await;
        // The queue keeps the pages past this call: take shared content once (lent regions
        // are copied here, once) and give the same pages to the top tier.
        let shared: Vec<Page<'static>> = valid.iter().map(|&i| pages[i].to_shared()).collect();
        self.put_top(&shared, &valid, &mut results, deadline).await;
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
                attempt: 0,
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
    pub(super) async fn remove_unmetered(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
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
    pub(super) async fn clear_unmetered(&self) -> Result<(), TierError> {
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
    pub(super) async fn put_top(
        &self,
        top: &[Page<'_>],
        at: &[usize],
        results: &mut [PutResult],
        deadline: Option<Instant>,
    ) {
        let tier = &self.inner.levels[0].tier;
        let top_results = match deadline {
            Some(d) => tier.put_by(top, d).await,
            None => tier.put(top).await,
        };
        let mut top_results = top_results.into_iter();
        for &i in at {
            results[i] = top_results.next().unwrap_or_else(|| {
                Err(TierError::Unavailable(
                    "the top tier returned too few results".into(),
                ))
            });
        }
    }
    pub(super) fn count_puts(&self, pages: &[Page<'_>], results: &[PutResult]) {
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
    /// Copies pages read at level `found_at` into every level above, each only if no put,
    /// remove or clear touched its key since the read began (`generations`, by slot).
    /// Queues for every lower tier the pages a read found in the top tier and admitted (see
    /// [`HierarchyPolicy::admit_after`]), those no put or remove touched since the read began
    /// and with nothing in motion, when the queue has room (a copy skipped waits for the page's
    /// next put). Decided and queued under the keys' stripes, so a later put's version is
    /// queued after this one and supersedes it.
    pub(super) fn copy_down_admitted(
        &self,
        candidates: Vec<(usize, Page<'static>)>,
        generations: &[u64],
    ) {
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
            attempt: 0,
        };
        if let Err(mpsc::error::SendError(job)) = tx.send(job) {
            for p in &job.pages {
                self.motion
                    .done(&p.key, p.seq, p.data.as_ref().map_or(0, |d| d.len() as u64));
            }
        }
        drop(held);
    }
}
