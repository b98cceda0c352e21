//! The syscall engine: each page moved by `preadv`/`pwritev` on the calling thread, its
//! checksum taken as its bytes are read.

use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Duration;

use tier_core::TierError;

use crate::{checksum, format, perms, FolderMode};

use super::{op_name, Xfer, XferOp};
/// Linux's bound on the parts of one vectored call (`UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// The most a checksummed read moves before it checksums what it moved: small enough to be
/// checksummed from the core's own cache (a whole 2 MiB page has left it).
const HASH_CHUNK: usize = 256 << 10;

/// Moves one page with `preadv`/`pwritev` on the calling thread. The parts' addresses are
/// memory the caller keeps valid (and, for reads, exclusively lent) for the call. A read
/// given `crc` adds each piece's bytes to it as soon as they are read.
pub fn move_by_syscalls(
    op: XferOp,
    item: &Xfer,
    sync: bool,
    mode: FolderMode,
    mut crc: Option<&mut checksum::Crc>,
) -> Result<(), TierError> {
    let io_err =
        |e: std::io::Error| TierError::io(op_name(op), Some(&item.key), Some(item.path.clone()), e);
    // A read's file the tier holds open is read as it is; any other is opened here.
    let mut own = None;
    let file: &File = match (op, &item.opened) {
        (XferOp::Read, Some(file)) => file,
        _ => own.insert(open_page(&item.path, op, item.direct, sync, mode).map_err(io_err)?),
    };
    if op == XferOp::Read {
        // The page's file may have been replaced by one of another length since it was
        // planned: never serve a cut or overlong page.
        let stored = file.metadata().map_err(io_err)?.len();
        if stored != format::file_len(item.len) {
            return Err(TierError::LengthMismatch {
                key: item.key.clone(),
                stored: format::page_len(stored).unwrap_or(0) as usize,
                buffer: item.len,
            });
        }
    }
    let fd = file.as_raw_fd();
    // A page's parts in vectored calls: one call for all of them, or one per `HASH_CHUNK`
    // when checksumming; each resumes after what the previous one moved.
    let mut iov: Vec<libc::iovec> = item
        .parts
        .iter()
        .filter(|&&(_, len)| len > 0)
        .map(|&(addr, len)| libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        })
        .collect();
    let cap = if crc.is_some() {
        HASH_CHUNK
    } else {
        usize::MAX
    };
    let mut call: Vec<libc::iovec> = Vec::with_capacity(iov.len().min(IOV_MAX));
    let mut first = 0;
    let mut at = 0usize;
    while first < iov.len() {
        call.clear();
        let mut room = cap;
        for part in &iov[first..] {
            if room == 0 || call.len() == IOV_MAX {
                break;
            }
            let len = part.iov_len.min(room);
            call.push(libc::iovec {
                iov_base: part.iov_base,
                iov_len: len,
            });
            room -= len;
        }
        let count = call.len() as libc::c_int;
        // SAFETY: each iovec is live memory lent for this call (writable for reads).
        let n = unsafe {
            match op {
                XferOp::Write => libc::pwritev(fd, call.as_ptr(), count, at as libc::off_t),
                XferOp::Read => libc::preadv(fd, call.as_ptr(), count, at as libc::off_t),
            }
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(io_err(e));
        }
        if n == 0 {
            return Err(io_err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file ended before the page did",
            )));
        }
        let mut moved = n as usize;
        at += moved;
        while moved > 0 {
            let part = &mut iov[first];
            let step = moved.min(part.iov_len);
            if let Some(crc) = crc.as_deref_mut() {
                // SAFETY: the call has just written these bytes, into memory lent for it.
                crc.update(unsafe { std::slice::from_raw_parts(part.iov_base as *const u8, step) });
            }
            part.iov_base = (part.iov_base as usize + step) as *mut libc::c_void;
            part.iov_len -= step;
            moved -= step;
            if part.iov_len == 0 {
                first += 1;
            }
        }
    }
    if let (XferOp::Write, Some(created), Some(file)) = (op, &item.created, own) {
        created.keep(file);
    }
    Ok(())
}

/// Opens a page file to read (never through a link, never waiting on a FIFO, only a regular
/// file: see [`perms::open_existing`]), or creates a temp file to write (exclusively, never
/// through a link, with `mode`'s file mode; see [`FolderMode::create_new`]).
pub fn open_page(
    path: &Path,
    op: XferOp,
    direct: bool,
    sync: bool,
    mode: FolderMode,
) -> std::io::Result<File> {
    let mut flags = 0;
    if direct {
        flags |= libc::O_DIRECT;
    }
    if op == XferOp::Write {
        if sync {
            flags |= libc::O_DSYNC;
        }
        return mode.create_new(path, flags);
    }
    open_to_read(path, flags).map(|(file, _)| file)
}

/// Opens an existing page file to read, with `flags` added: never through a link, never
/// waiting on a FIFO, only a regular file (see [`perms::open_existing`]), without touching its
/// access time where the file is the caller's own. Returns it with its metadata.
pub fn open_to_read(path: &Path, flags: i32) -> std::io::Result<(File, std::fs::Metadata)> {
    // Reading a page must not write its inode: without O_NOATIME the first read after a
    // write updates the access time (relatime). Only the file's owner may ask for it.
    let open = || {
        let mut read = OpenOptions::new();
        read.read(true);
        match perms::open_existing_with_metadata(&mut read, path, flags | libc::O_NOATIME) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                perms::open_existing_with_metadata(&mut read, path, flags)
            }
            other => other,
        }
    };
    // A name another client of a network filesystem replaced answers `ESTALE` while this
    // client's caches still hold the old file (GlusterFS: for about 0.1 s, the kernel's own
    // retry included): tried again a few times, 1.3 s at most, before it is an error.
    let mut pause = Duration::from_millis(20);
    loop {
        match open() {
            Err(e) if e.raw_os_error() == Some(libc::ESTALE) && pause <= STALE_WAIT => {
                std::thread::sleep(pause);
                pause *= 2;
            }
            other => return other,
        }
    }
}

/// The longest pause between tries of an open that answered `ESTALE` (the pauses double
/// from 20 ms up to it: 1.26 s in all).
const STALE_WAIT: Duration = Duration::from_millis(640);
