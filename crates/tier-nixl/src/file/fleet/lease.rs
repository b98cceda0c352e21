//! The files processes sharing some folders agree through: the usage count and the eviction
//! lease, each changed under a short `flock` that is waited for within a bound.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use tier_core::TierError;

use super::{layout, now_ms};
use crate::file::FolderMode;

/// Bound on waiting for the usage or lease file's `flock` (held for a few system calls).
const FLOCK_WAIT: Duration = Duration::from_secs(5);

/// The usage file: the folders' bytes as a little-endian u64.
pub(super) struct Usage {
    pub file: File,
    pub path: PathBuf,
}

impl Usage {
    pub(super) fn read(&self) -> Result<u64, TierError> {
        let _lock = Flock::take(&self.file, libc::LOCK_SH).map_err(|e| self.error(e))?;
        self.load().map_err(|e| self.error(e))
    }

    fn load(&self) -> io::Result<u64> {
        let mut bytes = [0u8; 8];
        let n = self.file.read_at(&mut bytes, 0)?;
        Ok(if n == 8 { u64::from_le_bytes(bytes) } else { 0 })
    }

    /// Adds `delta` (never below 0); returns the new usage.
    pub(super) fn add(&self, delta: i64) -> Result<u64, TierError> {
        self.update(|now| now.saturating_add_signed(delta))
    }

    pub(super) fn update(&self, f: impl FnOnce(u64) -> u64) -> Result<u64, TierError> {
        let _lock = Flock::take(&self.file, libc::LOCK_EX).map_err(|e| self.error(e))?;
        let new = f(self.load().map_err(|e| self.error(e))?);
        self.file
            .write_all_at(&new.to_le_bytes(), 0)
            .map_err(|e| self.error(e))?;
        Ok(new)
    }

    pub(super) fn error(&self, e: io::Error) -> TierError {
        TierError::io(
            "update the shared folders' usage",
            None,
            Some(self.path.clone()),
            e,
        )
    }
}

/// The eviction lease: `<holder> <expiry in ms since the epoch>`, or nothing when free.
pub(super) struct Lease {
    pub file: File,
    pub path: PathBuf,
    pub holder: String,
    pub ttl: Duration,
}

impl Lease {
    /// Takes the lease if it is free, expired or this holder's; `Some(true)` if it was taken
    /// over from another holder whose lease had expired, `None` if another holds it.
    pub(super) fn claim(&self) -> io::Result<Option<bool>> {
        let _lock = Flock::take(&self.file, libc::LOCK_EX)?;
        let (holder, expiry) = self.load()?;
        let now = now_ms();
        let takeover = match holder {
            None => false,
            Some(h) if h == self.holder => false,
            Some(_) if expiry > now => return Ok(None),
            Some(_) => true,
        };
        self.store(Some(now + self.ttl.as_millis() as u64))?;
        Ok(Some(takeover))
    }

    /// Extends the lease if this holder still has it.
    pub(super) fn renew(&self) -> io::Result<bool> {
        let _lock = Flock::take(&self.file, libc::LOCK_EX)?;
        if self.load()?.0.as_deref() != Some(&self.holder) {
            return Ok(false);
        }
        self.store(Some(now_ms() + self.ttl.as_millis() as u64))?;
        Ok(true)
    }

    /// Frees the lease if this holder has it.
    pub(super) fn release(&self) -> io::Result<()> {
        let _lock = Flock::take(&self.file, libc::LOCK_EX)?;
        if self.load()?.0.as_deref() == Some(&self.holder) {
            self.store(None)?;
        }
        Ok(())
    }

    fn load(&self) -> io::Result<(Option<String>, u64)> {
        let mut buf = vec![0u8; 512];
        let n = self.file.read_at(&mut buf, 0)?;
        let text = String::from_utf8_lossy(&buf[..n]);
        let mut parts = text.split_whitespace();
        let holder = parts.next().map(str::to_string);
        let expiry = parts.next().and_then(|e| e.parse().ok()).unwrap_or(0);
        Ok((holder, expiry))
    }

    fn store(&self, expiry: Option<u64>) -> io::Result<()> {
        let text = expiry.map_or_else(String::new, |e| format!("{} {e}\n", self.holder));
        self.file.set_len(0)?;
        self.file.write_all_at(text.as_bytes(), 0)
    }
}

/// An `flock` on a file, released on drop; taken within [`FLOCK_WAIT`].
struct Flock<'a>(&'a File);

impl<'a> Flock<'a> {
    fn take(file: &'a File, op: libc::c_int) -> io::Result<Self> {
        let deadline = Instant::now() + FLOCK_WAIT;
        loop {
            // SAFETY: a valid open fd.
            if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
                return Ok(Self(file));
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(err);
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("its lock was held for over {FLOCK_WAIT:?}"),
                ));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        // SAFETY: a valid open fd.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Opens (creating if needed) one of the folders' shared files, never through a link.
pub(super) fn open_rw(path: &Path, mode: FolderMode) -> Result<File, TierError> {
    mode.open_fixed(path).map_err(|e| {
        TierError::io(
            "open a shared folder's file",
            None,
            Some(path.to_path_buf()),
            e,
        )
    })
}

/// This tier's name as a lease holder: pid space, process, a number of its own (two tiers of
/// one process are two holders) and random bits (two containers' pid 1 are two holders).
pub(super) fn holder_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}:{}:{}:{:016x}",
        layout::pid_space_tag(),
        std::process::id(),
        NEXT.fetch_add(1, Relaxed),
        crate::file::perms::nonce()
    )
}
