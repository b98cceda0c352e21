//! Prometheus metrics of a hierarchy and its tiers, in the OpenMetrics text format.
//!
//! Two sources, one exposition. Every call to a tier of a [`Hierarchy`](crate::Hierarchy), and
//! to the hierarchy itself, goes through a [`CallMeter`]: it times the call (a histogram per
//! operation), counts its pages and its errors by kind, emits a debug span and event, and warns
//! (at most once a second per tier) naming a page that failed. The counters tiers and the
//! hierarchy keep anyway (hits, bytes, evictions, promotions, the queue) are read when scraped,
//! so nothing is counted twice.
//!
//! `prometheus-client` rather than the `metrics` facade: kvtier runs inside engines' processes
//! (SGLang, LMCache, vLLM), where a library must not take the one process-wide recorder, and
//! each hierarchy keeps its own registry that one endpoint serves.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tracing::Instrument;

mod encode;
mod serve;

pub(crate) use encode::encode;
pub use serve::serve_metrics;

use crate::{
    GetResult, Lookup, Page, PageKey, PutResult, ReadSlot, RemoveResult, StorageTier, TierError,
    TierInfo, TierStats,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    hierarchy: String,
    tier: String,
    kind: String,
    op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    hierarchy: String,
    tier: String,
    kind: String,
    op: String,
    error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabels {
    hierarchy: String,
    tier: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HierarchyLabels {
    hierarchy: String,
}

fn call_seconds() -> Histogram {
    // 10 µs to about 10 s, by fours.
    Histogram::new(exponential_buckets(1e-5, 4.0, 11))
}

/// The live metric families the calls of one hierarchy's tiers record into.
#[derive(Clone)]
pub(crate) struct CallFamilies {
    hierarchy: String,
    seconds: Family<CallLabels, Histogram, fn() -> Histogram>,
    pages: Family<CallLabels, Counter>,
    bytes: Family<CallLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
}

impl CallFamilies {
    pub(crate) fn new(hierarchy: &str) -> Self {
        CallFamilies {
            hierarchy: hierarchy.to_owned(),
            seconds: Family::new_with_constructor(call_seconds),
            pages: Family::default(),
            bytes: Family::default(),
            errors: Family::default(),
        }
    }

    /// A meter for the calls to the tier `name` of kind `kind`.
    pub(crate) fn meter(&self, name: &str, kind: &str) -> CallMeter {
        let ops = OPS.map(|op| {
            let labels = CallLabels {
                hierarchy: self.hierarchy.clone(),
                tier: name.to_owned(),
                kind: kind.to_owned(),
                op: op.to_owned(),
            };
            OpMetrics {
                seconds: self.seconds.get_or_create(&labels).clone(),
                pages: self.pages.get_or_create(&labels).clone(),
                bytes: self.bytes.get_or_create(&labels).clone(),
            }
        });
        CallMeter {
            errors: self.errors.clone(),
            hierarchy: self.hierarchy.clone(),
            tier: name.to_owned(),
            kind: kind.to_owned(),
            ops,
            warned: Mutex::new(Warned::default()),
        }
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "tier_call_seconds",
            "Duration of calls to a tier, by operation (its count is the number of calls)",
            self.seconds.clone(),
        );
        registry.register(
            "tier_call_pages",
            "Pages (keys) passed to a tier's calls, by operation",
            self.pages.clone(),
        );
        registry.register(
            "tier_call_bytes",
            "Bytes a tier's calls stored (put) or returned (get hits)",
            self.bytes.clone(),
        );
        registry.register(
            "tier_call_errors",
            "Pages or calls a tier failed, by operation and error kind",
            self.errors.clone(),
        );
    }
}

#[derive(Default)]
struct Warned {
    last: Option<Instant>,
    quiet: u64,
}

/// The operations metered, in the order of [`CallMeter`]'s handles.
const OPS: [&str; 5] = ["put", "get", "exists", "remove", "clear"];

/// One operation's live metrics for one tier (handles into the families).
struct OpMetrics {
    seconds: Histogram,
    pages: Counter,
    bytes: Counter,
}

/// Measures the calls to one tier: time, pages, bytes, errors by kind; a debug span and event
/// per call, and a rate-limited warning naming a failed page.
pub(crate) struct CallMeter {
    errors: Family<ErrorLabels, Counter>,
    hierarchy: String,
    tier: String,
    kind: String,
    ops: [OpMetrics; 5],
    warned: Mutex<Warned>,
}

/// What one call did, for [`CallMeter::record`].
struct Outcome<'a> {
    pages: usize,
    bytes: u64,
    hits: usize,
    misses: usize,
    errors: Vec<(Option<&'a PageKey>, &'a TierError)>,
}

impl Outcome<'_> {
    fn new(pages: usize) -> Self {
        Outcome {
            pages,
            bytes: 0,
            hits: 0,
            misses: 0,
            errors: Vec::new(),
        }
    }
}

impl CallMeter {
    fn record(&self, op: &'static str, took: Duration, outcome: Outcome<'_>) {
        if let Some(m) = OPS.iter().position(|o| *o == op).map(|i| &self.ops[i]) {
            m.seconds.observe(took.as_secs_f64());
            m.pages.inc_by(outcome.pages as u64);
            m.bytes.inc_by(outcome.bytes);
        }
        for (_, e) in &outcome.errors {
            self.errors
                .get_or_create(&ErrorLabels {
                    hierarchy: self.hierarchy.clone(),
                    tier: self.tier.clone(),
                    kind: self.kind.clone(),
                    op: op.to_owned(),
                    error: e.kind().to_owned(),
                })
                .inc();
        }
        tracing::debug!(
            tier = %self.tier,
            op,
            pages = outcome.pages,
            bytes = outcome.bytes,
            hits = outcome.hits,
            misses = outcome.misses,
            errors = outcome.errors.len(),
            micros = took.as_micros() as u64,
            "tier call"
        );
        if let Some((key, error)) = outcome.errors.first() {
            self.warn(op, *key, error, outcome.errors.len() as u64);
        }
    }

    fn warn(&self, op: &str, key: Option<&PageKey>, error: &TierError, failed: u64) {
        let mut w = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if w.last
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            w.quiet += failed;
            return;
        }
        let key = key.map_or_else(|| "-".to_owned(), |k| k.to_string());
        tracing::warn!(
            tier = %self.tier,
            op,
            key = %key,
            error = %error,
            failed_since_last_warning = w.quiet,
            "tier call failed"
        );
        w.last = Some(now);
        w.quiet = 0;
    }

    fn span(&self, op: &'static str, pages: usize) -> tracing::Span {
        tracing::debug_span!("tier_call", tier = %self.tier, op, pages)
    }

    /// Runs a `put` of `pages` and records it.
    pub(crate) async fn put(
        &self,
        pages: &[Page<'_>],
        call: impl Future<Output = Vec<PutResult>>,
    ) -> Vec<PutResult> {
        let started = Instant::now();
        let results = call.instrument(self.span("put", pages.len())).await;
        let mut outcome = Outcome::new(pages.len());
        for (page, r) in pages.iter().zip(&results) {
            match r {
                Ok(()) => outcome.bytes += page.data.len() as u64,
                Err(e) => outcome.errors.push((Some(&page.key), e)),
            }
        }
        self.record("put", started.elapsed(), outcome);
        results
    }

    /// Starts measuring a `get` of `pages` slots: its start and its span.
    pub(crate) fn getting(&self, pages: usize) -> (Instant, tracing::Span) {
        (Instant::now(), self.span("get", pages))
    }

    /// Records a `get` started at `started` by [`CallMeter::getting`], from its slots (the
    /// call hands them back) and results.
    pub(crate) fn got(&self, started: Instant, slots: &[ReadSlot<'_>], results: &[GetResult]) {
        let mut outcome = Outcome::new(slots.len());
        for (slot, r) in slots.iter().zip(results) {
            match r {
                Ok(Lookup::Hit) => {
                    outcome.hits += 1;
                    outcome.bytes += slot.buf.len() as u64;
                }
                Ok(Lookup::Miss) => outcome.misses += 1,
                Err(e) => outcome.errors.push((Some(&slot.key), e)),
            }
        }
        self.record("get", started.elapsed(), outcome);
    }

    /// Runs an `exists` of `keys` and records it.
    pub(crate) async fn exists(
        &self,
        keys: &[PageKey],
        call: impl Future<Output = Result<usize, TierError>>,
    ) -> Result<usize, TierError> {
        let started = Instant::now();
        let result = call.instrument(self.span("exists", keys.len())).await;
        let mut outcome = Outcome::new(keys.len());
        match &result {
            Ok(n) => {
                outcome.hits = *n;
                outcome.misses = keys.len() - n.min(&keys.len());
            }
            Err(e) => outcome.errors.push((e.key(), e)),
        }
        self.record("exists", started.elapsed(), outcome);
        result
    }

    /// Runs a `remove` of `keys` and records it.
    pub(crate) async fn remove(
        &self,
        keys: &[PageKey],
        call: impl Future<Output = Vec<RemoveResult>>,
    ) -> Vec<RemoveResult> {
        let started = Instant::now();
        let results = call.instrument(self.span("remove", keys.len())).await;
        let mut outcome = Outcome::new(keys.len());
        for (key, r) in keys.iter().zip(&results) {
            match r {
                Ok(true) => outcome.hits += 1,
                Ok(false) => outcome.misses += 1,
                Err(e) => outcome.errors.push((Some(key), e)),
            }
        }
        self.record("remove", started.elapsed(), outcome);
        results
    }

    /// Runs a `clear` and records it.
    pub(crate) async fn clear(
        &self,
        call: impl Future<Output = Result<(), TierError>>,
    ) -> Result<(), TierError> {
        let started = Instant::now();
        let result = call.instrument(self.span("clear", 0)).await;
        let mut outcome = Outcome::new(0);
        if let Err(e) = &result {
            outcome.errors.push((None, e));
        }
        self.record("clear", started.elapsed(), outcome);
        result
    }
}

/// A tier whose every call is measured by a [`CallMeter`]; what a hierarchy holds.
pub(crate) struct Metered {
    inner: Arc<dyn StorageTier>,
    meter: CallMeter,
}

impl Metered {
    pub(crate) fn new(inner: Arc<dyn StorageTier>, families: &CallFamilies) -> Self {
        let info = inner.info();
        let meter = families.meter(&info.name, &info.kind);
        Metered { inner, meter }
    }
}

#[async_trait::async_trait]
impl StorageTier for Metered {
    fn info(&self) -> TierInfo {
        self.inner.info()
    }

    fn stats(&self) -> TierStats {
        self.inner.stats()
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        self.meter.put(pages, self.inner.put(pages)).await
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        let (started, span) = self.meter.getting(slots.len());
        let results = self.inner.get(slots).instrument(span).await;
        self.meter.got(started, slots, &results);
        results
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        self.meter.exists(keys, self.inner.exists(keys)).await
    }

    async fn touch(&self, keys: &[PageKey]) -> Result<(), TierError> {
        self.inner.touch(keys).await
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        self.meter.remove(keys, self.inner.remove(keys)).await
    }

    async fn clear(&self) -> Result<(), TierError> {
        self.meter.clear(self.inner.clear()).await
    }

    async fn flush(&self) -> Result<(), TierError> {
        self.inner.flush().await
    }
}
