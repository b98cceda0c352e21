//! The NIXL engine: a batch's files registered with a NIXL FILE backend (by path, or by fd
//! where NIXL has no path mode) and moved in one transfer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tier_core::{PageKey, TierError};
use tier_folder::io::PageEngine;

use crate::batch::{move_isolating, BatchOutcome, Failure};
use crate::nixl::{
    next_dev_id, Backend, Desc, Finished, Held, IoRoom, MemKind, Transfer, Unsettled, XferOp,
};

use super::super::FolderMode;
use super::{free_bytes, op_name, Xfer};
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

/// Each part of `item`: its DRAM descriptor and the file range it maps to, for a file
/// registered as `dev_id`.
fn descs(item: &Xfer, dev_id: u64) -> impl Iterator<Item = (Desc<'static>, Desc<'static>)> + '_ {
    let mut offset = 0;
    item.parts.iter().map(move |&(addr, len)| {
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

/// NIXL's FILE engine: a lane's backend (one agent), and how its files are handed to it.
pub struct NixlEngine {
    /// The lane's FILE backend.
    pub backend: Arc<Backend>,
    /// Path or fd mode.
    pub mode: FileMode,
    /// Bound on each transfer's completion.
    pub timeout: Duration,
    /// Ask for synchronous writes (`O_DSYNC` / path-mode `sync`).
    pub sync: bool,
    /// Reads are checksummed: a read that failed unsettled is retried (see `settle_one`).
    pub checksums: bool,
    /// Who may use the files written (their mode).
    pub file_mode: FolderMode,
    /// The folders are on a filesystem whose clients cache apart (network, FUSE): a name
    /// another client replaced may answer `ESTALE` for a moment (see [`open_page`]).
    pub remote: bool,
}

impl PageEngine<Arc<Held>> for NixlEngine {
    fn describe(&self) -> String {
        format!("nixl {} ({} mode)", self.backend.plugin(), self.mode)
    }

    /// Every item in one registration and one transfer; if that fails as a whole, each item
    /// alone, so one bad page does not fail its neighbours.
    fn move_all(&self, op: XferOp, items: &[Xfer], memory: &Arc<Held>) -> BatchOutcome {
        move_isolating(
            items.len(),
            self.timeout,
            &mut |which| self.transfer(op, items, which, memory),
            &|i, message| self.item_error(op, &items[i], message),
        )
    }

    /// The batch moves in groups of about
    /// [`HASH_GROUP`] bytes, and each group's buffered pages are checksummed as soon as it
    /// lands. While groups land from the page cache, the next is posted only once the last is
    /// checksummed, so its bytes are still in the cores' caches (with more in flight, or
    /// checksummed after the whole batch, they come back from DRAM); while they come from the
    /// disk, [`HASH_DEPTH`] are in flight, keeping it busy. A group's failure is handled as
    /// [`PageEngine::move_all`] handles a batch's. Direct reads land in staging by DMA and are
    /// checksummed where they are copied out. A batch with nothing to checksum (direct, or
    /// versions already verified) moves as [`PageEngine::move_all`] moves it.
    fn read_hashing(
        &self,
        items: &[Xfer],
        memory: &Arc<Held>,
        skip: &[bool],
        hashed: &mut [Option<u32>],
    ) -> BatchOutcome {
        // Nothing to checksum (direct reads, versions already verified): one batch.
        if items.iter().zip(skip).all(|(i, &skip)| i.direct || skip) {
            return self.move_all(XferOp::Read, items, memory);
        }
        let mut outcome = BatchOutcome {
            results: Vec::with_capacity(items.len()),
            poisoned: false,
        };
        let cap = self.backend.descs_per_posting();
        let mut groups = Vec::new();
        let mut start = 0;
        while start < items.len() {
            let mut end = start + 1;
            let mut bytes = items[start].len;
            let mut descs = items[start].parts.len();
            while end < items.len()
                && bytes + items[end].len <= HASH_GROUP
                && descs + items[end].parts.len() <= cap
            {
                bytes += items[end].len;
                descs += items[end].parts.len();
                end += 1;
            }
            groups.push(start..end);
            start = end;
        }
        let mut in_flight = std::collections::VecDeque::with_capacity(HASH_DEPTH);
        let mut next = groups.into_iter().peekable();
        let mut depth = 1;
        let mut since = Instant::now();
        loop {
            while in_flight.len() < depth {
                let Some(group) = next.peek().cloned() else {
                    break;
                };
                let part = &items[group.clone()];
                let all: Vec<usize> = (0..group.len()).collect();
                // Room is waited for only with nothing in flight: what is in flight may be
                // the very room wanted, given back only once settled below.
                let wait = match in_flight.is_empty() {
                    true => self.timeout,
                    false => Duration::ZERO,
                };
                let posted = match self.room_for(XferOp::Read, part, &all, wait) {
                    Ok(room) => self.post(XferOp::Read, part, &all, memory, room),
                    Err(_) if !in_flight.is_empty() => break,
                    Err(e) => Err(e),
                };
                next.next();
                in_flight.push_back((group, posted));
            }
            let Some((group, posted)) = in_flight.pop_front() else {
                break;
            };
            let part = &items[group.clone()];
            // The group's transfer is its first attempt: a failure is handled as a batch's.
            let mut first = Some(posted.and_then(|t| self.settle(XferOp::Read, t)));
            let landed = move_isolating(
                part.len(),
                self.timeout,
                &mut |which| match first.take() {
                    Some(outcome) => outcome,
                    None => self.transfer(XferOp::Read, part, which, memory),
                },
                &|i, message| self.item_error(XferOp::Read, &part[i], message),
            );
            let bytes: usize = part.iter().map(|i| i.len).sum();
            let cached = bytes as f64 >= CACHED_RATE * since.elapsed().as_secs_f64();
            depth = if cached { 1 } else { HASH_DEPTH };
            if !landed.poisoned {
                for (((item, r), crc), &skip) in part
                    .iter()
                    .zip(&landed.results)
                    .zip(&mut hashed[group.clone()])
                    .zip(&skip[group.clone()])
                {
                    if r.is_ok() && !item.direct && !skip {
                        *crc = Some(item.checksum_parts());
                    }
                }
            }
            outcome.poisoned |= landed.poisoned;
            outcome.results.extend(landed.results);
            since = Instant::now();
        }
        outcome
    }

    /// NIXL opens (path mode) or reads (fd mode) files where kvtier cannot watch.
    fn reads_what_it_opens(&self) -> bool {
        false
    }
}

impl NixlEngine {
    /// An error of this engine's backend.
    pub fn backend_error(&self, key: Option<&PageKey>, message: String) -> TierError {
        TierError::Backend {
            backend: self.describe(),
            key: key.cloned(),
            message,
        }
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

    /// Moves the items `which` of `items`: in one registration and one transfer, or, where
    /// their descriptors are more than one posting may take ([`Backend::descs_per_posting`]),
    /// in such postings one after another.
    pub(super) fn transfer(
        &self,
        op: XferOp,
        items: &[Xfer],
        which: &[usize],
        memory: &Arc<Held>,
    ) -> Result<(), Failure> {
        let cap = self.backend.descs_per_posting();
        let mut start = 0;
        while start < which.len() {
            let mut end = start + 1;
            let mut descs = items[which[start]].parts.len();
            while end < which.len() && descs + items[which[end]].parts.len() <= cap {
                descs += items[which[end]].parts.len();
                end += 1;
            }
            let window = &which[start..end];
            let room = self.room_for(op, items, window, self.timeout)?;
            let posted = self.post(op, items, window, memory, room)?;
            self.settle(op, posted)?;
            start = end;
        }
        Ok(())
    }

    /// Room in the backend's pool of I/O requests for the descriptors of the items `which`
    /// of `items`, waiting up to `wait` for it.
    fn room_for(
        &self,
        op: XferOp,
        items: &[Xfer],
        which: &[usize],
        wait: Duration,
    ) -> Result<IoRoom, Failure> {
        let descs = which.iter().map(|&i| items[i].parts.len()).sum();
        self.backend
            .io_room(descs, wait)
            .map_err(|e| Failure::Batch(format!("{}: {e}", op_name(op))))
    }

    /// Registers the files of the items `which` of `items` and posts their transfer, with
    /// `room` for their descriptors: one for them all, but for a read into memory a caller
    /// lent, one per region (see [`Posted`]).
    pub(super) fn post(
        &self,
        op: XferOp,
        items: &[Xfer],
        which: &[usize],
        memory: &Arc<Held>,
        mut room: IoRoom,
    ) -> Result<Posted, Failure> {
        let (registration, files, dev_ids) = self.register_files(op, items, which)?;
        let (local, remote): (Vec<Desc<'_>>, Vec<Desc<'_>>) = which
            .iter()
            .enumerate()
            .flat_map(|(n, &i)| descs(&items[i], dev_ids[n]))
            .unzip();
        let backend = &self.backend;
        let mut held = Held::default();
        held.include(memory);
        held.files(registration, files);
        let held = held.seal();
        let mut posting = |local: &[Desc<'_>], remote: &[Desc<'_>]| {
            backend
                .post(op, local, MemKind::File, remote, &held, &mut room)
                .map_err(|e| Failure::Batch(format!("{}: posting the transfer: {e}", op_name(op))))
        };
        if !(op == XferOp::Read && held.lent()) || local.len() <= 1 {
            return Ok(Posted(vec![posting(&local, &remote)?]));
        }
        // Each transfer: a region of a page of a few regions, else a whole page.
        let mut spans = Vec::with_capacity(local.len());
        let mut at = 0;
        for &i in which {
            let n = items[i].parts.len();
            if n <= SPLIT_REGIONS {
                spans.extend((at..at + n).map(|d| d..d + 1));
            } else {
                spans.push(at..at + n);
            }
            at += n;
        }
        let mut posted = Vec::with_capacity(spans.len());
        for span in spans {
            match posting(&local[span.clone()], &remote[span]) {
                Ok(transfer) => posted.push(transfer),
                Err(e) => {
                    // Those posted are waited out: they read into the caller's memory.
                    let _ = self.settle(op, Posted(posted));
                    return Err(e);
                }
            }
        }
        Ok(Posted(posted))
    }

    /// Waits for posted transfers (each bounded by the transfer timeout) and says how they
    /// ended: every one of them is waited for, whatever the first says.
    pub(super) fn settle(&self, op: XferOp, posted: Posted) -> Result<(), Failure> {
        let mut outcome = Ok(());
        for transfer in posted.0 {
            let ended = self.settle_one(op, transfer);
            if outcome.is_ok() {
                outcome = ended;
            }
        }
        outcome
    }

    /// Waits for a posted transfer (bounded by the transfer timeout) and says how it ended.
    fn settle_one(&self, op: XferOp, transfer: Transfer) -> Result<(), Failure> {
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

/// The most one checksummed NIXL read moves before its pages are checksummed: the bytes of
/// a group still sit in the cores' caches when its transfer completes. (`benches/checksum_reads.rs`,
/// 32 pages of 2 MiB from the page cache: 0.79x to 0.86x as fast as without checksums in groups
/// of one page, one in flight; 0.72x checksummed after the batch, 0.70x to 0.75x with two or
/// more groups in flight; 4 MiB groups and 512 KiB transfers no better. From the disk, one in
/// flight: 0.85x to 0.92x; four: 0.98x to 1.08x.)
const HASH_GROUP: usize = 2 << 20;

/// Groups of a checksummed NIXL read in flight while they come from the disk.
const HASH_DEPTH: usize = 4;

/// Bytes per second above which a group landed from the page cache (a core copies them at
/// 5 to 10 GB/s; a disk feeding two lanes gives each far less).
const CACHED_RATE: f64 = 4e9;

/// The transfers of one batch. A read into memory a caller lent is posted one region a
/// transfer: NIXL reports each transfer's end, but after one descriptor of several fails it
/// no longer reports the others, whose I/O may still land in the caller's memory. A transfer
/// of one descriptor ends known (done or failed), so the caller's memory is given back exactly
/// when every read into it has ended; before, one failed page made the whole batch wait a
/// transfer timeout blind. A page of more than [`SPLIT_REGIONS`] regions (SGLang's
/// `layer_first` pages) is one transfer: a transfer per region cost 6 times a batch's time for
/// pages of 64 regions, so such a page that fails still waits that timeout.
pub(super) struct Posted(Vec<Transfer>);

/// The most regions of a page read into a caller's memory one transfer each (SGLang's MHA
/// pages are two: K and V).
const SPLIT_REGIONS: usize = 4;

mod files;
#[cfg(test)]
mod tests;
