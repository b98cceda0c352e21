//! A batch's files, opened by kvtier and registered with the lane's NIXL backend: by path
//! (path mode) or by descriptor (fd mode), a read's file another client replaced opened again.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tier_core::TierError;
use tier_folder::io::open_page;

use crate::batch::Failure;
use crate::nixl::{next_dev_id, Desc, MemKind, Registration, XferOp};

use super::super::super::FolderMode;
use super::super::{op_name, Xfer};
use super::{FileMode, NixlEngine};

/// Keeps a descriptor of the temp file a write created in its item (see [`Xfer::created`]), so
/// the trailer is appended through it; the transfer holds the file itself until it settles.
pub(super) fn keep_created(op: XferOp, item: &Xfer, file: &File) {
    if let (XferOp::Write, Some(created)) = (op, &item.created) {
        if let Ok(own) = file.try_clone() {
            created.keep(own);
        }
    }
}

/// How many times a read's files are opened again for a registration that failed on a file
/// another client replaced (see [`NixlEngine::register_files`]).
const REOPENS: usize = 3;

/// Whether the file open at descriptor `fd` can no longer be opened through it: another
/// client of a network filesystem replaced or removed it (`ESTALE`), or it is gone.
pub(super) fn replaced(fd: i32) -> bool {
    match File::open(format!("/proc/self/fd/{fd}")) {
        Ok(_) => false,
        Err(e) => {
            e.raw_os_error() == Some(libc::ESTALE) || e.kind() == std::io::ErrorKind::NotFound
        }
    }
}

/// A batch's files registered: the registration, the files it holds, each item's device id.
pub(super) type RegisteredFiles = (Registration, Vec<Arc<File>>, Vec<u64>);

/// What [`NixlEngine::open_files`] opened for a registration.
pub(super) struct Opened {
    /// The files kvtier opened (or holds open for a read), held until the transfer settles.
    pub(super) files: Vec<Arc<File>>,
    /// Per item: its registration's metaInfo (empty for a file registered by descriptor).
    pub(super) metas: Vec<Vec<u8>>,
    /// Per item: its device id.
    pub(super) dev_ids: Vec<u64>,
    /// (Item, descriptor) of each read's file NIXL opens again through `/proc/self/fd`.
    pub(super) by_descriptor: Vec<(usize, i32)>,
}

impl NixlEngine {
    /// Opens and registers the files of the items `which` of `items`: the registration, the
    /// files it holds, each item's device id (see [`Self::register_opened`]).
    pub(super) fn register_files(
        &self,
        op: XferOp,
        items: &[Xfer],
        which: &[usize],
    ) -> Result<RegisteredFiles, Failure> {
        let opened = self.open_files(op, items, which)?;
        self.register_opened(op, items, which, opened)
    }

    /// Registers files [`Self::open_files`] opened. A read's file another client replaced
    /// since kvtier opened it (NIXL opens it again through `/proc/self/fd/N`, which answers
    /// `ESTALE` on GlusterFS once the server let go of it) is opened again by its name, a few
    /// times; still replaced, it fails alone as `ESTALE`, which [`super::FileIo::read_all`]
    /// takes for a page replaced while it was read.
    pub(super) fn register_opened(
        &self,
        op: XferOp,
        items: &[Xfer],
        which: &[usize],
        mut opened: Opened,
    ) -> Result<RegisteredFiles, Failure> {
        let mut reopened = 0;
        loop {
            let descs: Vec<Desc<'_>> = which
                .iter()
                .enumerate()
                .map(|(n, &i)| Desc {
                    addr: 0,
                    len: items[i].len,
                    dev_id: opened.dev_ids[n],
                    meta: &opened.metas[n],
                })
                .collect();
            let e = match self.backend.register(MemKind::File, &descs) {
                Ok(registration) => return Ok((registration, opened.files, opened.dev_ids)),
                Err(e) => e,
            };
            let Some(&(i, _)) = opened.by_descriptor.iter().find(|(_, fd)| replaced(*fd)) else {
                return Err(Failure::Batch(format!(
                    "{}: registering files: {e}",
                    op_name(op)
                )));
            };
            if reopened == REOPENS {
                let item = &items[i];
                let stale = std::io::Error::from_raw_os_error(libc::ESTALE);
                let e = TierError::io(op_name(op), Some(&item.key), Some(item.path.clone()), stale);
                return Err(Failure::Item(i, e));
            }
            reopened += 1;
            tracing::debug!(path = %items[i].path.display(), "a page file was replaced before NIXL opened it: opened again");
            drop(opened);
            opened = self.open_files(op, items, which)?;
        }
    }

    /// Opens the files of the items `which` of `items` that kvtier opens (all in fd mode; in
    /// path mode, those NIXL is handed by descriptor), and says how each is registered.
    pub(super) fn open_files(
        &self,
        op: XferOp,
        items: &[Xfer],
        which: &[usize],
    ) -> Result<Opened, Failure> {
        let mut opened = Opened {
            files: Vec::new(),
            metas: Vec::new(),
            dev_ids: Vec::with_capacity(which.len()),
            by_descriptor: Vec::new(),
        };
        for &i in which {
            let item = &items[i];
            if let (XferOp::Read, Some(file), false) = (op, &item.opened, item.direct) {
                // The file the tier holds open for this read (see `Xfer::opened`): registered
                // by its descriptor (an empty metaInfo is fd mode in either NIXL), never
                // opened again.
                opened.metas.push(Vec::new());
                opened.dev_ids.push(file.as_raw_fd() as u64);
                opened.files.push(Arc::clone(file));
                continue;
            }
            let failed = |e| {
                Failure::Item(
                    i,
                    TierError::io(op_name(op), Some(&item.key), Some(item.path.clone()), e),
                )
            };
            match self.mode {
                FileMode::Fd => {
                    let file = open_page(&item.path, op, item.direct, self.sync, self.file_mode)
                        .map_err(failed)?;
                    opened.metas.push(Vec::new());
                    opened.dev_ids.push(file.as_raw_fd() as u64);
                    keep_created(op, item, &file);
                    opened.files.push(Arc::new(file));
                }
                FileMode::Path if op == XferOp::Write => {
                    // Made here, so it is new, this tier's mode, and not a planted link; NIXL
                    // is handed it by its descriptor (`/proc/self/fd/N` opens the very file
                    // that descriptor holds), so a link renamed over its name meanwhile (by
                    // a member of a group-mode folder's group) is never written through.
                    let file = self.file_mode.create_new(&item.path, 0).map_err(failed)?;
                    let held = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
                    opened
                        .metas
                        .push(path_meta(&held, op, item.direct, self.sync));
                    keep_created(op, item, &file);
                    opened.files.push(Arc::new(file));
                    opened.dev_ids.push(next_dev_id());
                }
                FileMode::Path if self.file_mode != FolderMode::Owner || self.remote => {
                    // Where others may write the folder, a read's file is opened here (never
                    // through a link, never a FIFO) and handed to NIXL by its descriptor: a
                    // link or FIFO planted under a page's name is never read or waited on.
                    // So it is where clients cache apart: a name another client replaced
                    // answers `ESTALE` for a moment, which `open_page` waits out.
                    let file = open_page(&item.path, op, item.direct, self.sync, self.file_mode)
                        .map_err(failed)?;
                    let held = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
                    opened
                        .metas
                        .push(path_meta(&held, op, item.direct, self.sync));
                    opened.by_descriptor.push((i, file.as_raw_fd()));
                    opened.files.push(Arc::new(file));
                    opened.dev_ids.push(next_dev_id());
                }
                FileMode::Path => {
                    opened
                        .metas
                        .push(path_meta(&item.path, op, item.direct, self.sync));
                    opened.dev_ids.push(next_dev_id());
                }
            }
        }
        Ok(opened)
    }
}

/// Path-mode metaInfo: `<ro|rw>[,create][,direct][,sync]:<path>`.
fn path_meta(path: &Path, op: XferOp, direct: bool, sync: bool) -> Vec<u8> {
    let mut meta = match op {
        XferOp::Read => b"ro".to_vec(),
        XferOp::Write => b"rw,create".to_vec(),
    };
    if direct {
        meta.extend_from_slice(b",direct");
    }
    if sync && op == XferOp::Write {
        meta.extend_from_slice(b",sync");
    }
    meta.push(b':');
    meta.extend_from_slice(OsStr::as_bytes(path.as_os_str()));
    meta
}
