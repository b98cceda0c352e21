//! How a folder cache is shared: by one owner, by readers of another's folders, or by a fleet
//! of processes (config kinds' `access` and `shared` settings).

use std::time::Duration;

/// How a tier uses its folders beside other processes (in config files: `access`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileAccess {
    /// One process owns the folders (an exclusive lock): its index, kept in memory and rebuilt
    /// by a scan at start, answers `exists` without touching the disk.
    #[default]
    Owner,
    /// Reads the pages another process's tier stores in the same folders (an SGLang MLA rank
    /// reading what the writer rank stores). It takes no lock, removes no leftovers, keeps no
    /// index (the files are its index), and never writes or removes a page: puts fail,
    /// `remove` finds nothing of its own, `clear` is a no-op.
    Reader,
    /// Any number of processes, on one machine or many (a shared filesystem), store, read,
    /// remove and clear pages in the same folders. The folders are the truth: every lookup
    /// looks at the files, so a page another process stored is found and one it removed or
    /// evicted is a miss. A capacity bounds the folders' bytes for all of them together (see
    /// [`SharedFolder`]).
    Shared,
}

/// Settings of [`FileAccess::Shared`] folders.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedFolder {
    /// How long an evictor's lease lasts without renewal: a process that dies or stalls while
    /// evicting is taken over by another once this has passed.
    pub lease: Duration,
    /// A hit refreshes its page's last-use time (the file's modification time) at most once
    /// per this interval, so reads do not become a storm of metadata writes.
    pub touch_interval: Duration,
    /// An eviction starts when the folders' bytes pass the capacity and stops once they are at
    /// most this fraction of it.
    pub low_watermark: f64,
    /// How the processes agree on the usage count and the evictor.
    pub locks: SharedLocks,
}

/// How processes sharing folders agree on the usage count and on who evicts (in config
/// files: `locks`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SharedLocks {
    /// Under `flock`s of the filesystem: exact where they reach across its clients.
    #[default]
    Flock,
    /// Without locks, for filesystems that have none (3FS's FUSE client): usage updates may
    /// be lost and evictions may overlap, which costs capacity accuracy, never bytes; the
    /// usage is corrected by each scan of the folders. Nothing keeps an owner out either.
    None,
}

impl Default for SharedFolder {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(10),
            touch_interval: Duration::from_secs(60),
            low_watermark: 0.9,
            locks: SharedLocks::Flock,
        }
    }
}
