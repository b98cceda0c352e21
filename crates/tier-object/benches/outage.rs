//! A dead store under DRAM, measured per call: 4 MiB of DRAM over the object tier on a real
//! S3 server (s3s-fs on loopback), 256 pages of 64 KiB stored, then gets of pages only the
//! store holds before, during and after an outage (the server frozen with SIGSTOP, as a
//! blackholed or overloaded store behaves), with the tier's `op_timeout` of 5 s. Each round
//! runs the hierarchy without a breaker (`trip_after = 0`, what every call paid before tier
//! health) and with the default one, interleaved; medians of the rounds are quoted.
//!
//! `cargo bench -p tier-object --bench outage` (rounds: `$KVTIER_BENCH_ROUNDS`, default 1;
//! a round without the breaker waits out 6 x 5 s).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier};
use tier_hierarchy::{HealthPolicy, Hierarchy, HierarchyPolicy, TierState};
use tier_mem::{MemTier, MemTierConfig};
use tier_object::{ObjectTier, ObjectTierConfig, S3Settings};
use tier_tests::s3::S3Server;

const LEN: usize = 64 << 10;
const CALLS: usize = 6;

fn key(i: usize) -> PageKey {
    PageKey::new(format!("{i:064x}")).expect("valid key")
}

/// Per-call latencies of one phase.
type Phase = Vec<Duration>;

async fn gets(h: &Hierarchy, from: usize) -> (Phase, usize) {
    let mut took = Vec::new();
    let mut hits = 0;
    for i in from..from + CALLS {
        let mut buf = vec![0u8; LEN];
        let started = Instant::now();
        let r = h.get(&mut [ReadSlot::new(key(i), &mut buf)]).await;
        took.push(started.elapsed());
        hits += usize::from(matches!(r.first(), Some(Ok(Lookup::Hit))));
    }
    (took, hits)
}

/// One round: before, during and after per-call latencies.
async fn round(server: &S3Server, prefix: &str, breaker: bool) -> [Phase; 3] {
    let settings = S3Settings::endpoint(
        &server.endpoint(),
        &server.bucket,
        &server.access_key,
        &server.secret_key,
    );
    let mut config = ObjectTierConfig::new(prefix);
    config.op_timeout = Duration::from_secs(5);
    let lower = ObjectTier::open(settings.build().expect("client"), config).expect("tier");
    let health = HealthPolicy {
        trip_after: if breaker { 3 } else { 0 },
        probe_backoff: Duration::from_millis(100),
        ..HealthPolicy::default()
    };
    let h = Hierarchy::builder("bench")
        .policy(HierarchyPolicy {
            health,
            ..HierarchyPolicy::default()
        })
        .tier(Arc::new(
            MemTier::open(MemTierConfig::new(4 << 20)).expect("DRAM"),
        ))
        .tier(Arc::new(lower))
        .build()
        .expect("hierarchy");
    for first in (0..256).step_by(32) {
        let pages: Vec<Page<'static>> = (first..first + 32)
            .map(|i| Page::new(key(i), vec![i as u8; LEN]))
            .collect();
        for r in h.put(&pages).await {
            r.expect("put");
        }
    }
    h.flush().await.expect("flush");
    // Pages 0..64 left DRAM long ago: each phase reads six of them from the store.
    let (before, _) = gets(&h, 0).await;
    server.freeze();
    let (during, during_hits) = gets(&h, 10).await;
    server.thaw();
    let thawed = Instant::now();
    while breaker && h.health()[1].state == TierState::Down {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let back_up = thawed.elapsed();
    let (after, after_hits) = gets(&h, 20).await;
    assert_eq!(during_hits, 0, "a frozen store served a page");
    assert_eq!(
        after_hits, CALLS,
        "pages written before the outage are hits after it"
    );
    if breaker {
        println!("  with the breaker: back up {back_up:.2?} after the thaw");
        for line in h.metrics_text().lines().filter(|l| {
            l.starts_with("kvtier_tier_up{")
                || l.starts_with("kvtier_tier_state_transitions_total{")
                || l.starts_with("kvtier_tier_skipped_")
        }) {
            println!("    {line}");
        }
    }
    h.close().await.expect("close");
    [before, during, after]
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn show(label: &str, rounds: &[[Phase; 3]]) {
    for (p, phase) in ["before", "during", "after"].iter().enumerate() {
        let per_call: Vec<String> = (0..CALLS)
            .map(|c| {
                let t = median(rounds.iter().map(|r| r[p][c]).collect());
                format!("{t:>9.2?}")
            })
            .collect();
        println!("{label:<18} {phase:<7} {}", per_call.join("  "));
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::var("KVTIER_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let server = S3Server::start();
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        println!("round {}", r + 1);
        without.push(round(&server, &format!("off{r}"), false).await);
        with.push(round(&server, &format!("on{r}"), true).await);
    }
    println!(
        "\nper-call latency of gets of pages only the store holds, op_timeout 5 s, median of {rounds} round(s):"
    );
    show("no breaker", &without);
    show("breaker (default)", &with);
}
