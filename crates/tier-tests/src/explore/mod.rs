//! Every schedule of a small scenario on a hierarchy: an exhaustive check of its queue and
//! in-flight set.
//!
//! Each tier of the hierarchy sits behind a gate: a call waits there until the explorer lets
//! it through, one call at a time. Between two releases everything else runs until it waits at
//! a gate again (one thread, so the code between two tier calls is one step). The explorer
//! tries every order of releases, and, once per schedule if the scenario allows it, dropping a
//! client's call wherever it waits, by depth-first search over these choices: each schedule
//! runs afresh on a new runtime, replaying the choices before its new one. The clients'
//! calls, then a flush and a read of every key, are checked as [`crate::history`] checks a
//! random history: against every order the calls could have run in.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use tier_core::PageKey;
use tier_hierarchy::{Hierarchy, HierarchyPolicy, WritePolicy};
use tokio::sync::oneshot;

use crate::history::{check, perform, Answer, Call, Event};
use crate::model::ModelTier;
use crate::suite::DynTier;

mod gate;

use gate::{settle, GatedTier, Gates};

/// Page length every scenario writes.
const LEN: usize = 4096;

/// One client call of a scenario, on key indices.
#[derive(Debug, Clone, Copy)]
pub enum Step {
    /// Put a new version of the key.
    Put(usize),
    /// Get the key.
    Get(usize),
    /// `exists` of the key.
    Exists(usize),
    /// Remove the key.
    Remove(usize),
}

/// A small scenario: clients running their steps in order, at once, on a hierarchy of a
/// model top tier holding `top_pages` pages over a model lower tier.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// What it checks, for messages.
    pub name: &'static str,
    /// The hierarchy's write policy.
    pub write: WritePolicy,
    /// Pages (4 KiB each) the top tier holds.
    pub top_pages: usize,
    /// Each client's steps.
    pub clients: Vec<Vec<Step>>,
    /// Keys the steps name.
    pub keys: usize,
    /// Whether the explorer may also drop one client call (where it waits) per schedule.
    pub drops: bool,
    /// A queue too small for one page: pages the top tier evicts are not carried down (lost,
    /// as evicted from the hierarchy), and nothing older below may be served in their place.
    /// Otherwise the queue holds every page the scenario writes.
    pub tiny_queue: bool,
    /// Schedules past which the search stops and fails (the scenario is too big).
    pub max_schedules: usize,
    /// The hierarchy's `admit_after`: requests of a key before its page is written below.
    /// Above 1, a page not admitted is lost when the top tier evicts it: misses are allowed,
    /// a stale or foreign page never is.
    pub admit_after: u32,
    /// A flaw planted in the lower tier, to show the explorer rejects what it should; `None`
    /// for every scenario of kvtier's hierarchy.
    pub flaw: Option<Flaw>,
}

/// A flaw the explorer's self-tests plant below the hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
    /// The lower tier answers every put of a key it holds as done and keeps the old page.
    LowerKeepsOldVersions,
}

/// What an exploration covered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Explored {
    /// Schedules run, each to its end and checked.
    pub schedules: usize,
    /// Of them, schedules with a dropped call.
    pub with_drop: usize,
    /// The most choices one schedule made.
    pub deepest: usize,
}

/// A choice the explorer makes at one point of a schedule.
#[derive(Debug, Clone)]
enum Choice {
    /// Let the call waiting at this gate through.
    Release(u64, String),
    /// Drop this client's call where it waits.
    Drop(usize),
}

impl Choice {
    fn describe(&self) -> String {
        match self {
            Choice::Release(_, label) => format!("let through: {label}"),
            Choice::Drop(client) => format!("drop client {client}'s call"),
        }
    }
}

/// One client's state, shared with the explorer.
#[derive(Default)]
struct Client {
    /// Set while a call runs: sending drops it.
    cancel: Option<oneshot::Sender<()>>,
    done: bool,
}

/// Runs one schedule: `replay` first, then the first option at every new choice point.
/// Returns the choices made with how many options each had, and the violations found.
fn run_schedule(scenario: &Scenario, replay: &[usize]) -> Schedule {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime for one schedule");
    runtime.block_on(schedule(scenario, replay))
}

async fn schedule(scenario: &Scenario, replay: &[usize]) -> Schedule {
    let gates = Arc::new(Gates::default());
    let top_bytes = (scenario.top_pages * LEN) as u64;
    let top_gates = Arc::clone(&gates);
    let lower: DynTier = Arc::new(GatedTier {
        name: "lower",
        inner: Arc::new(ModelTier::default()),
        gates: Arc::clone(&gates),
        flaw: scenario.flaw,
    });
    let policy = HierarchyPolicy {
        write: scenario.write,
        queue_bytes: Some(if scenario.tiny_queue { 1 } else { 1 << 20 }),
        admit_after: scenario.admit_after,
        ..HierarchyPolicy::default()
    };
    let built = Hierarchy::builder("explored")
        .policy(policy)
        .tier_with(move |on_evict| {
            Ok(Arc::new(GatedTier {
                name: "top",
                inner: Arc::new(ModelTier::bounded(top_bytes, on_evict)),
                gates: top_gates,
                flaw: None,
            }) as DynTier)
        })
        .tier(lower)
        .build();
    let h = match built {
        Ok(h) => Arc::new(h),
        Err(e) => {
            return Schedule {
                problems: vec![format!("could not build the hierarchy: {e}")],
                ..Schedule::default()
            }
        }
    };
    let names: Arc<Vec<PageKey>> = Arc::new(
        (0..scenario.keys)
            .map(|i| PageKey::new(format!("x{i}")).expect("valid key"))
            .collect(),
    );
    let log = Arc::new(Log::default());
    let clients: Arc<Vec<Mutex<Client>>> =
        Arc::new(scenario.clients.iter().map(|_| Mutex::default()).collect());
    let mut next_version = 1;
    for (task, steps) in scenario.clients.iter().enumerate() {
        let calls: Vec<Call> = steps
            .iter()
            .map(|step| match *step {
                Step::Put(k) => {
                    next_version += 1;
                    Call::Put(vec![(k, next_version, LEN)])
                }
                Step::Get(k) => Call::Get(vec![(k, LEN)]),
                Step::Exists(k) => Call::Exists(vec![k]),
                Step::Remove(k) => Call::Remove(vec![k]),
            })
            .collect();
        let (h, names, log, clients) = (
            Arc::clone(&h),
            Arc::clone(&names),
            Arc::clone(&log),
            Arc::clone(&clients),
        );
        tokio::spawn(async move {
            for call in calls {
                let (tx, rx) = oneshot::channel::<()>();
                lock(&clients[task]).cancel = Some(tx);
                let start = log.tick();
                let answer = tokio::select! {
                    biased;
                    _ = rx => Some(Answer::Dropped),
                    answer = perform(&*h, &names, &call, None) => answer,
                };
                lock(&clients[task]).cancel = None;
                log.push(task, call, start, answer);
            }
            lock(&clients[task]).done = true;
        });
    }
    let mut made = Vec::new();
    let mut dropped = false;
    let mut problems = Vec::new();
    loop {
        settle(&gates).await;
        if clients.iter().all(|c| lock(c).done) {
            break;
        }
        let mut options: Vec<Choice> = gates
            .waiting()
            .into_iter()
            .map(|(id, label)| Choice::Release(id, label))
            .collect();
        if scenario.drops && !dropped {
            options.extend(
                (0..clients.len())
                    .filter(|&t| lock(&clients[t]).cancel.is_some())
                    .map(Choice::Drop),
            );
        }
        if options.is_empty() {
            problems.push("no call can move: the clients are stuck".to_string());
            break;
        }
        let pick = replay
            .get(made.len())
            .copied()
            .unwrap_or(0)
            .min(options.len() - 1);
        made.push((pick, options.len(), options[pick].describe()));
        match &options[pick] {
            Choice::Release(id, _) => gates.release(*id),
            Choice::Drop(task) => {
                dropped = true;
                if let Some(tx) = lock(&clients[*task]).cancel.take() {
                    let _ = tx.send(());
                }
            }
        }
    }
    // Afterwards, sequentially: everything lands, then every key is read.
    let last = {
        let h = Arc::clone(&h);
        let (names, log) = (Arc::clone(&names), Arc::clone(&log));
        let task = scenario.clients.len();
        tokio::spawn(async move {
            let _ = h.flush().await;
            for k in 0..names.len() {
                let call = Call::Get(vec![(k, LEN)]);
                let start = log.tick();
                let answer = perform(&*h, &names, &call, None).await;
                log.push(task, call, start, answer);
            }
        })
    };
    for _ in 0..10_000 {
        if last.is_finished() {
            break;
        }
        settle(&gates).await;
        if let Some((id, _)) = gates.waiting().first() {
            gates.release(*id);
        }
    }
    if !last.is_finished() {
        problems.push("the final flush and reads did not finish".to_string());
    }
    let mut events = std::mem::take(&mut *lock(&log.events));
    events.sort_by_key(|e| e.start);
    let may_lose = scenario.tiny_queue || scenario.admit_after > 1;
    let (_, violations) = check(&names, &events, may_lose);
    problems.extend(violations.into_iter().map(|(_, _, v)| v));
    if !problems.is_empty() {
        let story = events.iter().map(|e| {
            format!(
                "[{}, {}] client {}: {:?} -> {}",
                e.start,
                e.end,
                e.task,
                e.call,
                e.answer.brief()
            )
        });
        problems.extend(story);
    }
    Schedule {
        made,
        problems,
        dropped,
    }
}

/// What one schedule did.
#[derive(Default)]
struct Schedule {
    /// Per choice point: the option taken, how many there were, and what it was.
    made: Vec<(usize, usize, String)>,
    /// Violations found (then the calls, as run).
    problems: Vec<String>,
    /// Whether a client call was dropped.
    dropped: bool,
}

/// The calls of one schedule, stamped on one logical clock.
#[derive(Default)]
struct Log {
    clock: AtomicU64,
    events: Mutex<Vec<Event>>,
}

impl Log {
    /// The clock's next tick: a call's start.
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, SeqCst)
    }

    /// Records `call`, begun at `start` and ending now (`None`: it did not finish).
    fn push(&self, task: usize, call: Call, start: u64, answer: Option<Answer>) {
        let end = self.tick();
        let answer = answer.unwrap_or(Answer::Dropped);
        lock(&self.events).push(Event {
            task,
            call,
            start,
            end,
            answer,
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs every schedule of `scenario` and checks each; the first violation fails it, with the
/// schedule that led there.
pub fn explore(scenario: &Scenario) -> Result<Explored, String> {
    let mut explored = Explored::default();
    let mut replay: Vec<usize> = Vec::new();
    loop {
        let Schedule {
            made,
            problems,
            dropped,
        } = run_schedule(scenario, &replay);
        explored.schedules += 1;
        explored.with_drop += usize::from(dropped);
        explored.deepest = explored.deepest.max(made.len());
        if !problems.is_empty() {
            let choices: Vec<&String> = made.iter().map(|(_, _, what)| what).collect();
            return Err(format!(
                "scenario `{}`, schedule {}: {problems:#?}\nchoices made: {choices:#?}",
                scenario.name, explored.schedules
            ));
        }
        if explored.schedules >= scenario.max_schedules {
            return Err(format!(
                "scenario `{}` has more than {} schedules: make it smaller",
                scenario.name, scenario.max_schedules
            ));
        }
        // The next schedule: the last choice point with an option left takes its next one.
        let Some(at) = made
            .iter()
            .rposition(|(pick, options, _)| pick + 1 < *options)
        else {
            return Ok(explored);
        };
        replay = made[..at].iter().map(|(pick, _, _)| *pick).collect();
        replay.push(made[at].0 + 1);
    }
}
