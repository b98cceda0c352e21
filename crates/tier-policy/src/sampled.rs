//! Sampled LRU, as Redis approximates it: no order is kept, only each key's last use (a
//! 32-bit clock beside the key, every use halved when it runs out). A victim is the oldest of
//! a pool of candidates refilled by random samples at each eviction. Memory per key: the key,
//! its value, 4 bytes of clock and
//! about 5 to 10 bytes of hash table, nothing else, so an index of millions of pages stays
//! small. With 64 samples and a pool of 32 its prefix reuse came within 0.22 points of LRU's
//! on every size of the sweeps in `docs/policies.md` (with 16 and 16, up to 1.37 below).

use std::hash::{BuildHasher, Hash};

use hashbrown::HashTable;

use crate::segments::Segments;
use crate::Policy;

/// Random slots looked at per eviction.
const SAMPLES: usize = 64;
/// Oldest candidates kept between evictions.
const POOL: usize = 32;
/// Rounds of sampling before a victim is searched for key by key (every key sampled being
/// protected).
const ROUNDS: usize = 4;

struct Slot<K, V> {
    key: K,
    value: V,
    used: u32,
}

/// Keys with a value each, in a dense array of [`Segments`] (a removal moves the last slot into
/// the hole) and a table of 32-bit slot numbers, evicted by sampled last use (see the module documentation).
pub struct SampledTable<K, V> {
    slots: Segments<Slot<K, V>>,
    table: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    clock: u32,
    /// Candidates from earlier samples, oldest first: a key and its clock when sampled.
    pool: Vec<(K, u32)>,
    rng: u64,
}

impl<K, V> Default for SampledTable<K, V> {
    fn default() -> Self {
        SampledTable {
            slots: Segments::default(),
            table: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
            clock: 0,
            pool: Vec::new(),
            rng: 0x9e37_79b9_7f4a_7c15,
        }
    }
}

impl<K: std::fmt::Debug, V> std::fmt::Debug for SampledTable<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SampledTable")
            .field("len", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl<K, V> SampledTable<K, V> {
    /// Bytes of one key's slot (its key, value and last use) in the dense array.
    pub const SLOT_BYTES: usize = std::mem::size_of::<Slot<K, V>>();
}

impl<K: Clone + Eq + Hash, V> SampledTable<K, V> {
    /// Keys held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.slots.len() == 0
    }

    /// Heap bytes its dense array and its table are allocated: the table grows by doubling, so
    /// a change there means a larger allocation replaced one now freed.
    pub fn allocated_bytes(&self) -> usize {
        self.slots.allocated_bytes() + self.table.allocation_size()
    }

    /// The clock, moved on by one use. Where it would run out, every last use (and the clock)
    /// is halved first: the order of uses stays, uses that close together may tie.
    fn tick(&mut self) -> u32 {
        if self.clock == u32::MAX {
            for slot in self.slots.iter_mut() {
                slot.used /= 2;
            }
            for (_, used) in &mut self.pool {
                *used /= 2;
            }
            self.clock /= 2;
        }
        self.clock += 1;
        self.clock
    }

    /// Sets the clock, to show what happens as it runs out.
    #[cfg(test)]
    pub(crate) fn set_clock(&mut self, clock: u32) {
        self.clock = clock;
    }

    fn find(&self, key: &K) -> Option<usize> {
        let hash = self.hasher.hash_one(key);
        self.table
            .find(hash, |&i| self.slots[i as usize].key == *key)
            .map(|&i| i as usize)
    }

    /// `key`'s value.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.find(key).map(|i| &self.slots[i].value)
    }

    /// `key`'s value, to change (its last use stays).
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.find(key).map(|i| &mut self.slots[i].value)
    }

    /// Holds `key` with `value`, used now; returns the value it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let used = self.tick();
        if let Some(i) = self.find(&key) {
            self.slots[i].used = used;
            return Some(std::mem::replace(&mut self.slots[i].value, value));
        }
        let Ok(at) = u32::try_from(self.slots.len()) else {
            // 2^32 keys: no slot number left; the oldest goes (never reached in practice).
            let _ = self.victim(&mut |_, _| false);
            return self.insert(key, value);
        };
        let hash = self.hasher.hash_one(&key);
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.table
            .insert_unique(hash, at, |&i| hasher.hash_one(&slots[i as usize].key));
        self.slots.push(Slot { key, value, used });
        None
    }

    /// Marks `key` used now; returns whether it is held.
    pub fn touch(&mut self, key: &K) -> bool {
        let used = self.tick();
        match self.find(key) {
            Some(i) => {
                self.slots[i].used = used;
                true
            }
            None => false,
        }
    }

    /// Forgets `key`; returns its value.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let i = self.find(key)?;
        self.remove_slot(i).map(|(_, value)| value)
    }

    fn remove_slot(&mut self, i: usize) -> Option<(K, V)> {
        let hash = self.hasher.hash_one(&self.slots[i].key);
        if let Ok(entry) = self.table.find_entry(hash, |&j| j as usize == i) {
            entry.remove();
        }
        let last = self.slots.len() - 1;
        if i != last {
            // The last slot moves into the hole: its table entry follows it.
            let hash = self.hasher.hash_one(&self.slots[last].key);
            if let Some(j) = self.table.find_mut(hash, |&j| j as usize == last) {
                *j = i as u32;
            }
        }
        let slot = self.slots.swap_remove(i)?;
        Some((slot.key, slot.value))
    }

    /// Forgets every key; returns them with their values.
    pub fn drain(&mut self) -> impl Iterator<Item = (K, V)> + '_ {
        self.table.clear();
        self.pool.clear();
        self.slots.drain().map(|s| (s.key, s.value))
    }

    fn random_slot(&mut self) -> usize {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng % self.slots.len() as u64) as usize
    }

    /// Chooses the least recently used key of those sampled (and of the pool kept from earlier
    /// samples) that `keep` does not protect, forgets it and returns it with its value; `None`
    /// when every key is protected (or none is held).
    pub fn victim(&mut self, keep: &mut dyn FnMut(&K, &V) -> bool) -> Option<(K, V)> {
        if self.is_empty() {
            return None;
        }
        for _ in 0..ROUNDS {
            // A table no larger than a sample is looked at whole: exact LRU.
            let whole = self.slots.len() <= SAMPLES;
            for n in 0..SAMPLES.min(self.slots.len()) {
                let i = if whole { n } else { self.random_slot() };
                let slot = &self.slots[i];
                self.pool.push((slot.key.clone(), slot.used));
            }
            let mut pool = std::mem::take(&mut self.pool);
            // Each use has a clock value of its own: one candidate per value.
            pool.sort_by_key(|&(_, used)| used);
            pool.dedup_by_key(|(_, used)| *used);
            let mut chosen = None;
            // Oldest first: a candidate used since it was sampled, gone, or protected now
            // leaves the pool (a later sample finds it again).
            pool.retain(|(key, used)| {
                if chosen.is_some() {
                    return true;
                }
                match self.find(key) {
                    Some(i) if self.slots[i].used == *used => {
                        if keep(&self.slots[i].key, &self.slots[i].value) {
                            false
                        } else {
                            chosen = Some(i);
                            false
                        }
                    }
                    _ => false,
                }
            });
            pool.truncate(POOL);
            self.pool = pool;
            if let Some(i) = chosen {
                return self.remove_slot(i);
            }
        }
        // Every candidate protected: the first unprotected key will do.
        let i = (0..self.slots.len()).find(|&i| !keep(&self.slots[i].key, &self.slots[i].value))?;
        self.remove_slot(i)
    }
}

/// Sampled LRU as a [`Policy`]: a [`SampledTable`] of keys alone.
#[derive(Debug)]
pub struct Sampled<K> {
    table: SampledTable<K, ()>,
}

impl<K> Default for Sampled<K> {
    fn default() -> Self {
        Sampled {
            table: SampledTable::default(),
        }
    }
}

impl<K: Clone + Eq + Hash + Send> Policy<K> for Sampled<K> {
    fn insert(&mut self, key: &K, _weight: u64, _after: Option<&K>) {
        self.table.insert(key.clone(), ());
    }

    fn touch(&mut self, key: &K, _after: Option<&K>) {
        self.table.touch(key);
    }

    fn remove(&mut self, key: &K) {
        self.table.remove(key);
    }

    fn victim(&mut self, keep: &mut dyn FnMut(&K) -> bool) -> Option<K> {
        self.table.victim(&mut |k, _| keep(k)).map(|(k, ())| k)
    }

    fn clear(&mut self) {
        self.table.drain().for_each(drop);
    }
}
