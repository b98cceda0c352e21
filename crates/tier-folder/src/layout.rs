//! Where a page lives on disk: key -> stable 64-bit hash -> one of N storage folders and one of
//! 256 bucket sub-folders; file name = the key, escaped so it is always a single plain name.
//!
//! On-disk format (do not change without a migration): hash = FNV-1a 64 of the key's bytes,
//! then the splitmix64 finaliser; folder = hash % N; bucket = (hash >> 32) & 0xff as two hex
//! digits. Names keep `[A-Za-z0-9_-]` and non-leading `.`, and write every other byte as
//! `%XX`, so no name is `.`, `..`, holds `/`, or starts with `.`. Writes go to
//! `.tmp-<host>-<pid>-<nonce><seq>-<name>` in the same bucket (the nonce random per layout, so
//! no one can plant a file under the name first) and are renamed into place when complete.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tier_core::{PageKey, TierError};

use super::perms::{nonce, FolderMode};
pub use tier_format::route_hash;

/// Bucket folders per storage folder.
pub const BUCKETS: usize = 256;
/// Longest escaped file name kvtier writes (temp prefix included it stays under NAME_MAX).
pub const MAX_NAME: usize = 200;
const TEMP_PREFIX: &str = ".tmp-";

/// The storage folders and the routing of keys into them.
#[derive(Debug)]
pub struct Layout {
    dirs: Vec<PathBuf>,
    mode: FolderMode,
    /// The start of this tier's temp file names: the pid space, the process and a nonce of
    /// this tier (see [`temp_owner`]).
    own_temps: String,
    temp_seq: AtomicU64,
}

impl Layout {
    /// Creates (if needed), checks and canonicalises the folders, rejecting duplicates by real
    /// path and folders `mode` does not trust, then creates or checks all bucket folders in each.
    pub fn create(dirs: &[PathBuf], mode: FolderMode) -> Result<Self, TierError> {
        if dirs.is_empty() {
            return Err(TierError::config(
                "dirs",
                "at least one storage folder is needed",
            ));
        }
        let mut seen = HashSet::new();
        let mut real = Vec::with_capacity(dirs.len());
        for (i, dir) in dirs.iter().enumerate() {
            mode.create_storage_dir(dir)?;
            let canon = dir
                .canonicalize()
                .map_err(|e| TierError::io("resolve storage folder", None, Some(dir.clone()), e))?;
            if !seen.insert(canon.clone()) {
                return Err(TierError::config(
                    format!("dirs[{i}]"),
                    format!(
                        "{} is the same folder as an earlier entry ({})",
                        dir.display(),
                        canon.display()
                    ),
                ));
            }
            real.push(canon);
        }
        let layout = Self {
            dirs: real,
            mode,
            own_temps: format!(
                "{TEMP_PREFIX}{}-{}-{:016x}",
                pid_space_tag(),
                std::process::id(),
                nonce()
            ),
            temp_seq: AtomicU64::new(0),
        };
        layout.create_buckets()?;
        Ok(layout)
    }

    /// The canonical storage folders.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Who may use the folders, and so the mode of the files made in them.
    pub fn mode(&self) -> FolderMode {
        self.mode
    }

    /// Makes every bucket folder (path mode cannot create parent folders), and refuses one
    /// that is a link or another user's.
    pub fn create_buckets(&self) -> Result<(), TierError> {
        for dir in &self.dirs {
            for b in 0..BUCKETS {
                self.mode.create_bucket(&dir.join(bucket_name(b)))?;
            }
        }
        Ok(())
    }

    /// The bucket folders of `dir` a scan may walk: each a real folder, never a link put in
    /// its place (skipped, with a warning).
    fn walkable_buckets(dir: &Path) -> impl Iterator<Item = PathBuf> + '_ {
        (0..BUCKETS).map(|b| dir.join(bucket_name(b))).filter(|bucket| {
            let ok = FolderMode::walkable(bucket);
            if !ok && fs::symlink_metadata(bucket).is_ok() {
                tracing::warn!(bucket = %bucket.display(), "a bucket that is not a real folder is skipped");
            }
            ok
        })
    }

    /// The file a page lives in, or `KeyRejected` if its escaped name is too long.
    pub fn page_path(&self, key: &PageKey) -> Result<PathBuf, TierError> {
        let name = encode(key);
        if name.len() > MAX_NAME {
            return Err(TierError::KeyRejected {
                key: key.clone(),
                reason: "the key escaped as a file name exceeds 200 bytes",
            });
        }
        let h = route_hash(key.as_str().as_bytes());
        let dir = &self.dirs[(h % self.dirs.len() as u64) as usize];
        Ok(dir
            .join(bucket_name(((h >> 32) & 0xff) as usize))
            .join(name))
    }

    /// A fresh temporary path beside `final_path`, named for this machine and process (see
    /// [`temp_owner`]).
    pub fn temp_path(&self, final_path: &Path) -> PathBuf {
        let seq = self.temp_seq.fetch_add(1, Ordering::Relaxed);
        let name = final_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        final_path.with_file_name(format!("{}{seq}-{name}", self.own_temps))
    }

    /// Walks one bucket of owned folders into `report`: removes leftovers of crashed writes
    /// (temp files of other tiers: this tier's own are writes in flight), and adds the
    /// complete pages found (key, length, modification time) for the index.
    pub fn scan_owned_bucket(
        &self,
        bucket: &Path,
        report: &mut ScanReport,
    ) -> Result<(), TierError> {
        let entries = fs::read_dir(bucket)
            .map_err(|e| TierError::io("scan bucket", None, Some(bucket.to_path_buf()), e))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let path = entry.path();
            if name.starts_with(TEMP_PREFIX) {
                if name.starts_with(&self.own_temps) {
                    continue;
                }
                match fs::remove_file(&path) {
                    Ok(()) => report.temps_removed += 1,
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "cannot remove a leftover temp file")
                    }
                }
                continue;
            }
            let Some(key) = decode(&name) else {
                report.foreign += 1;
                continue;
            };
            match self.page_path(&key) {
                Ok(expected) if expected == path => {}
                _ => {
                    report.foreign += 1;
                    continue;
                }
            }
            let Ok(meta) = entry.metadata() else { continue };
            let page_len = crate::format::page_len(meta.len());
            let Some(page_len) = page_len.filter(|&l| meta.is_file() && l > 0) else {
                report.foreign += 1;
                continue;
            };
            report.pages.push((key, page_len, meta.modified().ok()));
        }
        Ok(())
    }
}

impl Layout {
    /// Every bucket folder of every storage folder a scan may walk (see
    /// [`walkable_buckets`](Self::walkable_buckets)).
    pub fn buckets(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .flat_map(|dir| Self::walkable_buckets(dir))
            .collect()
    }

    /// Walks every bucket of shared folders: removes the temp files `stale` picks (leftovers of
    /// dead writers), and returns the pages found.
    pub fn scan_shared(
        &self,
        stale: impl Fn(&str, &fs::Metadata) -> bool,
    ) -> Result<FolderScan, TierError> {
        let mut report = FolderScan::default();
        for bucket in self.buckets() {
            self.scan_bucket(&bucket, &stale, None, &mut report)?;
        }
        Ok(report)
    }

    /// Walks one bucket of shared folders into `report`: removes the temp files `stale` picks,
    /// and adds the pages found; with `limit`, at most that many, picked at random among the
    /// bucket's names (only those are `stat`ed; `report.sampled` says some were left).
    pub fn scan_bucket(
        &self,
        bucket: &Path,
        stale: &impl Fn(&str, &fs::Metadata) -> bool,
        limit: Option<usize>,
        report: &mut FolderScan,
    ) -> Result<(), TierError> {
        let entries = match fs::read_dir(bucket) {
            Ok(entries) => entries,
            // Another process's clear or a hand may have removed it: it holds nothing.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(TierError::io("scan bucket", None, Some(bucket.into()), e)),
        };
        let mut names = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if is_temp(&name) {
                let Ok(meta) = entry.metadata() else { continue };
                if meta.is_file() && stale(&name, &meta) && fs::remove_file(entry.path()).is_ok() {
                    report.temps_removed += 1;
                }
                continue;
            }
            names.push(entry.path());
        }
        if let Some(limit) = limit.filter(|&l| l < names.len()) {
            // A random `limit` of them first (a partial Fisher-Yates shuffle).
            let mut seed = nonce() | 1;
            for i in 0..limit {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let j = i + (seed % (names.len() - i) as u64) as usize;
                names.swap(i, j);
            }
            names.truncate(limit);
            report.sampled = true;
        }
        for path in names {
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            let ours = path
                .file_name()
                .and_then(|n| decode(&n.to_string_lossy()))
                .is_some_and(|key| self.page_path(&key).is_ok_and(|p| p == path));
            if ours && meta.is_file() && meta.len() > crate::format::TRAILER {
                report.pages.push(FolderPage {
                    len: meta.len(),
                    stamp: FileStamp::of(&meta),
                    path,
                });
            }
        }
        Ok(())
    }
}

/// What a scan of shared folders found.
#[derive(Debug, Default)]
pub struct FolderScan {
    /// The page files.
    pub pages: Vec<FolderPage>,
    /// Leftovers of dead writers removed.
    pub temps_removed: usize,
    /// Some bucket's pages were sampled, not all listed.
    pub sampled: bool,
}

/// A page file as a scan saw it.
#[derive(Debug, Clone)]
pub struct FolderPage {
    /// Its path.
    pub path: PathBuf,
    /// Its file's length (page and trailer: what it uses of the folder).
    pub len: u64,
    /// Which file it was, and when last used.
    pub stamp: FileStamp,
}

/// A file's identity and modification time: a page file that still has the stamp a scan saw
/// was neither stored again nor used since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    dev: u64,
    ino: u64,
    /// Modification time, in nanoseconds since the epoch: the page's last use.
    pub mtime_ns: i128,
}

impl FileStamp {
    /// The stamp of the file `meta` describes.
    pub fn of(meta: &fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

/// Of a temp file's name: the tag of the pid space and the process id that made it.
pub fn temp_owner(name: &str) -> Option<(&str, u32)> {
    let rest = name.strip_prefix(TEMP_PREFIX)?;
    let mut parts = rest.splitn(3, '-');
    let host = parts.next()?;
    let pid = parts.next()?.parse().ok()?;
    Some((host, pid))
}

/// Whether `name` is a temp file's (a write in flight, or its leftover).
pub fn is_temp(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX)
}

/// The tag in temp names of the pid space this process's id means something in: 8 hex digits
/// of the routing hash of the kernel's boot id and the inode of this process's pid namespace.
/// Only a writer of the same tag can be looked up by its pid (`kill(pid, 0)`); machines, and
/// containers that share a host name but not a pid namespace (`--net=host` pods), have tags of
/// their own, and their temp files are left to age out.
pub fn pid_space_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        let boot = fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let pid_ns = fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino());
        let mut id = boot;
        id.extend_from_slice(&pid_ns.to_le_bytes());
        if id.len() == 8 {
            // No /proc: no process can tell this one's pid space apart; a random tag keeps
            // its temp files from being taken for another process's.
            id.extend_from_slice(&nonce().to_le_bytes());
        }
        format!("{:08x}", route_hash(&id) as u32)
    })
}

/// What a start-up scan found.
#[derive(Debug, Default)]
pub struct ScanReport {
    /// Complete pages: key, length, modification time.
    pub pages: Vec<(PageKey, u32, Option<std::time::SystemTime>)>,
    /// Leftovers of interrupted writes that were removed.
    pub temps_removed: usize,
    /// Files that are not kvtier pages of this layout (left alone).
    pub foreign: usize,
}

pub fn bucket_name(b: usize) -> String {
    format!("{b:02x}")
}

fn encode(key: &PageKey) -> String {
    key.escaped_name('%')
}

fn decode(name: &str) -> Option<PageKey> {
    PageKey::from_escaped_name(name, '%')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_never_escape() {
        for k in [
            "00ff",
            "../../etc/passwd",
            "a/b",
            "..",
            ".",
            ".hidden",
            "a.b",
            "%41",
            "x".repeat(200).as_str(),
        ] {
            let key = PageKey::new(k).unwrap();
            let name = encode(&key);
            assert!(!name.contains('/') && !name.starts_with('.'), "{name}");
            assert_eq!(decode(&name), Some(key), "{k}");
        }
        assert_eq!(decode("%zz"), None);
        assert_eq!(decode("%41"), None, "non-canonical escape is not ours");
    }
}
