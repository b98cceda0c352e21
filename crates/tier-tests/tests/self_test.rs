//! The suite proves it can fail: the model tier passes every case, and each broken tier is
//! rejected by the case aimed at its fault.

use rstest::rstest;
use std::sync::Arc;

use tier_core::TierError;
use tier_tests::broken::{BrokenFactory, Fault, HierarchyFlaw, ModelFactory};
use tier_tests::faulty::{Faults, FaultyTier};
use tier_tests::model::ModelTier;
use tier_tests::suite::{self, DynTier};
use tier_tests::TierFactory;

tier_tests::conformance_suite!(ModelFactory::default());

#[rstest]
#[case::fd_leak(Fault::LeaksFd, "fd_leak", "fd leak")]
#[case::flipped_byte(Fault::FlipsByte, "integrity_batches", "1 bytes differ")]
#[case::phantom_hit(Fault::PhantomHit, "partial_batch", "gave Ok(Hit)")]
#[case::exists_not_prefix(Fault::CountsAllInExists, "exists_prefix", "want 3")]
#[case::lands_after_drop(Fault::LandsAfterDrop, "histories", "stale")]
#[case::stale_tail(Fault::KeepsStaleTail, "overwrite", "the stored page has")]
#[case::first_duplicate(Fault::KeepsFirstDuplicate, "overwrite", "bytes differ")]
#[case::empty_pages(Fault::AcceptsEmptyPages, "bad_input", "an empty page gave Ok")]
#[case::miscounts(Fault::MiscountsPuts, "stats_count", "stats.puts moved by 6, want 3")]
#[case::ignores_capacity(Fault::IgnoresCapacity, "capacity_bound", "over its capacity")]
#[case::forgets_on_reopen(Fault::ForgetsOnReopen, "persistence", "reads as a miss")]
#[case::ignores_remove(Fault::IgnoresRemove, "remove", "should be absent but reads as a hit")]
#[case::ignores_clear(Fault::IgnoresClear, "clear", "should be absent but reads as a hit")]
#[case::tears_large_pages(
    Fault::TearsLargePages,
    "integrity_page_sizes",
    "2097152 bytes): 4070 bytes differ"
)]
#[case::reverses_regions(
    Fault::ReversesRegions,
    "integrity_regions",
    "read into regions at other boundaries"
)]
#[case::serves_older_version(Fault::ServesOlderVersion, "concurrent_writers", "stale")]
#[case::writes_outside_root(Fault::WritesOutsideRoot, "hostile_keys", "outside the tier root")]
#[case::leaks_fd_on_failure(Fault::LeaksFdOnFailure, "fd_leak", "after breaking its storage")]
#[case::lands_after_drop_seen_by_cancellation(
    Fault::LandsAfterDrop,
    "cancellation",
    "after version 3 was put over it (the dropped call landed later)"
)]
#[case::leaks_fd_on_drop(
    Fault::LeaksFdOnDrop,
    "cancellation",
    "fd leak: a second run of every call dropped at each await point"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_rejects_broken_tier(#[case] fault: Fault, #[case] case: &str, #[case] says: &str) {
    if suite::counts_fds(case) && !tier_tests::fd::in_own_process() {
        return;
    }
    let failure = suite::run(case, &BrokenFactory::new(fault))
        .await
        .expect_err("the suite must reject a broken tier");
    assert_eq!(failure.case, case);
    assert!(
        failure.message.contains(says),
        "unexpected verdict: {failure}"
    );
    eprintln!("rejected as expected: {failure}");
}

/// The hierarchy cases check the hierarchy a tier sits under: each is shown to fail on a
/// hierarchy with the flaw it aims at, over the model tier. The other one fails too only
/// where the flaw explains it (`explained` in its message: the faulty-tier case has failing
/// copies down too, and catches a write failed by them when one fails).
#[rstest]
#[case::promotes_torn_reads(
    HierarchyFlaw::PromotesTornReads,
    "hierarchy_over_faulty_tier",
    "a hit returned wrong bytes",
    None
)]
#[case::fails_writes_in_outage(
    HierarchyFlaw::FailsWritesInOutage,
    "hierarchy_lower_outage",
    "with the lower tier down: put of",
    Some("the lower tier did not take the copy")
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hierarchy_cases_reject_a_flawed_hierarchy(
    #[case] flaw: HierarchyFlaw,
    #[case] case: &str,
    #[case] says: &str,
    #[case] explained: Option<&str>,
) {
    let failure = suite::run_flawed(case, &ModelFactory::default(), flaw)
        .await
        .expect_err("the case must reject a flawed hierarchy");
    assert_eq!(failure.case, case);
    assert!(
        failure.message.contains(says),
        "unexpected verdict: {failure}"
    );
    eprintln!("rejected as expected: {failure}");
    let other = ["hierarchy_over_faulty_tier", "hierarchy_lower_outage"]
        .into_iter()
        .find(|c| *c != case)
        .unwrap();
    if let Err(failure) = suite::run_flawed(other, &ModelFactory::default(), flaw).await {
        assert!(
            explained.is_some_and(|why| failure.message.contains(why)),
            "{flaw:?} unexpectedly failed {other}: {failure}"
        );
    }
}

#[rstest]
#[case(Fault::LeaksFd)]
#[case(Fault::FlipsByte)]
#[case(Fault::PhantomHit)]
#[case(Fault::CountsAllInExists)]
#[case(Fault::LandsAfterDrop)]
#[case(Fault::KeepsStaleTail)]
#[case(Fault::KeepsFirstDuplicate)]
#[case(Fault::AcceptsEmptyPages)]
#[case(Fault::MiscountsPuts)]
#[case(Fault::IgnoresCapacity)]
#[case(Fault::ForgetsOnReopen)]
#[case(Fault::IgnoresRemove)]
#[case(Fault::IgnoresClear)]
#[case(Fault::TearsLargePages)]
#[case(Fault::ReversesRegions)]
#[case(Fault::ServesOlderVersion)]
#[case(Fault::WritesOutsideRoot)]
#[case(Fault::LeaksFdOnFailure)]
#[case(Fault::LeaksFdOnDrop)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fault_fails_only_what_it_breaks(#[case] fault: Fault) {
    // The suite's fd-leak case counts the process's descriptors: under `cargo test` this runs
    // in a process of its own, away from tests opening runtimes and files meanwhile.
    if !tier_tests::fd::in_own_process() {
        return;
    }
    let verdicts = suite::run_all(&BrokenFactory::new(fault)).await;
    let failed: Vec<(&str, String)> = verdicts
        .iter()
        .filter_map(|(name, v)| v.as_ref().err().map(|f| (*name, f.to_string())))
        .collect();
    assert!(!failed.is_empty(), "{fault:?} passed every case");
    for (name, failure) in &failed {
        // A phantom hit also shows up wherever the suite expects a miss.
        let expected: &[&str] = match fault {
            Fault::LeaksFd => &["fd_leak", "cancellation"],
            // Any case reading 200 pages meets the flipped byte.
            Fault::FlipsByte => &[
                "integrity_batches",
                "concurrent_writers",
                "capacity_bound",
                "hierarchy_over_faulty_tier",
                "histories",
                "cancellation",
            ],
            // ... and as wrong bytes wherever a hierarchy reads through to the tier.
            Fault::PhantomHit => &[
                "fd_leak",
                "partial_batch",
                "remove",
                "clear",
                "hostile_keys",
                "hierarchy_over_faulty_tier",
                "hierarchy_lower_outage",
                "histories",
                "cancellation",
            ],
            Fault::CountsAllInExists => &["exists_prefix", "fd_leak", "histories"],
            Fault::LandsAfterDrop => &["histories", "cancellation"],
            // A shorter rewrite read back at its own length: a length mismatch.
            Fault::KeepsStaleTail => &["overwrite", "histories"],
            Fault::KeepsFirstDuplicate => &["overwrite"],
            // `overwrite` also puts a page followed by an empty copy of its key.
            Fault::AcceptsEmptyPages => &["overwrite", "bad_input", "fd_leak"],
            Fault::MiscountsPuts => &["stats_count"],
            Fault::IgnoresCapacity => &["capacity_bound"],
            Fault::ForgetsOnReopen => &["persistence"],
            // Cases that remove to clean up see the page stay too; its stats count no remove.
            Fault::IgnoresRemove => &["remove", "hostile_keys", "histories", "stats_count"],
            Fault::IgnoresClear => &["clear", "histories"],
            Fault::TearsLargePages => &["integrity_page_sizes"],
            Fault::ReversesRegions => &["integrity_regions"],
            // Every case that rewrites a key and reads it back.
            Fault::ServesOlderVersion => &[
                "concurrent_writers",
                "overwrite",
                "histories",
                "cancellation",
            ],
            Fault::WritesOutsideRoot => &["hostile_keys"],
            Fault::LeaksFdOnFailure => &["fd_leak"],
            Fault::LeaksFdOnDrop => &["cancellation"],
        };
        assert!(
            expected.contains(name),
            "{fault:?} unexpectedly failed {name}: {failure}"
        );
    }
}

#[tokio::test]
async fn unknown_case_is_a_failure_not_a_pass() {
    let failure = suite::run("no_such_case", &ModelFactory::default())
        .await
        .unwrap_err();
    assert!(failure.message.contains("no_such_case"));
}

/// The model behind a delay: calls overlap the way they do on a real tier (a slow lower tier
/// under the histories' hierarchies).
struct SlowModelFactory;

#[tier_core::async_trait]
impl TierFactory for SlowModelFactory {
    async fn open(&self) -> Result<DynTier, TierError> {
        let faults = Faults {
            latency: std::time::Duration::from_millis(2),
            ..Faults::default()
        };
        Ok(Arc::new(FaultyTier::new(
            Arc::new(ModelTier::default()),
            faults,
        )))
    }
}

#[test]
fn histories_over_a_slow_tier() {
    suite::run_case("histories", &SlowModelFactory);
}

/// `kill` returns before a thread running on another core has stopped; `freeze` returns only
/// once every thread has (a plain SIGSTOP left a busy shell running in about one round of seven).
#[test]
fn freeze_returns_once_the_process_is_stopped() {
    let mut busy = std::process::Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .expect("a busy shell");
    let pid = libc::pid_t::try_from(busy.id()).expect("a pid");
    std::thread::sleep(std::time::Duration::from_millis(100));
    let running_on = (0..200)
        .filter(|_| {
            tier_tests::freeze::freeze(pid);
            let stopped = tier_tests::freeze::all_stopped(pid);
            tier_tests::freeze::thaw(pid);
            std::thread::sleep(std::time::Duration::from_millis(2));
            !stopped
        })
        .count();
    let _ = busy.kill();
    let _ = busy.wait();
    assert_eq!(running_on, 0, "the process ran on after freeze() returned");
}
