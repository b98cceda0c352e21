//! Page files in the stored format of [`tier_format`] (a page's bytes, then a 32-byte trailer
//! that says what they are), so a file carries its own proof on every filesystem (no extended
//! attributes, which NFSv3, 3FS and EFS lack). The trailer is written after the page's bytes to
//! the temp file, before the rename. Each folder's format marker: [`crate::marker`].

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use tier_core::PageKey;

use tier_format::{decode, encode};
pub use tier_format::{sealed_len as file_len, Trailer, TRAILER, VERSION};

/// The largest page a FILE tier stores (a staging buffer bounds it): its index holds lengths
/// in 32 bits.
pub const MAX_PAGE: usize = 1 << 30;

/// The length of the page a page file of `file_len` bytes holds, if it can hold one of this
/// tier's: a longer file is none of its pages.
pub fn page_len(file_len: u64) -> Option<u32> {
    tier_format::page_len(file_len)
        .filter(|&len| len <= MAX_PAGE as u64)
        .and_then(|len| u32::try_from(len).ok())
}

/// Appends the trailer of `key`'s `page_len` bytes to the temp file at `path`, which holds
/// them: through `created`, the descriptor its engine created and wrote it with, where there
/// is one (its `O_DIRECT` cleared: a trailer is not a block), else opened again; synced to the
/// disk if `sync`. Returns the file, open: its identity once renamed in (see `io::FileId`) is
/// the version this process wrote.
pub fn seal(
    created: Option<File>,
    path: &Path,
    key: &PageKey,
    page_len: usize,
    crc: Option<u32>,
    sync: bool,
) -> io::Result<File> {
    let file = match created {
        Some(file) => {
            buffered(&file)?;
            file
        }
        None => super::perms::open_existing(OpenOptions::new().write(true), path, 0)?,
    };
    file.write_all_at(&encode(key, page_len as u64, crc), page_len as u64)?;
    if sync {
        file.sync_data()?;
    }
    Ok(file)
}

/// Clears `O_DIRECT` on `file`'s open description, if set.
fn buffered(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL and F_SETFL read and set the flags of a descriptor `file` owns.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & libc::O_DIRECT != 0
        // SAFETY: as above.
        && unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_DIRECT) } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads the trailer of an open page file, as `key`'s.
pub fn read_from(file: &File, key: &PageKey) -> io::Result<Trailer> {
    Ok(match last_bytes(file)? {
        Some((t, len)) => decode(&t, key, len),
        None => Trailer::Not("shorter than a trailer"),
    })
}

/// Whether an open file ends in a trailer of this format, whatever page it names.
pub fn ends_in_this_format(file: &File) -> bool {
    last_bytes(file).is_ok_and(|last| last.is_some_and(|(t, _)| tier_format::is_of_this_format(&t)))
}

/// An open file's last [`TRAILER`] bytes and its length, if it is that long.
fn last_bytes(file: &File) -> io::Result<Option<([u8; TRAILER as usize], u64)>> {
    let len = file.metadata()?.len();
    if len < TRAILER {
        return Ok(None);
    }
    let mut t = [0u8; TRAILER as usize];
    file.read_exact_at(&mut t, len - TRAILER)?;
    Ok(Some((t, len)))
}

/// What a page file's trailer records of the page's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Their CRC-32C.
    Crc(u32),
    /// None: a whole page written with `page_checksum = "off"` (by this process before, or by
    /// another sharing the folder), which a reader that checks serves as it is.
    Unchecked,
}

/// What the open page `file` (at `path`) records for `key`'s page; `None` if it is not that
/// page (see [`Trailer`]).
pub fn recorded_in(file: &File, key: &PageKey, path: &Path) -> Option<Recorded> {
    match read_from(file, key) {
        Ok(Trailer::Page(Some(crc))) => Some(Recorded::Crc(crc)),
        Ok(Trailer::Page(None)) => Some(Recorded::Unchecked),
        Ok(Trailer::Not(why)) => {
            tracing::debug!(key = %key, path = %path.display(), why, "not a page file");
            None
        }
        Err(e) => {
            tracing::debug!(key = %key, path = %path.display(), error = %e, "page trailer unread");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::{Read, Write};

    fn key(s: &str) -> PageKey {
        PageKey::new(s).unwrap()
    }

    /// A file longer than the largest page with its trailer holds none of the tier's pages,
    /// so its length never reaches the index's 32 bits.
    #[test]
    fn a_file_past_the_largest_page_holds_no_page() {
        assert_eq!(page_len(file_len(MAX_PAGE)), Some(MAX_PAGE as u32));
        assert_eq!(page_len(file_len(MAX_PAGE + 1)), None);
        assert_eq!(page_len(u64::from(u32::MAX) + TRAILER + 1), None);
        assert_eq!(page_len(TRAILER - 1), None);
    }

    #[test]
    fn a_sealed_file_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("page");
        fs::write(&path, b"0123456789").unwrap();
        seal(None, &path, &key("k"), 10, Some(99), true).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), file_len(10));
        let recorded = |key: &PageKey| recorded_in(&File::open(&path).unwrap(), key, &path);
        assert_eq!(recorded(&key("k")), Some(Recorded::Crc(99)));
        assert_eq!(recorded(&key("other")), None);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"x").unwrap();
        assert_eq!(recorded(&key("k")), None, "grown");
        let mut bytes = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut bytes).unwrap();
        assert_eq!(
            &bytes[..10],
            b"0123456789",
            "the page's bytes stay in place"
        );
    }

    /// A temp file is sealed through the descriptor its engine wrote it with: its name is
    /// not opened again (here it is gone), and a descriptor opened for direct I/O takes the
    /// 32-byte trailer, which direct I/O would refuse.
    #[test]
    fn a_file_is_sealed_through_the_descriptor_that_wrote_it() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("page");
        let page = vec![7u8; 4096];
        fs::write(&path, &page).unwrap();
        let direct = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .expect("the temp folder's filesystem has direct I/O");
        let moved = dir.path().join("renamed");
        fs::rename(&path, &moved).unwrap();
        assert!(seal(None, &path, &key("k"), 4096, Some(5), false).is_err());
        let file = seal(Some(direct), &path, &key("k"), 4096, Some(5), false).unwrap();
        assert_eq!(file.metadata().unwrap().len(), file_len(4096));
        assert_eq!(
            recorded_in(&File::open(&moved).unwrap(), &key("k"), &moved),
            Some(Recorded::Crc(5))
        );
    }
}
