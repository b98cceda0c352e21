//! The NIXL OBJ tier: pages as S3 objects, their bytes moved by NIXL's OBJ plugin.
//!
//! Each batch is one DRAM registration (the pages' own bytes for puts, a buffer of the batch's
//! own for gets), one OBJ registration (object key in each descriptor's metaInfo, a unique
//! devId each) and one transfer. What NIXL OBJ lacks goes through `object_store` on the same
//! bucket, by [`tier_object::ObjectTier`]: `exists` (concurrent HEADs), `remove`, `clear` (of
//! the tier's prefix only), and the length check before a read.
//!
//! Objects are named exactly as [`tier_object::ObjectTier`] names them (`<prefix>/<escaped
//! key>`), so both tiers on one bucket and prefix see the same pages.
//!
//! A read needs each object's length first: NIXL OBJ reads a byte range, and a range of the
//! wrong length would silently return part of a page. So a get is one HEAD per page plus one
//! NIXL transfer for the batch.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tier_core::{
    async_trait, Bytes, GetResult, Lookup, Page, PageBuf, PageKey, PutResult, ReadSlot,
    RemoveResult, StatsRecorder, StorageTier, TierError, TierInfo, TierStats,
};
use tier_object::{ObjectId, ObjectTier, ObjectTierConfig, S3Settings};

use crate::batch::{marked_bufs, run_blocking, send_pages, BatchOutcome};
use crate::nixl::{
    next_dev_id, Agent, Backend, Desc, Finished, Held, MemKind, Owned, Registered, XferOp,
};

/// How the S3 SDK inside NIXL checksums requests (`req_checksum`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestChecksum {
    /// Checksum every request body (plain bodies; works on every S3-compatible server).
    #[default]
    Required,
    /// Only where the operation requires it (the SDK may send `aws-chunked` bodies, which some
    /// S3-compatible servers store verbatim).
    Supported,
}

/// Configuration of a [`NixlObjTier`].
#[derive(Debug, Clone)]
pub struct NixlObjConfig {
    /// Instance name, for logs and stats.
    pub name: String,
    /// Namespace inside the bucket: `/`-separated parts of `[A-Za-z0-9._-]`, none `.` or `..`.
    pub prefix: String,
    /// Bucket, endpoint, credentials, region, addressing style; also the `object_store`
    /// client's timeouts and retries.
    pub s3: S3Settings,
    /// Request checksum mode of NIXL's S3 client.
    pub checksum: RequestChecksum,
    /// CA bundle for HTTPS endpoints.
    pub ca_bundle: Option<PathBuf>,
    /// Objects at least this large go through NIXL's S3 CRT client (multipart, parallel
    /// ranges); `None` leaves the plugin's default.
    pub crt_min_bytes: Option<u64>,
    /// Further OBJ plugin parameters, applied last (e.g. `num_threads`).
    pub plugin_params: BTreeMap<String, String>,
    /// NIXL agents, i.e. batches moving at once.
    pub lanes: usize,
    /// Requests in flight per batch: `object_store` HEADs and deletes, and the threads of NIXL's
    /// S3 client (`num_threads`, unless `plugin_params` sets it).
    pub concurrency: usize,
    /// Largest page accepted.
    pub max_page_bytes: usize,
    /// Bound on each NIXL transfer and each `object_store` call.
    pub transfer_timeout: Duration,
    /// Bytes that transfers which never finished may keep for good (NIXL's S3 client may
    /// still finish a request kvtier gave up on) before the tier refuses new ones with an
    /// error: an outage costs errors, not unbounded memory.
    pub max_abandoned_bytes: usize,
    /// Folder holding `libnixl_capi.so`, searched before `$NIXL_LIB_DIR` and the defaults.
    pub runtime_dir: Option<PathBuf>,
    /// Bytes of pages the tier holds under its prefix; beyond it, `policy` evicts (the
    /// catalog is the object_store tier's, see [`tier_object`]). `None`: unbounded.
    pub capacity_bytes: Option<u64>,
    /// Which pages go first when the capacity is reached.
    pub policy: tier_policy::PolicyKind,
}

impl NixlObjConfig {
    /// Defaults for the bucket `s3` names, under `prefix`.
    pub fn new(s3: S3Settings, prefix: impl Into<String>) -> Self {
        Self {
            name: "nixl-obj".into(),
            prefix: prefix.into(),
            s3,
            checksum: RequestChecksum::Required,
            ca_bundle: None,
            crt_min_bytes: None,
            plugin_params: BTreeMap::new(),
            lanes: 2,
            concurrency: 16,
            max_page_bytes: 256 << 20,
            transfer_timeout: Duration::from_secs(30),
            max_abandoned_bytes: crate::nixl::DEFAULT_ABANDON_LIMIT,
            runtime_dir: None,
            capacity_bytes: None,
            policy: tier_policy::PolicyKind::default(),
        }
    }

    /// Checks the settings that need no I/O.
    pub fn validate(&self) -> Result<(), TierError> {
        tier_object::check_prefix(&self.prefix)?;
        if self.capacity_bytes == Some(0) {
            return Err(TierError::config(
                "capacity",
                "must be at least 1 byte (or unset)",
            ));
        }
        if self.capacity_bytes.is_some() && self.policy.build::<PageKey>().is_none() {
            return Err(TierError::config(
                "policy",
                "tinylfu is moka's, for DRAM tiers; an object tier takes lru, sieve, s3fifo, arc or prefix",
            ));
        }
        if self.s3.access_key.is_empty() || self.s3.secret_key.is_empty() {
            return Err(TierError::config(
                "access_key",
                "S3 credentials are missing",
            ));
        }
        if !(1..=crate::file::MAX_LANES).contains(&self.lanes) {
            return Err(TierError::config(
                "lanes",
                format!(
                    "must be 1 to {} (one NIXL agent each)",
                    crate::file::MAX_LANES
                ),
            ));
        }
        if !(1..=1024).contains(&self.concurrency) {
            return Err(TierError::config("concurrency", "must be 1 to 1024"));
        }
        if !(1..=MAX_OBJECT).contains(&self.max_page_bytes) {
            return Err(TierError::config(
                "max_page",
                "must be 1 byte to 5 GiB (the largest single S3 PUT)",
            ));
        }
        if self.transfer_timeout.is_zero() {
            return Err(TierError::config("transfer_timeout", "must be positive"));
        }
        if self.s3.bucket.is_empty() {
            return Err(TierError::config("bucket", "a bucket is required"));
        }
        if let Some(endpoint) = &self.s3.endpoint {
            if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
                return Err(TierError::config(
                    "endpoint",
                    format!("{endpoint:?} must start with http:// or https://"),
                ));
            }
        }
        Ok(())
    }

    /// The OBJ plugin's backend parameters.
    pub fn backend_params(&self) -> BTreeMap<String, String> {
        let s3 = &self.s3;
        let mut p = BTreeMap::new();
        p.insert("bucket".into(), s3.bucket.clone());
        p.insert("region".into(), s3.region.clone());
        p.insert("access_key".into(), s3.access_key.clone());
        p.insert("secret_key".into(), s3.secret_key.clone());
        p.insert(
            "use_virtual_addressing".into(),
            s3.virtual_hosted.to_string(),
        );
        let scheme = match &s3.endpoint {
            Some(e) if e.starts_with("http://") => "http",
            _ => "https",
        };
        p.insert("scheme".into(), scheme.into());
        if let Some(endpoint) = &s3.endpoint {
            p.insert("endpoint_override".into(), endpoint.clone());
        }
        let checksum = match self.checksum {
            RequestChecksum::Required => "required",
            RequestChecksum::Supported => "supported",
        };
        p.insert("req_checksum".into(), checksum.into());
        if let Some(ca) = &self.ca_bundle {
            p.insert("ca_bundle".into(), ca.display().to_string());
        }
        if let Some(min) = self.crt_min_bytes {
            p.insert("crtMinLimit".into(), min.to_string());
        }
        // The plugin's thread pool bounds its requests in flight; its default is one thread
        // per core (2 here), which left gets at a tenth of an object_store client's rate.
        p.insert("num_threads".into(), self.concurrency.to_string());
        p.extend(self.plugin_params.clone());
        p
    }
}

/// The largest object one S3 PUT may write.
const MAX_OBJECT: usize = 5 << 30;

/// Reads of an object overwritten while it was read, before it is answered as a miss (S3
/// answers a ranged GET of whatever the name holds when the request arrives). With the pauses
/// between them (2 to 32 ms) about 0.4 s: writers busy on one key under a loaded machine
/// outlasted eight.
const OBJ_READ_ATTEMPTS: u32 = 16;

/// Whether `bytes` are the content one of `ids` names: their MD5 is its entity tag (what S3
/// and compatible stores give for an object written by one PUT).
fn holds_tagged(bytes: &[u8], ids: [&ObjectId; 2]) -> bool {
    use md5::{Digest, Md5};
    let digest = Md5::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    ids.iter().any(|id| {
        id.e_tag
            .as_deref()
            .is_some_and(|tag| tag.trim_matches('"').eq_ignore_ascii_case(&hex))
    })
}

/// A shared page tier on S3-compatible object storage, data moved by NIXL OBJ.
pub struct NixlObjTier {
    shared: Arc<Shared>,
}

struct Shared {
    config: NixlObjConfig,
    /// Control path on the same bucket and prefix.
    control: ObjectTier,
    /// One agent and OBJ backend per lane. Dropped with the tier, on the dropping thread: an
    /// agent whose transfer timed out is never destroyed, since its leaked registration holds
    /// it (its S3 client may still be finishing that request).
    lanes: Vec<Arc<Backend>>,
    next_lane: AtomicUsize,
    stats: StatsRecorder,
}

/// One page to move: its object, its length, and the DRAM address of its bytes.
struct ObjXfer {
    key: PageKey,
    object: String,
    len: usize,
    local: usize,
}

impl NixlObjTier {
    /// Opens the tier: loads the NIXL runtime, creates one OBJ backend per lane and the
    /// `object_store` client. No request is made: a wrong endpoint or credential shows on
    /// the first call.
    pub async fn open(config: NixlObjConfig) -> Result<Self, TierError> {
        config.validate()?;
        let mut control_config = ObjectTierConfig::new(config.prefix.clone());
        control_config.name = config.name.clone();
        control_config.concurrency = config.concurrency;
        control_config.op_timeout = config.transfer_timeout;
        control_config.max_page_bytes = config.max_page_bytes;
        control_config.capacity_bytes = config.capacity_bytes;
        control_config.policy = config.policy;
        let control = ObjectTier::open(config.s3.build()?, control_config)?;
        control.load_catalog().await?;
        let shared = tokio::task::spawn_blocking(move || -> Result<Shared, TierError> {
            let runtime = crate::runtime::load(config.runtime_dir.as_deref())?;
            let params = config.backend_params();
            let lanes = (0..config.lanes)
                .map(|lane| create_backend(&config.name, lane, &params))
                .collect::<Result<Vec<_>, _>>()?;
            for lane in &lanes {
                lane.limit_abandoned(config.max_abandoned_bytes);
            }
            tracing::info!(
                tier = %config.name, %runtime, bucket = %config.s3.bucket,
                prefix = %config.prefix, lanes = config.lanes, "NIXL OBJ tier open"
            );
            Ok(Shared {
                config,
                control,
                lanes,
                next_lane: AtomicUsize::new(0),
                stats: StatsRecorder::default(),
            })
        })
        .await
        .map_err(|e| TierError::Unavailable(format!("opening the tier panicked: {e}")))??;
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// The object a page is stored as.
    pub fn object_name(&self, key: &PageKey) -> Result<String, TierError> {
        self.shared.control.object_path(key).map(|p| p.to_string())
    }
}

fn create_backend(
    name: &str,
    lane: usize,
    params: &BTreeMap<String, String>,
) -> Result<Arc<Backend>, TierError> {
    let backend_err = |message: String| TierError::Backend {
        backend: "nixl OBJ".into(),
        key: None,
        message,
    };
    let agent =
        Agent::for_lane(name, lane).map_err(|e| backend_err(format!("creating the agent: {e}")))?;
    agent
        .create_backend("OBJ", params)
        .map_err(|e| backend_err(format!("creating the OBJ backend: {e}")))
}

impl Shared {
    fn lane(&self) -> &Arc<Backend> {
        let n = self.next_lane.fetch_add(1, Ordering::Relaxed);
        &self.lanes[n % self.lanes.len()]
    }

    fn backend_error(&self, key: Option<&PageKey>, message: String) -> TierError {
        TierError::Backend {
            backend: format!("nixl OBJ (bucket {})", self.config.s3.bucket),
            key: key.cloned(),
            message,
        }
    }

    /// Moves every item (blocking): one registration of all their objects, then one transfer
    /// per item, all posted before any is waited for. One descriptor per transfer makes every
    /// outcome exact: NIXL's OBJ plugin reports a transfer failed as soon as one of its
    /// requests fails, while the others may still be writing into (or reading) their memory.
    /// `memory` registered the items' DRAM; each transfer holds it with the objects.
    fn move_all(
        &self,
        backend: &Arc<Backend>,
        op: XferOp,
        items: &[ObjXfer],
        memory: &Arc<Held>,
    ) -> BatchOutcome {
        let what = match op {
            XferOp::Read => "get object",
            XferOp::Write => "put object",
        };
        let fail_all = |message: String| BatchOutcome {
            results: items
                .iter()
                .map(|item| Err(self.backend_error(Some(&item.key), message.clone())))
                .collect(),
            poisoned: false,
        };
        let remote: Vec<Desc<'_>> = items
            .iter()
            .map(|item| Desc {
                addr: 0,
                len: item.len,
                dev_id: next_dev_id(),
                meta: item.object.as_bytes(),
            })
            .collect();
        let held = match backend.register(MemKind::Object, &remote) {
            Ok(objects) => {
                let mut held = Held::default();
                held.include(memory);
                held.files(objects, Vec::new());
                held.seal()
            }
            Err(e) => return fail_all(format!("{what}: registering objects: {e}")),
        };
        let posted: Vec<_> = items
            .iter()
            .zip(&remote)
            .map(|(item, remote)| {
                backend.post(
                    op,
                    &[Desc::dram(item.local, item.len)],
                    MemKind::Object,
                    std::slice::from_ref(remote),
                    &held,
                )
            })
            .collect();
        let deadline = Instant::now() + self.config.transfer_timeout;
        let mut poisoned = false;
        let results = posted
            .into_iter()
            .zip(items)
            .map(|(posted, item)| {
                let transfer = posted.map_err(|e| {
                    self.backend_error(Some(&item.key), format!("{what}: posting: {e}"))
                })?;
                let left = deadline.saturating_duration_since(Instant::now());
                // The tier's own memory: an unsettled transfer keeps it, never waited on.
                match transfer.finish(left) {
                    Finished::Done => Ok(()),
                    Finished::Failed(e) => Err(self.backend_error(
                        Some(&item.key),
                        format!(
                            "{what}: {e} (S3 refused or was unreachable; NIXL logs the reason on stderr)"
                        ),
                    )),
                    // NIXL's S3 client may still complete a request it was told to drop (its
                    // own retries outlast ours), so memory of a timed-out batch is never reused.
                    Finished::Unsettled(_) => {
                        poisoned = true;
                        Err(TierError::Timeout {
                            op: "NIXL OBJ transfer",
                            after: self.config.transfer_timeout,
                        })
                    }
                }
            })
            .collect();
        BatchOutcome { results, poisoned }
    }

    /// Writes pages from their own bytes (blocking).
    fn write_pages(&self, pages: &[(PageKey, String, Bytes)]) -> Vec<Result<(), TierError>> {
        let backend = self.lane();
        let data: Vec<&[u8]> = pages.iter().map(|(_, _, d)| &d[..]).collect();
        let owner: Vec<Bytes> = pages.iter().map(|p| p.2.clone()).collect();
        let outcome = send_pages(backend, &data, Some(Arc::new(owner)), &mut |addrs, held| {
            let items: Vec<ObjXfer> = pages
                .iter()
                .zip(addrs)
                .map(|((key, object, data), &local)| ObjXfer {
                    key: key.clone(),
                    object: object.clone(),
                    len: data.len(),
                    local,
                })
                .collect();
            self.move_all(backend, XferOp::Write, &items, held)
        });
        outcome.results
    }

    /// Reads objects into a registered buffer of the batch's own, then copies each page read to
    /// its caller's buffer. A transfer that timed out may still write into that buffer later:
    /// it keeps the buffer for good, and the caller's memory is never at risk.
    fn read_pages(
        &self,
        reads: &[(PageKey, String)],
        bufs: &mut [&mut PageBuf<'_>],
    ) -> Vec<Result<(), TierError>> {
        let backend = self.lane();
        let mut offsets = Vec::with_capacity(bufs.len());
        let mut total = 0;
        for buf in bufs.iter() {
            offsets.push(total);
            total += buf.len();
        }
        let staging = vec![0u8; total.max(1)].into_boxed_slice();
        let base = staging.as_ptr() as usize;
        let staging = match backend.register_dram(&[(base, staging.len())]) {
            Ok(registration) => Arc::new(Owned::new(registration, staging)),
            Err(e) => {
                return reads
                    .iter()
                    .map(|(key, _)| {
                        Err(self.backend_error(Some(key), format!("registering a buffer: {e}")))
                    })
                    .collect()
            }
        };
        let items: Vec<ObjXfer> = reads
            .iter()
            .zip(bufs.iter().zip(&offsets))
            .map(|((key, object), (buf, &off))| ObjXfer {
                key: key.clone(),
                object: object.clone(),
                len: buf.len(),
                local: base + off,
            })
            .collect();
        let mut held = Held::default();
        held.own(Arc::clone(&staging) as Arc<dyn Registered>);
        let outcome = self.move_all(backend, XferOp::Read, &items, &held.seal());
        // Each page read has settled; pages whose transfer did not are errors, not copied.
        let bytes = staging.memory();
        for ((buf, &off), r) in bufs.iter_mut().zip(&offsets).zip(&outcome.results) {
            if r.is_ok() {
                let len = buf.len();
                buf.fill_from(&bytes[off..off + len]);
            }
        }
        outcome.results
    }
}

impl Shared {
    /// NIXL reports a failed S3 request only as a backend error: when a batch had any, ask the
    /// bucket through `object_store` and add its answer (e.g. an authentication failure).
    async fn explain_failures(&self, results: &mut [Result<(), TierError>]) {
        if !results
            .iter()
            .any(|r| matches!(r, Err(TierError::Backend { .. })))
        {
            return;
        }
        if let Err(why) = self.control.check_access().await {
            for r in results.iter_mut() {
                if let Err(TierError::Backend { message, .. }) = r {
                    message.push_str(&format!("; the bucket answers: {why}"));
                }
            }
        }
    }
}

#[async_trait]
impl StorageTier for NixlObjTier {
    fn info(&self) -> TierInfo {
        TierInfo {
            name: self.shared.config.name.clone(),
            kind: "nixl-obj".into(),
            capacity_bytes: self.shared.config.capacity_bytes,
            max_page_bytes: Some(self.shared.config.max_page_bytes),
            persistent: true,
        }
    }

    fn stats(&self) -> TierStats {
        self.shared
            .stats
            .snapshot(self.shared.control.stats().resident_bytes)
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        let shared = &self.shared;
        let mut results: Vec<Option<PutResult>> = (0..pages.len()).map(|_| None).collect();
        // A key repeated in the batch: only its last valid page is written.
        let last = Page::last_valid(pages, Some(shared.config.max_page_bytes));
        let mut positions = Vec::new();
        let mut writes = Vec::new();
        for (i, page) in pages.iter().enumerate() {
            let planned = page
                .check_len(Some(shared.config.max_page_bytes))
                .and_then(|()| shared.control.object_path(&page.key));
            match planned {
                Err(e) => results[i] = Some(Err(e)),
                Ok(_) if last.get(&page.key) != Some(&i) => results[i] = Some(Ok(())),
                Ok(object) => {
                    positions.push(i);
                    // Owned by the transfer (a timed-out OBJ transfer may outlive this call):
                    // lent or multi-region pages are gathered into one buffer here.
                    writes.push((page.key.clone(), object.to_string(), page.data.to_bytes()));
                }
            }
        }
        if !writes.is_empty() {
            let job_shared = Arc::clone(shared);
            let keys: Vec<PageKey> = writes.iter().map(|w| w.0.clone()).collect();
            let turn = shared.control.write_order().turn(&keys).await;
            // Spawned, so a dropped `put` still finishes its transfer with the bytes it owns;
            // it holds its keys' turn until then, so a later write of them never lands first.
            let outcome = tokio::task::spawn_blocking(move || {
                let written = job_shared.write_pages(&writes);
                // Stored pages join the catalog before their turn ends (a bounded tier).
                let stored = writes
                    .iter()
                    .zip(&written)
                    .filter(|(_, r)| r.is_ok())
                    .map(|((key, _, data), _)| (key, data.len() as u64));
                let evicted = job_shared.control.record_stored(stored);
                (0..evicted).for_each(|_| job_shared.stats.eviction());
                drop(turn);
                written
            })
            .await
            .map_err(|e| TierError::Unavailable(format!("write task failed: {e}")));
            match outcome {
                Ok(mut written) => {
                    shared.explain_failures(&mut written).await;
                    for (pos, r) in positions.into_iter().zip(written) {
                        results[pos] = Some(r);
                    }
                }
                Err(e) => {
                    for pos in positions {
                        results[pos] = Some(Err(TierError::Unavailable(e.to_string())));
                    }
                }
            }
        }
        shared.control.delete_evicted().await;
        results
            .into_iter()
            .zip(pages)
            .map(|(r, page)| {
                let r = r.unwrap_or_else(|| {
                    Err(TierError::Unavailable("page was not scheduled".into()))
                });
                match &r {
                    Ok(()) => shared.stats.put(page.data.len()),
                    Err(_) => shared.stats.errors(1),
                }
                r
            })
            .collect()
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let shared = &self.shared;
        let keys: Vec<PageKey> = slots.iter().map(|s| s.key.clone()).collect();
        let ids = shared.control.object_ids(&keys).await;
        let mut results: Vec<Option<GetResult>> = (0..slots.len()).map(|_| None).collect();
        let mut reads = Vec::new();
        for (i, (slot, id)) in slots.iter().zip(ids).enumerate() {
            match id {
                Err(e) => results[i] = Some(Err(e)),
                Ok(None) => results[i] = Some(Ok(Lookup::Miss)),
                Ok(Some(id)) if id.len != slot.buf.len() as u64 => {
                    results[i] = Some(Err(TierError::LengthMismatch {
                        key: slot.key.clone(),
                        stored: id.len as usize,
                        buffer: slot.buf.len(),
                    }))
                }
                Ok(Some(id)) => match shared.control.object_path(&slot.key) {
                    Ok(object) => reads.push((i, slot.key.clone(), object.to_string(), id)),
                    Err(_) => results[i] = Some(Ok(Lookup::Miss)),
                },
            }
        }
        // NIXL reads a range of whatever the name holds when its request arrives: a read is
        // whole only if the object is the same one after it as before it. One replaced while
        // it was read is read again (a few times); one removed, or replaced every time, is a
        // miss: what arrived may mix two objects.
        for attempt in 1..=OBJ_READ_ATTEMPTS {
            if reads.is_empty() {
                break;
            }
            let mut wanted = vec![false; slots.len()];
            for (i, ..) in &reads {
                wanted[*i] = true;
            }
            let mut bufs = marked_bufs(slots, &wanted);
            // `marked_bufs` gives the buffers in slot order: read in that order too.
            reads.sort_by_key(|(i, ..)| *i);
            let objects: Vec<(PageKey, String)> = reads
                .iter()
                .map(|(_, k, o, _)| (k.clone(), o.clone()))
                .collect();
            let outcome = run_blocking(|| shared.read_pages(&objects, &mut bufs));
            drop(bufs);
            let read_keys: Vec<PageKey> = reads.iter().map(|(_, k, _, _)| k.clone()).collect();
            let after = shared.control.object_ids(&read_keys).await;
            let mut again = Vec::new();
            for ((i, key, object, before), (r, after)) in
                reads.into_iter().zip(outcome.into_iter().zip(after))
            {
                results[i] = Some(match (r, after) {
                    // Overwritten while read, yet the bytes are one whole version: the one
                    // whose content hash the store gave as its entity tag.
                    (Ok(()), Ok(Some(now)))
                        if now != before
                            && now.len == before.len
                            && holds_tagged(&slots[i].buf.to_vec(), [&before, &now]) =>
                    {
                        Ok(Lookup::Hit)
                    }
                    // Overwritten while read (or a transfer failed on an object that did
                    // not change: S3 clients retry those too; not one that timed out, which
                    // keeps its memory for good): read it again.
                    (r, Ok(Some(now)))
                        if (now != before
                            || matches!(r, Err(ref e) if !matches!(e, TierError::Timeout { .. })))
                            && now.len == before.len
                            && attempt < OBJ_READ_ATTEMPTS =>
                    {
                        again.push((i, key, object, now));
                        continue;
                    }
                    (_, Ok(after)) if after.as_ref() != Some(&before) => Ok(Lookup::Miss),
                    (Ok(()), Ok(_)) => Ok(Lookup::Hit),
                    (Ok(()), Err(e)) | (Err(e), _) => Err(e),
                });
            }
            reads = again;
            if !reads.is_empty() {
                // Overwritten while read: give the writer a moment before the next attempt.
                tokio::time::sleep(std::time::Duration::from_millis(1 << attempt.min(5))).await;
            }
        }
        let results = shared.stats.settle_gets(results, slots);
        shared.control.record_read(
            slots
                .iter()
                .zip(&results)
                .filter(|(_, r)| matches!(r, Ok(Lookup::Hit)))
                .map(|(s, _)| &s.key),
        );
        results
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        self.shared.control.exists(keys).await
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        let results = self.shared.control.remove(keys).await;
        for r in &results {
            match r {
                Ok(true) => self.shared.stats.removed(),
                Ok(false) => {}
                Err(_) => self.shared.stats.errors(1),
            }
        }
        results
    }

    async fn clear(&self) -> Result<(), TierError> {
        self.shared.control.clear().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nixl::Unsettled;
    use tier_tests::s3::S3Server;

    fn backend(server: &S3Server) -> Arc<Backend> {
        let s3 = S3Settings::endpoint(
            &server.endpoint(),
            &server.bucket,
            &server.access_key,
            &server.secret_key,
        );
        let config = NixlObjConfig::new(s3, "unsettled");
        crate::runtime::load(None).expect("the NIXL runtime");
        create_backend("unsettled-test", 0, &config.backend_params()).expect("an OBJ backend")
    }

    fn object(name: &str, len: usize) -> Desc<'_> {
        Desc {
            addr: 0,
            len,
            dev_id: next_dev_id(),
            meta: name.as_bytes(),
        }
    }

    /// Moves one object to or from `buf` in a transfer of its own.
    fn move_one(backend: &Arc<Backend>, op: XferOp, name: &str, buf: &[u8]) -> Finished {
        let remote = [object(name, buf.len())];
        let mut held = Held::default();
        held.lend(
            backend
                .register_dram(&[(buf.as_ptr() as usize, buf.len())])
                .unwrap(),
        );
        held.files(
            backend.register(MemKind::Object, &remote).unwrap(),
            Vec::new(),
        );
        let local = [Desc::dram(buf.as_ptr() as usize, buf.len())];
        let transfer = backend
            .post(op, &local, MemKind::Object, &remote, &held.seal())
            .unwrap();
        transfer.finish(Duration::from_secs(30))
    }

    /// A transfer to an endpoint that never answers times out: it keeps the memory it holds
    /// (never freed under a late request), counts it against its backend's bound, and past the
    /// bound the backend refuses new transfers. Misuse is refused too: a descriptor outside
    /// what the transfer holds registered.
    #[test]
    fn a_transfer_that_never_settles_keeps_its_memory_and_bounds_its_backend() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", silent.local_addr().unwrap());
        let s3 = S3Settings::endpoint(&endpoint, "bucket", "key", "secret");
        let config = NixlObjConfig::new(s3, "silent");
        crate::runtime::load(None).expect("the NIXL runtime");
        let backend =
            create_backend("silent-test", 0, &config.backend_params()).expect("an OBJ backend");
        backend.limit_abandoned(4096);
        let post = |name: &str, local_offset: usize| {
            let buf = vec![7u8; 4096].into_boxed_slice();
            let addr = buf.as_ptr() as usize;
            let memory = Arc::new(Owned::new(
                backend.register_dram(&[(addr, 4096)]).unwrap(),
                buf,
            ));
            let remote = [object(name, 4096)];
            let mut held = Held::default();
            held.own(Arc::clone(&memory) as Arc<dyn Registered>);
            held.files(
                backend.register(MemKind::Object, &remote).unwrap(),
                Vec::new(),
            );
            let local = [Desc::dram(addr + local_offset, 4096)];
            let posted = backend.post(
                XferOp::Write,
                &local,
                MemKind::Object,
                &remote,
                &held.seal(),
            );
            (memory, posted)
        };

        let (_, outside) = post("outside", 1);
        let refused = outside
            .err()
            .expect("a descriptor past the registered range is refused");
        assert!(refused.to_string().contains("outside"), "{refused}");

        let (memory, posted) = post("first", 0);
        match posted.unwrap().finish(Duration::from_millis(300)) {
            Finished::Unsettled(Unsettled::TimedOut) => {}
            other => panic!("a request nobody answers: want timed out, got {other:?}"),
        }
        assert!(
            Arc::strong_count(&memory) > 1,
            "the timed-out transfer let go of memory its request may still read"
        );
        assert_eq!(backend.abandoned_bytes(), 4096);

        // At the bound, one more may go; past it, none.
        let (_, posted) = post("second", 0);
        assert!(matches!(
            posted.unwrap().finish(Duration::from_millis(300)),
            Finished::Unsettled(Unsettled::TimedOut)
        ));
        let (_, refused) = post("third", 0);
        let refused = refused
            .err()
            .expect("past the bound, transfers are refused");
        assert!(
            refused.to_string().contains("over the bound of 4096"),
            "{refused}"
        );
    }

    /// NIXL's OBJ plugin reports a transfer failed as soon as one of its requests fails, while
    /// the others may still be writing into their memory: freeing or reusing that memory then
    /// corrupted the heap (a "double free" abort seen once in CI). A failure among several
    /// descriptors must leave the transfer unsettled; a failure of the only one is settled.
    #[test]
    fn a_failure_among_several_objects_leaves_the_transfer_unsettled() {
        let server = S3Server::shared();
        let backend = backend(&server);
        const BIG: usize = 32 << 20;
        let content: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8 + 1).collect();
        assert!(matches!(
            move_one(&backend, XferOp::Write, "big", &content),
            Finished::Done
        ));

        let missing = vec![0u8; 4096];
        match move_one(&backend, XferOp::Read, "missing", &missing) {
            Finished::Failed(_) => {}
            other => panic!("one missing object: want a settled failure, got {other:?}"),
        }

        // Big first, missing last: the plugin looks at its requests from the last one. The
        // memory is the transfer's own: it holds it while others of its requests may run.
        let big = vec![0u8; BIG].into_boxed_slice();
        let small = vec![0u8; 4096].into_boxed_slice();
        let regions = [
            (big.as_ptr() as usize, BIG),
            (small.as_ptr() as usize, small.len()),
        ];
        let memory = Arc::new(Owned::new(
            backend.register_dram(&regions).unwrap(),
            (big, small),
        ));
        let remote = [object("big", BIG), object("missing", 4096)];
        let mut held = Held::default();
        held.own(Arc::clone(&memory) as Arc<dyn Registered>);
        held.files(
            backend.register(MemKind::Object, &remote).unwrap(),
            Vec::new(),
        );
        let local = [
            Desc::dram(regions[0].0, BIG),
            Desc::dram(regions[1].0, 4096),
        ];
        let transfer = backend
            .post(XferOp::Read, &local, MemKind::Object, &remote, &held.seal())
            .unwrap();
        match transfer.finish(Duration::from_secs(30)) {
            Finished::Unsettled(Unsettled::Failed(_)) => {}
            other => panic!("a missing object among two: want unsettled, got {other:?}"),
        }
        assert!(
            Arc::strong_count(&memory) > 1,
            "the transfer let go of memory its other request may still write"
        );
    }
}
