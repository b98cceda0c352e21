//! The conformance cases, the [`TierFactory`] they open tiers from, and the runner.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tier_core::{
    async_trait, DemotionQueue, GetResult, Hierarchy, HierarchyPolicy, Lookup, Page, PageKey,
    ReadSlot, StorageTier, TierError, WritePolicy,
};
use tokio::sync::RwLock;

use crate::broken::{FlawedHierarchy, HierarchyFlaw};
use crate::faulty::{Faults, FaultyTier};
use crate::history::{run_history, HistoryCounts, HistoryPlan};
use crate::model::ModelTier;
use crate::{content, fd};

/// A shared tier handle.
pub type DynTier = Arc<dyn StorageTier>;

/// Opens the tiers a suite run checks. One factory serves one test: repeated [`open`] calls
/// must reach the same storage, so a persistent tier's pages survive a drop and a reopen.
///
/// [`open`]: TierFactory::open
#[async_trait]
pub trait TierFactory: Send + Sync {
    /// Opens the tier under test.
    async fn open(&self) -> Result<DynTier, TierError>;

    /// Opens a tier of the same kind bounded to `capacity_bytes`, on fresh storage; `None` if
    /// the kind has no byte bound.
    async fn open_bounded(&self, _capacity_bytes: u64) -> Option<Result<DynTier, TierError>> {
        None
    }

    /// The folder the tier's files must stay inside, if it keeps files.
    fn root(&self) -> Option<PathBuf> {
        None
    }

    /// The names the tier's storage holds outside the place the tier owns, where the factory
    /// can list them (an object tier: its bucket's names not under its prefix); `None` if it
    /// cannot. The hostile-keys case compares them around its puts: a tier writes only under
    /// its own prefix.
    async fn names_outside(&self) -> Option<Result<BTreeSet<String>, String>> {
        None
    }

    /// Descriptors the tier may legitimately keep open after a call, such as a pool of idle
    /// network connections (0 for tiers that hold none). The fd-leak case then runs enough
    /// rounds that a per-call leak exceeds it.
    fn fd_slack(&self) -> usize {
        0
    }

    /// Makes the storage under the last opened tier fail its I/O (for example by removing its
    /// folders), so the fd-leak case can count descriptors around failing calls. Returns what
    /// it did, or `None` if this kind cannot be made to fail.
    async fn break_storage(&self) -> Option<String> {
        None
    }
}

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
    let _guard = if COUNTS_FDS.contains(&case) {
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
    if COUNTS_FDS.contains(&name) && !crate::fd::in_own_process() {
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

// ---------------------------------------------------------------- cases

/// 256 distinct 64 KiB pages written in batches of 128, read back in batches of 100 into zeroed
/// buffers, every byte compared.
pub async fn integrity_batches(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, PAGE);
    let pages = versioned(&keys("int", 256), 1, len);
    let heads: HashSet<Vec<u8>> = pages
        .iter()
        .map(|(k, v, _)| content::page(k, *v, 16).to_vec())
        .collect();
    if heads.len() != pages.len() {
        return Err("suite bug: pages are not distinct".into());
    }
    put_all(&tier, &pages, 128).await?;
    expect_pages(&tier, &pages, 100).await
}

/// Pages of 4 KiB to 2 MiB, sizes interleaved within each batch.
pub async fn integrity_page_sizes(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let limit = tier.info().max_page_bytes.unwrap_or(usize::MAX);
    let sizes: Vec<usize> = [4 << 10, 16 << 10, 64 << 10, 512 << 10, 2 << 20]
        .into_iter()
        .filter(|s| *s <= limit)
        .collect();
    if sizes.is_empty() {
        return Err(format!(
            "the tier accepts no page of 4 KiB or more (limit {limit})"
        ));
    }
    let ks = keys("size", 8 * sizes.len());
    let pages: Vec<(PageKey, u64, usize)> = ks
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), 7, sizes[i % sizes.len()]))
        .collect();
    put_all(&tier, &pages, 16).await?;
    expect_pages(&tier, &pages, 13).await
}

/// Region boundaries of page `i` of `len` bytes under pattern `pattern`: one region, two
/// halves (an MHA page's K and V), or three uneven parts.
fn region_cuts(pattern: usize, len: usize) -> Vec<usize> {
    match pattern % 3 {
        0 => vec![len / 2],
        1 => vec![len / 3, len / 3 + (len / 3).min(4096) + 1],
        _ => vec![],
    }
}

fn split_at_cuts<'a>(mut buf: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let (mut out, mut at) = (Vec::new(), 0);
    for &cut in cuts {
        let (head, tail) = buf.split_at(cut - at);
        out.push(head);
        (buf, at) = (tail, cut);
    }
    out.push(buf);
    out
}

fn split_at_cuts_mut<'a>(mut buf: &'a mut [u8], cuts: &[usize]) -> Vec<&'a mut [u8]> {
    let (mut out, mut at) = (Vec::new(), 0);
    for &cut in cuts {
        let (head, tail) = buf.split_at_mut(cut - at);
        out.push(head);
        (buf, at) = (tail, cut);
    }
    out.push(buf);
    out
}

/// Pages of several regions lent from the caller's memory (an engine's K and V halves, or
/// uneven parts), put in one batch, read back into zeroed buffers split at other boundaries
/// and into one contiguous buffer: every byte equal, each page whole.
pub async fn integrity_regions(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, PAGE);
    let ks = keys("reg", 48);
    let contents: Vec<Vec<u8>> = ks
        .iter()
        .map(|k| content::page(k, 5, len).to_vec())
        .collect();
    let pages: Vec<Page<'_>> = ks
        .iter()
        .zip(&contents)
        .enumerate()
        .map(|(i, (k, c))| Page::lent(k.clone(), split_at_cuts(c, &region_cuts(i, len))))
        .collect();
    let results = tier.put(&pages).await;
    check_len(&results, pages.len(), "put")?;
    for (page, r) in pages.iter().zip(results) {
        r.map_err(|e| {
            format!(
                "put of {}-region page {} failed: {e}",
                page.data.regions().len(),
                page.key
            )
        })?;
    }
    drop(pages);
    let mut bufs: Vec<Vec<u8>> = ks.iter().map(|_| vec![0u8; len]).collect();
    let mut slots: Vec<ReadSlot<'_>> = ks
        .iter()
        .zip(bufs.iter_mut())
        .enumerate()
        .map(|(i, (k, b))| {
            ReadSlot::regions(k.clone(), split_at_cuts_mut(b, &region_cuts(i + 1, len)))
        })
        .collect();
    let results = tier.get(&mut slots).await;
    drop(slots);
    check_len(&results, ks.len(), "get")?;
    for ((key, buf), result) in ks.iter().zip(&bufs).zip(results) {
        match result {
            Ok(Lookup::Hit) => content::verify(key, 5, buf)
                .map_err(|e| format!("read into regions at other boundaries: {e}"))?,
            other => return Err(format!("multi-region page {key} read back as {other:?}")),
        }
    }
    for key in ks.iter().step_by(3) {
        match read_page(tier.as_ref(), key.clone(), len).await {
            (Ok(Lookup::Hit), buf) => {
                content::verify(key, 5, &buf).map_err(|e| format!("read into one buffer: {e}"))?
            }
            (other, _) => return Err(format!("multi-region page {key} read back as {other:?}")),
        }
    }
    Ok(())
}

/// Open file descriptors counted before and after ten rounds of each operation kind,
/// successful and failing; any growth fails.
pub async fn fd_leak(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 16 << 10);
    let ks = keys("fd", 4);
    let absent = keys("fd-absent", 2);
    // Each call with the outcome it must have on its first run (in this order), so the fds
    // are counted around calls that did what they should.
    let ops: Vec<(&str, Op, &str)> = vec![
        ("put", Op::Put(ks[..2].to_vec(), len), "ok ok"),
        ("put overwrite", Op::Put(ks[..2].to_vec(), len), "ok ok"),
        ("get hit", Op::Get(ks[..2].to_vec(), len), "hit hit"),
        ("get miss", Op::Get(absent.clone(), len), "miss miss"),
        (
            "get length mismatch",
            Op::Get(ks[..1].to_vec(), len + 1),
            "mismatch",
        ),
        ("put empty page", Op::Put(ks[2..3].to_vec(), 0), "err"),
        ("exists", Op::Exists(ks.clone()), "2"),
        (
            "remove present",
            Op::PutRemove(ks[3..].to_vec(), len),
            "true",
        ),
        ("remove absent", Op::Remove(absent.clone()), "false false"),
        ("clear", Op::Clear, "ok"),
    ];
    // Warm-up: lazily created resources (pools, registrations) are not leaks.
    for (name, op, want) in &ops {
        let got = op.run(&tier).await;
        if got != *want {
            return Err(format!(
                "fd_leak's `{name}` answered {got:?}, want {want:?}"
            ));
        }
    }
    let slack = f.fd_slack();
    let rounds = 10 + 2 * slack;
    for (name, op, _) in &ops {
        count_fds_around(name, rounds, slack, || async {
            op.run(&tier).await;
        })
        .await?;
    }
    if let Some(what) = f.break_storage().await {
        let broken = vec![
            ("put", Op::Put(ks.clone(), len)),
            ("get", Op::Get(ks.clone(), len)),
            ("exists", Op::Exists(ks.clone())),
            ("remove", Op::Remove(ks.clone())),
        ];
        for (name, op) in &broken {
            let got = op.run(&tier).await;
            // A put into broken storage must fail (the fds are counted around failing calls).
            if *name == "put" && got != "err err err err" {
                return Err(format!(
                    "a put after {what} answered {got:?}, want every page to fail"
                ));
            }
        }
        for (name, op) in &broken {
            let label = format!("{name} after {what}");
            count_fds_around(&label, rounds, slack, || async {
                op.run(&tier).await;
            })
            .await?;
        }
    }
    Ok(())
}

async fn count_fds_around<F, Fut>(name: &str, rounds: usize, slack: usize, mut op: F) -> CaseResult
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let before = open_fds()?;
    for _ in 0..rounds {
        op().await;
    }
    fds_back_to(before, slack, &format!("{rounds} rounds of `{name}`")).await
}

fn open_fds() -> Result<usize, String> {
    fd::open_fds().map_err(|e| format!("cannot count fds: {e}"))
}

/// Whether the open descriptors came back to `before` (plus `slack`) after `what`.
async fn fds_back_to(before: usize, slack: usize, what: &str) -> CaseResult {
    // Background work (a hierarchy's queued copies) may hold fds briefly: a leak is growth
    // that does not go away.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let mut after = open_fds()?;
    while after > before + slack && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        after = open_fds()?;
    }
    if after > before + slack {
        return Err(format!(
            "fd leak: {what} grew open fds from {before} to {after} (allowed: {slack})"
        ));
    }
    Ok(())
}

enum Op {
    Put(Vec<PageKey>, usize),
    Get(Vec<PageKey>, usize),
    Exists(Vec<PageKey>),
    PutRemove(Vec<PageKey>, usize),
    Remove(Vec<PageKey>),
    Clear,
}

impl Op {
    /// Runs the operation; its outcome in a few words (per key, or a count).
    async fn run(&self, tier: &DynTier) -> String {
        let put = |results: Vec<tier_core::PutResult>| -> Vec<String> {
            results
                .iter()
                .map(|r| if r.is_ok() { "ok" } else { "err" }.to_string())
                .collect()
        };
        let words: Vec<String> = match self {
            Op::Put(ks, len) => {
                let pages: Vec<Page<'static>> = ks
                    .iter()
                    .map(|k| Page::new(k.clone(), content::page(k, 1, *len)))
                    .collect();
                put(tier.put(&pages).await)
            }
            Op::Get(ks, len) => {
                let want: Vec<(PageKey, usize)> = ks.iter().map(|k| (k.clone(), *len)).collect();
                match read(tier, &want).await {
                    Ok((_, results)) => results
                        .iter()
                        .map(|r| match r {
                            Ok(Lookup::Hit) => "hit",
                            Ok(Lookup::Miss) => "miss",
                            Err(TierError::LengthMismatch { .. }) => "mismatch",
                            Err(_) => "err",
                        })
                        .map(String::from)
                        .collect(),
                    Err(e) => vec![format!("failed: {e}")],
                }
            }
            Op::Exists(ks) => vec![match tier.exists(ks).await {
                Ok(n) => n.to_string(),
                Err(_) => "err".into(),
            }],
            Op::PutRemove(ks, len) => {
                let pages: Vec<Page<'static>> = ks
                    .iter()
                    .map(|k| Page::new(k.clone(), content::page(k, 1, *len)))
                    .collect();
                let _ = tier.put(&pages).await;
                removed(tier.remove(ks).await)
            }
            Op::Remove(ks) => removed(tier.remove(ks).await),
            Op::Clear => vec![if tier.clear().await.is_ok() {
                "ok"
            } else {
                "err"
            }
            .into()],
        };
        words.join(" ")
    }
}

fn removed(results: Vec<tier_core::RemoveResult>) -> Vec<String> {
    results
        .iter()
        .map(|r| match r {
            Ok(present) => present.to_string(),
            Err(_) => "err".into(),
        })
        .collect()
}

/// A batch with absent keys: each key gets its own hit or miss, hits byte-exact.
pub async fn partial_batch(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 16 << 10);
    let ks = keys("part", 16);
    let present: Vec<(PageKey, u64, usize)> =
        ks.iter().step_by(2).map(|k| (k.clone(), 3, len)).collect();
    put_all(&tier, &present, 8).await?;
    let want: Vec<(PageKey, usize)> = ks.iter().map(|k| (k.clone(), len)).collect();
    let (bufs, results) = read(&tier, &want).await?;
    for (i, ((key, buf), result)) in ks.iter().zip(&bufs).zip(results).enumerate() {
        match (i % 2 == 0, result) {
            (true, Ok(Lookup::Hit)) => content::verify(key, 3, buf)?,
            (false, Ok(Lookup::Miss)) => {}
            (stored, other) => {
                return Err(format!(
                    "page {key} (stored: {stored}) in a mixed batch gave {other:?}"
                ))
            }
        }
    }
    Ok(())
}

/// `exists` returns the length of the leading run of present keys.
pub async fn exists_prefix(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 4 << 10);
    let k = keys("pre", 6);
    put_all(
        &tier,
        &versioned(
            &[k[0].clone(), k[1].clone(), k[2].clone(), k[4].clone()],
            1,
            len,
        ),
        8,
    )
    .await?;
    let cases: [(Vec<PageKey>, usize); 6] = [
        (k.clone(), 3),
        (vec![k[3].clone(), k[0].clone()], 0),
        (vec![], 0),
        (vec![k[0].clone()], 1),
        (
            vec![
                k[4].clone(),
                k[0].clone(),
                k[1].clone(),
                k[5].clone(),
                k[2].clone(),
            ],
            3,
        ),
        (vec![k[5].clone()], 0),
    ];
    for (query, want) in cases {
        let got = exists(&tier, &query).await?;
        if got != want {
            return Err(format!("exists over {query:?} gave {got}, want {want}"));
        }
    }
    Ok(())
}

/// A later write replaces an earlier one whole, whatever its length, also within one batch.
pub async fn overwrite(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 64 << 10);
    let ks = keys("over", 4);
    put_all(&tier, &versioned(&ks, 1, len), 4).await?;
    put_all(&tier, &versioned(&ks, 2, len), 4).await?;
    expect_pages(&tier, &versioned(&ks, 2, len), 4).await?;
    // Shorter replacement: no stale tail, and the old length no longer fits.
    let short = len / 2;
    put_all(&tier, &versioned(&ks[..1], 3, short), 1).await?;
    expect_pages(&tier, &versioned(&ks[..1], 3, short), 1).await?;
    let (_, results) = read(&tier, &[(ks[0].clone(), len)]).await?;
    match &results[0] {
        Err(TierError::LengthMismatch { stored, .. }) if *stored == short => {}
        other => {
            return Err(format!(
                "reading a shrunk page with its old length gave {other:?}"
            ))
        }
    }
    // Same key twice in one batch: the later entry wins.
    let batch = vec![
        Page::new(ks[1].clone(), content::page(&ks[1], 4, len)),
        Page::new(ks[1].clone(), content::page(&ks[1], 5, len)),
    ];
    for r in tier.put(&batch).await {
        r.map_err(|e| format!("put of a duplicated key failed: {e}"))?;
    }
    expect_pages(&tier, &[(ks[1].clone(), 5, len)], 1).await?;
    // A valid page, then an empty copy of the same key: the empty one fails alone, and the
    // page reported stored is stored.
    let batch = [
        Page::new(ks[2].clone(), content::page(&ks[2], 6, len)),
        Page::new(ks[2].clone(), Vec::<u8>::new()),
    ];
    let results = tier.put(&batch).await;
    match results.as_slice() {
        [Ok(()), Err(TierError::EmptyPage { .. })] => {}
        other => return Err(format!("put of [page, empty copy] gave {other:?}")),
    }
    expect_pages(&tier, &[(ks[2].clone(), 6, len)], 1)
        .await
        .map_err(|e| format!("a page reported stored beside an empty copy of its key: {e}"))
}

/// Removing reports presence per key and leaves neighbours intact; a removed key can be
/// stored again.
pub async fn remove(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 16 << 10);
    let ks = keys("rm", 4);
    let absent = keys("rm-absent", 1);
    put_all(&tier, &versioned(&ks, 1, len), 4).await?;
    let query = [ks[1].clone(), ks[3].clone(), absent[0].clone()];
    let got: Vec<String> = tier
        .remove(&query)
        .await
        .into_iter()
        .map(|r| format!("{r:?}"))
        .collect();
    if got != ["Ok(true)", "Ok(true)", "Ok(false)"] {
        return Err(format!("remove of [present, present, absent] gave {got:?}"));
    }
    expect_misses(&tier, &query[..2], len).await?;
    expect_pages(
        &tier,
        &versioned(&[ks[0].clone(), ks[2].clone()], 1, len),
        2,
    )
    .await?;
    let again: Vec<String> = tier
        .remove(&query[..1])
        .await
        .into_iter()
        .map(|r| format!("{r:?}"))
        .collect();
    if again != ["Ok(false)"] {
        return Err(format!("removing a removed page gave {again:?}"));
    }
    put_all(&tier, &versioned(&ks[1..2], 2, len), 1).await?;
    expect_pages(&tier, &versioned(&ks[1..2], 2, len), 1).await
}

/// `clear` empties the tier, which stays usable.
pub async fn clear(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 16 << 10);
    let ks = keys("clr", 8);
    put_all(&tier, &versioned(&ks, 1, len), 8).await?;
    tier.clear()
        .await
        .map_err(|e| format!("clear failed: {e}"))?;
    expect_misses(&tier, &ks, len).await?;
    let n = exists(&tier, &ks).await?;
    if n != 0 {
        return Err(format!("exists after clear gave {n}"));
    }
    put_all(&tier, &versioned(&ks[..2], 2, len), 2).await?;
    expect_pages(&tier, &versioned(&ks[..2], 2, len), 2).await
}

/// Four writers and two readers on the same eight keys: every read is exactly one written
/// version, never a torn or mixed page.
pub async fn concurrent_writers(f: &dyn TierFactory) -> CaseResult {
    const WRITERS: u64 = 4;
    const ROUNDS: u64 = 6;
    let tier = open(f).await?;
    let len = page_len(&tier, 64 << 10);
    let ks = keys("conc", 8);
    put_all(&tier, &versioned(&ks, 0, len), 8).await?;
    let mut versions = vec![0];
    versions.extend((0..WRITERS).flat_map(|w| (0..ROUNDS).map(move |r| 1 + w * 100 + r)));
    let versions = Arc::new(versions);
    // Per writer, the rounds whose puts have returned: a read that begins after writer w's
    // round r returned may see another writer's page or a later one of w's, never an older
    // one of w's (w's puts run one after another), nor the initial version.
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());

    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let (tier, ks, acked) = (tier.clone(), ks.clone(), acked.clone());
        tasks.spawn(async move {
            for r in 0..ROUNDS {
                let mut order = ks.clone();
                let shift = ((w + r) as usize) % order.len();
                order.rotate_left(shift);
                let pages = versioned(&order, 1 + w * 100 + r, len);
                put_all(&tier, &pages, 3).await?;
                acked[w as usize].store(r + 1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
            Ok(())
        });
    }
    for _ in 0..2 {
        let (tier, ks, versions, acked) =
            (tier.clone(), ks.clone(), versions.clone(), acked.clone());
        tasks.spawn(async move {
            for _ in 0..(ROUNDS * 2) {
                let done: Vec<u64> = acked.iter().map(|a| a.load(Ordering::SeqCst)).collect();
                let want: Vec<(PageKey, usize)> = ks.iter().map(|k| (k.clone(), len)).collect();
                let (bufs, results) = read(&tier, &want).await?;
                for ((key, buf), result) in ks.iter().zip(&bufs).zip(results) {
                    match result {
                        Ok(Lookup::Hit) => match content::which_version(key, &versions, buf) {
                            Some(0) if done.iter().any(|&d| d > 0) => {
                                return Err(format!(
                                    "page {key} read back its initial version after a writer's put of it returned (stale)"
                                ))
                            }
                            Some(v) if v > 0 && (v - 1) % 100 + 1 < done[((v - 1) / 100) as usize] => {
                                let (w, r) = ((v - 1) / 100, (v - 1) % 100);
                                return Err(format!(
                                    "page {key} read back writer {w}'s round {r} after its round {} had returned (stale)",
                                    done[w as usize] - 1
                                ));
                            }
                            Some(_) => {}
                            None => return Err(format!("page {key} read back torn or mixed")),
                        },
                        other => {
                            return Err(format!(
                                "page {key} under concurrent writes gave {other:?}"
                            ))
                        }
                    }
                }
                tokio::task::yield_now().await;
            }
            Ok(())
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| format!("a concurrent task panicked: {e}"))??;
    }
    // Settled: each key holds one final version, read twice the same, and it is one writer's
    // last: every writer's last round wrote every key, so anything older is a lost update.
    let last: Vec<u64> = (0..WRITERS).map(|w| 1 + w * 100 + ROUNDS - 1).collect();
    let want: Vec<(PageKey, usize)> = ks.iter().map(|k| (k.clone(), len)).collect();
    let (first, _) = read(&tier, &want).await?;
    let (second, _) = read(&tier, &want).await?;
    for ((key, a), b) in ks.iter().zip(&first).zip(&second) {
        if a != b || content::which_version(key, &versions, a).is_none() {
            return Err(format!(
                "page {key} is unstable or invalid after writers finished"
            ));
        }
        if content::which_version(key, &last, a).is_none() {
            return Err(format!(
                "page {key} holds version {:?} after the writers finished, not one writer's last (stale: a lost update)",
                content::which_version(key, &versions, a)
            ));
        }
    }
    Ok(())
}

/// Wrong buffer lengths, empty pages and oversized pages fail alone with typed errors, and
/// nothing stored is disturbed.
pub async fn bad_input(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 16 << 10);
    let ks = keys("bad", 6);
    put_all(&tier, &versioned(&ks[..2], 1, len), 2).await?;

    let (bufs, results) = read(
        &tier,
        &[
            (ks[0].clone(), len - 1),
            (ks[1].clone(), len),
            (ks[0].clone(), len + 1),
        ],
    )
    .await?;
    for (i, r) in [0usize, 2].into_iter().map(|i| (i, &results[i])) {
        match r {
            Err(e @ TierError::LengthMismatch { stored, .. })
                if *stored == len && e.key() == Some(&ks[0]) => {}
            other => {
                return Err(format!(
                    "a buffer of the wrong length (slot {i}) gave {other:?}"
                ))
            }
        }
    }
    match &results[1] {
        Ok(Lookup::Hit) => content::verify(&ks[1], 1, &bufs[1])?,
        other => return Err(format!("a good slot beside bad ones gave {other:?}")),
    }

    let results = tier
        .put(&[
            Page::new(ks[2].clone(), Vec::new()),
            Page::new(ks[3].clone(), content::page(&ks[3], 1, len)),
        ])
        .await;
    check_len(&results, 2, "put")?;
    match &results[0] {
        Err(TierError::EmptyPage { key }) if *key == ks[2] => {}
        other => return Err(format!("an empty page gave {other:?}")),
    }
    results[1]
        .as_ref()
        .map_err(|e| format!("a good page beside an empty one failed: {e}"))?;

    let limit = tier.info().max_page_bytes;
    if limit.is_none() {
        not_applicable("the tier has no page size limit: no page is over it");
    }
    if let Some(limit) = limit {
        let results = tier
            .put(&[
                Page::new(ks[4].clone(), vec![1u8; limit + 1]),
                Page::new(ks[5].clone(), content::page(&ks[5], 1, len)),
            ])
            .await;
        check_len(&results, 2, "put")?;
        match &results[0] {
            Err(TierError::PageTooLarge { len: l, .. }) if *l == limit + 1 => {}
            other => return Err(format!("a page over the {limit}-byte limit gave {other:?}")),
        }
        results[1]
            .as_ref()
            .map_err(|e| format!("a good page beside an oversized one failed: {e}"))?;
        if exists(&tier, &ks[4..5]).await? != 0 {
            return Err("a rejected oversized page is visible".into());
        }
        expect_pages(&tier, &versioned(&ks[5..6], 1, len), 1).await?;
    }
    if exists(&tier, &ks[2..3]).await? != 0 {
        return Err("a rejected empty page is visible".into());
    }
    expect_pages(&tier, &versioned(&ks[..2], 1, len), 2).await?;
    expect_pages(&tier, &versioned(&ks[3..4], 1, len), 1).await
}

/// Keys shaped like paths (`../../etc/passwd`, `a/b`, `/abs`, ...) are stored and read back as
/// opaque names, or rejected with `KeyRejected`; no file appears outside the tier's root.
pub async fn hostile_keys(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 4 << 10);
    let names = [
        "../../etc/passwd",
        "a/b",
        "..",
        ".",
        "/abs/kvtier-escape",
        "./x",
        "a\\b",
        "%2e%2e%2f",
        "~root",
        "-rf",
        ".hidden",
        "a/../../b",
        "*?<>|:\"",
        "CON",
        "..%2f..",
        "tmp.partial",
    ];
    let long = "z/".repeat(PageKey::MAX_LEN / 2);
    let ks: Vec<PageKey> = names
        .iter()
        .copied()
        .chain([long.as_str()])
        .map(|n| PageKey::new(n).map_err(|e| format!("suite bug: {e}")))
        .collect::<Result<_, _>>()?;
    let root = f.root();
    let outside = f.names_outside().await.transpose()?;
    if root.is_none() && outside.is_none() {
        not_applicable(
            "no folder or bucket outside which writes could be watched (the factory gives neither)",
        );
    }
    let watched = watched_dirs(root);
    let before = listings(&watched);

    let pages: Vec<Page<'static>> = ks
        .iter()
        .map(|k| Page::new(k.clone(), content::page(k, 9, len)))
        .collect();
    let results = tier.put(&pages).await;
    check_len(&results, pages.len(), "put")?;
    let mut stored = Vec::new();
    for (key, r) in ks.iter().zip(results) {
        match r {
            Ok(()) => stored.push(key.clone()),
            Err(TierError::KeyRejected { .. }) => {}
            Err(e) => {
                return Err(format!(
                    "hostile key {key:?} failed with {e} (want Ok or KeyRejected)"
                ))
            }
        }
    }
    let rejected: Vec<PageKey> = ks.iter().filter(|k| !stored.contains(k)).cloned().collect();
    expect_pages(&tier, &versioned(&stored, 9, len), 64).await?;
    for key in &rejected {
        let (_, r) = read(&tier, &[(key.clone(), len)]).await?;
        if !matches!(r[0], Ok(Lookup::Miss) | Err(TierError::KeyRejected { .. })) {
            return Err(format!("rejected key {key:?} reads as {:?}", r[0]));
        }
    }
    let n = exists(&tier, &stored).await?;
    if n != stored.len() {
        return Err(format!(
            "exists over {} stored hostile keys gave {n}",
            stored.len()
        ));
    }
    if Path::new("/abs/kvtier-escape").exists() {
        return Err("key /abs/kvtier-escape created a file at that absolute path".into());
    }
    let after = listings(&watched);
    if before != after {
        return Err(format!(
            "hostile keys changed folders outside the tier root: {before:?} -> {after:?}"
        ));
    }
    if let Some(before) = outside {
        let after = f
            .names_outside()
            .await
            .ok_or("the factory stopped listing names")??;
        if after != before {
            return Err(format!(
                "hostile keys wrote names outside the tier's prefix: {:?}",
                after.difference(&before).collect::<Vec<_>>()
            ));
        }
    }
    for r in tier.remove(&stored).await {
        r.map_err(|e| format!("removing a hostile key failed: {e}"))?;
    }
    expect_misses(&tier, &stored, len).await
}

/// The root's parent and grandparent: where `..` keys would land.
fn watched_dirs(root: Option<PathBuf>) -> Vec<PathBuf> {
    let Some(root) = root else { return Vec::new() };
    root.ancestors()
        .skip(1)
        .take(2)
        .map(Path::to_path_buf)
        .collect()
}

fn listings(dirs: &[PathBuf]) -> Vec<BTreeSet<String>> {
    dirs.iter()
        .map(|d| {
            std::fs::read_dir(d)
                .map(|it| {
                    it.filter_map(|e| e.ok())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}

/// A bounded tier never holds more bytes than its capacity, counted independently by reading
/// every page written (and by its own stats where it keeps them); what it holds is exact.
pub async fn capacity_bound(f: &dyn TierFactory) -> CaseResult {
    const CAPACITY: u64 = 2 << 20;
    let Some(opened) = f.open_bounded(CAPACITY).await else {
        // A tier that claims a capacity must give the means to test it.
        let claimed = open(f).await?.info().capacity_bytes;
        if let Some(capacity) = claimed {
            return Err(format!(
                "the tier reports a capacity of {capacity} bytes, but its factory opens no bounded tier to test it"
            ));
        }
        not_applicable("the tier has no byte bound (its factory opens no bounded tier)");
        return Ok(());
    };
    let tier = opened.map_err(|e| format!("could not open a bounded tier: {e}"))?;
    if tier.info().capacity_bytes != Some(CAPACITY) {
        return Err(format!(
            "bounded tier reports capacity {:?}, want {CAPACITY}",
            tier.info().capacity_bytes
        ));
    }
    let len = page_len(&tier, 64 << 10);
    let ks = keys("cap", (3 * CAPACITY as usize) / len);
    let mut written = Vec::new();
    for chunk in ks.chunks(8) {
        let pages = versioned(chunk, 1, len);
        put_all(&tier, &pages, 8).await?;
        written.extend(pages);
        let want: Vec<(PageKey, usize)> = written.iter().map(|(k, _, l)| (k.clone(), *l)).collect();
        let (bufs, results) = read(&tier, &want).await?;
        let mut held = 0u64;
        for (((key, version, _), buf), r) in written.iter().zip(&bufs).zip(results) {
            match r {
                Ok(Lookup::Hit) => {
                    content::verify(key, *version, buf)?;
                    held += buf.len() as u64;
                }
                Ok(Lookup::Miss) => {}
                Err(e) => return Err(format!("get in a bounded tier failed: {e}")),
            }
        }
        if held > CAPACITY {
            return Err(format!(
                "tier holds {held} readable bytes, over its capacity of {CAPACITY}"
            ));
        }
        if let Some(resident) = tier.stats().resident_bytes.filter(|r| *r > CAPACITY) {
            return Err(format!(
                "tier reports {resident} resident bytes, over its capacity of {CAPACITY}"
            ));
        }
        if held == 0 {
            return Err("a bounded tier holds nothing after a put".into());
        }
    }
    Ok(())
}

/// A persistent tier's pages survive dropping and reopening it.
pub async fn persistence(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    if !tier.info().persistent {
        not_applicable("the tier is not persistent");
        return Ok(());
    }
    let len = page_len(&tier, 64 << 10);
    let pages = versioned(&keys("persist", 32), 4, len);
    put_all(&tier, &pages, 16).await?;
    drop(tier);
    let tier = open(f).await?;
    expect_pages(&tier, &pages, 16).await?;
    let keys: Vec<PageKey> = pages.iter().map(|(k, _, _)| k.clone()).collect();
    let n = exists(&tier, &keys).await?;
    if n != keys.len() {
        return Err(format!("after reopen exists gave {n} of {}", keys.len()));
    }
    Ok(())
}

/// Counters move by exactly what was done.
pub async fn stats_count(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 8 << 10);
    let ks = keys("stat", 4);
    let s0 = tier.stats();
    put_all(&tier, &versioned(&ks[..3], 1, len), 3).await?;
    let want = [
        (ks[0].clone(), len),
        (ks[1].clone(), len),
        (ks[3].clone(), len),
        (ks[2].clone(), len + 1),
    ];
    read(&tier, &want).await?;
    tier.remove(&ks[..1]).await;
    let s1 = tier.stats();
    let deltas = [
        ("puts", s1.puts - s0.puts, 3),
        (
            "bytes_written",
            s1.bytes_written - s0.bytes_written,
            3 * len as u64,
        ),
        ("hits", s1.hits - s0.hits, 2),
        ("bytes_read", s1.bytes_read - s0.bytes_read, 2 * len as u64),
        ("misses", s1.misses - s0.misses, 1),
        ("errors", s1.errors - s0.errors, 1),
        ("removes", s1.removes - s0.removes, 1),
    ];
    for (name, got, want) in deltas {
        if got != want {
            return Err(format!("stats.{name} moved by {got}, want {want}"));
        }
    }
    Ok(())
}

/// A hierarchy of an in-memory top tier over this tier behind a [`FaultyTier`].
type OverFaulty = (DynTier, Arc<ModelTier>, Arc<FaultyTier>, Arc<Hierarchy>);

fn over_faulty(tier: DynTier, faults: Faults) -> Result<OverFaulty, String> {
    let faulty = Arc::new(FaultyTier::new(Arc::clone(&tier), faults));
    let top = Arc::new(ModelTier::default());
    let levels: Vec<DynTier> = vec![top.clone(), faulty.clone()];
    let h = Hierarchy::new(
        "suite/faulty-lower",
        levels,
        HierarchyPolicy::default(),
        None,
    )
    .map_err(|e| format!("could not build the hierarchy: {e}"))?;
    Ok((tier, top, faulty, Arc::new(h)))
}

/// Reads `pages` through `tier`; every hit must hold the exact page. Returns (hits, misses,
/// errors).
async fn tally(tier: &DynTier, pages: &[(PageKey, u64, usize)]) -> Result<[usize; 3], String> {
    let mut counts = [0; 3];
    for chunk in pages.chunks(16) {
        let want: Vec<(PageKey, usize)> = chunk.iter().map(|(k, _, l)| (k.clone(), *l)).collect();
        let (bufs, results) = read(tier, &want).await?;
        for (((key, version, _), buf), result) in chunk.iter().zip(&bufs).zip(results) {
            match result {
                Ok(Lookup::Hit) => {
                    content::verify(key, *version, buf)
                        .map_err(|e| format!("a hit returned wrong bytes for {key}: {e}"))?;
                    counts[0] += 1;
                }
                Ok(Lookup::Miss) => counts[1] += 1,
                Err(_) => counts[2] += 1,
            }
        }
    }
    Ok(counts)
}

/// DRAM (a model tier) over this tier behind a fault injector (30% of calls fail, every other
/// hit torn: half garbage and an error): reads through the hierarchy are exact pages, misses
/// or errors, never wrong bytes; a torn page is never promoted; once faults stop, every page
/// this tier reports present is exact.
pub async fn hierarchy_over_faulty_tier(f: &dyn TierFactory) -> CaseResult {
    over_faulty_tier(f, None).await
}

/// The hierarchy the hierarchy cases call: kvtier's, or one with a flaw (self-tests).
fn calls_through(top: &Arc<ModelTier>, h: &Arc<Hierarchy>, flaw: Option<HierarchyFlaw>) -> DynTier {
    match flaw {
        None => h.clone(),
        Some(flaw) => Arc::new(FlawedHierarchy::new(Arc::clone(h), Arc::clone(top), flaw)),
    }
}

async fn over_faulty_tier(f: &dyn TierFactory, flaw: Option<HierarchyFlaw>) -> CaseResult {
    let faults = Faults {
        error_rate: 0.3,
        torn_reads: true,
        ..Faults::default()
    };
    let (tier, top, faulty, hierarchy) = over_faulty(open(f).await?, faults)?;
    let h = calls_through(&top, &hierarchy, flaw);
    let len = page_len(&tier, 16 << 10);
    let pages = versioned(&keys("hft", 96), 1, len);
    put_all(&h, &pages, 16).await?;
    settle(&hierarchy).await?;
    top.clear()
        .await
        .map_err(|e| format!("clearing the top tier failed: {e}"))?;
    let mut seen = [0; 3];
    for _ in 0..3 {
        let counts = tally(&h, &pages).await?;
        for (s, c) in seen.iter_mut().zip(counts) {
            *s += c;
        }
    }
    if faulty.injected() == 0 || seen[0] == 0 {
        return Err(format!(
            "the faults were not exercised (injected {}, hits {})",
            faulty.injected(),
            seen[0]
        ));
    }
    faulty.set_faults(Faults::default());
    // Promoted pages (top) and stored pages (this tier) are exact; nothing torn got promoted.
    tally(&h, &pages).await?;
    let mut present = Vec::new();
    for page in &pages {
        if exists(&tier, std::slice::from_ref(&page.0)).await? == 1 {
            present.push(page.clone());
        }
    }
    if present.is_empty() {
        return Err("no page reached the tier under a 30% fault rate".into());
    }
    expect_pages(&tier, &present, 16).await?;
    hierarchy
        .close()
        .await
        .map_err(|e| format!("closing the hierarchy failed: {e}"))
}

/// With this tier failing every call under a hierarchy, the top tier still serves what it holds
/// and takes new pages; when the tier recovers, pages written before the outage and after it
/// are read from it exactly.
pub async fn hierarchy_lower_outage(f: &dyn TierFactory) -> CaseResult {
    lower_outage(f, None).await
}

async fn lower_outage(f: &dyn TierFactory, flaw: Option<HierarchyFlaw>) -> CaseResult {
    let (tier, top, faulty, h) = over_faulty(open(f).await?, Faults::default())?;
    let dyn_h = calls_through(&top, &h, flaw);
    let len = page_len(&tier, 16 << 10);
    let before = versioned(&keys("out", 32), 1, len);
    let during = versioned(&keys("dur", 32), 1, len);
    let after = versioned(&keys("aft", 32), 1, len);
    put_all(&dyn_h, &before, 16).await?;
    settle(&h).await?;
    faulty.set_failing(true);
    expect_pages(&dyn_h, &before, 16).await?;
    put_all(&dyn_h, &during, 16)
        .await
        .map_err(|e| format!("with the lower tier down: {e}"))?;
    expect_pages(&dyn_h, &during, 16).await?;
    let all: Vec<PageKey> = before.iter().chain(&during).map(|p| p.0.clone()).collect();
    let run = exists(&dyn_h, &all).await?;
    if run != all.len() {
        return Err(format!(
            "exists gave {run} of {} pages the top tier holds",
            all.len()
        ));
    }
    settle(&h).await?;
    if h.hierarchy_stats().lower_errors == 0 {
        return Err("the outage was not counted as lower-tier errors".into());
    }
    faulty.set_failing(false);
    put_all(&dyn_h, &after, 16).await?;
    settle(&h).await?;
    top.clear()
        .await
        .map_err(|e| format!("clearing the top tier failed: {e}"))?;
    expect_pages(&dyn_h, &before, 16).await?;
    expect_pages(&dyn_h, &after, 16).await?;
    // Pages put during the outage never reached this tier: misses, never wrong bytes.
    tally(&dyn_h, &during).await?;
    h.close()
        .await
        .map_err(|e| format!("closing the hierarchy failed: {e}"))
}

/// Waits for a hierarchy's background copies to land.
async fn settle(h: &Hierarchy) -> CaseResult {
    h.flush()
        .await
        .map_err(|e| format!("the hierarchy's copies down did not land: {e}"))
}

/// Every call dropped at each of its await points in turn (see [`crate::cancel`]): after each
/// drop, later calls finish, each key holds what it held before or what the call leaves
/// (whole), and a new version put over it is what reads see. Run twice: the descriptors the
/// process holds must not grow over the second run (the first fills connection pools, which
/// dropped requests make open more connections than calls that finish).
pub async fn cancellation(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let len = page_len(&tier, 16 << 10);
    let may_lose = tier.info().capacity_bytes.is_some_and(|c| c < 64 << 20);
    let sweep = |prefix: &'static str| {
        let tier = Arc::clone(&tier);
        async move {
            let mut took = Vec::new();
            for (i, call) in crate::cancel::Call::ALL.into_iter().enumerate() {
                let prefix = format!("{prefix}{i}");
                let polls =
                    crate::cancel::each_await_point(&*tier, call, &prefix, len, may_lose).await?;
                took.push(format!("{call:?} {polls}"));
            }
            Ok::<_, String>(took)
        }
    };
    sweep("cw").await?;
    let before = open_fds()?;
    let took = sweep("cx").await?;
    fds_back_to(
        before,
        f.fd_slack(),
        "a second run of every call dropped at each await point",
    )
    .await?;
    eprintln!(
        "cancellation: polls each call took when not dropped (it was dropped after each smaller count): {}",
        took.join(", ")
    );
    Ok(())
}

/// Random concurrent histories with dropped calls (see [`crate::history`]) on the tier alone,
/// under a tiny top tier in write-through and in write-back (so pages are evicted, demoted and
/// promoted all the time), and over the tier with faults injected. Every answer is checked
/// against the orders the calls could have run in; the counts are printed.
pub async fn histories(f: &dyn TierFactory) -> CaseResult {
    let tier = open(f).await?;
    let info = tier.info();
    // A bound tier may evict what a history wrote; it must still never answer wrong bytes.
    let may_lose = info.capacity_bytes.is_some_and(|c| c < 64 << 20);
    let base = HistoryPlan {
        may_lose,
        ..HistoryPlan::default()
    };
    let dropped = crate::history::overwrite_after_drop(&*tier, 24, may_lose)
        .await
        .map_err(|e| format!("overwrite_after_drop: {e}"))?;
    eprintln!("histories/overwrite_after_drop: 24 rounds, {dropped} puts dropped");
    let mut total = HistoryCounts::default();
    let run = |name: &'static str, tier: DynTier, plan: HistoryPlan| async move {
        remove_history_keys(&tier, &plan).await;
        let counts = run_history(tier, plan)
            .await
            .map_err(|e| format!("{name}: {e}"))?;
        eprintln!("histories/{name}: {counts:?}");
        Ok::<_, String>(counts)
    };
    total += run("alone", Arc::clone(&tier), base).await?;
    // The last runs with a queue too small for one page: evicted pages are not carried down
    // (lost to the hierarchy, as if evicted from it) and what is below must never be served
    // in their place.
    for (name, write, queue, seed) in [
        ("write_through", WritePolicy::WriteThrough, 1 << 20, 1),
        ("write_back", WritePolicy::WriteBack, 1 << 20, 2),
        ("write_back_full_queue", WritePolicy::WriteBack, 1, 4),
    ] {
        let h = Arc::new(small_top_over(Arc::clone(&tier), write, queue)?);
        let plan = HistoryPlan {
            seed: base.seed + seed,
            may_lose: base.may_lose || queue == 1,
            ..base
        };
        total += run(name, h.clone(), plan).await?;
        h.close()
            .await
            .map_err(|e| format!("{name}: closing the hierarchy failed: {e}"))?;
    }
    let faults = Faults {
        error_rate: 0.2,
        torn_reads: true,
        ..Faults::default()
    };
    let (_, _, faulty, h) = over_faulty(Arc::clone(&tier), faults)?;
    let plan = HistoryPlan {
        seed: base.seed + 3,
        may_lose: true,
        ..base
    };
    total += run("faulty_below", h.clone(), plan).await?;
    if faulty.injected() == 0 {
        return Err("faulty_below: no fault was injected".into());
    }
    let _ = h.close().await;
    if total.cancelled == 0 || total.hits == 0 {
        return Err(format!(
            "the histories did not exercise the tier: {total:?}"
        ));
    }
    eprintln!("histories: {total:?}");
    Ok(())
}

/// A hierarchy whose top holds three 4 KiB pages, over `tier`, queueing `queue_bytes`.
fn small_top_over(
    tier: DynTier,
    write: WritePolicy,
    queue_bytes: u64,
) -> Result<Hierarchy, String> {
    let policy = HierarchyPolicy {
        write,
        queue_bytes: Some(queue_bytes),
        ..HierarchyPolicy::default()
    };
    let (top, demotions) = match write {
        WritePolicy::WriteBack => {
            let queue = DemotionQueue::new();
            let top = ModelTier::bounded(3 * 4096, Some(queue.listener(0)));
            (top, Some(queue))
        }
        WritePolicy::WriteThrough => (ModelTier::bounded(3 * 4096, None), None),
    };
    Hierarchy::new(
        "suite/small-top",
        vec![Arc::new(top), tier],
        policy,
        demotions,
    )
    .map_err(|e| format!("could not build the hierarchy: {e}"))
}

async fn remove_history_keys(tier: &DynTier, plan: &HistoryPlan) {
    let keys = crate::history::keys(plan);
    let _ = tier.remove(&keys).await;
}
