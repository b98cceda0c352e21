//! The in-memory index of complete pages: presence, length, pins, byte capacity, and the
//! eviction policy's order.
//!
//! The tier's [catalog](super::catalog) changes a page's file and its entry together, under
//! one lock (a rename in with its insert, an unlink with its removal). Each entry has a
//! generation: a read that finds its file vanished forgets the entry only if it is still the
//! one the read planned with.
//!
//! The index is authoritative for the process that owns the storage folders (an exclusive lock
//! file makes that one process). It is rebuilt by scanning at start, while calls are served
//! (see [`PageIndex::load`]): until it is, a key it does not hold has its file looked at, and a
//! key removed meanwhile is never indexed from the scan. Cost per page, for
//! 64-character keys, in heap bytes: about 705 under the default policy, `auto` (which keeps
//! an LRU, a prefix, an ARC and an LFU order), 235 under `lru` (hash-map slot with the page's length,
//! generation and checksum, the key's shared string, and the policy's entries; the
//! `footprint` test counts both). Nothing else in the tier grows
//! with the pages stored.

use std::collections::{HashMap, HashSet};

use tier_core::PageKey;
use tier_policy::{Policy, PolicyKind};

#[derive(Debug)]
struct Entry {
    len: u64,
    pins: u32,
    generation: u64,
    /// The checksum of the file it describes, once known (written or verified by this process).
    checksum: Option<u32>,
}

/// Pages known to be complete on disk, ordered for eviction by a [`Policy`].
pub struct PageIndex {
    entries: HashMap<PageKey, Entry>,
    policy: Box<dyn Policy<PageKey>>,
    next_generation: u64,
    bytes: u64,
    /// Set while the pages found at open are indexed (see [`PageIndex::load`]).
    loading: Option<Loading>,
}

/// What happened while the pages found at open were being indexed, so that a file the scan
/// listed before a change is never indexed after it.
#[derive(Debug, Default)]
struct Loading {
    /// Keys removed or evicted since loading began.
    gone: HashSet<PageKey>,
    /// The index was cleared since: every file the scan finds is a page to unlink.
    cleared: bool,
}

/// What [`PageIndex::load`] made of a page file found at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loaded {
    /// Indexed.
    Indexed,
    /// Left: the index knows a newer state of the key (stored or removed since).
    Known,
    /// To unlink: the index was cleared since loading began.
    Cleared,
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
            loading: None,
        })
    }

    /// Starts indexing pages found on disk beside the calls served meanwhile (see
    /// [`PageIndex::load`]), until [`PageIndex::end_loading`].
    pub fn begin_loading(&mut self) {
        self.loading = Some(Loading::default());
    }

    /// Ends loading: the index describes every page on disk again.
    pub fn end_loading(&mut self) {
        self.loading = None;
    }

    /// Whether `key`'s file may hold a page found at open and not indexed yet: its file is
    /// to be looked at.
    pub fn may_hold_unindexed(&self, key: &PageKey) -> bool {
        !self.entries.contains_key(key)
            && self
                .loading
                .as_ref()
                .is_some_and(|l| !l.cleared && !l.gone.contains(key))
    }

    /// Indexes a page file of `len` found at open, unless the index has learnt of its key
    /// since loading began. It ranks as used after the pages stored meanwhile (the policies
    /// only append), so those few seconds of puts are evicted first.
    pub fn load(&mut self, key: PageKey, len: u64) -> Loaded {
        let Some(loading) = &self.loading else {
            return Loaded::Known;
        };
        if self.entries.contains_key(&key) || loading.gone.contains(&key) {
            return Loaded::Known;
        }
        if loading.cleared {
            return Loaded::Cleared;
        }
        self.insert(key, len, None, None);
        Loaded::Indexed
    }

    fn forgotten(&mut self, key: &PageKey) {
        if let Some(loading) = &mut self.loading {
            loading.gone.insert(key.clone());
        }
    }

    /// The stored length of `key`, if present.
    pub fn len_of(&self, key: &PageKey) -> Option<u64> {
        self.entries.get(key).map(|e| e.len)
    }

    /// The generation of `key`'s entry (new with every insert), if present.
    pub fn generation(&self, key: &PageKey) -> Option<u64> {
        self.entries.get(key).map(|e| e.generation)
    }

    /// The checksum recorded for `key`'s file, if this process knows it.
    pub fn checksum(&self, key: &PageKey) -> Option<u32> {
        self.entries.get(key).and_then(|e| e.checksum)
    }

    /// Records the checksum of `key`'s file, verified against its recorded one, if its entry is
    /// still of `generation`.
    pub fn learn_checksum(&mut self, key: &PageKey, generation: u64, checksum: u32) {
        if let Some(e) = self.entries.get_mut(key) {
            if e.generation == generation {
                e.checksum = Some(checksum);
            }
        }
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

    /// Records a complete page (new or replaced) and its file's checksum if known, stored after
    /// `after` in its batch.
    pub fn insert(
        &mut self,
        key: PageKey,
        len: u64,
        checksum: Option<u32>,
        after: Option<&PageKey>,
    ) {
        self.next_generation += 1;
        let generation = self.next_generation;
        self.policy.insert(&key, len, after);
        if let Some(e) = self.entries.get_mut(&key) {
            self.bytes = self.bytes - e.len + len;
            e.len = len;
            e.generation = generation;
            e.checksum = checksum;
        } else {
            self.bytes += len;
            self.entries.insert(
                key,
                Entry {
                    len,
                    pins: 0,
                    generation,
                    checksum,
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
        self.forgotten(key);
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
        if let Some(loading) = &mut self.loading {
            loading.gone.clear();
            loading.cleared = true;
        }
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
            self.forgotten(&key);
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
            idx.insert(k(name), 10, None, None);
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
        idx.insert(k("a"), 10, Some(1), None);
        idx.insert(k("a"), 4, None, None);
        assert_eq!(
            idx.checksum(&k("a")),
            None,
            "a replaced page's checksum is the new file's"
        );
        assert_eq!((idx.bytes(), idx.pages()), (4, 1));
        assert!(idx.remove(&k("a")));
        assert_eq!(idx.bytes(), 0);
    }
}

#[cfg(test)]
mod footprint {
    use super::*;
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

    /// The system allocator, counting the bytes live on the heap: a measure that, unlike the
    /// resident set, no other process or page cache moves.
    struct Counting;

    static LIVE: AtomicI64 = AtomicI64::new(0);

    // SAFETY: every call is forwarded unchanged to the system allocator.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            LIVE.fetch_add(layout.size() as i64, Relaxed);
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            LIVE.fetch_sub(layout.size() as i64, Relaxed);
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            LIVE.fetch_add(new_size as i64 - layout.size() as i64, Relaxed);
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    /// Heap bytes per page of an index of `PAGES` 64-character keys under `policy`.
    fn per_page(policy: PolicyKind) -> f64 {
        const PAGES: usize = 500_000;
        let before = LIVE.load(Relaxed);
        let mut idx = PageIndex::new(policy).unwrap();
        for i in 0..PAGES {
            let key = format!("{:064x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            idx.insert(PageKey::new(key).unwrap(), 65536, Some(i as u32), None);
        }
        assert_eq!(idx.pages(), PAGES);
        let per_page = (LIVE.load(Relaxed) - before) as f64 / PAGES as f64;
        println!("page index, {policy}: {per_page:.0} heap bytes per page ({PAGES} pages)");
        per_page
    }

    /// The documented cost (module documentation), counted as heap bytes the index holds,
    /// keys included. Alone in a process of its own, so no other test allocates meanwhile.
    #[test]
    fn index_costs_what_its_documentation_says() {
        if !tier_tests::fd::in_own_process() {
            return;
        }
        let default = per_page(PolicyKind::default());
        assert!(default < 750.0, "default policy: {default} bytes per page");
        let lru = per_page(PolicyKind::Lru);
        assert!(lru < 255.0, "lru: {lru} bytes per page");
    }
}
