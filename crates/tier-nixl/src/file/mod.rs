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
//!
//! NIXL logs the path-mode probe's expected failure to stderr at every start
//! (`POSIX path-mode open failed ... /nonexistent-kvtier-path-mode-probe-...`): it is the probe
//! working, not an error.

mod index;
mod io;
mod layout;

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tier_core::{
    async_trait, GetResult, Lookup, Page, PageKey, PutResult, ReadSlot, RemoveResult,
    StatsRecorder, StorageTier, TierError, TierInfo, TierStats,
};

pub use io::FileMode;
pub use layout::{route_hash, BUCKETS};

use crate::nixl::Agent;
use crate::staging::{align_up, StagingLease, StagingPool, ALIGN};
use index::PageIndex;
use io::{FileIo, ReadItem, Staged, WriteItem};
use layout::Layout;

/// Which NIXL FILE plugin moves the bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PathModeChoice {
    /// Probe, and use path mode where the runtime supports it.
    #[default]
    Auto,
    /// Require path mode: opening fails on a runtime without it.
    On,
    /// Use fd mode even where path mode is available.
    Off,
}

/// Whether to bypass the page cache (`O_DIRECT`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
    /// Request synchronous writes (durable on return, slower).
    pub sync_writes: bool,
    /// Byte capacity; least recently used pages are evicted beyond it. `None`: unbounded.
    pub capacity_bytes: Option<u64>,
    /// Bytes per staging buffer; also the largest page. Batches larger than this are split.
    pub staging_bytes: usize,
    /// Staging buffers, i.e. batches in flight at once. Staging memory is
    /// `staging_bytes x staging_buffers`.
    pub staging_buffers: usize,
    /// Bound on each NIXL transfer.
    pub transfer_timeout: Duration,
    /// Folder holding `libnixl_capi.so`, searched before `$NIXL_LIB_DIR` and the defaults.
    pub runtime_dir: Option<PathBuf>,
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
            sync_writes: false,
            capacity_bytes: None,
            staging_bytes: 16 << 20,
            staging_buffers: 2,
            transfer_timeout: Duration::from_secs(30),
            runtime_dir: None,
        }
    }

    fn validate(&self) -> Result<(), TierError> {
        if self.staging_bytes < ALIGN {
            return Err(TierError::config(
                "staging_bytes",
                format!("must be at least {ALIGN} bytes"),
            ));
        }
        if self.staging_buffers == 0 {
            return Err(TierError::config("staging_buffers", "must be at least 1"));
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
    io: FileIo,
    staging: Arc<StagingPool>,
    stats: StatsRecorder,
    direct: bool,
    max_page: usize,
    // Held for the tier's life: the exclusive locks on the storage folders.
    _locks: Vec<File>,
}

const LOCK_FILE: &str = ".kvtier.lock";
const LOCK_WAIT: Duration = Duration::from_secs(5);

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
        self.shared.io.mode
    }

    /// Whether pages go through `O_DIRECT` where aligned.
    pub fn direct_io(&self) -> bool {
        self.shared.direct
    }

    /// The canonical storage folders.
    pub fn dirs(&self) -> &[PathBuf] {
        self.shared.layout.dirs()
    }
}

impl Shared {
    fn open(config: NixlFileConfig) -> Result<Self, TierError> {
        let runtime = crate::runtime::load(config.runtime_dir.as_deref())?;
        let layout = Layout::create(&config.dirs)?;
        let locks = layout
            .dirs()
            .iter()
            .map(|d| lock_folder(&d.join(LOCK_FILE)))
            .collect::<Result<Vec<_>, _>>()?;
        let scan = layout.scan()?;
        let mut index = PageIndex::default();
        let mut found = scan.pages;
        found.sort_by_key(|(_, _, mtime)| *mtime);
        for (key, len, _) in found {
            index.insert(key, len);
        }

        let plugin = config.plugin.nixl_name();
        let backend_err = |message: String| TierError::Backend {
            backend: format!("nixl {plugin}"),
            key: None,
            message,
        };
        let agent = Agent::new(&format!("kvtier-{}-{}", config.name, std::process::id()))
            .map_err(|e| backend_err(format!("creating the agent: {e}")))?;
        let backend = agent
            .create_backend(plugin, &config.plugin_params)
            .map_err(|e| backend_err(format!("creating the {plugin} backend: {e}")))?;
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
            pages = index.pages(), temps_removed = scan.temps_removed,
            "NIXL FILE tier open"
        );
        let staging = StagingPool::new(
            Arc::clone(&backend),
            config.staging_buffers,
            config.staging_bytes,
        );
        let max_page = staging.buf_bytes();
        let io = FileIo {
            backend,
            mode,
            timeout: config.transfer_timeout,
            sync: config.sync_writes,
        };
        let shared = Self {
            layout,
            index: Mutex::new(index),
            io,
            staging,
            stats: StatsRecorder::default(),
            direct,
            max_page,
            _locks: locks,
            config,
        };
        shared.enforce_capacity();
        Ok(shared)
    }

    fn index(&self) -> MutexGuard<'_, PageIndex> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
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

    /// Evicts least recently used pages until the capacity holds; deletes their files.
    fn enforce_capacity(&self) {
        let Some(capacity) = self.config.capacity_bytes else {
            return;
        };
        let victims = self.index().evict_to(capacity);
        for key in victims {
            self.stats.eviction();
            if let Ok(path) = self.layout.page_path(&key) {
                let _ = fs::remove_file(path);
            }
        }
    }

    /// Writes one staged chunk and commits what succeeded (blocking thread).
    fn write_chunk(&self, mut lease: StagingLease, items: Vec<WriteItem>) -> Vec<PutResult> {
        let outcome = self.io.write_batch(lease.buf(), &items);
        if outcome.poisoned {
            lease.leak();
        } else {
            drop(lease);
        }
        {
            let mut index = self.index();
            for (item, result) in items.iter().zip(&outcome.results) {
                match result {
                    Ok(()) => {
                        index.insert(item.key.clone(), item.data.len() as u64);
                        self.stats.put(item.data.len());
                    }
                    Err(_) => self.stats.errors(1),
                }
            }
        }
        self.enforce_capacity();
        outcome.results
    }

    /// Reads one chunk into staging (blocking thread); unpins its pages.
    fn read_chunk(
        &self,
        mut lease: StagingLease,
        items: Vec<ReadItem>,
    ) -> (Option<StagingLease>, Vec<Result<Staged, TierError>>) {
        let outcome = self.io.read_batch(lease.buf(), &items);
        let mut index = self.index();
        for (item, result) in items.iter().zip(&outcome.results) {
            index.unpin(&item.key);
            match result {
                Ok(Staged::At(_)) => index.touch(&item.key),
                Ok(Staged::Missing) => {
                    // Deleted underneath us: forget it.
                    index.remove(&item.key);
                }
                Err(_) => {}
            }
        }
        drop(index);
        if outcome.poisoned {
            lease.leak();
            return (None, outcome.results);
        }
        (Some(lease), outcome.results)
    }
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

    async fn put(&self, pages: &[Page]) -> Vec<PutResult> {
        let shared = &self.shared;
        let mut results: Vec<Option<PutResult>> = (0..pages.len()).map(|_| None).collect();
        // A key repeated in the batch: only its last page is written.
        let mut last: HashMap<&PageKey, usize> = HashMap::new();
        for (i, page) in pages.iter().enumerate() {
            last.insert(&page.key, i);
        }
        let mut items: Vec<(usize, WriteItem)> = Vec::new();
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
                Ok(_) if last[&page.key] != i => results[i] = Some(Ok(())),
                Ok((direct, path)) => {
                    let temp = shared.layout.temp_path(&path);
                    items.push((
                        i,
                        WriteItem {
                            key: page.key.clone(),
                            data: page.data.clone(),
                            path,
                            temp,
                            direct,
                        },
                    ));
                }
            }
        }
        let lens: Vec<(usize, usize)> = items
            .iter()
            .enumerate()
            .map(|(n, (_, it))| (n, it.data.len()))
            .collect();
        let mut slots: Vec<Option<(usize, WriteItem)>> = items.into_iter().map(Some).collect();
        let mut tasks = Vec::new();
        for chunk in chunks(&lens, shared.staging.buf_bytes()) {
            let (positions, chunk_items): (Vec<usize>, Vec<WriteItem>) =
                chunk.iter().filter_map(|&n| slots[n].take()).unzip();
            let shared = Arc::clone(shared);
            tasks.push((
                positions,
                tokio::spawn(async move {
                    let lease = shared.staging.acquire().await?;
                    tokio::task::spawn_blocking(move || shared.write_chunk(lease, chunk_items))
                        .await
                        .map_err(|e| TierError::Unavailable(format!("write task failed: {e}")))
                }),
            ));
        }
        for (positions, task) in tasks {
            let outcome = task
                .await
                .map_err(|e| TierError::Unavailable(format!("write task failed: {e}")))
                .and_then(|r| r);
            match outcome {
                Ok(chunk_results) => {
                    for (pos, r) in positions.into_iter().zip(chunk_results) {
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
        let mut items: Vec<(usize, ReadItem)> = Vec::new();
        {
            let mut index = shared.index();
            for (i, slot) in slots.iter().enumerate() {
                match index.len_of(&slot.key) {
                    None => results[i] = Some(Ok(Lookup::Miss)),
                    Some(len) if len as usize != slot.buf.len() => {
                        results[i] = Some(Err(TierError::LengthMismatch {
                            key: slot.key.clone(),
                            stored: len as usize,
                            buffer: slot.buf.len(),
                        }))
                    }
                    Some(len) => {
                        let len = len as usize;
                        let planned = shared
                            .direct_for(&slot.key, len)
                            .or(Ok(false))
                            .and_then(|direct| Ok((direct, shared.layout.page_path(&slot.key)?)));
                        match planned {
                            Ok((direct, path)) => {
                                index.pin(&slot.key);
                                items.push((
                                    i,
                                    ReadItem {
                                        key: slot.key.clone(),
                                        path,
                                        len,
                                        direct,
                                    },
                                ));
                            }
                            Err(e) => results[i] = Some(Err(e)),
                        }
                    }
                }
            }
        }
        let lens: Vec<(usize, usize)> = items
            .iter()
            .enumerate()
            .map(|(n, (_, it))| (n, it.len))
            .collect();
        let mut pending: Vec<Option<(usize, ReadItem)>> = items.into_iter().map(Some).collect();
        let mut tasks = Vec::new();
        for chunk in chunks(&lens, shared.staging.buf_bytes()) {
            let (positions, chunk_items): (Vec<usize>, Vec<ReadItem>) =
                chunk.iter().filter_map(|&n| pending[n].take()).unzip();
            let shared = Arc::clone(shared);
            tasks.push((
                positions,
                tokio::spawn(async move {
                    let lease = match shared.staging.acquire().await {
                        Ok(lease) => lease,
                        Err(e) => {
                            let mut index = shared.index();
                            for item in &chunk_items {
                                index.unpin(&item.key);
                            }
                            return Err(e);
                        }
                    };
                    tokio::task::spawn_blocking(move || shared.read_chunk(lease, chunk_items))
                        .await
                        .map_err(|e| TierError::Unavailable(format!("read task failed: {e}")))
                }),
            ));
        }
        for (positions, task) in tasks {
            let outcome = task
                .await
                .map_err(|e| TierError::Unavailable(format!("read task failed: {e}")))
                .and_then(|r| r);
            match outcome {
                Ok((lease, chunk_results)) => {
                    for (pos, r) in positions.into_iter().zip(chunk_results) {
                        let slot = &mut slots[pos];
                        results[pos] = Some(match (r, &lease) {
                            (Ok(Staged::At(off)), Some(lease)) => {
                                let len = slot.buf.len();
                                slot.buf.copy_from_slice(&lease.bytes()[off..off + len]);
                                Ok(Lookup::Hit)
                            }
                            (Ok(Staged::Missing), _) => Ok(Lookup::Miss),
                            (Ok(Staged::At(_)), None) => Err(TierError::Timeout {
                                op: "NIXL transfer",
                                after: shared.config.transfer_timeout,
                            }),
                            (Err(e), _) => Err(e),
                        });
                    }
                }
                Err(e) => {
                    let msg = e.to_string();
                    for pos in positions {
                        results[pos] = Some(Err(TierError::Unavailable(msg.clone())));
                    }
                }
            }
        }
        results
            .into_iter()
            .zip(slots.iter())
            .map(|(r, slot)| {
                let r = r.unwrap_or_else(|| {
                    Err(TierError::Unavailable("page was not scheduled".into()))
                });
                match &r {
                    Ok(Lookup::Hit) => shared.stats.hit(slot.buf.len()),
                    Ok(Lookup::Miss) => shared.stats.miss(),
                    Err(_) => shared.stats.errors(1),
                }
                r
            })
            .collect()
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        let index = self.shared.index();
        Ok(keys.iter().take_while(|k| index.contains(k)).count())
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        let shared = Arc::clone(&self.shared);
        let keys = keys.to_vec();
        let n = keys.len();
        tokio::task::spawn_blocking(move || {
            keys.iter()
                .map(|key| {
                    if !shared.index().remove(key) {
                        return Ok(false);
                    }
                    let path = shared.layout.page_path(key)?;
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
        let shared = Arc::clone(&self.shared);
        tokio::task::spawn_blocking(move || {
            let keys = shared.index().drain();
            let mut first_err = None;
            for key in keys {
                let Ok(path) = shared.layout.page_path(&key) else {
                    continue;
                };
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
