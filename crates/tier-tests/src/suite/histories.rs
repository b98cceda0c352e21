//! Calls dropped at every await point, and random concurrent histories checked against a model.

use std::sync::Arc;

use tier_hierarchy::{Hierarchy, HierarchyPolicy, WritePolicy};

use super::{
    fds_back_to, open, open_fds, over_faulty, page_len, quick_probes, CaseResult, DynTier,
    TierFactory,
};
use crate::faulty::Faults;
use crate::history::{run_history, HistoryCounts, HistoryPlan};
use crate::model::ModelTier;

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
    let (_, _, faulty, h) = over_faulty(Arc::clone(&tier), faults, quick_probes())?;
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
    Hierarchy::builder("suite/small-top")
        .policy(policy)
        .tier_with(|on_evict| Ok(Arc::new(ModelTier::bounded(3 * 4096, on_evict)) as _))
        .tier(tier)
        .build()
        .map_err(|e| format!("could not build the hierarchy: {e}"))
}

async fn remove_history_keys(tier: &DynTier, plan: &HistoryPlan) {
    let keys = crate::history::keys(plan);
    let _ = tier.remove(&keys).await;
}
