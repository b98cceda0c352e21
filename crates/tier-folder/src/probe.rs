//! What a folder's filesystem gives a FILE tier (`kvtier probe DIR`): whether it is local,
//! whether `flock` excludes at all and across clients, extended attributes, `O_DIRECT`, hard
//! links and `renameat2(RENAME_NOREPLACE)`. Shared folders depend on none of these for their
//! bytes; locks that hold only per node cost capacity accuracy (see `docs/sharing.md`).

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::perms::nonce;

/// `statfs` types of filesystems whose clients share one cache (one machine): ext2/3/4, XFS,
/// Btrfs, tmpfs, ZFS, overlayfs, ramfs.
pub const LOCAL_FILESYSTEMS: [i64; 7] = [
    0xEF53,
    0x5846_5342,
    0x9123_683E,
    0x0102_1994,
    0x2FC1_2FC1,
    0x794C_7630,
    0x8584_58F6,
];

/// How far `flock` excludes on a folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockReach {
    /// Across clients: tried through a second mount of the folder.
    AcrossClients,
    /// Across the processes of this machine, which is the only one (a local filesystem).
    LocalFilesystem,
    /// Only among this node's processes: the mount option that says so, or the second mount
    /// through which a lock did not exclude.
    ThisNodeOnly(String),
    /// Across clients as far as the filesystem type and its mount options tell (not tried:
    /// give a second mount to try).
    LikelyAcrossClients(String),
    /// Not known across clients (a FUSE filesystem may lock per node): give a second mount to
    /// try.
    Unknown(String),
    /// No exclusion at all, even between two descriptors of this process.
    None(String),
}

/// What [`probe_folder`] found.
#[derive(Debug, Clone)]
pub struct FolderProbe {
    /// The folder, resolved.
    pub dir: PathBuf,
    /// Its mount's filesystem type and options, as `/proc/self/mounts` gives them.
    pub filesystem: String,
    /// The mount's options.
    pub mount_options: String,
    /// Whether its clients share one cache (a local disk or memory).
    pub local: bool,
    /// How far `flock` excludes.
    pub locks: LockReach,
    /// Whether files keep `user.*` extended attributes (kvtier needs none).
    pub xattrs: bool,
    /// Whether files open with `O_DIRECT`.
    pub direct_io: bool,
    /// Whether hard links work (a shared evictor spares a page it would delete with one).
    pub hard_links: bool,
    /// Whether `renameat2(RENAME_NOREPLACE)` works (the fallback where links do not).
    pub rename_noreplace: bool,
}

/// Probes `dir` (which must exist and be writable); `other`, the same folder through a second
/// mount (another client), lets the locks be tried across clients. Leaves nothing behind.
pub fn probe_folder(dir: &Path, other: Option<&Path>) -> io::Result<FolderProbe> {
    let dir = dir.canonicalize()?;
    let (filesystem, mount_options) = mount_of(&dir).unwrap_or_default();
    let scratch = Scratch(dir.join(format!(".kvtier-probe-{:016x}", nonce())));
    fs::create_dir(&scratch.0)?;
    let file = scratch.0.join("file");
    fs::write(&file, b"kvtier")?;
    let local = statfs_type(&dir).is_some_and(|t| LOCAL_FILESYSTEMS.contains(&t));
    let locks = lock_reach(&file, other, &scratch.0, local, &filesystem, &mount_options)?;
    let xattrs = xattr::set(&file, "user.kvtier.probe", b"1").is_ok()
        && xattr::get(&file, "user.kvtier.probe")
            .ok()
            .flatten()
            .as_deref()
            == Some(&b"1"[..]);
    let direct_io = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&file)
        .is_ok();
    let hard_links = fs::hard_link(&file, scratch.0.join("link")).is_ok();
    let rename_noreplace =
        super::perms::rename_noreplace(&file, &scratch.0.join("renamed")).is_ok();
    Ok(FolderProbe {
        dir,
        filesystem,
        mount_options,
        local,
        locks,
        xattrs,
        direct_io,
        hard_links,
        rename_noreplace,
    })
}

/// The probe's scratch folder, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn lock_reach(
    file: &Path,
    other: Option<&Path>,
    scratch: &Path,
    local: bool,
    filesystem: &str,
    options: &str,
) -> io::Result<LockReach> {
    let holder = File::open(file)?;
    if let Err(e) = flock(&holder, libc::LOCK_EX | libc::LOCK_NB) {
        return Ok(LockReach::None(format!("flock fails: {e}")));
    }
    if flock(&File::open(file)?, libc::LOCK_EX | libc::LOCK_NB).is_ok() {
        return Ok(LockReach::None(
            "a second descriptor takes the lock a first one holds".into(),
        ));
    }
    if let Some(other) = other {
        let name = scratch.file_name().unwrap_or_default();
        let through = other.join(name).join("file");
        let seen = (0..50).any(|_| {
            through.exists() || {
                std::thread::sleep(std::time::Duration::from_millis(100));
                false
            }
        });
        if !seen {
            return Err(io::Error::other(format!(
                "{} does not show what was written through {}: not the same folder",
                other.display(),
                scratch.display()
            )));
        }
        return Ok(
            match flock(&File::open(&through)?, libc::LOCK_EX | libc::LOCK_NB) {
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => LockReach::AcrossClients,
                Err(e) => LockReach::ThisNodeOnly(format!("through {}: {e}", other.display())),
                Ok(()) => LockReach::ThisNodeOnly(format!(
                    "a lock held through {} does not exclude through {}",
                    scratch.display(),
                    other.display()
                )),
            },
        );
    }
    if local {
        return Ok(LockReach::LocalFilesystem);
    }
    Ok(node_local_option(filesystem, options).map_or_else(
        || {
            if filesystem.starts_with("fuse") {
                LockReach::Unknown(format!(
                    "{filesystem}: a FUSE filesystem without flock support locks per node"
                ))
            } else {
                LockReach::LikelyAcrossClients(filesystem.to_string())
            }
        },
        LockReach::ThisNodeOnly,
    ))
}

/// The mount option by which `filesystem` locks per node, if it has one.
pub fn node_local_option(filesystem: &str, options: &str) -> Option<String> {
    let has = |o: &str| options.split(',').any(|x| x == o);
    let says = match filesystem {
        "nfs" | "nfs4" => ["nolock", "local_lock=flock", "local_lock=all"]
            .into_iter()
            .find(|o| has(o)),
        "lustre" => ["localflock", "noflock"].into_iter().find(|o| has(o)),
        _ => None,
    };
    says.map(|o| format!("{filesystem} mounted with {o}"))
}

/// The filesystem type and options of the mount holding `dir` (the longest mount point that
/// is a prefix of it).
pub fn mount_of(dir: &Path) -> Option<(String, String)> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, point, fstype, options) = (
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
            );
            let point = point.replace("\\040", " ");
            dir.starts_with(&point)
                .then(|| (point.len(), fstype.to_string(), options.to_string()))
        })
        .max_by_key(|(len, _, _)| *len)
        .map(|(_, fstype, options)| (fstype, options))
}

/// Whether I/O under `dir` can hang: a filesystem not known to be local (network, FUSE), or
/// one whose type cannot be read.
pub fn may_hang(dir: &Path) -> bool {
    statfs_type(dir).is_none_or(|t| !LOCAL_FILESYSTEMS.contains(&t))
}

fn statfs_type(dir: &Path) -> Option<i64> {
    let path = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statfs writes into the zeroed struct it is given.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a writable struct.
    (unsafe { libc::statfs(path.as_ptr(), &mut fs) } == 0).then_some(fs.f_type as i64)
}

fn flock(file: &File, op: i32) -> io::Result<()> {
    // SAFETY: a valid open fd.
    if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_local_mount_options_are_named() {
        assert_eq!(
            node_local_option("nfs4", "rw,vers=4.2,local_lock=flock"),
            Some("nfs4 mounted with local_lock=flock".into())
        );
        assert_eq!(
            node_local_option("nfs", "rw,nolock,vers=3"),
            Some("nfs mounted with nolock".into())
        );
        assert_eq!(node_local_option("nfs4", "rw,local_lock=none"), None);
        assert_eq!(
            node_local_option("lustre", "rw,localflock"),
            Some("lustre mounted with localflock".into())
        );
        assert_eq!(node_local_option("lustre", "rw,flock"), None);
    }

    #[test]
    fn a_local_folder_probes_as_one_machine_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = probe_folder(dir.path(), None).unwrap();
        assert!(p.local, "{p:?}");
        assert_eq!(p.locks, LockReach::LocalFilesystem);
        assert!(p.hard_links && p.rename_noreplace, "{p:?}");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0, "left nothing");
    }
}
