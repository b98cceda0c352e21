//! Admission to the lower tiers: a page is written below only once its key has been requested
//! (put or read through the hierarchy) `admit_after` times. Requests are counted in a
//! count-min sketch of fixed size that halves every counter as it fills, so old popularity
//! fades and memory never grows with the keys seen.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Mutex;

use crate::PageKey;

const ROWS: usize = 4;
/// Counters per row: 4 x 2^18 bytes = 1 MiB in all.
const WIDTH: usize = 1 << 18;
/// Counts saturate here; more than any useful threshold.
const MAX_COUNT: u8 = 15;

struct Sketch {
    counters: Vec<u8>,
    /// Increments since the last halving.
    added: usize,
    hasher: std::hash::RandomState,
}

impl Sketch {
    fn slots(&self, key: &PageKey) -> [usize; ROWS] {
        let hash = self.hasher.hash_one(key);
        // Four indices from one 64-bit hash (double hashing).
        let (a, b) = (hash as u32 as usize, (hash >> 32) as usize | 1);
        std::array::from_fn(|row| row * WIDTH + (a.wrapping_add(row.wrapping_mul(b)) % WIDTH))
    }

    fn estimate(&self, key: &PageKey) -> u8 {
        self.slots(key)
            .iter()
            .map(|&i| self.counters[i])
            .min()
            .unwrap_or(0)
    }

    fn add(&mut self, key: &PageKey) {
        let slots = self.slots(key);
        let least = slots.iter().map(|&i| self.counters[i]).min().unwrap_or(0);
        // Conservative update: raise only the counters at the minimum.
        for i in slots {
            if self.counters[i] == least && least < MAX_COUNT {
                self.counters[i] += 1;
            }
        }
        self.added += 1;
        if self.added >= WIDTH * 8 {
            self.added = 0;
            for c in &mut self.counters {
                *c /= 2;
            }
        }
    }
}

/// Who may be written below. With a threshold of 1 (the default) every page may, and nothing
/// is counted (no sketch is allocated).
pub(super) struct Admission {
    threshold: AtomicU32,
    sketch: Mutex<Option<Sketch>>,
}

impl Admission {
    pub fn new() -> Self {
        Self {
            threshold: AtomicU32::new(1),
            sketch: Mutex::new(None),
        }
    }

    /// Pages need `n` requests of their key before they are written below.
    pub fn set_threshold(&self, n: u32) {
        self.threshold.store(n.max(1), Relaxed);
    }

    fn counting(&self) -> bool {
        self.threshold.load(Relaxed) > 1
    }

    /// Counts one request of each key; answers, per key, whether this request is the one that
    /// admits it (its count reached the threshold just now). Empty when nothing is counted.
    pub fn record(&self, keys: &[PageKey]) -> Vec<bool> {
        if !self.counting() {
            return Vec::new();
        }
        let threshold = self.threshold.load(Relaxed);
        let mut sketch = self.sketch.lock().unwrap_or_else(|e| e.into_inner());
        let sketch = sketch.get_or_insert_with(|| Sketch {
            counters: vec![0; ROWS * WIDTH],
            added: 0,
            hasher: std::hash::RandomState::new(),
        });
        keys.iter()
            .map(|key| {
                let before = u32::from(sketch.estimate(key));
                sketch.add(key);
                before < threshold && u32::from(sketch.estimate(key)) >= threshold
            })
            .collect()
    }

    /// Whether `key` has been requested often enough to be written below.
    pub fn admits(&self, key: &PageKey) -> bool {
        let threshold = self.threshold.load(Relaxed);
        if threshold <= 1 {
            return true;
        }
        let sketch = self.sketch.lock().unwrap_or_else(|e| e.into_inner());
        sketch
            .as_ref()
            .is_some_and(|s| u32::from(s.estimate(key)) >= threshold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u32) -> PageKey {
        PageKey::new(format!("key-{i}")).unwrap()
    }

    #[test]
    fn a_key_is_admitted_at_its_nth_request_and_not_before() {
        let a = Admission::new();
        assert!(a.admits(&k(0)), "threshold 1 admits everything");
        a.set_threshold(3);
        for i in 0..10_000 {
            a.record(&[k(i)]);
        }
        let early = (0..10_000).filter(|&i| a.admits(&k(i))).count();
        assert!(
            early < 50,
            "{early} keys seen once admitted (collisions only)"
        );
        assert_eq!(a.record(&[k(1), k(2)]), [false, false]);
        assert!(!a.admits(&k(1)));
        assert_eq!(a.record(&[k(1)]), [true], "the third request admits");
        assert!(a.admits(&k(1)) && !a.admits(&k(2)));
        assert_eq!(a.record(&[k(1)]), [false], "admitted once, not again");
    }
}
