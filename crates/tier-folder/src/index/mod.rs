//! The in-memory index of complete pages: presence, length, pins, byte capacity, and the
//! eviction policy's order.
//!
//! The tier's catalog (`crate::catalog`) changes a page's file and its entry together, under
//! one lock (a rename in with its insert, an unlink with its removal). Each entry has a
//! generation: a read that finds its file vanished forgets the entry only if it is still the
//! one the read planned with.
//!
//! The index is authoritative for the process that owns the storage folders (an exclusive lock
//! file makes that one process). It is rebuilt by scanning at start, while calls are served
//! (see [`PageIndex::load`]): until it is, a key it does not hold has its file looked at, and a
//! key removed meanwhile is never indexed from the scan.
//!
//! It keeps its policy's exact order up to `ordered_pages` pages, then carries that order over
//! to sampled LRU ([`SampledTable`]) for good. Cost per page, for 64-character keys, in heap
//! bytes (the `footprint` test, 500,000 pages): in exact order about 670 under `auto` (which
//! keeps an LRU, a prefix, an ARC and an LFU order) and 200 under `lru` (a hash-map slot with
//! the page's 14-byte entry, the key's shared string, and the policy's entries); sampled, 63
//! (a 52-byte slot in segments of 16,384: the key packed in 34 bytes (see [`Packer`]), the
//! entry and its 32-bit clock; and 32-bit slot numbers in a hash table; 69 with 56-byte slots in
//! one array grown by doubling). Nothing else in the tier grows with the pages stored.

use std::collections::{HashMap, HashSet};

use tier_core::PageKey;
use tier_policy::{Policy, PolicyKind, SampledTable};

use super::packed::{Packed, Packer};

/// A page's entry: 14 bytes aligned to 2, so that a sampled index's slot (the packed key, the
/// entry and its clock) is 52.
#[derive(Debug)]
#[repr(C, packed(2))]
struct Entry {
    /// The page's length: a FILE tier's pages are at most [`MAX_PAGE`](super::format::MAX_PAGE).
    len: u32,
    generation: Generation,
    /// The checksum of the file it describes, once known (written or verified by this
    /// process): valid where its marks say it is checksummed.
    checksum: u32,
    marks: Marks,
}

const _: () = assert!(SampledTable::<Packed, Entry>::SLOT_BYTES == 52);

/// An entry's pins (reads in progress: 15 bits, saturating) and, in the top bit, whether its
/// checksum is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Marks(u16);

impl Marks {
    const CHECKSUMMED: u16 = 1 << 15;
    const PINS: u16 = Self::CHECKSUMMED - 1;

    /// No pins; checksummed or not.
    fn new(checksummed: bool) -> Self {
        Marks(if checksummed { Self::CHECKSUMMED } else { 0 })
    }

    /// These marks with the pins of `old` (an entry replaced while it was read).
    fn with_pins_of(self, old: Marks) -> Self {
        Marks(self.0 & Self::CHECKSUMMED | old.0 & Self::PINS)
    }

    fn checksummed(self) -> bool {
        self.0 & Self::CHECKSUMMED != 0
    }

    fn set_checksummed(&mut self) {
        self.0 |= Self::CHECKSUMMED;
    }

    fn pinned(self) -> bool {
        self.0 & Self::PINS != 0
    }

    fn pin(&mut self) {
        if self.0 & Self::PINS != Self::PINS {
            self.0 += 1;
        }
    }

    fn unpin(&mut self) {
        if self.pinned() {
            self.0 -= 1;
        }
    }
}

/// An entry's generation, new with every insert; the default is none (a catalog without an
/// index). It wraps after 2^32 inserts: a read compares the generation it planned with within
/// its transfer's timeout, and 2^32 inserts in that time would take over 10^8 puts a second.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Generation(u32);

impl Generation {
    /// The generation after this one (never none).
    fn next(self) -> Self {
        Generation(self.0.wrapping_add(1).max(1))
    }
}

/// Where the entries are, and what orders them for eviction.
enum Store {
    /// A map of entries and a [`Policy`] holding the keys in its order.
    Ordered {
        entries: HashMap<PageKey, Entry>,
        policy: Box<dyn Policy<PageKey>>,
    },
    /// `sampled`: the entries in a [`SampledTable`], each with its last use and no order, under
    /// keys packed where they end in a hex digest (see [`Packer`]).
    Sampled {
        table: SampledTable<Packed, Entry>,
        packer: Box<Packer>,
    },
}

/// Pages an index keeps in its policy's exact order by default; past them it turns sampled.
pub const ORDERED_PAGES: usize = 1 << 16;

/// Pages known to be complete on disk, ordered for eviction by a [`Policy`] up to
/// `ordered_pages`, by sampled last use past them (and from the start under `sampled`).
pub struct PageIndex {
    store: Store,
    ordered_pages: usize,
    last_generation: Generation,
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
        let store = match policy {
            PolicyKind::Sampled => Store::Sampled {
                table: SampledTable::default(),
                packer: Box::default(),
            },
            other => Store::Ordered {
                entries: HashMap::new(),
                policy: other.build()?,
            },
        };
        Some(PageIndex {
            store,
            ordered_pages: ORDERED_PAGES,
            last_generation: Generation::default(),
            bytes: 0,
            loading: None,
        })
    }

    /// The same index, keeping its policy's order up to `pages` pages (default
    /// [`ORDERED_PAGES`]): past them it carries that order over to sampled last use for good.
    pub fn ordered_up_to(mut self, pages: usize) -> Self {
        self.ordered_pages = pages;
        self
    }

    /// Whether the index holds its policy's exact order (else sampled last use).
    #[cfg(test)]
    fn ordered(&self) -> bool {
        matches!(self.store, Store::Ordered { .. })
    }

    /// Readies the index for `pages` more pages (those an open's scan found): if they would
    /// take it past its ordered pages, it turns sampled now, while it holds few, rather than in
    /// the middle of the load (carrying 262,144 pages' `auto` order over held the index's lock
    /// for about half a second).
    pub fn expect(&mut self, pages: usize) {
        if self.pages().saturating_add(pages) > self.ordered_pages {
            self.turn_sampled();
        }
    }

    /// Turns an ordered index sampled, its policy's order kept: the policy's victims, first to
    /// last, become the least to the most recently used.
    fn turn_sampled(&mut self) {
        let Store::Ordered { entries, policy } = &mut self.store else {
            return;
        };
        let (mut table, mut packer) = (SampledTable::default(), Box::<Packer>::default());
        while let Some(key) = policy.victim(&mut |_| false) {
            if let Some(e) = entries.remove(&key) {
                table.insert(packer.pack(&key), e);
            }
        }
        for (key, e) in entries.drain() {
            table.insert(packer.pack(&key), e);
        }
        self.store = Store::Sampled { table, packer };
        release_freed_memory();
    }

    fn entry(&self, key: &PageKey) -> Option<&Entry> {
        match &self.store {
            Store::Ordered { entries, .. } => entries.get(key),
            Store::Sampled { table, packer } => table.get(&packer.find(key)),
        }
    }

    fn entry_mut(&mut self, key: &PageKey) -> Option<&mut Entry> {
        match &mut self.store {
            Store::Ordered { entries, .. } => entries.get_mut(key),
            Store::Sampled { table, packer } => table.get_mut(&packer.find(key)),
        }
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
        !self.contains(key)
            && self
                .loading
                .as_ref()
                .is_some_and(|l| !l.cleared && !l.gone.contains(key))
    }

    /// Indexes a page file of `len` found at open, unless the index has learnt of its key
    /// since loading began. It ranks as used after the pages stored meanwhile (the policies
    /// only append), so those few seconds of puts are evicted first.
    pub fn load(&mut self, key: PageKey, len: u32) -> Loaded {
        let Some(loading) = &self.loading else {
            return Loaded::Known;
        };
        if loading.gone.contains(&key) || self.contains(&key) {
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
        self.entry(key).map(|e| u64::from(e.len))
    }

    /// The generation of `key`'s entry (new with every insert), if present.
    pub fn generation(&self, key: &PageKey) -> Option<Generation> {
        self.entry(key).map(|e| e.generation)
    }

    /// The checksum recorded for `key`'s file, if this process knows it.
    pub fn checksum(&self, key: &PageKey) -> Option<u32> {
        self.entry(key)
            .and_then(|e| e.marks.checksummed().then_some(e.checksum))
    }

    /// Records the checksum of `key`'s file, verified against its recorded one, if its entry is
    /// still of `generation`.
    pub fn learn_checksum(&mut self, key: &PageKey, generation: Generation, checksum: u32) {
        if let Some(e) = self.entry_mut(key) {
            if { e.generation } == generation {
                e.checksum = checksum;
                e.marks.set_checksummed();
            }
        }
    }

    /// Forgets `key` if its entry is still of `generation`; returns whether it did.
    pub fn remove_if(&mut self, key: &PageKey, generation: Generation) -> bool {
        if self.generation(key) != Some(generation) {
            return false;
        }
        self.remove(key)
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &PageKey) -> bool {
        self.entry(key).is_some()
    }

    /// Bytes of all indexed pages.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Number of indexed pages.
    pub fn pages(&self) -> usize {
        match &self.store {
            Store::Ordered { entries, .. } => entries.len(),
            Store::Sampled { table, .. } => table.len(),
        }
    }

    /// Records a complete page (new or replaced) and its file's checksum if known, stored after
    /// `after` in its batch.
    pub fn insert(
        &mut self,
        key: PageKey,
        len: u32,
        checksum: Option<u32>,
        after: Option<&PageKey>,
    ) {
        self.last_generation = self.last_generation.next();
        let entry = Entry {
            len,
            generation: self.last_generation,
            checksum: checksum.unwrap_or(0),
            marks: Marks::new(checksum.is_some()),
        };
        let replaced = match &mut self.store {
            Store::Ordered { entries, policy } => {
                policy.insert(&key, u64::from(len), after);
                let replaced = match entries.get_mut(&key) {
                    Some(e) => Some(std::mem::replace(
                        e,
                        Entry {
                            marks: entry.marks.with_pins_of(e.marks),
                            ..entry
                        },
                    )),
                    None => entries.insert(key, entry),
                };
                if entries.len() > self.ordered_pages {
                    self.turn_sampled();
                }
                replaced
            }
            Store::Sampled { table, packer } => {
                let packed = packer.pack(&key);
                let marks = match table.get(&packed) {
                    Some(old) => entry.marks.with_pins_of(old.marks),
                    None => entry.marks,
                };
                let allocated = table.allocated_bytes();
                let replaced = table.insert(packed, Entry { marks, ..entry });
                if table.allocated_bytes() != allocated {
                    // The smaller array or table it outgrew: glibc would keep it resident.
                    release_freed_memory();
                }
                replaced
            }
        };
        self.bytes = self.bytes - replaced.map_or(0, |e| u64::from(e.len)) + u64::from(len);
    }

    /// Marks `key` as just read (after `after` in its batch).
    pub fn touch(&mut self, key: &PageKey, after: Option<&PageKey>) {
        match &mut self.store {
            Store::Ordered { entries, policy } => {
                if entries.contains_key(key) {
                    policy.touch(key, after);
                }
            }
            Store::Sampled { table, packer } => {
                table.touch(&packer.find(key));
            }
        }
    }

    /// Forgets `key`; returns whether it was present.
    pub fn remove(&mut self, key: &PageKey) -> bool {
        self.forgotten(key);
        let removed = match &mut self.store {
            Store::Ordered { entries, policy } => {
                let e = entries.remove(key);
                if e.is_some() {
                    policy.remove(key);
                }
                e
            }
            Store::Sampled { table, packer } => {
                let packed = packer.find(key);
                let e = table.remove(&packed);
                if e.is_some() {
                    packer.forget(&packed);
                }
                e
            }
        };
        match removed {
            Some(e) => {
                self.bytes -= u64::from(e.len);
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
        self.bytes = 0;
        match &mut self.store {
            Store::Ordered { entries, policy } => {
                policy.clear();
                entries.drain().map(|(k, _)| k).collect()
            }
            Store::Sampled { table, packer } => {
                let keys = table.drain().map(|(k, _)| packer.key(&k)).collect();
                packer.forget_all();
                keys
            }
        }
    }

    /// Protects `key` from eviction while it is read.
    pub fn pin(&mut self, key: &PageKey) {
        if let Some(e) = self.entry_mut(key) {
            e.marks.pin();
        }
    }

    /// Ends one [`PageIndex::pin`].
    pub fn unpin(&mut self, key: &PageKey) {
        if let Some(e) = self.entry_mut(key) {
            e.marks.unpin();
        }
    }

    /// Removes unpinned pages the policy chooses until at most `capacity` bytes remain;
    /// returns them for deletion.
    pub fn evict_to(&mut self, capacity: u64) -> Vec<PageKey> {
        let mut victims = Vec::new();
        while self.bytes > capacity {
            let victim = match &mut self.store {
                Store::Ordered { entries, policy } => {
                    let mut pinned = |k: &PageKey| entries.get(k).is_some_and(|e| e.marks.pinned());
                    policy
                        .victim(&mut pinned)
                        .map(|key| (entries.remove(&key).map_or(0, |e| e.len), key))
                }
                Store::Sampled { table, packer } => {
                    table
                        .victim(&mut |_, e| e.marks.pinned())
                        .map(|(packed, e)| {
                            let key = packer.key(&packed);
                            packer.forget(&packed);
                            (e.len, key)
                        })
                }
            };
            let Some((len, key)) = victim else {
                break;
            };
            self.bytes -= u64::from(len);
            self.forgotten(&key);
            victims.push(key);
        }
        victims
    }
}

/// Gives the allocator's free memory back to the system: after an index turned sampled (its
/// policy's entries freed), after its sampled array or table grew (the smaller one freed:
/// about 20 MiB left resident over a 1,000,000-page fill otherwise), and after an open's scan
/// (its keys freed once indexed), glibc keeps the freed blocks in the process's resident set
/// otherwise. A grown index calls it a few dozen times in its life.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only hands free memory of the allocator's arenas back to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod footprint;
#[cfg(test)]
mod tests;
