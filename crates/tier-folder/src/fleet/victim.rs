//! A victim of eviction: unlinked if it is still the file the scan saw, else spared and put
//! back without ever replacing a newer file.

use std::fs;
use std::io;
use std::path::Path;

use super::layout::{FileStamp, FolderPage, Layout};
use crate::perms::rename_noreplace;

/// What became of a victim.
pub(super) enum Victim {
    /// Unlinked: its bytes are free.
    Evicted(u64),
    /// Stored again, read or removed since the scan: left as it is now, with the bytes of an
    /// older file freed where a newer one had taken its name.
    Spared(u64),
}

/// A way to move a file from one path to another.
pub(super) type Move = fn(&Path, &Path) -> io::Result<()>;

/// How a spared victim is put back without replacing a newer file: a hard link
/// (`fs::hard_link`), else a rename that never replaces ([`rename_noreplace`]).
pub(super) struct PutBack {
    pub link: Move,
    pub noreplace: Move,
}

/// The filesystem's own ways.
pub(super) fn put_back() -> PutBack {
    PutBack {
        link: |from, to| fs::hard_link(from, to),
        noreplace: rename_noreplace,
    }
}

/// Unlinks a victim if it is still the file `page` describes (see [`Victim`]); a spared one
/// is put back by `put_back`.
pub(super) fn unlink_if_unchanged(
    layout: &Layout,
    page: &FolderPage,
    put_back: PutBack,
) -> io::Result<Victim> {
    unlink_if(
        layout,
        &page.path,
        |m| FileStamp::of(m) == page.stamp,
        put_back,
    )
}

/// Unlinks the file at `path` if, once renamed aside (where no writer can land on it), it is
/// the one `still` recognises; else puts it back by `put_back`. The check and the unlink are
/// of one file: a page renamed in between (stored again) is never removed.
pub(super) fn unlink_if(
    layout: &Layout,
    path: &Path,
    still: impl Fn(&fs::Metadata) -> bool,
    put_back: PutBack,
) -> io::Result<Victim> {
    let aside = layout.temp_path(path);
    match fs::rename(path, &aside) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Victim::Spared(0)),
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(&aside)?;
    if still(&meta) {
        fs::remove_file(&aside)?;
        return Ok(Victim::Evicted(meta.len()));
    }
    // Stored again or read since the scan: back in place, unless a newer file has taken its
    // name meanwhile (then this one's bytes are freed, and counted by nobody else). A
    // filesystem without hard links gets a rename that never replaces. Where neither works it
    // cannot go back without risking a newer file's place: it is removed and its bytes freed
    // (left aside under a temp name, it was lost all the same and never subtracted).
    match (put_back.link)(&aside, path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            fs::remove_file(&aside)?;
            return Ok(Victim::Spared(meta.len()));
        }
        Err(_) => {
            return match (put_back.noreplace)(&aside, path) {
                Ok(()) => Ok(Victim::Spared(0)),
                Err(e) => {
                    if e.kind() != io::ErrorKind::AlreadyExists {
                        tracing::debug!(page = %path.display(), error = %e, "a spared victim cannot be put back: removed");
                    }
                    fs::remove_file(&aside)?;
                    Ok(Victim::Spared(meta.len()))
                }
            };
        }
    }
    fs::remove_file(&aside)?;
    Ok(Victim::Spared(0))
}
