use std::collections::BTreeMap;
use std::hash::Hash;

use crate::{Map, Policy};

const T1: usize = 0;
const T2: usize = 1;
const B1: usize = 2;
const B2: usize = 3;

/// ARC: held keys seen once (T1) and more than once (T2), each list in LRU order, with ghost
/// lists of keys recently evicted from each (B1, B2). A hit in a ghost list moves the target
/// size of T1 toward the list that would have kept it. Sizes count keys: the cache size is the
/// number of keys held when the tier asks for a victim.
#[derive(Debug)]
pub struct AdaptiveReplacement<K> {
    place: Map<K, (usize, u64)>,
    lists: [BTreeMap<u64, K>; 4],
    next: u64,
    /// Target number of keys in T1.
    target: usize,
}

impl<K> Default for AdaptiveReplacement<K> {
    fn default() -> Self {
        AdaptiveReplacement {
            place: Map::default(),
            lists: Default::default(),
            next: 0,
            target: 0,
        }
    }
}

impl<K: Clone + Eq + Hash + Send> AdaptiveReplacement<K> {
    fn held(&self) -> usize {
        self.lists[T1].len() + self.lists[T2].len()
    }

    /// Moves (or puts) `key` to the most recent end of `list`.
    fn place_in(&mut self, key: &K, list: usize) {
        self.next += 1;
        if let Some((l, tick)) = self.place.insert(key.clone(), (list, self.next)) {
            self.lists[l].remove(&tick);
        }
        self.lists[list].insert(self.next, key.clone());
    }

    fn drop_oldest(&mut self, list: usize) {
        if let Some((_, key)) = self.lists[list].pop_first() {
            self.place.remove(&key);
        }
    }

    /// Keeps the ghosts within ARC's bounds: |T1| + |B1| <= c and everything <= 2c.
    fn trim_ghosts(&mut self) {
        let c = self.held().max(1);
        while self.lists[T1].len() + self.lists[B1].len() > c && !self.lists[B1].is_empty() {
            self.drop_oldest(B1);
        }
        while self.held() + self.lists[B1].len() + self.lists[B2].len() > 2 * c {
            if self.lists[B2].is_empty() {
                self.drop_oldest(B1);
            } else {
                self.drop_oldest(B2);
            }
        }
    }

    fn evict_from(&mut self, list: usize, keep: &mut dyn FnMut(&K) -> bool) -> Option<K> {
        let tick = *self.lists[list].iter().find(|(_, k)| !keep(k))?.0;
        let key = self.lists[list].remove(&tick)?;
        self.place.remove(&key);
        self.place_in(&key, if list == T1 { B1 } else { B2 });
        Some(key)
    }
}

impl<K: Clone + Eq + Hash + Send> Policy<K> for AdaptiveReplacement<K> {
    fn insert(&mut self, key: &K, _weight: u64, _after: Option<&K>) {
        let c = self.held().max(1);
        match self.place.get(key).map(|&(l, _)| l) {
            Some(T1) | Some(T2) => self.place_in(key, T2),
            Some(B1) => {
                let step = (self.lists[B2].len() / self.lists[B1].len().max(1)).max(1);
                self.target = (self.target + step).min(c);
                self.place_in(key, T2);
            }
            Some(_) => {
                let step = (self.lists[B1].len() / self.lists[B2].len().max(1)).max(1);
                self.target = self.target.saturating_sub(step);
                self.place_in(key, T2);
            }
            None => self.place_in(key, T1),
        }
        self.trim_ghosts();
    }

    fn touch(&mut self, key: &K, _after: Option<&K>) {
        if matches!(self.place.get(key), Some(&(T1 | T2, _))) {
            self.place_in(key, T2);
        }
    }

    fn remove(&mut self, key: &K) {
        if let Some((l, tick)) = self.place.remove(key) {
            self.lists[l].remove(&tick);
        }
    }

    fn victim(&mut self, keep: &mut dyn FnMut(&K) -> bool) -> Option<K> {
        let t1 = self.lists[T1].len();
        let first = if t1 > 0 && (t1 > self.target || self.lists[T2].is_empty()) {
            T1
        } else {
            T2
        };
        let key = self
            .evict_from(first, keep)
            .or_else(|| self.evict_from(T1 + T2 - first, keep));
        self.trim_ghosts();
        key
    }

    fn clear(&mut self) {
        *self = AdaptiveReplacement::default();
    }
}

impl<K: Clone + Eq + Hash + Send> AdaptiveReplacement<K> {
    /// `key` was evicted by another order: it becomes a ghost of its list, as if chosen here,
    /// so this order stays ready to lead.
    pub(crate) fn evicted(&mut self, key: &K) {
        if let Some(&(list @ (T1 | T2), tick)) = self.place.get(key) {
            self.lists[list].remove(&tick);
            self.place.remove(key);
            self.place_in(key, if list == T1 { B1 } else { B2 });
            self.trim_ghosts();
        }
    }
}

impl<K: Clone + Eq + Hash + Send> crate::auto::Held<K> for AdaptiveReplacement<K> {
    fn holds(&self, key: &K) -> bool {
        matches!(self.place.get(key), Some(&(T1 | T2, _)))
    }
    fn count(&self) -> usize {
        self.held()
    }
    fn held_keys(&self) -> Vec<K> {
        self.lists[T1]
            .values()
            .chain(self.lists[T2].values())
            .cloned()
            .collect()
    }
}
