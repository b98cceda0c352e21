use std::collections::BTreeMap;
use std::hash::Hash;

use crate::{Map, Policy};

#[derive(Debug)]
struct Entry<K> {
    /// Which life of the key this is (a key removed and stored again is a new one).
    id: u64,
    /// Eviction priority: the aging floor when last used plus the uses so far.
    priority: u64,
    uses: u64,
    /// Orders entries of equal priority, older first.
    stamp: u64,
    /// Held keys linked to this one as the next page of a chain.
    children: u32,
    /// The page before this one in the batch that first stored it, and that entry's `id`.
    parent: Option<(K, u64)>,
}

/// The prefix-aware policy: leaf-first LFU with dynamic aging.
///
/// What a KV cache knows that a generic cache does not:
/// - A block is reused only if every block before it in its request is present, so evicting
///   a chain's head wastes its whole tail. A key stored right after another in one batch is
///   that key's child; only leaves (keys no held key follows) are evicted, so a chain is cut
///   from its tail, and its head, shared by every request that extends it, stays.
/// - A block near the root is used by many requests: among leaves the one with the lowest
///   priority goes, where priority is the number of uses plus an aging floor. The floor
///   rises to each victim's priority (GreedyDual's inflation), so a block used often long ago
///   loses to one used once lately: frequency for a hot root, recency for the rest, with no
///   parameter to tune per trace.
///
/// Links are made only when a key is first stored (a new key has no children), so they never
/// form a cycle. If the caller protects every leaf, the lowest-priority unprotected key is
/// chosen among all (a scan, only then).
#[derive(Debug)]
pub struct Prefix<K> {
    entries: Map<K, Entry<K>>,
    leaves: BTreeMap<(u64, u64), K>,
    floor: u64,
    next: u64,
    /// Orders leaves by uses plus aging (`true`) or by last use alone (`false`: leaf-first LRU).
    frequency: bool,
}

impl<K> Default for Prefix<K> {
    fn default() -> Self {
        Prefix {
            entries: Map::default(),
            leaves: BTreeMap::new(),
            floor: 0,
            next: 0,
            frequency: true,
        }
    }
}

impl<K: Clone + Eq + Hash + Send> Prefix<K> {
    /// Leaf-first LRU: the least recently used leaf goes (SGLang's radix-tree eviction).
    pub fn leaf_lru() -> Self {
        Prefix {
            frequency: false,
            ..Prefix::default()
        }
    }

    fn tick(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// `key` was evicted by another order: forgets it and ages the rest as if it were chosen
    /// here, so this order stays ready to lead.
    pub(crate) fn evicted(&mut self, key: &K) {
        if let Some(e) = self.forget(key) {
            self.floor = self.floor.max(e.priority);
        }
    }

    /// Counts one more use of `key`, re-ordering it among the leaves.
    fn used(&mut self, key: &K) {
        let stamp = self.tick();
        let floor = self.floor;
        let Some(e) = self.entries.get_mut(key) else {
            return;
        };
        let was = (e.priority, e.stamp);
        e.uses += 1;
        e.priority = if self.frequency { floor + e.uses } else { 0 };
        e.stamp = stamp;
        if e.children == 0 {
            self.leaves.remove(&was);
            self.leaves.insert((e.priority, e.stamp), key.clone());
        }
    }

    /// Forgets `key`; its parent becomes a leaf if this was its last child.
    fn forget(&mut self, key: &K) -> Option<Entry<K>> {
        let e = self.entries.remove(key)?;
        if e.children == 0 {
            self.leaves.remove(&(e.priority, e.stamp));
        }
        if let Some((parent, id)) = &e.parent {
            let stamp = self.tick();
            if let Some(p) = self.entries.get_mut(parent).filter(|p| p.id == *id) {
                p.children -= 1;
                if p.children == 0 {
                    // Last among its equals: the next victim of the same worth is another
                    // chain's tail, so chains shrink together rather than one to its root.
                    if self.frequency {
                        p.stamp = stamp;
                    }
                    self.leaves.insert((p.priority, p.stamp), parent.clone());
                }
            }
        }
        Some(e)
    }
}

impl<K: Clone + Eq + Hash + Send> crate::auto::Held<K> for Prefix<K> {
    fn holds(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }
    fn count(&self) -> usize {
        self.entries.len()
    }
    fn held_keys(&self) -> Vec<K> {
        self.entries.keys().cloned().collect()
    }
}

impl<K: Clone + Eq + Hash + Send> Policy<K> for Prefix<K> {
    fn insert(&mut self, key: &K, _weight: u64, after: Option<&K>) {
        if self.entries.contains_key(key) {
            self.used(key);
            return;
        }
        let id = self.tick();
        let mut parent = None;
        if let Some(a) = after.filter(|a| *a != key) {
            if let Some(p) = self.entries.get_mut(a) {
                p.children += 1;
                if p.children == 1 {
                    self.leaves.remove(&(p.priority, p.stamp));
                }
                parent = Some((a.clone(), p.id));
            }
        }
        let priority = if self.frequency { self.floor + 1 } else { 0 };
        self.entries.insert(
            key.clone(),
            Entry {
                id,
                priority,
                uses: 1,
                stamp: id,
                children: 0,
                parent,
            },
        );
        self.leaves.insert((priority, id), key.clone());
    }

    fn touch(&mut self, key: &K, _after: Option<&K>) {
        self.used(key);
    }

    fn remove(&mut self, key: &K) {
        self.forget(key);
    }

    fn victim(&mut self, keep: &mut dyn FnMut(&K) -> bool) -> Option<K> {
        let key = match self.leaves.values().find(|k| !keep(k)) {
            Some(k) => k.clone(),
            None => self
                .entries
                .iter()
                .filter(|(k, _)| !keep(k))
                .min_by_key(|(_, e)| (e.priority, e.stamp))
                .map(|(k, _)| k.clone())?,
        };
        let e = self.forget(&key)?;
        self.floor = self.floor.max(e.priority);
        Some(key)
    }

    fn clear(&mut self) {
        *self = Prefix {
            frequency: self.frequency,
            ..Prefix::default()
        };
    }
}
