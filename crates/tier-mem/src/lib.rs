//! A DRAM tier on [`moka::future::Cache`].
//!
//! Capacity is in bytes (each entry weighs its key plus its page) and holds whenever a `put`
//! returns: the tier runs moka's pending maintenance before answering, so evictions the batch
//! caused have happened. Pages the tier evicts for room or expiry go to an optional
//! [`EvictionListener`], which is how a hierarchy demotes them to the next tier down.

pub mod config;

use std::sync::Arc;
use std::time::Duration;

use moka::future::Cache;
use moka::notification::RemovalCause;
use moka::policy::EvictionPolicy as MokaPolicy;
use tier_core::{
    async_trait, Bytes, EvictedPage, EvictionCause, EvictionListener, GetResult, Page, PageKey,
    PutResult, ReadSlot, RemoveResult, StatsRecorder, StorageTier, TierError, TierInfo, TierStats,
};

/// Which page a full tier lets go first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Admission by frequency sketch, then LRU: resists scans (moka's default).
    #[default]
    TinyLfu,
    /// Plain least recently used.
    Lru,
}

/// Builds a [`MemTier`].
#[derive(Clone)]
pub struct MemTierBuilder {
    name: String,
    capacity_bytes: u64,
    policy: EvictionPolicy,
    ttl: Option<Duration>,
    tti: Option<Duration>,
    listener: Option<EvictionListener>,
}

impl MemTierBuilder {
    /// Names the tier (for logs and stats).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }
    /// Chooses the eviction policy.
    pub fn policy(mut self, policy: EvictionPolicy) -> Self {
        self.policy = policy;
        self
    }
    /// Drops pages this long after they were stored.
    pub fn time_to_live(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// Drops pages not read or written for this long.
    pub fn time_to_idle(mut self, tti: Duration) -> Self {
        self.tti = Some(tti);
        self
    }
    /// Hands every page evicted for room or expiry to `listener`.
    pub fn on_evict(mut self, listener: EvictionListener) -> Self {
        self.listener = Some(listener);
        self
    }

    /// Builds the tier. Fails if the capacity is zero.
    pub fn build(self) -> Result<MemTier, TierError> {
        if self.capacity_bytes == 0 {
            return Err(TierError::config("capacity", "must be at least 1 byte"));
        }
        let stats = Arc::new(StatsRecorder::default());
        let listener_stats = Arc::clone(&stats);
        let listener = self.listener.clone();
        let mut builder = Cache::builder()
            .name(&self.name)
            .max_capacity(self.capacity_bytes)
            .weigher(|key: &PageKey, page: &Bytes| entry_weight(key, page.len()))
            .eviction_policy(match self.policy {
                EvictionPolicy::TinyLfu => MokaPolicy::tiny_lfu(),
                EvictionPolicy::Lru => MokaPolicy::lru(),
            })
            .eviction_listener(move |key: Arc<PageKey>, data: Bytes, cause| {
                let cause = match cause {
                    RemovalCause::Size => EvictionCause::Capacity,
                    RemovalCause::Expired => EvictionCause::Expired,
                    RemovalCause::Explicit | RemovalCause::Replaced => return,
                };
                listener_stats.eviction();
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
        // An entry weighs its key too, so the largest page leaves room for the longest key.
        let max_page = self
            .capacity_bytes
            .min(u64::from(u32::MAX))
            .saturating_sub(PageKey::MAX_LEN as u64) as usize;
        Ok(MemTier {
            cache: builder.build(),
            info: TierInfo {
                name: self.name,
                kind: "mem".into(),
                capacity_bytes: Some(self.capacity_bytes),
                max_page_bytes: Some(max_page),
                persistent: false,
            },
            stats,
        })
    }
}

/// What an entry costs against capacity: key plus page bytes (saturating at `u32::MAX`).
fn entry_weight(key: &PageKey, page_len: usize) -> u32 {
    u32::try_from(key.len() + page_len).unwrap_or(u32::MAX)
}

/// A byte-bounded DRAM page cache.
pub struct MemTier {
    cache: Cache<PageKey, Bytes>,
    info: TierInfo,
    stats: Arc<StatsRecorder>,
}

impl MemTier {
    /// Starts a builder for a tier holding at most `capacity_bytes` (keys plus pages).
    pub fn builder(capacity_bytes: u64) -> MemTierBuilder {
        MemTierBuilder {
            name: "mem".into(),
            capacity_bytes,
            policy: EvictionPolicy::default(),
            ttl: None,
            tti: None,
            listener: None,
        }
    }

    /// A shared reference to a page's bytes, without copying them.
    pub async fn get_shared(&self, key: &PageKey) -> Option<Bytes> {
        let page = self.cache.get(key).await;
        match &page {
            Some(data) => self.stats.hit(data.len()),
            None => self.stats.miss(),
        }
        page
    }

    /// Bytes held now (keys plus pages), after pending maintenance has run.
    pub async fn resident_bytes(&self) -> u64 {
        self.cache.run_pending_tasks().await;
        self.cache.weighted_size()
    }
}

#[async_trait]
impl StorageTier for MemTier {
    fn info(&self) -> TierInfo {
        self.info.clone()
    }

    fn stats(&self) -> TierStats {
        self.stats.snapshot(Some(self.cache.weighted_size()))
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        let mut results = Vec::with_capacity(pages.len());
        for page in pages {
            if let Err(e) = page.check_len(self.info.max_page_bytes) {
                self.stats.errors(1);
                results.push(Err(e));
                continue;
            }
            // Kept past the call: one gathered copy of lent or multi-region pages, none else.
            self.cache
                .insert(page.key.clone(), page.data.to_bytes())
                .await;
            self.stats.put(page.data.len());
            results.push(Ok(()));
        }
        // Let the evictions this batch caused happen before answering, so the byte bound holds.
        self.cache.run_pending_tasks().await;
        results
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let mut results = Vec::with_capacity(slots.len());
        for slot in slots.iter_mut() {
            let page = self.cache.get(&slot.key).await;
            results.push(slot.answer(page.as_deref(), &self.stats));
        }
        results
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        Ok(keys
            .iter()
            .take_while(|key| self.cache.contains_key(*key))
            .count())
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        let mut results = Vec::with_capacity(keys.len());
        for key in keys {
            let present = self.cache.remove(key).await.is_some();
            if present {
                self.stats.removed();
            }
            results.push(Ok(present));
        }
        results
    }

    async fn clear(&self) -> Result<(), TierError> {
        self.cache.invalidate_all();
        self.cache.run_pending_tasks().await;
        Ok(())
    }
}
