//! Moving batches of pages between a staging buffer and files through a NIXL FILE backend, in
//! path mode or legacy fd mode. Runs on blocking threads; every fd and registration a batch
//! takes is held by its transfer, released once it settles (see [`crate::nixl::Held`]).

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tier_core::{PageKey, TierError};

use super::checksum;
use crate::batch::{move_isolating, BatchOutcome, Failure};
use crate::nixl::{next_dev_id, Backend, Desc, Finished, Held, MemKind, Unsettled, XferOp};
use crate::staging::align_up;
use crate::{FileEngine, READ_ATTEMPTS};

/// How files are handed to NIXL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileMode {
    /// NIXL opens files itself from a path in the registration metaInfo (NIXL >= 1.3).
    Path,
    /// kvtier opens each file and registers its fd as the device id.
    Fd,
}

impl std::fmt::Display for FileMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Path => "path",
            Self::Fd => "fd",
        })
    }
}

/// Registers an existing file by path (`ro:<path>`) and looks for it among the process's open
/// files: a path-mode NIXL opens it at registration, an older one ignores the metaInfo and
/// opens nothing. Nothing fails on either (probing with a missing path, as NIXL's docs
/// suggest, makes a path-mode NIXL log an error at every start). Fd mode, which every NIXL
/// supports, is the answer whenever the probe cannot tell.
pub fn probe_path_mode(backend: &Arc<Backend>) -> FileMode {
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let Ok(dir) = tempfile::Builder::new()
        .prefix(&format!(
            "kvtier-path-mode-probe-{}-{n}-",
            std::process::id()
        ))
        .tempdir()
    else {
        return FileMode::Fd;
    };
    let path = dir.path().join("probe");
    if std::fs::write(&path, [0u8; 4096]).is_err() {
        return FileMode::Fd;
    }
    let meta = format!("ro:{}", path.display());
    let desc = Desc {
        addr: 0,
        len: 4096,
        dev_id: next_dev_id(),
        meta: meta.as_bytes(),
    };
    let Ok(registration) = backend.register(MemKind::File, &[desc]) else {
        return FileMode::Fd;
    };
    let opened = std::fs::read_dir("/proc/self/fd").is_ok_and(|fds| {
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
    });
    drop(registration);
    if opened {
        FileMode::Path
    } else {
        FileMode::Fd
    }
}

/// One page to move: its file, its length, and the DRAM regions of its bytes.
#[derive(Clone)]
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
}

impl Xfer {
    /// Each part's DRAM descriptor and the file range it maps to, for a file registered as
    /// `dev_id`.
    fn descs(&self, dev_id: u64) -> impl Iterator<Item = (Desc<'static>, Desc<'static>)> + '_ {
        let mut offset = 0;
        self.parts.iter().map(move |&(addr, len)| {
            let file = Desc {
                addr: offset,
                len,
                dev_id,
                meta: &[],
            };
            offset += len;
            (Desc::dram(addr, len), file)
        })
    }
}

/// A FILE backend and how to use it.
pub struct FileIo {
    /// The backend.
    pub backend: Arc<Backend>,
    /// What moves the bytes.
    pub engine: FileEngine,
    /// Path or fd mode.
    pub mode: FileMode,
    /// Bound on each transfer's completion.
    pub timeout: Duration,
    /// Ask for synchronous writes (`O_DSYNC` / path-mode `sync`).
    pub sync: bool,
    /// Read each page file's recorded checksum with its bytes.
    pub checksums: bool,
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

/// Staging offsets of consecutive pages, each slot aligned for direct I/O.
pub fn slots(lens: impl IntoIterator<Item = usize>) -> (Vec<usize>, usize) {
    let mut offsets = Vec::new();
    let mut end = 0;
    for len in lens {
        offsets.push(end);
        end += align_up(len);
    }
    (offsets, end)
}

impl FileIo {
    fn backend_error(&self, key: Option<&PageKey>, message: String) -> TierError {
        TierError::Backend {
            backend: format!("nixl {} ({} mode)", self.backend.plugin(), self.mode),
            key: key.cloned(),
            message,
        }
    }

    /// Registers caller-owned DRAM (each distinct range once) for one batch's transfers;
    /// nothing where the engine needs no registration.
    pub fn lend_local(&self, ranges: &[(usize, usize)]) -> Result<Arc<Held>, TierError> {
        let mut held = Held::default();
        if self.engine != FileEngine::Syscalls {
            let registration = self
                .backend
                .register_dram(ranges)
                .map_err(|e| self.backend_error(None, format!("registering page memory: {e}")))?;
            held.lend(registration);
        }
        Ok(held.seal())
    }

    /// Moves every item with one registration and one transfer; if that fails as a whole,
    /// retries each item alone so one bad page does not fail its neighbours. `memory`
    /// registered the items' DRAM (nothing for the syscall engine).
    pub fn transfer_all(&self, op: XferOp, items: &[Xfer], memory: &Arc<Held>) -> BatchOutcome {
        if self.engine == FileEngine::Syscalls {
            return BatchOutcome {
                results: items
                    .iter()
                    .map(|item| move_by_syscalls(op, item, self.sync, None))
                    .collect(),
                poisoned: false,
            };
        }
        move_isolating(
            items.len(),
            self.timeout,
            &mut |which| self.transfer(op, items, which, memory),
            &|i, message| self.item_error(op, &items[i], message),
        )
    }

    /// A failed item's error. NIXL reports failed I/O only as a backend status, so a write that
    /// failed where the filesystem has no room for the page is reported as what it is.
    fn item_error(&self, op: XferOp, item: &Xfer, message: String) -> TierError {
        let folder = item.path.parent().unwrap_or(&item.path);
        if op == XferOp::Write && free_bytes(folder).is_some_and(|free| free < item.len as u64) {
            return TierError::io(
                "write page",
                Some(&item.key),
                Some(item.path.clone()),
                std::io::Error::from_raw_os_error(libc::ENOSPC),
            );
        }
        self.backend_error(Some(&item.key), message)
    }

    fn transfer(
        &self,
        op: XferOp,
        items: &[Xfer],
        which: &[usize],
        memory: &Arc<Held>,
    ) -> Result<(), Failure> {
        // Fd mode: open every file first; the transfer holds them with their registration.
        let mut files: Vec<File> = Vec::new();
        let mut metas: Vec<Vec<u8>> = Vec::new();
        let mut dev_ids = Vec::with_capacity(which.len());
        for &i in which {
            let item = &items[i];
            match self.mode {
                FileMode::Fd => {
                    let file = open_page(&item.path, op, item.direct, self.sync).map_err(|e| {
                        Failure::Item(
                            i,
                            TierError::io(op_name(op), Some(&item.key), Some(item.path.clone()), e),
                        )
                    })?;
                    dev_ids.push(file.as_raw_fd() as u64);
                    files.push(file);
                }
                FileMode::Path => {
                    metas.push(path_meta(&item.path, op, item.direct, self.sync));
                    dev_ids.push(next_dev_id());
                }
            }
        }
        let files_reg: Vec<Desc<'_>> = which
            .iter()
            .enumerate()
            .map(|(n, &i)| Desc {
                addr: 0,
                len: items[i].len,
                dev_id: dev_ids[n],
                meta: metas.get(n).map_or(&[][..], Vec::as_slice),
            })
            .collect();
        let (local, remote): (Vec<Desc<'_>>, Vec<Desc<'_>>) = which
            .iter()
            .enumerate()
            .flat_map(|(n, &i)| items[i].descs(dev_ids[n]))
            .unzip();
        let registration = self
            .backend
            .register(MemKind::File, &files_reg)
            .map_err(|e| Failure::Batch(format!("{}: registering files: {e}", op_name(op))))?;
        let mut held = Held::default();
        held.include(memory);
        held.files(registration, files);
        let transfer = self
            .backend
            .post(op, &local, MemKind::File, &remote, &held.seal())
            .map_err(|e| Failure::Batch(format!("{}: posting the transfer: {e}", op_name(op))))?;
        // Writes only read memory: a caller's pages need no waiting for (see Abandoned).
        match transfer.finish(self.timeout) {
            Finished::Done => Ok(()),
            Finished::Failed(e) => Err(Failure::Batch(format!("{}: transfer: {e}", op_name(op)))),
            Finished::Unsettled(Unsettled::Failed(e)) if op == XferOp::Write => {
                // Its other writes land in temp files that are removed, never renamed in.
                Err(Failure::Abandoned(format!(
                    "{}: transfer: {e}",
                    op_name(op)
                )))
            }
            Finished::Unsettled(Unsettled::Failed(e)) if self.checksums => {
                // A page file replaced mid-read fails a batch read (a short read): its pages
                // are read again one by one. A late read of the failed batch that lands on a
                // retried page fails that page's checksum: a miss, never a hit.
                Err(Failure::Batch(format!("{}: transfer: {e}", op_name(op))))
            }
            // I/O may still be running: the transfer keeps what it holds.
            Finished::Unsettled(why) => Err(Failure::Unsettled(why)),
        }
    }
}

/// Which file a path names: a read is whole only if the file it began on is the one it ended
/// on. kvtier never writes a page file in place (it renames a new file over it), so the same
/// identity before and after a read means the bytes read are one version's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
    ctime_ns: i128,
    len: u64,
}

fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path).ok()?;
    Some(FileId {
        dev: m.dev(),
        ino: m.ino(),
        ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        len: m.len(),
    })
}

impl FileIo {
    /// Reads every item. Per item: a hit (`true`); a miss (`false`) if its file vanished, or
    /// was replaced while it was read (what arrived may mix two versions: never a hit); a
    /// length mismatch if it now holds a page of another length; or the error. NIXL opens
    /// (path mode) or reads (fd mode) files where kvtier cannot watch, so each file's
    /// identity is compared before and after; the syscall engine checks the open file itself.
    /// A read whose checksum the index knows needs neither: bytes that match it are the page's
    /// whichever file they came from, and any others are a miss (see `verify`).
    pub fn read_all(&self, items: &[Xfer], memory: &Arc<Held>) -> BatchReads {
        let mut reads = self.read_once(items, memory);
        // A page replaced by a put while it was read is read again (the new file), a few
        // times, each after a growing pause (puts of one key can follow each other closely),
        // before it is answered as a miss.
        for attempt in 1..READ_ATTEMPTS {
            if reads.poisoned {
                break;
            }
            // (Not one whose checksum the index knew: a new file cannot match it.)
            let again: Vec<usize> = (0..items.len())
                .filter(|&i| {
                    matches!(reads.results[i], Ok(false))
                        && items[i].checksum.is_none()
                        && items[i].path.exists()
                })
                .collect();
            if again.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(1 << attempt));
            let retry: Vec<Xfer> = again.iter().map(|&i| items[i].clone()).collect();
            let second = self.read_once(&retry, memory);
            reads.poisoned |= second.poisoned;
            let second_reads = second.results.into_iter().zip(second.recorded);
            for ((i, (r, crc)), hashed) in again.into_iter().zip(second_reads).zip(second.hashed) {
                reads.results[i] = r;
                reads.recorded[i] = crc;
                reads.hashed[i] = hashed;
            }
        }
        reads
    }

    fn read_once(&self, items: &[Xfer], memory: &Arc<Held>) -> BatchReads {
        // A checksum is read by path: the file's identity before and after proves it is the
        // one whose bytes were read.
        let watch =
            |i: &Xfer| i.checksum.is_none() && (self.engine == FileEngine::Nixl || self.checksums);
        let before: Vec<Option<FileId>> = items
            .iter()
            .map(|i| if watch(i) { file_id(&i.path) } else { None })
            .collect();
        let mut hashed = vec![None; items.len()];
        let outcome = if self.engine == FileEngine::Syscalls && self.checksums {
            // Each page is checksummed as it is read, while its bytes are in cache (checksummed
            // after a whole batch, 512 KiB pages read about a quarter slower, measured here).
            BatchOutcome {
                results: items
                    .iter()
                    .zip(hashed.iter_mut())
                    .map(|(item, crc)| {
                        let mut running = (!item.direct).then(checksum::Crc::new);
                        move_by_syscalls(XferOp::Read, item, self.sync, running.as_mut())?;
                        *crc = running.map(|c| c.value());
                        Ok(())
                    })
                    .collect(),
                poisoned: false,
            }
        } else {
            self.transfer_all(XferOp::Read, items, memory)
        };
        let mut recorded = vec![None; items.len()];
        let results = outcome
            .results
            .into_iter()
            .zip(items)
            .zip(before)
            .zip(recorded.iter_mut())
            .map(|(((r, item), before), recorded)| {
                if self.checksums && r.is_ok() {
                    // Read before the identity check that vouches for it; none is a miss.
                    *recorded = item
                        .checksum
                        .or_else(|| checksum::recorded(&item.path).ok().flatten());
                }
                if !watch(item) {
                    // The file the syscalls opened was checked; one that was not there to
                    // open is a miss, even if a put renamed a new one in since.
                    return match r {
                        Ok(()) => Ok(true),
                        Err(TierError::Io { ref source, .. })
                            if source.kind() == std::io::ErrorKind::NotFound =>
                        {
                            Ok(false)
                        }
                        Err(_) if !item.path.exists() => Ok(false),
                        // Replaced by a page of another length since it was planned.
                        Err(_)
                            if item.checksum.is_some()
                                && fs::metadata(&item.path)
                                    .is_ok_and(|m| m.len() != item.len as u64) =>
                        {
                            Ok(false)
                        }
                        Err(e) => Err(e),
                    };
                }
                let after = file_id(&item.path);
                match (r, after) {
                    (_, None) => Ok(false),
                    (_, Some(after)) if before != Some(after) => Ok(false),
                    (_, Some(after)) if after.len != item.len as u64 => {
                        Err(TierError::LengthMismatch {
                            key: item.key.clone(),
                            stored: after.len as usize,
                            buffer: item.len,
                        })
                    }
                    (Ok(()), _) => Ok(true),
                    (Err(e), _) => Err(e),
                }
            })
            .collect();
        BatchReads {
            results,
            recorded,
            hashed,
            poisoned: outcome.poisoned,
        }
    }
}

/// What [`FileIo::read_all`] found.
pub struct BatchReads {
    /// Per item: hit (`true`), miss (`false`), or the error.
    pub results: Vec<Result<bool, TierError>>,
    /// Per item: the checksum its file records (with checksums on, for hits).
    pub recorded: Vec<Option<u32>>,
    /// Per item read in place by the syscall engine with checksums on: the CRC-32C of the
    /// bytes it read, taken as it read them (none for the others: the caller hashes them).
    pub hashed: Vec<Option<u32>>,
    /// True if the batch's DRAM must never be reused or freed.
    pub poisoned: bool,
}

fn op_name(op: XferOp) -> &'static str {
    match op {
        XferOp::Read => "read page",
        XferOp::Write => "write page",
    }
}

/// Linux's bound on the parts of one vectored call (`UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// The most a checksummed read moves before it checksums what it moved: small enough to be
/// checksummed from the core's own cache (a whole 2 MiB page has left it).
const HASH_CHUNK: usize = 256 << 10;

/// Moves one page with `preadv`/`pwritev` on the calling thread. The parts' addresses are
/// memory the caller keeps valid (and, for reads, exclusively lent) for the call. A read
/// given `crc` adds each piece's bytes to it as soon as they are read.
fn move_by_syscalls(
    op: XferOp,
    item: &Xfer,
    sync: bool,
    mut crc: Option<&mut checksum::Crc>,
) -> Result<(), TierError> {
    let io_err =
        |e: std::io::Error| TierError::io(op_name(op), Some(&item.key), Some(item.path.clone()), e);
    let file = open_page(&item.path, op, item.direct, sync).map_err(io_err)?;
    if op == XferOp::Read {
        // The page's file may have been replaced by one of another length since it was
        // planned: never serve a cut or overlong page.
        let stored = file.metadata().map_err(io_err)?.len();
        if stored != item.len as u64 {
            return Err(TierError::LengthMismatch {
                key: item.key.clone(),
                stored: stored as usize,
                buffer: item.len,
            });
        }
    }
    let fd = file.as_raw_fd();
    // A page's parts in vectored calls: one call for all of them, or one per `HASH_CHUNK`
    // when checksumming; each resumes after what the previous one moved.
    let mut iov: Vec<libc::iovec> = item
        .parts
        .iter()
        .filter(|&&(_, len)| len > 0)
        .map(|&(addr, len)| libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        })
        .collect();
    let cap = if crc.is_some() {
        HASH_CHUNK
    } else {
        usize::MAX
    };
    let mut call: Vec<libc::iovec> = Vec::with_capacity(iov.len().min(IOV_MAX));
    let mut first = 0;
    let mut at = 0usize;
    while first < iov.len() {
        call.clear();
        let mut room = cap;
        for part in &iov[first..] {
            if room == 0 || call.len() == IOV_MAX {
                break;
            }
            let len = part.iov_len.min(room);
            call.push(libc::iovec {
                iov_base: part.iov_base,
                iov_len: len,
            });
            room -= len;
        }
        let count = call.len() as libc::c_int;
        // SAFETY: each iovec is live memory lent for this call (writable for reads).
        let n = unsafe {
            match op {
                XferOp::Write => libc::pwritev(fd, call.as_ptr(), count, at as libc::off_t),
                XferOp::Read => libc::preadv(fd, call.as_ptr(), count, at as libc::off_t),
            }
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(io_err(e));
        }
        if n == 0 {
            return Err(io_err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file ended before the page did",
            )));
        }
        let mut moved = n as usize;
        at += moved;
        while moved > 0 {
            let part = &mut iov[first];
            let step = moved.min(part.iov_len);
            if let Some(crc) = crc.as_deref_mut() {
                // SAFETY: the call has just written these bytes, into memory lent for it.
                crc.update(unsafe { std::slice::from_raw_parts(part.iov_base as *const u8, step) });
            }
            part.iov_base = (part.iov_base as usize + step) as *mut libc::c_void;
            part.iov_len -= step;
            moved -= step;
            if part.iov_len == 0 {
                first += 1;
            }
        }
    }
    Ok(())
}

fn open_page(path: &Path, op: XferOp, direct: bool, sync: bool) -> std::io::Result<File> {
    let mut opts = OpenOptions::new();
    let mut flags = libc::O_CLOEXEC;
    if direct {
        flags |= libc::O_DIRECT;
    }
    match op {
        XferOp::Read => {
            opts.read(true);
        }
        XferOp::Write => {
            // Temp names are unique per write; truncate, as a retry of a failed batch reopens
            // the file its first attempt created.
            opts.write(true).create(true).truncate(true).mode(0o644);
            if sync {
                flags |= libc::O_DSYNC;
            }
        }
    }
    if op == XferOp::Read {
        // Reading a page must not write its inode: without O_NOATIME the first read after a
        // write updates the access time (relatime). Only the file's owner may ask for it.
        match opts
            .clone()
            .custom_flags(flags | libc::O_NOATIME)
            .open(path)
        {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
            other => return other,
        }
    }
    opts.custom_flags(flags).open(path)
}

/// Bytes an unprivileged writer may still use on the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Path-mode metaInfo: `<ro|rw>[,create][,direct][,sync]:<path>`.
fn path_meta(path: &Path, op: XferOp, direct: bool, sync: bool) -> Vec<u8> {
    let mut meta = match op {
        XferOp::Read => b"ro".to_vec(),
        XferOp::Write => b"rw,create".to_vec(),
    };
    if direct {
        meta.extend_from_slice(b",direct");
    }
    if sync && op == XferOp::Write {
        meta.extend_from_slice(b",sync");
    }
    meta.push(b':');
    meta.extend_from_slice(OsStr::as_bytes(path.as_os_str()));
    meta
}
