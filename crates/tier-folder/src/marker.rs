//! Each storage folder holds [`MARKER`], naming the format of its pages. A folder with pages
//! but no marker holds pages of format 1 (checksums in `user.kvtier.crc32c`): opening it is
//! refused with an error saying so, never misread; unless a page's trailer shows it is of this
//! format (its marker not yet shown through a network filesystem's caches, or removed).

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use tier_core::TierError;

use crate::format::VERSION;
use crate::layout::{bucket_name, BUCKETS};
use crate::perms::{nonce, FolderMode};

/// The file in each storage folder naming its pages' format.
pub const MARKER: &str = ".kvtier.format";

/// How a storage folder's format was found at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FolderFormat {
    /// Its marker names this format.
    Current,
    /// No marker and no pages: a reader leaves it so; others mark it.
    Empty,
}

/// How long a folder holding pages but no marker is looked at again before it is taken for
/// format 1: a marker another client wrote shows through this client's caches within it.
const UNMARKED_WAIT: Duration = Duration::from_secs(3);

/// Checks that `dir` holds pages of this format, marking it if it holds none yet (`mark`:
/// not for readers). A folder with pages of format 1, or marked with another format, is
/// refused with an error naming the folder and what to do.
pub fn check_folder(dir: &Path, mark: bool, mode: FolderMode) -> Result<FolderFormat, TierError> {
    let marker = dir.join(MARKER);
    let refuse = |found: String| {
        TierError::config(
            "dirs",
            format!(
                "{} holds {found}; this kvtier reads and writes page format {VERSION} only: \
                 empty the folder or give the tier another one",
                dir.display()
            ),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    let unmarked_deadline = Instant::now() + UNMARKED_WAIT;
    loop {
        match read_marker(&marker) {
            Ok(Marker::Text(text)) if text == marker_text() => return Ok(FolderFormat::Current),
            Ok(Marker::NotAFile) => {
                return Err(TierError::config(
                    "dirs",
                    format!(
                        "{} is not a regular file (a link, FIFO, device or folder): kvtier \
                         reads no marker through it; remove it or give the tier another folder",
                        marker.display()
                    ),
                ))
            }
            // A marker being written by another process right now.
            Ok(Marker::Text(text)) if text.is_empty() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            // The marker's text is never quoted: it may be any file's.
            Ok(Marker::Text(text)) => {
                return Err(refuse(match marked_version(&text) {
                    Some(version) => format!("pages of format {version} (by its {MARKER})"),
                    None => format!("a {MARKER} that is no kvtier format marker"),
                }))
            }
            // Pages but no marker: another client's marker may not show through this one's
            // caches yet (GlusterFS: seen opening a folder its owner had just marked and
            // filled, through another mount). A page of this format proves the folder's; for
            // other files it waits, as a folder of format 1 stays so.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match unmarked_files(dir) {
                    Unmarked::None => break,
                    Unmarked::OfThisFormat if !mark => return Ok(FolderFormat::Current),
                    Unmarked::OfThisFormat => break,
                    Unmarked::Other => {}
                }
                if Instant::now() >= unmarked_deadline {
                    return Err(refuse(format!(
                        "pages of format 1 (no {MARKER}; their checksums in extended attributes)"
                    )));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            // Another client of a network filesystem renamed its marker in over the one this
            // client had cached: read it again by its path.
            Err(e) if e.raw_os_error() == Some(libc::ESTALE) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(TierError::io(
                    "read the folder's format",
                    None,
                    Some(marker),
                    e,
                ))
            }
        }
    }
    if !mark {
        return Ok(FolderFormat::Empty);
    }
    let temp = dir.join(format!("{MARKER}.{:016x}", nonce()));
    let write = || -> io::Result<()> {
        let mut file = mode.create_new(&temp, libc::O_CLOEXEC | libc::O_NOFOLLOW)?;
        file.write_all(marker_text().as_bytes())?;
        file.sync_all()?;
        fs::rename(&temp, &marker)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&temp);
        TierError::io("mark the folder's format", None, Some(marker.clone()), e)
    })?;
    Ok(FolderFormat::Current)
}

fn marker_text() -> String {
    format!("kvtier page format {VERSION}\n")
}

/// The most of a marker read: a marker is one short line.
const MARKER_CAP: u64 = 256;

/// What a folder's marker holds.
enum Marker {
    /// Its text (at most [`MARKER_CAP`] bytes, lossily decoded).
    Text(String),
    /// It is a link, FIFO, device or folder: never read through.
    NotAFile,
}

/// Reads the marker at `path` without following a link or waiting on a FIFO: only a regular
/// file's first [`MARKER_CAP`] bytes are read.
fn read_marker(path: &Path) -> io::Result<Marker> {
    use std::io::Read;
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(Marker::NotAFile),
        Err(e) => return Err(e),
    };
    if !file.metadata()?.is_file() {
        return Ok(Marker::NotAFile);
    }
    let mut bytes = Vec::new();
    file.take(MARKER_CAP).read_to_end(&mut bytes)?;
    Ok(Marker::Text(String::from_utf8_lossy(&bytes).into_owned()))
}

/// The format version a marker of any kvtier version names, if `text` is one.
fn marked_version(text: &str) -> Option<u32> {
    text.strip_prefix("kvtier page format ")?
        .strip_suffix('\n')?
        .parse()
        .ok()
}

/// What the buckets of a folder without a marker hold, besides kvtier's dot files.
#[derive(Debug, PartialEq, Eq)]
enum Unmarked {
    /// Nothing.
    None,
    /// A page of this format (its trailer says so), with or without other files.
    OfThisFormat,
    /// Files, none of them seen to be a page of this format.
    Other,
}

/// Looks at the first file of each bucket of `dir` (one listing entry per bucket at most, so
/// it costs about 256 directory reads however full the folder is), and at its trailer: a
/// regular file only, never through a link or waiting on a FIFO.
fn unmarked_files(dir: &Path) -> Unmarked {
    let mut found = Unmarked::None;
    for b in 0..BUCKETS {
        let Ok(mut entries) = fs::read_dir(dir.join(bucket_name(b))) else {
            continue;
        };
        let Some(entry) = entries.find_map(|e| {
            e.ok()
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        }) else {
            continue;
        };
        if of_this_format(&entry.path()) {
            return Unmarked::OfThisFormat;
        }
        found = Unmarked::Other;
    }
    found
}

/// Whether the file at `path` ends with a trailer of this format.
fn of_this_format(path: &Path) -> bool {
    crate::perms::open_existing(OpenOptions::new().read(true), path, 0)
        .is_ok_and(|file| crate::format::ends_in_this_format(&file))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A marker planted as a link to another file, or a FIFO, or holding another file's text,
    /// is refused at once, and nothing it holds reaches the error (a link to a credentials
    /// file was read through and its text quoted; a FIFO made the open wait for ever).
    #[test]
    fn a_planted_marker_is_refused_at_once_and_never_quoted() {
        let secret = "aws_secret_access_key = NOT-FOR-LOGS";
        let elsewhere = tempfile::tempdir().unwrap();
        let credentials = elsewhere.path().join("credentials");
        fs::write(&credentials, format!("{secret}\n")).unwrap();
        type Plant<'a> = &'a dyn Fn(&Path);
        let planted: [(&str, Plant<'_>); 4] = [
            ("a link", &|m| {
                std::os::unix::fs::symlink(&credentials, m).unwrap()
            }),
            ("a FIFO", &|m| {
                let c = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a valid C string.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }),
            ("another file's text", &|m| fs::write(m, secret).unwrap()),
            ("a folder", &|m| fs::create_dir(m).unwrap()),
        ];
        for (what, plant) in planted {
            let dir = tempfile::tempdir().unwrap();
            plant(&dir.path().join(MARKER));
            let (sent, answered) = std::sync::mpsc::channel();
            let path = dir.path().to_path_buf();
            std::thread::spawn(move || {
                let _ = sent.send(check_folder(&path, true, FolderMode::Owner));
            });
            let outcome = answered
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("the open waited on a marker that is {what}"));
            let message = match outcome {
                Err(e @ TierError::Config { .. }) => e.to_string(),
                other => panic!("a marker that is {what} was taken: {other:?}"),
            };
            assert!(
                !message.contains("NOT-FOR-LOGS"),
                "a marker that is {what} was quoted: {message}"
            );
            assert!(message.contains(MARKER), "{message}");
        }
        assert_eq!(
            fs::read_to_string(&credentials).unwrap(),
            format!("{secret}\n"),
            "the link's target is untouched"
        );
    }

    /// A folder of pages of this format whose marker has not shown through this client (or
    /// was removed) is of this format at once: its pages' trailers say so. (It waited 3 s for
    /// the marker and then was refused as format 1, which two clients of one GlusterFS volume
    /// under load outlasted.) A folder of other files still waits and is refused.
    #[test]
    fn pages_of_this_format_prove_a_folder_without_its_marker() {
        let dir = tempfile::tempdir().unwrap();
        let bucket = dir.path().join(crate::layout::bucket_name(7));
        fs::create_dir_all(&bucket).unwrap();
        let key = tier_core::PageKey::new("k").unwrap();
        let mut page = vec![7u8; 4096];
        page.extend_from_slice(&tier_format::encode(&key, 4096, None));
        fs::write(bucket.join("page"), &page).unwrap();
        let started = Instant::now();
        assert_eq!(
            check_folder(dir.path(), false, FolderMode::Owner).ok(),
            Some(FolderFormat::Current)
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert!(!dir.path().join(MARKER).exists(), "a reader marks nothing");
        assert_eq!(
            check_folder(dir.path(), true, FolderMode::Owner).ok(),
            Some(FolderFormat::Current)
        );
        assert_eq!(
            fs::read_to_string(dir.path().join(MARKER)).unwrap(),
            marker_text()
        );

        let old = tempfile::tempdir().unwrap();
        let bucket = old.path().join(crate::layout::bucket_name(7));
        fs::create_dir_all(&bucket).unwrap();
        fs::write(bucket.join("page"), &page[..4096]).unwrap();
        let refused = check_folder(old.path(), true, FolderMode::Owner)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("format 1"), "{refused}");
    }

    /// A marker of another kvtier format is named by its version.
    #[test]
    fn a_marker_of_another_format_is_named_by_its_version() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(MARKER), "kvtier page format 9\n").unwrap();
        let message = check_folder(dir.path(), false, FolderMode::Owner)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(message.contains("pages of format 9"), "{message}");
    }

    /// A folder whose pages show through this client before its marker does (another client
    /// marked and filled it; GlusterFS's caches): it is read as the format the marker says
    /// once the marker shows, not refused as format 1 at once.
    #[test]
    fn pages_whose_marker_shows_late_are_of_the_marked_format() {
        let dir = tempfile::tempdir().unwrap();
        let bucket = dir.path().join(crate::layout::bucket_name(7));
        fs::create_dir_all(&bucket).unwrap();
        fs::write(bucket.join("page"), b"bytes").unwrap();
        let marker = dir.path().join(MARKER);
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(500));
            fs::write(marker, marker_text()).unwrap();
        });
        let format = check_folder(dir.path(), false, FolderMode::Owner);
        late.join().unwrap();
        assert!(
            matches!(format, Ok(FolderFormat::Current)),
            "{:?}",
            format.err()
        );
    }
}
