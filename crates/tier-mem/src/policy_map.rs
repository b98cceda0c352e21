//! The DRAM tier's own engine: pages in a map, their order kept by a [`Policy`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tier_core::{Bytes, EvictedPage, EvictionCause, EvictionListener, PageKey, StatsRecorder};
use tier_policy::Policy;

use crate::entry_weight;

struct Held {
    pages: HashMap<PageKey, Bytes>,
    policy: Box<dyn Policy<PageKey>>,
    bytes: u64,
}

/// Pages and their policy under one lock, never held across an await. Evicted pages go to
/// the listener before the lock is released, so no call misses a page whose eviction the
/// listener has not seen yet.
pub(crate) struct PolicyMap {
    held: Mutex<Held>,
    capacity: u64,
    listener: Option<EvictionListener>,
    stats: Arc<StatsRecorder>,
}

impl PolicyMap {
    pub(crate) fn new(
        policy: Box<dyn Policy<PageKey>>,
        capacity: u64,
        listener: Option<EvictionListener>,
        stats: Arc<StatsRecorder>,
    ) -> Self {
        PolicyMap {
            held: Mutex::new(Held {
                pages: HashMap::new(),
                policy,
                bytes: 0,
            }),
            capacity,
            listener,
            stats,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        // Nothing panics while the lock is held; a poisoned lock still guards whole state.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Evicts until `data` fits, then stores it under `key` (after `after` in its batch).
    pub(crate) fn insert(&self, key: &PageKey, data: Bytes, after: Option<&PageKey>) {
        let weight = u64::from(entry_weight(key, data.len()));
        let mut held = self.lock();
        if let Some(old) = held.pages.remove(key) {
            held.bytes -= u64::from(entry_weight(key, old.len()));
        }
        // Room first, then the page: a new page is never its own victim.
        while held.bytes + weight > self.capacity {
            let Some(victim) = held.policy.victim(&mut |k| k == key) else {
                break;
            };
            if let Some(data) = held.pages.remove(&victim) {
                held.bytes -= u64::from(entry_weight(&victim, data.len()));
                self.stats.eviction();
                if let Some(listener) = &self.listener {
                    listener(EvictedPage {
                        key: victim,
                        data,
                        cause: EvictionCause::Capacity,
                    });
                }
            }
        }
        held.pages.insert(key.clone(), data);
        held.bytes += weight;
        held.policy.insert(key, weight, after);
    }

    /// The page under `key` (read after `after` in its batch), if held.
    pub(crate) fn get(&self, key: &PageKey, after: Option<&PageKey>) -> Option<Bytes> {
        let mut held = self.lock();
        let page = held.pages.get(key).cloned();
        if page.is_some() {
            held.policy.touch(key, after);
        }
        page
    }

    /// Marks `key` as just read (after `after` in its batch), if held.
    pub(crate) fn touch(&self, key: &PageKey, after: Option<&PageKey>) {
        let mut held = self.lock();
        if held.pages.contains_key(key) {
            held.policy.touch(key, after);
        }
    }

    /// How many of `keys`, from the first, are held.
    pub(crate) fn leading_run(&self, keys: &[PageKey]) -> usize {
        let held = self.lock();
        keys.iter()
            .take_while(|k| held.pages.contains_key(*k))
            .count()
    }

    /// Forgets `key`; returns whether it was held.
    pub(crate) fn remove(&self, key: &PageKey) -> bool {
        let mut held = self.lock();
        match held.pages.remove(key) {
            Some(data) => {
                held.bytes -= u64::from(entry_weight(key, data.len()));
                held.policy.remove(key);
                true
            }
            None => false,
        }
    }

    /// Forgets every page.
    pub(crate) fn clear(&self) {
        let mut held = self.lock();
        held.pages.clear();
        held.policy.clear();
        held.bytes = 0;
    }

    /// Bytes held (keys plus pages).
    pub(crate) fn bytes(&self) -> u64 {
        self.lock().bytes
    }
}
