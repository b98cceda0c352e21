use std::collections::VecDeque;
use std::hash::Hash;

use crate::{Map, Policy};

#[derive(Debug)]
struct Entry {
    weight: u64,
    /// Reads since it entered its queue, saturating at 3.
    freq: u8,
    main: bool,
    /// Which queue slot is current (older slots of the key are stale).
    stamp: u64,
}

/// S3-FIFO: a new key enters a small FIFO (a tenth of the bytes); leaving it, a key read
/// meanwhile moves to the main FIFO, others are evicted and remembered in a ghost list. A key
/// that comes back while remembered goes straight to main. Main is a FIFO with reinsertion:
/// a read key goes round again with its count lowered.
#[derive(Debug)]
pub struct S3Fifo<K> {
    entries: Map<K, Entry>,
    small: VecDeque<(K, u64)>,
    main: VecDeque<(K, u64)>,
    ghosts: Map<K, u64>,
    ghost_order: VecDeque<(K, u64)>,
    small_bytes: u64,
    bytes: u64,
    next: u64,
}

impl<K> Default for S3Fifo<K> {
    fn default() -> Self {
        S3Fifo {
            entries: Map::default(),
            small: VecDeque::new(),
            main: VecDeque::new(),
            ghosts: Map::default(),
            ghost_order: VecDeque::new(),
            small_bytes: 0,
            bytes: 0,
            next: 0,
        }
    }
}

impl<K: Clone + Eq + Hash + Send> S3Fifo<K> {
    fn stamp(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn enqueue(&mut self, key: &K, main: bool) {
        let stamp = self.stamp();
        let e = self.entries.get_mut(key).expect("enqueued keys are held");
        e.stamp = stamp;
        e.main = main;
        if main {
            self.main.push_back((key.clone(), stamp));
        } else {
            self.small.push_back((key.clone(), stamp));
        }
    }

    fn forget_weight(&mut self, e: &Entry) {
        self.bytes -= e.weight;
        if !e.main {
            self.small_bytes -= e.weight;
        }
    }

    fn remember(&mut self, key: K) {
        let stamp = self.stamp();
        self.ghosts.insert(key.clone(), stamp);
        self.ghost_order.push_back((key, stamp));
        while self.ghosts.len() > self.entries.len().max(1) {
            let Some((k, s)) = self.ghost_order.pop_front() else {
                break;
            };
            if self.ghosts.get(&k) == Some(&s) {
                self.ghosts.remove(&k);
            }
        }
    }

    /// Drops stale queue slots once they outnumber the live ones.
    fn compact(&mut self) {
        let live = self.entries.len() + 64;
        let entries = &self.entries;
        let current = |(k, s): &(K, u64)| entries.get(k).is_some_and(|e| e.stamp == *s);
        if self.small.len() + self.main.len() > 2 * live {
            self.small.retain(current);
            self.main.retain(current);
        }
        if self.ghost_order.len() > 2 * (self.ghosts.len() + 64) {
            let ghosts = &self.ghosts;
            self.ghost_order
                .retain(|(k, s)| ghosts.get(k).is_some_and(|g| g == s));
        }
    }

    /// The front live slot of a queue, popped.
    fn pop(&mut self, main: bool) -> Option<K> {
        loop {
            let (k, s) = if main {
                self.main.pop_front()?
            } else {
                self.small.pop_front()?
            };
            if self.entries.get(&k).is_some_and(|e| e.stamp == s) {
                return Some(k);
            }
        }
    }
}

impl<K: Clone + Eq + Hash + Send> Policy<K> for S3Fifo<K> {
    fn insert(&mut self, key: &K, weight: u64, _after: Option<&K>) {
        if let Some(e) = self.entries.get_mut(key) {
            e.freq = (e.freq + 1).min(3);
            self.bytes = self.bytes - e.weight + weight;
            if !e.main {
                self.small_bytes = self.small_bytes - e.weight + weight;
            }
            e.weight = weight;
            return;
        }
        let main = self.ghosts.remove(key).is_some();
        self.entries.insert(
            key.clone(),
            Entry {
                weight,
                freq: 0,
                main,
                stamp: 0,
            },
        );
        self.bytes += weight;
        if !main {
            self.small_bytes += weight;
        }
        self.enqueue(key, main);
        self.compact();
    }

    fn touch(&mut self, key: &K, _after: Option<&K>) {
        if let Some(e) = self.entries.get_mut(key) {
            e.freq = (e.freq + 1).min(3);
        }
    }

    fn remove(&mut self, key: &K) {
        if let Some(e) = self.entries.remove(key) {
            self.forget_weight(&e);
        }
        self.ghosts.remove(key);
    }

    fn victim(&mut self, keep: &mut dyn FnMut(&K) -> bool) -> Option<K> {
        // Each key moves at most four times (out of small, three reads spent in main) before
        // it is evicted; a queue whose keys were all protected in a row is left for the other.
        let mut steps = 5 * self.entries.len() + 1;
        let (mut kept_small, mut kept_main) = (0, 0);
        while steps > 0 {
            steps -= 1;
            let small_open = kept_small <= self.small.len() && !self.small.is_empty();
            let main_open = kept_main <= self.main.len() && !self.main.is_empty();
            let small_first = self.small_bytes * 10 >= self.bytes || !main_open;
            let from_small = match (small_open, main_open) {
                (false, false) => return None,
                (true, false) => true,
                (false, true) => false,
                (true, true) => small_first,
            };
            let Some(key) = self.pop(!from_small) else {
                if from_small {
                    kept_small = usize::MAX;
                } else {
                    kept_main = usize::MAX;
                }
                continue;
            };
            let main = !from_small;
            if keep(&key) {
                self.enqueue(&key, main);
                if main {
                    kept_main += 1;
                } else {
                    kept_small += 1;
                }
                continue;
            }
            let e = self.entries.get_mut(&key).expect("popped keys are held");
            if e.freq > 0 {
                if main {
                    e.freq -= 1;
                } else {
                    e.freq = 0;
                    self.small_bytes -= e.weight;
                }
                self.enqueue(&key, true);
                continue;
            }
            let e = self.entries.remove(&key).expect("popped keys are held");
            self.forget_weight(&e);
            if !main {
                self.remember(key.clone());
            }
            return Some(key);
        }
        None
    }

    fn clear(&mut self) {
        *self = S3Fifo::default();
    }
}
