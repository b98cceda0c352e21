//! Moving batches of pages between memory and files, by one of two engines: NIXL's FILE
//! backend ([`NixlEngine`], path or fd mode) or kvtier's own [`Syscalls`]. Runs on
//! blocking threads; every fd and registration a batch takes is held by its transfer, released
//! once it settles (see [`crate::nixl::Held`]).

use std::fs::{self, File};
use std::sync::Arc;
use std::time::Duration;

use tier_core::TierError;
use tier_folder::format;

use crate::batch::BatchOutcome;
use crate::nixl::{Held, XferOp};
use crate::staging::align_up;
use crate::READ_ATTEMPTS;

mod nixl;

pub use nixl::{probe_path_mode, FileMode, NixlEngine};
pub use tier_folder::io::{
    file_id, free_bytes, op_name, pin, sync_folders, Created, FileId, PageEngine, Syscalls,
    VerifiedFiles, Xfer, VERIFY_ONCE_MIN,
};

/// What moves a lane's bytes: one of the two engines (see [`PageEngine`]). The NIXL engine
/// also registers the memory a batch moves, which the tier asks of it by name.
pub enum Engine {
    /// A NIXL FILE backend (one agent per lane).
    Nixl(NixlEngine),
    /// kvtier's own system calls: no NIXL agent, nothing registered.
    Syscalls(Syscalls),
}

impl Engine {
    /// The engine as the folder cache uses it.
    fn pages(&self) -> &dyn PageEngine<Arc<Held>> {
        match self {
            Self::Nixl(nixl) => nixl,
            Self::Syscalls(syscalls) => syscalls,
        }
    }
}

/// A lane's engine and how to use it.
pub struct FileIo {
    /// What moves the bytes.
    pub engine: Engine,
    /// Read each page file's recorded checksum with its bytes.
    pub checksums: bool,
    /// The file versions verified in this process, when reads verify once per version.
    pub verified: Option<Arc<VerifiedFiles>>,
    /// The engine reads the file a read holds open instead of opening its name again: only
    /// where every folder is local. A client of a distributed filesystem serves the open and
    /// reads of a file another client removed from its caches (GlusterFS: for every page
    /// just read), and the name's `stat` too; only the engine's fresh open reaches the server.
    pub reads_held: bool,
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
    /// How files are handed to the engine: the syscalls engine opens each by its descriptor.
    pub fn mode(&self) -> FileMode {
        match &self.engine {
            Engine::Nixl(nixl) => nixl.mode,
            Engine::Syscalls(_) => FileMode::Fd,
        }
    }

    /// Registers caller-owned DRAM (each distinct range once) for one batch's transfers;
    /// nothing where the engine needs no registration.
    pub fn lend_local(&self, ranges: &[(usize, usize)]) -> Result<Arc<Held>, TierError> {
        let mut held = Held::default();
        if let Engine::Nixl(nixl) = &self.engine {
            let registration = nixl
                .backend
                .register_dram(ranges)
                .map_err(|e| nixl.backend_error(None, format!("registering page memory: {e}")))?;
            held.lend(registration);
        }
        Ok(held.seal())
    }

    /// Moves every item (see [`PageEngine::move_all`]). `memory` holds the items' DRAM
    /// (nothing for the syscall engine).
    pub fn transfer_all(&self, op: XferOp, items: &[Xfer], memory: &Arc<Held>) -> BatchOutcome {
        self.engine.pages().move_all(op, items, memory)
    }
}

impl FileIo {
    /// Reads every item. Per item: a hit (`true`); a miss (`false`) if its file vanished, or
    /// was replaced while it was read (what arrived may mix two versions: never a hit); a
    /// length mismatch if it now holds a page of another length; or the error.
    ///
    /// A file whose identity is wanted (its checksum is not known, or it is verified once per
    /// version) is opened and held across the read ([`pin`]); on local folders the engine
    /// reads that very file (see [`Xfer::opened`], [`Self::reads_held`]). It is served only
    /// if its name still holds it afterwards (the latest version, not one removed or replaced
    /// meanwhile). Other files the engine opens by name; a read whose checksum the index
    /// knows needs no identity: bytes that match it are the page's whichever file they came
    /// from, and any others are a miss (see `verify`).
    pub fn read_all(&self, items: &mut [Xfer], memory: &Arc<Held>) -> BatchReads {
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
            let mut retry: Vec<Xfer> = again.iter().map(|&i| items[i].clone()).collect();
            let second = self.read_once(&mut retry, memory);
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

    fn read_once(&self, items: &mut [Xfer], memory: &Arc<Held>) -> BatchReads {
        // A checksum is read from the file held across the read, whose identity before and
        // after proves it is the one whose bytes were read.
        let engine = self.engine.pages();
        let watch =
            |i: &Xfer| i.checksum.is_none() && (!engine.reads_what_it_opens() || self.checksums);
        // Pages verified once per file version: their identity is taken before and after too.
        let verified = self.verified.as_deref().filter(|_| self.checksums);
        let once = |i: &Xfer| verified.is_some() && i.len >= VERIFY_ONCE_MIN;
        let pinned: Vec<Option<(Arc<File>, FileId)>> = items
            .iter()
            .map(|i| {
                (watch(i) || once(i))
                    .then(|| pin(&i.path).map(|(file, id)| (Arc::new(file), id)))
                    .flatten()
            })
            .collect();
        // A buffered read reads the file held (a direct one opens its own, for `O_DIRECT`).
        for (item, pinned) in items.iter_mut().zip(&pinned) {
            item.opened = pinned
                .as_ref()
                .filter(|_| self.reads_held && !item.direct)
                .map(|(file, _)| Arc::clone(file));
        }
        let before: Vec<Option<FileId>> = pinned.iter().map(|p| p.as_ref().map(|p| p.1)).collect();
        // A version already verified is read without its checksum.
        let skip: Vec<bool> = before
            .iter()
            .map(|id| id.is_some_and(|id| verified.is_some_and(|v| v.contains(&id))))
            .collect();
        let mut hashed = vec![None; items.len()];
        let outcome = match self.checksums {
            true => engine.read_hashing(items, memory, &skip, &mut hashed),
            false => engine.move_all(XferOp::Read, items, memory),
        };
        // The name must still hold the file read: a file held open outlives its name (a put
        // renamed a new version in, or a remove unlinked it), and is then no page's latest.
        let after: Vec<Option<FileId>> = items
            .iter()
            .zip(&before)
            .map(|(i, b)| b.and_then(|_| file_id(&i.path)))
            .collect();
        for item in items.iter_mut() {
            item.opened = None;
        }
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
                        // The file the engine opened was checked; one that was not there to
                        // open is a miss, even if a put renamed a new one in since.
                        return match r {
                            Ok(()) => Ok(true),
                            Err(ref e) if gone(e) => Ok(false),
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
                        // The client may still show the name's old file for a moment.
                        (Err(ref e), _) if gone(e) => Ok(false),
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

/// Whether a read failed because its file was not there to open, or was replaced or removed
/// by another client of a network filesystem (`ESTALE`) before the engine opened it: a miss,
/// read again if its checksum is not known (see [`FileIo::read_all`]).
fn gone(e: &TierError) -> bool {
    matches!(e, TierError::Io { source, .. }
        if source.kind() == std::io::ErrorKind::NotFound
            || source.raw_os_error() == Some(libc::ESTALE))
}

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
