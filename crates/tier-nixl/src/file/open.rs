//! Opening the tier: folders created and locked, leftovers of crashed writes removed, the
//! pages present indexed, one NIXL backend per lane created (none for the syscalls engine), path
//! mode and direct I/O probed.

use std::fs::{self, File};
use std::os::unix::io::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tier_core::{StatsRecorder, TierError, WriteOrder};

use super::catalog::Catalog;
use super::fleet::Fleet;
use super::index::PageIndex;
use super::io::{self, Engine, FileIo, FileMode, NixlEngine, Syscalls};
use super::layout::Layout;
use super::perms::{self, FolderMode};
use super::{
    DirectIo, Durability, FileAccess, FileEngine, FilePlugin, NixlFileConfig, PageChecksum,
    PathModeChoice, Shared, SharedLocks, VerifyReads,
};
use crate::nixl::Agent;
use crate::staging::StagingPool;

const LOCK_FILE: &str = ".kvtier.lock";
const LOCK_WAIT: Duration = Duration::from_secs(5);

impl Shared {
    /// Opens the tier, leaving the scan of its folders to [`opening`](super::opening)
    /// (`opened` tells when it is done).
    pub(super) fn open(
        config: NixlFileConfig,
        opened: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Self, TierError> {
        // The syscalls engine moves every byte itself: no runtime, agent or registration.
        let runtime = match config.engine {
            FileEngine::Nixl => Some(crate::runtime::load(config.runtime_dir.as_deref())?),
            FileEngine::Syscalls => None,
        };
        let layout = Layout::create(&config.dirs, config.mode)?;
        let index = PageIndex::new(config.policy)
            .ok_or_else(|| {
                TierError::config("policy", format!("{} is not for file tiers", config.policy))
            })?
            .ordered_up_to(config.ordered_pages);
        let locks = match config.access {
            FileAccess::Reader => Vec::new(),
            // Nothing to lock with: sharers cannot keep an owner out (see `SharedLocks::None`).
            FileAccess::Shared if config.shared.locks == SharedLocks::None => Vec::new(),
            access => layout
                .dirs()
                .iter()
                .map(|d| lock_folder(&d.join(LOCK_FILE), access, config.mode))
                .collect::<Result<Vec<_>, _>>()?,
        };
        for dir in layout.dirs() {
            tier_folder::marker::check_folder(
                dir,
                config.access != FileAccess::Reader,
                config.mode,
            )?;
        }
        let catalog = match config.access {
            FileAccess::Owner => Catalog::owned(layout, index),
            FileAccess::Reader => Catalog::read_only(layout),
            FileAccess::Shared => {
                warn_of_node_local_locks(&layout);
                let fleet = Fleet::open(
                    &layout,
                    config.capacity_bytes,
                    config.shared,
                    config.transfer_timeout,
                )?;
                Catalog::shared(layout, fleet)
            }
        };

        let plugin = config.plugin.nixl_name();
        let backends = match config.engine {
            FileEngine::Nixl => (0..config.staging_buffers)
                .map(|lane| create_backend(&config, lane))
                .collect::<Result<Vec<_>, _>>()?,
            FileEngine::Syscalls => Vec::new(),
        };
        let mode = match (config.path_mode, backends.first()) {
            // The syscalls engine opens every file itself.
            (_, None) | (PathModeChoice::Off, _) => FileMode::Fd,
            (choice, Some(backend)) => match (choice, io::probe_path_mode(backend)) {
                (PathModeChoice::On, FileMode::Fd) => {
                    return Err(TierError::config(
                        "path_mode",
                        "path mode was required, but this NIXL runtime ignores path metaInfo (NIXL >= 1.3 has it)",
                    ))
                }
                (_, probed) => probed,
            },
        };
        let direct = match config.direct_io {
            DirectIo::Off => false,
            choice => match catalog
                .layout()
                .dirs()
                .iter()
                .find(|d| !supports_direct_io(d, config.mode))
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
        let remote = catalog
            .layout()
            .dirs()
            .iter()
            .any(|d| super::probe::may_hang(d));
        let bounded = config.bounded_io.applies_to(catalog.layout().dirs());
        match &runtime {
            Some(runtime) => tracing::info!(
                tier = %config.name, %runtime, plugin, %mode, direct, bounded_io = bounded,
                access = ?config.access,
                "NIXL FILE tier open"
            ),
            None => tracing::info!(
                tier = %config.name, engine = "syscalls", direct, bounded_io = bounded,
                access = ?config.access,
                "NIXL FILE tier open"
            ),
        }
        let staging = StagingPool::new(
            backends.first().cloned(),
            config.staging_buffers,
            config.staging_bytes,
        );
        let verified =
            (config.verify == VerifyReads::Once).then(|| Arc::new(io::VerifiedFiles::default()));
        let sync = config.durability == Durability::Power;
        let checksums = config.page_checksum == PageChecksum::Crc32c;
        let engines: Vec<Engine> = match config.engine {
            FileEngine::Nixl => backends
                .into_iter()
                .map(|backend| {
                    Engine::Nixl(NixlEngine {
                        backend,
                        mode,
                        timeout: config.transfer_timeout,
                        sync,
                        checksums,
                        file_mode: config.mode,
                        remote,
                    })
                })
                .collect(),
            FileEngine::Syscalls => (0..config.staging_buffers.max(1))
                .map(|_| {
                    Engine::Syscalls(Syscalls {
                        sync,
                        mode: config.mode,
                    })
                })
                .collect(),
        };
        let lanes = engines
            .into_iter()
            .map(|engine| FileIo {
                engine,
                checksums,
                verified: verified.clone(),
                reads_held: !remote,
            })
            .collect();
        // The capacity is enforced once the index holds the pages found (see `opening`).
        Ok(Self {
            bounded,
            catalog: Arc::new(catalog),
            lanes,
            staging,
            inflight: Arc::new(tokio::sync::Semaphore::new(config.staging_buffers)),
            stats: StatsRecorder::default(),
            order: WriteOrder::new(),
            direct,
            opened,
            _locks: locks,
            config,
        })
    }
}

/// The pool of I/O requests a POSIX backend is given unless `plugin_params` sets
/// `ios_pool_size`: NIXL's default (65,536) allocates about 11.5 MiB per lane up front; this
/// one about 1.4 MiB. Transfers are kept within it (see [`crate::nixl::IoRoom`]).
pub const POSIX_IOS_POOL: usize = 8192;

/// Creates one lane's agent and backend. POSIX gets `use_uring = true` unless the config picks
/// an I/O engine itself (measured faster here for 2 MiB pages), and a pool of
/// [`POSIX_IOS_POOL`] I/O requests unless it sets one; if the runtime cannot use io_uring,
/// the plugin's defaults are used for its engine.
pub(super) fn create_backend(
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
    let mut params = config.plugin_params.clone();
    if config.plugin == FilePlugin::Posix {
        params
            .entry("ios_pool_size".into())
            .or_insert_with(|| POSIX_IOS_POOL.to_string());
    }
    let engines = ["use_uring", "use_aio", "use_posix_aio"];
    let tuned =
        config.plugin == FilePlugin::Posix && !engines.iter().any(|k| params.contains_key(*k));
    if tuned {
        let mut uring = params.clone();
        uring.insert("use_uring".into(), "true".into());
        match agent.create_backend(plugin, &uring) {
            Ok(backend) => return Ok(limited(backend)),
            Err(e) => {
                tracing::warn!(error = %e, "POSIX with io_uring unavailable; using the plugin's defaults")
            }
        }
    }
    agent
        .create_backend(plugin, &params)
        .map(limited)
        .map_err(|e| backend_err(format!("creating the {plugin} backend: {e}")))
}

/// Locks a storage folder for `access`: alone for an owner, beside other sharers for a
/// sharer. Waits up to [`LOCK_WAIT`] for an owner's lock (a restarting owner's predecessor may
/// still be exiting); a folder held in the other mode is refused at once, naming both modes.
///
/// The lock file is opened for reading and writing (NFSv4 refuses a shared lock on a
/// descriptor without read access), never through a link.
fn lock_folder(
    path: &std::path::Path,
    access: FileAccess,
    mode: FolderMode,
) -> Result<File, TierError> {
    lock_folder_between(path, access, mode, |_| {})
}

/// Where [`lock_folder`] lets a test act, as another process could.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LockStep {
    /// The lock was refused.
    Refused,
    /// A shared lock could be had beside the holders: sharers hold it, or nobody now.
    SharersSeen,
}

/// [`lock_folder`], calling `between` at each [`LockStep`].
fn lock_folder_between(
    path: &std::path::Path,
    access: FileAccess,
    mode: FolderMode,
    mut between: impl FnMut(LockStep),
) -> Result<File, TierError> {
    let file = mode
        .open_fixed(path)
        .map_err(|e| TierError::io("open lock file", None, Some(path.to_path_buf()), e))?;
    let folder = path.parent().unwrap_or(path).display().to_string();
    let op = if access == FileAccess::Shared {
        libc::LOCK_SH
    } else {
        libc::LOCK_EX
    };
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        if try_flock(&file, op).map_err(|e| lock_error(path, access, e))? {
            return Ok(file);
        }
        between(LockStep::Refused);
        if access == FileAccess::Owner && sharers_may_hold(&file) {
            between(LockStep::SharersSeen);
            // Free now: the holder left between the refusal and the probe.
            if try_flock(&file, op).map_err(|e| lock_error(path, access, e))? {
                return Ok(file);
            }
            // Refused again: sharers hold it, unless an owner took it since the probe (then
            // it is waited for as any owner's lock).
            if sharers_may_hold(&file) {
                return Err(TierError::config(
                    "access",
                    format!(
                        "storage folder {folder} is open in access = \"shared\" by other \
                         processes; access = \"owner\" needs it alone (open it shared too, or \
                         stop them)"
                    ),
                ));
            }
        }
        if Instant::now() >= deadline {
            let message = match access {
                FileAccess::Shared => format!(
                    "storage folder {folder} is owned by another process (access = \"owner\", \
                     lock held for over {LOCK_WAIT:?}); access = \"shared\" cannot open it \
                     beside an owner"
                ),
                _ => format!(
                    "storage folder {folder} is in use by another kvtier tier (access = \"owner\", \
                     lock held for over {LOCK_WAIT:?})"
                ),
            };
            return Err(TierError::Unavailable(message));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a shared lock can be had on `lock`'s file beside its holders (sharers hold it, or
/// nobody: an owner's lock excludes it). Tried on a new open of the same file through its
/// descriptor (never its path, which another process could swap for a link or a FIFO) and let
/// go at once.
fn sharers_may_hold(lock: &File) -> bool {
    let again = fs::OpenOptions::new()
        .read(true)
        .open(format!("/proc/self/fd/{}", lock.as_raw_fd()));
    again.is_ok_and(|probe| try_flock(&probe, libc::LOCK_SH).unwrap_or(false))
}

/// The error of an `flock` on a folder's lock file that failed: where the filesystem has no
/// locks (3FS's FUSE client, NFS without a lock manager) a config error naming the setting
/// that opens it anyway; otherwise an I/O error.
fn lock_error(path: &std::path::Path, access: FileAccess, e: std::io::Error) -> TierError {
    let folder = path.parent().unwrap_or(path).display();
    let unsupported = matches!(
        e.raw_os_error(),
        Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL)
    );
    match (unsupported, access) {
        (false, _) => TierError::io("lock storage folder", None, Some(path.to_path_buf()), e),
        (true, FileAccess::Shared) => TierError::config(
            "locks",
            format!(
                "storage folder {folder} cannot be locked ({e}): on a filesystem without locks \
                 set locks = \"none\" (`kvtier probe {folder}` tells what it has)"
            ),
        ),
        (true, _) => TierError::config(
            "access",
            format!(
                "storage folder {folder} cannot be locked ({e}): access = \"owner\" needs a lock \
                 to hold it alone; on a filesystem without locks open it with access = \"shared\" \
                 and locks = \"none\""
            ),
        ),
    }
}

/// Tries an `flock` without waiting: whether it was taken.
fn try_flock(file: &File, op: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: a valid open fd.
    if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// Warns where a shared folder's mount says its locks hold per node only: the folders' usage
/// then drifts and evictors on several nodes may run at once (bytes stay right; see
/// `docs/sharing.md`).
fn warn_of_node_local_locks(layout: &Layout) {
    for dir in layout.dirs() {
        let Some((filesystem, options)) = super::probe::mount_of(dir) else {
            continue;
        };
        if let Some(why) = super::probe::node_local_option(&filesystem, &options) {
            tracing::warn!(
                dir = %dir.display(),
                "a shared folder whose locks hold on this node only ({why}): its usage may \
                 drift and several evictors may run at once"
            );
        }
    }
}

/// Whether a file of `dir` opens with `O_DIRECT`: a probe file under a name no one can guess,
/// created exclusively, removed after.
fn supports_direct_io(dir: &std::path::Path, mode: FolderMode) -> bool {
    let probe = dir.join(format!(".kvtier-direct-probe-{:016x}", perms::nonce()));
    let ok = mode.create_new(&probe, libc::O_DIRECT).is_ok();
    let _ = fs::remove_file(&probe);
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An owner's lock let go between the refusal and the probe, and taken by another owner
    /// before the retry: the folder is another owner's (waited for, then had), not "open in
    /// access = shared" (refused at once, as it was).
    #[test]
    fn an_owner_lock_passed_between_two_owners_is_waited_for_not_called_shared() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE);
        let holder = || {
            let f = FolderMode::Owner.open_fixed(&path).unwrap();
            assert!(try_flock(&f, libc::LOCK_EX).unwrap());
            f
        };
        let mut first = Some(holder());
        let mut released = None;
        let opened =
            lock_folder_between(
                &path,
                FileAccess::Owner,
                FolderMode::Owner,
                |step| match step {
                    LockStep::Refused => drop(first.take()),
                    LockStep::SharersSeen if released.is_none() => {
                        let next = holder();
                        released = Some(std::thread::spawn(move || {
                            std::thread::sleep(Duration::from_millis(300));
                            drop(next);
                        }));
                    }
                    LockStep::SharersSeen => {}
                },
            );
        released
            .expect("another owner took the lock")
            .join()
            .unwrap();
        let file = opened.expect("the folder, once the other owner let go");
        assert!(!sharers_may_hold(&file), "held alone");
    }

    /// A filesystem without locks is a config error naming the setting that opens it anyway;
    /// any other failure stays an I/O error.
    #[test]
    fn a_folder_that_cannot_be_locked_names_the_setting() {
        let path = std::path::Path::new("/pages/.kvtier.lock");
        let unsupported = || std::io::Error::from_raw_os_error(libc::ENOLCK);
        match lock_error(path, FileAccess::Shared, unsupported()) {
            TierError::Config { field, message } => {
                assert_eq!(field, "locks");
                assert!(message.contains("locks = \"none\"") && message.contains("/pages"));
            }
            other => panic!("a sharer: {other:?}"),
        }
        match lock_error(path, FileAccess::Owner, unsupported()) {
            TierError::Config { field, message } => {
                assert_eq!(field, "access");
                assert!(message.contains("access = \"shared\""), "{message}");
            }
            other => panic!("an owner: {other:?}"),
        }
        let eio = std::io::Error::from_raw_os_error(libc::EIO);
        assert!(matches!(
            lock_error(path, FileAccess::Shared, eio),
            TierError::Io { .. }
        ));
    }
}
