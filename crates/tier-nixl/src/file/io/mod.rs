//! Moving batches of pages between memory and files, by one of two engines: NIXL's FILE
//! backend ([`nixl`], path or fd mode) or kvtier's own syscalls (`tier_folder::io`). Runs on
//! blocking threads; every fd and registration a batch takes is held by its transfer, released
//! once it settles (see [`crate::nixl::Held`]).

use std::fs::{self, File};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tier_core::{PageKey, TierError};
use tier_folder::{checksum, format, io::move_by_syscalls};

use crate::batch::{move_isolating, BatchOutcome};
use crate::nixl::{Backend, Held, XferOp};
use crate::staging::align_up;
use crate::READ_ATTEMPTS;

mod nixl;

pub use nixl::{probe_path_mode, FileMode};
pub use tier_folder::io::{
    file_id, free_bytes, op_name, pin, sync_folders, Created, FileId, VerifiedFiles, Xfer,
    VERIFY_ONCE_MIN,
};

/// What moves a lane's bytes.
pub enum Engine {
    /// A NIXL FILE backend (one agent per lane).
    Nixl(Arc<Backend>),
    /// kvtier's own system calls (`tier_folder::io`): no NIXL agent, nothing registered.
    Syscalls,
}

impl Engine {
    fn is_nixl(&self) -> bool {
        matches!(self, Self::Nixl(_))
    }
}

/// A lane's engine and how to use it.
pub struct FileIo {
    /// What moves the bytes.
    pub engine: Engine,
    /// Path or fd mode.
    pub mode: FileMode,
    /// Bound on each transfer's completion.
    pub timeout: Duration,
    /// Ask for synchronous writes (`O_DSYNC` / path-mode `sync`).
    pub sync: bool,
    /// Read each page file's recorded checksum with its bytes.
    pub checksums: bool,
    /// The file versions verified in this process, when reads verify once per version.
    pub verified: Option<Arc<VerifiedFiles>>,
    /// Who may use the files written (their mode).
    pub file_mode: super::FolderMode,
    /// The folders are on a filesystem whose clients cache apart (network, FUSE): a name
    /// another client replaced may answer `ESTALE` for a moment (see [`tier_folder::io::open_page`]).
    pub remote: bool,
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
        let backend = match &self.engine {
            Engine::Nixl(backend) => format!("nixl {} ({} mode)", backend.plugin(), self.mode),
            Engine::Syscalls => "syscalls".to_string(),
        };
        TierError::Backend {
            backend,
            key: key.cloned(),
            message,
        }
    }

    /// Registers caller-owned DRAM (each distinct range once) for one batch's transfers;
    /// nothing where the engine needs no registration.
    pub fn lend_local(&self, ranges: &[(usize, usize)]) -> Result<Arc<Held>, TierError> {
        let mut held = Held::default();
        if let Engine::Nixl(backend) = &self.engine {
            let registration = backend
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
        if !self.engine.is_nixl() {
            return BatchOutcome {
                results: items
                    .iter()
                    .map(|item| move_by_syscalls(op, item, self.sync, self.file_mode, None))
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
            let second_versions = second
                .hashed
                .into_iter()
                .zip(second.stable)
                .zip(second.trusted);
            for ((i, (r, crc)), ((hashed, stable), trusted)) in
                again.into_iter().zip(second_reads).zip(second_versions)
            {
                reads.results[i] = r;
                reads.recorded[i] = crc;
                reads.hashed[i] = hashed;
                reads.stable[i] = stable;
                reads.trusted[i] = trusted;
            }
        }
        reads
    }

    fn read_once(&self, items: &[Xfer], memory: &Arc<Held>) -> BatchReads {
        // A checksum is read by path: the file's identity before and after proves it is the
        // one whose bytes were read.
        let watch = |i: &Xfer| i.checksum.is_none() && (self.engine.is_nixl() || self.checksums);
        // Pages verified once per file version: their identity is taken before and after too.
        let verified = self.verified.as_deref().filter(|_| self.checksums);
        let once = |i: &Xfer| verified.is_some() && i.len >= VERIFY_ONCE_MIN;
        let pinned: Vec<Option<(File, FileId)>> = items
            .iter()
            .map(|i| (watch(i) || once(i)).then(|| pin(&i.path)).flatten())
            .collect();
        let before: Vec<Option<FileId>> = pinned.iter().map(|p| p.as_ref().map(|p| p.1)).collect();
        // A version already verified is read without its checksum.
        let skip: Vec<bool> = before
            .iter()
            .map(|id| id.is_some_and(|id| verified.is_some_and(|v| v.contains(&id))))
            .collect();
        let mut hashed = vec![None; items.len()];
        let outcome = match (&self.engine, self.checksums) {
            (Engine::Nixl(_), true) if items.iter().any(|i| !i.direct) => {
                self.transfer_hashing(items, memory, &skip, &mut hashed)
            }
            (Engine::Syscalls, true) => self.read_hashing(items, &skip, &mut hashed),
            _ => self.transfer_all(XferOp::Read, items, memory),
        };
        let after: Vec<Option<FileId>> = items
            .iter()
            .zip(&before)
            .map(|(i, b)| b.and_then(|_| file_id(&i.path)))
            .collect();
        let stable: Vec<Option<FileId>> = items
            .iter()
            .zip(before.iter().zip(&after))
            .map(|(i, (b, a))| (once(i) && b.is_some() && b == a).then_some(*b).flatten())
            .collect();
        let trusted: Vec<bool> = skip
            .iter()
            .zip(&stable)
            .map(|(&skip, stable)| skip && stable.is_some())
            .collect();
        let mut recorded = vec![None; items.len()];
        let results = outcome
            .results
            .into_iter()
            .zip(items)
            .zip(before.into_iter().zip(after))
            .zip(recorded.iter_mut().zip(&trusted).zip(&pinned))
            .map(
                |(((r, item), (before, after)), ((recorded, &trusted), pinned))| {
                    if self.checksums && r.is_ok() && !trusted {
                        // From the file held across the read, which the identity check vouches
                        // for; none is a miss.
                        *recorded = item.checksum.map(format::Recorded::Crc).or_else(|| {
                            let (file, _) = pinned.as_ref()?;
                            format::recorded_in(file, &item.key, &item.path)
                        });
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
                                    && fs::metadata(&item.path).is_ok_and(|m| {
                                        m.is_file() && m.len() != format::file_len(item.len)
                                    }) =>
                            {
                                Ok(false)
                            }
                            Err(e) => Err(e),
                        };
                    }
                    match (r, after) {
                        (_, None) => Ok(false),
                        (_, Some(after)) if before != Some(after) => Ok(false),
                        (_, Some(after)) if after.file_len() != format::file_len(item.len) => {
                            Err(TierError::LengthMismatch {
                                key: item.key.clone(),
                                stored: format::page_len(after.file_len()).unwrap_or(0) as usize,
                                buffer: item.len,
                            })
                        }
                        (Ok(()), _) => Ok(true),
                        (Err(e), _) => Err(e),
                    }
                },
            )
            .collect();
        BatchReads {
            results,
            recorded,
            hashed,
            stable,
            trusted,
            poisoned: outcome.poisoned,
        }
    }
}

impl FileIo {
    /// Reads with the syscall engine and checksums on: each buffered page is checksummed as
    /// it is read, while its bytes are in cache (checksummed after a whole batch, 512 KiB
    /// pages read about a quarter slower, measured here).
    fn read_hashing(
        &self,
        items: &[Xfer],
        skip: &[bool],
        hashed: &mut [Option<u32>],
    ) -> BatchOutcome {
        BatchOutcome {
            results: items
                .iter()
                .zip(skip)
                .zip(hashed.iter_mut())
                .map(|((item, &skip), crc)| {
                    let mut running = (!item.direct && !skip).then(checksum::Crc::new);
                    move_by_syscalls(
                        XferOp::Read,
                        item,
                        self.sync,
                        self.file_mode,
                        running.as_mut(),
                    )?;
                    *crc = running.map(|c| c.value());
                    Ok(())
                })
                .collect(),
            poisoned: false,
        }
    }

    /// Reads with the NIXL engine and checksums on: the batch moves in groups of about
    /// [`HASH_GROUP`] bytes, and each group's buffered pages are checksummed as soon as it
    /// lands. While groups land from the page cache, the next is posted only once the last is
    /// checksummed, so its bytes are still in the cores' caches (with more in flight, or
    /// checksummed after the whole batch, they come back from DRAM); while they come from the
    /// disk, [`HASH_DEPTH`] are in flight, keeping it busy. A group's failure is handled as
    /// [`FileIo::transfer_all`] handles a batch's. Direct reads land in staging by DMA and are
    /// checksummed where they are copied out.
    fn transfer_hashing(
        &self,
        items: &[Xfer],
        memory: &Arc<Held>,
        skip: &[bool],
        hashed: &mut [Option<u32>],
    ) -> BatchOutcome {
        let mut outcome = BatchOutcome {
            results: Vec::with_capacity(items.len()),
            poisoned: false,
        };
        let mut groups = Vec::new();
        let mut start = 0;
        while start < items.len() {
            let mut end = start + 1;
            let mut bytes = items[start].len;
            while end < items.len() && bytes + items[end].len <= HASH_GROUP {
                bytes += items[end].len;
                end += 1;
            }
            groups.push(start..end);
            start = end;
        }
        let mut in_flight = std::collections::VecDeque::with_capacity(HASH_DEPTH);
        let mut next = groups.into_iter();
        let mut depth = 1;
        let mut since = Instant::now();
        loop {
            while in_flight.len() < depth {
                let Some(group) = next.next() else { break };
                let all: Vec<usize> = (0..group.len()).collect();
                let posted = self.post(XferOp::Read, &items[group.clone()], &all, memory);
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

/// What [`FileIo::read_all`] found.
pub struct BatchReads {
    /// Per item: hit (`true`), miss (`false`), or the error.
    pub results: Vec<Result<bool, TierError>>,
    /// Per item: the checksum its file records (with checksums on, for hits).
    pub recorded: Vec<Option<format::Recorded>>,
    /// Per item read in place with checksums on: the CRC-32C of the bytes read, taken as they
    /// landed (none for direct reads: the caller checksums them where it copies them out).
    pub hashed: Vec<Option<u32>>,
    /// Per item verified once per version: its file's version, if unchanged across the read
    /// (to be recorded as verified once its bytes match).
    pub stable: Vec<Option<FileId>>,
    /// Per item: a read of a version already verified, unchanged across it: a hit as read.
    pub trusted: Vec<bool>,
    /// True if the batch's DRAM must never be reused or freed.
    pub poisoned: bool,
}
