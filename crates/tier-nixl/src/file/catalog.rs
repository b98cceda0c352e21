//! The FILE tier's catalog: the pages it stores, as files and as index entries, changed
//! together in this one place under one lock. A file is renamed in with its entry's insert and
//! unlinked with its entry's removal, so the index never describes a file that is gone,
//! replaced behind its back or of another length. Nothing outside this module sees the lock.
//!
//! Entries carry generations (new with every insert): a read that planned with one generation
//! changes an entry only while it is still that one, so a page a put replaced meanwhile is
//! never forgotten or unlinked in its place.
//!
//! A reader (of another process's folders) keeps no index: the files are its catalog, and it
//! changes none of them.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use tier_core::{PageKey, TierError};

use super::index::PageIndex;
use super::io::Xfer;
use super::layout::Layout;
use crate::batch::BatchOutcome;

/// The pages of one FILE tier: its folders' layout and the index of the files in them.
pub(super) struct Catalog {
    layout: Layout,
    index: Mutex<PageIndex>,
    reader: bool,
}

/// A stored page, as a read plans with it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stored {
    pub len: u64,
    /// Its entry's generation (0 for a reader, which has no entries).
    pub generation: u64,
    /// Its file's checksum, once this process wrote or verified it.
    pub checksum: Option<u32>,
}

/// Pins on the pages a get reads (eviction leaves them), released when it drops: when the get
/// returns, and when it is dropped at an await point.
pub(super) struct Pins<'a> {
    catalog: &'a Catalog,
    keys: Vec<PageKey>,
}

impl Drop for Pins<'_> {
    fn drop(&mut self) {
        let mut index = self.catalog.index();
        for key in &self.keys {
            index.unpin(key);
        }
    }
}

impl Catalog {
    /// The catalog of `layout`'s folders. An owner (holding the folders' locks) scans them:
    /// leftovers of crashed writes are removed (their count returned) and the pages found are
    /// indexed, oldest first. A reader indexes nothing.
    pub fn load(
        layout: Layout,
        mut index: PageIndex,
        reader: bool,
    ) -> Result<(Self, usize), TierError> {
        let mut temps_removed = 0;
        if !reader {
            let scan = layout.scan()?;
            let mut found = scan.pages;
            found.sort_by_key(|(_, _, mtime)| *mtime);
            for (key, len, _) in found {
                index.insert(key, len, None, None);
            }
            temps_removed = scan.temps_removed;
        }
        let catalog = Catalog {
            layout,
            index: Mutex::new(index),
            reader,
        };
        Ok((catalog, temps_removed))
    }

    /// Where the pages' files are.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    fn index(&self) -> MutexGuard<'_, PageIndex> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pages indexed.
    pub fn pages(&self) -> usize {
        self.index().pages()
    }

    /// Bytes of the pages indexed.
    pub fn bytes(&self) -> u64 {
        self.index().bytes()
    }

    /// `key`'s stored page: from the index, or for a reader from its file.
    fn stored(&self, index: &PageIndex, key: &PageKey) -> Option<Stored> {
        if !self.reader {
            return Some(Stored {
                len: index.len_of(key)?,
                generation: index.generation(key)?,
                checksum: index.checksum(key),
            });
        }
        let path = self.layout.page_path(key).ok()?;
        let meta = fs::metadata(path).ok().filter(|m| m.is_file())?;
        Some(Stored {
            len: meta.len(),
            generation: 0,
            checksum: None,
        })
    }

    /// How many of `keys`, from the first, are stored.
    pub fn leading(&self, keys: &[PageKey]) -> usize {
        let index = self.index();
        keys.iter()
            .take_while(|k| self.stored(&index, k).is_some())
            .count()
    }

    /// Each of `keys`' stored page (`None`: absent), each pinned until the returned pins drop.
    pub fn pin<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k PageKey>,
    ) -> (Pins<'_>, Vec<Option<Stored>>) {
        let mut pins = Pins {
            catalog: self,
            keys: Vec::new(),
        };
        let mut index = self.index();
        let stored = keys
            .into_iter()
            .map(|key| {
                let stored = self.stored(&index, key)?;
                index.pin(key);
                pins.keys.push(key.clone());
                Some(stored)
            })
            .collect();
        (pins, stored)
    }

    /// The generation of `key`'s entry (0 if it has none).
    pub fn generation(&self, key: &PageKey) -> u64 {
        self.index().generation(key).unwrap_or(0)
    }

    /// Whether `key`'s entry is still the one of `generation`.
    pub fn is_current(&self, key: &PageKey, generation: u64) -> bool {
        self.index().generation(key) == Some(generation)
    }

    /// Records checksums verified by reads, each for its entry if still of its generation.
    pub fn learn_checksums(&self, learned: &[(&PageKey, u64, u32)]) {
        if self.reader || learned.is_empty() {
            return;
        }
        let mut index = self.index();
        for &(key, generation, crc) in learned {
            index.learn_checksum(key, generation, crc);
        }
    }

    /// Forgets a page whose file failed its checksum and unlinks the file, if its entry is
    /// still of `generation` (a newer put's file is left alone).
    pub fn discard(&self, key: &PageKey, generation: u64, path: &Path) {
        if self.reader {
            return;
        }
        let mut index = self.index();
        if index.remove_if(key, generation) {
            let _ = fs::remove_file(path);
        }
    }

    /// After reads: each hit becomes most recent, in batch order; a page whose file vanished
    /// (deleted by hand) is forgotten if its entry is still of the generation the read planned
    /// with.
    pub fn settle_reads<'r>(
        &self,
        reads: impl IntoIterator<Item = (&'r PageKey, u64, &'r Path, &'r Result<bool, TierError>)>,
    ) {
        let mut index = self.index();
        let mut after = None;
        for (key, generation, path, result) in reads {
            match result {
                Ok(true) => {
                    index.touch(key, after);
                    after = Some(key);
                }
                Ok(false) if !path.exists() => {
                    index.remove_if(key, generation);
                }
                _ => {}
            }
        }
    }

    /// Renames each written temp file of `xfers` into place at its `finals` path and records
    /// it with its checksum, in batch order, under the one lock; removes the temp files of
    /// pages that failed.
    pub fn commit(
        &self,
        xfers: &[Xfer],
        finals: &[PathBuf],
        outcome: &mut BatchOutcome,
        checksums: &[Option<u32>],
    ) {
        let mut index = self.index();
        let items = xfers.iter().zip(finals).zip(&mut outcome.results);
        for ((xfer, path), result) in items {
            if result.is_ok() {
                if let Err(e) = fs::rename(&xfer.path, path) {
                    *result = Err(TierError::io(
                        "rename page into place",
                        Some(&xfer.key),
                        Some(path.clone()),
                        e,
                    ));
                }
            }
            if result.is_err() && !outcome.poisoned {
                let _ = fs::remove_file(&xfer.path);
            }
        }
        let mut after = None;
        for ((xfer, result), crc) in xfers.iter().zip(&outcome.results).zip(checksums) {
            if result.is_ok() {
                index.insert(xfer.key.clone(), xfer.len as u64, *crc, after);
                after = Some(&xfer.key);
            }
        }
    }

    /// Evicts the unpinned pages the policy chooses until at most `capacity` bytes remain,
    /// unlinking their files; returns how many.
    pub fn evict_to(&self, capacity: u64) -> usize {
        let mut index = self.index();
        let victims = index.evict_to(capacity);
        for key in &victims {
            if let Ok(path) = self.layout.page_path(key) {
                let _ = fs::remove_file(path);
            }
        }
        victims.len()
    }

    /// Forgets `key` and unlinks its file; whether it was stored.
    pub fn remove(&self, key: &PageKey) -> Result<bool, TierError> {
        let path = self.layout.page_path(key)?;
        let mut index = self.index();
        if !index.remove(key) {
            return Ok(false);
        }
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(TierError::io("remove page", Some(key), Some(path), e)),
        }
    }

    /// Forgets every page at once; returns their keys, for
    /// [`unlink_forgotten`](Catalog::unlink_forgotten).
    pub fn forget_all(&self) -> Vec<PageKey> {
        self.index().drain()
    }

    /// Unlinks the file of a page [`forget_all`](Catalog::forget_all) forgot, unless a put
    /// stored the key since.
    pub fn unlink_forgotten(&self, key: &PageKey) -> Result<(), TierError> {
        let Ok(path) = self.layout.page_path(key) else {
            return Ok(());
        };
        let index = self.index();
        if index.contains(key) {
            return Ok(());
        }
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(TierError::io("clear page", Some(key), Some(path), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tier_policy::PolicyKind;

    fn key(s: &str) -> PageKey {
        PageKey::new(s).expect("a valid key")
    }

    fn owner() -> (tempfile::TempDir, Catalog) {
        let dir = tempfile::tempdir().expect("a temp folder");
        let layout = Layout::create(&[dir.path().to_path_buf()]).expect("a layout");
        let index = PageIndex::new(PolicyKind::Lru).expect("an index");
        let (catalog, _) = Catalog::load(layout, index, false).expect("a catalog");
        (dir, catalog)
    }

    /// Writes `bytes` to a temp file and commits it as `key`'s page, with `ok` as its write's
    /// result; returns the page's path and the temp file's.
    fn commit(catalog: &Catalog, key: &PageKey, bytes: &[u8], ok: bool) -> (PathBuf, PathBuf) {
        let path = catalog.layout().page_path(key).expect("a page path");
        let temp = catalog.layout().temp_path(&path);
        fs::write(&temp, bytes).expect("a temp file");
        let xfer = Xfer {
            key: key.clone(),
            path: temp.clone(),
            len: bytes.len(),
            direct: false,
            parts: Vec::new(),
            checksum: None,
        };
        let result = if ok {
            Ok(())
        } else {
            Err(TierError::Unavailable("the write failed".into()))
        };
        let mut outcome = BatchOutcome {
            results: vec![result],
            poisoned: false,
        };
        catalog.commit(
            &[xfer],
            std::slice::from_ref(&path),
            &mut outcome,
            &[Some(7)],
        );
        (path, temp)
    }

    fn generation_of(catalog: &Catalog, key: &PageKey) -> Option<u64> {
        let (_pins, stored) = catalog.pin([key]);
        stored[0].map(|s| s.generation)
    }

    #[test]
    fn a_committed_page_is_its_file_and_its_entry_and_a_failed_one_neither() {
        let (_dir, catalog) = owner();
        let (a, b) = (key("a"), key("b"));
        let (path, temp) = commit(&catalog, &a, b"page a", true);
        assert_eq!(fs::read(&path).expect("the page file"), b"page a");
        assert!(!temp.exists(), "the temp file was renamed into place");
        let (_pins, stored) = catalog.pin([&a]);
        let stored = stored[0].expect("a is stored");
        assert_eq!((stored.len, stored.checksum), (6, Some(7)));

        let (path, temp) = commit(&catalog, &b, b"page b", false);
        assert!(
            !path.exists() && !temp.exists(),
            "a failed write leaves no file"
        );
        assert_eq!(catalog.leading(&[a, b]), 1);
        assert_eq!(catalog.bytes(), 6);
    }

    #[test]
    fn a_read_planned_with_an_old_generation_never_drops_the_new_page() {
        let (_dir, catalog) = owner();
        let k = key("k");
        let (path, _) = commit(&catalog, &k, b"first", true);
        let old = generation_of(&catalog, &k).expect("k is stored");
        commit(&catalog, &k, b"second", true);
        let new = generation_of(&catalog, &k).expect("k is stored");
        assert_ne!(old, new);

        // A read of the first file found bad bytes: the second file is not its fault.
        catalog.discard(&k, old, &path);
        assert_eq!(fs::read(&path).expect("the new file stays"), b"second");
        assert!(catalog.is_current(&k, new));
        // A read of the first file found it gone: the second file's entry stays.
        fs::remove_file(&path).expect("deleted by hand");
        catalog.settle_reads([(&k, old, path.as_path(), &Ok(false))]);
        assert_eq!(catalog.leading(std::slice::from_ref(&k)), 1);
        // The same with the entry's own generation: forgotten.
        catalog.settle_reads([(&k, new, path.as_path(), &Ok(false))]);
        assert_eq!(catalog.leading(std::slice::from_ref(&k)), 0);

        let (path, _) = commit(&catalog, &k, b"third", true);
        let third = generation_of(&catalog, &k).expect("k is stored");
        catalog.discard(&k, third, &path);
        assert!(!path.exists(), "a bad page's file goes with its entry");
        assert_eq!(catalog.leading(std::slice::from_ref(&k)), 0);
    }

    #[test]
    fn a_clear_never_unlinks_a_page_put_after_it() {
        let (_dir, catalog) = owner();
        let (a, b) = (key("a"), key("b"));
        let (path_a, _) = commit(&catalog, &a, b"old a", true);
        let (path_b, _) = commit(&catalog, &b, b"old b", true);
        let mut forgotten = catalog.forget_all();
        forgotten.sort();
        assert_eq!(forgotten, vec![a.clone(), b.clone()]);
        assert_eq!(
            catalog.leading(std::slice::from_ref(&a)),
            0,
            "forgotten at once"
        );

        commit(&catalog, &a, b"new a", true);
        for key in &forgotten {
            catalog.unlink_forgotten(key).expect("unlinked");
        }
        assert_eq!(fs::read(&path_a).expect("the new page stays"), b"new a");
        assert_eq!(catalog.leading(std::slice::from_ref(&a)), 1);
        assert!(!path_b.exists(), "the forgotten page's file is gone");
    }

    #[test]
    fn removes_and_evictions_unlink_and_pins_hold_pages() {
        let (_dir, catalog) = owner();
        let (a, b) = (key("a"), key("b"));
        let (path_a, _) = commit(&catalog, &a, b"aaaa", true);
        let (path_b, _) = commit(&catalog, &b, b"bbbb", true);
        assert!(catalog.remove(&a).expect("removed"));
        assert!(!path_a.exists());
        assert!(!catalog.remove(&a).expect("absent"));

        let pins = catalog.pin([&b]);
        assert_eq!(catalog.evict_to(0), 0, "a pinned page stays");
        assert!(path_b.exists());
        drop(pins);
        assert_eq!(catalog.evict_to(0), 1);
        assert!(!path_b.exists());
        assert_eq!((catalog.pages(), catalog.bytes()), (0, 0));
    }
}
