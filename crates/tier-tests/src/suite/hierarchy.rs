//! The tier below a hierarchy whose calls to it fail, or whose lower level goes away.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tier_core::{Lookup, PageKey, StorageTier};
use tier_hierarchy::{HealthPolicy, Hierarchy, HierarchyPolicy, TierState};

use super::{
    exists, expect_pages, keys, open, page_len, put_all, read, versioned, CaseResult, DynTier,
    TierFactory,
};
use crate::broken::{FlawedHierarchy, HierarchyFlaw};
use crate::content;
use crate::faulty::{Faults, FaultyTier};
use crate::model::ModelTier;

/// A hierarchy of an in-memory top tier over this tier behind a [`FaultyTier`].
type OverFaulty = (DynTier, Arc<ModelTier>, Arc<FaultyTier>, Arc<Hierarchy>);

pub(super) fn over_faulty(
    tier: DynTier,
    faults: Faults,
    health: HealthPolicy,
) -> Result<OverFaulty, String> {
    let faulty = Arc::new(FaultyTier::new(Arc::clone(&tier), faults));
    let top = Arc::new(ModelTier::default());
    let h = Hierarchy::builder("suite/faulty-lower")
        .policy(HierarchyPolicy {
            health,
            ..HierarchyPolicy::default()
        })
        .tier(top.clone())
        .tier(faulty.clone())
        .build()
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

/// A breaker that probes often, so a case sees a tier that recovers up again within a second.
pub(super) fn quick_probes() -> HealthPolicy {
    HealthPolicy {
        probe_backoff: Duration::from_millis(50),
        probe_backoff_max: Duration::from_millis(200),
        ..HealthPolicy::default()
    }
}

/// DRAM (a model tier) over this tier behind a fault injector (30% of calls fail, every other
/// hit torn: half garbage and an error): reads through the hierarchy are exact pages, misses
/// or errors, never wrong bytes; a torn page is never promoted; once faults stop, every page
/// this tier reports present is exact. (No breaker: every call reaches the faults.)
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

pub(super) async fn over_faulty_tier(
    f: &dyn TierFactory,
    flaw: Option<HierarchyFlaw>,
) -> CaseResult {
    let faults = Faults {
        error_rate: 0.3,
        torn_reads: true,
        ..Faults::default()
    };
    let no_breaker = HealthPolicy {
        trip_after: 0,
        ..HealthPolicy::default()
    };
    let (tier, top, faulty, hierarchy) = over_faulty(open(f).await?, faults, no_breaker)?;
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
/// and takes new pages, and the tier is marked down; when the tier recovers, a probe finds it
/// up and pages written before the outage and after it are read from it exactly.
pub async fn hierarchy_lower_outage(f: &dyn TierFactory) -> CaseResult {
    lower_outage(f, None).await
}

pub(super) async fn lower_outage(f: &dyn TierFactory, flaw: Option<HierarchyFlaw>) -> CaseResult {
    let (tier, top, faulty, h) = over_faulty(open(f).await?, Faults::default(), quick_probes())?;
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
    if h.health()[1].state != TierState::Down {
        return Err(format!(
            "a tier failing every call is not down: {:?}",
            h.health()[1]
        ));
    }
    faulty.set_failing(false);
    let recovering = Instant::now();
    while h.health()[1].state == TierState::Down {
        if recovering.elapsed() > Duration::from_secs(10) {
            return Err("the recovered tier was not found up within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
