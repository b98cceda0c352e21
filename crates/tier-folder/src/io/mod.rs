//! Moving a batch of pages between memory and their files: the engine's trait
//! ([`PageEngine`]), what every engine shares (the page to move, its direction, a batch's
//! outcome, file identities across a read, folder syncs) and kvtier's own engine,
//! [`Syscalls`] (`preadv`/`pwritev` on the calling thread). NIXL's FILE engine lives in
//! `tier-nixl`, over the same types.

use std::fs::{self, File};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use tier_core::{PageKey, TierError};

use crate::checksum;

mod engine;
mod syscalls;

pub use engine::{PageEngine, Syscalls};
pub use syscalls::{move_by_syscalls, open_page};

/// Transfer direction, seen from memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XferOp {
    /// Storage to memory.
    Read,
    /// Memory to storage.
    Write,
}

/// Outcome of a batch: per-item results, and whether a transfer of it never settled.
pub struct BatchOutcome {
    /// One result per item, in order.
    pub results: Vec<Result<(), TierError>>,
    /// True if a transfer of the batch is unsettled: its memory is held by the transfer, and
    /// its files may still be written.
    pub poisoned: bool,
}

/// One page to move: its file, its length, and the DRAM regions of its bytes.
pub struct Xfer {
    /// The page's key.
    pub key: PageKey,
    /// The file: a temp file for writes, the page file for reads.
    pub path: PathBuf,
    /// Length in bytes.
    pub len: usize,
    /// Whether to bypass the page cache.
    pub direct: bool,
    /// The page's bytes in registered DRAM: (address, length) of each region, in file order.
    pub parts: Vec<(usize, usize)>,
    /// For a read: the checksum the tier's index knows for the file, so it is not read from
    /// the file.
    pub checksum: Option<u32>,
    /// For a write the tier asked to keep it for (`Some`): the temp file the engine created
    /// and wrote, kept open (its own descriptor) so its trailer is appended without opening it
    /// again (see [`crate::format::seal`]). `None` for reads, and past a batch's first pages,
    /// so that a batch never holds more files open than its caller allows for.
    pub created: Option<Created>,
    /// For a buffered read: the page file the tier opened to hold across the read (see
    /// [`pin`]). The engine reads this very file instead of opening the path again, so the
    /// bytes read are of the version the tier holds (a page file is never written in place).
    pub opened: Option<Arc<File>>,
}

/// The temp file a write's engine created last, kept open for its seal. A write run again (a
/// batch that failed is retried page by page) creates its temp file anew, unlinking the one
/// an earlier run made: the file kept is always the latest, the one renamed in.
#[derive(Debug, Default)]
pub struct Created(Mutex<Option<File>>);

impl Created {
    /// Keeps `file`, just created under the write's temp name, in place of any kept before.
    pub fn keep(&self, file: File) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(file);
    }

    /// The file kept last, if any.
    pub fn take(&mut self) -> Option<File> {
        self.0
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// The same move, to run again: without a temp file created by an earlier run, nor the file
/// an earlier run opened to read (a run again reads the name's file as it is then).
impl Clone for Xfer {
    fn clone(&self) -> Self {
        Xfer {
            key: self.key.clone(),
            path: self.path.clone(),
            len: self.len,
            direct: self.direct,
            parts: self.parts.clone(),
            checksum: self.checksum,
            created: self.created.as_ref().map(|_| Created::default()),
            opened: None,
        }
    }
}

/// Syncs the folder of every page renamed into place, once per folder, so the renames
/// survive a power loss (the files' bytes were written with `O_DSYNC`). A folder that will
/// not sync fails its pages: written and readable, but not acknowledged as durable.
pub fn sync_folders(items: &[Xfer], finals: &[PathBuf], results: &mut [Result<(), TierError>]) {
    // Per folder: the error its sync gave, as (kind, OS code), since an io::Error is not Clone.
    type Synced = Option<(std::io::ErrorKind, Option<i32>)>;
    let mut synced: Vec<(&Path, Synced)> = Vec::new();
    for ((item, path), result) in items.iter().zip(finals).zip(results.iter_mut()) {
        let Some(folder) = path.parent() else {
            continue;
        };
        if result.is_err() {
            continue;
        }
        let outcome = match synced.iter().find(|(f, _)| *f == folder) {
            Some((_, outcome)) => *outcome,
            None => {
                let outcome = File::open(folder)
                    .and_then(|dir| dir.sync_all())
                    .err()
                    .map(|e| (e.kind(), e.raw_os_error()));
                synced.push((folder, outcome));
                outcome
            }
        };
        if let Some((kind, code)) = outcome {
            let error = code.map_or_else(|| kind.into(), std::io::Error::from_raw_os_error);
            *result = Err(TierError::io(
                "sync the page's folder",
                Some(&item.key),
                Some(folder.to_path_buf()),
                error,
            ));
        }
    }
}

/// Which file a path names, in which version: a read is whole only if the file it began on
/// is the one it ended on. kvtier never writes a page file in place (it renames a new file
/// over it), and any write changes a file's ctime, so the same identity before and after a
/// read means the bytes read are one version's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    dev: u64,
    ino: u64,
    ctime_ns: i128,
    mtime_ns: i128,
    len: u64,
}

pub fn file_id(path: &Path) -> Option<FileId> {
    fs::metadata(path).ok().map(|m| id_of(&m))
}

/// Opens the page file at `path` to hold it across a read: while it is open its inode number
/// cannot be reused by a new file, so the path naming the same identity after the read as
/// the open file had before it means the read was of this file (a new file created in the
/// same clock tick with a reused inode number would otherwise look the same). Opened as
/// [`open_page`] opens a read's file: a link or FIFO planted under the name is never opened
/// or waited on (`None`, as for a name that holds no file).
pub fn pin(path: &Path) -> Option<(File, FileId)> {
    let (file, metadata) = syscalls::open_to_read(path, 0).ok()?;
    Some((file, id_of(&metadata)))
}

impl FileId {
    /// The identity of the file whose metadata is `m`.
    pub fn of(m: &fs::Metadata) -> Self {
        id_of(m)
    }

    /// The file's length, trailer included.
    pub fn file_len(&self) -> u64 {
        self.len
    }
}

fn id_of(m: &fs::Metadata) -> FileId {
    use std::os::unix::fs::MetadataExt;
    FileId {
        dev: m.dev(),
        ino: m.ino(),
        ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        len: m.len(),
    }
}

/// The smallest page verified once per file version: below it a checksum costs less than the
/// two `stat`s that prove a version unchanged.
pub const VERIFY_ONCE_MIN: usize = 64 << 10;

/// The page file versions this process has verified (bounded: forgotten all at once when
/// full, to be verified again as they are read).
#[derive(Default)]
pub struct VerifiedFiles(std::sync::Mutex<std::collections::HashSet<FileId>>);

impl VerifiedFiles {
    const MAX: usize = 1 << 16;

    /// Whether this version was verified.
    pub fn contains(&self, id: &FileId) -> bool {
        self.0.lock().is_ok_and(|set| set.contains(id))
    }

    /// Records a version whose bytes matched its checksum.
    pub fn insert(&self, id: FileId) {
        if let Ok(mut set) = self.0.lock() {
            if set.len() >= Self::MAX {
                set.clear();
            }
            set.insert(id);
        }
    }
}

impl Xfer {
    /// The CRC-32C of the page's bytes in DRAM, once a read of them has completed.
    pub fn checksum_parts(&self) -> u32 {
        checksum::of(self.parts.iter().map(|&(addr, len)| {
            // SAFETY: the parts are memory lent to this read for the batch (see `Xfer`), and
            // its transfer has completed: nothing writes them now.
            unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
        }))
    }
}

/// What an operation on a page file is called in errors.
pub fn op_name(op: XferOp) -> &'static str {
    match op {
        XferOp::Read => "read page",
        XferOp::Write => "write page",
    }
}

/// Bytes an unprivileged writer may still use on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}
