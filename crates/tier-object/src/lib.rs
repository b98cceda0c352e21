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
//! its `policy` and deletes what it evicts in those keys' turns. With `access = "shared"`,
//! the capacity is the prefix's, kept by one node at a time for all the nodes writing it
//! (`shared`).

use std::future::Future;
use std::sync::Arc;

use object_store::path::Path;
use object_store::ObjectStore;
use tier_core::{
    async_trait, GetResult, Page, PageKey, PutResult, ReadSlot, RemoveResult, StorageTier,
    TierError, TierInfo, TierStats, WriteOrder,
};

mod catalog;
mod config;
mod flat;
mod listing;
mod names;
mod objects;
mod s3;
mod shared;
mod unfinished;
mod usage;

pub use config::{ObjectTierConfig, PrefixAccess};
pub use flat::FlatMove;
pub use names::check_prefix;
pub use s3::{S3Settings, Secret};
pub use shared::{PrefixStats, SharedPrefix};
pub use tier_policy::PolicyKind;

use listing::Listed;
use objects::{GiveBack, Objects};
use shared::Fleet;

/// Which object a name held when asked: its length and the store's identity of its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectId {
    /// The page length it holds (its bytes less the trailer).
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
    /// The capacity of a shared prefix (a private one's is its objects' catalog).
    fleet: Option<Arc<Fleet>>,
    order: WriteOrder,
}

impl ObjectTier {
    /// A tier over `store`; checks the config (no request is made).
    pub fn open(store: Arc<dyn ObjectStore>, config: ObjectTierConfig) -> Result<Self, TierError> {
        let fleet = match (config.access, config.capacity_bytes) {
            (PrefixAccess::Shared, Some(capacity)) => {
                Some(Arc::new(Fleet::new(config.shared, capacity)))
            }
            _ => None,
        };
        Ok(Self {
            objects: Arc::new(Objects::new(store, config)?),
            fleet,
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

    /// Moves a prefix of the flat layout (pages directly under the prefix, as kvtier stored
    /// them before prefixes had buckets) into its buckets; a page its bucket already holds
    /// (stored there later) stays and the flat one goes. Run it while no node uses the prefix
    /// (`kvtier move-flat CONFIG` does, for a config's object tiers).
    pub async fn move_flat_layout(&self) -> Result<FlatMove, TierError> {
        self.objects.move_flat_layout().await
    }

    /// Fills the catalog of a tier with a `capacity` from one listing of its prefix (oldest
    /// object first), then evicts down to the capacity; returns the objects found. A no-op
    /// without a capacity. A shared prefix starts its listing in the background and returns
    /// 0 at once ([`Self::settle`] waits for it).
    pub async fn load_catalog(&self) -> Result<usize, TierError> {
        if self.fleet.is_some() {
            // The listing runs beside the calls served meanwhile (see `shared`).
            drop(self.settle_in_background(false));
            return Ok(0);
        }
        let Some(catalog) = &self.objects.catalog else {
            return Ok(0);
        };
        let mut listed = self.objects.list().await?;
        listed.sort_by_key(|l| l.meta.last_modified);
        let mut found = 0;
        for Listed { key, meta, .. } in listed {
            // A private prefix counts page bytes, as its puts do.
            if let Some(len) = tier_format::page_len(meta.size) {
                found += 1;
                let evicted = catalog.insert(&key, len, None);
                (0..evicted).for_each(|_| self.objects.stats.eviction());
            }
        }
        self.delete_evicted().await;
        Ok(found)
    }

    /// For a tier writing these objects another way (NIXL OBJ): records pages it stored (key
    /// and page length), in batch order, in the catalog of a tier with a capacity; returns how
    /// many the policy evicted (deleted by the next [`Self::delete_evicted`]).
    pub fn record_stored<'k>(&self, pages: impl IntoIterator<Item = (&'k PageKey, u64)>) -> usize {
        if let Some(fleet) = &self.fleet {
            for (key, len) in pages {
                fleet.note_written(key, len);
            }
            return 0;
        }
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
        if let Some(fleet) = &self.fleet {
            fleet.note_read(keys);
            return;
        }
        let Some(catalog) = &self.objects.catalog else {
            return;
        };
        let mut after = None;
        for key in keys {
            catalog.touch(key, after);
            after = Some(key);
        }
    }

    /// Lists a shared prefix now, and evicts down to its low watermark if it is over its
    /// capacity and this node gets the lease; waits for a listing under way first. (Puts and
    /// opens leave this to the background; see `shared`.) A no-op for a private prefix.
    pub async fn settle(&self) -> Result<(), TierError> {
        match &self.fleet {
            Some(fleet) => fleet.settle(&self.objects, true).await,
            None => Ok(()),
        }
    }

    /// Settles a shared prefix in a task of its own (an eviction whose call is dropped still
    /// finishes and frees its lease); `wait`: after any under way.
    fn settle_in_background(&self, wait: bool) -> tokio::task::JoinHandle<()> {
        let objects = Arc::clone(&self.objects);
        let fleet = self.fleet.clone();
        tokio::spawn(async move {
            let Some(fleet) = fleet else {
                return;
            };
            if let Err(e) = fleet.settle(&objects, wait).await {
                tracing::warn!(error = %e, "cannot settle the shared prefix's capacity");
            }
        })
    }

    /// Deletes the objects the catalog evicted, each in its key's turn and only if no put has
    /// stored the key again since; what could not be deleted is retried by a later put.
    pub async fn delete_evicted(&self) {
        if let Some(fleet) = self.fleet.as_ref().filter(|f| f.due()) {
            let wait = fleet.over_bound();
            let settling = self.settle_in_background(wait);
            if wait {
                let _ = settling.await;
            }
            return;
        }
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

    /// What this node did for a shared prefix (`None` unless the prefix is shared and bounded).
    pub fn prefix_stats(&self) -> Option<PrefixStats> {
        self.fleet.as_ref().map(|f| f.stats(&self.objects))
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
        let mut info = self.objects.info();
        if let Some(fleet) = &self.fleet {
            info.capacity_bytes = Some(fleet.capacity());
        }
        info
    }

    fn stats(&self) -> TierStats {
        self.objects.stats(self.fleet.as_ref().map(|f| f.bytes()))
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        let keys = pages.iter().map(|p| p.key.clone()).collect();
        let owned: Vec<Page<'static>> = pages.iter().map(Page::to_shared).collect();
        // Noted in the task: a put whose call is dropped still counts in the fleet's usage.
        let fleet = self.fleet.clone();
        let results = self
            .in_turn(keys, pages.len(), move |objects| async move {
                let results = objects.put(&owned).await;
                if let Some(fleet) = &fleet {
                    for (page, r) in owned.iter().zip(&results) {
                        if r.is_ok() {
                            fleet.note_written(&page.key, page.data.len() as u64);
                        }
                    }
                }
                results
            })
            .await;
        self.delete_evicted().await;
        results
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let results = self.objects.get(slots).await;
        if let Some(fleet) = &self.fleet {
            let hits = slots.iter().zip(&results);
            fleet.note_read(hits.filter_map(|(slot, r)| {
                matches!(r, Ok(tier_core::Lookup::Hit)).then_some(&slot.key)
            }));
        }
        results
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        self.objects.exists(keys).await
    }

    /// As reads of them would: first in the catalog's use order, or most recent in the
    /// fleet's eviction of a shared prefix. No request is sent.
    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        self.record_read(keys);
        Ok(())
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        let owned = keys.to_vec();
        self.in_turn(keys.to_vec(), keys.len(), move |objects| async move {
            objects.remove(&owned).await
        })
        .await
    }

    /// A shared prefix: settles now what puts left to the background (a listing due, an
    /// eviction called for), after any settle under way, so a node that flushes before it
    /// exits leaves the prefix within its capacity. Otherwise nothing to wait for.
    async fn flush(&self) -> Result<(), TierError> {
        match &self.fleet {
            Some(fleet) if fleet.due() => fleet.settle(&self.objects, true).await,
            _ => Ok(()),
        }
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
