//! Random concurrent histories, checked against what a sequential store may answer.
//!
//! Several tasks call `put`, `get`, `exists`, `remove` and `clear` on a few keys at once, with
//! random page lengths; some calls are dropped at a random point: after 0 to 5 polls (so at
//! each await point in turn) or after up to 2 ms, whichever comes first. Every call's start and end are stamped on one logical clock.
//! Afterwards each answer is checked against every order the calls could have run in:
//!
//! - a hit holds, byte for byte, a version that was put under that key with that length, and
//!   not one *superseded* before the get began (a later put that returned Ok, or a remove or
//!   clear that returned, all begun after the version's put ended);
//! - a length mismatch names the length of such a version;
//! - `exists` counts no superseded page, and stops at no page that must be there;
//! - unless the tier may lose pages (bounded, or faults injected), a page whose put returned Ok
//!   is there until a later call touched its key: a miss, an error or a `false` remove is a
//!   lost write.
//!
//! A dropped call may have happened or not, but only until it was dropped: a version whose
//! put was dropped and that surfaces after a later, acknowledged put is stale too.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier, TierError};

use crate::content;
use crate::rng::Rng;

mod check;

pub(crate) use check::check;

/// Page lengths a history writes and reads (most calls use the first); multiples of 4 KiB,
/// which every tier takes (direct I/O too).
const LENS: [usize; 3] = [4096, 12288, 8192];
/// Bound on one call that is not dropped on purpose: past it the history reports a hang.
const CALL_BOUND: Duration = Duration::from_secs(60);

/// The shape of one history.
#[derive(Debug, Clone, Copy)]
pub struct HistoryPlan {
    /// Seed of every random choice (printed, and with any violation; see [`crate::rng::seed`]).
    pub seed: u64,
    /// Concurrent tasks.
    pub tasks: usize,
    /// Calls per task.
    pub ops: usize,
    /// Distinct keys the calls touch.
    pub keys: usize,
    /// Share of calls dropped before they finish, in percent.
    pub cancel_percent: u64,
    /// The tier may lose pages (it evicts, or faults are injected below it): misses and
    /// errors are then allowed, wrong or stale bytes never.
    pub may_lose: bool,
}

impl Default for HistoryPlan {
    fn default() -> Self {
        Self {
            seed: crate::rng::seed(0x6b76_7469_6572),
            tasks: 4,
            ops: 120,
            keys: 6,
            cancel_percent: 20,
            may_lose: false,
        }
    }
}

/// What a history did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistoryCounts {
    /// Calls made.
    pub calls: u64,
    /// Calls dropped before they finished.
    pub cancelled: u64,
    /// Pages read back as hits and checked.
    pub hits: u64,
    /// Answers that were misses.
    pub misses: u64,
    /// Answers that were errors (other than length mismatches).
    pub errors: u64,
}

impl std::ops::AddAssign for HistoryCounts {
    fn add_assign(&mut self, o: Self) {
        self.calls += o.calls;
        self.cancelled += o.cancelled;
        self.hits += o.hits;
        self.misses += o.misses;
        self.errors += o.errors;
    }
}

/// A page length: most calls use the first.
fn pick_len(rng: &mut Rng) -> usize {
    match rng.below(100) {
        0..=84 => LENS[0],
        85..=94 => LENS[1],
        _ => LENS[2],
    }
}

/// 1 to `max` distinct key indices out of `keys`.
fn pick_keys(rng: &mut Rng, keys: usize, max: u64) -> Vec<usize> {
    let n = 1 + rng.below(max) as usize;
    let mut picked = Vec::new();
    while picked.len() < n.min(keys) {
        let k = rng.below(keys as u64) as usize;
        if !picked.contains(&k) {
            picked.push(k);
        }
    }
    picked
}

/// A call, with what it asked.
#[derive(Debug)]
pub(crate) enum Call {
    /// (key, version, length) per page.
    Put(Vec<(usize, u64, usize)>),
    /// (key, buffer length) per slot.
    Get(Vec<(usize, usize)>),
    Exists(Vec<usize>),
    Remove(Vec<usize>),
    Clear,
}

/// What one key's get answered.
#[derive(Debug)]
pub(crate) enum Seen {
    Hit(Vec<u8>),
    Miss,
    Mismatch(usize),
    Error(String),
}

#[derive(Debug)]
pub(crate) enum Answer {
    Dropped,
    /// Per page: the put's error, if any.
    Put(Vec<Option<String>>),
    Get(Vec<Seen>),
    Exists(Result<usize, String>),
    Remove(Vec<Result<bool, String>>),
    Clear(Result<(), String>),
}

impl Answer {
    /// The answer without page bytes.
    pub(crate) fn brief(&self) -> String {
        match self {
            Answer::Get(seen) => format!(
                "{:?}",
                seen.iter()
                    .map(|s| match s {
                        Seen::Hit(buf) => format!("hit {} B", buf.len()),
                        other => format!("{other:?}"),
                    })
                    .collect::<Vec<_>>()
            ),
            other => format!("{other:?}"),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Event {
    pub task: usize,
    pub call: Call,
    pub start: u64,
    pub end: u64,
    pub answer: Answer,
}

impl Event {
    fn touches(&self, key: usize) -> bool {
        match &self.call {
            Call::Put(pages) => pages.iter().any(|p| p.0 == key),
            Call::Remove(keys) => keys.contains(&key),
            Call::Clear => true,
            Call::Get(_) | Call::Exists(_) => false,
        }
    }

    fn mentions(&self, key: usize) -> bool {
        match &self.call {
            Call::Get(slots) => slots.iter().any(|s| s.0 == key),
            Call::Exists(keys) => keys.contains(&key),
            _ => self.touches(key),
        }
    }

    /// Whether this call certainly replaced or removed `key`'s page (it returned, and Ok).
    fn supersedes(&self, key: usize) -> bool {
        match (&self.call, &self.answer) {
            (Call::Put(pages), Answer::Put(errs)) => pages
                .iter()
                .zip(errs)
                .any(|(p, e)| p.0 == key && e.is_none()),
            (Call::Remove(keys), Answer::Remove(rs)) => {
                keys.iter().zip(rs).any(|(k, r)| *k == key && r.is_ok())
            }
            (Call::Clear, Answer::Clear(r)) => r.is_ok(),
            _ => false,
        }
    }
}

/// A version some put wrote: the event that wrote it and its length.
struct Written {
    event: usize,
    version: u64,
    len: usize,
    acked: bool,
}

/// The keys a history with `plan` touches.
pub fn keys(plan: &HistoryPlan) -> Vec<PageKey> {
    (0..plan.keys)
        .map(|i| PageKey::new(format!("hist{:04x}k{i:03}", plan.seed & 0xffff)).expect("valid key"))
        .collect()
}

/// Runs one history on `tier`; returns its counts, or every violation found (with the seed).
pub async fn run_history(
    tier: Arc<dyn StorageTier>,
    plan: HistoryPlan,
) -> Result<HistoryCounts, String> {
    let names = Arc::new(keys(&plan));
    let clock = Arc::new(AtomicU64::new(0));
    let versions = Arc::new(AtomicU64::new(1));
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..plan.tasks {
        let (tier, names, clock, versions) = (
            Arc::clone(&tier),
            Arc::clone(&names),
            Arc::clone(&clock),
            Arc::clone(&versions),
        );
        tasks.spawn(async move {
            let mut rng =
                Rng::new(plan.seed ^ (task as u64 + 1).wrapping_mul(0xa076_1d64_78bd_642f));
            let mut events = Vec::new();
            for _ in 0..plan.ops {
                let call = match rng.below(100) {
                    0..=39 => Call::Put(
                        pick_keys(&mut rng, plan.keys, 3)
                            .into_iter()
                            .map(|k| (k, versions.fetch_add(1, SeqCst), pick_len(&mut rng)))
                            .collect(),
                    ),
                    40..=74 => Call::Get(
                        pick_keys(&mut rng, plan.keys, 3)
                            .into_iter()
                            .map(|k| (k, pick_len(&mut rng)))
                            .collect(),
                    ),
                    75..=84 => Call::Exists(pick_keys(&mut rng, plan.keys, 4)),
                    85..=97 => Call::Remove(pick_keys(&mut rng, plan.keys, 2)),
                    _ => Call::Clear,
                };
                let drop_after = (rng.below(100) < plan.cancel_percent).then(|| DropAfter {
                    polls: rng.below(6) as u32,
                    time: Duration::from_micros(rng.below(2000)),
                });
                let start = clock.fetch_add(1, SeqCst);
                let answer = perform(&*tier, &names, &call, drop_after).await;
                let end = clock.fetch_add(1, SeqCst);
                if let Some(answer) = answer {
                    events.push(Event {
                        task,
                        call,
                        start,
                        end,
                        answer,
                    });
                } else {
                    return Err(format!(
                        "task {task}: {call:?} did not finish within {CALL_BOUND:?}"
                    ));
                }
                if rng.below(4) == 0 {
                    tokio::task::yield_now().await;
                }
            }
            Ok(events)
        });
    }
    let mut events = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let task_events = joined.map_err(|e| format!("a history task panicked: {e}"))??;
        events.extend(task_events);
    }
    events.sort_by_key(|e| e.start);
    let (counts, violations) = check(&names, &events, plan.may_lose);
    if violations.is_empty() {
        return Ok(counts);
    }
    let shown: Vec<&String> = violations.iter().take(5).map(|(_, _, v)| v).collect();
    // The calls on the first violation's key, up to the call that saw it.
    let (key, call) = violations
        .iter()
        .find(|(k, _, _)| *k < names.len())
        .map_or((0, events.len() - 1), |(k, c, _)| (*k, *c));
    let mut story: Vec<String> = events[..=call]
        .iter()
        .filter(|e| e.mentions(key))
        .map(|e| {
            format!(
                "[{}, {}] task {}: {:?} -> {}",
                e.start,
                e.end,
                e.task,
                e.call,
                e.answer.brief()
            )
        })
        .collect();
    story.drain(..story.len().saturating_sub(16));
    Err(format!(
        "history with seed {:#x} ({} calls, {} dropped): {} violations, first: {shown:#?}\ncalls on {} (key {key}): {story:#?}",
        plan.seed,
        counts.calls,
        counts.cancelled,
        violations.len(),
        names[key],
    ))
}

/// When to drop a call: after this many polls, or this long, whichever comes first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DropAfter {
    polls: u32,
    time: Duration,
}

/// `fut`, dropped unfinished after `limit.polls` polls or `limit.time`; `Err(())` if it was.
async fn within<F: Future>(limit: Option<DropAfter>, fut: F) -> Result<F::Output, ()> {
    let Some(limit) = limit else {
        return tokio::time::timeout(CALL_BOUND, fut).await.map_err(|_| ());
    };
    let mut fut = std::pin::pin!(fut);
    let mut polls = 0;
    let counted = std::future::poll_fn(|cx| {
        if polls == limit.polls {
            return Poll::Ready(Err(()));
        }
        polls += 1;
        fut.as_mut().poll(cx).map(Ok)
    });
    tokio::time::timeout(limit.time, counted)
        .await
        .unwrap_or(Err(()))
}

/// Makes one call; `None` if it hung past [`CALL_BOUND`].
pub(crate) async fn perform(
    tier: &dyn StorageTier,
    names: &[PageKey],
    call: &Call,
    drop_after: Option<DropAfter>,
) -> Option<Answer> {
    let bound = drop_after;
    let answer = match call {
        Call::Put(pages) => {
            let pages: Vec<Page<'static>> = pages
                .iter()
                .map(|&(k, v, len)| Page::new(names[k].clone(), content::page(&names[k], v, len)))
                .collect();
            within(bound, tier.put(&pages)).await.map(|rs| {
                Answer::Put(
                    rs.into_iter()
                        .map(|r| r.err().map(|e| e.to_string()))
                        .collect(),
                )
            })
        }
        Call::Get(slots) => {
            let mut bufs: Vec<Vec<u8>> = slots.iter().map(|&(_, len)| vec![0u8; len]).collect();
            let mut read: Vec<ReadSlot<'_>> = slots
                .iter()
                .zip(bufs.iter_mut())
                .map(|(&(k, _), b)| ReadSlot::new(names[k].clone(), b))
                .collect();
            let results = within(bound, tier.get(&mut read)).await;
            drop(read);
            results.map(|rs| {
                Answer::Get(
                    rs.into_iter()
                        .zip(bufs)
                        .map(|(r, buf)| match r {
                            Ok(Lookup::Hit) => Seen::Hit(buf),
                            Ok(Lookup::Miss) => Seen::Miss,
                            Err(TierError::LengthMismatch { stored, .. }) => Seen::Mismatch(stored),
                            Err(e) => Seen::Error(e.to_string()),
                        })
                        .collect(),
                )
            })
        }
        Call::Exists(keys) => {
            let keys: Vec<PageKey> = keys.iter().map(|&k| names[k].clone()).collect();
            within(bound, tier.exists(&keys))
                .await
                .map(|r| Answer::Exists(r.map_err(|e| e.to_string())))
        }
        Call::Remove(keys) => {
            let keys: Vec<PageKey> = keys.iter().map(|&k| names[k].clone()).collect();
            within(bound, tier.remove(&keys)).await.map(|rs| {
                Answer::Remove(
                    rs.into_iter()
                        .map(|r| r.map_err(|e| e.to_string()))
                        .collect(),
                )
            })
        }
        Call::Clear => within(bound, tier.clear())
            .await
            .map(|r| Answer::Clear(r.map_err(|e| e.to_string()))),
    };
    match answer {
        Ok(answer) => Some(answer),
        Err(_) if drop_after.is_some() => Some(Answer::Dropped),
        Err(_) => None,
    }
}

/// A put dropped half way, then an acknowledged put of the same key: whatever the dropped
/// call left running must never land over the newer page. Checked after a pause long enough
/// for any leftover work to finish, `rounds` times with drops at different points.
pub async fn overwrite_after_drop(
    tier: &dyn StorageTier,
    rounds: u64,
    may_lose: bool,
) -> Result<u64, String> {
    let mut dropped = 0;
    for r in 0..rounds {
        let key = PageKey::new(format!("late{:03}", r % 3)).expect("valid key");
        let (old, new) = (10_000 + 2 * r, 10_001 + 2 * r);
        let limit = DropAfter {
            polls: 1 + (r % 4) as u32,
            time: Duration::from_micros(250 * (r % 8)),
        };
        let page = |v| [Page::new(key.clone(), content::page(&key, v, LENS[0]))];
        if within(Some(limit), tier.put(&page(old))).await.is_err() {
            dropped += 1;
        }
        match within(None, tier.put(&page(new))).await {
            Ok(rs) if rs.iter().all(|r| r.is_ok()) => {}
            _ if may_lose => continue,
            other => return Err(format!("round {r}: the acknowledged put failed: {other:?}")),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let mut buf = vec![0u8; LENS[0]];
        let got = within(None, tier.get(&mut [ReadSlot::new(key.clone(), &mut buf)])).await;
        match got.as_deref() {
            Ok([Ok(Lookup::Hit)]) if content::verify(&key, new, &buf).is_ok() => {}
            Ok([Ok(Lookup::Hit)]) if content::verify(&key, old, &buf).is_ok() => {
                return Err(format!(
                    "round {r}: a put dropped after {limit:?} landed over the newer page put after it (stale)"
                ))
            }
            Ok([Ok(Lookup::Hit)]) => {
                return Err(format!("round {r}: {key} read back torn or foreign"))
            }
            Ok([Ok(Lookup::Miss)] | [Err(_)]) if may_lose => {}
            other => return Err(format!("round {r}: reading {key} back gave {other:?}")),
        }
    }
    Ok(dropped)
}
