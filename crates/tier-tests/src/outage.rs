//! A hierarchy over an S3-backed tier whose server freezes (SIGSTOP), dies or is cut short by
//! a deadline: the cases of [`s3_outage_suite!`](crate::s3_outage_suite) that prove a dead
//! or slow store costs a request nothing once it is known down, that it comes back up, and
//! that nothing acknowledged or queued is lost meanwhile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier};
use tier_hierarchy::{HealthPolicy, Hierarchy, HierarchyPolicy, TierState, WritePolicy};

use crate::content;
use crate::factory::DynTier;
use crate::factory::{S3Target, S3TierFactory};
use crate::model::ModelTier;
use crate::s3::S3Server;

/// Page size of these cases.
const LEN: usize = 64 << 10;
/// A call that skips a down tier must answer within this (the figure is in the bench).
pub const FAST: Duration = Duration::from_millis(100);

fn key(i: usize) -> PageKey {
    PageKey::new(format!("{i:064x}")).expect("valid key")
}

fn pages(range: std::ops::Range<usize>) -> Vec<Page<'static>> {
    range
        .map(|i| Page::new(key(i), content::page(&key(i), 1, LEN)))
        .collect()
}

/// Quick probes so a case sees the tier come back within seconds.
fn health() -> HealthPolicy {
    HealthPolicy {
        probe_backoff: Duration::from_millis(200),
        probe_backoff_max: Duration::from_secs(1),
        probe_timeout: Duration::from_secs(1),
        ..HealthPolicy::default()
    }
}

async fn lower(f: &dyn S3TierFactory, server: &S3Server, prefix: &str) -> Result<DynTier, String> {
    let mut target = S3Target::of(server, prefix);
    target.bound = Duration::from_secs(5);
    f.open(&target)
        .await
        .map_err(|e| format!("could not open the tier: {e}"))
}

fn write_through(
    top_bytes: u64,
    lower: DynTier,
    health: HealthPolicy,
) -> Result<Hierarchy, String> {
    Hierarchy::builder("outage")
        .policy(HierarchyPolicy {
            write: WritePolicy::WriteThrough,
            health,
            ..HierarchyPolicy::default()
        })
        .tier(Arc::new(ModelTier::bounded(top_bytes, None)))
        .tier(lower)
        .build()
        .map_err(|e| e.to_string())
}

async fn get_one(
    h: &Hierarchy,
    i: usize,
) -> (Result<Lookup, tier_core::TierError>, Vec<u8>, Duration) {
    let started = Instant::now();
    let (r, buf) = crate::read_page(h, key(i), LEN).await;
    (r, buf, started.elapsed())
}

fn lower_state(h: &Hierarchy) -> TierState {
    h.health()[1].state
}

async fn wait_for(h: &Hierarchy, state: TierState, within: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    while lower_state(h) != state {
        if started.elapsed() > within {
            return Err(format!(
                "the lower tier is {:?}, not {state:?}, after {within:?}: {:?}",
                lower_state(h),
                h.health()[1]
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(started.elapsed())
}

/// 256 pages of 64 KiB through 4 MiB of DRAM over the tier, all written below; the first 64
/// then live only below.
async fn stocked(h: &Hierarchy) -> Result<(), String> {
    for batch in (0..256).step_by(32) {
        for (i, r) in h
            .put(&pages(batch..batch + 32))
            .await
            .into_iter()
            .enumerate()
        {
            r.map_err(|e| format!("put of page {} failed: {e}", batch + i))?;
        }
    }
    h.flush().await.map_err(|e| format!("flush failed: {e}"))
}

async fn expect_hits(h: &Hierarchy, range: std::ops::Range<usize>) -> Result<(), String> {
    for i in range {
        match get_one(h, i).await {
            (Ok(Lookup::Hit), buf, _) => content::verify(&key(i), 1, &buf)?,
            (other, _, _) => return Err(format!("page {i}: {other:?}, expected a hit")),
        }
    }
    Ok(())
}

/// What [`frozen_server`] measured.
#[derive(Debug)]
pub struct Frozen {
    /// Six gets of pages only the frozen tier held, in order.
    pub gets: Vec<Duration>,
    /// Puts made while the tier was down.
    pub puts: Vec<Duration>,
    /// From the server's thaw to the tier up again.
    pub back_up_in: Duration,
    /// The health metrics while the tier was down.
    pub metrics: Vec<String>,
}

/// The server frozen under DRAM over the tier: after the breaker trips (at most three slow
/// calls), gets of pages only below are misses within [`FAST`], puts stay fast, the metrics
/// say the tier is down; thawed, it is up within the probe's backoff and the pages written
/// before the outage are hits, byte-exact.
pub async fn frozen_server(f: &dyn S3TierFactory, breaker: bool) -> Result<Frozen, String> {
    let server = S3Server::start();
    let policy = HealthPolicy {
        trip_after: if breaker { 3 } else { 0 },
        ..health()
    };
    let h = write_through(4 << 20, lower(f, &server, "frozen").await?, policy)?;
    stocked(&h).await?;
    expect_hits(&h, 0..2).await?;
    server.freeze();
    let mut gets = Vec::new();
    for i in 2..8 {
        let (r, _, took) = get_one(&h, i).await;
        if matches!(r, Ok(Lookup::Hit)) {
            return Err(format!("page {i} was a hit from a frozen server"));
        }
        gets.push(took);
    }
    if !breaker {
        server.thaw();
        return Ok(Frozen {
            gets,
            puts: Vec::new(),
            back_up_in: Duration::ZERO,
            metrics: Vec::new(),
        });
    }
    let slow = gets.iter().filter(|t| **t > FAST).count();
    if slow > 3 || gets[3..].iter().any(|t| *t > FAST) {
        return Err(format!(
            "gets after the breaker should skip the tier: {gets:?}"
        ));
    }
    if lower_state(&h) != TierState::Down {
        return Err(format!("the tier is not down: {:?}", h.health()[1]));
    }
    let mut puts = Vec::new();
    for batch in (1000..1016).step_by(4) {
        let started = Instant::now();
        for r in h.put(&pages(batch..batch + 4)).await {
            r.map_err(|e| format!("a put while the tier was down failed: {e}"))?;
        }
        puts.push(started.elapsed());
    }
    if puts.iter().any(|t| *t > FAST) {
        return Err(format!("puts while the tier was down: {puts:?}"));
    }
    let metrics: Vec<String> = h.health_metrics();
    let down_line = metrics
        .iter()
        .find(|l| l.starts_with("kvtier_tier_up{") && !l.contains("tier=\"model\""));
    if !down_line.is_some_and(|l| l.ends_with(" 0")) {
        return Err(format!(
            "kvtier_tier_up does not say the tier is down: {metrics:?}"
        ));
    }
    server.thaw();
    let back_up_in = wait_for(&h, TierState::Up, Duration::from_secs(10)).await?;
    expect_hits(&h, 2..8).await?;
    expect_hits(&h, 1000..1016).await?;
    Ok(Frozen {
        gets,
        puts,
        back_up_in,
        metrics,
    })
}

/// The server killed: calls fail fast, the tier goes down; restarted, a probe finds it up
/// and what was written before is read back exact.
pub async fn killed_server(f: &dyn S3TierFactory) -> Result<Duration, String> {
    let mut server = S3Server::start();
    let h = write_through(4 << 20, lower(f, &server, "killed").await?, health())?;
    stocked(&h).await?;
    server.stop();
    for i in 0..6 {
        let (r, _, _) = get_one(&h, i).await;
        if matches!(r, Ok(Lookup::Hit)) {
            return Err(format!("page {i} was a hit from a dead server"));
        }
    }
    if lower_state(&h) != TierState::Down {
        return Err(format!("the tier is not down: {:?}", h.health()[1]));
    }
    let (_, _, skipped) = get_one(&h, 6).await;
    if skipped > FAST {
        return Err(format!("a get of a down tier took {skipped:?}"));
    }
    server.restart();
    wait_for(&h, TierState::Up, Duration::from_secs(10)).await?;
    expect_hits(&h, 0..64).await?;
    Ok(skipped)
}

/// A get with a deadline on a frozen (not yet known down) tier returns by the deadline with
/// what the top tier held, the rest as misses; an `exists` too.
pub async fn deadline_on_a_frozen_server(f: &dyn S3TierFactory) -> Result<Duration, String> {
    let server = S3Server::start();
    let h = write_through(4 << 20, lower(f, &server, "deadline").await?, health())?;
    stocked(&h).await?;
    server.freeze();
    let mut top = vec![0u8; LEN];
    let mut below = vec![0u8; LEN];
    let started = Instant::now();
    let deadline = started + Duration::from_millis(300);
    let results = {
        let mut slots = [
            ReadSlot::new(key(255), &mut top),
            ReadSlot::new(key(0), &mut below),
        ];
        h.get_by(&mut slots, deadline).await
    };
    let took = started.elapsed();
    server.thaw();
    if took > Duration::from_millis(300) + FAST {
        return Err(format!("a get with a 300 ms deadline took {took:?}"));
    }
    match (&results[0], &results[1]) {
        (Ok(Lookup::Hit), Ok(Lookup::Miss)) => content::verify(&key(255), 1, &top)?,
        other => return Err(format!("expected the top tier's hit and a miss: {other:?}")),
    }
    server.freeze();
    let started = Instant::now();
    let n = h
        .exists_by(&[key(0), key(1)], started + Duration::from_millis(300))
        .await
        .map_err(|e| format!("exists_by failed: {e}"))?;
    let exists_took = started.elapsed();
    server.thaw();
    if exists_took > Duration::from_millis(300) + FAST || n != 0 {
        return Err(format!("exists_by answered {n} in {exists_took:?}"));
    }
    Ok(took)
}

/// Write-back with the server frozen: evicted pages wait in the queue (served from it
/// meanwhile) and land once the tier is back; none is dropped while the queue has room.
pub async fn write_back_keeps_its_queue(f: &dyn S3TierFactory) -> Result<u64, String> {
    let server = S3Server::start();
    let below = lower(f, &server, "write-back").await?;
    write_back_through_frozen_storage(below, || server.freeze(), || server.thaw()).await
}

/// Write-back over `below` (under 1 MiB of DRAM) while its storage is frozen by `freeze` (a
/// server stopped, a FUSE daemon stopped): pages the top evicts wait in the queue, served
/// from it, while the tier is down; thawed by `thaw`, they land, none dropped, every page read
/// back exact. Returns the demotions made.
pub async fn write_back_through_frozen_storage(
    below: DynTier,
    freeze: impl FnOnce(),
    thaw: impl FnOnce(),
) -> Result<u64, String> {
    let h = Hierarchy::builder("outage")
        .policy(HierarchyPolicy {
            write: WritePolicy::WriteBack,
            queue_bytes: Some(8 << 20),
            health: health(),
            ..HierarchyPolicy::default()
        })
        .tier_with(|listener| Ok(Arc::new(ModelTier::bounded(1 << 20, listener)) as DynTier))
        .tier(below)
        .build()
        .map_err(|e| e.to_string())?;
    // The probe at open has answered by then: the tier is not known down when its storage
    // freezes, so the first demotions fail and must be carried again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    freeze();
    // 48 pages into 1 MiB: 32 are evicted into the queue while the tier does not answer.
    let mut frozen = Ok(());
    for batch in (0..48).step_by(8) {
        for r in h.put(&pages(batch..batch + 8)).await {
            if let Err(e) = r {
                frozen = Err(format!("put failed: {e}"));
            }
        }
    }
    let frozen = frozen
        .and(wait_for(&h, TierState::Down, Duration::from_secs(30)).await)
        .and(expect_hits(&h, 0..48).await);
    thaw();
    frozen?;
    wait_for(&h, TierState::Up, Duration::from_secs(30)).await?;
    h.flush().await.map_err(|e| format!("flush failed: {e}"))?;
    let stats = h.hierarchy_stats();
    if stats.demotions_dropped != 0 || stats.stale_below != 0 {
        return Err(format!(
            "pages were dropped from the queue: {} dropped, {} stale below",
            stats.demotions_dropped, stats.stale_below
        ));
    }
    expect_hits(&h, 0..48).await?;
    // The 32 pages evicted while the storage was frozen are below: read from it alone.
    let below = h.tiers().pop().ok_or("no tier below")?;
    let mut landed = 0;
    for page in pages(0..48) {
        let mut buf = vec![0u8; page.data.len()];
        let got = below
            .get(&mut [ReadSlot::new(page.key.clone(), &mut buf)])
            .await;
        if matches!(got[0], Ok(Lookup::Hit)) {
            landed += 1;
        }
    }
    if landed < 32 {
        return Err(format!(
            "{landed} of the 32 pages evicted while frozen are below"
        ));
    }
    Ok(stats.demotions)
}

/// What [`frozen_storage`] measured.
#[derive(Debug)]
pub struct FrozenStorage {
    /// A get with a 300 ms deadline while the tier was not yet known down.
    pub deadline_get: Duration,
    /// Gets of pages only the tier held, in order, after it.
    pub gets: Vec<Duration>,
    /// From the thaw to the tier up again.
    pub back_up_in: Duration,
}

/// `lower` under 4 MiB of DRAM, written through, its storage then frozen by `freeze` (a FUSE
/// daemon stopped, a server stopped): a get with a 300 ms deadline returns by it (+ [`FAST`])
/// with the top's page a hit; plain gets of pages only below take at most `bound` (the tier's
/// own) until the breaker trips, then [`FAST`]; thawed by `thaw`, the tier is up within
/// seconds and every page is read back exact.
pub async fn frozen_storage(
    lower: DynTier,
    bound: Duration,
    freeze: impl FnOnce(),
    thaw: impl FnOnce(),
) -> Result<FrozenStorage, String> {
    let h = write_through(4 << 20, lower, health())?;
    stocked(&h).await?;
    expect_hits(&h, 0..2).await?;
    freeze();
    let mut top = vec![0u8; LEN];
    let mut below = vec![0u8; LEN];
    let started = Instant::now();
    let results = {
        let mut slots = [
            ReadSlot::new(key(255), &mut top),
            ReadSlot::new(key(2), &mut below),
        ];
        h.get_by(&mut slots, started + Duration::from_millis(300))
            .await
    };
    let deadline_get = started.elapsed();
    let mut gets = Vec::new();
    let mut outcome = Ok(());
    if deadline_get > Duration::from_millis(300) + FAST {
        outcome = Err(format!(
            "a get with a 300 ms deadline took {deadline_get:?}"
        ));
    } else if !matches!(
        (&results[0], &results[1]),
        (Ok(Lookup::Hit), Ok(Lookup::Miss))
    ) {
        outcome = Err(format!(
            "expected the top tier's hit and a miss: {results:?}"
        ));
    } else {
        for i in 3..9 {
            let (r, _, took) = get_one(&h, i).await;
            if matches!(r, Ok(Lookup::Hit)) {
                outcome = Err(format!("page {i} was a hit from frozen storage"));
                break;
            }
            gets.push(took);
        }
        let slow = gets.iter().filter(|t| **t > FAST).count();
        if outcome.is_ok() && (slow > 3 || gets[3..].iter().any(|t| *t > FAST)) {
            outcome = Err(format!(
                "gets after the breaker should skip the tier: {gets:?}"
            ));
        } else if outcome.is_ok() && gets.iter().any(|t| *t > bound + FAST) {
            outcome = Err(format!(
                "a get outlasted the tier's bound {bound:?}: {gets:?}"
            ));
        } else if outcome.is_ok() && lower_state(&h) != TierState::Down {
            outcome = Err(format!("the tier is not down: {:?}", h.health()[1]));
        }
    }
    thaw();
    outcome?;
    content::verify(&key(255), 1, &top)?;
    let back_up_in = wait_for(&h, TierState::Up, Duration::from_secs(30)).await?;
    expect_hits(&h, 0..64).await?;
    Ok(FrozenStorage {
        deadline_get,
        gets,
        back_up_in,
    })
}
