//! The NIXL FILE tier: pages as files under N storage folders x 256 buckets, moved by a NIXL
//! FILE plugin (POSIX by default; GDS, GDS_MT, HF3FS by config) through registered DRAM
//! staging buffers: one registration and one transfer per batch.
//!
//! - **Path mode** (NIXL >= 1.3) is probed at start: NIXL opens each file from a path in the
//!   registration metaInfo. Otherwise (or with `path_mode = Off`) the tier opens files itself
//!   and registers their fds; every fd is closed on every path.
//! - **Atomic visibility**: pages are written to a temp name and renamed into place only when
//!   complete; leftovers of crashed writes are removed at start.
//! - **Ownership**: one process owns the storage folders (an exclusive `flock` on a lock file in
//!   each); its in-memory index answers `exists` without touching the disk.

mod checksum;
mod index;
mod io;
mod layout;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use tier_core::{
    async_trait, GetResult, Lookup, Page, PageBuf, PageData, PageKey, PutResult, ReadSlot,
    RemoveResult, StatsRecorder, StorageTier, TierError, TierInfo, TierStats, WriteOrder,
};

pub use checksum::PageChecksum;
pub use io::{probe_path_mode, FileMode};
pub use layout::{route_hash, BUCKETS};

use crate::batch::{marked_bufs, run_blocking, send_pages, BatchOutcome};
use crate::nixl::{Agent, Held, Registered, XferOp};
use crate::staging::{align_up, StagingLease, StagingPool, ALIGN};
use index::PageIndex;
use io::{FileIo, Xfer};
use layout::Layout;
use tier_policy::PolicyKind;

/// Which NIXL FILE plugin moves the bytes (in config files, its name in NIXL).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FilePlugin {
    /// POSIX I/O (pread/pwrite, AIO or io_uring by plugin parameters). Needs no GPU.
    #[default]
    Posix,
    /// GPUDirect Storage.
    Gds,
    /// GPUDirect Storage, multi-threaded.
    GdsMt,
    /// 3FS (HF3FS).
    Hf3fs,
}

impl FilePlugin {
    /// The plugin's name in NIXL.
    pub fn nixl_name(self) -> &'static str {
        match self {
            Self::Posix => "POSIX",
            Self::Gds => "GDS",
            Self::GdsMt => "GDS_MT",
            Self::Hf3fs => "HF3FS",
        }
    }
}

/// Whether to use NIXL's path mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathModeChoice {
    /// Probe, and use path mode where the runtime supports it.
    #[default]
    Auto,
    /// Require path mode: opening fails on a runtime without it.
    On,
    /// Use fd mode even where path mode is available.
    Off,
}

/// What a page acknowledged by `put` survives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// The process's death (kill -9): a page is written to a temp file and renamed into
    /// place, so a file under a page's name is always whole. A power loss may lose recent
    /// pages, or leave a renamed file whose bytes never reached the disk.
    #[default]
    Process,
    /// A power loss as well: page files are written synchronously (`O_DSYNC`) and the folder
    /// is synced after the rename, before `put` answers.
    Power,
}

/// What moves page bytes between memory and files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileEngine {
    /// The NIXL FILE plugin: one registration and one transfer per batch.
    #[default]
    Nixl,
    /// Plain `pread`/`pwrite` by the tier's own threads, for host memory on a local or mounted
    /// filesystem: no registration and no NIXL request per batch. A read also checks that the
    /// file still has the page's length.
    Syscalls,
}

/// Whether to bypass the page cache (`O_DIRECT`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DirectIo {
    /// Buffered I/O.
    #[default]
    Off,
    /// Direct I/O for every page; pages whose length is not a multiple of 4 KiB are refused
    /// (`TierError::Unaligned`), and opening fails on a filesystem without direct I/O.
    Required,
    /// Direct I/O where possible; unaligned pages, or a filesystem without it, fall back to
    /// buffered I/O.
    Preferred,
}

/// Configuration of a [`NixlFileTier`].
#[derive(Debug, Clone)]
pub struct NixlFileConfig {
    /// Instance name, for logs and stats.
    pub name: String,
    /// Storage folders (one per disk); created if missing, duplicates by real path rejected.
    pub dirs: Vec<PathBuf>,
    /// The NIXL FILE plugin.
    pub plugin: FilePlugin,
    /// Plugin parameters, overriding the plugin's defaults (e.g. `use_uring = "true"`).
    pub plugin_params: BTreeMap<String, String>,
    /// Path mode choice.
    pub path_mode: PathModeChoice,
    /// Direct I/O choice.
    pub direct_io: DirectIo,
    /// What moves the bytes (NIXL, or the tier's own syscalls).
    pub engine: FileEngine,
    /// What an acknowledged page survives.
    pub durability: Durability,
    /// Whether each page carries a checksum, verified on every read.
    pub page_checksum: PageChecksum,
    /// Byte capacity; pages the policy chooses are evicted beyond it. `None`: unbounded.
    pub capacity_bytes: Option<u64>,
    /// Which pages go first when the capacity is reached (any but TinyLFU, which is moka's).
    pub policy: PolicyKind,
    /// Bytes per staging buffer; also the largest page. Batches larger than this are split.
    pub staging_bytes: usize,
    /// Staging buffers, i.e. batches in flight at once. Staging memory is
    /// `staging_bytes x staging_buffers`.
    pub staging_buffers: usize,
    /// Bound on each NIXL transfer.
    pub transfer_timeout: Duration,
    /// Bytes that transfers which never finished may keep for good (a stuck disk) before the
    /// tier refuses new ones with an error.
    pub max_abandoned_bytes: usize,
    /// Folder holding `libnixl_capi.so`, searched before `$NIXL_LIB_DIR` and the defaults.
    pub runtime_dir: Option<PathBuf>,
    /// A *reader*: reads the pages another process's tier owns in the same folders (an SGLang
    /// MLA rank reading what the writer rank stores). It takes no lock, removes no leftovers,
    /// keeps no index (the files are its index: `exists` and `get` look at them), and never
    /// writes or removes a page: puts fail, `remove` finds nothing of its own, `clear` is a
    /// no-op. Pages appear to it whole or not at all (the owner renames them into place).
    pub reader: bool,
}

impl NixlFileConfig {
    /// Defaults for storage under `dirs`.
    pub fn new(dirs: impl IntoIterator<Item = impl Into<PathBuf>>) -> Self {
        Self {
            name: "nixl-file".into(),
            dirs: dirs.into_iter().map(Into::into).collect(),
            plugin: FilePlugin::Posix,
            plugin_params: BTreeMap::new(),
            path_mode: PathModeChoice::Auto,
            direct_io: DirectIo::Off,
            engine: FileEngine::Nixl,
            durability: Durability::Process,
            page_checksum: PageChecksum::Crc32c,
            capacity_bytes: None,
            policy: PolicyKind::default(),
            staging_bytes: 16 << 20,
            staging_buffers: 2,
            transfer_timeout: Duration::from_secs(30),
            max_abandoned_bytes: crate::nixl::DEFAULT_ABANDON_LIMIT,
            runtime_dir: None,
            reader: false,
        }
    }

    /// Checks the settings that need no I/O.
    pub fn validate(&self) -> Result<(), TierError> {
        if self.dirs.is_empty() {
            return Err(TierError::config(
                "dirs",
                "at least one storage folder is needed",
            ));
        }
        if self.staging_bytes < ALIGN {
            return Err(TierError::config(
                "staging_bytes",
                format!("must be at least {ALIGN} bytes"),
            ));
        }
        if self.staging_bytes > MAX_STAGING {
            return Err(TierError::config(
                "staging_bytes",
                format!("must be at most {MAX_STAGING} bytes (1 GiB): it bounds the largest page"),
            ));
        }
        if !(1..=MAX_LANES).contains(&self.staging_buffers) {
            return Err(TierError::config(
                "staging_buffers",
                format!("must be 1 to {MAX_LANES} (one NIXL agent each)"),
            ));
        }
        if self.policy == PolicyKind::Tinylfu {
            return Err(TierError::config(
                "policy",
                "tinylfu is moka's, for DRAM tiers; a file tier takes lru, sieve, s3fifo, arc or prefix",
            ));
        }
        if self.capacity_bytes == Some(0) {
            return Err(TierError::config(
                "capacity_bytes",
                "must be at least 1 byte (or unset)",
            ));
        }
        if self.transfer_timeout.is_zero() {
            return Err(TierError::config("transfer_timeout", "must be positive"));
        }
        Ok(())
    }
}

/// A persistent page tier on local (or mounted) filesystems through NIXL.
pub struct NixlFileTier {
    shared: Arc<Shared>,
}

struct Shared {
    config: NixlFileConfig,
    layout: Layout,
    index: Mutex<PageIndex>,
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
    max_page: usize,
    // Held for the tier's life: the exclusive locks on the storage folders.
    _locks: Vec<File>,
}

const LOCK_FILE: &str = ".kvtier.lock";
/// Largest staging buffer (and page).
const MAX_STAGING: usize = 1 << 30;
/// Most lanes (NIXL agents) one tier runs.
pub(crate) const MAX_LANES: usize = 64;
const LOCK_WAIT: Duration = Duration::from_secs(5);
/// Bytes of buffered writes worth a thread of their own: the page cache takes a page's
/// bytes at memory speed until the kernel throttles writers, then each writer waits its turn.
const SPLIT_BYTES: usize = 4 << 20;

impl NixlFileTier {
    /// Opens the tier: loads the NIXL runtime, creates the folders and all bucket folders,
    /// locks them, removes leftovers of crashed writes, indexes the pages present, creates the
    /// backend and picks path or fd mode.
    pub async fn open(config: NixlFileConfig) -> Result<Self, TierError> {
        config.validate()?;
        let shared = tokio::task::spawn_blocking(move || Shared::open(config))
            .await
            .map_err(|e| TierError::Unavailable(format!("opening the tier panicked: {e}")))??;
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// The mode in use.
    pub fn mode(&self) -> FileMode {
        self.shared.lanes[0].mode
    }

    /// Whether pages go through `O_DIRECT` where aligned.
    pub fn direct_io(&self) -> bool {
        self.shared.direct
    }

    /// The canonical storage folders.
    pub fn dirs(&self) -> &[PathBuf] {
        self.shared.layout.dirs()
    }

    /// The file a page is stored in (whether or not it is present).
    pub fn page_path(&self, key: &PageKey) -> Result<PathBuf, TierError> {
        self.shared.layout.page_path(key)
    }

    /// Pages indexed now.
    pub fn pages(&self) -> usize {
        self.shared.index().pages()
    }
}

impl Shared {
    fn open(config: NixlFileConfig) -> Result<Self, TierError> {
        let runtime = crate::runtime::load(config.runtime_dir.as_deref())?;
        let layout = Layout::create(&config.dirs)?;
        let mut index = PageIndex::new(config.policy).ok_or_else(|| {
            TierError::config("policy", format!("{} is not for file tiers", config.policy))
        })?;
        let (locks, temps_removed) = if config.reader {
            (Vec::new(), 0)
        } else {
            let locks = layout
                .dirs()
                .iter()
                .map(|d| lock_folder(&d.join(LOCK_FILE)))
                .collect::<Result<Vec<_>, _>>()?;
            if config.page_checksum == PageChecksum::Crc32c {
                for dir in layout.dirs() {
                    checksum::supported(dir).map_err(|e| {
                        TierError::config(
                            "page_checksum",
                            format!(
                                "{} cannot keep a page's checksum in an extended attribute ({e}); \
                                 set page_checksum = \"off\" to store pages without one",
                                dir.display()
                            ),
                        )
                    })?;
                }
            }
            let scan = layout.scan()?;
            let mut found = scan.pages;
            found.sort_by_key(|(_, _, mtime)| *mtime);
            for (key, len, _) in found {
                index.insert(key, len, None, None);
            }
            (locks, scan.temps_removed)
        };

        let plugin = config.plugin.nixl_name();
        let backends = (0..config.staging_buffers)
            .map(|lane| create_backend(&config, lane))
            .collect::<Result<Vec<_>, _>>()?;
        let backend = Arc::clone(&backends[0]);
        let mode = match (config.path_mode, io::probe_path_mode(&backend)) {
            (PathModeChoice::Off, _) => FileMode::Fd,
            (PathModeChoice::On, FileMode::Fd) => {
                return Err(TierError::config(
                    "path_mode",
                    "path mode was required, but this NIXL runtime ignores path metaInfo (NIXL >= 1.3 has it)",
                ))
            }
            (_, probed) => probed,
        };
        let direct = match config.direct_io {
            DirectIo::Off => false,
            choice => match layout.dirs().iter().find(|d| !supports_direct_io(d)) {
                None => true,
                Some(dir) if choice == DirectIo::Required => {
                    return Err(TierError::config(
                        "direct_io",
                        format!(
                            "the filesystem of {} does not support O_DIRECT",
                            dir.display()
                        ),
                    ))
                }
                Some(dir) => {
                    tracing::warn!(dir = %dir.display(), "no O_DIRECT on this filesystem; using buffered I/O");
                    false
                }
            },
        };
        tracing::info!(
            tier = %config.name, %runtime, plugin, %mode, direct,
            pages = index.pages(), temps_removed, reader = config.reader,
            "NIXL FILE tier open"
        );
        let staging = StagingPool::new(
            Arc::clone(&backend),
            config.staging_buffers,
            config.staging_bytes,
        );
        let max_page = staging.buf_bytes();
        let lanes = backends
            .into_iter()
            .map(|backend| FileIo {
                backend,
                engine: config.engine,
                mode,
                timeout: config.transfer_timeout,
                sync: config.durability == Durability::Power,
                checksums: config.page_checksum == PageChecksum::Crc32c,
            })
            .collect();
        let shared = Self {
            layout,
            index: Mutex::new(index),
            lanes,
            staging,
            inflight: Arc::new(tokio::sync::Semaphore::new(config.staging_buffers)),
            stats: StatsRecorder::default(),
            order: WriteOrder::new(),
            direct,
            max_page,
            _locks: locks,
            config,
        };
        shared.enforce_capacity();
        Ok(shared)
    }

    fn lane(&self, n: usize) -> &FileIo {
        &self.lanes[n % self.lanes.len()]
    }

    fn index(&self) -> MutexGuard<'_, PageIndex> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stored length of `key`'s page: from the index, or for a reader from its file.
    fn stored_len(&self, index: &PageIndex, key: &PageKey) -> Option<u64> {
        if !self.config.reader {
            return index.len_of(key);
        }
        let path = self.layout.page_path(key).ok()?;
        fs::metadata(path)
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len())
    }

    fn limit(&self) -> Option<usize> {
        let cap = self
            .config
            .capacity_bytes
            .map_or(usize::MAX, |c| c.min(usize::MAX as u64) as usize);
        Some(self.max_page.min(cap))
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

    /// Evicts the pages the policy chooses until the capacity holds; deletes their files.
    fn enforce_capacity(&self) {
        let Some(capacity) = self.config.capacity_bytes else {
            return;
        };
        // Unlinked under the lock that forgets them: a put renaming a new file in waits.
        let mut index = self.index();
        for key in index.evict_to(capacity) {
            self.stats.eviction();
            if let Ok(path) = self.layout.page_path(&key) {
                let _ = fs::remove_file(path);
            }
        }
    }

    /// Writes pages and commits what succeeded (blocking, on the calling thread). With a lease,
    /// pages are copied into it (direct I/O needs its alignment); without, NIXL reads each
    /// page's own regions, registered for this batch. `lent` says the pages' memory is the
    /// caller's: a transfer NIXL will not release is then never left behind (see
    /// [`crate::nixl::Transfer::finish`]).
    fn write_pages(
        &self,
        lane: usize,
        pages: &[PlannedWrite<'_>],
        lease: Option<StagingLease>,
        lent: bool,
    ) -> Vec<PutResult> {
        let finals: Vec<PathBuf> = pages.iter().map(|p| p.path.clone()).collect();
        let (xfers, mut outcome) = match lease {
            Some(lease) => self.write_staged(pages, lease),
            None => self.write_zero_copy(self.lane(lane), pages, lent),
        };
        let mut checksums = vec![None; pages.len()];
        if !outcome.poisoned && self.config.page_checksum == PageChecksum::Crc32c {
            // On the temp file, before the rename: a page file never lacks its checksum.
            let stamped = pages.iter().zip(&xfers).zip(&mut outcome.results);
            for (((page, xfer), result), known) in stamped.zip(&mut checksums) {
                if result.is_ok() {
                    let crc = checksum::of(page.data.regions());
                    *known = Some(crc);
                    if let Err(e) = checksum::stamp(&xfer.path, crc) {
                        *result = Err(TierError::io(
                            "record the page's checksum",
                            Some(&page.key),
                            Some(xfer.path.clone()),
                            e,
                        ));
                    }
                }
            }
        }
        {
            // Files and entries change together: renamed in under the lock that inserts them.
            let mut index = self.index();
            FileIo::commit_writes(&xfers, &finals, &mut outcome);
            let mut after = None;
            for ((page, result), crc) in pages.iter().zip(&outcome.results).zip(checksums) {
                match result {
                    Ok(()) => {
                        index.insert(page.key.clone(), page.data.len() as u64, crc, after);
                        after = Some(&page.key);
                        self.stats.put(page.data.len());
                    }
                    Err(_) => self.stats.errors(1),
                }
            }
        }
        if self.config.durability == Durability::Power {
            // Outside the index lock: readers need not wait for the disk.
            io::sync_folders(&xfers, &finals, &mut outcome.results);
        }
        self.enforce_capacity();
        outcome.results
    }

    fn write_staged(
        &self,
        pages: &[PlannedWrite<'_>],
        mut lease: StagingLease,
    ) -> (Vec<Xfer>, BatchOutcome) {
        let (offsets, _) = io::slots(pages.iter().map(|p| p.data.len()));
        let base = lease.buf().addr();
        let buf = lease.buf().as_mut_slice();
        for (page, off) in pages.iter().zip(&offsets) {
            page.data.copy_to(&mut buf[*off..*off + page.data.len()]);
        }
        let xfers = write_xfers(pages, |i, _| vec![(base + offsets[i], pages[i].data.len())]);
        let mut held = Held::default();
        held.own(Arc::new(lease));
        let outcome = self
            .lane(0)
            .transfer_all(XferOp::Write, &xfers, &held.seal());
        (xfers, outcome)
    }

    fn write_zero_copy(
        &self,
        io: &FileIo,
        pages: &[PlannedWrite<'_>],
        lent: bool,
    ) -> (Vec<Xfer>, BatchOutcome) {
        if io.engine == FileEngine::Syscalls {
            let xfers = write_xfers(pages, |_, page| {
                page.data
                    .regions()
                    .map(|r| (r.as_ptr() as usize, r.len()))
                    .collect()
            });
            let outcome = io.transfer_all(XferOp::Write, &xfers, &Held::default().seal());
            return (xfers, outcome);
        }
        let regions: Vec<&[u8]> = pages.iter().flat_map(|p| p.data.regions()).collect();
        // The tier's pages are held by their transfers; a caller's are read during the call.
        let owner = (!lent).then(|| {
            let shared: Vec<_> = pages.iter().flat_map(|p| p.data.shared_regions()).collect();
            Arc::new(shared) as Arc<dyn Send + Sync>
        });
        let mut xfers = Vec::new();
        let outcome = send_pages(&io.backend, &regions, owner, &mut |addrs, held| {
            let mut addrs = addrs.iter();
            xfers = write_xfers(pages, |_, page| {
                page.data
                    .regions()
                    .map(|r| (addrs.next().copied().unwrap_or_default(), r.len()))
                    .collect()
            });
            io.transfer_all(XferOp::Write, &xfers, held)
        });
        (xfers, outcome)
    }

    /// Reads pages straight into the caller's buffers, on the calling thread (and a helper
    /// thread for the second half of big batches, see [`run_split`]). No await happens while
    /// NIXL may write into the buffers, so a dropped future cannot free them under a transfer.
    fn read_in_place(&self, reads: &[PlannedRead], bufs: &mut [&mut PageBuf<'_>]) -> VerifiedReads {
        const SPLIT_AT: usize = 32;
        if reads.len() < SPLIT_AT {
            return self.read_part(self.lane(0), reads, bufs);
        }
        let mid = reads.len() / 2;
        let (left_reads, right_reads) = reads.split_at(mid);
        let (left_bufs, right_bufs) = bufs.split_at_mut(mid);
        let (mut reads, others) = run_split(
            || self.read_part(self.lane(0), left_reads, left_bufs),
            vec![|| self.read_part(self.lane(1), right_reads, right_bufs)],
        );
        let right = others.into_iter().next();
        match right.unwrap_or_else(|| Err("a kvtier-io helper did not run".to_string())) {
            Ok(right) => {
                reads
                    .replaced
                    .extend(right.replaced.into_iter().map(|i| i + mid));
                reads.results.extend(right.results);
            }
            Err(msg) => reads.results.extend(
                right_reads
                    .iter()
                    .map(|_| Err(TierError::Unavailable(msg.clone()))),
            ),
        }
        reads
    }

    fn read_part(
        &self,
        io: &FileIo,
        reads: &[PlannedRead],
        bufs: &mut [&mut PageBuf<'_>],
    ) -> VerifiedReads {
        let ranges: Vec<Vec<(usize, usize)>> = bufs.iter_mut().map(|b| b.ranges()).collect();
        let flat: Vec<(usize, usize)> = ranges.iter().flatten().copied().collect();
        let memory = match io.lend_local(&flat) {
            Ok(memory) => memory,
            Err(e) => {
                return VerifiedReads {
                    results: reads.iter().map(|_| Err(copy_error(&e))).collect(),
                    replaced: Vec::new(),
                }
            }
        };
        let xfers = read_xfers(reads, |i| ranges[i].clone());
        let outcome = io.read_all(&xfers, &memory);
        drop(memory);
        let mut results = outcome.results;
        let replaced = self.verify(reads, &outcome.recorded, &mut results, |i| {
            outcome.hashed[i].unwrap_or_else(|| checksum::of(bufs[i].regions()))
        });
        VerifiedReads { results, replaced }
    }

    /// Turns each hit whose bytes (checksummed by `crc_of`) do not match the checksum its file
    /// records, or whose file records none, into a miss: counted as an error, logged, and the
    /// page forgotten and its file removed, unless a newer put has replaced it meanwhile.
    ///
    /// The index keeps each file's checksum once this process wrote or verified it, so a read
    /// compares against it and asks the file for none. Files change only with their entry's
    /// generation (under the index lock): a mismatch while the entry is still the one the read
    /// planned with is the file's fault; after a put replaced it, the read is to be made again
    /// against the new file's own: those are returned (answered as misses meanwhile).
    fn verify(
        &self,
        reads: &[PlannedRead],
        recorded: &[Option<u32>],
        results: &mut [Result<bool, TierError>],
        crc_of: impl Fn(usize) -> u32,
    ) -> Vec<usize> {
        let mut replaced = Vec::new();
        if self.config.page_checksum == PageChecksum::Off {
            return replaced;
        }
        let mut learned = Vec::new();
        for (i, (read, result)) in reads.iter().zip(results.iter_mut()).enumerate() {
            if result.is_err()
                && read.checksum.is_some()
                && self.index().generation(&read.key) != Some(read.generation)
            {
                // Removed or replaced while it was read (unwatched, see `FileIo::read_all`).
                *result = Ok(false);
                replaced.push(i);
                continue;
            }
            if !matches!(result, Ok(true)) {
                continue;
            }
            let crc = crc_of(i);
            if recorded[i] == Some(crc) {
                if read.checksum.is_none() && !self.config.reader {
                    learned.push((&read.key, read.generation, crc));
                }
                continue;
            }
            *result = Ok(false);
            if read.checksum.is_some()
                && self.index().generation(&read.key) != Some(read.generation)
            {
                replaced.push(i);
                continue;
            }
            self.stats.errors(1);
            tracing::warn!(
                tier = %self.config.name, key = %read.key, path = %read.path.display(),
                recorded = ?recorded[i], read = crc,
                "page bytes do not match their checksum: answered as a miss, file removed"
            );
            if !self.config.reader {
                let mut index = self.index();
                if index.remove_if(&read.key, read.generation) {
                    let _ = fs::remove_file(&read.path);
                }
            }
        }
        if !learned.is_empty() {
            let mut index = self.index();
            for (key, generation, crc) in learned {
                index.learn_checksum(key, generation, crc);
            }
        }
        replaced
    }

    /// Reads a chunk into a staging lease (blocking thread), for direct I/O. The hits are
    /// verified once copied out (see [`StagedReads`]).
    fn read_staged(&self, mut lease: StagingLease, reads: &[PlannedRead]) -> StagedReads {
        let (offsets, _) = io::slots(reads.iter().map(|r| r.len));
        let base = lease.buf().addr();
        let xfers = read_xfers(reads, |i| vec![(base + offsets[i], reads[i].len)]);
        let lease = Arc::new(lease);
        let mut held = Held::default();
        held.own(Arc::clone(&lease) as Arc<dyn Registered>);
        let outcome = self.lane(0).read_all(&xfers, &held.seal());
        StagedReads {
            lease: (!outcome.poisoned).then_some(lease),
            offsets,
            results: outcome.results,
            recorded: outcome.recorded,
        }
    }

    /// Unpins read pages; hits become most recent. A file that vanished under its entry
    /// (deleted by hand) is forgotten, unless the entry is no longer the one the read planned
    /// with (a newer put replaced it meanwhile).
    fn finish_reads(&self, reads: &[PlannedRead], results: &[Result<bool, TierError>]) {
        let mut index = self.index();
        let mut after = None;
        for (read, result) in reads.iter().zip(results) {
            match result {
                Ok(true) => {
                    index.touch(&read.key, after);
                    after = Some(&read.key);
                }
                Ok(false) if !read.path.exists() => {
                    index.remove_if(&read.key, read.generation);
                }
                _ => {}
            }
        }
    }
}

/// A page planned for writing.
struct PlannedWrite<'a> {
    key: PageKey,
    data: PageData<'a>,
    path: PathBuf,
    temp: PathBuf,
    direct: bool,
}

/// Reads checked against their pages' checksums.
struct VerifiedReads {
    /// Per read: hit, miss, or the error.
    results: Vec<Result<bool, TierError>>,
    /// Reads of pages a put replaced after they were planned, to be made again (see
    /// [`Shared::verify`]).
    replaced: Vec<usize>,
}

/// What [`Shared::read_staged`] read. A batch read that failed in one page may still land
/// other pages' late reads in the lease (it is held until they have), so each hit is checked
/// against its checksum after it is copied out, where nothing else writes.
struct StagedReads {
    /// The lease read into; `None` if a transfer into it never settled.
    lease: Option<Arc<StagingLease>>,
    /// Each read's offset in the lease.
    offsets: Vec<usize>,
    /// Per read: hit, miss or error, not yet verified.
    results: Vec<Result<bool, TierError>>,
    /// Per read: the checksum its file records.
    recorded: Vec<Option<u32>>,
}

/// The pins a get holds on the pages it reads (no eviction unlinks them meanwhile), released
/// when it drops: when the get returns, and when it is dropped at an await point.
struct Pins<'a> {
    shared: &'a Shared,
    keys: Vec<PageKey>,
}

impl Drop for Pins<'_> {
    fn drop(&mut self) {
        let mut index = self.shared.index();
        for key in &self.keys {
            index.unpin(key);
        }
    }
}

/// A page planned for reading into slot `slot`.
#[derive(Clone)]
struct PlannedRead {
    slot: usize,
    key: PageKey,
    /// The index entry's generation when planned (0 for a reader, which has no index).
    generation: u64,
    /// The checksum the index knows for the entry's file, if any (none: read the file's).
    checksum: Option<u32>,
    path: PathBuf,
    len: usize,
    direct: bool,
}

/// Transfers of `pages`; `parts` gives each page's DRAM regions.
fn write_xfers<'a, 'p>(
    pages: &'p [PlannedWrite<'a>],
    mut parts: impl FnMut(usize, &'p PlannedWrite<'a>) -> Vec<(usize, usize)>,
) -> Vec<Xfer> {
    pages
        .iter()
        .enumerate()
        .map(|(i, p)| Xfer {
            key: p.key.clone(),
            path: p.temp.clone(),
            len: p.data.len(),
            direct: p.direct,
            parts: parts(i, p),
            checksum: None,
        })
        .collect()
}

/// Transfers of `reads`; `parts` gives each read's DRAM regions.
fn read_xfers(reads: &[PlannedRead], parts: impl Fn(usize) -> Vec<(usize, usize)>) -> Vec<Xfer> {
    reads
        .iter()
        .enumerate()
        .map(|(i, r)| Xfer {
            key: r.key.clone(),
            path: r.path.clone(),
            len: r.len,
            direct: r.direct,
            parts: parts(i),
            checksum: r.checksum,
        })
        .collect()
}

/// The threads that move the other parts of big batches while the calling thread moves the
/// first: started once, one per core, kept for the process (a thread started per batch often
/// began on its caller's core, and after an idle pause ran the batch up to half again slower);
/// `None` if none could be started.
fn io_helpers() -> Option<&'static rayon::ThreadPool> {
    static HELPERS: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    HELPERS
        .get_or_init(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
                .thread_name(|_| "kvtier-io".into())
                .build()
                .ok()
        })
        .as_ref()
}

/// Runs `first` on the calling thread while the helper threads run `others`, and returns when
/// all are done: `first`'s result, and each other's or why it has none (it panicked or could
/// not run). Without helper threads, the others run after `first`, here.
fn run_split<T: Send, F: FnOnce() -> T + Send>(
    first: impl FnOnce() -> T,
    others: Vec<F>,
) -> (T, Vec<Result<T, String>>) {
    let Some(helpers) = io_helpers() else {
        return (first(), others.into_iter().map(|f| Ok(f())).collect());
    };
    let mut results: Vec<Option<Result<T, String>>> = others.iter().map(|_| None).collect();
    let first = helpers.in_place_scope(|scope| {
        for (f, out) in others.into_iter().zip(results.iter_mut()) {
            scope.spawn(move |_| {
                *out = Some(
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
                        .map_err(|_| "a kvtier-io helper thread panicked".to_string()),
                );
            });
        }
        first()
    });
    let others = results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("a kvtier-io helper did not run".to_string())))
        .collect();
    (first, others)
}

fn copy_error(e: &TierError) -> TierError {
    TierError::Unavailable(e.to_string())
}

/// Creates one lane's agent and backend. POSIX gets `use_uring = true` unless the config picks
/// an I/O engine itself (measured faster here for 2 MiB pages); if the runtime cannot use
/// io_uring, the plugin's defaults are used.
fn create_backend(
    config: &NixlFileConfig,
    lane: usize,
) -> Result<Arc<crate::nixl::Backend>, TierError> {
    let plugin = config.plugin.nixl_name();
    let backend_err = |message: String| TierError::Backend {
        backend: format!("nixl {plugin}"),
        key: None,
        message,
    };
    let agent = Agent::for_lane(&config.name, lane)
        .map_err(|e| backend_err(format!("creating the agent: {e}")))?;
    let limited = |backend: Arc<crate::nixl::Backend>| {
        backend.limit_abandoned(config.max_abandoned_bytes);
        backend
    };
    let engines = ["use_uring", "use_aio", "use_posix_aio"];
    let tuned = config.plugin == FilePlugin::Posix
        && !engines
            .iter()
            .any(|k| config.plugin_params.contains_key(*k));
    if tuned {
        let mut params = config.plugin_params.clone();
        params.insert("use_uring".into(), "true".into());
        match agent.create_backend(plugin, &params) {
            Ok(backend) => return Ok(limited(backend)),
            Err(e) => {
                tracing::warn!(error = %e, "POSIX with io_uring unavailable; using the plugin's defaults")
            }
        }
    }
    agent
        .create_backend(plugin, &config.plugin_params)
        .map(limited)
        .map_err(|e| backend_err(format!("creating the {plugin} backend: {e}")))
}

fn lock_folder(path: &std::path::Path) -> Result<File, TierError> {
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| TierError::io("open lock file", None, Some(path.to_path_buf()), e))?;
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        // SAFETY: valid open fd.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(file);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(TierError::io(
                "lock storage folder",
                None,
                Some(path.to_path_buf()),
                err,
            ));
        }
        if Instant::now() >= deadline {
            return Err(TierError::Unavailable(format!(
                "storage folder {} is in use by another kvtier tier (lock held for over {LOCK_WAIT:?})",
                path.parent().unwrap_or(path).display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn supports_direct_io(dir: &std::path::Path) -> bool {
    let probe = dir.join(format!(".kvtier-direct-probe-{}", std::process::id()));
    let ok = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = fs::remove_file(&probe);
    ok
}

/// Records a write job's per-page results at their batch positions (or its error for each).
fn settle_writes(
    shared: &Shared,
    results: &mut [Option<PutResult>],
    positions: Vec<usize>,
    outcome: Result<Vec<PutResult>, TierError>,
) {
    match outcome {
        Ok(job_results) => {
            for (pos, r) in positions.into_iter().zip(job_results) {
                results[pos] = Some(r);
            }
        }
        Err(e) => {
            shared.stats.errors(positions.len());
            let msg = e.to_string();
            for pos in positions {
                results[pos] = Some(Err(TierError::Unavailable(msg.clone())));
            }
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

impl NixlFileTier {
    /// Reads planned pages into their slots (buffered ones in place, direct ones through
    /// staging) and sets their results; returns the reads to make again (see
    /// [`Shared::verify`]).
    async fn read_round(
        &self,
        slots: &mut [ReadSlot<'_>],
        results: &mut [Option<GetResult>],
        buffered: Vec<PlannedRead>,
        direct: Vec<PlannedRead>,
    ) -> Vec<PlannedRead> {
        let shared = &self.shared;
        let mut replaced = Vec::new();
        if !buffered.is_empty() {
            let mut wanted = vec![false; slots.len()];
            for read in &buffered {
                wanted[read.slot] = true;
            }
            let mut bufs = marked_bufs(slots, &wanted);
            let outcome = run_blocking(|| shared.read_in_place(&buffered, &mut bufs));
            shared.finish_reads(&buffered, &outcome.results);
            replaced.extend(outcome.replaced.iter().map(|&i| buffered[i].clone()));
            for (read, r) in buffered.iter().zip(outcome.results) {
                results[read.slot] =
                    Some(r.map(|hit| if hit { Lookup::Hit } else { Lookup::Miss }));
            }
        }
        // Direct I/O goes through aligned staging, one chunk at a time: a call never holds a
        // staging buffer while waiting for another, so concurrent calls cannot deadlock.
        let lens: Vec<(usize, usize)> =
            direct.iter().enumerate().map(|(n, r)| (n, r.len)).collect();
        let mut direct: Vec<Option<PlannedRead>> = direct.into_iter().map(Some).collect();
        for chunk in chunks(&lens, shared.staging.buf_bytes()) {
            let reads: Arc<[PlannedRead]> =
                chunk.iter().filter_map(|&n| direct[n].take()).collect();
            let outcome = match shared.staging.acquire().await {
                Ok(lease) => {
                    let (shared, job_reads) = (Arc::clone(shared), Arc::clone(&reads));
                    tokio::task::spawn_blocking(move || shared.read_staged(lease, &job_reads))
                        .await
                        .map_err(|e| TierError::Unavailable(format!("read task failed: {e}")))
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok(staged) => {
                    let mut chunk_results = staged.results;
                    for ((read, &off), r) in
                        reads.iter().zip(&staged.offsets).zip(&mut chunk_results)
                    {
                        if let Ok(true) = r {
                            match &staged.lease {
                                Some(lease) => slots[read.slot]
                                    .buf
                                    .fill_from(&lease.bytes()[off..off + read.len]),
                                None => {
                                    *r = Err(TierError::Timeout {
                                        op: "NIXL transfer",
                                        after: shared.config.transfer_timeout,
                                    })
                                }
                            }
                        }
                    }
                    let again = shared.verify(&reads, &staged.recorded, &mut chunk_results, |i| {
                        checksum::of(slots[reads[i].slot].buf.regions())
                    });
                    replaced.extend(again.iter().map(|&i| reads[i].clone()));
                    shared.finish_reads(&reads, &chunk_results);
                    for (read, r) in reads.iter().zip(chunk_results) {
                        results[read.slot] =
                            Some(r.map(|hit| if hit { Lookup::Hit } else { Lookup::Miss }));
                    }
                }
                Err(e) => {
                    let failed: Vec<Result<bool, TierError>> = reads
                        .iter()
                        .map(|_| Err(TierError::Unavailable(e.to_string())))
                        .collect();
                    shared.finish_reads(&reads, &failed);
                    for (read, r) in reads.iter().zip(failed) {
                        results[read.slot] = Some(r.map(|_| Lookup::Miss));
                    }
                }
            }
        }
        replaced
    }
}

#[async_trait]
impl StorageTier for NixlFileTier {
    fn info(&self) -> TierInfo {
        TierInfo {
            name: self.shared.config.name.clone(),
            kind: "nixl-file".into(),
            capacity_bytes: self.shared.config.capacity_bytes,
            max_page_bytes: self.shared.limit(),
            persistent: true,
        }
    }

    fn stats(&self) -> TierStats {
        self.shared
            .stats
            .snapshot(Some(self.shared.index().bytes()))
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        let shared = &self.shared;
        if shared.config.reader {
            shared.stats.errors(pages.len());
            return pages
                .iter()
                .map(|p| {
                    Err(TierError::Unavailable(format!(
                        "{} is a reader: it never writes (page {})",
                        shared.config.name, p.key
                    )))
                })
                .collect();
        }
        let keys: Vec<PageKey> = pages.iter().map(|p| p.key.clone()).collect();
        let _turn = shared.order.turn(&keys).await;
        let mut results: Vec<Option<PutResult>> = (0..pages.len()).map(|_| None).collect();
        // A key repeated in the batch: only its last valid page is written.
        let last = Page::last_valid(pages, shared.limit());
        let (mut direct, mut buffered) = (Vec::new(), Vec::new());
        for (i, page) in pages.iter().enumerate() {
            let planned = page
                .check_len(shared.limit())
                .and_then(|()| shared.direct_for(&page.key, page.data.len()))
                .and_then(|direct| Ok((direct, shared.layout.page_path(&page.key)?)));
            match planned {
                Err(e) => {
                    shared.stats.errors(1);
                    results[i] = Some(Err(e));
                }
                Ok(_) if last.get(&page.key) != Some(&i) => results[i] = Some(Ok(())),
                Ok((is_direct, path)) => {
                    let write = PlannedWrite {
                        key: page.key.clone(),
                        data: page.data.clone(),
                        temp: shared.layout.temp_path(&path),
                        path,
                        direct: is_direct,
                    };
                    if is_direct {
                        direct.push((i, write))
                    } else {
                        buffered.push((i, write))
                    }
                }
            }
        }
        // Direct pages go in chunks that fit a staging buffer, one chunk at a time (a call
        // never holds a staging buffer while waiting for another); buffered pages are split
        // across the in-flight budget and written at once on as many threads, so big batches
        // use several cores. Writes run on the calling thread (no await while NIXL reads the
        // pages), so a dropped `put` has written and committed each page whole, or not at all.
        let lent = pages.iter().any(|p| p.data.lent_bytes() > 0);
        let lens: Vec<(usize, usize)> = direct
            .iter()
            .enumerate()
            .map(|(n, (_, w))| (n, w.data.len()))
            .collect();
        let mut direct: Vec<Option<(usize, PlannedWrite<'_>)>> =
            direct.into_iter().map(Some).collect();
        for chunk in chunks(&lens, shared.staging.buf_bytes()) {
            let (positions, writes): (Vec<usize>, Vec<PlannedWrite<'_>>) =
                chunk.iter().filter_map(|&n| direct[n].take()).unzip();
            let outcome = match shared.staging.acquire().await {
                Ok(lease) => Ok(run_blocking(|| {
                    shared.write_pages(0, &writes, Some(lease), false)
                })),
                Err(e) => Err(e),
            };
            settle_writes(shared, &mut results, positions, outcome);
        }
        // A part per 32 pages or per SPLIT_BYTES, whichever makes more, up to one per lane.
        let bytes: usize = buffered.iter().map(|(_, w)| w.data.len()).sum();
        let parts = (buffered.len() / 32)
            .max(bytes / SPLIT_BYTES)
            .clamp(1, shared.config.staging_buffers)
            .min(buffered.len().max(1));
        let per_part = buffered.len().div_ceil(parts).max(1);
        let mut jobs: Vec<(Vec<usize>, Vec<PlannedWrite<'_>>)> = Vec::new();
        while !buffered.is_empty() {
            let rest = buffered.split_off(per_part.min(buffered.len()));
            jobs.push(std::mem::replace(&mut buffered, rest).into_iter().unzip());
        }
        if !jobs.is_empty() {
            let permits = Arc::clone(&shared.inflight)
                .acquire_many_owned(jobs.len() as u32)
                .await
                .map_err(|_| TierError::Unavailable("tier closed".into()));
            let outcomes: Vec<Result<Vec<PutResult>, TierError>> = match &permits {
                Ok(_) => run_blocking(|| {
                    let others = jobs[1..]
                        .iter()
                        .enumerate()
                        .map(|(n, (_, writes))| {
                            move || shared.write_pages(n + 1, writes, None, lent)
                        })
                        .collect();
                    let (first, others) =
                        run_split(|| shared.write_pages(0, &jobs[0].1, None, lent), others);
                    std::iter::once(Ok(first))
                        .chain(
                            others
                                .into_iter()
                                .map(|r| r.map_err(TierError::Unavailable)),
                        )
                        .collect()
                }),
                Err(e) => jobs
                    .iter()
                    .map(|_| Err(TierError::Unavailable(e.to_string())))
                    .collect(),
            };
            drop(permits);
            for ((positions, _), outcome) in jobs.into_iter().zip(outcomes) {
                settle_writes(shared, &mut results, positions, outcome);
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(TierError::Unavailable("page was not scheduled".into())))
            })
            .collect()
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let shared = &self.shared;
        let mut results: Vec<Option<GetResult>> = (0..slots.len()).map(|_| None).collect();
        let (mut direct, mut buffered) = (Vec::new(), Vec::new());
        let mut pins = Pins {
            shared,
            keys: Vec::new(),
        };
        {
            let mut index = shared.index();
            for (i, slot) in slots.iter().enumerate() {
                let len = match shared.stored_len(&index, &slot.key) {
                    None => {
                        results[i] = Some(Ok(Lookup::Miss));
                        continue;
                    }
                    Some(len) => len as usize,
                };
                if len != slot.buf.len() {
                    results[i] = Some(Err(TierError::LengthMismatch {
                        key: slot.key.clone(),
                        stored: len,
                        buffer: slot.buf.len(),
                    }));
                    continue;
                }
                match shared.layout.page_path(&slot.key) {
                    Ok(path) => {
                        index.pin(&slot.key);
                        pins.keys.push(slot.key.clone());
                        let is_direct = shared.direct_for(&slot.key, len).unwrap_or(false);
                        let read = PlannedRead {
                            slot: i,
                            key: slot.key.clone(),
                            generation: index.generation(&slot.key).unwrap_or(0),
                            checksum: index.checksum(&slot.key),
                            path,
                            len,
                            direct: is_direct,
                        };
                        if is_direct {
                            direct.push(read)
                        } else {
                            buffered.push(read)
                        }
                    }
                    Err(e) => results[i] = Some(Err(e)),
                }
            }
        }
        let replaced = self.read_round(slots, &mut results, buffered, direct).await;
        if !replaced.is_empty() {
            // Pages a put replaced after they were planned: read again, each checked against
            // its new file's own checksum (the index's was the old file's).
            let mut again = replaced;
            {
                let index = shared.index();
                for read in &mut again {
                    read.checksum = None;
                    read.generation = index.generation(&read.key).unwrap_or(0);
                }
            }
            let (direct, buffered) = again.into_iter().partition(|r| r.direct);
            self.read_round(slots, &mut results, buffered, direct).await;
        }
        drop(pins);
        shared.stats.settle_gets(results, slots)
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        let shared = &self.shared;
        if shared.config.reader {
            let index = shared.index();
            return Ok(keys
                .iter()
                .take_while(|k| shared.stored_len(&index, k).is_some())
                .count());
        }
        let index = shared.index();
        Ok(keys.iter().take_while(|k| index.contains(k)).count())
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
                    let path = shared.layout.page_path(key)?;
                    // Forgotten and unlinked together (see the index).
                    let mut index = shared.index();
                    if !index.remove(key) {
                        return Ok(false);
                    }
                    match fs::remove_file(&path) {
                        Ok(()) => {
                            shared.stats.removed();
                            Ok(true)
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                        Err(e) => {
                            shared.stats.errors(1);
                            Err(TierError::io("remove page", Some(key), Some(path), e))
                        }
                    }
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

    async fn clear(&self) -> Result<(), TierError> {
        // Forgotten at once, before anything awaits: a clear that is dropped has happened (its
        // pages read as absent), never later than a put made after it.
        let keys = self.shared.index().drain();
        let shared = Arc::clone(&self.shared);
        tokio::task::spawn_blocking(move || {
            let mut first_err = None;
            for key in keys {
                let Ok(path) = shared.layout.page_path(&key) else {
                    continue;
                };
                // Unlinked with the index locked, and only if no put stored the key since.
                let index = shared.index();
                if index.contains(&key) {
                    continue;
                }
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        first_err.get_or_insert(TierError::io(
                            "clear page",
                            Some(&key),
                            Some(path),
                            e,
                        ));
                    }
                }
            }
            first_err.map_or(Ok(()), Err)
        })
        .await
        .map_err(|e| TierError::Unavailable(format!("clear task failed: {e}")))?
    }
}
