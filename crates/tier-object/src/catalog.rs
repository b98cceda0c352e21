//! The bound of an object tier with a `capacity`: which of its objects it holds, their
//! sizes, and the policy's order. Objects the policy lets go are queued for deletion; the tier
//! deletes each in its key's turn, and only if no put stored the key again meanwhile.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tier_core::PageKey;
use tier_policy::Policy;

struct Held {
    lens: HashMap<PageKey, u64>,
    policy: Box<dyn Policy<PageKey>>,
    bytes: u64,
    /// Evicted, not yet deleted.
    doomed: Vec<PageKey>,
}

pub(crate) struct Catalog {
    held: Mutex<Held>,
    capacity: u64,
}

impl Catalog {
    pub fn new(policy: Box<dyn Policy<PageKey>>, capacity: u64) -> Self {
        Self {
            held: Mutex::new(Held {
                lens: HashMap::new(),
                policy,
                bytes: 0,
                doomed: Vec::new(),
            }),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        // Nothing panics while the lock is held; a poisoned lock still guards whole state.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a stored object (after `after` in its batch); evicts until the bound holds.
    /// Returns how many were evicted.
    pub fn insert(&self, key: &PageKey, len: u64, after: Option<&PageKey>) -> usize {
        let mut held = self.lock();
        if let Some(old) = held.lens.insert(key.clone(), len) {
            held.bytes -= old;
        }
        held.bytes += len;
        held.policy.insert(key, len, after);
        let mut evicted = 0;
        while held.bytes > self.capacity {
            let Some(victim) = held.policy.victim(&mut |_| false) else {
                break;
            };
            if let Some(len) = held.lens.remove(&victim) {
                held.bytes -= len;
            }
            held.doomed.push(victim);
            evicted += 1;
        }
        evicted
    }

    /// Marks `key` read (after `after` in its batch).
    pub fn touch(&self, key: &PageKey, after: Option<&PageKey>) {
        let mut held = self.lock();
        if held.lens.contains_key(key) {
            held.policy.touch(key, after);
        }
    }

    /// Forgets `key` (removed).
    pub fn remove(&self, key: &PageKey) {
        let mut held = self.lock();
        if let Some(len) = held.lens.remove(key) {
            held.bytes -= len;
            held.policy.remove(key);
        }
    }

    /// Forgets every object.
    pub fn clear(&self) {
        let mut held = self.lock();
        held.lens.clear();
        held.policy.clear();
        held.bytes = 0;
        held.doomed.clear();
    }

    /// Whether `key` is held.
    pub fn contains(&self, key: &PageKey) -> bool {
        self.lock().lens.contains_key(key)
    }

    /// Evicted keys awaiting deletion, handed over once.
    pub fn take_doomed(&self) -> Vec<PageKey> {
        std::mem::take(&mut self.lock().doomed)
    }

    /// Gives back keys whose deletion did not happen (retried by a later call).
    pub fn give_back(&self, keys: Vec<PageKey>) {
        self.lock().doomed.extend(keys);
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}
