//! [`ModelTier`]: an obviously correct in-memory tier, the reference the suite's self-tests
//! start from and that recorders compare against. Bounded, it evicts least recently used pages
//! and hands each to a listener before it is gone, so it can top a write-back hierarchy.
//! Every call yields to the runtime before it acts (and a put before each page), so a caller
//! that drops it finds await points to drop it at, as with a real tier.

use std::collections::HashMap;
use std::sync::Mutex;

use tier_core::{
    async_trait, Bytes, EvictedPage, EvictionCause, EvictionListener, GetResult, Page, PageKey,
    PutResult, ReadSlot, RemoveResult, StatsRecorder, StorageTier, TierError, TierInfo, TierStats,
};

#[derive(Default)]
struct Pages {
    map: HashMap<PageKey, (Bytes, u64)>,
    bytes: u64,
    tick: u64,
}

impl Pages {
    fn insert(&mut self, key: PageKey, data: Bytes) {
        self.tick += 1;
        self.bytes += data.len() as u64;
        if let Some((old, _)) = self.map.insert(key, (data, self.tick)) {
            self.bytes -= old.len() as u64;
        }
    }

    fn remove(&mut self, key: &PageKey) -> bool {
        match self.map.remove(key) {
            Some((old, _)) => {
                self.bytes -= old.len() as u64;
                true
            }
            None => false,
        }
    }

    fn touch(&mut self, key: &PageKey) -> Option<Bytes> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(key).map(|(data, used)| {
            *used = tick;
            data.clone()
        })
    }

    /// The least recently used page, removed.
    fn pop_oldest(&mut self) -> Option<(PageKey, Bytes)> {
        let key = self
            .map
            .iter()
            .min_by_key(|(_, (_, used))| *used)
            .map(|(k, _)| k.clone())?;
        let (data, _) = self.map.remove(&key)?;
        self.bytes -= data.len() as u64;
        Some((key, data))
    }
}

/// A `HashMap` behind a mutex. Unbounded unless made with [`ModelTier::bounded`]; not
/// persistent.
#[derive(Default)]
pub struct ModelTier {
    pages: Mutex<Pages>,
    capacity: Option<u64>,
    persistent: bool,
    listener: Option<EvictionListener>,
    stats: StatsRecorder,
}

impl ModelTier {
    /// A model holding at most `capacity` bytes, evicting least recently used pages into
    /// `listener` (called with the page still held by nobody else, before the put returns).
    pub fn bounded(capacity: u64, listener: Option<EvictionListener>) -> Self {
        Self {
            capacity: Some(capacity),
            listener,
            ..Self::default()
        }
    }

    /// An unbounded model that says it is persistent: a factory that hands out the same one
    /// on every open is storage that survives a reopen.
    pub fn persistent() -> Self {
        Self {
            persistent: true,
            ..Self::default()
        }
    }

    /// The bytes stored under `key`, without counting a read or touching recency.
    pub fn peek(&self, key: &PageKey) -> Option<Bytes> {
        self.pages().map.get(key).map(|(data, _)| data.clone())
    }

    fn pages(&self) -> std::sync::MutexGuard<'_, Pages> {
        // A poisoned lock only means another test thread panicked; the map itself is intact.
        self.pages.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn enforce_capacity(&self, pages: &mut Pages) {
        let Some(capacity) = self.capacity else {
            return;
        };
        while pages.bytes > capacity {
            let Some((key, data)) = pages.pop_oldest() else {
                return;
            };
            self.stats.eviction();
            if let Some(listener) = &self.listener {
                listener(EvictedPage {
                    key,
                    data,
                    cause: EvictionCause::Capacity,
                });
            }
        }
    }
}

#[async_trait]
impl StorageTier for ModelTier {
    fn info(&self) -> TierInfo {
        TierInfo {
            name: "model".into(),
            kind: "model".into(),
            capacity_bytes: self.capacity,
            max_page_bytes: Some(64 << 20),
            persistent: self.persistent,
        }
    }

    fn stats(&self) -> TierStats {
        let resident = self.pages().bytes;
        self.stats.snapshot(Some(resident))
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        let limit = self.info().max_page_bytes;
        let mut results = Vec::with_capacity(pages.len());
        for page in pages {
            tokio::task::yield_now().await;
            if let Err(e) = page.check_len(limit) {
                self.stats.errors(1);
                results.push(Err(e));
                continue;
            }
            let mut stored = self.pages();
            stored.insert(page.key.clone(), page.data.to_bytes());
            self.stats.put(page.data.len());
            self.enforce_capacity(&mut stored);
            results.push(Ok(()));
        }
        results
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        tokio::task::yield_now().await;
        let mut pages = self.pages();
        slots
            .iter_mut()
            .map(|slot| {
                let page = pages.touch(&slot.key);
                slot.answer(page.as_deref(), &self.stats)
            })
            .collect()
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        tokio::task::yield_now().await;
        let pages = self.pages();
        Ok(keys
            .iter()
            .take_while(|k| pages.map.contains_key(*k))
            .count())
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        tokio::task::yield_now().await;
        let mut pages = self.pages();
        keys.iter()
            .map(|k| {
                let present = pages.remove(k);
                if present {
                    self.stats.removed();
                }
                Ok(present)
            })
            .collect()
    }

    async fn clear(&self) -> Result<(), TierError> {
        tokio::task::yield_now().await;
        *self.pages() = Pages::default();
        Ok(())
    }
}
