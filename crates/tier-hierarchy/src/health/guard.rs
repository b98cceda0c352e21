//! [`Guarded`]: a tier behind its [`Health`]: calls skip it while it is down, every call's
//! outcome feeds its health, and a probe task finds a down tier back up.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Gate, Health, HealthPolicy, Outcome, TierHealth, TierState};
use crate::{
    GetResult, Lookup, Page, PageKey, PutResult, ReadSlot, RemoveResult, StorageTier, TierError,
    TierInfo, TierStats,
};

/// A tier of a hierarchy with its health. `breaker` off (the top tier): outcomes are
/// recorded, calls are never skipped.
pub(crate) struct Guarded {
    inner: Arc<dyn StorageTier>,
    health: Arc<Health>,
    breaker: bool,
    /// The probe at open, cancelled when the tier is dropped: a hierarchy closed at once
    /// releases its tiers (their folders and locks) without waiting for it.
    open_probe: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let probe = self.open_probe.get_mut().map(Option::take);
        if let Ok(Some(probe)) = probe {
            probe.abort();
        }
    }
}

/// A call in progress: dropped unfinished (the caller gave up), it teaches nothing.
struct Ticket<'a> {
    guard: &'a Guarded,
    id: u64,
    started: Instant,
    open: bool,
}

impl Ticket<'_> {
    fn end(mut self, outcome: Outcome) {
        self.open = false;
        if self.guard.health.end(self.id, self.started, outcome) && self.guard.breaker {
            self.guard.start_probing();
        }
    }

    /// The caller's deadline passed first: a call that waited past `stall_after` was not
    /// answered in a time a working tier takes.
    fn cut(self) {
        let waited = self.started.elapsed();
        let outcome = if waited >= self.guard.health.policy().stall_after {
            Outcome::Failed {
                timeout: true,
                why: format!("no answer in {:.1} s", waited.as_secs_f64()),
            }
        } else {
            Outcome::Neutral
        };
        self.end(outcome);
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if self.open {
            self.guard
                .health
                .end(self.id, self.started, Outcome::Neutral);
        }
    }
}

/// How a batch of per-key results counts: answered if any key was, failed if only tier
/// faults came back, neutral otherwise (only the caller's errors).
fn judge<T>(results: &[Result<T, TierError>], read_bytes: Option<u64>) -> Outcome {
    if results.iter().any(Result::is_ok) {
        return Outcome::Answered { read_bytes };
    }
    match results
        .iter()
        .find_map(|r| r.as_ref().err().filter(|e| e.is_tier_fault()))
    {
        Some(e) => Outcome::Failed {
            timeout: matches!(e, TierError::Timeout { .. }),
            why: e.to_string(),
        },
        None => Outcome::Neutral,
    }
}

fn judge_one<T>(result: &Result<T, TierError>) -> Outcome {
    judge(std::slice::from_ref(result), None)
}

impl Guarded {
    pub(crate) fn new(inner: Arc<dyn StorageTier>, policy: HealthPolicy, breaker: bool) -> Self {
        let health = Arc::new(Health::new(inner.info().name, policy));
        Self {
            inner,
            health,
            breaker,
            open_probe: Mutex::new(None),
        }
    }

    pub(crate) fn health(&self) -> TierHealth {
        self.health.snapshot()
    }

    pub(crate) fn state(&self) -> TierState {
        self.health.state()
    }

    /// Waits until the tier is not down.
    pub(crate) async fn wait_up(&self) {
        self.health.wait_up().await
    }

    /// `Some(why)`: skip the call (the tier is down).
    fn skip(&self) -> Option<String> {
        if !self.breaker {
            return None;
        }
        match self.health.gate() {
            Gate::Go => None,
            Gate::Skip(just_tripped) => {
                if just_tripped {
                    self.start_probing();
                }
                Some(format!(
                    "tier {} is down ({}); skipped until a probe finds it back",
                    self.inner.info().name,
                    self.health.reason()
                ))
            }
        }
    }

    fn begin(&self) -> Ticket<'_> {
        let (id, started) = self.health.begin();
        Ticket {
            guard: self,
            id,
            started,
            open: true,
        }
    }

    /// Whether a read of `bytes` cannot finish by `deadline`, by the tier's estimate (only
    /// once it is slow: an up tier is always asked).
    fn too_slow_for(&self, bytes: u64, deadline: Instant) -> bool {
        if !self.breaker || self.health.state() != TierState::Slow {
            return false;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        self.health
            .snapshot()
            .load_time(1, bytes)
            .is_some_and(|t| t > left)
    }

    /// Probes the tier at open, in the background: a tier that does not answer is down
    /// before the first request waits for it. The probe ends when the tier is dropped.
    pub(crate) fn probe_at_open(&self) {
        if !self.breaker || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        // Held weakly until the probe runs: a tier dropped before then goes at once.
        let tier = Arc::downgrade(&self.inner);
        let health = Arc::clone(&self.health);
        let task = tokio::spawn(async move {
            let Some(held) = tier.upgrade() else {
                return;
            };
            let (id, started) = health.begin();
            let timeout = health.policy().probe_timeout;
            let probed = probe(held.as_ref(), timeout).await;
            drop(held);
            match probed {
                Ok(()) => {
                    health.end(id, started, Outcome::Answered { read_bytes: None });
                }
                Err(why) => {
                    health.end(id, started, Outcome::Neutral);
                    if health.trip(format!("the probe at open failed: {why}")) {
                        spawn_probing(tier, Arc::downgrade(&health));
                    }
                }
            }
        });
        if let Ok(mut slot) = self.open_probe.lock() {
            *slot = Some(task.abort_handle());
        }
    }

    /// Starts the one probe task of a tier that just went down.
    fn start_probing(&self) {
        spawn_probing(Arc::downgrade(&self.inner), Arc::downgrade(&self.health));
    }
}

/// The probe task of a down tier: probes with backoff until the tier answers, and ends when
/// the tier is dropped (it holds neither the tier nor its health between probes).
fn spawn_probing(tier: Weak<dyn StorageTier>, health: Weak<Health>) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    tokio::spawn(async move {
        loop {
            let wait = match health.upgrade() {
                Some(h) => h.next_backoff(),
                None => return,
            };
            tokio::time::sleep(wait).await;
            let (Some(tier), Some(health)) = (tier.upgrade(), health.upgrade()) else {
                return;
            };
            if health.state() != TierState::Down {
                return;
            }
            match probe(tier.as_ref(), health.policy().probe_timeout).await {
                Ok(()) => {
                    health.recovered();
                    return;
                }
                Err(why) => {
                    tracing::debug!(tier = %tier.info().name, error = %why, "probe failed");
                }
            }
        }
    });
}

/// Runs `call` to its end, or until `deadline`: `None` when the deadline came first (the call
/// is then dropped, which every tier allows).
async fn until<T>(
    deadline: Option<Instant>,
    call: impl std::future::Future<Output = T>,
) -> Option<T> {
    match deadline {
        None => Some(call.await),
        Some(d) => tokio::time::timeout_at(d.into(), call).await.ok(),
    }
}

/// One probe: an `exists` of one key, bounded.
async fn probe(tier: &dyn StorageTier, timeout: Duration) -> Result<(), String> {
    let key = PageKey::new("kvtier-health-probe").map_err(|e| e.to_string())?;
    match tokio::time::timeout(timeout, tier.exists(std::slice::from_ref(&key))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer in {:.1} s", timeout.as_secs_f64())),
    }
}

impl Guarded {
    async fn get_within(
        &self,
        slots: &mut [ReadSlot<'_>],
        deadline: Option<Instant>,
    ) -> Vec<GetResult> {
        let n = slots.len();
        let bytes: u64 = slots.iter().map(|s| s.buf.len() as u64).sum();
        let skip = self.skip().is_some() || deadline.is_some_and(|d| self.too_slow_for(bytes, d));
        if skip {
            self.health.skipped_reads(n);
            return (0..n).map(|_| Ok(Lookup::Miss)).collect();
        }
        let ticket = self.begin();
        let Some(results) = until(deadline, self.inner.get(slots)).await else {
            ticket.cut();
            return (0..n).map(|_| Ok(Lookup::Miss)).collect();
        };
        let read: u64 = slots
            .iter()
            .zip(&results)
            .filter(|(_, r)| matches!(r, Ok(Lookup::Hit)))
            .map(|(s, _)| s.buf.len() as u64)
            .sum();
        ticket.end(judge(&results, Some(read)));
        results
    }

    async fn exists_within(
        &self,
        keys: &[PageKey],
        deadline: Option<Instant>,
    ) -> Result<usize, TierError> {
        if self.skip().is_some() {
            self.health.skipped_reads(keys.len());
            return Ok(0);
        }
        let ticket = self.begin();
        let Some(result) = until(deadline, self.inner.exists(keys)).await else {
            ticket.cut();
            return Ok(0);
        };
        ticket.end(judge_one(&result));
        result
    }

    async fn put_within(&self, pages: &[Page<'_>], deadline: Option<Instant>) -> Vec<PutResult> {
        if let Some(why) = self.skip() {
            self.health.skipped_writes(pages.len());
            return pages
                .iter()
                .map(|_| Err(TierError::Unavailable(why.clone())))
                .collect();
        }
        let ticket = self.begin();
        let Some(results) = until(deadline, self.inner.put(pages)).await else {
            let after = ticket.started.elapsed();
            ticket.cut();
            return pages
                .iter()
                .map(|_| Err(TierError::Timeout { op: "put", after }))
                .collect();
        };
        ticket.end(judge(&results, None));
        results
    }
}

#[async_trait]
impl StorageTier for Guarded {
    fn info(&self) -> TierInfo {
        self.inner.info()
    }

    fn stats(&self) -> TierStats {
        self.inner.stats()
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        self.put_within(pages, None).await
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        self.get_within(slots, None).await
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        self.exists_within(keys, None).await
    }

    /// Skipped while the tier is skipped (a touch is a hint; nothing is lost).
    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        if self.skip().is_some() {
            return Ok(());
        }
        let ticket = self.begin();
        let result = self.inner.touch(keys).await;
        ticket.end(judge_one(&result));
        result
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        if let Some(why) = self.skip() {
            self.health.skipped_writes(keys.len());
            return keys
                .iter()
                .map(|_| Err(TierError::Unavailable(why.clone())))
                .collect();
        }
        let ticket = self.begin();
        let results = self.inner.remove(keys).await;
        ticket.end(judge(&results, None));
        results
    }

    async fn clear(&self) -> Result<(), TierError> {
        if let Some(why) = self.skip() {
            return Err(TierError::Unavailable(why));
        }
        let ticket = self.begin();
        let result = self.inner.clear().await;
        ticket.end(judge_one(&result));
        result
    }

    async fn flush(&self) -> Result<(), TierError> {
        // A down tier acknowledged none of the writes it skipped: nothing to wait for.
        if self.breaker && self.health.state() == TierState::Down {
            return Ok(());
        }
        self.inner.flush().await
    }

    async fn get_by(&self, slots: &mut [ReadSlot<'_>], deadline: Instant) -> Vec<GetResult> {
        self.get_within(slots, Some(deadline)).await
    }

    async fn exists_by(&self, keys: &[PageKey], deadline: Instant) -> Result<usize, TierError> {
        self.exists_within(keys, Some(deadline)).await
    }

    async fn put_by(&self, pages: &[Page<'_>], deadline: Instant) -> Vec<PutResult> {
        self.put_within(pages, Some(deadline)).await
    }
}
