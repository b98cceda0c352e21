//! The FILE tier's catalog: the pages it stores, as files and as index entries, changed
//! together in this one place under one lock. A file is renamed in with its entry's insert and
//! unlinked with its entry's removal, so the index never describes a file that is gone,
//! replaced behind its back or of another length. Nothing outside this module sees the lock.
//!
//! Entries carry generations (new with every insert): a read that planned with one generation
//! changes an entry only while it is still that one, so a page a put replaced meanwhile is
//! never forgotten or unlinked in its place.
//!
//! A reader (of another process's folders) and a sharer (of folders other processes write
//! too) keep no index: the files are their catalog. A reader changes none of them; a sharer
//! changes them as an owner does, and its [fleet](super::fleet) keeps the folders' usage and
//! elects their evictor.

mod files;
#[cfg(test)]
mod tests;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tier_core::{PageKey, TierError};

use super::fleet::{Fleet, FleetStats, Room};
use super::index::{Generation, Loaded, PageIndex};
use super::layout::{FileStamp, Layout};
use crate::io::{BatchOutcome, Xfer};
use files::{discard_temp, land_shared, planted, planted_error, touch};

/// The pages of one FILE tier: its folders' layout and what knows which pages they hold.
pub struct Catalog {
    layout: Arc<Layout>,
    keeper: Keeper,
}

/// Who knows which pages the folders hold.
enum Keeper {
    /// This process, which owns the folders: its index.
    Owner(Box<Mutex<PageIndex>>),
    /// The files, which another process writes.
    Reader,
    /// The files, which this and other processes write.
    Sharer(Arc<Fleet>),
}

/// A stored page, as a read plans with it.
#[derive(Debug, Clone, Copy)]
pub struct Stored {
    pub len: u64,
    /// Its entry's generation (none without an index).
    pub generation: Generation,
    /// Its file's checksum, once this process wrote or verified it.
    pub checksum: Option<u32>,
    /// Its file's last use, where the file was looked at (no index).
    pub mtime_ns: Option<i128>,
}

/// Pins on the pages a get reads (eviction leaves them), released when it drops: when the get
/// returns, and when it is dropped at an await point.
pub struct Pins<'a> {
    catalog: &'a Catalog,
    keys: Vec<PageKey>,
}

impl Drop for Pins<'_> {
    fn drop(&mut self) {
        if let Some(mut index) = self.catalog.index() {
            for key in &self.keys {
                index.unpin(key);
            }
        }
    }
}

impl Catalog {
    /// The catalog of `layout`'s folders, owned, serving at once: the pages already in them
    /// are indexed by [`load`](Self::load) meanwhile, their files looked at until then.
    pub fn owned(layout: Layout, mut index: PageIndex) -> Self {
        index.begin_loading();
        Catalog {
            layout: Arc::new(layout),
            keeper: Keeper::Owner(Box::new(Mutex::new(index))),
        }
    }

    /// Readies an owner's index for the `pages` its open's scan found (see
    /// [`PageIndex::expect`]).
    pub fn expect(&self, pages: usize) {
        if let Some(mut index) = self.index() {
            index.expect(pages);
        }
    }

    /// Indexes pages found in an owner's folders at open (oldest first), as
    /// [`PageIndex::load`] decides; unlinks those a clear since then left on disk.
    pub fn load(&self, found: &[(PageKey, u32)]) {
        let Some(mut index) = self.index() else {
            return;
        };
        for (key, len) in found {
            if index.load(key.clone(), *len) == Loaded::Cleared {
                if let Ok(path) = self.layout.page_path(key) {
                    let _ = fs::remove_file(path);
                }
            }
        }
    }

    /// Ends [`load`](Self::load)ing: the index describes the folders alone again.
    pub fn loaded(&self) {
        if let Some(mut index) = self.index() {
            index.end_loading();
        }
    }

    /// The catalog of folders another process owns.
    pub fn read_only(layout: Layout) -> Self {
        Catalog {
            layout: Arc::new(layout),
            keeper: Keeper::Reader,
        }
    }

    /// The catalog of folders shared with other processes, kept by `fleet`.
    pub fn shared(layout: Layout, fleet: Fleet) -> Self {
        Catalog {
            layout: Arc::new(layout),
            keeper: Keeper::Sharer(Arc::new(fleet)),
        }
    }

    /// Where the pages' files are.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    fn index(&self) -> Option<MutexGuard<'_, PageIndex>> {
        match &self.keeper {
            Keeper::Owner(index) => Some(index.lock().unwrap_or_else(|e| e.into_inner())),
            _ => None,
        }
    }

    /// The fleet of shared folders (`None` unless they are shared).
    pub fn fleet(&self) -> Option<&Fleet> {
        match &self.keeper {
            Keeper::Sharer(fleet) => Some(fleet),
            _ => None,
        }
    }

    /// Whether this process keeps an index (an owner): else every lookup looks at the files.
    pub fn indexed(&self) -> bool {
        matches!(self.keeper, Keeper::Owner(_))
    }

    /// Pages indexed (none without an index).
    pub fn pages(&self) -> usize {
        self.index().map_or(0, |index| index.pages())
    }

    /// Bytes of the pages indexed; of shared folders, their usage.
    pub fn bytes(&self) -> u64 {
        match &self.keeper {
            Keeper::Owner(_) => self.index().map_or(0, |index| index.bytes()),
            Keeper::Reader => 0,
            Keeper::Sharer(fleet) => fleet.usage(),
        }
    }

    /// What this process did for its shared folders (`None` unless they are shared).
    pub fn fleet_stats(&self) -> Option<FleetStats> {
        self.fleet().map(Fleet::stats)
    }

    /// Pages this process evicted from shared folders.
    pub fn fleet_evictions(&self) -> u64 {
        self.fleet().map_or(0, Fleet::evicted)
    }

    /// `key`'s stored page: from the index, or from its file without one (or while the index
    /// loads and does not know the key yet).
    fn stored(&self, index: Option<&PageIndex>, key: &PageKey) -> Option<Stored> {
        if let Some(index) = index {
            if let (Some(len), Some(generation)) = (index.len_of(key), index.generation(key)) {
                return Some(Stored {
                    len,
                    generation,
                    checksum: index.checksum(key),
                    mtime_ns: None,
                });
            }
            if !index.may_hold_unindexed(key) {
                return None;
            }
        }
        let path = self.layout.page_path(key).ok()?;
        let meta = fs::metadata(path).ok().filter(|m| m.is_file())?;
        // No page is empty: a file that shows no page bytes is another client's write as this
        // client's caches still see it (GlusterFS: a page just renamed in, stat'ed as 32
        // bytes through the other mount). Absent, not a page of length 0.
        Some(Stored {
            len: super::format::page_len(meta.len())
                .filter(|&len| len > 0)
                .map(u64::from)?,
            generation: Generation::default(),
            checksum: None,
            mtime_ns: Some(FileStamp::of(&meta).mtime_ns),
        })
    }

    /// How many of `keys`, from the first, are stored.
    pub fn leading(&self, keys: &[PageKey]) -> usize {
        let index = self.index();
        keys.iter()
            .take_while(|k| self.stored(index.as_deref(), k).is_some())
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
                let stored = self.stored(index.as_deref(), key)?;
                if let Some(index) = index.as_deref_mut() {
                    index.pin(key);
                    pins.keys.push(key.clone());
                }
                Some(stored)
            })
            .collect();
        (pins, stored)
    }

    /// The generation of `key`'s entry (none if it has none).
    pub fn generation(&self, key: &PageKey) -> Generation {
        self.index()
            .and_then(|index| index.generation(key))
            .unwrap_or_default()
    }

    /// Whether `key`'s entry is still the one of `generation`.
    pub fn is_current(&self, key: &PageKey, generation: Generation) -> bool {
        self.index()
            .is_some_and(|index| index.generation(key) == Some(generation))
    }

    /// Records checksums verified by reads, each for its entry if still of its generation.
    pub fn learn_checksums(&self, learned: &[(&PageKey, Generation, u32)]) {
        let Some(mut index) = self.index() else {
            return;
        };
        for &(key, generation, crc) in learned {
            index.learn_checksum(key, generation, crc);
        }
    }

    /// Forgets a page whose file failed its checksum and unlinks the file, if its entry is
    /// still of `generation` (a newer put's file is left alone); in shared folders, unlinks it
    /// if it is still the file that was read (`mtime_ns`).
    pub fn discard(
        &self,
        key: &PageKey,
        generation: Generation,
        path: &Path,
        mtime_ns: Option<i128>,
    ) {
        match &self.keeper {
            Keeper::Owner(_) => {
                if let Some(mut index) = self.index() {
                    if index.remove_if(key, generation) {
                        let _ = fs::remove_file(path);
                    }
                }
            }
            Keeper::Reader => {}
            Keeper::Sharer(fleet) => {
                if let Some(mtime_ns) = mtime_ns {
                    fleet.discard(self.layout(), path, mtime_ns);
                }
            }
        }
    }

    /// After reads: each hit becomes most recent, in batch order; a page whose file vanished
    /// (deleted by hand) is forgotten if its entry is still of the generation the read planned
    /// with. In shared folders, a hit on a page not used for a while refreshes its use time.
    pub fn settle_reads<'r>(&self, reads: impl IntoIterator<Item = SettledRead<'r>>) {
        match &self.keeper {
            Keeper::Owner(_) => {
                let Some(mut index) = self.index() else {
                    return;
                };
                let mut after = None;
                for read in reads {
                    match read.found {
                        Some(true) => {
                            index.touch(read.key, after);
                            after = Some(read.key);
                        }
                        Some(false) if !read.path.exists() => {
                            index.remove_if(read.key, read.generation);
                        }
                        _ => {}
                    }
                }
            }
            Keeper::Reader => {}
            Keeper::Sharer(fleet) => {
                for read in reads {
                    let due = read.mtime_ns.is_some_and(|m| fleet.due_for_touch(m));
                    if read.found == Some(true) && due {
                        touch(read.path);
                    }
                }
            }
        }
    }

    /// Marks the stored pages of `keys` as just used, as hits on them would (see
    /// [`settle_reads`](Self::settle_reads)); keys not stored are left. In shared folders each
    /// is a `stat` and, for a page not used for a while, a use-time update.
    pub fn touch(&self, keys: &[PageKey]) {
        match &self.keeper {
            Keeper::Owner(_) => {
                let Some(mut index) = self.index() else {
                    return;
                };
                let mut after = None;
                for key in keys {
                    index.touch(key, after);
                    after = Some(key);
                }
            }
            Keeper::Reader => {}
            Keeper::Sharer(fleet) => {
                for key in keys {
                    let Ok(path) = self.layout.page_path(key) else {
                        continue;
                    };
                    let due = fs::metadata(&path).is_ok_and(|m| {
                        m.is_file() && fleet.due_for_touch(FileStamp::of(&m).mtime_ns)
                    });
                    if due {
                        touch(&path);
                    }
                }
            }
        }
    }

    /// Makes room in shared folders for `bytes` about to be written (see
    /// [`Fleet::make_room`]), or starts an eviction beside the write; nothing to do for an
    /// owner, which evicts after it writes.
    pub fn make_room(&self, bytes: u64) -> Result<(), TierError> {
        let Some(fleet) = self.fleet() else {
            return Ok(());
        };
        if fleet.make_room(&self.layout, bytes)? == Room::EvictBeside {
            self.evict_beside();
        }
        Ok(())
    }

    /// Starts an eviction of shared folders on a thread of its own, unless one of this
    /// process runs already (see [`Fleet::evict_beside`]).
    fn evict_beside(&self) {
        let Keeper::Sharer(fleet) = &self.keeper else {
            return;
        };
        if !fleet.begin_beside() {
            return;
        }
        let (evictor, layout) = (Arc::clone(fleet), Arc::clone(&self.layout));
        let spawned = std::thread::Builder::new()
            .name("kvtier-evict".into())
            .spawn(move || evictor.evict_beside(&layout));
        if let Err(e) = spawned {
            fleet.end_beside();
            tracing::warn!(error = %e, "cannot start an eviction of the shared folders");
        }
    }

    /// Waits for an eviction of shared folders under way in this process, then evicts if they
    /// are over their capacity (a flush: nothing left to the background).
    pub fn settle(&self) -> Result<(), TierError> {
        match self.fleet() {
            Some(fleet) => fleet.settle_now(&self.layout),
            None => Ok(()),
        }
    }

    /// Renames each written temp file of `xfers` into place at its `finals` path and records
    /// it with its checksum, in batch order, under the one lock; removes the temp files of
    /// pages that failed. In shared folders, counts the pages renamed in, less the older files
    /// they replaced.
    pub fn commit(
        &self,
        xfers: &[Xfer],
        finals: &[PathBuf],
        outcome: &mut BatchOutcome,
        checksums: &[Option<u32>],
    ) {
        let mut index = self.index();
        let mut landed = 0i64;
        let items = xfers.iter().zip(finals).zip(&mut outcome.results);
        for ((xfer, path), result) in items {
            if result.is_ok() {
                // A temp name someone who may write the folder swapped for a link (names are
                // unguessable, but a bucket can be listed) is never renamed in as a page.
                let renamed = if planted(&xfer.path) {
                    Err(planted_error())
                } else {
                    match self.keeper {
                        Keeper::Sharer(_) => {
                            land_shared(&xfer.path, path, super::format::file_len(xfer.len))
                        }
                        _ => fs::rename(&xfer.path, path).map(|()| 0),
                    }
                };
                // Swapped between that look and the rename: taken out again at once (kvtier
                // makes no links, so a link under a page's name is never another put's page).
                let renamed = renamed.and_then(|added| {
                    if planted(path) {
                        let _ = fs::remove_file(path);
                        return Err(planted_error());
                    }
                    Ok(added)
                });
                match renamed {
                    Ok(added) => landed += added,
                    Err(e) => {
                        *result = Err(TierError::io(
                            "rename page into place",
                            Some(&xfer.key),
                            Some(path.clone()),
                            e,
                        ))
                    }
                }
            }
            if result.is_err() && !outcome.poisoned {
                discard_temp(&xfer.path);
            }
        }
        if let Some(fleet) = self.fleet() {
            fleet.count(landed);
            // Writes in flight together may take the folders over: each made room for itself.
            if fleet.over_capacity() {
                self.evict_beside();
            }
        }
        let Some(index) = index.as_deref_mut() else {
            return;
        };
        let mut after = None;
        for ((xfer, result), crc) in xfers.iter().zip(&outcome.results).zip(checksums) {
            if result.is_err() {
                continue;
            }
            // A page longer than `MAX_PAGE` is refused before it is written; were one renamed
            // in, it would be unlinked rather than held unindexed.
            match u32::try_from(xfer.len) {
                Ok(len) if xfer.len <= super::format::MAX_PAGE => {
                    index.insert(xfer.key.clone(), len, *crc, after);
                    after = Some(&xfer.key);
                }
                _ => {
                    if let Ok(path) = self.layout.page_path(&xfer.key) {
                        let _ = fs::remove_file(path);
                    }
                }
            }
        }
    }

    /// Evicts the unpinned pages the policy chooses until at most `capacity` bytes remain,
    /// unlinking their files; returns how many. (Shared folders evict as they are written.)
    pub fn evict_to(&self, capacity: u64) -> usize {
        let Some(mut index) = self.index() else {
            return 0;
        };
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
        let len = match &self.keeper {
            Keeper::Owner(_) => {
                let removed = self.index().is_some_and(|mut index| {
                    // A page found at open and not indexed yet is removed as well.
                    let unindexed = index.may_hold_unindexed(key);
                    index.remove(key) || unindexed
                });
                if !removed {
                    return Ok(false);
                }
                0
            }
            Keeper::Reader => return Ok(false),
            Keeper::Sharer(_) => match fs::metadata(&path) {
                Ok(m) => m.len(),
                Err(_) => return Ok(false),
            },
        };
        match fs::remove_file(&path) {
            Ok(()) => {
                if let Some(fleet) = self.fleet() {
                    fleet.count(-(len as i64));
                }
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(TierError::io("remove page", Some(key), Some(path), e)),
        }
    }

    /// Forgets every page at once; returns their keys, for
    /// [`unlink_forgotten`](Catalog::unlink_forgotten). Shared folders are cleared by
    /// [`clear_shared`](Catalog::clear_shared) instead.
    pub fn forget_all(&self) -> Vec<PageKey> {
        self.index()
            .map_or_else(Vec::new, |mut index| index.drain())
    }

    /// Unlinks the file of a page [`forget_all`](Catalog::forget_all) forgot, unless a put
    /// stored the key since.
    pub fn unlink_forgotten(&self, key: &PageKey) -> Result<(), TierError> {
        let Ok(path) = self.layout.page_path(key) else {
            return Ok(());
        };
        let Some(index) = self.index() else {
            return Ok(());
        };
        if index.contains(key) {
            return Ok(());
        }
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(TierError::io("clear page", Some(key), Some(path), e)),
        }
    }

    /// Unlinks every page file of shared folders (writes in flight stay theirs); nothing for
    /// another kind of catalog.
    pub fn clear_shared(&self) -> Result<(), TierError> {
        let Some(fleet) = self.fleet() else {
            return Ok(());
        };
        let scan = self.layout.scan_shared(|_, _| false)?;
        let mut first_err = None;
        let mut freed = 0;
        for page in scan.pages {
            match fs::remove_file(&page.path) {
                Ok(()) => freed += page.len,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    first_err.get_or_insert(TierError::io("clear page", None, Some(page.path), e));
                }
            }
        }
        fleet.count(-(freed as i64));
        first_err.map_or(Ok(()), Err)
    }
}

/// A read as [`Catalog::settle_reads`] takes it.
pub struct SettledRead<'r> {
    pub key: &'r PageKey,
    pub generation: Generation,
    pub mtime_ns: Option<i128>,
    pub path: &'r Path,
    /// Hit or miss; `None`: the read failed.
    pub found: Option<bool>,
}
