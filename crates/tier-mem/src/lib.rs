//! A DRAM tier: [`moka::future::Cache`] for the LRU and TinyLFU policies, a map ordered by a
//! [`tier_policy`] policy for the others (SIEVE, S3-FIFO, ARC, prefix-aware).
//!
//! Capacity is in bytes (each entry weighs its key plus its page) and holds whenever a `put`
//! returns: with moka the tier runs its pending maintenance before answering, so evictions the
//! batch caused have happened. Pages the tier evicts for room or expiry go to an optional
//! [`EvictionListener`], which is how a hierarchy demotes them to the next tier down, before
//! any call can miss them: moka removes a page from its map before it calls the listener, so
//! a call that misses waits for the maintenance under way to finish.

mod policy_map;

use std::sync::Arc;
use std::time::Duration;

use moka::future::Cache;
use moka::notification::RemovalCause;
use moka::policy::EvictionPolicy as MokaPolicy;
use tier_core::{
    async_trait, Bytes, EvictedPage, EvictionCause, EvictionListener, GetResult, Lookup, Page,
    PageKey, PutResult, ReadSlot, RemoveResult, StatsRecorder, StorageTier, TierError, TierInfo,
    TierStats,
};

pub use tier_policy::PolicyKind;

use policy_map::PolicyMap;

/// A [`MemTier`]'s settings: [`MemTierConfig::new`] gives the defaults, fields are set
/// directly, [`MemTier::open`] validates them.
#[derive(Clone)]
pub struct MemTierConfig {
    /// Instance name (for logs, stats and metrics).
    pub name: String,
    /// Bytes the tier holds at most (keys plus pages).
    pub capacity_bytes: u64,
    /// The eviction policy; `None`: [`PolicyKind::Auto`], or `lru` for a tier with an expiry.
    pub policy: Option<PolicyKind>,
    /// Drops pages this long after they were stored (policies `lru` and `tinylfu` only).
    pub ttl: Option<Duration>,
    /// Drops pages not read or written for this long (policies `lru` and `tinylfu` only).
    pub tti: Option<Duration>,
    /// Gets every page evicted for room or expiry (how a hierarchy demotes them).
    pub on_evict: Option<EvictionListener>,
}

impl MemTierConfig {
    /// Defaults for a tier of `capacity_bytes`.
    pub fn new(capacity_bytes: u64) -> Self {
        Self {
            name: "mem".into(),
            capacity_bytes,
            policy: None,
            ttl: None,
            tti: None,
            on_evict: None,
        }
    }

    /// The policy the tier runs: the one chosen, else the default, or `lru` with an expiry
    /// (only moka's policies expire pages).
    pub fn resolved_policy(&self) -> PolicyKind {
        match self.policy {
            Some(policy) => policy,
            None if self.ttl.is_some() || self.tti.is_some() => PolicyKind::Lru,
            None => PolicyKind::default(),
        }
    }

    /// Checks the settings: a capacity of at least one byte, an expiry only with a policy
    /// that has one.
    pub fn validate(&self) -> Result<(), TierError> {
        if self.capacity_bytes == 0 {
            return Err(TierError::config("capacity", "must be at least 1 byte"));
        }
        let policy = self.resolved_policy();
        if let (Some(field), false) = (
            [("ttl", self.ttl), ("tti", self.tti)]
                .iter()
                .find_map(|(f, d)| d.map(|_| *f)),
            matches!(policy, PolicyKind::Lru | PolicyKind::Tinylfu),
        ) {
            return Err(TierError::config(
                field,
                format!("expiry needs policy \"lru\" or \"tinylfu\"; policy \"{policy}\" has none"),
            ));
        }
        Ok(())
    }

    fn open(self) -> Result<MemTier, TierError> {
        self.validate()?;
        let stats = Arc::new(StatsRecorder::default());
        // An entry weighs its key too, so the largest page leaves room for the longest key.
        let max_page = self
            .capacity_bytes
            .min(u64::from(u32::MAX))
            .saturating_sub(PageKey::MAX_LEN as u64) as usize;
        let info = TierInfo {
            name: self.name.clone(),
            kind: "mem".into(),
            capacity_bytes: Some(self.capacity_bytes),
            max_page_bytes: Some(max_page),
            persistent: false,
        };
        let policy = self.resolved_policy();
        // moka is the engine for LRU and TinyLFU (and their expiry); this crate's map for the rest.
        let own = match policy {
            PolicyKind::Lru | PolicyKind::Tinylfu => None,
            other => other.build::<PageKey>(),
        };
        let engine = match own {
            Some(order) => Engine::Map(PolicyMap::new(
                order,
                self.capacity_bytes,
                self.on_evict.clone(),
                Arc::clone(&stats),
            )),
            None => Engine::Moka {
                settles: self.on_evict.is_some(),
                cache: self.moka(policy, Arc::clone(&stats)),
            },
        };
        Ok(MemTier {
            engine,
            info,
            stats,
        })
    }

    fn moka(self, policy: PolicyKind, stats: Arc<StatsRecorder>) -> Cache<PageKey, Bytes> {
        let listener = self.on_evict.clone();
        let mut builder = Cache::builder()
            .name(&self.name)
            .max_capacity(self.capacity_bytes)
            .weigher(|key: &PageKey, page: &Bytes| entry_weight(key, page.len()))
            .eviction_policy(match policy {
                PolicyKind::Lru => MokaPolicy::lru(),
                _ => MokaPolicy::tiny_lfu(),
            })
            .eviction_listener(move |key: Arc<PageKey>, data: Bytes, cause| {
                let cause = match cause {
                    RemovalCause::Size => EvictionCause::Capacity,
                    RemovalCause::Expired => EvictionCause::Expired,
                    RemovalCause::Explicit | RemovalCause::Replaced => return,
                };
                stats.eviction();
                if let Some(listener) = &listener {
                    listener(EvictedPage {
                        key: (*key).clone(),
                        data,
                        cause,
                    });
                }
            });
        if let Some(ttl) = self.ttl {
            builder = builder.time_to_live(ttl);
        }
        if let Some(tti) = self.tti {
            builder = builder.time_to_idle(tti);
        }
        builder.build()
    }
}

/// What an entry costs against capacity: key plus page bytes (saturating at `u32::MAX`).
fn entry_weight(key: &PageKey, page_len: usize) -> u32 {
    u32::try_from(key.len() + page_len).unwrap_or(u32::MAX)
}

/// Where the pages live: moka's cache, or a map this crate orders by a policy.
enum Engine {
    Moka {
        cache: Cache<PageKey, Bytes>,
        /// An eviction listener is set: a miss waits for evictions under way (see the
        /// module documentation).
        settles: bool,
    },
    Map(PolicyMap),
}

/// A byte-bounded DRAM page cache.
pub struct MemTier {
    engine: Engine,
    info: TierInfo,
    stats: Arc<StatsRecorder>,
}

impl MemTier {
    /// A tier with `config`'s settings, once they are validated.
    pub fn open(config: MemTierConfig) -> Result<MemTier, TierError> {
        config.open()
    }

    /// A shared reference to a page's bytes, without copying them.
    pub async fn get_shared(&self, key: &PageKey) -> Option<Bytes> {
        let page = match &self.engine {
            Engine::Moka { cache, .. } => cache.get(key).await,
            Engine::Map(map) => map.get(key, None),
        };
        match &page {
            Some(data) => self.stats.hit(data.len()),
            None => self.stats.miss(),
        }
        page
    }

    /// After a call missed a page: waits until every eviction moka has begun has reached the
    /// listener (its maintenance runs under one lock, so taking it waits for the run under
    /// way, and runs an interrupted one to its end).
    async fn settle_evictions(&self) {
        if let Engine::Moka {
            cache,
            settles: true,
        } = &self.engine
        {
            cache.run_pending_tasks().await;
        }
    }

    /// Bytes held now (keys plus pages), after pending maintenance has run.
    pub async fn resident_bytes(&self) -> u64 {
        match &self.engine {
            Engine::Moka { cache, .. } => {
                cache.run_pending_tasks().await;
                cache.weighted_size()
            }
            Engine::Map(map) => map.bytes(),
        }
    }
}

#[async_trait]
impl StorageTier for MemTier {
    fn info(&self) -> TierInfo {
        self.info.clone()
    }

    fn stats(&self) -> TierStats {
        let resident = match &self.engine {
            Engine::Moka { cache, .. } => cache.weighted_size(),
            Engine::Map(map) => map.bytes(),
        };
        self.stats.snapshot(Some(resident))
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        let mut results = Vec::with_capacity(pages.len());
        let mut after = None;
        for page in pages {
            if let Err(e) = page.check_len(self.info.max_page_bytes) {
                self.stats.errors(1);
                results.push(Err(e));
                continue;
            }
            // Kept past the call: one gathered copy of lent or multi-region pages, none else.
            let data = page.data.to_bytes();
            match &self.engine {
                Engine::Moka { cache, .. } => cache.insert(page.key.clone(), data).await,
                Engine::Map(map) => map.insert(&page.key, data, after),
            }
            self.stats.put(page.data.len());
            results.push(Ok(()));
            after = Some(&page.key);
        }
        // Let the evictions this batch caused happen before answering, so the byte bound holds.
        if let Engine::Moka { cache, .. } = &self.engine {
            cache.run_pending_tasks().await;
        }
        results
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let mut results = Vec::with_capacity(slots.len());
        let mut after: Option<PageKey> = None;
        for slot in slots.iter_mut() {
            let page = match &self.engine {
                Engine::Moka { cache, .. } => cache.get(&slot.key).await,
                Engine::Map(map) => map.get(&slot.key, after.as_ref()),
            };
            after = Some(slot.key.clone());
            results.push(slot.answer(page.as_deref(), &self.stats));
        }
        if results.iter().any(|r| matches!(r, Ok(Lookup::Miss))) {
            self.settle_evictions().await;
        }
        results
    }

    /// Moka counts a touch as a read (its `get`, a reference count and no copy); a policy's
    /// map moves each held key to where a read would.
    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        let mut after: Option<&PageKey> = None;
        for key in keys {
            match &self.engine {
                Engine::Moka { cache, .. } => {
                    cache.get(key).await;
                }
                Engine::Map(map) => map.touch(key, after),
            }
            after = Some(key);
        }
        Ok(())
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        let run = match &self.engine {
            Engine::Moka { cache, .. } => keys
                .iter()
                .take_while(|key| cache.contains_key(*key))
                .count(),
            Engine::Map(map) => map.leading_run(keys),
        };
        if run < keys.len() {
            self.settle_evictions().await;
        }
        Ok(run)
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        let mut results = Vec::with_capacity(keys.len());
        for key in keys {
            let present = match &self.engine {
                Engine::Moka { cache, .. } => cache.remove(key).await.is_some(),
                Engine::Map(map) => map.remove(key),
            };
            if present {
                self.stats.removed();
            }
            results.push(Ok(present));
        }
        if results.iter().any(|r| matches!(r, Ok(false))) {
            self.settle_evictions().await;
        }
        results
    }

    async fn clear(&self) -> Result<(), TierError> {
        match &self.engine {
            Engine::Moka { cache, .. } => {
                cache.invalidate_all();
                cache.run_pending_tasks().await;
            }
            Engine::Map(map) => map.clear(),
        }
        Ok(())
    }
}
