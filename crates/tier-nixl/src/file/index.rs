//! The in-memory index of complete pages: presence, length, pins, byte capacity, and the
//! eviction policy's order.
//!
//! The tier changes a page's file and its entry together, under the index's lock (a rename
//! in with its insert, an unlink with its removal), so the index never describes a file that
//! is gone or of another length. Each entry has a generation: a read that finds its file
//! vanished forgets the entry only if it is still the one the read planned with.
//!
//! The index is authoritative for the process that owns the storage folders (an exclusive lock
//! file makes that one process). It is rebuilt by scanning at start. Cost per page, for
//! 64-character keys: about 420 bytes under the default policy, `auto` (which keeps both an LRU
//! and a prefix order), 175 under `lru` (hash-map slot, the key's shared string, and the
//! policy's entries; the `footprint` test measures the default). Nothing else in the tier grows
//! with the pages stored.

use std::collections::HashMap;

use tier_core::PageKey;
use tier_policy::{Policy, PolicyKind};

#[derive(Debug)]
struct Entry {
    len: u64,
    pins: u32,
    generation: u64,
}

/// Pages known to be complete on disk, ordered for eviction by a [`Policy`].
pub struct PageIndex {
    entries: HashMap<PageKey, Entry>,
    policy: Box<dyn Policy<PageKey>>,
    next_generation: u64,
    bytes: u64,
}

impl Default for PageIndex {
    fn default() -> Self {
        PageIndex::new(PolicyKind::default())
            .unwrap_or_else(|| unreachable!("the default is kvtier's"))
    }
}

impl PageIndex {
    /// An empty index evicting by `policy`; `None` for a policy kvtier does not implement
    /// (TinyLFU is moka's, for DRAM only).
    pub fn new(policy: PolicyKind) -> Option<Self> {
        Some(PageIndex {
            entries: HashMap::new(),
            policy: policy.build()?,
            next_generation: 0,
            bytes: 0,
        })
    }

    /// The stored length of `key`, if present.
    pub fn len_of(&self, key: &PageKey) -> Option<u64> {
        self.entries.get(key).map(|e| e.len)
    }

    /// The generation of `key`'s entry (new with every insert), if present.
    pub fn generation(&self, key: &PageKey) -> Option<u64> {
        self.entries.get(key).map(|e| e.generation)
    }

    /// Forgets `key` if its entry is still of `generation`; returns whether it did.
    pub fn remove_if(&mut self, key: &PageKey, generation: u64) -> bool {
        if self.generation(key) != Some(generation) {
            return false;
        }
        self.remove(key)
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &PageKey) -> bool {
        self.entries.contains_key(key)
    }

    /// Bytes of all indexed pages.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Number of indexed pages.
    pub fn pages(&self) -> usize {
        self.entries.len()
    }

    /// Records a complete page (new or replaced), stored after `after` in its batch.
    pub fn insert(&mut self, key: PageKey, len: u64, after: Option<&PageKey>) {
        self.next_generation += 1;
        let generation = self.next_generation;
        self.policy.insert(&key, len, after);
        if let Some(e) = self.entries.get_mut(&key) {
            self.bytes = self.bytes - e.len + len;
            e.len = len;
            e.generation = generation;
        } else {
            self.bytes += len;
            self.entries.insert(
                key,
                Entry {
                    len,
                    pins: 0,
                    generation,
                },
            );
        }
    }

    /// Marks `key` as just read (after `after` in its batch).
    pub fn touch(&mut self, key: &PageKey, after: Option<&PageKey>) {
        if self.entries.contains_key(key) {
            self.policy.touch(key, after);
        }
    }

    /// Forgets `key`; returns whether it was present.
    pub fn remove(&mut self, key: &PageKey) -> bool {
        match self.entries.remove(key) {
            Some(e) => {
                self.policy.remove(key);
                self.bytes -= e.len;
                true
            }
            None => false,
        }
    }

    /// Forgets every page; returns their keys.
    pub fn drain(&mut self) -> Vec<PageKey> {
        self.policy.clear();
        self.bytes = 0;
        self.entries.drain().map(|(k, _)| k).collect()
    }

    /// Protects `key` from eviction while it is read.
    pub fn pin(&mut self, key: &PageKey) {
        if let Some(e) = self.entries.get_mut(key) {
            e.pins += 1;
        }
    }

    /// Ends one [`PageIndex::pin`].
    pub fn unpin(&mut self, key: &PageKey) {
        if let Some(e) = self.entries.get_mut(key) {
            e.pins = e.pins.saturating_sub(1);
        }
    }

    /// Removes unpinned pages the policy chooses until at most `capacity` bytes remain;
    /// returns them for deletion.
    pub fn evict_to(&mut self, capacity: u64) -> Vec<PageKey> {
        let mut victims = Vec::new();
        while self.bytes > capacity {
            let entries = &self.entries;
            let mut pinned = |k: &PageKey| entries.get(k).is_some_and(|e| e.pins > 0);
            let Some(key) = self.policy.victim(&mut pinned) else {
                break;
            };
            if let Some(e) = self.entries.remove(&key) {
                self.bytes -= e.len;
            }
            victims.push(key);
        }
        victims
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> PageKey {
        PageKey::new(s).unwrap()
    }

    #[test]
    fn evicts_least_recent_unpinned_first() {
        let mut idx = PageIndex::default();
        for name in ["a", "b", "c", "d"] {
            idx.insert(k(name), 10, None);
        }
        idx.touch(&k("a"), None);
        idx.pin(&k("b"));
        assert_eq!(idx.evict_to(20), vec![k("c"), k("d")]);
        assert_eq!(idx.bytes(), 20);
        assert!(idx.contains(&k("a")) && idx.contains(&k("b")));
        idx.unpin(&k("b"));
        assert_eq!(idx.evict_to(10), vec![k("b")]);
    }

    #[test]
    fn replacing_a_page_updates_bytes() {
        let mut idx = PageIndex::default();
        idx.insert(k("a"), 10, None);
        idx.insert(k("a"), 4, None);
        assert_eq!((idx.bytes(), idx.pages()), (4, 1));
        assert!(idx.remove(&k("a")));
        assert_eq!(idx.bytes(), 0);
    }
}

#[cfg(test)]
mod footprint {
    use super::*;

    fn rss() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        kb * 1024
    }

    /// The documented cost: at most 450 bytes per page for 64-character keys (default policy).
    /// Measured as the process's resident memory: alone in a process of its own.
    #[test]
    fn index_costs_under_450_bytes_per_page() {
        if !tier_tests::fd::in_own_process() {
            return;
        }
        const PAGES: usize = 500_000;
        let keys: Vec<PageKey> = (0..PAGES)
            .map(|i| {
                PageKey::new(format!(
                    "{:064x}",
                    (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
                ))
                .unwrap()
            })
            .collect();
        let before = rss();
        let mut idx = PageIndex::default();
        for k in keys {
            idx.insert(k, 65536, None);
        }
        let per_page = (rss() - before) as f64 / PAGES as f64;
        println!("page index: {per_page:.0} bytes per page ({PAGES} pages, 64-char keys)");
        assert!(per_page < 450.0, "{per_page} bytes per page");
        assert_eq!(idx.pages(), PAGES);
    }
}
