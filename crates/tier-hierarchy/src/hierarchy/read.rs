//! The read path: a page from the fastest tier holding it, or from the queue while it moves;
//! hits below promoted; the leading run of present keys.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use super::motion::InMotion;
use super::{Hierarchy, WritePolicy};
use crate::{GetResult, Lookup, Page, PageKey, ReadSlot, StorageTier, TierError};

/// The calls themselves; the trait's methods measure them.
impl Hierarchy {
    pub(super) async fn get_unmetered(
        &self,
        slots: &mut [ReadSlot<'_>],
        deadline: Option<Instant>,
    ) -> Vec<GetResult> {
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
            let level_results = match deadline {
                Some(d) => level.tier.get_by(&mut batch, d).await,
                None => level.tier.get(&mut batch).await,
            };
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
                let promotion = self.promote(depth, promote, &generations);
                match deadline {
                    // A promotion is only a copy: one the deadline cuts is not made.
                    Some(d) => drop(tokio::time::timeout_at(d.into(), promotion).await),
                    None => promotion.await,
                }
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
    pub(super) async fn exists_unmetered(
        &self,
        keys: &[PageKey],
        deadline: Option<Instant>,
    ) -> Result<usize, TierError> {
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
                let found = match deadline {
                    Some(d) => level.tier.exists_by(rest, d).await,
                    None => level.tier.exists(rest).await,
                };
                match found {
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
    /// Answers a read from what is in motion for its key.
    pub(super) fn serve_in_motion(&self, slot: &mut ReadSlot<'_>, moving: InMotion) -> GetResult {
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
    pub(super) async fn promote(
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
