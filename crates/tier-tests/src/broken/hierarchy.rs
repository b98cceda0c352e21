//! A hierarchy with a deliberate flaw in how it treats its failing lower tier.

use std::sync::Arc;

use tier_core::{
    async_trait, GetResult, Page, PageKey, PutResult, ReadSlot, RemoveResult, StorageTier,
    TierError, TierInfo, TierStats,
};
use tier_hierarchy::Hierarchy;

use crate::model::ModelTier;

/// A flaw in how a hierarchy treats its failing lower tier: what the suite's hierarchy cases
/// must catch (see [`crate::suite::run_flawed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HierarchyFlaw {
    /// A read that failed below after part of the page arrived (torn) is promoted anyway: the
    /// top tier then serves what the buffer held.
    PromotesTornReads,
    /// A write waits for its copy down and fails if the lower tier did not take it: an outage
    /// below fails writes the top tier took.
    FailsWritesInOutage,
}

/// kvtier's [`Hierarchy`] with one [`HierarchyFlaw`] wrapped around it.
pub struct FlawedHierarchy {
    inner: Arc<Hierarchy>,
    top: Arc<ModelTier>,
    flaw: HierarchyFlaw,
}

impl FlawedHierarchy {
    /// `inner` (whose top tier is `top`) with `flaw`.
    pub fn new(inner: Arc<Hierarchy>, top: Arc<ModelTier>, flaw: HierarchyFlaw) -> Self {
        Self { inner, top, flaw }
    }
}

#[async_trait]
impl StorageTier for FlawedHierarchy {
    fn info(&self) -> TierInfo {
        self.inner.info()
    }

    fn stats(&self) -> TierStats {
        self.inner.stats()
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        let failed_below = self.inner.hierarchy_stats().lower_errors;
        let mut results = self.inner.put(pages).await;
        if self.flaw == HierarchyFlaw::FailsWritesInOutage {
            let _ = self.inner.flush().await;
            if self.inner.hierarchy_stats().lower_errors > failed_below {
                for r in results.iter_mut().filter(|r| r.is_ok()) {
                    *r = Err(TierError::Unavailable(
                        "the lower tier did not take the copy".into(),
                    ));
                }
            }
        }
        results
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let results = self.inner.get(slots).await;
        if self.flaw == HierarchyFlaw::PromotesTornReads {
            for (slot, r) in slots.iter().zip(&results) {
                let torn = slot.buf.to_vec();
                if r.is_err() && torn.iter().any(|&b| b != 0) {
                    let _ = self.top.put(&[Page::new(slot.key.clone(), torn)]).await;
                }
            }
        }
        results
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        self.inner.exists(keys).await
    }

    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        self.inner.touch(keys).await
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        self.inner.remove(keys).await
    }

    async fn clear(&self) -> Result<(), TierError> {
        self.inner.clear().await
    }

    async fn flush(&self) -> Result<(), TierError> {
        self.inner.flush().await
    }
}
