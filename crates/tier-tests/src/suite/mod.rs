//! The conformance cases, the [`TierFactory`] they open tiers from, and the runner.

mod descriptors;
mod hierarchy;
mod histories;
mod input;
mod integrity;
mod ops;
mod state;

pub use descriptors::*;
pub use hierarchy::*;
pub use histories::*;
pub use input::*;
pub use integrity::*;
pub use ops::*;
pub use state::*;

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tier_core::{GetResult, Lookup, Page, PageKey, ReadSlot, StorageTier, TierError};
use tokio::sync::RwLock;

use crate::broken::HierarchyFlaw;
use crate::content;
use descriptors::{fds_back_to, open_fds};
use hierarchy::{lower_outage, over_faulty, over_faulty_tier, quick_probes};

pub use crate::factory::{DynTier, TierFactory};

/// A case's verdict: what broke, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The case that failed.
    pub case: &'static str,
    /// What it saw.
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "conformance case `{}` failed: {}",
            self.case, self.message
        )
    }
}

impl std::error::Error for Failure {}

type CaseResult = Result<(), String>;
type CaseFuture<'a> = Pin<Box<dyn Future<Output = CaseResult> + Send + 'a>>;
type CaseFn = for<'a> fn(&'a dyn TierFactory) -> CaseFuture<'a>;

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        /// Every case, by name, in the order [`run_all`] runs them.
        pub const CASES: &[(&str, CaseFn)] = &[$((stringify!($name), |f| Box::pin($name(f)))),*];
    };
}

crate::with_cases!(cases);

/// Longest a case may take before it counts as hung.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(300);

/// Cases that count the process's descriptors: each runs alone, and under `cargo test` in a
/// process of its own.
const COUNTS_FDS: [&str; 2] = ["fd_leak", "cancellation"];

/// Whether case `name` counts the whole process's descriptors: under `cargo test` it must run
/// in a process of its own ([`crate::fd::in_own_process`]), away from other tests' runtimes.
pub fn counts_fds(name: &str) -> bool {
    COUNTS_FDS.contains(&name)
}

/// Cases share a process; those counting descriptors must run alone, the others may overlap.
static FD_LOCK: RwLock<()> = RwLock::const_new(());

/// Runs the case called `name` against tiers from `factory`.
pub async fn run(name: &str, factory: &dyn TierFactory) -> Result<(), Failure> {
    let Some(&(case, run_case)) = CASES.iter().find(|(n, _)| *n == name) else {
        return Err(Failure {
            case: "unknown",
            message: format!("no conformance case is called {name}"),
        });
    };
    checked(case, run_case(factory)).await
}

/// Runs one of the hierarchy cases (`hierarchy_over_faulty_tier`, `hierarchy_lower_outage`)
/// with `flaw` in the hierarchy they stack over the tier: the self-tests' proof that these
/// cases catch what they aim at, a hierarchy that mishandles its failing lower tier.
pub async fn run_flawed(
    name: &str,
    factory: &dyn TierFactory,
    flaw: HierarchyFlaw,
) -> Result<(), Failure> {
    match name {
        "hierarchy_over_faulty_tier" => {
            checked(
                "hierarchy_over_faulty_tier",
                over_faulty_tier(factory, Some(flaw)),
            )
            .await
        }
        "hierarchy_lower_outage" => {
            checked("hierarchy_lower_outage", lower_outage(factory, Some(flaw))).await
        }
        other => Err(Failure {
            case: "unknown",
            message: format!("{other} stacks no hierarchy over the tier"),
        }),
    }
}

/// Runs a case under the suite's rules: the fd-leak case alone, a bound on its time, and
/// what did not apply printed.
async fn checked(
    case: &'static str,
    run_case: impl Future<Output = CaseResult>,
) -> Result<(), Failure> {
    let _guard = if counts_fds(case) {
        Guard::Exclusive(FD_LOCK.write().await)
    } else {
        Guard::Shared(FD_LOCK.read().await)
    };
    let checked = NOT_APPLICABLE.scope(RefCell::default(), async {
        let result = tokio::time::timeout(CASE_TIMEOUT, run_case).await;
        (result, NOT_APPLICABLE.with(|n| n.take()))
    });
    let (result, skipped) = checked.await;
    for why in skipped {
        // In the test's output (CI shows it for these cases): what this tier was not tested on.
        println!("conformance case `{case}`: not applicable here: {why}");
    }
    match result {
        Ok(result) => result.map_err(|message| Failure { case, message }),
        Err(_) => Err(Failure {
            case,
            message: format!("did not finish within {CASE_TIMEOUT:?}"),
        }),
    }
}

tokio::task_local! {
    /// The parts of the running case that did not apply to the tier, and why.
    static NOT_APPLICABLE: RefCell<Vec<String>>;
}

/// Records that part of the running case does not apply to this tier (printed by name with
/// the case's verdict), rather than passing silently.
fn not_applicable(why: impl Into<String>) {
    let why = why.into();
    let _ = NOT_APPLICABLE.try_with(|n| n.borrow_mut().push(why));
}

/// Runs every case; returns each one's verdict.
pub async fn run_all(factory: &dyn TierFactory) -> Vec<(&'static str, Result<(), Failure>)> {
    let mut verdicts = Vec::new();
    for (name, _) in CASES {
        verdicts.push((*name, run(name, factory).await));
    }
    verdicts
}

/// Runs one case on a fresh two-thread runtime and panics with its failure, for `#[test]`s.
/// The cases that count the whole process's descriptors (`fd_leak`, `cancellation`) run in a
/// process of their own under `cargo test` ([`crate::fd::in_own_process`]).
pub fn run_case(name: &str, factory: &dyn TierFactory) {
    if counts_fds(name) && !crate::fd::in_own_process() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime for the conformance case");
    if let Err(failure) = runtime.block_on(run(name, factory)) {
        panic!("{failure}");
    }
}

enum Guard<'a> {
    Exclusive(#[allow(dead_code)] tokio::sync::RwLockWriteGuard<'a, ()>),
    Shared(#[allow(dead_code)] tokio::sync::RwLockReadGuard<'a, ()>),
}

// ---------------------------------------------------------------- helpers

const PAGE: usize = 64 << 10;

fn keys(prefix: &str, n: usize) -> Vec<PageKey> {
    (0..n)
        .map(|i| {
            let hash = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            PageKey::new(format!("{prefix}{i:05}{hash:016x}")).expect("suite keys are valid")
        })
        .collect()
}

fn page_len(tier: &DynTier, want: usize) -> usize {
    tier.info().max_page_bytes.map_or(want, |m| want.min(m))
}

async fn open(f: &dyn TierFactory) -> Result<DynTier, String> {
    f.open()
        .await
        .map_err(|e| format!("could not open the tier: {e}"))
}

/// Puts `(key, version, len)` pages in batches of `batch`; every put must succeed.
async fn put_all(tier: &DynTier, pages: &[(PageKey, u64, usize)], batch: usize) -> CaseResult {
    for chunk in pages.chunks(batch) {
        let batch: Vec<Page<'static>> = chunk
            .iter()
            .map(|(k, v, len)| Page::new(k.clone(), content::page(k, *v, *len)))
            .collect();
        let results = tier.put(&batch).await;
        check_len(&results, batch.len(), "put")?;
        for (page, r) in batch.iter().zip(results) {
            r.map_err(|e| format!("put of {} failed: {e}", page.key))?;
        }
    }
    Ok(())
}

fn check_len<T>(results: &[T], want: usize, op: &str) -> CaseResult {
    if results.len() == want {
        Ok(())
    } else {
        Err(format!(
            "{op} of {want} keys returned {} results",
            results.len()
        ))
    }
}

/// Reads one page of `len` bytes into a zeroed buffer; returns its result and the buffer.
pub async fn read_page(tier: &dyn StorageTier, key: PageKey, len: usize) -> (GetResult, Vec<u8>) {
    let mut buf = vec![0u8; len];
    let result = tier
        .get(&mut [ReadSlot::new(key, &mut buf)])
        .await
        .pop()
        .unwrap_or_else(|| Err(TierError::Unavailable("get returned no result".into())));
    (result, buf)
}

/// Reads `(key, len)` into zeroed buffers; returns the buffers and per-key results.
async fn read(
    tier: &DynTier,
    keys: &[(PageKey, usize)],
) -> Result<(Vec<Vec<u8>>, Vec<GetResult>), String> {
    let mut bufs: Vec<Vec<u8>> = keys.iter().map(|(_, len)| vec![0u8; *len]).collect();
    let mut slots: Vec<ReadSlot<'_>> = keys
        .iter()
        .zip(bufs.iter_mut())
        .map(|((k, _), b)| ReadSlot::new(k.clone(), b))
        .collect();
    let results = tier.get(&mut slots).await;
    drop(slots);
    check_len(&results, keys.len(), "get")?;
    Ok((bufs, results))
}

/// Reads pages that must all be hits holding `version`, every byte compared.
async fn expect_pages(tier: &DynTier, pages: &[(PageKey, u64, usize)], batch: usize) -> CaseResult {
    for chunk in pages.chunks(batch) {
        let want: Vec<(PageKey, usize)> = chunk.iter().map(|(k, _, l)| (k.clone(), *l)).collect();
        let (bufs, results) = read(tier, &want).await?;
        for (((key, version, _), buf), result) in chunk.iter().zip(&bufs).zip(results) {
            match result {
                Ok(Lookup::Hit) => content::verify(key, *version, buf)?,
                Ok(Lookup::Miss) => {
                    return Err(format!("page {key} was stored but reads as a miss"))
                }
                Err(e) => return Err(format!("get of stored page {key} failed: {e}")),
            }
        }
    }
    Ok(())
}

/// Reads keys that must all be misses.
async fn expect_misses(tier: &DynTier, keys: &[PageKey], len: usize) -> CaseResult {
    let want: Vec<(PageKey, usize)> = keys.iter().map(|k| (k.clone(), len)).collect();
    let (_, results) = read(tier, &want).await?;
    for (key, result) in keys.iter().zip(results) {
        match result {
            Ok(Lookup::Miss) => {}
            Ok(Lookup::Hit) => {
                return Err(format!("page {key} should be absent but reads as a hit"))
            }
            Err(e) => {
                return Err(format!(
                    "get of absent page {key} failed instead of missing: {e}"
                ))
            }
        }
    }
    Ok(())
}

fn versioned(keys: &[PageKey], version: u64, len: usize) -> Vec<(PageKey, u64, usize)> {
    keys.iter().map(|k| (k.clone(), version, len)).collect()
}

async fn exists(tier: &DynTier, keys: &[PageKey]) -> Result<usize, String> {
    tier.exists(keys)
        .await
        .map_err(|e| format!("exists failed: {e}"))
}
