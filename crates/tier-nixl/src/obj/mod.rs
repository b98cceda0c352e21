//! The NIXL OBJ tier: pages as S3 objects, their bytes moved by NIXL's OBJ plugin.
//!
//! Each batch is one DRAM registration (the pages' own bytes for puts, a buffer of the batch's
//! own for gets), one OBJ registration (object key in each descriptor's metaInfo, a unique
//! devId each) and one transfer. What NIXL OBJ lacks goes through `object_store` on the same
//! bucket, by [`tier_object::ObjectTier`]: `exists` (concurrent HEADs), `remove`, `clear` (of
//! the tier's prefix only), and the length check before a read.
//!
//! Objects are named exactly as [`tier_object::ObjectTier`] names them (`<prefix>/<bucket>/
//! <escaped key>`), so both tiers on one bucket and prefix see the same pages.
//!
//! A read needs each object's length first: NIXL OBJ reads a byte range, and a range of the
//! wrong length would silently return part of a page. So a get is one HEAD per page plus one
//! NIXL transfer for the batch.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use tier_core::{
    async_trait, GetResult, Lookup, Page, PageKey, PutResult, ReadSlot, RemoveResult,
    StatsRecorder, StorageTier, TierError, TierInfo, TierStats,
};
use tier_object::{ObjectTier, ObjectTierConfig};

use crate::batch::{marked_bufs, run_blocking};
use crate::nixl::{Agent, Backend};

mod config;
#[cfg(test)]
mod tests;
mod transfer;

pub use config::{NixlObjConfig, RequestChecksum};
use transfer::OBJ_READ_ATTEMPTS;

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

impl NixlObjTier {
    /// What this node did for a shared prefix (`None` unless it is shared and bounded).
    pub fn prefix_stats(&self) -> Option<tier_object::PrefixStats> {
        self.shared.control.prefix_stats()
    }

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
        control_config.access = config.access;
        control_config.shared = config.shared;
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
                    // the page and its trailer (see `tier_format`) gathered into one buffer.
                    writes.push((page.key.clone(), object.to_string(), sealed(page)));
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
                    .map(|((key, _, data), _)| (key, data.len() as u64 - tier_format::TRAILER));
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
        // NIXL reads a range of whatever the name holds when its request arrives: what arrived
        // may mix two objects. The trailer tells: bytes that open as one whole page of the key
        // are a hit. Others, of an object replaced while it was read, are read again (a few
        // times); of one unchanged, removed, or replaced every time, a miss.
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
            // Only reads not proven whole ask the store again.
            let doubtful: Vec<PageKey> = reads
                .iter()
                .zip(&outcome)
                .filter(|(_, r)| !matches!(r, Ok(true)))
                .map(|((_, k, _, _), _)| k.clone())
                .collect();
            let mut after = shared.control.object_ids(&doubtful).await.into_iter();
            let mut again = Vec::new();
            for ((i, key, object, before), r) in reads.into_iter().zip(outcome) {
                if matches!(r, Ok(true)) {
                    results[i] = Some(Ok(Lookup::Hit));
                    continue;
                }
                let after = after.next().expect("an answer per doubtful read");
                results[i] = Some(match (r, after) {
                    // Replaced while read (or a transfer failed on an object that did not
                    // change: S3 clients retry those too; not one that timed out, which keeps
                    // its memory for good): read it again.
                    (r, Ok(Some(now)))
                        if (now != before
                            || matches!(r, Err(ref e) if !matches!(e, TierError::Timeout { .. })))
                            && now.len == before.len
                            && attempt < OBJ_READ_ATTEMPTS =>
                    {
                        again.push((i, key, object, now));
                        continue;
                    }
                    // Unchanged, yet not a whole page of the key (torn, foreign, of format 1):
                    // a miss, and counted.
                    (Ok(false), Ok(Some(now))) if now == before => {
                        shared.stats.errors(1);
                        Ok(Lookup::Miss)
                    }
                    (Ok(_), _) => Ok(Lookup::Miss),
                    (Err(_), Ok(after)) if after.as_ref() != Some(&before) => Ok(Lookup::Miss),
                    (Err(e), _) => Err(e),
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

    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        self.shared.control.touch(keys).await
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

    async fn flush(&self) -> Result<(), TierError> {
        self.shared.control.flush().await
    }

    async fn clear(&self) -> Result<(), TierError> {
        self.shared.control.clear().await
    }
}

/// `page`'s bytes then their trailer, in one buffer: the object a put writes.
fn sealed(page: &Page<'_>) -> tier_core::Bytes {
    let mut bytes = Vec::with_capacity(tier_format::sealed_len(page.data.len()) as usize);
    for region in page.data.regions() {
        bytes.extend_from_slice(region);
    }
    bytes.extend_from_slice(&tier_format::seal(&page.key, page.data.regions()));
    bytes.into()
}
