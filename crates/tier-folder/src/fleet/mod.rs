//! Folders shared by many processes, on one machine or many (`access = "shared"`): the
//! folders are the truth, and a capacity is the folders', whoever wrote them.
//!
//! - **Usage** is a byte count in `.kvtier.usage` (in the first folder), changed under an
//!   `flock` by every process: a put adds the pages it renamed in (less the files they
//!   replaced), a remove takes off what it unlinked. It is corrected by a scan of the folders
//!   at open, and by an eviction that examined every bucket (small folders), so a count a
//!   killed process never made is mended then (within what the others changed during the
//!   scan: see [`lease::Usage::settle`]).
//! - **Eviction** starts when a put's pages would take the usage past the capacity, and stops
//!   at the low watermark (less the pages coming). One process evicts at a time: the holder of `.kvtier.lease` (a holder and
//!   an expiry, changed under an `flock`), renewed while it works and taken over by another
//!   once it expires (a holder that died or stalled). Victims are pages least recently used
//!   by any process (a file's modification time: set by its write, refreshed by hits at most
//!   once per [`SharedFolder::touch_interval`]), chosen as Redis chooses its approximate LRU:
//!   from samples. The evictor examines a window of buckets (from a random one, 4,096 pages, a
//!   bucket's picked at random where it holds more) and takes its oldest pages in the share
//!   of the folders it must free (at most a quarter), then the next window: the cost of
//!   an eviction follows the pages it evicts, not the size of the folders. Folders of fewer
//!   pages than a window are one window: an exact LRU.
//! - A victim is renamed aside before it is unlinked, and unlinked only if it is still the file
//!   the scan saw, with the use time it saw: a page stored again or read since the scan is put
//!   back (or left to its newer file). A reader racing an eviction gets the page or a miss.
//! - **Off the put path**: a put whose pages take the usage past the capacity by at most
//!   [`EVICT_BESIDE`] (2%) goes on while an eviction runs on a thread of its own (one per
//!   process at a time), so a put that evicts costs about what one that does not; so does a
//!   landing that finds writes in flight took the folders over. Past that, the put evicts
//!   before it writes. A flush waits for an eviction under way.
//! - A writer whose pages would take the usage beyond the capacity by more than one eviction
//!   step (capacity minus low watermark) while another process holds the lease waits for it,
//!   bounded by two lease periods, taking the lease over if it expires. The folders hold at
//!   most the capacity plus one step, plus the writes in flight.

mod lease;
#[cfg(test)]
mod tests;
mod victim;

use std::fs;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tier_core::TierError;

use super::layout::{self, FolderScan, Layout};
use super::SharedFolder;
use lease::{holder_id, Lease, SharedFile, Usage, UsageMark};
use victim::{put_back, unlink_if_unchanged, Victim};

const USAGE_FILE: &str = ".kvtier.usage";
const LEASE_FILE: &str = ".kvtier.lease";
/// Victims unlinked between two renewals of the lease.
const RENEW_EVERY: usize = 64;
/// Pages an eviction examines before it evicts from them (a window of buckets).
const EVICTION_SAMPLE: usize = 4096;
/// The largest share of a window's pages (the oldest) an eviction takes before it looks at the
/// next window.
const WINDOW_SHARE: usize = 4;
/// How far past the capacity (a fraction of it, at most one eviction step) a put may take
/// the folders while an eviction runs beside it.
const EVICT_BESIDE: f64 = 0.02;

/// What a put does about the capacity before it writes (see [`Fleet::make_room`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// Room enough: within the capacity, or made.
    Made,
    /// Past the capacity by at most [`EVICT_BESIDE`]: the put goes on while an eviction runs
    /// beside it ([`Fleet::evict_beside`]).
    EvictBeside,
}

/// What the processes sharing some folders agree on: their usage, and who evicts.
pub struct Fleet {
    usage: Usage,
    lease: Lease,
    capacity: Option<u64>,
    low: u64,
    settings: SharedFolder,
    /// Temp files older than this are leftovers, whoever made them.
    stale_temp: Duration,
    /// One eviction at a time in this process (the lease orders processes).
    evicting: Mutex<()>,
    /// An eviction beside the puts is started or running.
    beside: AtomicBool,
    /// Pages an eviction examines per window ([`EVICTION_SAMPLE`]).
    sample: usize,
    counts: Counts,
}

#[derive(Default)]
struct Counts {
    evicted: AtomicU64,
    runs: AtomicU64,
    takeovers: AtomicU64,
    spared: AtomicU64,
    temps_removed: AtomicU64,
    examined: AtomicU64,
}

/// What this process's tier did for its shared folders.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FleetStats {
    /// The folders' bytes, as the usage file says (pages, and writes in flight).
    pub usage_bytes: u64,
    /// Pages this process evicted.
    pub evicted: u64,
    /// Evictions this process ran holding the lease.
    pub eviction_runs: u64,
    /// Leases this process took over from a holder whose lease had expired.
    pub takeovers: u64,
    /// Victims left in place because they were stored again or read after the scan.
    pub spared: u64,
    /// Leftover temp files of dead writers removed.
    pub temps_removed: u64,
    /// Page files this process's evictions examined (stat'ed) to choose victims.
    pub examined: u64,
}

/// The scan of shared folders that follows an open: it removes dead writers' leftovers and
/// sets the usage from the bytes it finds (a count a killed process never made is corrected
/// there), bucket by bucket, while the tier serves.
pub struct OpenScan {
    /// Where the usage's counted changes stood when the scan began.
    since: UsageMark,
    /// Bytes of the page files found so far.
    found_bytes: u64,
}

/// How a call to [`Fleet::evict`] went.
#[derive(Debug, PartialEq, Eq)]
enum Eviction {
    /// Another process holds the lease (or another thread of this one is evicting).
    Busy,
    /// This process held the lease; the usage is at most the capacity now, or nothing more could go.
    Done,
}

impl Fleet {
    /// Opens the usage and lease files of `layout`'s folders. The usage is settled from a scan
    /// afterwards, in the background (see [`OpenScan`]).
    pub fn open(
        layout: &Layout,
        capacity: Option<u64>,
        settings: SharedFolder,
        transfer_timeout: Duration,
    ) -> Result<Self, TierError> {
        let first = &layout.dirs()[0];
        let shared_file =
            |name: &str| SharedFile::open(first.join(name), layout.mode(), settings.locks);
        let fleet = Self {
            usage: Usage::new(shared_file(USAGE_FILE)?),
            lease: Lease {
                file: shared_file(LEASE_FILE)?,
                holder: holder_id(),
                ttl: settings.lease,
                settle: lease::CLAIM_SETTLE,
                seen: Mutex::new(None),
            },
            capacity,
            low: capacity.map_or(0, |c| (c as f64 * settings.low_watermark) as u64),
            settings,
            stale_temp: transfer_timeout * 2 + Duration::from_secs(60),
            evicting: Mutex::new(()),
            beside: AtomicBool::new(false),
            sample: EVICTION_SAMPLE,
            counts: Counts::default(),
        };
        // What a scrape reports until this process next reads or writes the usage.
        if let Err(e) = fleet.usage.read() {
            tracing::warn!(error = %e, "cannot read the shared folders' usage at open");
        }
        Ok(fleet)
    }

    /// Begins the scan of the folders that follows an open.
    pub fn begin_open_scan(&self) -> Result<OpenScan, TierError> {
        Ok(OpenScan {
            since: self.usage.snapshot()?.1,
            found_bytes: 0,
        })
    }

    /// Scans one bucket into `scan`: removes dead writers' leftovers, counts its pages' bytes.
    pub fn open_scan_bucket(
        &self,
        layout: &Layout,
        bucket: &Path,
        scan: &mut OpenScan,
    ) -> Result<(), TierError> {
        let mut found = FolderScan::default();
        layout.scan_bucket(bucket, &self.leftover(), None, &mut found)?;
        self.counts
            .temps_removed
            .fetch_add(found.temps_removed as u64, Relaxed);
        // Only the bytes are kept: a page's path is not held for a million pages.
        let bytes = found.pages.iter().map(|p| p.len).sum::<u64>();
        scan.found_bytes += bytes;
        Ok(())
    }

    /// Ends the scan: the usage corrected from it ([`Usage::settle`]); evicts if the folders
    /// are over the capacity.
    pub fn end_open_scan(&self, layout: &Layout, scan: OpenScan) -> Result<(), TierError> {
        let usage = self.usage.settle(scan.found_bytes, scan.since)?;
        if self.capacity.is_some_and(|c| usage > c) {
            self.evict(layout, 0)?;
        }
        Ok(())
    }

    /// What this process did, and the folders' usage.
    pub fn stats(&self) -> FleetStats {
        let c = &self.counts;
        FleetStats {
            usage_bytes: self.usage.estimate().unwrap_or(0),
            evicted: c.evicted.load(Relaxed),
            eviction_runs: c.runs.load(Relaxed),
            takeovers: c.takeovers.load(Relaxed),
            spared: c.spared.load(Relaxed),
            temps_removed: c.temps_removed.load(Relaxed),
            examined: c.examined.load(Relaxed),
        }
    }

    /// The folders' bytes as this process last read or wrote the usage file, with its pending
    /// counts: from memory, so a scrape of the tier's stats never waits on the folders (a hung
    /// mount held every scrape, and with it the runtime's worker that ran it).
    pub fn usage(&self) -> u64 {
        self.usage.cached()
    }

    /// Whether a hit on a page last used at `mtime_ns` refreshes its use time.
    pub fn due_for_touch(&self, mtime_ns: i128) -> bool {
        let interval = self.settings.touch_interval.as_nanos() as i128;
        now_ns() - mtime_ns >= interval
    }

    /// Makes room for `bytes` about to be written: nothing to do within the capacity; an
    /// eviction beside the write if they take the folders past it by at most [`EVICT_BESIDE`];
    /// else evicts, or waits for the evictor (see the module documentation).
    pub fn make_room(&self, layout: &Layout, bytes: u64) -> Result<Room, TierError> {
        let Some(capacity) = self.capacity else {
            return Ok(Room::Made);
        };
        let mut usage = self.usage.estimate()?;
        if usage + bytes <= capacity {
            return Ok(Room::Made);
        }
        let step = capacity - self.low;
        let beside = ((capacity as f64 * EVICT_BESIDE) as u64).min(step);
        if usage + bytes <= capacity + beside {
            return Ok(Room::EvictBeside);
        }
        let started = Instant::now();
        let deadline = started + self.settings.lease * 2 + Duration::from_secs(1);
        loop {
            match self.evict(layout, bytes)? {
                Eviction::Done => return Ok(Room::Made),
                Eviction::Busy if usage + bytes <= capacity + step => return Ok(Room::Made),
                Eviction::Busy => {}
            }
            if Instant::now() >= deadline {
                return Err(TierError::Unavailable(format!(
                    "the shared folders {} hold {usage} bytes, over their capacity of {capacity}, \
                     and no evictor brought them down in {:?}",
                    layout.dirs()[0].display(),
                    started.elapsed()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
            usage = self.usage.estimate()?;
        }
    }

    /// Whether the folders hold more than their capacity, by the usage file.
    pub fn over_capacity(&self) -> bool {
        self.capacity
            .is_some_and(|c| self.usage.estimate().is_ok_and(|u| u > c))
    }

    /// Marks an eviction beside the puts as started: `false` if one is already.
    pub fn begin_beside(&self) -> bool {
        !self.beside.swap(true, Relaxed)
    }

    /// Marks the eviction beside the puts as ended (or never started).
    pub fn end_beside(&self) {
        self.beside.store(false, Relaxed);
    }

    /// The eviction beside the puts ([`Self::begin_beside`]), on its own thread: down to the
    /// capacity if the folders are still over it and this process gets the lease.
    pub fn evict_beside(&self, layout: &Layout) {
        if self.over_capacity() {
            if let Err(e) = self.evict(layout, 0) {
                tracing::warn!(error = %e, "cannot evict from the shared folders");
            }
        }
        self.end_beside();
    }

    /// Writes the counts pending here, waits for this process's eviction under way (bounded
    /// by its lease renewals), then evicts if the folders are over their capacity.
    pub fn settle_now(&self, layout: &Layout) -> Result<(), TierError> {
        self.usage.write_pending()?;
        drop(self.evicting.lock().unwrap_or_else(|e| e.into_inner()));
        if self.over_capacity() {
            self.evict(layout, 0)?;
        }
        Ok(())
    }

    /// Counts a change of the folders' bytes: pages renamed in (less the files they
    /// replaced), or removed; never waits long on the usage file's lock (see [`Usage`]).
    pub fn count(&self, delta: i64) {
        if delta != 0 {
            if let Err(e) = self.usage.count(delta) {
                tracing::warn!(error = %e, "cannot update the shared folders' usage");
            }
        }
    }

    /// Removes the page file at `path` that a read found corrupt, if it is still the file
    /// last used at `mtime_ns` (checked once it is renamed aside, where no writer lands: a
    /// page stored again meanwhile is never removed), and takes its bytes off the usage.
    pub fn discard(&self, layout: &Layout, path: &Path, mtime_ns: i128) {
        let still = |m: &fs::Metadata| layout::FileStamp::of(m).mtime_ns == mtime_ns;
        match victim::unlink_if(layout, path, still, put_back()) {
            Ok(Victim::Evicted(bytes) | Victim::Spared(bytes)) => self.count(-(bytes as i64)),
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "a corrupt page file stays")
            }
        }
    }

    /// Which temp files a scan removes: those older than any write may last, and those of
    /// dead writers of this pid space.
    fn leftover(&self) -> impl Fn(&str, &fs::Metadata) -> bool {
        let ours = layout::pid_space_tag();
        let stale_temp = self.stale_temp;
        move |name, meta| {
            let old = meta
                .modified()
                .ok()
                .and_then(|m| m.elapsed().ok())
                .is_some_and(|age| age > stale_temp);
            old || layout::temp_owner(name).is_some_and(|(tag, pid)| tag == ours && !alive(pid))
        }
    }

    /// Corrects the usage from the pages `scan` found, the scan having begun at `since`
    /// ([`Usage::settle`]). Writes in flight are not counted until they land.
    fn settle(&self, scan: &FolderScan, since: UsageMark) -> Result<u64, TierError> {
        let found = scan.pages.iter().map(|p| p.len).sum::<u64>();
        self.usage.settle(found, since)
    }

    /// Evicts the least recently used pages until the folders hold at most the low watermark
    /// less `incoming` bytes, if this process gets the lease and `incoming` more bytes would
    /// take them over their capacity.
    fn evict(&self, layout: &Layout, incoming: u64) -> Result<Eviction, TierError> {
        let Some(capacity) = self.capacity else {
            return Ok(Eviction::Done);
        };
        // A run that panicked held nothing the next one needs: its guard's poison is ignored.
        let _one = match self.evicting.try_lock() {
            Ok(one) => one,
            Err(std::sync::TryLockError::Poisoned(one)) => one.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(Eviction::Busy),
        };
        match self.lease.claim().map_err(|e| self.lease_error(e))? {
            None => return Ok(Eviction::Busy),
            Some(takeover) => {
                if takeover {
                    self.counts.takeovers.fetch_add(1, Relaxed);
                    tracing::info!(lease = %self.lease.file.path.display(), "took the shared folders' eviction lease over");
                }
            }
        }
        let outcome = self.evict_holding(layout, capacity, incoming);
        if let Err(e) = self.lease.release() {
            tracing::warn!(error = %e, "cannot release the shared folders' eviction lease");
        }
        outcome.map(|()| Eviction::Done)
    }

    fn evict_holding(
        &self,
        layout: &Layout,
        capacity: u64,
        incoming: u64,
    ) -> Result<(), TierError> {
        self.counts.runs.fetch_add(1, Relaxed);
        tracing::debug!(at_ns = now_ns() as u64, "shared eviction began");
        let outcome = self.evict_lru(layout, capacity, incoming);
        tracing::debug!(at_ns = now_ns() as u64, "shared eviction ended");
        outcome
    }

    /// Evicts in windows of buckets, starting at a random one: each window's pages
    /// ([`EVICTION_SAMPLE`] of them, the last bucket's picked at random where it holds more)
    /// are examined and its oldest go, in the share of the folders the run must free (at most
    /// a quarter of the window), until
    /// the usage is at the low watermark, or, after a window, once the pages coming fit under
    /// the capacity. Every window being a random sample of the folders, its oldest tenth (say)
    /// is about the folders' oldest tenth: the victims an exact LRU would take. A run costs
    /// about one window, whatever the folders hold. A window that is every bucket (small folders) is an exact LRU over all
    /// pages down to the low watermark, and sets the usage from what it found.
    fn evict_lru(&self, layout: &Layout, capacity: u64, incoming: u64) -> Result<(), TierError> {
        let buckets = layout.buckets();
        if buckets.is_empty() {
            return Ok(());
        }
        let first = (super::perms::nonce() % buckets.len() as u64) as usize;
        let leftover = self.leftover();
        let (mut at, mut victims) = (0, 0usize);
        // Renewed once a third of the lease has passed as well: over a network filesystem a
        // window's scan or 64 unlinks can outlast a lease (GlusterFS: 20 takeovers of a 3 s
        // lease in one test, each a run overlapping another).
        let mut renewed = Instant::now();
        let due = self.settings.lease / 3;
        // The share of every window this run may take: the share of the folders it must free.
        let mut fraction = None;
        while at < buckets.len() {
            let (before, since) = self.usage.snapshot()?;
            let opened = at;
            let mut window = FolderScan::default();
            while at < buckets.len() && window.pages.len() < self.sample {
                let bucket = &buckets[(first + at) % buckets.len()];
                let room = self.sample - window.pages.len();
                layout.scan_bucket(bucket, &leftover, Some(room), &mut window)?;
                at += 1;
                if renewed.elapsed() >= due {
                    if !self.renew(&mut 0)? {
                        return Ok(());
                    }
                    renewed = Instant::now();
                }
            }
            self.counts
                .temps_removed
                .fetch_add(window.temps_removed as u64, Relaxed);
            self.counts
                .examined
                .fetch_add(window.pages.len() as u64, Relaxed);
            let whole = opened == 0 && at == buckets.len() && !window.sampled;
            let usage = match whole {
                true => self.settle(&window, since)?,
                false => before,
            };
            if opened == 0 && usage + incoming <= capacity {
                return Ok(());
            }
            let mut excess = (usage + incoming).saturating_sub(self.low);
            if excess == 0 {
                return Ok(());
            }
            if window.pages.is_empty() {
                // This window's buckets hold no page (emptied since the usage was counted, by
                // another process's `clear` say): on to the next window, if any is left.
                continue;
            }
            window.pages.sort_by_key(|p| p.stamp.mtime_ns);
            let fraction = *fraction.get_or_insert(excess as f64 / usage.max(1) as f64);
            let share = match whole {
                true => window.pages.len(),
                false => ((window.pages.len() as f64 * fraction).ceil() as usize)
                    .clamp(1, window.pages.len().div_ceil(WINDOW_SHARE)),
            };
            let mut freed = 0u64;
            for page in &window.pages[..share] {
                if excess == 0 {
                    break;
                }
                if victims > 0 && (victims % RENEW_EVERY == 0 || renewed.elapsed() >= due) {
                    if !self.renew(&mut freed)? {
                        return Ok(());
                    }
                    renewed = Instant::now();
                }
                victims += 1;
                match unlink_if_unchanged(layout, page, put_back()) {
                    Ok(Victim::Evicted(bytes)) => {
                        freed += bytes;
                        excess = excess.saturating_sub(bytes);
                        self.counts.evicted.fetch_add(1, Relaxed);
                    }
                    Ok(Victim::Spared(bytes)) => {
                        freed += bytes;
                        excess = excess.saturating_sub(bytes);
                        self.counts.spared.fetch_add(1, Relaxed);
                    }
                    Err(e) => {
                        tracing::warn!(path = %page.path.display(), error = %e, "cannot evict a page")
                    }
                }
            }
            // Renewed between windows too: examining one takes time of its own.
            if !self.renew(&mut freed)? || excess == 0 {
                return Ok(());
            }
            renewed = Instant::now();
            // Room made for what is coming: the low watermark is for later windows, taken by
            // later puts, so no one put pays for an eviction step that grows with the folders.
            if self.usage.read()? + incoming <= capacity {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Counts the bytes `freed` so far off the usage, and renews the lease: `false` if it was
    /// lost (logged; the eviction stops).
    fn renew(&self, freed: &mut u64) -> Result<bool, TierError> {
        if *freed > 0 {
            self.usage.add(-(*freed as i64))?;
            *freed = 0;
        }
        let held = self.lease.renew().map_err(|e| self.lease_error(e))?;
        if !held {
            tracing::warn!("lost the shared folders' eviction lease while evicting; stopping");
        }
        Ok(held)
    }

    fn lease_error(&self, e: io::Error) -> TierError {
        TierError::io(
            "hold the eviction lease",
            None,
            Some(self.lease.file.path.clone()),
            e,
        )
    }

    /// Pages this process evicted so far (for the tier's stats).
    pub fn evicted(&self) -> u64 {
        self.counts.evicted.load(Relaxed)
    }
}

/// Whether process `pid` of this machine is alive.
impl Drop for Fleet {
    /// Writes the counts still pending here (within the usage lock's bound).
    fn drop(&mut self) {
        if let Err(e) = self.usage.write_pending() {
            tracing::warn!(error = %e, "the shared folders' usage misses this process's last counts until a scan");
        }
    }
}

fn alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let signalled = unsafe { libc::kill(pid, 0) } == 0;
    signalled || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}
