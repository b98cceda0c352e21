//! The gates every tier call of a schedule waits at, one call let through at a time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use tier_core::{
    async_trait, GetResult, Page, PageKey, PutResult, ReadSlot, RemoveResult, StorageTier,
    TierError, TierInfo, TierStats,
};
use tokio::sync::oneshot;

use super::Flaw;
use crate::suite::DynTier;

/// Yields the explorer gives the other tasks to reach their next gate.
const SETTLE_YIELDS: usize = 16;

/// Calls waiting at the gates, by arrival.
#[derive(Default)]
pub(super) struct Gates {
    waiting: Mutex<BTreeMap<u64, (String, oneshot::Sender<()>)>>,
    next: AtomicU64,
}

impl Gates {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, (String, oneshot::Sender<()>)>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until the explorer lets this call through (forgotten if dropped meanwhile).
    pub(super) async fn pass(self: &Arc<Self>, label: String) {
        struct Leave(Arc<Gates>, u64);
        impl Drop for Leave {
            fn drop(&mut self) {
                self.0.lock().remove(&self.1);
            }
        }
        let id = self.next.fetch_add(1, SeqCst);
        let (tx, rx) = oneshot::channel();
        self.lock().insert(id, (label, tx));
        let _leave = Leave(Arc::clone(self), id);
        let _ = rx.await;
    }

    pub(super) fn waiting(&self) -> Vec<(u64, String)> {
        self.lock()
            .iter()
            .map(|(id, (label, _))| (*id, label.clone()))
            .collect()
    }

    pub(super) fn release(&self, id: u64) {
        if let Some((_, tx)) = self.lock().remove(&id) {
            let _ = tx.send(());
        }
    }
}

/// A tier whose every call waits at the gates first.
pub(super) struct GatedTier {
    pub(super) name: &'static str,
    pub(super) inner: DynTier,
    pub(super) gates: Arc<Gates>,
    pub(super) flaw: Option<Flaw>,
}

impl GatedTier {
    fn label(&self, op: &str, keys: impl Iterator<Item = PageKey>) -> String {
        let keys: Vec<String> = keys.map(|k| k.to_string()).collect();
        format!("{} {op} {}", self.name, keys.join(","))
    }
}

#[async_trait]
impl StorageTier for GatedTier {
    fn info(&self) -> TierInfo {
        self.inner.info()
    }

    fn stats(&self) -> TierStats {
        self.inner.stats()
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        let label = self.label("put", pages.iter().map(|p| p.key.clone()));
        self.gates.pass(label).await;
        if self.flaw == Some(Flaw::LowerKeepsOldVersions) {
            let keys: Vec<PageKey> = pages.iter().map(|p| p.key.clone()).collect();
            let held = matches!(self.inner.exists(&keys[..1]).await, Ok(1));
            if pages.len() == 1 && held {
                return vec![Ok(())];
            }
        }
        self.inner.put(pages).await
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let label = self.label("get", slots.iter().map(|s| s.key.clone()));
        self.gates.pass(label).await;
        self.inner.get(slots).await
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        let label = self.label("exists", keys.iter().cloned());
        self.gates.pass(label).await;
        self.inner.exists(keys).await
    }

    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        self.inner.touch(keys).await
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        let label = self.label("remove", keys.iter().cloned());
        self.gates.pass(label).await;
        self.inner.remove(keys).await
    }

    async fn clear(&self) -> Result<(), TierError> {
        self.gates.pass(format!("{} clear", self.name)).await;
        self.inner.clear().await
    }
}

/// Lets every other task run until the calls waiting at the gates stop changing.
pub(super) async fn settle(gates: &Gates) {
    let mut seen = gates.waiting();
    for _ in 0..1000 {
        for _ in 0..SETTLE_YIELDS {
            tokio::task::yield_now().await;
        }
        let now = gates.waiting();
        if now == seen {
            return;
        }
        seen = now;
    }
}
