//! Who may read a tier's folders, and making files there that no one else planted.
//!
//! A page is a prompt in another form, so folders are this user's alone by default (`0700`,
//! files `0600`); [`FolderMode::Group`] opens them to the folder's group for caches several
//! users share. Every file kvtier makes is created without following a symbolic link
//! (`O_NOFOLLOW`), new files exclusively (`O_EXCL`) under names no one can guess, and a
//! folder kvtier walks is used only if it is a real folder of the right owner.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use tier_core::TierError;

/// How long a folder another client just made may take to show through this one.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

/// Who may use a FILE tier's folders (in config files: `mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FolderMode {
    /// This user only: folders `0700`, files `0600`; a folder of another user is refused.
    #[default]
    Owner,
    /// The folder's group as well: folders `2770` (new files take the folder's group), files
    /// `0660`; a folder of another user is accepted when its group is one of this process's
    /// groups and others have no access to it.
    Group,
}

impl FolderMode {
    /// The mode of folders kvtier makes.
    pub fn dir_mode(self) -> u32 {
        match self {
            Self::Owner => 0o700,
            Self::Group => 0o2770,
        }
    }

    /// The mode of files kvtier makes.
    pub fn file_mode(self) -> u32 {
        match self {
            Self::Owner => 0o600,
            Self::Group => 0o660,
        }
    }

    /// Makes `dir` (and missing parents, with this mode) if needed, then [`claim`](Self::claim)s it.
    ///
    /// On a distributed filesystem another client making the same folder at once can fail
    /// this one's with `EEXIST` (its cache not yet showing the folder) or `ESTALE`: it is
    /// tried again, for a bounded while.
    pub fn create_storage_dir(self, dir: &Path) -> Result<(), TierError> {
        settle(
            || {
                DirBuilder::new()
                    .recursive(true)
                    .mode(self.dir_mode())
                    .create(dir)
            },
            |e| racing_client(e, dir),
        )
        .map_err(|e| {
            let not_a_folder = e.raw_os_error() == Some(libc::ENOTDIR)
                || fs::symlink_metadata(dir).is_ok_and(|m| !m.is_dir());
            if not_a_folder {
                TierError::config(
                    "dirs",
                    format!(
                        "{} is not a folder (it, or a folder above it, is a file)",
                        dir.display()
                    ),
                )
            } else {
                TierError::io("create storage folder", None, Some(dir.into()), e)
            }
        })?;
        self.claim(dir, true)
    }

    /// Makes a bucket folder if needed and checks it (see [`claim`](Self::claim)).
    ///
    /// On a distributed filesystem another client's `mkdir` can make this one's fail with
    /// `EEXIST` while this client's cache still says the folder is not there (GlusterFS does):
    /// it is looked for again, for a bounded while.
    pub fn create_bucket(self, bucket: &Path) -> Result<(), TierError> {
        match settle(
            || DirBuilder::new().mode(self.dir_mode()).create(bucket),
            |e| racing_client(e, bucket),
        ) {
            Ok(()) => self.past_umask(bucket, None),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => self.claim(bucket, false),
            Err(e) => Err(TierError::io(
                "create bucket folder",
                None,
                Some(bucket.into()),
                e,
            )),
        }
    }

    /// In group mode, gives what was just made (a folder at `path`, or `file`) the group's
    /// access that the process's umask took away; owner mode's needs no fixing.
    fn past_umask(self, path: &Path, file: Option<&File>) -> Result<(), TierError> {
        if self == Self::Owner {
            return Ok(());
        }
        let mode = if file.is_some() {
            self.file_mode()
        } else {
            self.dir_mode()
        };
        let perms = fs::Permissions::from_mode(mode);
        match file {
            Some(f) => f.set_permissions(perms),
            None => fs::set_permissions(path, perms),
        }
        .map_err(|e| TierError::io("set mode", None, Some(path.into()), e))
    }

    /// Checks that `dir` is a real folder (not a symbolic link) kvtier may trust: this user's,
    /// or in group mode one of its groups' with no access for others. A `storage` folder of
    /// this user's with more access than the mode gives is narrowed to it.
    pub fn claim(self, dir: &Path, storage: bool) -> Result<(), TierError> {
        let meta = fs::symlink_metadata(dir)
            .map_err(|e| TierError::io("inspect folder", None, Some(dir.into()), e))?;
        let refuse = |why: String| {
            Err(TierError::config(
                "dirs",
                format!("{}: {why}; kvtier will not use it", dir.display()),
            ))
        };
        // The storage folder itself may be reached through a link the config names
        // (canonicalised before this); a bucket may not.
        if !storage && meta.file_type().is_symlink() {
            return refuse("the bucket folder is a symbolic link".into());
        }
        let meta = if storage {
            fs::metadata(dir)
                .map_err(|e| TierError::io("inspect folder", None, Some(dir.into()), e))?
        } else {
            meta
        };
        if !meta.is_dir() {
            return refuse("not a folder".into());
        }
        let me = euid();
        let mine = meta.uid() == me;
        match self {
            Self::Owner if !mine => {
                return refuse(format!(
                    "owned by uid {}, not this user (uid {me}); mode = \"owner\" keeps pages \
                     in this user's folders (mode = \"group\" shares them with a group)",
                    meta.uid()
                ))
            }
            Self::Group if !(mine || (in_group(meta.gid()) && meta.mode() & 0o007 == 0)) => {
                return refuse(format!(
                    "owned by uid {} with group {} and mode {:o}: mode = \"group\" needs a \
                     folder of this process's groups that others cannot use",
                    meta.uid(),
                    meta.gid(),
                    meta.mode() & 0o7777
                ))
            }
            _ => {}
        }
        if storage {
            self.ancestors_hold(dir, &meta)?;
        }
        let wanted = self.dir_mode();
        if storage && mine && meta.mode() & 0o7777 != wanted {
            fs::set_permissions(dir, fs::Permissions::from_mode(wanted))
                .map_err(|e| TierError::io("set folder mode", None, Some(dir.into()), e))?;
        }
        Ok(())
    }

    /// Refuses a storage folder `dir` (canonical, `meta` its own) under a folder someone it
    /// does not trust can write: that someone could rename the storage folder away and put a
    /// folder of planted pages in its place. Trusted: this user, root, the storage folder's
    /// owner, and in group mode its group; a folder anyone may write is trusted only with the
    /// sticky bit (`/tmp`: no one renames what is not theirs).
    fn ancestors_hold(self, dir: &Path, meta: &fs::Metadata) -> Result<(), TierError> {
        let me = euid();
        for above in dir.ancestors().skip(1) {
            let Ok(m) = fs::symlink_metadata(above) else {
                continue;
            };
            let (mode, sticky) = (m.mode() & 0o7777, m.mode() & libc::S_ISVTX != 0);
            let why = if mode & 0o002 != 0 && !sticky {
                Some(format!(
                    "every user may write it (mode {mode:o}, no sticky bit)"
                ))
            } else if ![me, 0, meta.uid()].contains(&m.uid()) {
                Some(format!("it belongs to uid {}, who may write it", m.uid()))
            } else if mode & 0o020 != 0
                && !sticky
                && m.gid() != 0
                && !(self == Self::Group && m.gid() == meta.gid())
            {
                Some(format!(
                    "its group {} may write it (mode {mode:o}, no sticky bit)",
                    m.gid()
                ))
            } else {
                None
            };
            if let Some(why) = why {
                return Err(TierError::config(
                    "dirs",
                    format!(
                        "{} is under {}, and {why}: whoever can write it can put a folder of \
                         planted pages in the storage folder's place; use a folder under \
                         folders only you (or root) can write",
                        dir.display(),
                        above.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Whether a folder a scan is about to walk is still a real folder (a link put in a
    /// bucket's place after opening is not followed).
    pub fn walkable(bucket: &Path) -> bool {
        fs::symlink_metadata(bucket).is_ok_and(|m| m.is_dir())
    }

    /// Creates a new file for writing: never through a link, never one that exists. A file
    /// left at `path` by an earlier attempt of this process (names are unguessable) is
    /// replaced.
    pub fn create_new(self, path: &Path, custom_flags: i32) -> io::Result<File> {
        let open = || {
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(self.file_mode())
                .custom_flags(custom_flags | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path)?;
            self.past_umask(path, Some(&file))
                .map_err(|e| io::Error::other(e.to_string()))?;
            io::Result::Ok(file)
        };
        match open() {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                fs::remove_file(path)?;
                open()
            }
            other => other,
        }
    }

    /// Opens (creating if needed) a fixed-name file of the folder for reading and writing:
    /// never through a link, and only a regular file.
    pub fn open_fixed(self, path: &Path) -> io::Result<File> {
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(self.file_mode())
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path)
        };
        // On a distributed filesystem another client's create can make this one's fail with
        // `EEXIST` while this client's cache still says the file is not there (GlusterFS
        // does): it is opened again, for a bounded while.
        let file = settle(open, |e| e.kind() == io::ErrorKind::AlreadyExists)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        if meta.uid() == euid() && meta.mode() & 0o777 != self.file_mode() {
            self.past_umask(path, Some(&file))
                .map_err(|e| io::Error::other(e.to_string()))?;
        }
        Ok(file)
    }
}

/// Opens an existing file of a folder others may write, as `options` say (read, write),
/// with `custom_flags` added: never through a link, never waiting on a FIFO, and only a
/// regular file (anything else is `InvalidData`).
pub fn open_existing(
    options: &mut OpenOptions,
    path: &Path,
    custom_flags: i32,
) -> io::Result<File> {
    open_existing_with_metadata(options, path, custom_flags).map(|(file, _)| file)
}

/// [`open_existing`], with the metadata of the file it opened.
pub fn open_existing_with_metadata(
    options: &mut OpenOptions,
    path: &Path,
    custom_flags: i32,
) -> io::Result<(File, fs::Metadata)> {
    let file = options
        .custom_flags(
            custom_flags | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
        .open(path)?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    Ok((file, metadata))
}

/// Runs `attempt` again while its error is `unsettled` (another client's create showing as
/// `EEXIST` while this client's cache still says the entry is absent, as GlusterFS does), for
/// at most [`SETTLE`]; then its result stands.
/// Whether making the folder `dir` failed as another client's making it at once can make it
/// fail on a distributed filesystem: `EEXIST` while this client does not see it yet, or a
/// stale handle of a folder above it (GlusterFS gives both).
fn racing_client(e: &io::Error, dir: &Path) -> bool {
    let unseen = e.kind() == io::ErrorKind::AlreadyExists
        && fs::symlink_metadata(dir).is_err_and(|e| e.kind() == io::ErrorKind::NotFound);
    unseen || e.raw_os_error() == Some(libc::ESTALE)
}

fn settle<T>(
    mut attempt: impl FnMut() -> io::Result<T>,
    unsettled: impl Fn(&io::Error) -> bool,
) -> io::Result<T> {
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        match attempt() {
            Err(e) if unsettled(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// This process's effective user id.
fn euid() -> u32 {
    // SAFETY: geteuid takes nothing and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether `gid` is this process's effective group or one of its supplementary groups.
fn in_group(gid: u32) -> bool {
    // SAFETY: getegid takes nothing and cannot fail.
    if unsafe { libc::getegid() } == gid {
        return true;
    }
    let mut groups = vec![0 as libc::gid_t; 1024];
    // SAFETY: the buffer holds `groups.len()` entries.
    let n = unsafe { libc::getgroups(groups.len() as i32, groups.as_mut_ptr()) };
    n > 0 && groups[..n as usize].contains(&gid)
}

/// 64 random bits from the kernel, for names no one can guess.
pub fn nonce() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: writes at most 8 bytes into an 8-byte buffer.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != 8 {
        // getrandom cannot fail for 8 bytes once the pool is seeded; should it, the clock and
        // address of a local still make a name no other process predicts in advance.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        return t ^ (&bytes as *const _ as u64).rotate_left(32);
    }
    u64::from_ne_bytes(bytes)
}

/// Renames `from` to `to` unless `to` exists (`renameat2` with `RENAME_NOREPLACE`).
pub fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    renameat2(from, to, libc::RENAME_NOREPLACE)
}

/// Swaps the files at `from` and `to`, both of which must exist (`renameat2` with
/// `RENAME_EXCHANGE`).
pub fn rename_exchange(from: &Path, to: &Path) -> std::io::Result<()> {
    renameat2(from, to, libc::RENAME_EXCHANGE)
}

fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: two NUL-terminated paths that live across the call.
    let done = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_storage_folder_that_is_a_file_is_a_config_error_naming_it() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("plain-file");
        fs::write(&file, b"x").unwrap();
        for dir in [file.clone(), file.join("below")] {
            let err = FolderMode::Owner.create_storage_dir(&dir).unwrap_err();
            assert!(
                matches!(&err, TierError::Config { field, message }
                    if field == "dirs" && message.contains("plain-file")),
                "{err:?}"
            );
        }
    }
}
