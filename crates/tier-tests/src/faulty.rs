//! [`FaultyTier`]: wraps any tier and injects failures: everything failing on a switch, a rate
//! of failed calls, added latency, the Nth call failing, and torn reads (a get that delivers
//! only part of a page: half the buffer overwritten with garbage and an error for that key, as a
//! storage read that came back short).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

use tier_core::{
    async_trait, GetResult, Lookup, Page, PageKey, PutResult, ReadSlot, RemoveResult, StorageTier,
    TierError, TierInfo, TierStats,
};

use crate::factory::DynTier;

/// What to inject.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Fraction of calls (0.0..=1.0) that fail whole.
    pub error_rate: f64,
    /// Delay added before every call.
    pub latency: Duration,
    /// Fail exactly the Nth call (1-based).
    pub fail_nth: Option<u64>,
    /// Every other hit comes back torn: its buffer's second half overwritten with garbage and
    /// the key's result an error (a short read).
    pub torn_reads: bool,
}

/// A tier with injected faults.
pub struct FaultyTier {
    inner: DynTier,
    faults: Mutex<Faults>,
    failing: AtomicBool,
    calls: AtomicU64,
    rng: AtomicU64,
    injected: AtomicU64,
    torn: AtomicU64,
}

impl FaultyTier {
    /// Wraps `inner` with `faults`.
    pub fn new(inner: DynTier, faults: Faults) -> Self {
        Self {
            inner,
            faults: Mutex::new(faults),
            failing: AtomicBool::new(false),
            calls: AtomicU64::new(0),
            rng: AtomicU64::new(0x2545_f491_4f6c_dd1d),
            injected: AtomicU64::new(0),
            torn: AtomicU64::new(0),
        }
    }

    /// Makes every call fail (`true`) or restores normal behaviour.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Relaxed);
    }

    /// Replaces the injected faults.
    pub fn set_faults(&self, faults: Faults) {
        *self.faults.lock().unwrap_or_else(|e| e.into_inner()) = faults;
    }

    /// Calls failed and reads torn on purpose so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Relaxed)
    }

    fn faults(&self) -> Faults {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Decides this call's fate after the configured latency.
    async fn enter(&self, op: &'static str) -> Result<Faults, TierError> {
        let faults = self.faults();
        if !faults.latency.is_zero() {
            tokio::time::sleep(faults.latency).await;
        }
        let n = self.calls.fetch_add(1, Relaxed) + 1;
        let roll = {
            let mut z = self.rng.fetch_add(0x9e37_79b9_7f4a_7c15, Relaxed);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) as f64 / u64::MAX as f64
        };
        let fail =
            self.failing.load(Relaxed) || faults.fail_nth == Some(n) || roll < faults.error_rate;
        if fail {
            self.injected.fetch_add(1, Relaxed);
            return Err(TierError::Backend {
                backend: "faulty".into(),
                key: None,
                message: format!("injected failure of {op} (call {n})"),
            });
        }
        Ok(faults)
    }
}

fn fail_all<T>(n: usize, e: &TierError) -> Vec<Result<T, TierError>> {
    (0..n)
        .map(|_| {
            Err(TierError::Backend {
                backend: "faulty".into(),
                key: None,
                message: e.to_string(),
            })
        })
        .collect()
}

#[async_trait]
impl StorageTier for FaultyTier {
    fn info(&self) -> TierInfo {
        TierInfo {
            kind: format!("faulty({})", self.inner.info().kind),
            ..self.inner.info()
        }
    }

    fn stats(&self) -> TierStats {
        self.inner.stats()
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        match self.enter("put").await {
            Ok(_) => self.inner.put(pages).await,
            Err(e) => fail_all(pages.len(), &e),
        }
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let faults = match self.enter("get").await {
            Ok(f) => f,
            Err(e) => return fail_all(slots.len(), &e),
        };
        let mut results = self.inner.get(slots).await;
        if faults.torn_reads {
            for (slot, r) in slots.iter_mut().zip(results.iter_mut()) {
                if matches!(r, Ok(Lookup::Hit)) && self.torn.fetch_add(1, Relaxed).is_multiple_of(2)
                {
                    let (len, half) = (slot.buf.len(), slot.buf.len() / 2);
                    let mut bytes = slot.buf.to_vec();
                    bytes[half..].fill(0xa5);
                    slot.buf.fill_from(&bytes);
                    self.injected.fetch_add(1, Relaxed);
                    *r = Err(TierError::Backend {
                        backend: "faulty".into(),
                        key: Some(slot.key.clone()),
                        message: format!("injected torn read: {half} of {len} bytes arrived"),
                    });
                }
            }
        }
        results
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        self.enter("exists").await?;
        self.inner.exists(keys).await
    }

    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        self.inner.touch(keys).await
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        match self.enter("remove").await {
            Ok(_) => self.inner.remove(keys).await,
            Err(e) => fail_all(keys.len(), &e),
        }
    }

    async fn clear(&self) -> Result<(), TierError> {
        self.enter("clear").await?;
        self.inner.clear().await
    }

    async fn flush(&self) -> Result<(), TierError> {
        self.inner.flush().await
    }
}
