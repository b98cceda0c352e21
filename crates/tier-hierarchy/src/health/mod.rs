//! Tier health: every tier of a hierarchy is up, slow or down, judged by its own calls.
//!
//! - **Down**: `trip_after` calls in a row failed (I/O, backend, unavailable), one timed out,
//!   or a call has gone unanswered for `stall_after`. A lower tier that is down costs nothing:
//!   its reads are misses at once, its writes fail at once (the hierarchy then serves those
//!   keys from above only, never a stale copy), and one probe at a time, with backoff, finds it
//!   back up.
//! - **Slow**: alive, but the 90th percentile of its recent calls is over `slow_after`. Calls
//!   still go; a call with a deadline skips a tier whose estimate does not fit in it.
//! - **Up**: otherwise.
//!
//! Each tier also keeps a running estimate of what a read costs (a fixed part and a
//! bandwidth, fitted to its recent reads), so a caller can weigh loading against recomputing.

mod guard;

pub(crate) use guard::Guarded;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// When a tier counts as slow or down, and how it is found back up.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthPolicy {
    /// Calls in a row that failed before a tier is down (a timeout counts at once). 0: a
    /// tier is never marked down (no breaker).
    pub trip_after: u32,
    /// A call unanswered this long marks its tier down: later calls skip it while the call
    /// waits out its own bound.
    pub stall_after: Duration,
    /// The 90th percentile of recent calls over which a tier is slow; `None`: never slow.
    pub slow_after: Option<Duration>,
    /// The first wait before a down tier is probed; it doubles after each failed probe.
    pub probe_backoff: Duration,
    /// The longest wait between probes.
    pub probe_backoff_max: Duration,
    /// Bound on one probe (an `exists` of one key).
    pub probe_timeout: Duration,
}

impl HealthPolicy {
    /// A config error naming the first setting that cannot work: a zero wait or bound (a
    /// probe loop without a pause, a probe that always times out), or a backoff bound below
    /// the first wait.
    pub fn check(&self) -> Result<(), tier_core::TierError> {
        let positive = [
            ("health.stall_after", self.stall_after),
            ("health.probe_backoff", self.probe_backoff),
            ("health.probe_timeout", self.probe_timeout),
        ];
        for (field, value) in positive {
            if value.is_zero() {
                return Err(tier_core::TierError::config(
                    field,
                    "must be longer than zero",
                ));
            }
        }
        if self.slow_after.is_some_and(|d| d.is_zero()) {
            return Err(tier_core::TierError::config(
                "health.slow_after",
                "must be longer than zero (leave it out for never slow)",
            ));
        }
        if self.probe_backoff_max < self.probe_backoff {
            return Err(tier_core::TierError::config(
                "health.probe_backoff_max",
                "must be at least probe_backoff",
            ));
        }
        Ok(())
    }
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            trip_after: 3,
            stall_after: Duration::from_secs(2),
            slow_after: Some(Duration::from_secs(1)),
            probe_backoff: Duration::from_millis(500),
            probe_backoff_max: Duration::from_secs(30),
            probe_timeout: Duration::from_secs(2),
        }
    }
}

/// A tier's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TierState {
    /// Answering within bounds.
    Up,
    /// Answering, but its recent calls are over `slow_after`.
    Slow,
    /// Not answering: skipped until a probe finds it back.
    Down,
}

impl TierState {
    /// `up`, `slow` or `down`.
    pub fn as_str(self) -> &'static str {
        match self {
            TierState::Up => "up",
            TierState::Slow => "slow",
            TierState::Down => "down",
        }
    }
}

/// One tier's health, as it was when asked.
#[derive(Debug, Clone)]
pub struct TierHealth {
    /// Up, slow or down.
    pub state: TierState,
    /// Why it is in that state (empty when up).
    pub reason: String,
    /// How long it has been in that state.
    pub for_how_long: Duration,
    /// State changes since the hierarchy opened.
    pub transitions: u64,
    /// Reads answered as misses at once because the tier was down (or too slow for the
    /// call's deadline), in pages.
    pub reads_skipped: u64,
    /// Writes (and removes) failed at once because the tier was down, in pages.
    pub writes_skipped: u64,
    /// The fitted fixed cost of one read call.
    pub read_latency: Option<Duration>,
    /// The fitted read bandwidth, bytes per second.
    pub read_bandwidth: Option<f64>,
}

impl TierHealth {
    /// The estimated time to read `pages` pages of `page_bytes` each in one call, if the tier
    /// has served reads to fit from.
    pub fn load_time(&self, pages: u64, page_bytes: u64) -> Option<Duration> {
        let latency = self.read_latency?;
        let bandwidth = self.read_bandwidth?;
        let secs =
            latency.as_secs_f64() + pages.saturating_mul(page_bytes) as f64 / bandwidth.max(1.0);
        Some(Duration::from_secs_f64(secs.clamp(0.0, 1e9)))
    }
}

/// How one call ended, as health counts it.
pub(crate) enum Outcome {
    /// The tier answered (`bytes` read in a read call that found pages).
    Answered { read_bytes: Option<u64> },
    /// It failed as a tier (I/O, backend, unavailable), or timed out.
    Failed { timeout: bool, why: String },
    /// Nothing to learn (only the caller's errors, or cut short by the caller).
    Neutral,
}

/// What [`Health::gate`] decided for a call.
pub(crate) enum Gate {
    /// Make the call.
    Go,
    /// Skip it (the tier is down); `true`: it just went down, start probing.
    Skip(bool),
}

/// Recent samples kept for the percentile.
const WINDOW: usize = 32;
/// The weight an old sample of the read fit keeps per new one.
const DECAY: f64 = 0.9;

/// The health of one tier.
pub(crate) struct Health {
    tier: String,
    policy: HealthPolicy,
    state: Mutex<State>,
    watch: watch::Sender<TierState>,
    reads_skipped: AtomicU64,
    writes_skipped: AtomicU64,
}

struct State {
    state: TierState,
    reason: String,
    since: Instant,
    transitions: u64,
    failures: u32,
    next_call: u64,
    in_flight: BTreeMap<u64, Instant>,
    recent: VecDeque<Duration>,
    fit: ReadFit,
    /// The wait before the next probe; it keeps growing until a call (not a probe) answers.
    backoff: Duration,
    /// A probe found the tier back, and no call has answered since: the next failure trips
    /// at once (a probe may be answered from a tier's memory while its storage hangs).
    on_trial: bool,
}

/// A least-squares fit, with decay, of a read call's seconds against its bytes.
#[derive(Default)]
struct ReadFit {
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

impl ReadFit {
    fn add(&mut self, bytes: f64, secs: f64) {
        for v in [
            &mut self.w,
            &mut self.x,
            &mut self.y,
            &mut self.xx,
            &mut self.xy,
        ] {
            *v *= DECAY;
        }
        self.w += 1.0;
        self.x += bytes;
        self.y += secs;
        self.xx += bytes * bytes;
        self.xy += bytes * secs;
    }

    /// (seconds per call, bytes per second), once a read was seen.
    fn solve(&self) -> Option<(f64, f64)> {
        if self.w <= 0.0 || self.x <= 0.0 {
            return None;
        }
        let (mx, my) = (self.x / self.w, self.y / self.w);
        let var = self.xx / self.w - mx * mx;
        let cov = self.xy / self.w - mx * my;
        // Calls all of one size (or a negative slope) say nothing of a fixed part: charge
        // everything to bandwidth.
        let (fixed, per_byte) = if var > mx * mx * 1e-6 && cov > 0.0 {
            let b = cov / var;
            let a = my - b * mx;
            if a >= 0.0 {
                (a, b)
            } else {
                (0.0, my / mx)
            }
        } else {
            (0.0, my / mx)
        };
        Some((fixed, 1.0 / per_byte.max(1e-15)))
    }
}

impl Health {
    pub(crate) fn new(tier: String, policy: HealthPolicy) -> Self {
        Self {
            tier,
            policy: policy.clone(),
            state: Mutex::new(State {
                state: TierState::Up,
                reason: String::new(),
                since: Instant::now(),
                transitions: 0,
                failures: 0,
                next_call: 0,
                in_flight: BTreeMap::new(),
                recent: VecDeque::with_capacity(WINDOW),
                fit: ReadFit::default(),
                backoff: policy.probe_backoff,
                on_trial: false,
            }),
            watch: watch::channel(TierState::Up).0,
            reads_skipped: AtomicU64::new(0),
            writes_skipped: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn policy(&self) -> &HealthPolicy {
        &self.policy
    }

    /// Whether a call may go to the tier now. A call unanswered past `stall_after` marks the
    /// tier down here.
    pub(crate) fn gate(&self) -> Gate {
        let mut s = self.lock();
        if s.state == TierState::Down {
            return Gate::Skip(false);
        }
        if self.policy.trip_after == 0 {
            return Gate::Go;
        }
        let stalled = s
            .in_flight
            .values()
            .next()
            .map(Instant::elapsed)
            .filter(|waited| *waited >= self.policy.stall_after);
        if let Some(waited) = stalled {
            let why = format!("a call unanswered for {:.1} s", waited.as_secs_f64());
            self.change(&mut s, TierState::Down, why);
            return Gate::Skip(true);
        }
        Gate::Go
    }

    /// Records a call as started; the ticket ends it.
    pub(crate) fn begin(&self) -> (u64, Instant) {
        let mut s = self.lock();
        let id = s.next_call;
        s.next_call += 1;
        let now = Instant::now();
        s.in_flight.insert(id, now);
        (id, now)
    }

    /// Ends call `id`, started at `started`. `true`: the tier just went down.
    pub(crate) fn end(&self, id: u64, started: Instant, outcome: Outcome) -> bool {
        let took = started.elapsed();
        let mut s = self.lock();
        s.in_flight.remove(&id);
        match outcome {
            Outcome::Neutral => false,
            Outcome::Answered { read_bytes } => {
                s.failures = 0;
                s.on_trial = false;
                s.backoff = self.policy.probe_backoff;
                if let Some(bytes) = read_bytes.filter(|b| *b > 0) {
                    s.fit.add(bytes as f64, took.as_secs_f64());
                }
                if s.recent.len() == WINDOW {
                    s.recent.pop_front();
                }
                s.recent.push_back(took);
                if let (Some(bound), true) = (self.policy.slow_after, s.recent.len() >= 8) {
                    let mut sorted: Vec<Duration> = s.recent.iter().copied().collect();
                    sorted.sort_unstable();
                    let p90 = sorted[sorted.len() * 9 / 10];
                    match s.state {
                        TierState::Up if p90 > bound => {
                            let why = format!(
                                "90th percentile of recent calls {:.3} s, over {:.3} s",
                                p90.as_secs_f64(),
                                bound.as_secs_f64()
                            );
                            self.change(&mut s, TierState::Slow, why);
                        }
                        TierState::Slow if p90 <= bound => {
                            self.change(&mut s, TierState::Up, String::new())
                        }
                        _ => {}
                    }
                }
                false
            }
            Outcome::Failed { timeout, why } => {
                s.failures = s.failures.saturating_add(1);
                let trip = self.policy.trip_after > 0
                    && s.state != TierState::Down
                    && (timeout || s.on_trial || s.failures >= self.policy.trip_after);
                if trip {
                    let why = if s.on_trial {
                        format!("the first call after a probe found it back failed: {why}")
                    } else if timeout {
                        format!("a call timed out: {why}")
                    } else {
                        format!("{} calls in a row failed, the last: {why}", s.failures)
                    };
                    self.change(&mut s, TierState::Down, why);
                }
                trip
            }
        }
    }

    /// A probe answered: the tier is up again.
    pub(crate) fn recovered(&self) {
        let mut s = self.lock();
        s.failures = 0;
        s.on_trial = true;
        s.recent.clear();
        if s.state == TierState::Down {
            self.change(&mut s, TierState::Up, String::new());
        }
    }

    /// The wait before the next probe, doubled for the one after (up to the bound).
    pub(crate) fn next_backoff(&self) -> Duration {
        let mut s = self.lock();
        let wait = s.backoff;
        s.backoff = (wait * 2).min(self.policy.probe_backoff_max);
        wait
    }

    /// Marks the tier down (a probe at open failed). `true`: it was not down before.
    pub(crate) fn trip(&self, why: String) -> bool {
        let mut s = self.lock();
        if s.state == TierState::Down || self.policy.trip_after == 0 {
            return false;
        }
        self.change(&mut s, TierState::Down, why);
        true
    }

    fn change(&self, s: &mut State, to: TierState, why: String) {
        let from = s.state;
        s.state = to;
        s.since = Instant::now();
        s.transitions += 1;
        match to {
            TierState::Down => {
                tracing::warn!(tier = %self.tier, from = from.as_str(), reason = %why, "tier is down: its reads are misses and its writes are skipped until a probe finds it back")
            }
            TierState::Slow => {
                tracing::warn!(tier = %self.tier, from = from.as_str(), reason = %why, "tier is slow")
            }
            TierState::Up => tracing::info!(tier = %self.tier, from = from.as_str(), "tier is up"),
        }
        s.reason = why;
        self.watch.send_replace(to);
    }

    pub(crate) fn skipped_reads(&self, pages: usize) {
        self.reads_skipped.fetch_add(pages as u64, Relaxed);
    }

    pub(crate) fn skipped_writes(&self, pages: usize) {
        self.writes_skipped.fetch_add(pages as u64, Relaxed);
    }

    pub(crate) fn state(&self) -> TierState {
        self.lock().state
    }

    /// The reason of the current state, for errors.
    pub(crate) fn reason(&self) -> String {
        self.lock().reason.clone()
    }

    /// Waits until the tier is not down.
    pub(crate) async fn wait_up(&self) {
        let mut rx = self.watch.subscribe();
        let _ = rx.wait_for(|s| *s != TierState::Down).await;
    }

    pub(crate) fn snapshot(&self) -> TierHealth {
        let s = self.lock();
        let fit = s.fit.solve();
        TierHealth {
            state: s.state,
            reason: s.reason.clone(),
            for_how_long: s.since.elapsed(),
            transitions: s.transitions,
            reads_skipped: self.reads_skipped.load(Relaxed),
            writes_skipped: self.writes_skipped.load(Relaxed),
            read_latency: fit.map(|(a, _)| Duration::from_secs_f64(a)),
            read_bandwidth: fit.map(|(_, bw)| bw),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed() -> Outcome {
        Outcome::Failed {
            timeout: false,
            why: "io".into(),
        }
    }

    #[test]
    fn errors_in_a_row_trip_and_an_answer_between_resets_the_count() {
        let h = Health::new("t".into(), HealthPolicy::default());
        for _ in 0..2 {
            let (id, at) = h.begin();
            assert!(!h.end(id, at, failed()));
        }
        let (id, at) = h.begin();
        h.end(id, at, Outcome::Answered { read_bytes: None });
        for _ in 0..2 {
            let (id, at) = h.begin();
            assert!(!h.end(id, at, failed()));
        }
        assert_eq!(h.state(), TierState::Up);
        let (id, at) = h.begin();
        assert!(h.end(id, at, failed()));
        assert_eq!(h.state(), TierState::Down);
        assert!(matches!(h.gate(), Gate::Skip(false)));
        h.recovered();
        assert_eq!(h.state(), TierState::Up);
        assert_eq!(h.snapshot().transitions, 2);
    }

    #[test]
    fn one_timeout_trips_and_a_stalled_call_trips_the_next_gate() {
        let h = Health::new("t".into(), HealthPolicy::default());
        let (id, at) = h.begin();
        let why = "5 s".to_string();
        assert!(h.end(id, at, Outcome::Failed { timeout: true, why }));
        h.recovered();
        let policy = HealthPolicy {
            stall_after: Duration::from_millis(20),
            ..HealthPolicy::default()
        };
        let h = Health::new("t".into(), policy);
        let _stuck = h.begin();
        assert!(matches!(h.gate(), Gate::Go));
        std::thread::sleep(Duration::from_millis(30));
        assert!(matches!(h.gate(), Gate::Skip(true)));
        assert_eq!(h.state(), TierState::Down);
    }

    #[test]
    fn a_tier_a_probe_found_back_trips_on_its_first_failure_and_backs_off_longer() {
        let h = Health::new("t".into(), HealthPolicy::default());
        assert!(h.trip("probe at open".into()));
        assert_eq!(h.next_backoff(), Duration::from_millis(500));
        h.recovered();
        let (id, at) = h.begin();
        assert!(h.end(id, at, failed()), "one failure trips a tier on trial");
        assert_eq!(
            h.next_backoff(),
            Duration::from_secs(1),
            "the backoff kept growing"
        );
        h.recovered();
        let (id, at) = h.begin();
        h.end(id, at, Outcome::Answered { read_bytes: None });
        assert_eq!(
            h.next_backoff(),
            Duration::from_millis(500),
            "an answer resets it"
        );
        let (id, at) = h.begin();
        assert!(
            !h.end(id, at, failed()),
            "off trial, one failure does not trip"
        );
    }

    #[test]
    fn no_breaker_never_goes_down() {
        let policy = HealthPolicy {
            trip_after: 0,
            ..HealthPolicy::default()
        };
        let h = Health::new("t".into(), policy);
        for _ in 0..10 {
            let (id, at) = h.begin();
            let why = "x".to_string();
            assert!(!h.end(id, at, Outcome::Failed { timeout: true, why }));
        }
        assert!(matches!(h.gate(), Gate::Go));
    }

    #[test]
    fn the_read_fit_recovers_a_fixed_cost_and_a_bandwidth() {
        let mut fit = ReadFit::default();
        // 1 ms per call plus 1 GB/s.
        for i in 1..40u64 {
            let bytes = (i % 7 + 1) * 1_000_000;
            fit.add(bytes as f64, 0.001 + bytes as f64 / 1e9);
        }
        let (fixed, bw) = fit.solve().expect("fitted");
        assert!((fixed - 0.001).abs() < 1e-6, "{fixed}");
        assert!((bw / 1e9 - 1.0).abs() < 1e-3, "{bw}");
        let mut one_size = ReadFit::default();
        for _ in 0..5 {
            one_size.add(1e6, 0.002);
        }
        let (fixed, bw) = one_size.solve().expect("fitted");
        assert_eq!(fixed, 0.0);
        assert!((bw - 5e8).abs() < 1.0, "{bw}");
    }

    #[test]
    fn slow_calls_make_a_tier_slow_and_fast_ones_bring_it_back() {
        let policy = HealthPolicy {
            slow_after: Some(Duration::from_millis(5)),
            ..HealthPolicy::default()
        };
        let h = Health::new("t".into(), policy);
        for _ in 0..8 {
            let (id, _) = h.begin();
            let at = Instant::now() - Duration::from_millis(10);
            h.end(id, at, Outcome::Answered { read_bytes: None });
        }
        assert_eq!(h.state(), TierState::Slow);
        for _ in 0..WINDOW {
            let (id, at) = h.begin();
            h.end(id, at, Outcome::Answered { read_bytes: None });
        }
        assert_eq!(h.state(), TierState::Up);
    }
}
