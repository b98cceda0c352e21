use std::cmp::Reverse;
use std::collections::BinaryHeap;
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
    /// Held keys by (frequency, last use), least first. A key's older entries stay until they
    /// surface (a push per use is cheaper than a reordering); an entry is current when it
    /// matches `held`.
    order: BinaryHeap<Reverse<Ranked<K>>>,
    /// Whether `order` is kept up to date; when not, the first victim builds it from `held`.
    ordered: bool,
    held: Map<K, (u32, u64)>,
    tick: u64,
}

/// A key and its (frequency, last use), ordered by the pair alone.
struct Ranked<K>((u32, u64), K);

impl<K> PartialEq for Ranked<K> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}
impl<K> Eq for Ranked<K> {}
impl<K> PartialOrd for Ranked<K> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Ranked<K> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

impl<K> Default for Lfu<K> {
    fn default() -> Self {
        Lfu {
            sketch: Sketch::new(MIN_WIDTH),
            order: BinaryHeap::new(),
            ordered: true,
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
        let rank = (self.sketch.increment(hash_of(key), 1), self.tick);
        match self.held.get_mut(key) {
            Some(at) => *at = rank,
            None => {
                self.held.insert(key.clone(), rank);
            }
        }
        if !self.ordered {
            return;
        }
        self.order.push(Reverse(Ranked(rank, key.clone())));
        if self.order.len() > 4 * self.held.len() + 64 {
            let held = &self.held;
            self.order
                .retain(|Reverse(Ranked(rank, k))| held.get(k) == Some(rank));
        }
    }

    /// An LFU that keeps no eviction order until its first victim (see [`Lfu::unorder`]).
    pub(crate) fn unordered() -> Self {
        let mut lfu = Lfu::default();
        lfu.unorder();
        lfu
    }

    /// Stops keeping the eviction order (for an order that does not choose victims now, as
    /// in [`crate::Auto`]): uses are still counted, and the next victim rebuilds the order.
    pub(crate) fn unorder(&mut self) {
        self.ordered = false;
        self.order = BinaryHeap::new();
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
        self.held.remove(key);
    }

    fn victim(&mut self, keep: &mut dyn FnMut(&K) -> bool) -> Option<K> {
        if !self.ordered {
            self.ordered = true;
            self.order = self
                .held
                .iter()
                .map(|(k, &rank)| Reverse(Ranked(rank, k.clone())))
                .collect();
        }
        let mut kept = Vec::new();
        let victim = loop {
            let Some(Reverse(Ranked(rank, key))) = self.order.pop() else {
                break None;
            };
            if self.held.get(&key) != Some(&rank) {
                continue;
            }
            if keep(&key) {
                kept.push(Reverse(Ranked(rank, key)));
                continue;
            }
            self.held.remove(&key);
            break Some(key);
        };
        self.order.extend(kept);
        victim
    }

    fn clear(&mut self) {
        *self = Lfu::default();
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
