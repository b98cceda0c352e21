//! A prefix shared by many nodes (`access = "shared"`): its capacity is the prefix's, whoever
//! wrote the objects, and one node evicts at a time.
//!
//! - **Usage**: each node lists the whole prefix (see `Objects::list`) when it opens and
//!   evicts, and while it writes a window of its buckets once per [`SharedPrefix::relist`]
//!   (see `usage`), adding what it put itself between listings. Other nodes' puts are seen
//!   as the windows go round: the prefix may exceed its capacity by what they put meanwhile.
//! - **Off the put path**: an open, and a put that finds the listing stale or the prefix over
//!   its capacity, start the listing (and the eviction it calls for) in a task of its own and
//!   return; only a put that finds the prefix over its capacity by more than 2% (by this
//!   node's count) waits for it. So no open and no put pays for a listing of the whole prefix
//!   while the evictions keep up. A flush settles what is due, after any settle under way.
//! - **One evictor per prefix**: the holder of `<prefix>/.kvtier-lease` (a holder and an
//!   expiry), taken with a conditional put: created with `If-None-Match: *` when there is none,
//!   replaced with `If-Match: <its ETag>` when it is free or expired; of two nodes racing for
//!   it, the store lets one win. The winner reads it back after 50 ms and goes on only if it
//!   still holds it: s3s-fs checks the condition apart from the write and lets two racing
//!   replaces both succeed (the 4-process test caught it), the later one holding. The holder
//!   renews it (conditionally too) right before each batch of DELETEs, the first included, so
//!   a racing write that lands even after the read-back stops it before it deletes more.
//! - **Victims**: the oldest objects by last write (the listing's last-modified time) or, for
//!   pages the evicting node read itself, by its last read there, down to the low watermark. Before each DELETE, a HEAD checks that the object still has the
//!   ETag and modification time (to the second, as `Last-Modified` carries it) the listing
//!   saw (the ETag where the listing gives one: s3s-fs's does not): a page another node
//!   stored again after the listing is left. (`object_store` has no conditional DELETE, so a re-store in the
//!   milliseconds between the HEAD and the DELETE is lost, as an eviction; S3's `If-Match` on
//!   DELETE would close that window where a store offers it.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use object_store::path::{Path, PathPart};
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use tier_core::{PageKey, TierError};

use crate::listing::Listed;
use crate::objects::{bucket_of, Objects, BUCKETS};
use crate::usage::PrefixUsage;

/// The lease object's name under the prefix (no page name starts with a `.`).
const LEASE: &str = ".kvtier-lease";
/// How long a node waits before it reads back a lease it took (see [`Fleet::confirm`]).
const CONFIRM_AFTER: Duration = Duration::from_millis(50);
/// Pages whose last read here a node remembers at most.
const READS_KEPT: usize = 1 << 20;
/// Victims looked at and deleted between two renewals of the lease.
const EVICT_CHUNK: usize = 256;
/// How far past its capacity (a fraction of it) the prefix may go by a node's count before
/// that node's puts wait for its eviction; below, they leave it to the background.
const WAIT_PAST: f64 = 0.02;

/// Settings of a shared prefix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedPrefix {
    /// How long an evictor's lease lasts without renewal: a node that dies or stalls while
    /// evicting is taken over by another once this has passed.
    pub lease: Duration,
    /// An eviction starts when the prefix's bytes pass the capacity and stops once they are
    /// at most this fraction of it.
    pub low_watermark: f64,
    /// A writing node lists a window of the prefix's buckets this often (about 16 LIST
    /// requests), to see other nodes' puts.
    pub relist: Duration,
}

impl Default for SharedPrefix {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            low_watermark: 0.9,
            relist: Duration::from_secs(10),
        }
    }
}

/// What this node did for a shared prefix.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// The prefix's bytes as this node last listed them, plus what it put since.
    pub usage_bytes: u64,
    /// Objects this node evicted.
    pub evicted: u64,
    /// Evictions this node ran holding the lease.
    pub eviction_runs: u64,
    /// Leases this node took over from a holder whose lease had expired.
    pub takeovers: u64,
    /// Victims left because another node stored them again after the listing.
    pub spared: u64,
    /// LIST requests this node made of the prefix, as S3 pages them (1,000 objects each).
    pub list_requests: u64,
}

/// A shared prefix's state in this node.
pub(crate) struct Fleet {
    settings: SharedPrefix,
    capacity: u64,
    low: u64,
    holder: String,
    usage: Mutex<PrefixUsage>,
    /// Another node's lease as this node first saw it: (holder, ETag, when seen).
    seen: Mutex<Option<(String, Option<String>, Instant)>>,
    /// When this node last read each page, in ms since the epoch (bounded, see `note_read`).
    read: Mutex<HashMap<PageKey, i64>>,
    evicting: tokio::sync::Mutex<()>,
    evicted: AtomicU64,
    runs: AtomicU64,
    takeovers: AtomicU64,
    spared: AtomicU64,
}

/// A random part of a lease holder's name: containers sharing a host name (host networking)
/// with equal pids (a pid-1 entrypoint in each) must not take each other's live lease.
fn holder_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // Seeded from the OS's random source for each new `RandomState`.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(now_ms() as u128);
    hasher.finish()
}

/// The lease as read: its holder and expiry, and the ETag a conditional replace needs.
struct LeaseSeen {
    holder: String,
    expiry_ms: u64,
    version: UpdateVersion,
}

impl Fleet {
    pub fn new(settings: SharedPrefix, capacity: u64) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "host".into());
        Self {
            settings,
            capacity,
            low: (capacity as f64 * settings.low_watermark) as u64,
            holder: format!(
                "{host}:{}:{}:{:016x}",
                std::process::id(),
                NEXT.fetch_add(1, Relaxed),
                holder_nonce()
            ),
            usage: Mutex::new(PrefixUsage::new()),
            seen: Mutex::new(None),
            read: Mutex::new(HashMap::new()),
            evicting: tokio::sync::Mutex::new(()),
            evicted: AtomicU64::new(0),
            runs: AtomicU64::new(0),
            takeovers: AtomicU64::new(0),
            spared: AtomicU64::new(0),
        }
    }

    fn usage(&self) -> std::sync::MutexGuard<'_, PrefixUsage> {
        self.usage.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The prefix's bytes as last listed, plus this node's puts since.
    pub fn bytes(&self) -> u64 {
        self.usage().bytes()
    }

    pub fn stats(&self, objects: &Objects) -> PrefixStats {
        PrefixStats {
            list_requests: objects.list_requests.load(Relaxed),
            usage_bytes: self.bytes(),
            evicted: self.evicted.load(Relaxed),
            eviction_runs: self.runs.load(Relaxed),
            takeovers: self.takeovers.load(Relaxed),
            spared: self.spared.load(Relaxed),
        }
    }

    /// Counts a page of `bytes` this node stored under `key`.
    pub fn note_written(&self, key: &PageKey, bytes: u64) {
        self.usage().written(bucket_of(key), bytes);
    }

    /// Records that this node read `keys` now: an eviction by this node counts a page's age
    /// from its last write or its last read here, whichever is later. The record forgets
    /// everything once it holds [`READS_KEPT`] pages (a bound on its memory).
    pub fn note_read<'k>(&self, keys: impl IntoIterator<Item = &'k PageKey>) {
        let now = now_ms() as i64;
        let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            if read.len() >= READS_KEPT {
                read.clear();
            }
            read.insert(key.clone(), now);
        }
    }

    /// Whether this node should look at the prefix now: over the capacity by its count, or
    /// its listing is older than `relist` and it wrote since.
    pub fn due(&self) -> bool {
        let u = self.usage();
        u.bytes() > self.capacity || (u.stale(self.settings.relist) && u.wrote())
    }

    /// Whether a put must wait for the prefix to be settled: by this node's count it is over
    /// its capacity by more than [`WAIT_PAST`]. Below that, listings and evictions run beside
    /// the puts.
    pub fn over_bound(&self) -> bool {
        self.bytes() > self.capacity + (self.capacity as f64 * WAIT_PAST) as u64
    }

    /// Lists the prefix (a window of its buckets where this node is only due for a periodic
    /// look and not `wait`ing), and evicts down to the low watermark if it is over its
    /// capacity and this node gets the lease. With one under way, returns at once, or if
    /// `wait`, once it is done (then settles again if still [`Fleet::due`]).
    pub async fn settle(&self, objects: &Objects, wait: bool) -> Result<(), TierError> {
        let _one = match self.evicting.try_lock() {
            Ok(one) => one,
            Err(_) if wait => {
                let one = self.evicting.lock().await;
                if !self.due() {
                    return Ok(());
                }
                one
            }
            Err(_) => return Ok(()),
        };
        let window = {
            let u = self.usage();
            let whole = wait || !u.ever_listed() || u.bytes() > self.capacity;
            (!whole).then(|| u.window()).flatten()
        };
        let total = match window {
            Some(window) => {
                let before = self.usage().before();
                let listed = objects.list_buckets_in(window.iter().copied()).await?;
                self.set_listed(&window, &listed, &before, true)
            }
            None => self.list_whole(objects).await?.1,
        };
        if total <= self.capacity {
            return Ok(());
        }
        let Some(mut version) = self.claim(objects).await? else {
            return Ok(());
        };
        // Listed again, holding the lease: another node may have evicted between the listing
        // and the claim (its lease just released), and the work is sized from what is left.
        let (listed, total) = match self.list_whole(objects).await {
            Ok(listed) => listed,
            Err(e) => {
                let _ = self.write_lease(objects, Some(version), false).await;
                return Err(e);
            }
        };
        if total <= self.capacity {
            let _ = self.write_lease(objects, Some(version), false).await;
            return Ok(());
        }
        self.runs.fetch_add(1, Relaxed);
        tracing::debug!(at_ns = now_ns(), "shared eviction began");
        let outcome = self.evict(objects, listed, total, &mut version).await;
        tracing::debug!(at_ns = now_ns(), "shared eviction ended");
        // Free: a conditional replace by an empty lease (it may have been taken over).
        let _ = self.write_lease(objects, Some(version), false).await;
        outcome
    }

    /// Lists the whole prefix and counts it: its pages and their bytes.
    async fn list_whole(&self, objects: &Objects) -> Result<(Vec<Listed>, u64), TierError> {
        let before = self.usage().before();
        let listed = objects.list().await?;
        let all: Vec<usize> = (0..BUCKETS).collect();
        let total = self.set_listed(&all, &listed, &before, false);
        Ok((listed, total))
    }

    /// Counts `buckets` as `listed` says, from a listing begun when this node's puts were
    /// `before` (see [`PrefixUsage::set_listed`]); the prefix's listed bytes.
    fn set_listed(
        &self,
        buckets: &[usize],
        listed: &[Listed],
        before: &[u64],
        window: bool,
    ) -> u64 {
        let pages = listed.iter().map(|l| (l.bucket, page_bytes(&l.meta)));
        let mut u = self.usage();
        u.set_listed(buckets, pages, before, window);
        u.listed_bytes()
    }

    /// Deletes the oldest of `listed` down to the low watermark, holding the lease (`version`).
    async fn evict(
        &self,
        objects: &Objects,
        mut listed: Vec<Listed>,
        total: u64,
        version: &mut UpdateVersion,
    ) -> Result<(), TierError> {
        {
            let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
            // Oldest first; of one time, by name (buckets list in any order).
            listed.sort_by_cached_key(|l| {
                let written = l.meta.last_modified.timestamp_millis();
                let used = read.get(&l.key).map_or(written, |&r| r.max(written));
                (used, l.key.clone())
            });
        }
        let mut excess = total - self.low;
        let mut candidates = listed.iter().peekable();
        // In chunks: the chunk's candidates looked at (HEAD) `concurrency` at a time, then the
        // lease renewed, then the unchanged ones deleted together. The renewal right before
        // each DELETE, the first included, stops an evictor whose lease another node's write
        // replaced since (a store whose conditional writes are not atomic with their check
        // can let a racing claim land after this node's read-back).
        while excess > 0 && candidates.peek().is_some() {
            let mut chunk = Vec::new();
            let mut covers = 0;
            while covers < excess && chunk.len() < EVICT_CHUNK {
                let Some(meta) = candidates.next() else { break };
                covers += page_bytes(&meta.meta);
                chunk.push(meta);
            }
            let unchanged = self.unchanged(objects, &chunk).await;
            match self
                .write_lease(objects, Some(version.clone()), true)
                .await?
            {
                Some(v) => *version = v,
                None => {
                    tracing::warn!(
                        "lost the shared prefix's eviction lease while evicting; stopping"
                    );
                    break;
                }
            }
            self.spared
                .fetch_add((chunk.len() - unchanged.len()) as u64, Relaxed);
            let pages: HashMap<&Path, (usize, u64)> = unchanged
                .iter()
                .map(|l| (&l.meta.location, (l.bucket, page_bytes(&l.meta))))
                .collect();
            let deleted = objects
                .delete_many(unchanged.iter().map(|l| l.meta.location.clone()).collect())
                .await?;
            for path in &deleted {
                let Some(&(bucket, size)) = pages.get(path) else {
                    continue;
                };
                self.evicted.fetch_add(1, Relaxed);
                objects.stats.eviction();
                excess = excess.saturating_sub(size);
                self.usage().freed(bucket, size);
            }
        }
        Ok(())
    }

    /// Those of `chunk` whose object is still the one listed: neither stored again nor gone.
    /// A re-store of a page writes its very bytes (its ETag may stay): the time tells, to the
    /// second a HEAD's `Last-Modified` carries.
    async fn unchanged<'m>(&self, objects: &Objects, chunk: &[&'m Listed]) -> Vec<&'m Listed> {
        type Head<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>>;
        let heads: Vec<Head<'_>> = chunk
            .iter()
            .map(|&l| -> Head<'_> { Box::pin(Self::still_listed(objects, &l.meta)) })
            .collect();
        let heads: Vec<bool> = futures::stream::iter(heads)
            .buffered(objects.config.concurrency.max(1))
            .collect()
            .await;
        chunk
            .iter()
            .zip(heads)
            .filter_map(|(meta, same)| same.then_some(*meta))
            .collect()
    }

    /// Whether `meta`'s object is still the one listed (see [`Fleet::unchanged`]).
    async fn still_listed(objects: &Objects, meta: &object_store::ObjectMeta) -> bool {
        let now = objects
            .bounded("object head", async {
                objects
                    .store
                    .head(&meta.location)
                    .await
                    .map_err(|e| objects.error(None, e))
            })
            .await;
        now.is_ok_and(|m| {
            (meta.e_tag.is_none() || same_etag(&m.e_tag, &meta.e_tag))
                && m.last_modified.timestamp() == meta.last_modified.timestamp()
        })
    }

    /// Takes the lease if it is absent, free, expired or this node's; returns the version a
    /// renewal must match, `None` if another node holds it (or won the race for it).
    async fn claim(&self, objects: &Objects) -> Result<Option<UpdateVersion>, TierError> {
        let seen = self.read_lease(objects).await?;
        match seen {
            None => match self.write_lease(objects, None, true).await? {
                Some(version) => self.confirm(objects, version).await,
                None => Ok(None),
            },
            Some(seen) => {
                let free = seen.holder.is_empty() || seen.holder == self.holder;
                if !free && seen.expiry_ms > now_ms() && !self.skewed_and_stale(&seen) {
                    return Ok(None);
                }
                let taken = match self.write_lease(objects, Some(seen.version), true).await? {
                    Some(version) => self.confirm(objects, version).await?,
                    None => None,
                };
                if taken.is_some() && !free {
                    self.takeovers.fetch_add(1, Relaxed);
                    tracing::info!(holder = %seen.holder, "took the shared prefix's eviction lease over");
                }
                Ok(taken)
            }
        }
    }

    /// Whether another node's lease that expires more than a lease from now (its clock runs
    /// ahead) has stayed as it is (its ETag) for a whole lease by this node's clock: its
    /// holder, which renews it far more often, is gone. (Taken at its word, a lease written
    /// by a clock an hour ahead blocked eviction for that hour.)
    fn skewed_and_stale(&self, lease: &LeaseSeen) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if lease.expiry_ms <= now_ms() + self.settings.lease.as_millis() as u64 {
            *seen = None;
            return false;
        }
        let tag = (lease.holder.clone(), lease.version.e_tag.clone());
        match &*seen {
            Some((holder, e_tag, since)) if (holder, e_tag) == (&tag.0, &tag.1) => {
                since.elapsed() > self.settings.lease
            }
            _ => {
                *seen = Some((tag.0, tag.1, Instant::now()));
                false
            }
        }
    }

    /// A lease just written, read back after a pause: still this node's, or another's that
    /// landed over it (a store whose conditional writes are not atomic with their check lets
    /// two racing writes both succeed; the later one holds).
    async fn confirm(
        &self,
        objects: &Objects,
        version: UpdateVersion,
    ) -> Result<Option<UpdateVersion>, TierError> {
        tokio::time::sleep(CONFIRM_AFTER).await;
        Ok(match self.read_lease(objects).await? {
            Some(seen)
                if seen.holder == self.holder && same_etag(&seen.version.e_tag, &version.e_tag) =>
            {
                Some(version)
            }
            _ => None,
        })
    }

    fn lease_path(objects: &Objects) -> Path {
        objects.prefix.clone().join(PathPart::from(LEASE))
    }

    async fn read_lease(&self, objects: &Objects) -> Result<Option<LeaseSeen>, TierError> {
        let path = Self::lease_path(objects);
        let got = match objects.store.get(&path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(objects.error(None, e)),
        };
        let version = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        let body = got.bytes().await.map_err(|e| objects.error(None, e))?;
        let text = String::from_utf8_lossy(&body);
        let mut parts = text.split_whitespace();
        Ok(Some(LeaseSeen {
            holder: parts.next().unwrap_or_default().to_string(),
            expiry_ms: parts.next().and_then(|e| e.parse().ok()).unwrap_or(0),
            version,
        }))
    }

    /// Writes the lease (held for `lease` from now, or free), created if `over` is `None`,
    /// else replacing that version; `None` if the store refused the condition.
    async fn write_lease(
        &self,
        objects: &Objects,
        over: Option<UpdateVersion>,
        hold: bool,
    ) -> Result<Option<UpdateVersion>, TierError> {
        let body = if hold {
            format!(
                "{} {}\n",
                self.holder,
                now_ms() + self.settings.lease.as_millis() as u64
            )
        } else {
            String::new()
        };
        let mode = match over {
            None => PutMode::Create,
            Some(v) => PutMode::Update(v),
        };
        let put = objects
            .store
            .put_opts(
                &Self::lease_path(objects),
                PutPayload::from(body.into_bytes()),
                PutOptions::from(mode),
            )
            .await;
        match put {
            Ok(done) => Ok(Some(UpdateVersion {
                e_tag: done.e_tag,
                version: done.version,
            })),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(None),
            Err(e) => Err(objects.error(None, e)),
        }
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The page bytes an object holds, as a prefix's capacity counts them (as its puts do): its
/// bytes less the trailer.
fn page_bytes(meta: &object_store::ObjectMeta) -> u64 {
    tier_format::page_len(meta.size).unwrap_or(meta.size)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Whether two ETags name the same version, whatever their form: stores quote them in some
/// answers and not in others (Azure lists them bare and HEADs them quoted), and mark weak ones
/// `W/`.
fn same_etag(a: &Option<String>, b: &Option<String>) -> bool {
    let bare = |tag: &str| {
        let tag = tag.trim();
        let tag = tag.strip_prefix("W/").unwrap_or(tag);
        tag.trim_matches('"').to_owned()
    };
    match (a, b) {
        (Some(a), Some(b)) => bare(a) == bare(b),
        (None, None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::same_etag;

    #[test]
    fn etags_match_whatever_their_quoting() {
        let tag = |s: &str| Some(s.to_owned());
        assert!(
            same_etag(&tag("\"0x8D9\""), &tag("0x8D9")),
            "Azure: listed bare, HEAD quoted"
        );
        assert!(same_etag(&tag("W/\"abc\""), &tag("\"abc\"")));
        assert!(!same_etag(&tag("\"abc\""), &tag("\"abd\"")));
        assert!(!same_etag(&tag("abc"), &None));
        assert!(same_etag(&None, &None));
    }
}
