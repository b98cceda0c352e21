//! [`ModelTier`]: an obviously correct in-memory tier, the reference the suite's self-tests
//! start from and that recorders compare against.

use std::collections::HashMap;
use std::sync::Mutex;

use tier_core::{
    async_trait, Bytes, GetResult, Page, PageKey, PutResult, ReadSlot, RemoveResult, StatsRecorder,
    StorageTier, TierError, TierInfo, TierStats,
};

/// A `HashMap` behind a mutex. Unbounded and not persistent.
#[derive(Default)]
pub struct ModelTier {
    pages: Mutex<HashMap<PageKey, Bytes>>,
    stats: StatsRecorder,
}

impl ModelTier {
    fn pages(&self) -> std::sync::MutexGuard<'_, HashMap<PageKey, Bytes>> {
        // A poisoned lock only means another test thread panicked; the map itself is intact.
        self.pages.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl StorageTier for ModelTier {
    fn info(&self) -> TierInfo {
        TierInfo {
            name: "model".into(),
            kind: "model".into(),
            capacity_bytes: None,
            max_page_bytes: Some(64 << 20),
            persistent: false,
        }
    }

    fn stats(&self) -> TierStats {
        let resident = self.pages().values().map(|p| p.len() as u64).sum();
        self.stats.snapshot(Some(resident))
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        let limit = self.info().max_page_bytes;
        pages
            .iter()
            .map(|page| {
                page.check_len(limit)
                    .inspect_err(|_| self.stats.errors(1))?;
                self.pages().insert(page.key.clone(), page.data.to_bytes());
                self.stats.put(page.data.len());
                Ok(())
            })
            .collect()
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let pages = self.pages();
        slots
            .iter_mut()
            .map(|slot| slot.answer(pages.get(&slot.key).map(|p| &p[..]), &self.stats))
            .collect()
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        let pages = self.pages();
        Ok(keys.iter().take_while(|k| pages.contains_key(*k)).count())
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        let mut pages = self.pages();
        keys.iter()
            .map(|k| {
                let present = pages.remove(k).is_some();
                if present {
                    self.stats.removed();
                }
                Ok(present)
            })
            .collect()
    }

    async fn clear(&self) -> Result<(), TierError> {
        self.pages().clear();
        Ok(())
    }
}
