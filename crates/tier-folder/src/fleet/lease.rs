//! The files processes sharing some folders agree through: the usage count and the eviction
//! lease, each changed under a short `flock` that is waited for within a bound.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use tier_core::TierError;

use super::{layout, now_ms};
use crate::{perms, FolderMode, SharedLocks};

/// Bound on waiting for the usage or lease file's `flock` (held for a few system calls).
const FLOCK_WAIT: Duration = Duration::from_secs(5);
/// Bound on a put's wait for the usage file's lock: past it the put goes on, its count left
/// pending ([`Usage::count`]); once a wait ran out, puts only try it until it is had again.
const PUT_WAIT: Duration = Duration::from_millis(100);
/// Without locks: how long a claimer of the lease waits before it looks whose claim stood.
pub(super) const CLAIM_SETTLE: Duration = Duration::from_millis(50);

/// One of the folders' shared files (usage, lease), changed under an `flock`.
///
/// On a local filesystem it is locked, read and written through one descriptor held open.
/// Where clients cache apart (FUSE, NFS, any filesystem not known local) it is read and
/// written through a descriptor opened for each change (`O_DIRECT` where taken, synced before
/// the lock is let go), none held open between changes, and locked through a file of its own
/// (`<name>.lock`): two GlusterFS clients adding to one counter through held descriptors lost
/// half their updates; this way at most a few in a few hundred (its client caches still serve
/// an occasional stale read), which the scan at every eviction corrects.
pub(super) struct SharedFile {
    /// On a local filesystem the file itself (its I/O's and its lock's descriptor); elsewhere
    /// the lock's own file.
    held: File,
    pub path: PathBuf,
    local: bool,
    /// Whether changes take the `flock` (`locks = "none"`: never).
    locked: bool,
    /// Keeps this process's threads apart: an `flock` belongs to the open file description, so
    /// a second thread's lock through it would enter (or convert, then drop) the first's.
    in_process: Mutex<()>,
}

impl SharedFile {
    /// Opens (creating if needed) the file at `path`, changed under its `flock` unless `locks`
    /// is [`SharedLocks::None`] (a filesystem without locks).
    pub(super) fn open(
        path: PathBuf,
        mode: FolderMode,
        locks: SharedLocks,
    ) -> Result<Self, TierError> {
        let file = open_rw(&path, mode)?;
        let local = is_local(&file);
        let held = if local {
            file
        } else {
            drop(file);
            let mut name = path.clone().into_os_string();
            name.push(".lock");
            open_rw(Path::new(&name), mode)?
        };
        Ok(Self {
            held,
            path,
            local,
            locked: locks == SharedLocks::Flock,
            in_process: Mutex::new(()),
        })
    }

    /// Takes its `flock` (`op`: shared or exclusive), within [`FLOCK_WAIT`]; nothing without
    /// locks.
    fn lock(&self, op: libc::c_int) -> io::Result<Locked<'_>> {
        self.lock_within(op, FLOCK_WAIT)
    }

    /// [`Self::lock`] within `wait` (zero: one try), this process's threads included: a
    /// thread frozen holding it holds up the others no longer than an `flock` would.
    fn lock_within(&self, op: libc::c_int, wait: Duration) -> io::Result<Locked<'_>> {
        let deadline = Instant::now() + wait;
        let thread = loop {
            match self.in_process.try_lock() {
                Ok(guard) => break guard,
                Err(TryLockError::Poisoned(e)) => break e.into_inner(),
                Err(TryLockError::WouldBlock) if Instant::now() >= deadline => {
                    return Err(held_too_long(wait))
                }
                Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_micros(200)),
            }
        };
        let flock = match self.locked {
            true => Flock::take(&self.held, op, deadline, wait)?,
            false => Flock(None),
        };
        Ok(Locked {
            _flock: flock,
            _thread: thread,
        })
    }

    /// Reads from the start into `buf`.
    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if self.local {
            return self.held.read_at(buf, 0);
        }
        let (fresh, direct) = self.fresh()?;
        if direct {
            let mut block = Box::new(Block([0; BLOCK]));
            let n = fresh.read_at(&mut block.0, 0)?.min(buf.len());
            buf[..n].copy_from_slice(&block.0[..n]);
            return Ok(n);
        }
        // SAFETY: a valid open fd; advice only.
        unsafe { libc::posix_fadvise(fresh.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        fresh.read_at(buf, 0)
    }

    /// Replaces the content with `bytes`.
    fn write(&self, bytes: &[u8]) -> io::Result<()> {
        let replace = |f: &File, block: &[u8]| {
            f.write_all_at(block, 0)?;
            f.set_len(bytes.len() as u64)
        };
        if self.local {
            return replace(&self.held, bytes);
        }
        let (fresh, direct) = self.fresh()?;
        if direct && bytes.len() <= BLOCK {
            let mut block = Box::new(Block([0; BLOCK]));
            block.0[..bytes.len()].copy_from_slice(bytes);
            replace(&fresh, &block.0)?;
        } else {
            replace(&fresh, bytes)?;
        }
        fresh.sync_data()
    }

    /// A descriptor of its own: `O_DIRECT` where the filesystem takes it (past every cache of
    /// the client), else buffered; whether it is direct.
    fn fresh(&self) -> io::Result<(File, bool)> {
        let open = |flags: i32| {
            perms::open_existing(
                std::fs::OpenOptions::new().read(true).write(true),
                &self.path,
                flags,
            )
        };
        match open(libc::O_DIRECT) {
            Ok(file) => Ok((file, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((open(0)?, false)),
            Err(e) => Err(e),
        }
    }
}

/// The unit of direct I/O on the shared files.
const BLOCK: usize = 4096;

/// A block aligned for direct I/O.
#[repr(C, align(4096))]
struct Block([u8; BLOCK]);

/// Whether `file` is on a filesystem whose clients share one cache (a local disk or memory):
/// ext2/3/4, XFS, Btrfs, tmpfs, ZFS, overlayfs.
fn is_local(file: &File) -> bool {
    // SAFETY: statfs writes into the zeroed struct it is given.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and a writable struct.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 {
        return false;
    }
    super::super::probe::LOCAL_FILESYSTEMS.contains(&(fs.f_type as i64))
}

/// The usage file: the folders' bytes, the running sum of every change counted since the file
/// was made, and the running sum of the removals among them ([`UsageMark`]), each a
/// little-endian u64. (A file of the bytes alone, or of the bytes and the sum, as earlier
/// kvtiers wrote it, reads as sums of 0.)
///
/// Puts never wait on it past [`PUT_WAIT`]: a process frozen holding its lock (stopped, or
/// stuck syncing on a hung client) made every other process's puts time out. A put's count
/// the lock did not let in is kept pending in this process and written with the next change
/// that gets the lock (a put's, an eviction's, a flush's or the close's), never lost; a put's
/// look at the usage then takes the last one read plus what is pending here.
pub(super) struct Usage {
    pub file: SharedFile,
    /// Bytes added here and not yet written.
    pending_added: AtomicU64,
    /// Bytes removed here and not yet written.
    pending_removed: AtomicU64,
    /// The usage the file held when last read or written here.
    last: AtomicU64,
    /// A put's wait for the lock ran out, and no lock was had since.
    busy: AtomicBool,
}

/// Where the running sums of counted changes stood: a scan that began there knows how much
/// was added and removed while it looked (see [`Usage::settle`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct UsageMark {
    sum: u64,
    removed: u64,
}

/// What the usage file holds.
#[derive(Debug, Clone, Copy)]
struct Counted {
    bytes: u64,
    mark: UsageMark,
}

impl Usage {
    pub(super) fn new(file: SharedFile) -> Self {
        Self {
            file,
            pending_added: AtomicU64::new(0),
            pending_removed: AtomicU64::new(0),
            last: AtomicU64::new(0),
            busy: AtomicBool::new(false),
        }
    }

    /// The usage, with what is pending here, waiting for the lock within [`FLOCK_WAIT`].
    pub(super) fn read(&self) -> Result<u64, TierError> {
        let _lock = self.file.lock(libc::LOCK_SH).map_err(|e| self.error(e))?;
        let counted = self.load().map_err(|e| self.error(e))?;
        Ok(counted.bytes.saturating_add_signed(self.pending()))
    }

    /// The usage as a put sees it: read within [`PUT_WAIT`], else the last usage read here
    /// plus what is pending here.
    pub(super) fn estimate(&self) -> Result<u64, TierError> {
        match self.file.lock_within(libc::LOCK_SH, self.put_wait()) {
            Ok(_lock) => {
                self.busy.store(false, Relaxed);
                let counted = self.load().map_err(|e| self.error(e))?;
                Ok(counted.bytes.saturating_add_signed(self.pending()))
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                self.busy.store(true, Relaxed);
                Ok(self.cached())
            }
            Err(e) => Err(self.error(e)),
        }
    }

    /// The usage last read or written here, plus what is pending here: no I/O.
    pub(super) fn cached(&self) -> u64 {
        let last = self.last.load(Relaxed);
        last.saturating_add_signed(self.pending())
    }

    /// The net change pending here.
    fn pending(&self) -> i64 {
        self.pending_added.load(Relaxed) as i64 - self.pending_removed.load(Relaxed) as i64
    }

    /// Keeps `delta` pending here.
    fn hold(&self, delta: i64) {
        match delta >= 0 {
            true => self.pending_added.fetch_add(delta as u64, Relaxed),
            false => self
                .pending_removed
                .fetch_add(delta.unsigned_abs(), Relaxed),
        };
    }

    fn put_wait(&self) -> Duration {
        match self.busy.load(Relaxed) {
            true => Duration::ZERO,
            false => PUT_WAIT,
        }
    }

    /// The usage, and the mark a scan beginning now settles from (what is pending here
    /// written first, so it is not counted again after the scan).
    pub(super) fn snapshot(&self) -> Result<(u64, UsageMark), TierError> {
        let _lock = self.file.lock(libc::LOCK_EX).map_err(|e| self.error(e))?;
        let counted = self.apply(0)?;
        Ok((counted.bytes, counted.mark))
    }

    /// Under the lock: writes `delta` and what is pending here; what the file holds now. On a
    /// failed write the changes stay pending.
    fn apply(&self, delta: i64) -> Result<Counted, TierError> {
        let counted = self.load().map_err(|e| self.error(e))?;
        self.hold(delta);
        let added = self.pending_added.swap(0, Relaxed);
        let removed = self.pending_removed.swap(0, Relaxed);
        if added == 0 && removed == 0 {
            return Ok(counted);
        }
        let net = added as i64 - removed as i64;
        let new = Counted {
            bytes: counted.bytes.saturating_add_signed(net),
            mark: UsageMark {
                sum: counted.mark.sum.wrapping_add_signed(net),
                removed: counted.mark.removed.wrapping_add(removed),
            },
        };
        if let Err(e) = self.store(new) {
            self.pending_added.fetch_add(added, Relaxed);
            self.pending_removed.fetch_add(removed, Relaxed);
            return Err(self.error(e));
        }
        Ok(new)
    }

    fn load(&self) -> io::Result<Counted> {
        let mut bytes = [0u8; 24];
        let n = self.file.read(&mut bytes)?;
        let word = |i: usize| match n >= i * 8 + 8 {
            true => u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap_or_default()),
            false => 0,
        };
        let counted = Counted {
            bytes: word(0),
            mark: UsageMark {
                sum: word(1),
                removed: word(2),
            },
        };
        self.last.store(counted.bytes, Relaxed);
        Ok(counted)
    }

    fn store(&self, counted: Counted) -> io::Result<()> {
        let mut text = [0u8; 24];
        text[..8].copy_from_slice(&counted.bytes.to_le_bytes());
        text[8..16].copy_from_slice(&counted.mark.sum.to_le_bytes());
        text[16..].copy_from_slice(&counted.mark.removed.to_le_bytes());
        self.file.write(&text)?;
        self.last.store(counted.bytes, Relaxed);
        Ok(())
    }

    /// Adds `delta` and what is pending here (never below 0), waiting for the lock within
    /// [`FLOCK_WAIT`]; returns the new usage. Not written, the change stays pending.
    pub(super) fn add(&self, delta: i64) -> Result<u64, TierError> {
        let _lock = match self.file.lock(libc::LOCK_EX) {
            Ok(lock) => lock,
            Err(e) => {
                self.hold(delta);
                return Err(self.error(e));
            }
        };
        Ok(self.apply(delta)?.bytes)
    }

    /// Counts a put's (or a remove's) change: written at once if the lock is had within
    /// [`PUT_WAIT`], else left pending (see [`Usage`]).
    pub(super) fn count(&self, delta: i64) -> Result<(), TierError> {
        self.hold(delta);
        match self.file.lock_within(libc::LOCK_EX, self.put_wait()) {
            Ok(_lock) => {
                self.busy.store(false, Relaxed);
                self.apply(0).map(drop)
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                self.busy.store(true, Relaxed);
                tracing::debug!(
                    pending = self.pending(),
                    "the shared folders' usage lock is held: the count is left pending"
                );
                Ok(())
            }
            Err(e) => Err(self.error(e)),
        }
    }

    /// Writes what is pending here, waiting for the lock within [`FLOCK_WAIT`].
    pub(super) fn write_pending(&self) -> Result<(), TierError> {
        if self.pending_added.load(Relaxed) == 0 && self.pending_removed.load(Relaxed) == 0 {
            return Ok(());
        }
        self.add(0).map(drop)
    }

    /// Corrects the usage from a scan that found `found` bytes of pages and began at `since`
    /// (what is pending here written first); returns it.
    ///
    /// The scan looked at the folders a bucket at a time while others wrote: a page added
    /// before the scan reached its bucket is both found and counted since, one removed
    /// before is neither. So the folders hold at least `found` less what was removed since
    /// and at most `found` plus what was added since; a count within that is kept (taking
    /// `found` plus the changes since, as before, counted every page written during the scan
    /// twice: three processes filling one folder at once saw nearly twice its bytes), and
    /// one outside it (counts a killed process never made, a folder filled by an owner) is
    /// moved to the nearer end.
    pub(super) fn settle(&self, found: u64, since: UsageMark) -> Result<u64, TierError> {
        let _lock = self.file.lock(libc::LOCK_EX).map_err(|e| self.error(e))?;
        let counted = self.apply(0)?;
        let net = counted.mark.sum.wrapping_sub(since.sum) as i64;
        // A writer of the two-word file (an earlier kvtier) drops the removals: then unknown.
        let removed = counted.mark.removed.saturating_sub(since.removed);
        let added = net.saturating_add_unsigned(removed).max(0) as u64;
        let (least, most) = (found.saturating_sub(removed), found.saturating_add(added));
        let bytes = counted.bytes.clamp(least, most);
        if bytes != counted.bytes {
            let settled = Counted { bytes, ..counted };
            self.store(settled).map_err(|e| self.error(e))?;
        }
        Ok(bytes)
    }

    pub(super) fn error(&self, e: io::Error) -> TierError {
        TierError::io(
            "update the shared folders' usage",
            None,
            Some(self.file.path.clone()),
            e,
        )
    }
}

/// The eviction lease: `<holder> <expiry in ms since the epoch>`, or nothing when free.
pub(super) struct Lease {
    pub file: SharedFile,
    pub holder: String,
    pub ttl: Duration,
    /// Without locks, how long a claimer waits before it looks whether its claim stood
    /// ([`CLAIM_SETTLE`]).
    pub settle: Duration,
    /// Another holder's lease as this process first saw it: (holder, expiry, when seen).
    pub seen: Mutex<Option<(String, u64, Instant)>>,
}

impl Lease {
    /// Takes the lease if it is free, expired or this holder's; `Some(true)` if it was taken
    /// over from another holder whose lease had expired, `None` if another holds it.
    pub(super) fn claim(&self) -> io::Result<Option<bool>> {
        let _lock = self.file.lock(libc::LOCK_EX)?;
        let (holder, expiry) = self.load()?;
        let now = now_ms();
        let takeover = match holder {
            None => false,
            Some(h) if h == self.holder => false,
            Some(h) if expiry > now && !self.skewed_and_stale(&h, expiry, now) => return Ok(None),
            Some(_) => true,
        };
        self.store(Some(now + self.ttl.as_millis() as u64))?;
        if !self.file.locked {
            // Two claimers may both have found it free: the last write wins, and each looks
            // after a moment which one that was. (Two may still overlap now and then.)
            std::thread::sleep(self.settle);
            if self.load()?.0.as_deref() != Some(&self.holder) {
                return Ok(None);
            }
        }
        Ok(Some(takeover))
    }

    /// Whether another holder's lease that expires more than a lease from now (its holder's
    /// clock runs ahead) has stayed as it is for a whole lease by this process's clock: its
    /// holder, which renews it far more often, is gone. (Taken at its word, a lease written
    /// by a clock an hour ahead blocked eviction for that hour.)
    fn skewed_and_stale(&self, holder: &str, expiry: u64, now: u64) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if expiry <= now + self.ttl.as_millis() as u64 {
            *seen = None;
            return false;
        }
        match &*seen {
            Some((h, e, since)) if h == holder && *e == expiry => since.elapsed() > self.ttl,
            _ => {
                *seen = Some((holder.to_owned(), expiry, Instant::now()));
                false
            }
        }
    }

    /// Extends the lease if this holder still has it.
    pub(super) fn renew(&self) -> io::Result<bool> {
        let _lock = self.file.lock(libc::LOCK_EX)?;
        if self.load()?.0.as_deref() != Some(&self.holder) {
            return Ok(false);
        }
        self.store(Some(now_ms() + self.ttl.as_millis() as u64))?;
        Ok(true)
    }

    /// Frees the lease if this holder has it.
    pub(super) fn release(&self) -> io::Result<()> {
        let _lock = self.file.lock(libc::LOCK_EX)?;
        if self.load()?.0.as_deref() == Some(&self.holder) {
            self.store(None)?;
        }
        Ok(())
    }

    fn load(&self) -> io::Result<(Option<String>, u64)> {
        let mut buf = vec![0u8; 512];
        let n = self.file.read(&mut buf)?;
        let text = String::from_utf8_lossy(&buf[..n]);
        let mut parts = text.split_whitespace();
        let holder = parts.next().map(str::to_string);
        let expiry = parts.next().and_then(|e| e.parse().ok()).unwrap_or(0);
        Ok((holder, expiry))
    }

    fn store(&self, expiry: Option<u64>) -> io::Result<()> {
        let text = expiry.map_or_else(String::new, |e| format!("{} {e}\n", self.holder));
        self.file.write(text.as_bytes())
    }
}

/// A shared file held by this thread of this process, and by this process among others (its
/// `flock`, let go of first).
struct Locked<'a> {
    _flock: Flock<'a>,
    _thread: MutexGuard<'a, ()>,
}

/// An `flock` on a file, released on drop; taken within [`FLOCK_WAIT`] (`None`: no lock).
struct Flock<'a>(Option<&'a File>);

impl<'a> Flock<'a> {
    /// Takes it by `deadline`, a wait of `wait` in all.
    fn take(
        file: &'a File,
        op: libc::c_int,
        deadline: Instant,
        wait: Duration,
    ) -> io::Result<Self> {
        loop {
            // SAFETY: a valid open fd.
            if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
                return Ok(Self(Some(file)));
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(err);
            }
            if Instant::now() >= deadline {
                return Err(held_too_long(wait));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

fn held_too_long(wait: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("its lock was held for over {wait:?}"),
    )
}

impl Drop for Flock<'_> {
    fn drop(&mut self) {
        if let Some(file) = self.0 {
            // SAFETY: a valid open fd.
            unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
        }
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
        crate::perms::nonce()
    )
}
