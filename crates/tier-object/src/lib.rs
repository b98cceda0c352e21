//! A tier over any [`object_store::ObjectStore`]: S3 and S3-compatible endpoints, GCS, Azure,
//! a local folder, memory. The shared, distributed tier for when one machine is not enough.
//!
//! Pages are objects named `<prefix>/<escaped key>`; the prefix is the tier's namespace (per
//! model or deployment) and `clear` removes only it. Batches run concurrently up to
//! `concurrency`; every call is bounded by `op_timeout` on top of the store's own retries and
//! timeouts. Pages above `multipart_threshold` are uploaded in parts. With `create_only`, a
//! page is written with `PutMode::Create`: two writers of one key never interleave and the
//! first complete page wins (pages are content-addressed, so both hold the same bytes).
//!
//! With a `capacity`, the tier bounds the bytes under its prefix (a bucket shared by many
//! nodes still needs a bound per prefix): a catalog of its objects, filled by one listing at
//! open ([`ObjectTier::load_catalog`]) and kept by its own puts, removes and reads, evicts by
//! its `policy` and deletes what it evicts in those keys' turns.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use object_store::path::{Path, PathPart};
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};
use tier_core::{
    async_trait, GetResult, Page, PageData, PageKey, PutResult, ReadSlot, RemoveResult,
    StatsRecorder, StorageTier, TierError, TierInfo, TierStats, WriteOrder,
};

mod catalog;
mod s3;

use catalog::Catalog;
pub use tier_policy::PolicyKind;

/// Longest escaped object name (stores that keep objects as files need it under NAME_MAX).
const MAX_NAME: usize = 200;
pub use s3::S3Settings;

/// Which object a name held when asked: its length and the store's identity of its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectId {
    /// Length in bytes.
    pub len: u64,
    /// The store's entity tag, if it gives one.
    pub e_tag: Option<String>,
    /// The store's version id, if versioned.
    pub version: Option<String>,
    /// Last modification, in nanoseconds since the epoch.
    pub modified: Option<i64>,
}

/// Pages as objects in any object store.
///
/// A put or remove runs in a task of its own holding its keys' turn ([`WriteOrder`]): a call
/// dropped half way still finishes (a request the store may already have cannot be called
/// back), and a later put or remove of the same keys waits for it, so it never lands late.
pub struct ObjectTier {
    objects: Arc<Objects>,
    order: WriteOrder,
}

impl ObjectTier {
    /// A tier over `store`; checks the config (no request is made).
    pub fn open(store: Arc<dyn ObjectStore>, config: ObjectTierConfig) -> Result<Self, TierError> {
        Ok(Self {
            objects: Arc::new(Objects::new(store, config)?),
            order: WriteOrder::new(),
        })
    }

    /// The object a page is stored as, or `KeyRejected` if its escaped name is too long for
    /// stores that keep objects as files.
    pub fn object_path(&self, key: &PageKey) -> Result<Path, TierError> {
        self.objects.object_path(key)
    }

    /// The stored length of `key`'s object, `None` if absent.
    pub async fn stored_len(&self, key: &PageKey) -> Result<Option<u64>, TierError> {
        self.objects.stored_len(key).await
    }

    /// [`Self::stored_len`] of each key, `concurrency` HEADs in flight.
    pub async fn stored_lens(&self, keys: &[PageKey]) -> Vec<Result<Option<u64>, TierError>> {
        self.objects
            .object_ids(keys)
            .await
            .into_iter()
            .map(|r| r.map(|id| id.map(|id| id.len)))
            .collect()
    }

    /// Which object each key names now (`None`: absent), `concurrency` HEADs in flight. The
    /// same id before and after a read means the read saw one whole object.
    pub async fn object_ids(&self, keys: &[PageKey]) -> Vec<Result<Option<ObjectId>, TierError>> {
        self.objects.object_ids(keys).await
    }

    /// The order this tier's puts and removes take turns in: a tier writing the same objects
    /// another way (NIXL OBJ) takes its turns here too.
    pub fn write_order(&self) -> &WriteOrder {
        &self.order
    }

    /// Fills the catalog of a tier with a `capacity` from one listing of its prefix (oldest
    /// object first), then evicts down to the capacity; returns the objects found. A no-op
    /// without a capacity.
    pub async fn load_catalog(&self) -> Result<usize, TierError> {
        let Some(catalog) = &self.objects.catalog else {
            return Ok(0);
        };
        let mut listed = self.objects.list().await?;
        listed.sort_by_key(|meta| meta.last_modified);
        let mut found = 0;
        for meta in listed {
            let key = meta
                .location
                .filename()
                .and_then(|name| PageKey::from_escaped_name(name, MARKER));
            if let Some(key) = key {
                found += 1;
                let evicted = catalog.insert(&key, meta.size, None);
                (0..evicted).for_each(|_| self.objects.stats.eviction());
            }
        }
        self.delete_evicted().await;
        Ok(found)
    }

    /// For a tier writing these objects another way (NIXL OBJ): records pages it stored, in
    /// batch order, in the catalog of a tier with a capacity; returns how many the policy
    /// evicted (deleted by the next [`Self::delete_evicted`]).
    pub fn record_stored<'k>(&self, pages: impl IntoIterator<Item = (&'k PageKey, u64)>) -> usize {
        let Some(catalog) = &self.objects.catalog else {
            return 0;
        };
        let mut after = None;
        let mut evicted = 0;
        for (key, len) in pages {
            evicted += catalog.insert(key, len, after);
            after = Some(key);
        }
        evicted
    }

    /// For a tier reading these objects another way: records the keys it read, in batch order.
    pub fn record_read<'k>(&self, keys: impl IntoIterator<Item = &'k PageKey>) {
        let Some(catalog) = &self.objects.catalog else {
            return;
        };
        let mut after = None;
        for key in keys {
            catalog.touch(key, after);
            after = Some(key);
        }
    }

    /// Deletes the objects the catalog evicted, each in its key's turn and only if no put has
    /// stored the key again since; what could not be deleted is retried by a later put.
    pub async fn delete_evicted(&self) {
        let Some(catalog) = &self.objects.catalog else {
            return;
        };
        let doomed = catalog.take_doomed();
        if doomed.is_empty() {
            return;
        }
        // Dropped while waiting for the turn, the keys go back to the catalog's list.
        let mut handed = GiveBack {
            objects: Arc::clone(&self.objects),
            keys: doomed,
        };
        let turn = self.order.turn(&handed.keys).await;
        let keys = std::mem::take(&mut handed.keys);
        let objects = Arc::clone(&self.objects);
        let _ = tokio::spawn(async move {
            let mut failed = Vec::new();
            for key in keys {
                let Some(catalog) = &objects.catalog else {
                    break;
                };
                if catalog.contains(&key) {
                    continue;
                }
                let deleted = match objects.object_path(&key) {
                    Ok(path) => objects.delete_path(&path, Some(&key)).await,
                    Err(e) => Err(e),
                };
                if deleted.is_err() {
                    failed.push(key);
                }
            }
            drop(turn);
            if let Some(catalog) = &objects.catalog {
                catalog.give_back(failed);
            }
        })
        .await;
    }

    /// Checks that the store answers and the credentials may list the prefix.
    pub async fn check_access(&self) -> Result<(), TierError> {
        self.objects.check_access().await
    }

    /// Runs `work` on the tier in a task of its own holding `keys`' turn; `n` results.
    async fn in_turn<T, F, Fut>(
        &self,
        keys: Vec<PageKey>,
        n: usize,
        work: F,
    ) -> Vec<Result<T, TierError>>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Objects>) -> Fut + Send + 'static,
        Fut: Future<Output = Vec<Result<T, TierError>>> + Send + 'static,
    {
        let turn = self.order.turn(&keys).await;
        let objects = Arc::clone(&self.objects);
        tokio::spawn(async move {
            let results = work(objects).await;
            drop(turn);
            results
        })
        .await
        .unwrap_or_else(|e| {
            (0..n)
                .map(|_| Err(TierError::Unavailable(format!("object task failed: {e}"))))
                .collect()
        })
    }
}

#[async_trait]
impl StorageTier for ObjectTier {
    fn info(&self) -> TierInfo {
        self.objects.info()
    }

    fn stats(&self) -> TierStats {
        self.objects.stats()
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        let keys = pages.iter().map(|p| p.key.clone()).collect();
        let owned: Vec<Page<'static>> = pages.iter().map(Page::to_shared).collect();
        let results = self
            .in_turn(keys, pages.len(), move |objects| async move {
                objects.put(&owned).await
            })
            .await;
        self.delete_evicted().await;
        results
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        self.objects.get(slots).await
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        self.objects.exists(keys).await
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        let owned = keys.to_vec();
        self.in_turn(keys.to_vec(), keys.len(), move |objects| async move {
            objects.remove(&owned).await
        })
        .await
    }

    async fn clear(&self) -> Result<(), TierError> {
        // Writes still running (some for dropped calls) land first, then go with the rest.
        let turn = self.order.turn_all().await;
        let objects = Arc::clone(&self.objects);
        tokio::spawn(async move {
            let cleared = objects.clear().await;
            drop(turn);
            cleared
        })
        .await
        .unwrap_or_else(|e| Err(TierError::Unavailable(format!("clear task failed: {e}"))))
    }
}

/// Configuration of an [`ObjectTier`].
#[derive(Debug, Clone)]
pub struct ObjectTierConfig {
    /// Instance name.
    pub name: String,
    /// Namespace: `/`-separated parts of `[A-Za-z0-9._-]`, none `.` or `..`.
    pub prefix: String,
    /// Requests in flight per batch.
    pub concurrency: usize,
    /// Hard bound on each request (on top of the store's own retries).
    pub op_timeout: Duration,
    /// Pages larger than this are uploaded in parts.
    pub multipart_threshold: usize,
    /// Largest page accepted.
    pub max_page_bytes: usize,
    /// Write with `PutMode::Create`: the first complete page of a key wins.
    pub create_only: bool,
    /// Bytes of pages the tier holds under its prefix; beyond it, `policy` evicts. `None`:
    /// unbounded.
    pub capacity_bytes: Option<u64>,
    /// Which pages go first when the capacity is reached (any but TinyLFU, which is moka's).
    pub policy: PolicyKind,
}

impl ObjectTierConfig {
    /// Defaults under `prefix`.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            name: "object".into(),
            prefix: prefix.into(),
            concurrency: 16,
            op_timeout: Duration::from_secs(30),
            multipart_threshold: 16 << 20,
            max_page_bytes: 256 << 20,
            create_only: false,
            capacity_bytes: None,
            policy: PolicyKind::Lru,
        }
    }
}

/// The tier's requests; shared with the tasks its writes run in.
struct Objects {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    config: ObjectTierConfig,
    backend: String,
    stats: StatsRecorder,
    catalog: Option<Catalog>,
}

/// Keys taken for deletion, given back to the catalog if the deletion never started.
struct GiveBack {
    objects: Arc<Objects>,
    keys: Vec<PageKey>,
}

impl Drop for GiveBack {
    fn drop(&mut self) {
        if let Some(catalog) = &self.objects.catalog {
            catalog.give_back(std::mem::take(&mut self.keys));
        }
    }
}

impl Objects {
    pub fn new(
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
                        "tinylfu is moka's, for DRAM tiers; an object tier takes lru, sieve, s3fifo, arc or prefix",
                    )
                })?;
                Some(Catalog::new(policy, capacity))
            }
        };
        Ok(Self {
            catalog,
            backend: format!("object store {store}"),
            store,
            prefix,
            config,
            stats: StatsRecorder::default(),
        })
    }

    /// The object a page is stored as, or `KeyRejected` if its escaped name is too long for
    /// stores that keep objects as files.
    pub fn object_path(&self, key: &PageKey) -> Result<Path, TierError> {
        let name = escape(key);
        if name.len() > MAX_NAME {
            return Err(TierError::KeyRejected {
                key: key.clone(),
                reason: "the key escaped as an object name exceeds 200 bytes",
            });
        }
        Ok(self.prefix.clone().join(PathPart::from(name.as_str())))
    }

    fn error(&self, key: Option<&PageKey>, e: object_store::Error) -> TierError {
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

    async fn bounded<T>(
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

    async fn put_one(&self, page: &Page<'_>) -> PutResult {
        page.check_len(Some(self.config.max_page_bytes))?;
        let path = self.object_path(&page.key)?;
        let mode = if self.config.create_only {
            PutMode::Create
        } else {
            PutMode::Overwrite
        };
        self.bounded("object put", async {
            let result = if page.data.len() > self.config.multipart_threshold {
                self.put_multipart(&path, &page.data).await
            } else {
                let opts = PutOptions {
                    mode,
                    ..Default::default()
                };
                self.store
                    .put_opts(
                        &path,
                        PutPayload::from_iter(page.data.shared_regions()),
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

    async fn put_multipart(&self, path: &Path, data: &PageData<'_>) -> object_store::Result<()> {
        let upload = self.store.put_multipart(path).await?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, 8 << 20);
        for region in data.shared_regions() {
            writer.put(region);
        }
        writer.finish().await.map(|_| ())
    }

    async fn get_one(&self, slot: &mut ReadSlot<'_>) -> GetResult {
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
            Ok(page) => slot.answer(page.as_deref(), &self.stats),
            Err(e) => {
                self.stats.errors(1);
                Err(e)
            }
        }
    }

    async fn present(&self, key: &PageKey) -> Result<bool, TierError> {
        Ok(self.stored_len(key).await?.is_some())
    }

    /// The stored length of a key's object (`None`: absent), by one HEAD.
    pub async fn stored_len(&self, key: &PageKey) -> Result<Option<u64>, TierError> {
        Ok(self.object_id(key).await?.map(|id| id.len))
    }

    async fn object_id(&self, key: &PageKey) -> Result<Option<ObjectId>, TierError> {
        let Ok(path) = self.object_path(key) else {
            return Ok(None);
        };
        self.bounded("object head", async {
            match self.store.head(&path).await {
                Ok(meta) => Ok(Some(ObjectId {
                    len: meta.size,
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
    async fn object_ids(&self, keys: &[PageKey]) -> Vec<Result<Option<ObjectId>, TierError>> {
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
    fn info(&self) -> TierInfo {
        TierInfo {
            name: self.config.name.clone(),
            kind: "object".into(),
            capacity_bytes: self.catalog.as_ref().map(Catalog::capacity),
            max_page_bytes: Some(self.config.max_page_bytes),
            persistent: true,
        }
    }

    fn stats(&self) -> TierStats {
        self.stats
            .snapshot(self.catalog.as_ref().map(Catalog::bytes))
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
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

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
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

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
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

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        let jobs: Vec<Job<'_, RemoveResult>> = keys
            .iter()
            .map(|key| -> Job<'_, RemoveResult> { Box::pin(self.remove_one(key)) })
            .collect();
        run_ordered(jobs, self.config.concurrency).await
    }

    /// The objects directly under the prefix. Only those are the tier's: a page name never
    /// holds a `/`, so anything deeper (another tier's prefix nested in this one, `models`
    /// over `models/llama`) is not ours.
    async fn list(&self) -> Result<Vec<object_store::ObjectMeta>, TierError> {
        self.bounded("object list", async {
            self.store
                .list_with_delimiter(Some(&self.prefix))
                .await
                .map(|listing| listing.objects)
                .map_err(|e| self.error(None, e))
        })
        .await
    }

    async fn clear(&self) -> Result<(), TierError> {
        if let Some(catalog) = &self.catalog {
            catalog.clear();
        }
        let listed = self.list().await?;
        let jobs: Vec<Job<'_, Result<(), TierError>>> = listed
            .iter()
            .map(|meta| -> Job<'_, Result<(), TierError>> {
                Box::pin(self.delete_path(&meta.location, None))
            })
            .collect();
        run_ordered(jobs, self.config.concurrency)
            .await
            .into_iter()
            .collect()
    }
}

impl Objects {
    async fn remove_one(&self, key: &PageKey) -> RemoveResult {
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

    async fn delete_path(&self, path: &Path, key: Option<&PageKey>) -> Result<(), TierError> {
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

/// Checks a namespace prefix: `/`-separated parts of `[A-Za-z0-9._-]`, none `.` or `..`.
pub fn check_prefix(prefix: &str) -> Result<(), TierError> {
    parse_prefix(prefix).map(|_| ())
}

/// Parses and checks the namespace prefix.
fn parse_prefix(prefix: &str) -> Result<Path, TierError> {
    let parts: Vec<&str> = prefix.split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        return Err(TierError::config(
            "prefix",
            "a namespace is required, so clear() cannot touch other data",
        ));
    }
    for part in &parts {
        let ok = part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            && *part != "."
            && *part != "..";
        if !ok {
            return Err(TierError::config(
                "prefix",
                format!("{part:?} is not a plain name ([A-Za-z0-9._-], not . or ..)"),
            ));
        }
    }
    Ok(Path::from_iter(parts))
}

/// A key as one plain object-name part (`=XX` escapes; see [`PageKey::escaped_name`]).
/// What an escaped object name writes a byte of the key as (`=` and two hex digits).
const MARKER: char = '=';

fn escape(key: &PageKey) -> String {
    key.escaped_name(MARKER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_single_plain_parts() {
        for k in ["../../etc/passwd", "a/b", "..", ".", "x=y", "%2e"] {
            let e = escape(&PageKey::new(k).unwrap());
            assert!(
                !e.contains('/') && !e.starts_with('.') && !e.contains('%'),
                "{e}"
            );
        }
        assert_ne!(
            escape(&PageKey::new("x=2F").unwrap()),
            escape(&PageKey::new("x/").unwrap())
        );
    }

    #[test]
    fn prefixes_are_checked() {
        assert!(parse_prefix("models/llama-8b").is_ok());
        for bad in ["", "/", "a/../b", "a b", "."] {
            assert!(
                matches!(parse_prefix(bad), Err(TierError::Config { .. })),
                "{bad}"
            );
        }
    }
}
