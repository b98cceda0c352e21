//! [`Motion`]: the one owner of what a hierarchy has in motion between its tiers.
//!
//! - **Pages on their way down** (write-through copies and demotions), readable until they
//!   land, newest version per key; a job whose version was superseded or removed meanwhile is
//!   skipped when its turn comes, so an older copy never lands after a newer one or after a
//!   remove. A demotion the queue had no room for leaves a *tombstone*: the copies below are
//!   stale and are removed, and nothing below is served for that key until they are.
//! - **Keys whose copies below may be stale** because a copy down failed: nothing below is
//!   served for them until a later copy down, remove or clear of the key succeeds.
//! - **Key generations and stripe locks**, so a promotion (a copy up of what was read below)
//!   never overwrites a newer put or resurrects a removed page: puts hold their keys' stripes
//!   shared and bump the generation when they end; removes and clears hold them exclusively; a
//!   promotion only tries them exclusively, and copies up only if no put or remove touched the
//!   key since the read began.
//! - **The backlog** in pages and bytes, and a way to wait for it to shrink.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::{PageData, PageKey};

/// Stripes of the generation table: two keys share one with probability 1/STRIPES.
const STRIPES: usize = 1024;

struct Entry {
    /// The newest version on its way down; `None`: the copies below are stale, to be removed.
    data: Option<PageData<'static>>,
    /// Sequence number of that version.
    seq: u64,
    /// Sequence number the entry was created with (jobs older than it belong to a purged one).
    first: u64,
    /// Jobs still carrying this key.
    pending: u32,
}

/// What the hierarchy knows about a key in motion.
pub(super) enum InMotion {
    /// Not in motion: the tiers answer.
    Still,
    /// This version is on its way down: it is the page.
    Page(PageData<'static>),
    /// The copies below are stale: only the top tier may answer.
    StaleBelow,
}

#[derive(Default)]
struct Stripe {
    lock: RwLock<()>,
    generation: AtomicU64,
}

/// See the module documentation.
pub(super) struct Motion {
    pages: Mutex<HashMap<PageKey, Entry>>,
    stale: Mutex<HashSet<PageKey>>,
    /// A clear failed below: any key's copies there may be stale.
    all_stale: AtomicBool,
    /// Keys a remove is removing now, each with whether a tier evicted it meanwhile (the
    /// eviction is then part of the remove, not carried down).
    removing: Mutex<HashMap<PageKey, bool>>,
    /// A clear is running: evictions are not carried down.
    clearing: AtomicBool,
    next_seq: AtomicU64,
    stripes: Box<[Stripe]>,
    hasher: std::collections::hash_map::RandomState,
    backlog_pages: AtomicUsize,
    backlog_bytes: AtomicU64,
    changed: Notify,
    /// Bytes the backlog may hold before writers wait and demotions become tombstones.
    bound: AtomicU64,
    /// Bytes of puts past [`Motion::has_room`] and not yet returned: what they evict from the
    /// top tier is always carried down.
    reserved: AtomicU64,
}

/// A put's claim on queue room for what it evicts; released when the put returns (or is
/// dropped).
pub(super) struct Reservation {
    motion: Arc<Motion>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.motion.reserved.fetch_sub(self.bytes, Relaxed);
    }
}

impl Motion {
    pub(super) fn new() -> Self {
        Self {
            pages: Mutex::default(),
            stale: Mutex::default(),
            all_stale: AtomicBool::new(false),
            removing: Mutex::default(),
            clearing: AtomicBool::new(false),
            next_seq: AtomicU64::new(1),
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
            hasher: Default::default(),
            backlog_pages: AtomicUsize::new(0),
            backlog_bytes: AtomicU64::new(0),
            changed: Notify::new(),
            bound: AtomicU64::new(u64::MAX),
            reserved: AtomicU64::new(0),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<PageKey, Entry>> {
        self.pages.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stripe(&self, key: &PageKey) -> usize {
        (self.hasher.hash_one(key) as usize) % STRIPES
    }

    fn stripes_of(&self, keys: &[PageKey]) -> Vec<usize> {
        let mut s: Vec<usize> = keys.iter().map(|k| self.stripe(k)).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    // ------------------------------------------------------------ pages in motion

    /// A tier evicted `key`: unless a remove or clear of it runs (the remove then counts it
    /// as found), records what `carried` decides goes down (the page, or a tombstone) as the
    /// key's newest version in motion and returns it with the sequence number for the job
    /// that carries it. Decided and recorded under the lock [`Motion::purge`] takes, so an
    /// eviction is either seen by the purge or part of the removal, never neither.
    pub(super) fn carry_eviction(
        &self,
        key: &PageKey,
        carried: impl FnOnce() -> Option<PageData<'static>>,
    ) -> Option<(u64, Option<PageData<'static>>)> {
        let mut map = self.map();
        if self.clearing.load(SeqCst) {
            return None;
        }
        if let Some(seen) = self
            .removing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(key)
        {
            *seen = true;
            return None;
        }
        let data = carried();
        Some((self.track_in(&mut map, key, data.clone()), data))
    }

    /// Records `data` (or a tombstone) as `key`'s newest version in motion; returns its
    /// sequence number for the job that carries it.
    pub(super) fn track(&self, key: &PageKey, data: Option<PageData<'static>>) -> u64 {
        self.track_in(&mut self.map(), key, data)
    }

    fn track_in(
        &self,
        map: &mut HashMap<PageKey, Entry>,
        key: &PageKey,
        data: Option<PageData<'static>>,
    ) -> u64 {
        let seq = self.next_seq.fetch_add(1, Relaxed);
        let bytes = data.as_ref().map_or(0, |d| d.len() as u64);
        let entry = map.entry(key.clone()).or_insert(Entry {
            data: None,
            seq,
            first: seq,
            pending: 0,
        });
        entry.data = data;
        entry.seq = seq;
        entry.pending += 1;
        self.backlog_pages.fetch_add(1, SeqCst);
        self.backlog_bytes.fetch_add(bytes, SeqCst);
        seq
    }

    /// Whether the version `seq` of `key` is still the newest in motion (not superseded, not
    /// purged by a remove).
    pub(super) fn is_current(&self, key: &PageKey, seq: u64) -> bool {
        self.map().get(key).is_some_and(|e| e.seq == seq)
    }

    /// A job carrying version `seq` of `key` (`bytes` long) is finished, landed or skipped.
    pub(super) fn done(&self, key: &PageKey, seq: u64, bytes: u64) {
        {
            let mut map = self.map();
            if let Some(entry) = map.get_mut(key) {
                if seq >= entry.first {
                    entry.pending -= 1;
                    if entry.pending == 0 {
                        map.remove(key);
                    }
                }
            }
        }
        self.backlog_pages.fetch_sub(1, SeqCst);
        self.backlog_bytes.fetch_sub(bytes, SeqCst);
        self.changed.notify_waiters();
    }

    fn stale(&self) -> std::sync::MutexGuard<'_, HashSet<PageKey>> {
        self.stale.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What is in motion for `key`.
    pub(super) fn lookup(&self, key: &PageKey) -> InMotion {
        match self.map().get(key) {
            Some(Entry { data: Some(d), .. }) => InMotion::Page(d.clone()),
            Some(Entry { data: None, .. }) => InMotion::StaleBelow,
            None if self.all_stale.load(SeqCst) || self.stale().contains(key) => {
                InMotion::StaleBelow
            }
            None => InMotion::Still,
        }
    }

    /// The leading run of `keys` whose page is in motion.
    pub(super) fn leading(&self, keys: &[PageKey]) -> usize {
        let map = self.map();
        keys.iter()
            .take_while(|k| map.get(*k).is_some_and(|e| e.data.is_some()))
            .count()
    }

    /// The position of the first key whose copies below are stale, or `keys.len()`.
    pub(super) fn first_stale_below(&self, keys: &[PageKey]) -> usize {
        keys.iter()
            .position(|k| matches!(self.lookup(k), InMotion::StaleBelow))
            .unwrap_or(keys.len())
    }

    /// A copy down of `key` failed (`true`: the tiers below may hold an older version) or
    /// landed in every target (`false`).
    pub(super) fn set_stale_below(&self, key: &PageKey, stale: bool) {
        let mut set = self.stale();
        if stale {
            set.insert(key.clone());
        } else {
            set.remove(key);
        }
    }

    /// Forgets `keys` (all keys if `None`): their queued jobs are skipped when they come up,
    /// evictions of them are no longer carried down, and nothing below is served for them
    /// until [`Motion::removed`] says every tier removed them (a remove dropped or failed half
    /// way must not uncover older copies). Answers, per key, whether a page of it was in
    /// motion.
    fn purge(&self, keys: Option<&[PageKey]>) -> Vec<bool> {
        let mut map = self.map();
        match keys {
            Some(keys) => {
                let mut stale = self.stale();
                let mut removing = self.removing.lock().unwrap_or_else(|e| e.into_inner());
                keys.iter()
                    .map(|k| {
                        stale.insert(k.clone());
                        removing.insert(k.clone(), false);
                        map.remove(k).is_some_and(|e| e.data.is_some())
                    })
                    .collect()
            }
            None => {
                self.clearing.store(true, SeqCst);
                self.all_stale.store(true, SeqCst);
                map.clear();
                Vec::new()
            }
        }
    }

    /// Ends the removal [`Motion::purge`] started; answers, per key, whether a tier evicted
    /// it meanwhile.
    fn end_removal(&self, keys: Option<&[PageKey]>) -> Vec<bool> {
        match keys {
            Some(keys) => {
                let mut removing = self.removing.lock().unwrap_or_else(|e| e.into_inner());
                keys.iter()
                    .map(|k| removing.remove(k).unwrap_or(false))
                    .collect()
            }
            None => {
                self.clearing.store(false, SeqCst);
                Vec::new()
            }
        }
    }

    /// Every tier removed `keys` (all keys if `None`): nothing stale is left below them.
    pub(super) fn removed(&self, keys: Option<&[PageKey]>) {
        let mut set = self.stale();
        match keys {
            Some(keys) => {
                for k in keys {
                    set.remove(k);
                }
            }
            None => {
                set.clear();
                self.all_stale.store(false, SeqCst);
            }
        }
    }

    /// Keys whose copies below may be stale now, and whether all of them may be.
    pub(super) fn stale_below(&self) -> (usize, bool) {
        (self.stale().len(), self.all_stale.load(SeqCst))
    }

    // ------------------------------------------------------------ backlog

    /// Pages and bytes queued below now.
    pub(super) fn backlog(&self) -> (usize, u64) {
        (
            self.backlog_pages.load(SeqCst),
            self.backlog_bytes.load(SeqCst),
        )
    }

    pub(super) fn set_bound(&self, bytes: u64) {
        self.bound.store(bytes.max(1), Relaxed);
    }

    /// Whether `bytes` more fit under the bound (an empty backlog takes anything). Writers
    /// wait for this before they put.
    pub(super) fn has_room(&self, bytes: u64) -> bool {
        let (pages, queued) = self.backlog();
        pages == 0 || queued.saturating_add(bytes) <= self.bound.load(Relaxed)
    }

    /// Claims room for the evictions a put of `bytes` may cause, once it passed
    /// [`Motion::has_room`].
    pub(super) fn reserve(self: &Arc<Self>, bytes: u64) -> Reservation {
        self.reserved.fetch_add(bytes, Relaxed);
        Reservation {
            motion: Arc::clone(self),
            bytes,
        }
    }

    /// Whether an evicted page of `bytes` may still be queued: up to the bound plus what the
    /// puts in progress reserved (a batch larger than the bound evicts that much), and at
    /// least four times the bound.
    pub(super) fn may_queue_eviction(&self, bytes: u64) -> bool {
        let (pages, queued) = self.backlog();
        let bound = self.bound.load(Relaxed);
        let limit = bound
            .saturating_mul(4)
            .max(bound.saturating_add(self.reserved.load(Relaxed)));
        pages == 0 || queued.saturating_add(bytes) <= limit
    }

    /// Waits until `ready` holds, re-checking whenever the backlog shrinks.
    pub(super) async fn wait_until(&self, ready: impl Fn(&Self) -> bool) {
        loop {
            let changed = self.changed.notified();
            if ready(self) {
                return;
            }
            changed.await;
        }
    }

    // ------------------------------------------------------------ generations

    /// The generation of each key's stripe now.
    pub(super) fn generations(&self, keys: &[PageKey]) -> Vec<u64> {
        keys.iter()
            .map(|k| self.stripes[self.stripe(k)].generation.load(SeqCst))
            .collect()
    }

    /// Holds `keys`' stripes shared (puts); the generations move on when the guard drops.
    pub(super) async fn writing(&self, keys: &[PageKey]) -> Mutation<'_> {
        let stripes = self.stripes_of(keys);
        let mut shared = Vec::with_capacity(stripes.len());
        for &s in &stripes {
            shared.push(self.stripes[s].lock.read().await);
        }
        Mutation {
            motion: self,
            stripes,
            _shared: shared,
            _exclusive: Vec::new(),
        }
    }

    /// Starts removing `keys` (every key if `None`): holds their stripes exclusively (no put,
    /// copy down or promotion of them runs meanwhile) and [purges](Motion::purge) them. The
    /// generations move on and the removal ends when the guard drops, also when the remove
    /// is dropped half way.
    pub(super) async fn removing(&self, keys: Option<&[PageKey]>) -> Removal<'_> {
        let stripes = match keys {
            Some(keys) => self.stripes_of(keys),
            None => (0..STRIPES).collect(),
        };
        let mut exclusive = Vec::with_capacity(stripes.len());
        for &s in &stripes {
            exclusive.push(self.stripes[s].lock.write().await);
        }
        let mutation = Mutation {
            motion: self,
            stripes,
            _shared: Vec::new(),
            _exclusive: exclusive,
        };
        let in_motion = self.purge(keys);
        Removal {
            mutation,
            scope: Some(keys.map(<[PageKey]>::to_vec)),
            in_motion,
        }
    }

    /// Holds `keys`' stripes shared without moving generations (the background writer).
    pub(super) async fn landing(&self, keys: &[PageKey]) -> Vec<RwLockReadGuard<'_, ()>> {
        let mut shared = Vec::new();
        for s in self.stripes_of(keys) {
            shared.push(self.stripes[s].lock.read().await);
        }
        shared
    }

    /// For a promotion of `key` read when its stripe was at `generation`: takes the stripe
    /// exclusively (into `held`) without waiting, and answers whether the copy up is safe: no
    /// put, remove or clear touched the stripe since, and nothing of the key is in motion.
    pub(super) fn may_promote<'a>(
        &'a self,
        key: &PageKey,
        generation: u64,
        held: &mut HashMap<usize, RwLockWriteGuard<'a, ()>>,
    ) -> bool {
        let s = self.stripe(key);
        if let std::collections::hash_map::Entry::Vacant(slot) = held.entry(s) {
            match self.stripes[s].lock.try_write() {
                Ok(guard) => {
                    slot.insert(guard);
                }
                Err(_) => return false,
            }
        }
        self.stripes[s].generation.load(SeqCst) == generation
            && matches!(self.lookup(key), InMotion::Still)
    }
}

/// A remove or clear in progress (see [`Motion::removing`]).
pub(super) struct Removal<'a> {
    mutation: Mutation<'a>,
    /// The keys being removed (`Some(None)`: all); `None` once ended.
    scope: Option<Option<Vec<PageKey>>>,
    /// Per key, whether a page of it was in motion when the removal began.
    pub in_motion: Vec<bool>,
}

impl Removal<'_> {
    fn end(&mut self) -> Vec<bool> {
        match self.scope.take() {
            Some(keys) => self.mutation.motion.end_removal(keys.as_deref()),
            None => Vec::new(),
        }
    }

    /// Ends the removal; answers, per key, whether a tier evicted it meanwhile (it was there).
    pub(super) fn finish(mut self) -> Vec<bool> {
        self.end()
    }
}

impl Drop for Removal<'_> {
    fn drop(&mut self) {
        // Dropped half way: evictions are carried down again from here.
        self.end();
    }
}

/// Stripes held by a put, remove or clear; dropping it (also when the call is dropped) moves
/// their generations on, so a promotion that read before it ends never copies up.
pub(super) struct Mutation<'a> {
    motion: &'a Motion,
    stripes: Vec<usize>,
    _shared: Vec<RwLockReadGuard<'a, ()>>,
    _exclusive: Vec<RwLockWriteGuard<'a, ()>>,
}

impl Drop for Mutation<'_> {
    fn drop(&mut self) {
        for &s in &self.stripes {
            self.motion.stripes[s].generation.fetch_add(1, SeqCst);
        }
    }
}
