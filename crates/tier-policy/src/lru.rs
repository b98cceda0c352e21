use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use crate::Policy;

/// Least recently used first.
#[derive(Debug)]
pub struct Lru<K> {
    ticks: HashMap<K, u64>,
    by_age: BTreeMap<u64, K>,
    next: u64,
}

impl<K> Default for Lru<K> {
    fn default() -> Self {
        Lru {
            ticks: HashMap::new(),
            by_age: BTreeMap::new(),
            next: 0,
        }
    }
}

impl<K: Clone + Eq + Hash + Send> Lru<K> {
    fn use_now(&mut self, key: &K) {
        self.next += 1;
        if let Some(old) = self.ticks.insert(key.clone(), self.next) {
            self.by_age.remove(&old);
        }
        self.by_age.insert(self.next, key.clone());
    }
}

impl<K: Clone + Eq + Hash + Send> Policy<K> for Lru<K> {
    fn insert(&mut self, key: &K, _weight: u64, _after: Option<&K>) {
        self.use_now(key);
    }

    fn touch(&mut self, key: &K, _after: Option<&K>) {
        if self.ticks.contains_key(key) {
            self.use_now(key);
        }
    }

    fn remove(&mut self, key: &K) {
        if let Some(tick) = self.ticks.remove(key) {
            self.by_age.remove(&tick);
        }
    }

    fn victim(&mut self, keep: &mut dyn FnMut(&K) -> bool) -> Option<K> {
        let tick = *self.by_age.iter().find(|(_, k)| !keep(k))?.0;
        let key = self.by_age.remove(&tick)?;
        self.ticks.remove(&key);
        Some(key)
    }

    fn clear(&mut self) {
        self.ticks.clear();
        self.by_age.clear();
    }
}
