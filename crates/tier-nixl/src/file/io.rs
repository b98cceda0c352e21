//! Moving batches of pages between a staging buffer and files through a NIXL FILE backend, in
//! path mode or legacy fd mode. Runs on blocking threads; every fd and registration a batch
//! takes is released before it returns, on every path.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tier_core::{Bytes, PageKey, TierError};

use crate::nixl::{Backend, Completion, Desc, MemKind, Registration, XferOp};
use crate::staging::{align_up, StagingBuf};

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

/// Device ids for path-mode registrations: unique among live registrations in the process.
static NEXT_DEV_ID: AtomicU64 = AtomicU64::new(1);

fn next_dev_id() -> u64 {
    NEXT_DEV_ID.fetch_add(1, Ordering::Relaxed)
}

/// Registers a path that must not exist, without `create`: a path-mode NIXL fails to open it,
/// an older NIXL ignores the metaInfo and succeeds.
pub fn probe_path_mode(backend: &Arc<Backend>) -> FileMode {
    let probe = format!(
        "rw:/nonexistent-kvtier-path-mode-probe-{}",
        std::process::id()
    );
    let desc = Desc {
        addr: 0,
        len: 4096,
        dev_id: next_dev_id(),
        meta: probe.as_bytes(),
    };
    match backend.register(MemKind::File, &[desc]) {
        Err(_) => FileMode::Path,
        Ok(registration) => {
            drop(registration);
            FileMode::Fd
        }
    }
}

/// One page to write.
pub struct WriteItem {
    /// Its key.
    pub key: PageKey,
    /// Its bytes.
    pub data: Bytes,
    /// Where it ends up.
    pub path: PathBuf,
    /// Where it is written first.
    pub temp: PathBuf,
    /// Whether to bypass the page cache.
    pub direct: bool,
}

/// One page to read.
pub struct ReadItem {
    /// Its key.
    pub key: PageKey,
    /// Its file.
    pub path: PathBuf,
    /// Its length.
    pub len: usize,
    /// Whether to bypass the page cache.
    pub direct: bool,
}

/// Outcome of reading one page into the staging buffer.
#[derive(Debug)]
pub enum Staged {
    /// The page is at this offset of the staging buffer.
    At(usize),
    /// The file is gone.
    Missing,
}

/// Outcome of a batch: per-item results, and whether the staging buffer must be given up
/// because NIXL would not release a transfer that timed out.
pub struct BatchOutcome<T> {
    /// One result per item, in order.
    pub results: Vec<Result<T, TierError>>,
    /// True if the staging buffer (and the batch's registrations) must never be reused.
    pub poisoned: bool,
}

/// A FILE backend and how to use it.
pub struct FileIo {
    /// The backend.
    pub backend: Arc<Backend>,
    /// Path or fd mode.
    pub mode: FileMode,
    /// Bound on each transfer's completion.
    pub timeout: Duration,
    /// Ask for synchronous writes (`O_SYNC` / path-mode `sync`).
    pub sync: bool,
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

    /// Writes pages to their temp files, then renames each complete one into place. Temp files
    /// of failed pages are removed.
    pub fn write_batch(&self, staging: &mut StagingBuf, items: &[WriteItem]) -> BatchOutcome<()> {
        let (offsets, end) = slots(items.iter().map(|i| i.data.len()));
        debug_assert!(end <= staging.len());
        let buf = staging.as_mut_slice();
        for (item, off) in items.iter().zip(&offsets) {
            buf[*off..*off + item.data.len()].copy_from_slice(&item.data);
        }
        let all: Vec<usize> = (0..items.len()).collect();
        let mut results: Vec<Result<(), TierError>> = (0..items.len()).map(|_| Ok(())).collect();
        let poisoned = self.transfer_isolating(
            staging.addr(),
            &offsets,
            &all,
            XferOp::Write,
            &mut results,
            |i| {
                let it = &items[i];
                (it.key.clone(), it.temp.clone(), it.data.len(), it.direct)
            },
        );
        for (item, result) in items.iter().zip(results.iter_mut()) {
            if result.is_ok() {
                if let Err(e) = fs::rename(&item.temp, &item.path) {
                    *result = Err(TierError::io(
                        "rename page into place",
                        Some(&item.key),
                        Some(item.path.clone()),
                        e,
                    ));
                }
            }
            if result.is_err() && !poisoned {
                let _ = fs::remove_file(&item.temp);
            }
        }
        BatchOutcome { results, poisoned }
    }

    /// Reads pages into the staging buffer.
    pub fn read_batch(&self, staging: &mut StagingBuf, items: &[ReadItem]) -> BatchOutcome<Staged> {
        let (offsets, end) = slots(items.iter().map(|i| i.len));
        debug_assert!(end <= staging.len());
        let all: Vec<usize> = (0..items.len()).collect();
        let mut results: Vec<Result<(), TierError>> = (0..items.len()).map(|_| Ok(())).collect();
        let poisoned = self.transfer_isolating(
            staging.addr(),
            &offsets,
            &all,
            XferOp::Read,
            &mut results,
            |i| {
                let it = &items[i];
                (it.key.clone(), it.path.clone(), it.len, it.direct)
            },
        );
        let results = results
            .into_iter()
            .zip(items)
            .zip(offsets)
            .map(|((r, item), off)| match r {
                Ok(()) => Ok(Staged::At(off)),
                Err(_) if !item.path.exists() => Ok(Staged::Missing),
                Err(e) => Err(e),
            })
            .collect();
        BatchOutcome { results, poisoned }
    }

    /// Runs one registration + one transfer for `which` items; if that fails as a whole,
    /// retries each item alone so one bad page does not fail its neighbours. Returns whether
    /// a transfer could not be released.
    fn transfer_isolating(
        &self,
        base: usize,
        offsets: &[usize],
        which: &[usize],
        op: XferOp,
        results: &mut [Result<(), TierError>],
        item: impl Fn(usize) -> (PageKey, PathBuf, usize, bool) + Copy,
    ) -> bool {
        match self.transfer(base, offsets, which, op, item) {
            Ok(()) => false,
            Err(Failure::Item(i, e)) if which.len() == 1 => {
                results[i] = Err(e);
                false
            }
            Err(Failure::Batch(message)) if which.len() == 1 => {
                results[which[0]] = Err(self.backend_error(Some(&item(which[0]).0), message));
                false
            }
            Err(failure @ (Failure::TimedOut | Failure::Poisoned)) => {
                for &i in which {
                    results[i] = Err(TierError::Timeout {
                        op: "NIXL transfer",
                        after: self.timeout,
                    });
                }
                matches!(failure, Failure::Poisoned)
            }
            Err(_) => which
                .iter()
                .any(|&i| self.transfer_isolating(base, offsets, &[i], op, results, item)),
        }
    }

    fn transfer(
        &self,
        base: usize,
        offsets: &[usize],
        which: &[usize],
        op: XferOp,
        item: impl Fn(usize) -> (PageKey, PathBuf, usize, bool),
    ) -> Result<(), Failure> {
        let items: Vec<(PageKey, PathBuf, usize, bool)> = which.iter().map(|&i| item(i)).collect();
        // Fd mode: open every file first. Declared before the registration, so dropped after it.
        let mut files: Vec<File> = Vec::new();
        let mut metas: Vec<Vec<u8>> = Vec::new();
        let mut dev_ids = Vec::with_capacity(items.len());
        for (n, (key, path, _, direct)) in items.iter().enumerate() {
            match self.mode {
                FileMode::Fd => {
                    let file = open_page(path, op, *direct, self.sync).map_err(|e| {
                        Failure::Item(
                            which[n],
                            TierError::io(op_name(op), Some(key), Some(path.clone()), e),
                        )
                    })?;
                    dev_ids.push(file.as_raw_fd() as u64);
                    files.push(file);
                }
                FileMode::Path => {
                    metas.push(path_meta(path, op, *direct, self.sync));
                    dev_ids.push(next_dev_id());
                }
            }
        }
        let remote: Vec<Desc<'_>> = items
            .iter()
            .enumerate()
            .map(|(n, (_, _, len, _))| Desc {
                addr: 0,
                len: *len,
                dev_id: dev_ids[n],
                meta: metas.get(n).map_or(&[][..], Vec::as_slice),
            })
            .collect();
        let local: Vec<Desc<'_>> = which
            .iter()
            .zip(&items)
            .map(|(&i, (_, _, len, _))| Desc {
                addr: base + offsets[i],
                len: *len,
                dev_id: 0,
                meta: &[],
            })
            .collect();
        let registration: Registration = self
            .backend
            .register(MemKind::File, &remote)
            .map_err(|e| Failure::Batch(format!("{}: registering files: {e}", op_name(op))))?;
        let transfer = self
            .backend
            .post(op, &local, MemKind::File, &remote)
            .map_err(|e| Failure::Batch(format!("{}: posting the transfer: {e}", op_name(op))))?;
        let completion = transfer.wait(self.timeout);
        if !transfer.release() {
            // NIXL still owns the transfer: keep the registration and fds alive for good.
            std::mem::forget(registration);
            std::mem::forget(files);
            return Err(Failure::Poisoned);
        }
        drop(registration);
        drop(files);
        match completion {
            Completion::Done => Ok(()),
            Completion::Failed(e) => Err(Failure::Batch(format!("{}: transfer: {e}", op_name(op)))),
            Completion::TimedOut => Err(Failure::TimedOut),
        }
    }
}

fn op_name(op: XferOp) -> &'static str {
    match op {
        XferOp::Read => "read page",
        XferOp::Write => "write page",
    }
}

enum Failure {
    /// One item failed before the transfer (fd mode open).
    Item(usize, TierError),
    /// The registration or transfer failed as a whole.
    Batch(String),
    /// The transfer did not complete in time (it was released: nothing is in flight).
    TimedOut,
    /// A transfer timed out and NIXL would not release it.
    Poisoned,
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
            opts.write(true).create_new(true).mode(0o644);
            if sync {
                flags |= libc::O_DSYNC;
            }
        }
    }
    opts.custom_flags(flags).open(path)
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
