//! A tier still opening: one whose open outlasted the hierarchy's `open_timeout` (a FILE tier
//! on a mount that hangs) goes on opening on a thread of its own while the hierarchy serves
//! without it. Until it has opened, every call on it fails at once `Unavailable` (its health
//! calls it down, the levels around it serve); once it has, calls reach it, and the health
//! probe brings it back.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tier_core::{
    async_trait, GetResult, Page, PageKey, PutResult, ReadSlot, RemoveResult, StorageTier,
    TierError, TierInfo, TierStats,
};

type Opened = Result<Arc<dyn StorageTier>, TierError>;

/// Awaits `open` for at most `bound`; past it, the open goes on in the background and the
/// tier `info` describes is returned in its place, down until the open completes. A failed
/// background open leaves it down for good, saying why.
pub(crate) async fn open_within(
    info: TierInfo,
    bound: Duration,
    open: impl Future<Output = Opened> + Send + 'static,
) -> Opened {
    let slot = Arc::new(OnceLock::new());
    let (sent, mut answered) = tokio::sync::oneshot::channel::<Opened>();
    let runtime = tokio::runtime::Handle::current();
    let late = Arc::clone(&slot);
    let name = info.name.clone();
    // A thread of its own: an open stuck in the kernel holds it, never one of the runtime's
    // workers.
    std::thread::Builder::new()
        .name("kvtier-open".into())
        .spawn(move || {
            // Past the bound the receiver is closed: the tier goes to the waiting stand-in.
            if let Err(opened) = sent.send(runtime.block_on(open)) {
                if let Err(e) = &opened {
                    tracing::error!(tier = %name, error = %e, "the tier failed to open in the background");
                } else {
                    tracing::info!(tier = %name, "the tier opened in the background");
                }
                let _ = late.set(opened);
            }
        })
        .map_err(|e| TierError::Unavailable(format!("cannot start a thread to open a tier: {e}")))?;
    let started = Instant::now();
    tokio::select! {
        opened = &mut answered => {
            return opened.unwrap_or_else(|_| Err(TierError::Unavailable(format!(
                "the opening of tier {} ended without an answer", info.name
            ))));
        }
        () = tokio::time::sleep(bound) => {}
    }
    // Closed, the receiver takes what was sent before and refuses what comes after.
    answered.close();
    if let Ok(opened) = answered.try_recv() {
        return opened;
    }
    tracing::warn!(
        tier = %info.name, after = ?bound,
        "the tier did not open in time; the hierarchy serves without it until it has"
    );
    Ok(Arc::new(OpeningTier {
        info,
        slot,
        started,
    }))
}

/// A tier whose open goes on in the background (see the module docs).
struct OpeningTier {
    info: TierInfo,
    slot: Arc<OnceLock<Opened>>,
    started: Instant,
}

impl OpeningTier {
    fn tier(&self) -> Result<&Arc<dyn StorageTier>, TierError> {
        match self.slot.get() {
            Some(Ok(tier)) => Ok(tier),
            Some(Err(e)) => Err(TierError::Unavailable(format!(
                "tier {} failed to open: {e}",
                self.info.name
            ))),
            None => Err(TierError::Unavailable(format!(
                "tier {} is still opening ({:.0?}): its storage has not answered",
                self.info.name,
                self.started.elapsed()
            ))),
        }
    }
}

fn each<T>(n: usize, e: &TierError) -> Vec<Result<T, TierError>> {
    (0..n)
        .map(|_| Err(TierError::Unavailable(e.to_string())))
        .collect()
}

#[async_trait]
impl StorageTier for OpeningTier {
    fn info(&self) -> TierInfo {
        self.info.clone()
    }

    fn stats(&self) -> TierStats {
        self.tier().map(|t| t.stats()).unwrap_or_default()
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        match self.tier() {
            Ok(tier) => tier.put(pages).await,
            Err(e) => each(pages.len(), &e),
        }
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        match self.tier() {
            Ok(tier) => tier.get(slots).await,
            Err(e) => each(slots.len(), &e),
        }
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        self.tier()?.exists(keys).await
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        match self.tier() {
            Ok(tier) => tier.remove(keys).await,
            Err(e) => each(keys.len(), &e),
        }
    }

    async fn clear(&self) -> Result<(), TierError> {
        self.tier()?.clear().await
    }

    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        self.tier()?.touch(keys).await
    }

    async fn flush(&self) -> Result<(), TierError> {
        match self.slot.get() {
            Some(Ok(tier)) => tier.flush().await,
            // Nothing was ever stored in it.
            _ => Ok(()),
        }
    }

    async fn get_by(&self, slots: &mut [ReadSlot<'_>], deadline: Instant) -> Vec<GetResult> {
        match self.tier() {
            Ok(tier) => tier.get_by(slots, deadline).await,
            Err(e) => each(slots.len(), &e),
        }
    }

    async fn exists_by(&self, keys: &[PageKey], deadline: Instant) -> Result<usize, TierError> {
        self.tier()?.exists_by(keys, deadline).await
    }

    async fn put_by(&self, pages: &[Page<'_>], deadline: Instant) -> Vec<PutResult> {
        match self.tier() {
            Ok(tier) => tier.put_by(pages, deadline).await,
            Err(e) => each(pages.len(), &e),
        }
    }
}
