//! Deliberately broken tiers. The suite's own tests assert that each one fails the case that
//! should catch it: a suite that passes everything proves nothing.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tier_core::{
    async_trait, GetResult, Lookup, Page, PageKey, PutResult, ReadSlot, RemoveResult, StorageTier,
    TierError, TierInfo, TierStats,
};

use crate::model::ModelTier;
use crate::suite::{DynTier, TierFactory};

/// The fault a [`BrokenTier`] has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Opens a file on every read (its first 64) and never closes it.
    LeaksFd,
    /// Flips one bit of one byte in the 200th page it returns.
    FlipsByte,
    /// Reports a hit, with an untouched buffer, for a key it does not hold.
    PhantomHit,
    /// `exists` counts every present key instead of the leading run.
    CountsAllInExists,
    /// A put writes from a task of its own that outlives the call: a put dropped before it
    /// returned still lands, later, over whatever was put meanwhile.
    LandsAfterDrop,
}

/// A correct [`ModelTier`] with one [`Fault`].
pub struct BrokenTier {
    inner: Arc<ModelTier>,
    fault: Fault,
    hits_returned: AtomicU64,
    leaked: Mutex<Vec<File>>,
}

impl BrokenTier {
    /// A fresh, empty tier with `fault`.
    pub fn new(fault: Fault) -> Self {
        Self {
            inner: Arc::default(),
            fault,
            hits_returned: AtomicU64::new(0),
            leaked: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait]
impl StorageTier for BrokenTier {
    fn info(&self) -> TierInfo {
        TierInfo {
            kind: format!("broken-{:?}", self.fault),
            ..self.inner.info()
        }
    }

    fn stats(&self) -> TierStats {
        self.inner.stats()
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        if self.fault != Fault::LandsAfterDrop {
            return self.inner.put(pages).await;
        }
        let (inner, pages) = (
            Arc::clone(&self.inner),
            pages.iter().map(Page::to_shared).collect::<Vec<_>>(),
        );
        let n = pages.len();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            inner.put(&pages).await
        });
        writer.await.unwrap_or_else(|e| {
            (0..n)
                .map(|_| Err(TierError::Unavailable(format!("writer task: {e}"))))
                .collect()
        })
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        if self.fault == Fault::LeaksFd {
            let mut leaked = self.leaked.lock().unwrap_or_else(|e| e.into_inner());
            // Enough for the fd-leak case to see, too few to starve the test process.
            if leaked.len() < 64 {
                if let Ok(f) = File::open("/dev/null") {
                    leaked.push(f);
                }
            }
        }
        let mut results = self.inner.get(slots).await;
        for (slot, result) in slots.iter_mut().zip(results.iter_mut()) {
            match (self.fault, &result) {
                (Fault::PhantomHit, Ok(Lookup::Miss)) => *result = Ok(Lookup::Hit),
                (Fault::FlipsByte, Ok(Lookup::Hit))
                    if self.hits_returned.fetch_add(1, Ordering::Relaxed) == 199 =>
                {
                    let mut bytes = slot.buf.to_vec();
                    let mid = bytes.len() / 2;
                    bytes[mid] ^= 0x10;
                    slot.buf.fill_from(&bytes);
                }
                _ => {}
            }
        }
        results
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        if self.fault != Fault::CountsAllInExists {
            return self.inner.exists(keys).await;
        }
        let mut present = 0;
        for key in keys {
            present += self.inner.exists(std::slice::from_ref(key)).await?;
        }
        Ok(present)
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        self.inner.remove(keys).await
    }

    async fn clear(&self) -> Result<(), TierError> {
        self.inner.clear().await
    }
}

/// Opens fresh [`ModelTier`]s: the suite's known-good reference.
#[derive(Default)]
pub struct ModelFactory;

#[async_trait]
impl TierFactory for ModelFactory {
    async fn open(&self) -> Result<DynTier, TierError> {
        Ok(Arc::new(ModelTier::default()))
    }
}

/// Opens fresh [`BrokenTier`]s with one fault.
pub struct BrokenFactory(pub Fault);

#[async_trait]
impl TierFactory for BrokenFactory {
    async fn open(&self) -> Result<DynTier, TierError> {
        Ok(Arc::new(BrokenTier::new(self.0)))
    }

    fn root(&self) -> Option<PathBuf> {
        None
    }
}
