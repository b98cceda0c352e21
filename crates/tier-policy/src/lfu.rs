use std::collections::BTreeMap;
use std::hash::Hash;

use crate::{hash_of, Map, Policy};

/// Least frequently used first, frequencies never aged, ties by least recent use.
///
/// A key's frequency counts every request for it since the policy began, also while it was
/// not held: a block that comes back after an eviction returns with its count. So blocks used
/// once (most of a chat trace's) go first, and blocks reused again and again stay through any
/// stream of new ones. The counts of keys not held live in a count-min sketch (4 rows of
/// saturating 8-bit counters, 8 per held key, at least 4,096): bounded memory, counts that
/// may err upward only. When the held keys outgrow the sketch it doubles and is filled again
/// from the held keys' counts (those of keys not held are then forgotten).
pub struct Lfu<K> {
    sketch: Sketch,
    /// Held keys by (frequency, last use).
    order: BTreeMap<(u32, u64), K>,
    held: Map<K, (u32, u64)>,
    tick: u64,
}

impl<K> Default for Lfu<K> {
    fn default() -> Self {
        Lfu {
            sketch: Sketch::new(MIN_WIDTH),
            order: BTreeMap::new(),
            held: Map::default(),
            tick: 0,
        }
    }
}

const MIN_WIDTH: usize = 4096;
const ROWS: usize = 4;

/// A count-min sketch of 8-bit saturating counters.
struct Sketch {
    counters: Vec<u8>,
    /// Counters per row, a power of two.
    width: usize,
}

impl Sketch {
    fn new(width: usize) -> Self {
        Sketch {
            counters: vec![0; width * ROWS],
            width,
        }
    }

    fn slots(&self, hash: u64) -> [usize; ROWS] {
        let mask = self.width as u64 - 1;
        let mut slots = [0; ROWS];
        for (row, slot) in slots.iter_mut().enumerate() {
            let h = hash
                .rotate_left(16 * row as u32)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15);
            *slot = row * self.width + ((h >> 32) & mask) as usize;
        }
        slots
    }

    /// Counts one more request of the key with this hash; its estimated count.
    fn increment(&mut self, hash: u64, by: u32) -> u32 {
        let slots = self.slots(hash);
        let least = slots.iter().map(|&s| self.counters[s]).min().unwrap_or(0);
        let target = (u32::from(least) + by).min(u32::from(u8::MAX)) as u8;
        // Conservative update: only the counters below the new estimate grow.
        for s in slots {
            self.counters[s] = self.counters[s].max(target);
        }
        u32::from(target)
    }
}

impl<K: Clone + Eq + Hash + Send> Lfu<K> {
    /// How many keys are held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    fn request(&mut self, key: &K) {
        if self.held.len() * 8 > self.sketch.width {
            self.grow();
        }
        self.tick += 1;
        let frequency = self.sketch.increment(hash_of(key), 1);
        if let Some(old) = self.held.insert(key.clone(), (frequency, self.tick)) {
            self.order.remove(&old);
        }
        self.order.insert((frequency, self.tick), key.clone());
    }

    fn grow(&mut self) {
        self.sketch = Sketch::new(self.sketch.width * 2);
        for (key, (frequency, _)) in &self.held {
            self.sketch.increment(hash_of(key), *frequency);
        }
    }
}

impl<K: Clone + Eq + Hash + Send> Policy<K> for Lfu<K> {
    fn insert(&mut self, key: &K, _weight: u64, _after: Option<&K>) {
        self.request(key);
    }

    fn touch(&mut self, key: &K, _after: Option<&K>) {
        if self.held.contains_key(key) {
            self.request(key);
        }
    }

    fn remove(&mut self, key: &K) {
        if let Some(at) = self.held.remove(key) {
            self.order.remove(&at);
        }
    }

    fn victim(&mut self, keep: &mut dyn FnMut(&K) -> bool) -> Option<K> {
        let (&at, key) = self.order.iter().find(|(_, k)| !keep(k))?;
        let key = key.clone();
        self.order.remove(&at);
        self.held.remove(&key);
        Some(key)
    }

    fn clear(&mut self) {
        *self = Lfu {
            sketch: Sketch::new(MIN_WIDTH),
            order: BTreeMap::new(),
            held: Map::default(),
            tick: 0,
        };
    }
}

impl<K: Clone + Eq + Hash + Send> crate::auto::Held<K> for Lfu<K> {
    fn holds(&self, key: &K) -> bool {
        self.held.contains_key(key)
    }
    fn count(&self) -> usize {
        self.held.len()
    }
    fn held_keys(&self) -> Vec<K> {
        self.held.keys().cloned().collect()
    }
}
