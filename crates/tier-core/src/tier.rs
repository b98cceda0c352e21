use std::time::Instant;

use async_trait::async_trait;

use crate::{Lookup, Page, PageKey, ReadSlot, TierError, TierInfo, TierStats};

/// Outcome of storing one page.
pub type PutResult = Result<(), TierError>;
/// Outcome of reading one page: hit, miss, or the error that stopped it.
pub type GetResult = Result<Lookup, TierError>;
/// Outcome of removing one page: whether it was present.
pub type RemoveResult = Result<bool, TierError>;

/// A place pages can be stored: DRAM, local disk through NIXL, object storage, a hierarchy.
///
/// Batch calls return one result per input, in input order. A miss is not an error, and a
/// failure of one page never fails its neighbours. A stored page is either fully visible or
/// absent. Implementations must release every resource a call takes on every path, including
/// when the call's future is dropped.
#[async_trait]
pub trait StorageTier: Send + Sync {
    /// What this tier is.
    fn info(&self) -> TierInfo;

    /// Its counters now.
    fn stats(&self) -> TierStats;

    /// Stores pages; a later write to the same key replaces the earlier one whole. Pages may
    /// lend the caller's memory: a tier that keeps a page past the call takes
    /// [`Page::to_shared`].
    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult>;

    /// Reads pages into the slots' buffers. A buffer whose length differs from the stored
    /// page's gets [`TierError::LengthMismatch`].
    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult>;

    /// The number of leading keys that are all present: the reusable prefix of `keys`.
    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError>;

    /// Removes pages; `Ok(false)` for a key that was not present.
    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult>;

    /// Removes every page this tier holds, and nothing it does not own.
    async fn clear(&self) -> Result<(), TierError>;

    /// Marks the pages of `keys` it holds as just used, as reading them would, without reading
    /// them: its eviction keeps them longer. Keys it does not hold are ignored. A tier without
    /// a use order (or one it cannot refresh cheaply) does nothing.
    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        let _ = keys;
        Ok(())
    }

    /// Waits until every page whose put returned is where [`TierInfo::persistent`] promises
    /// (a hierarchy: written to its lower tiers). Tiers that store before answering have
    /// nothing to wait for.
    async fn flush(&self) -> Result<(), TierError> {
        Ok(())
    }

    /// [`get`](Self::get), answered by `deadline`: a key not read by then is a miss (its
    /// buffer's bytes are then unspecified, never reported as a hit). The default runs `get`
    /// until the deadline and drops it there (every call is drop-safe): all or nothing; a
    /// hierarchy keeps what its faster tiers found.
    async fn get_by(&self, slots: &mut [ReadSlot<'_>], deadline: Instant) -> Vec<GetResult> {
        let n = slots.len();
        let call = self.get(slots);
        match tokio::time::timeout_at(deadline.into(), call).await {
            Ok(results) => results,
            Err(_) => (0..n).map(|_| Ok(Lookup::Miss)).collect(),
        }
    }

    /// [`exists`](Self::exists), answered by `deadline`: what is not known present by then
    /// counts as absent (the default answers 0 at the deadline).
    async fn exists_by(&self, keys: &[PageKey], deadline: Instant) -> Result<usize, TierError> {
        tokio::time::timeout_at(deadline.into(), self.exists(keys))
            .await
            .unwrap_or(Ok(0))
    }

    /// [`put`](Self::put), answered by `deadline`: a page not acknowledged by then gets
    /// [`TierError::Timeout`] (stored whole or not at all, as for any dropped put).
    async fn put_by(&self, pages: &[Page<'_>], deadline: Instant) -> Vec<PutResult> {
        let started = Instant::now();
        match tokio::time::timeout_at(deadline.into(), self.put(pages)).await {
            Ok(results) => results,
            Err(_) => {
                let after = started.elapsed();
                (0..pages.len())
                    .map(|_| Err(TierError::Timeout { op: "put", after }))
                    .collect()
            }
        }
    }
}
