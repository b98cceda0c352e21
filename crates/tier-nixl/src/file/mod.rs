//! The FILE tier: pages as files under N storage folders x 256 buckets, moved by a NIXL FILE
//! plugin (POSIX by default; GDS, GDS_MT, HF3FS by config) or by the tier's own system calls
//! (`engine = "syscalls"`), straight from and into the caller's memory (through aligned
//! staging buffers for direct I/O).
//!
//! - **Path mode** (NIXL >= 1.3) is probed at start: NIXL opens each file from a path in the
//!   registration metaInfo. Otherwise (or with `path_mode = Off`) the tier opens files itself
//!   and registers their fds; every fd is closed on every path.
//! - **Atomic visibility**: pages are written to a temp name and renamed into place only when
//!   complete; leftovers of crashed writes are removed after start, in the background.
//! - **Access** ([`FileAccess`]): an *owner* writes the storage folders alone (an exclusive
//!   `flock` on a lock file in each) and its in-memory index answers `exists` without touching
//!   the disk; *readers* in other processes read the same files and never write; *sharers*
//!   (any number of processes, on one machine or many) read and write the same folders, whose
//!   files are the truth, under one capacity for all of them (see `fleet`).
//!
//! Where things are: `config` (settings), `open` (start-up), `write` and `read` (the two data
//! paths), `opening` (what an open leaves to the background: indexing, scanning), `io` (NIXL's
//! FILE engine beside the syscalls engine), `helpers` (threads for big batches). Everything
//! about the folders that is not how bytes move (layout, page format, catalog and index, the
//! fleet of sharers, permissions, the filesystem probe, the syscalls engine) is the folder
//! cache's own crate, `tier_folder`.

mod config;
mod helpers;
mod io;
mod open;
mod opening;
mod read;
mod write;

use tier_folder::{catalog, checksum, fleet, format, index, layout, perms, probe};

use std::fs::File;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use tier_core::{
    async_trait, GetResult, Page, PageKey, PutResult, ReadSlot, RemoveResult, StatsRecorder,
    StorageTier, TierError, TierInfo, TierStats, WriteOrder,
};

pub use io::{probe_path_mode, FileMode};
pub use tier_folder::{
    probe_folder, route_hash, BoundedIo, FileAccess, FleetStats, FolderMode, FolderProbe,
    LockReach, PageChecksum, SharedFolder, SharedLocks, VerifyReads, BUCKETS, PAGE_TRAILER,
};

use crate::staging::{align_up, StagingPool, ALIGN};
use catalog::Catalog;
use io::FileIo;

pub(crate) use config::MAX_LANES;
pub use config::{DirectIo, Durability, FileEngine, FilePlugin, NixlFileConfig, PathModeChoice};

/// A persistent page tier on local (or mounted) filesystems through NIXL.
pub struct NixlFileTier {
    shared: Arc<Shared>,
}

struct Shared {
    config: NixlFileConfig,
    /// Shared with the work the open left to the background (see `opening`).
    catalog: Arc<Catalog>,
    /// One agent and backend per lane, so parallel batches never queue on one agent's lock.
    /// Lane 0 also owns the staging buffers.
    lanes: Vec<FileIo>,
    staging: Arc<StagingPool>,
    /// Bounds zero-copy write jobs in flight (staged jobs are bounded by the staging pool).
    inflight: Arc<tokio::sync::Semaphore>,
    stats: StatsRecorder,
    /// Per-key turns: a remove still running after its call was dropped finishes before a
    /// later put or remove of its keys starts.
    order: WriteOrder,
    direct: bool,
    /// Whether calls give up on file I/O after `transfer_timeout` (see [`BoundedIo`]).
    bounded: bool,
    /// Whether the work the open left to the background is done (see `opening`).
    opened: tokio::sync::watch::Receiver<bool>,
    // Held for the tier's life: the locks on the storage folders (exclusive for an owner,
    // shared for a sharer, none for a reader).
    _locks: Vec<File>,
}

impl NixlFileTier {
    /// Opens the tier: loads the NIXL runtime, creates the folders and all bucket folders,
    /// locks them, removes leftovers of crashed writes, indexes the pages present, creates the
    /// backend and picks path or fd mode.
    pub async fn open(config: NixlFileConfig) -> Result<Self, TierError> {
        config.validate()?;
        let (done, opened) = tokio::sync::watch::channel(false);
        let shared = tokio::task::spawn_blocking(move || Shared::open(config, opened))
            .await
            .map_err(|e| TierError::Unavailable(format!("opening the tier panicked: {e}")))??;
        let shared = Arc::new(shared);
        opening::spawn(&shared, done);
        Ok(Self { shared })
    }

    /// Waits until the work the open left to a background thread is done: the pages already
    /// in an owner's folders indexed (and its capacity enforced over them), a sharer's folders
    /// scanned (dead writers' leftovers removed, the usage corrected). Calls are served
    /// meanwhile.
    pub async fn opened(&self) {
        let mut opened = self.shared.opened.clone();
        let _ = opened.wait_for(|done| *done).await;
    }

    /// The mode in use.
    pub fn mode(&self) -> FileMode {
        self.shared.lanes[0].mode()
    }

    /// Whether pages go through `O_DIRECT` where aligned.
    pub fn direct_io(&self) -> bool {
        self.shared.direct
    }

    /// The canonical storage folders.
    pub fn dirs(&self) -> &[PathBuf] {
        self.shared.catalog.layout().dirs()
    }

    /// The file a page is stored in (whether or not it is present).
    pub fn page_path(&self, key: &PageKey) -> Result<PathBuf, TierError> {
        self.shared.catalog.layout().page_path(key)
    }

    /// Pages indexed now (none in reader and shared access, whose folders are their index).
    pub fn pages(&self) -> usize {
        self.shared.catalog.pages()
    }

    /// What this process did for shared folders, and their usage (`None` unless shared).
    pub fn fleet_stats(&self) -> Option<FleetStats> {
        self.shared.catalog.fleet_stats()
    }
}

impl Shared {
    fn lane(&self, n: usize) -> &FileIo {
        &self.lanes[n % self.lanes.len()]
    }

    fn limit(&self) -> Option<usize> {
        Some(self.config.max_page_bytes())
    }

    /// Whether `len` goes through direct I/O, or the error refusing it.
    fn direct_for(&self, key: &PageKey, len: usize) -> Result<bool, TierError> {
        if !self.direct {
            return Ok(false);
        }
        if len.is_multiple_of(ALIGN) {
            return Ok(true);
        }
        match self.config.direct_io {
            DirectIo::Required => Err(TierError::Unaligned {
                key: key.clone(),
                len,
                align: ALIGN,
            }),
            _ => Ok(false),
        }
    }

    /// `work` with the tier's bound where I/O is bounded (see [`tier_folder::bounded::bound`]).
    async fn bound<R>(
        &self,
        op: &'static str,
        work: impl Future<Output = Result<R, TierError>>,
    ) -> Result<R, TierError> {
        tier_folder::bounded::bound(self.bounded, self.config.transfer_timeout, op, work).await
    }

    /// Runs `work` on a blocking thread; this future may be dropped, the work goes on.
    async fn off_thread<R: Send + 'static>(
        self: &Arc<Self>,
        work: impl FnOnce(&Shared) -> R + Send + 'static,
    ) -> Result<R, TierError> {
        let shared = Arc::clone(self);
        tokio::task::spawn_blocking(move || work(&shared))
            .await
            .map_err(|e| TierError::Unavailable(format!("a file I/O task failed: {e}")))
    }

    /// Evicts the pages the policy chooses until the capacity holds; deletes their files.
    fn enforce_capacity(&self) {
        let Some(capacity) = self.config.capacity_bytes else {
            return;
        };
        for _ in 0..self.catalog.evict_to(capacity) {
            self.stats.eviction();
        }
    }
}

/// Groups item indices into chunks whose aligned sizes fit one staging buffer.
fn chunks(lens: &[(usize, usize)], capacity: usize) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut used = capacity;
    for &(i, len) in lens {
        let need = align_up(len);
        if used + need > capacity {
            out.push(Vec::new());
            used = 0;
        }
        used += need;
        if let Some(last) = out.last_mut() {
            last.push(i);
        }
    }
    out
}

#[async_trait]
impl StorageTier for NixlFileTier {
    fn info(&self) -> TierInfo {
        self.shared.config.tier_info()
    }

    fn stats(&self) -> TierStats {
        let catalog = &self.shared.catalog;
        let mut stats = self.shared.stats.snapshot(Some(catalog.bytes()));
        stats.evictions += catalog.fleet_evictions();
        stats
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        self.put_pages(pages).await
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        self.get_pages(slots).await
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        let shared = &self.shared;
        if shared.bounded && !shared.catalog.indexed() {
            let keys = keys.to_vec();
            let lookup = shared.off_thread(move |s| s.catalog.leading(&keys));
            return shared.bound("file lookup", lookup).await;
        }
        Ok(shared.catalog.leading(keys))
    }

    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        let shared = &self.shared;
        if shared.config.access == FileAccess::Shared {
            let keys = keys.to_vec();
            let touch = shared.off_thread(move |s| s.catalog.touch(&keys));
            return shared.bound("file touch", touch).await;
        }
        shared.catalog.touch(keys);
        Ok(())
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        let shared = Arc::clone(&self.shared);
        let keys = keys.to_vec();
        let n = keys.len();
        // Runs to the end even if this call is dropped, holding the keys' turn till then.
        let turn = shared.order.turn(&keys).await;
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            keys.iter()
                .map(|key| {
                    let removed = shared.catalog.remove(key);
                    match &removed {
                        Ok(true) => shared.stats.removed(),
                        Err(TierError::Io { .. }) => shared.stats.errors(1),
                        _ => {}
                    }
                    removed
                })
                .collect()
        })
        .await
        .unwrap_or_else(|e| {
            (0..n)
                .map(|_| Err(TierError::Unavailable(format!("remove task failed: {e}"))))
                .collect()
        })
    }

    /// Shared folders: waits for an eviction this process runs beside its puts, and evicts
    /// if they are over their capacity, so a process that flushes before it exits leaves
    /// none cut short. Otherwise nothing to wait for (a put returns once its pages landed).
    async fn flush(&self) -> Result<(), TierError> {
        if self.shared.config.access != FileAccess::Shared {
            return Ok(());
        }
        self.shared.off_thread(|s| s.catalog.settle()).await?
    }

    async fn clear(&self) -> Result<(), TierError> {
        if self.shared.config.access == FileAccess::Shared {
            // Every key's turn, held to the end even if this call is dropped: a later put or
            // remove of this process waits for the clear, never lands under it.
            let turn = self.shared.order.turn_all().await;
            let shared = Arc::clone(&self.shared);
            return tokio::task::spawn_blocking(move || {
                let _turn = turn;
                shared.catalog.clear_shared()
            })
            .await
            .map_err(|e| TierError::Unavailable(format!("clear task failed: {e}")))?;
        }
        // Bounded writes may outlive their calls (holding their keys' turns): a clear waits
        // for them, so none lands after it.
        let _turn = match self.shared.bounded {
            true => Some(self.shared.order.turn_all().await),
            false => None,
        };
        // Forgotten at once, before anything else awaits: a clear that is dropped after its
        // turn has happened (its pages read as absent), never later than a put made after it.
        let keys = self.shared.catalog.forget_all();
        let shared = Arc::clone(&self.shared);
        tokio::task::spawn_blocking(move || {
            let mut first_err = None;
            for key in keys {
                if let Err(e) = shared.catalog.unlink_forgotten(&key) {
                    first_err.get_or_insert(e);
                }
            }
            first_err.map_or(Ok(()), Err)
        })
        .await
        .map_err(|e| TierError::Unavailable(format!("clear task failed: {e}")))?
    }
}

/// `e` again, for another page of the batch it failed: a timeout stays a timeout (the tier's
/// health tells them apart), anything else is the tier unavailable for the same reason.
fn again(e: &TierError) -> TierError {
    match e {
        &TierError::Timeout { op, after } => TierError::Timeout { op, after },
        e => TierError::Unavailable(e.to_string()),
    }
}
