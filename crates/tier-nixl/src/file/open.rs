//! Opening the tier: folders created and locked, leftovers of crashed writes removed, the
//! pages present indexed, one NIXL backend per lane created, path mode and direct I/O probed.

use std::fs::{self, File};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tier_core::{StatsRecorder, TierError, WriteOrder};

use super::catalog::Catalog;
use super::index::PageIndex;
use super::io::{self, FileIo, FileMode};
use super::layout::Layout;
use super::{
    checksum, DirectIo, Durability, FilePlugin, NixlFileConfig, PageChecksum, PathModeChoice,
    Shared,
};
use crate::nixl::Agent;
use crate::staging::StagingPool;

const LOCK_FILE: &str = ".kvtier.lock";
const LOCK_WAIT: Duration = Duration::from_secs(5);

impl Shared {
    pub(super) fn open(config: NixlFileConfig) -> Result<Self, TierError> {
        let runtime = crate::runtime::load(config.runtime_dir.as_deref())?;
        let layout = Layout::create(&config.dirs)?;
        let index = PageIndex::new(config.policy).ok_or_else(|| {
            TierError::config("policy", format!("{} is not for file tiers", config.policy))
        })?;
        let locks = if config.reader {
            Vec::new()
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
            locks
        };
        let (catalog, temps_removed) = Catalog::load(layout, index, config.reader)?;

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
            choice => match catalog
                .layout()
                .dirs()
                .iter()
                .find(|d| !supports_direct_io(d))
            {
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
            pages = catalog.pages(), temps_removed, reader = config.reader,
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
            catalog,
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
