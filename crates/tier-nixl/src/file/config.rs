//! The FILE tier's settings: plugin, engine, durability, direct I/O, checksums, limits.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tier_core::{TierError, TierInfo};
use tier_policy::PolicyKind;

use super::{BoundedIo, FileAccess, FolderMode, PageChecksum, SharedFolder, VerifyReads};
use crate::staging::ALIGN;

/// Largest staging buffer (it bounds the largest page).
const MAX_STAGING: usize = super::format::MAX_PAGE;
/// Most lanes (NIXL agents) one tier runs.
pub(crate) const MAX_LANES: usize = 64;

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
    /// The NIXL FILE plugin: one registration and one transfer per batch (per 2 MiB of it
    /// with checksums on, each part's pages checksummed as soon as it lands).
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

/// Configuration of a [`NixlFileTier`](super::NixlFileTier).
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
    /// Whether each page carries a checksum, verified as it is read.
    pub page_checksum: PageChecksum,
    /// How often a page's bytes are verified: once per file version (default) or every read.
    pub verify: VerifyReads,
    /// Byte capacity; pages the policy chooses are evicted beyond it. `None`: unbounded. In
    /// shared access, the capacity of the folders, whoever wrote them.
    pub capacity_bytes: Option<u64>,
    /// Which pages go first when the capacity is reached (any but TinyLFU, which is moka's).
    /// Shared folders evict the pages least recently used by any process instead.
    pub policy: PolicyKind,
    /// Pages the owner's index keeps in the policy's exact order: past them it carries that
    /// order over to sampled last use (as `policy = "sampled"` keeps from the start), about 63
    /// heap bytes per page instead of up to 670 (`auto`). Default 65,536.
    pub ordered_pages: usize,
    /// Bytes per staging buffer; also the largest page. Batches larger than this are split.
    pub staging_bytes: usize,
    /// Staging buffers, i.e. batches in flight at once. Staging memory is
    /// `staging_bytes x staging_buffers`.
    pub staging_buffers: usize,
    /// Bound on each NIXL transfer, and on each batch's file I/O where it is bounded.
    pub transfer_timeout: Duration,
    /// Whether a call may give up on file I/O that does not return (a hung mount).
    pub bounded_io: BoundedIo,
    /// Bytes that transfers which never finished may keep for good (a stuck disk) before the
    /// tier refuses new ones with an error.
    pub max_abandoned_bytes: usize,
    /// Folder holding `libnixl_capi.so`, searched before `$NIXL_LIB_DIR` and the defaults.
    pub runtime_dir: Option<PathBuf>,
    /// Whether the tier owns its folders, reads another process's, or shares them.
    pub access: FileAccess,
    /// Who may use the folders: this user (the default) or the folder's group.
    pub mode: FolderMode,
    /// Eviction lease, use-time refresh and watermarks of shared folders.
    pub shared: SharedFolder,
}

impl NixlFileConfig {
    /// The largest page the tier takes: one staging buffer's bytes, at most its capacity.
    pub fn max_page_bytes(&self) -> usize {
        let cap = self
            .capacity_bytes
            .map_or(usize::MAX, |c| c.min(usize::MAX as u64) as usize);
        crate::staging::align_up(self.staging_bytes).min(cap)
    }

    /// What the tier opened from this config is, known before it opens.
    pub fn tier_info(&self) -> TierInfo {
        TierInfo {
            name: self.name.clone(),
            kind: "nixl-file".into(),
            capacity_bytes: self.capacity_bytes,
            max_page_bytes: Some(self.max_page_bytes()),
            persistent: true,
        }
    }

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
            verify: VerifyReads::Once,
            capacity_bytes: None,
            policy: PolicyKind::default(),
            ordered_pages: super::index::ORDERED_PAGES,
            staging_bytes: 16 << 20,
            staging_buffers: 2,
            transfer_timeout: Duration::from_secs(30),
            bounded_io: BoundedIo::Auto,
            max_abandoned_bytes: crate::nixl::DEFAULT_ABANDON_LIMIT,
            runtime_dir: None,
            access: FileAccess::Owner,
            mode: FolderMode::Owner,
            shared: SharedFolder::default(),
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
                "tinylfu is moka's, for DRAM tiers; a file tier takes auto, lru, sieve, s3fifo, arc, prefix, radix, lfu or sampled",
            ));
        }
        if self.capacity_bytes == Some(0) {
            return Err(TierError::config(
                "capacity_bytes",
                "must be at least 1 byte (or unset)",
            ));
        }
        let shared = &self.shared;
        if !(shared.low_watermark > 0.0 && shared.low_watermark < 1.0) {
            return Err(TierError::config(
                "low_watermark",
                format!(
                    "must be above 0 and below 1 (a fraction of the capacity), not {}",
                    shared.low_watermark
                ),
            ));
        }
        if shared.lease.is_zero() {
            return Err(TierError::config("lease", "must be positive"));
        }
        if self.transfer_timeout.is_zero() {
            return Err(TierError::config("transfer_timeout", "must be positive"));
        }
        if self.plugin == FilePlugin::Posix {
            let asked = self.plugin_params.get("ios_pool_size");
            if let (Some(_), Err(e)) = (asked, crate::nixl::pool_size(asked.map(String::as_str))) {
                return Err(TierError::config(
                    "plugin_params",
                    format!("{} (0 for NIXL's default, else 64 to 65,536)", e.detail),
                ));
            }
        }
        Ok(())
    }
}
