//! [`Objects`]: the tier's requests to its store, shared with the tasks its writes run in.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use object_store::path::{Path, PathPart};
use object_store::{MultipartUpload, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use tier_core::{
    GetResult, Page, PageData, PageKey, PutResult, ReadSlot, RemoveResult, StatsRecorder,
    TierError, TierInfo, TierStats,
};

use crate::catalog::Catalog;
use crate::names::{escape, parse_prefix};
use crate::unfinished::Unfinished;
use crate::PrefixAccess;
use crate::{ObjectId, ObjectTierConfig};

/// Longest escaped object name (stores that keep objects as files need it under NAME_MAX).
const MAX_NAME: usize = 200;
/// Buckets a prefix's pages are spread over: `<prefix>/<bucket>/<escaped key>`, the bucket
/// named by two hex digits of the key's route hash, so that a prefix lists bucket by bucket,
/// in parallel (and on stores that keep objects as files, folder by folder).
pub(crate) const BUCKETS: usize = 256;

/// The bucket of `key`'s object.
pub(crate) fn bucket_of(key: &PageKey) -> usize {
    (tier_format::route_hash(key.as_str().as_bytes()) % BUCKETS as u64) as usize
}

fn bucket_name(b: usize) -> String {
    format!("{b:02x}")
}

/// The tier's requests; shared with the tasks its writes run in.
pub(crate) struct Objects {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) prefix: Path,
    pub(crate) config: ObjectTierConfig,
    pub(crate) backend: String,
    pub(crate) stats: StatsRecorder,
    pub(crate) catalog: Option<Catalog>,
    /// LIST requests made, as S3 pages them (see [`Objects::count_listed`]).
    pub(crate) list_requests: std::sync::atomic::AtomicU64,
}

/// Keys taken for deletion, given back to the catalog if the deletion never started.
pub(crate) struct GiveBack {
    pub(crate) objects: Arc<Objects>,
    pub(crate) keys: Vec<PageKey>,
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        if let Some(catalog) = &self.objects.catalog {
            catalog.give_back(std::mem::take(&mut self.keys));
        }
    }
}

impl Objects {
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        mut config: ObjectTierConfig,
    ) -> Result<Self, TierError> {
        if !(1..=1024).contains(&config.concurrency) {
            return Err(TierError::config("concurrency", "must be 1 to 1024"));
        }
        if config.op_timeout.is_zero() {
            return Err(TierError::config("op_timeout", "must be positive"));
        }
        let prefix = parse_prefix(&config.prefix)?;
        let catalog = match config.capacity_bytes {
            None => None,
            Some(0) => {
                return Err(TierError::config(
                    "capacity",
                    "must be at least 1 byte (or unset)",
                ))
            }
            Some(capacity) => {
                // A page larger than the bound would only be stored to be evicted.
                config.max_page_bytes = config
                    .max_page_bytes
                    .min(usize::try_from(capacity).unwrap_or(usize::MAX));
                let policy = config.policy.build().ok_or_else(|| {
                    TierError::config(
                        "policy",
                        "tinylfu is moka's, for DRAM tiers; an object tier takes auto, lru, sieve, s3fifo, arc, prefix, radix, lfu or sampled",
                    )
                })?;
                Some(Catalog::new(policy, capacity))
            }
        };
        let shared = &config.shared;
        if !(shared.low_watermark > 0.0 && shared.low_watermark < 1.0) {
            return Err(TierError::config(
                "low_watermark",
                format!("must be above 0 and below 1, not {}", shared.low_watermark),
            ));
        }
        if shared.lease.is_zero() || shared.relist.is_zero() {
            return Err(TierError::config(
                "lease",
                "lease and relist must be positive",
            ));
        }
        // A shared prefix's capacity is its fleet's (see `shared`), not a catalog's.
        let catalog = catalog.filter(|_| config.access != PrefixAccess::Shared);
        Ok(Self {
            catalog,
            backend: format!("object store {store}"),
            store,
            prefix,
            config,
            stats: StatsRecorder::default(),
            list_requests: Default::default(),
        })
    }

    /// The object a page is stored as, or `KeyRejected` if its escaped name is too long for
    /// stores that keep objects as files.
    pub(crate) fn object_path(&self, key: &PageKey) -> Result<Path, TierError> {
        let name = escape(key);
        if name.len() > MAX_NAME {
            return Err(TierError::KeyRejected {
                key: key.clone(),
                reason: "the key escaped as an object name exceeds 200 bytes",
            });
        }
        Ok(self
            .bucket(bucket_of(key))
            .join(PathPart::from(name.as_str())))
    }

    /// The folder of bucket `b` under the prefix.
    pub(crate) fn bucket(&self, b: usize) -> Path {
        self.prefix
            .clone()
            .join(PathPart::from(bucket_name(b).as_str()))
    }

    pub(crate) fn error(&self, key: Option<&PageKey>, e: object_store::Error) -> TierError {
        let message = match &e {
            object_store::Error::Unauthenticated { .. }
            | object_store::Error::PermissionDenied { .. } => {
                format!("authentication failed: {e}")
            }
            _ => e.to_string(),
        };
        TierError::Backend {
            backend: self.backend.clone(),
            key: key.cloned(),
            message,
        }
    }

    pub(crate) async fn bounded<T>(
        &self,
        op: &'static str,
        fut: impl std::future::Future<Output = Result<T, TierError>>,
    ) -> Result<T, TierError> {
        tokio::time::timeout(self.config.op_timeout, fut)
            .await
            .unwrap_or(Err(TierError::Timeout {
                op,
                after: self.config.op_timeout,
            }))
    }

    pub(crate) async fn put_one(&self, page: &Page<'_>) -> PutResult {
        page.check_len(Some(self.config.max_page_bytes))?;
        let path = self.object_path(&page.key)?;
        let mode = if self.config.create_only {
            PutMode::Create
        } else {
            PutMode::Overwrite
        };
        // The object: the page's bytes, then their trailer (see `tier_format`).
        let trailer =
            bytes::Bytes::copy_from_slice(&tier_format::seal(&page.key, page.data.regions()));
        self.bounded("object put", async {
            let result = if page.data.len() > self.config.multipart_threshold {
                self.put_multipart(&path, &page.data, trailer).await
            } else {
                let opts = PutOptions {
                    mode,
                    ..Default::default()
                };
                self.store
                    .put_opts(
                        &path,
                        PutPayload::from_iter(
                            page.data.shared_regions().into_iter().chain([trailer]),
                        ),
                        opts,
                    )
                    .await
                    .map(|_| ())
            };
            match result {
                Ok(()) => Ok(()),
                // Create-only: the key is already stored, by this or another writer.
                Err(object_store::Error::AlreadyExists { .. }) if self.config.create_only => Ok(()),
                Err(e) => Err(self.error(Some(&page.key), e)),
            }
        })
        .await
    }

    /// Uploads a page and its `trailer` in parts of [`PART_BYTES`] (the trailer with the last),
    /// [`PARTS_AT_ONCE`] at a time. An upload that fails, or whose call is dropped (a timeout,
    /// a cancelled put), is aborted, so the store keeps no parts of it.
    pub(crate) async fn put_multipart(
        &self,
        path: &Path,
        data: &PageData<'_>,
        trailer: bytes::Bytes,
    ) -> object_store::Result<()> {
        let mut upload = Unfinished(Some(self.store.put_multipart(path).await?));
        let bytes = data.to_bytes();
        let mut parts: Vec<Vec<bytes::Bytes>> = (0..bytes.len())
            .step_by(PART_BYTES)
            .map(|at| vec![bytes.slice(at..(at + PART_BYTES).min(bytes.len()))])
            .collect();
        match parts.last_mut() {
            Some(last) => last.push(trailer),
            None => parts.push(vec![trailer]),
        }
        let uploaded = async {
            for window in parts.chunks(PARTS_AT_ONCE) {
                let sent: Vec<_> = window
                    .iter()
                    .map(|part| {
                        let payload = PutPayload::from_iter(part.iter().cloned());
                        Ok(upload.get()?.put_part(payload))
                    })
                    .collect::<object_store::Result<_>>()?;
                futures::future::try_join_all(sent).await?;
            }
            upload.get()?.complete().await
        }
        .await;
        // A failed upload is aborted by the guard, in the background: an abort awaited here
        // would itself be cut short were this call dropped meanwhile.
        if uploaded.is_ok() {
            upload.0 = None;
        }
        uploaded.map(|_| ())
    }

    pub(crate) async fn get_one(&self, slot: &mut ReadSlot<'_>) -> GetResult {
        let path = match self.object_path(&slot.key) {
            Ok(path) => path,
            Err(_) => return slot.answer(None, &self.stats),
        };
        let key = slot.key.clone();
        let fetched = self
            .bounded("object get", async {
                match self.store.get(&path).await {
                    Ok(result) => result
                        .bytes()
                        .await
                        .map(Some)
                        .map_err(|e| self.error(Some(&key), e)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(e) => Err(self.error(Some(&key), e)),
                }
            })
            .await;
        match fetched {
            Ok(Some(stored)) => match tier_format::open(&key, &stored) {
                Ok(page) => slot.answer(Some(page), &self.stats),
                // Not a whole page of this key: a miss, and counted (a torn or foreign object,
                // or one of format 1).
                Err(why) => {
                    tracing::debug!(key = %key, why, "not a page object");
                    self.stats.errors(1);
                    slot.answer(None, &self.stats)
                }
            },
            Ok(None) => slot.answer(None, &self.stats),
            Err(e) => {
                self.stats.errors(1);
                Err(e)
            }
        }
    }

    pub(crate) async fn present(&self, key: &PageKey) -> Result<bool, TierError> {
        Ok(self.stored_len(key).await?.is_some())
    }

    /// The page length a key's object holds (`None`: absent, or too short to hold one), by
    /// one HEAD.
    pub async fn stored_len(&self, key: &PageKey) -> Result<Option<u64>, TierError> {
        Ok(self.object_id(key).await?.map(|id| id.len))
    }

    pub(crate) async fn object_id(&self, key: &PageKey) -> Result<Option<ObjectId>, TierError> {
        let Ok(path) = self.object_path(key) else {
            return Ok(None);
        };
        self.bounded("object head", async {
            match self.store.head(&path).await {
                Ok(meta) => Ok(tier_format::page_len(meta.size).map(|len| ObjectId {
                    len,
                    e_tag: meta.e_tag,
                    version: meta.version,
                    modified: meta.last_modified.timestamp_nanos_opt(),
                })),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(self.error(Some(key), e)),
            }
        })
        .await
    }

    /// Checks that the store answers for this tier's prefix, by one HEAD of a name no page
    /// uses; the error says why not (unreachable, authentication, ...).
    pub async fn check_access(&self) -> Result<(), TierError> {
        let probe = self
            .prefix
            .clone()
            .join(PathPart::from(".kvtier-access-check"));
        self.bounded("object head", async {
            match self.store.head(&probe).await {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(self.error(None, e)),
            }
        })
        .await
    }

    /// [`Self::stored_len`] of each key, `concurrency` HEADs in flight.
    pub(crate) async fn object_ids(
        &self,
        keys: &[PageKey],
    ) -> Vec<Result<Option<ObjectId>, TierError>> {
        let jobs: Vec<Job<'_, Result<Option<ObjectId>, TierError>>> = keys
            .iter()
            .map(|k| -> Job<'_, Result<Option<ObjectId>, TierError>> {
                Box::pin(self.object_id(k))
            })
            .collect();
        run_ordered(jobs, self.config.concurrency).await
    }
}

impl Objects {
    pub(crate) fn info(&self) -> TierInfo {
        TierInfo {
            name: self.config.name.clone(),
            kind: "object".into(),
            capacity_bytes: self.catalog.as_ref().map(Catalog::capacity),
            max_page_bytes: Some(self.config.max_page_bytes),
            persistent: true,
        }
    }

    /// The tier's counts, with the bytes its catalog holds, else `held` (a fleet's).
    pub(crate) fn stats(&self, held: Option<u64>) -> TierStats {
        let held = self.catalog.as_ref().map(Catalog::bytes).or(held);
        self.stats.snapshot(held)
    }

    pub(crate) async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        // A key repeated in the batch: only its last valid page is written.
        let last = Page::last_valid(pages, Some(self.config.max_page_bytes));
        let jobs: Vec<Job<'_, PutResult>> = pages
            .iter()
            .enumerate()
            .map(|(i, page)| -> Job<'_, PutResult> {
                if last.get(&page.key) != Some(&i) {
                    let checked = page.check_len(Some(self.config.max_page_bytes));
                    Box::pin(async move { checked })
                } else {
                    Box::pin(self.put_one(page))
                }
            })
            .collect();
        let results = run_ordered(jobs, self.config.concurrency).await;
        let mut after = None;
        for (page, r) in pages.iter().zip(&results) {
            match r {
                Ok(()) => {
                    self.stats.put(page.data.len());
                    if let Some(catalog) = &self.catalog {
                        let evicted = catalog.insert(&page.key, page.data.len() as u64, after);
                        (0..evicted).for_each(|_| self.stats.eviction());
                    }
                    after = Some(&page.key);
                }
                Err(_) => self.stats.errors(1),
            }
        }
        results
    }

    pub(crate) async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let jobs: Vec<Job<'_, GetResult>> = slots
            .iter_mut()
            .map(|slot| -> Job<'_, GetResult> { Box::pin(self.get_one(slot)) })
            .collect();
        let results = run_ordered(jobs, self.config.concurrency).await;
        if let Some(catalog) = &self.catalog {
            let mut after = None;
            for (slot, r) in slots.iter().zip(&results) {
                if matches!(r, Ok(tier_core::Lookup::Hit)) {
                    catalog.touch(&slot.key, after);
                    after = Some(&slot.key);
                }
            }
        }
        results
    }

    pub(crate) async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        // HEADs run concurrently, a window at a time; the run ends at the first absent key.
        let mut run = 0;
        for window in keys.chunks(self.config.concurrency) {
            let jobs: Vec<Job<'_, Result<bool, TierError>>> = window
                .iter()
                .map(|k| -> Job<'_, Result<bool, TierError>> { Box::pin(self.present(k)) })
                .collect();
            let present = run_ordered(jobs, self.config.concurrency)
                .await
                .into_iter()
                .collect::<Result<Vec<bool>, TierError>>()?;
            let lead = present.iter().take_while(|p| **p).count();
            run += lead;
            if lead < window.len() {
                break;
            }
        }
        Ok(run)
    }

    pub(crate) async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        let jobs: Vec<Job<'_, RemoveResult>> = keys
            .iter()
            .map(|key| -> Job<'_, RemoveResult> { Box::pin(self.remove_one(key)) })
            .collect();
        run_ordered(jobs, self.config.concurrency).await
    }

    /// Deletes `paths`, with the store's multi-object delete where it has one (1,000 per
    /// request on S3), each request bounded by `op_timeout`; objects already gone count as
    /// deleted. Returns the paths deleted, in any order.
    pub(crate) async fn delete_many(&self, paths: Vec<Path>) -> Result<Vec<Path>, TierError> {
        // By name: a store that says an object was already gone names it by its string.
        let asked: std::collections::HashMap<String, Path> = paths
            .iter()
            .map(|p| (p.as_ref().to_owned(), p.clone()))
            .collect();
        let mut deleted = self
            .store
            .delete_stream(futures::stream::iter(paths.into_iter().map(Ok)).boxed());
        let mut done = Vec::new();
        while let Some(next) = self
            .bounded("object delete", async { Ok(deleted.next().await) })
            .await?
        {
            match next {
                Ok(path) => done.push(path),
                Err(object_store::Error::NotFound { path, .. }) => {
                    if let Some(p) = asked.get(&path) {
                        done.push(p.clone());
                    }
                }
                Err(e) => return Err(self.error(None, e)),
            }
        }
        Ok(done)
    }

    pub(crate) async fn clear(&self) -> Result<(), TierError> {
        if let Some(catalog) = &self.catalog {
            catalog.clear();
        }
        let listed = self.list().await?;
        let jobs: Vec<Job<'_, Result<(), TierError>>> = listed
            .iter()
            .map(|l| -> Job<'_, Result<(), TierError>> {
                Box::pin(self.delete_path(&l.meta.location, None))
            })
            .collect();
        run_ordered(jobs, self.config.concurrency)
            .await
            .into_iter()
            .collect()
    }
}

impl Objects {
    pub(crate) async fn remove_one(&self, key: &PageKey) -> RemoveResult {
        let was = self.present(key).await?;
        if was {
            self.delete_path(&self.object_path(key)?, Some(key)).await?;
            self.stats.removed();
        }
        if let Some(catalog) = &self.catalog {
            catalog.remove(key);
        }
        Ok(was)
    }

    pub(crate) async fn delete_path(
        &self,
        path: &Path,
        key: Option<&PageKey>,
    ) -> Result<(), TierError> {
        self.bounded("object delete", async {
            match self.store.delete(path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(self.error(key, e)),
            }
        })
        .await
    }
}

/// One request of a batch.
type Job<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Runs `jobs` with at most `limit` in flight; results in input order. A finished request
/// frees its slot at once, whatever the ones before it are doing (ordered buffering would
/// hold it until they finish: a third of the throughput on an S3 server whose latency varies).
async fn run_ordered<T: Send>(jobs: Vec<Job<'_, T>>, limit: usize) -> Vec<T> {
    let indexed: Vec<Job<'_, (usize, T)>> = jobs
        .into_iter()
        .enumerate()
        .map(|(i, job)| -> Job<'_, (usize, T)> { Box::pin(job.map(move |t| (i, t))) })
        .collect();
    let mut done: Vec<(usize, T)> = futures::stream::iter(indexed)
        .buffer_unordered(limit)
        .collect()
        .await;
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, t)| t).collect()
}

/// Bytes per part of a multipart upload.
const PART_BYTES: usize = 8 << 20;
/// Parts of one upload in flight at once.
const PARTS_AT_ONCE: usize = 8;
