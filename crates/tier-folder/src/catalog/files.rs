//! What the catalog does to a page's file alone: renaming a written page into shared folders
//! (counting exactly what it replaced), discarding a failed write's temp file, recognising what
//! someone planted under a name, and setting a file's use time.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

/// Whether what is at `path` is not a regular file (a link or a FIFO planted there).
pub(super) fn planted(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| !m.is_file())
}

/// Removes the temp file of a write that failed, its bytes given back to the filesystem at
/// once: a NIXL transfer that failed keeps its files open until its other I/O has ended (a
/// transfer timeout later, or for good), and a removed file's blocks stay taken while it is
/// open, so a full filesystem stayed full that long. Truncated only as a regular file opened
/// by its name, never through a link, never waiting on a FIFO.
pub(super) fn discard_temp(path: &Path) {
    let opened = crate::perms::open_existing(fs::OpenOptions::new().write(true), path, 0);
    if let Ok(file) = opened {
        let _ = file.set_len(0);
    }
    let _ = fs::remove_file(path);
}

pub(super) fn planted_error() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "the temp file was replaced by a link or another file that is not a regular file \
         (someone else may write the folder); not renamed in",
    )
}

/// Renames a written page file into shared folders; returns the bytes it adds to them: its
/// length if its name was free, less the file it replaced otherwise. A free name is taken
/// only while it is free, so processes storing one new page at once count it once (each
/// counted it whole before: the usage grew past the folders' bytes until the next full scan,
/// and eviction kept them that much below their capacity). The name is taken by
/// `RENAME_NOREPLACE`, or where the filesystem has none (GlusterFS's client, NFS) by a hard
/// link, which fails on a taken name on every client alike. A taken name's file is swapped
/// out (`RENAME_EXCHANGE`) and removed by this writer, which so knows exactly what it
/// replaced, whoever moves the name's file meanwhile (an evictor moving it aside between a
/// look at its length and a rename over it was subtracted twice). Where none of these works,
/// the page is counted as it was before.
pub(super) fn land_shared(temp: &Path, path: &Path, len: u64) -> std::io::Result<i64> {
    let unsupported = |e: &std::io::Error| {
        matches!(
            e.raw_os_error(),
            Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP | libc::EPERM | libc::EMLINK)
        )
    };
    // A name freed and taken again between the tries is tried once more, a few times at most.
    for _ in 0..4 {
        match crate::perms::rename_noreplace(temp, path) {
            Ok(()) => return Ok(len as i64),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) if unsupported(&e) => match fs::hard_link(temp, path) {
                Ok(()) => {
                    if let Err(e) = fs::remove_file(temp) {
                        tracing::warn!(path = %temp.display(), error = %e, "a landed page's temp name is left");
                    }
                    return Ok(len as i64);
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) || unsupported(&e) => {}
                Err(e) => return Err(e),
            },
            Err(e) => return Err(e),
        }
        match crate::perms::rename_exchange(temp, path) {
            Ok(()) => {
                // The file replaced is at the temp name now, this writer's alone.
                let replaced = fs::symlink_metadata(temp)
                    .ok()
                    .filter(fs::Metadata::is_file)
                    .map_or(0, |m| m.len());
                if let Err(e) = fs::remove_file(temp) {
                    tracing::warn!(path = %temp.display(), error = %e, "a replaced page file is left under a temp name");
                }
                return Ok(len as i64 - replaced as i64);
            }
            // The name was freed meanwhile (its file moved aside): taken again if still free.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) && temp.exists() => continue,
            Err(e) if unsupported(&e) => break,
            Err(e) => return Err(e),
        }
    }
    let replaced = fs::metadata(path).map_or(0, |m| m.len());
    match fs::rename(temp, path) {
        Ok(()) => {}
        // GlusterFS's client may answer a rename over a name another client unlinks at that
        // moment with `ENOENT`, the file moved all the same: the temp name, this writer's
        // alone, is gone. The page landed, and the unlink may take it, as a moment later.
        Err(e)
            if e.raw_os_error() == Some(libc::ENOENT)
                && fs::symlink_metadata(temp).is_err_and(|e| e.kind() == ErrorKind::NotFound) =>
        {
            tracing::debug!(path = %path.display(), "a rename answered ENOENT and moved the page");
        }
        Err(e) => return Err(e),
    }
    Ok(len as i64 - replaced as i64)
}

/// Sets a page file's use time (its modification time) to now; a file gone meanwhile is left.
pub(super) fn touch(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
    ];
    // SAFETY: a valid C string and two timespecs, as utimensat takes them. A link planted
    // under a page's name is touched itself, never what it names.
    unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
}
