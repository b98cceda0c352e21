use std::hash::Hash;

use hashlink::LinkedHashSet;

use crate::Policy;

/// Least recently used first.
#[derive(Debug)]
pub struct Lru<K> {
    /// Held keys, least recently used at the front.
    order: LinkedHashSet<K>,
}

impl<K: Eq + Hash> Default for Lru<K> {
    fn default() -> Self {
        Lru {
            order: LinkedHashSet::new(),
        }
    }
}

impl<K: Clone + Eq + Hash + Send> Lru<K> {
    /// How many keys are held.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

impl<K: Clone + Eq + Hash + Send> crate::auto::Held<K> for Lru<K> {
    fn holds(&self, key: &K) -> bool {
        self.order.contains(key)
    }
    fn count(&self) -> usize {
        self.order.len()
    }
    fn held_keys(&self) -> Vec<K> {
        self.order.iter().cloned().collect()
    }
}

impl<K: Clone + Eq + Hash + Send> Policy<K> for Lru<K> {
    fn insert(&mut self, key: &K, _weight: u64, _after: Option<&K>) {
        if !self.order.to_back(key) {
            self.order.insert(key.clone());
        }
    }

    fn touch(&mut self, key: &K, _after: Option<&K>) {
        self.order.to_back(key);
    }

    fn remove(&mut self, key: &K) {
        self.order.remove(key);
    }

    fn victim(&mut self, keep: &mut dyn FnMut(&K) -> bool) -> Option<K> {
        let key = self.order.iter().find(|k| !keep(k))?.clone();
        self.order.remove(&key);
        Some(key)
    }

    fn clear(&mut self) {
        self.order.clear();
    }
}
