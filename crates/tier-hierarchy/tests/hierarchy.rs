//! Hierarchies of DRAM tiers: the whole suite on write-through and write-back compositions,
//! pages surviving eviction from the top tier, and a failing lower tier not failing top hits.

use std::sync::Arc;
use std::time::Duration;

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier, TierError};
use tier_hierarchy::{HealthPolicy, Hierarchy, HierarchyPolicy, WritePolicy};
use tier_mem::{MemTier, MemTierConfig};
use tier_tests::content;
use tier_tests::faulty::{Faults, FaultyTier};
use tier_tests::suite::DynTier;
use tier_tests::TierFactory;

fn policy(write: WritePolicy) -> HierarchyPolicy {
    HierarchyPolicy {
        write,
        ..HierarchyPolicy::default()
    }
}

/// DRAM (`top` bytes) over DRAM (256 MiB), wired for `write`.
fn dram_over_dram(top: u64, write: WritePolicy) -> Result<Hierarchy, TierError> {
    let lower = MemTier::open(MemTierConfig {
        name: "lower".into(),
        ..MemTierConfig::new(256 << 20)
    })?;
    Hierarchy::builder("dram/dram")
        .policy(policy(write))
        .tier_with(move |on_evict| {
            let upper = MemTierConfig {
                name: "upper".into(),
                on_evict,
                ..MemTierConfig::new(top)
            };
            Ok(Arc::new(MemTier::open(upper)?) as DynTier)
        })
        .tier(Arc::new(lower))
        .build()
}

/// DRAM over DRAM with a 1 MiB top tier: the suite's cases write far more than that, so pages
/// are evicted, copied or demoted down, read from below and promoted.
struct HierarchyFactory(WritePolicy);

#[tier_core::async_trait]
impl TierFactory for HierarchyFactory {
    async fn open(&self) -> Result<DynTier, TierError> {
        Ok(Arc::new(dram_over_dram(1 << 20, self.0)?))
    }
}

mod write_through {
    tier_tests::conformance_suite!(super::HierarchyFactory(
        tier_hierarchy::WritePolicy::WriteThrough
    ));
}

mod write_back {
    tier_tests::conformance_suite!(super::HierarchyFactory(
        tier_hierarchy::WritePolicy::WriteBack
    ));
}

fn key(i: usize) -> PageKey {
    PageKey::new(format!("h{i:063x}")).unwrap()
}

async fn read_all(
    tier: &dyn StorageTier,
    n: usize,
    len: usize,
) -> Vec<(Result<Lookup, TierError>, Vec<u8>)> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(tier_tests::read_page(tier, key(i), len).await);
    }
    out
}

#[rstest::rstest]
#[case(WritePolicy::WriteThrough)]
#[case(WritePolicy::WriteBack)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_stays_readable_after_eviction_from_the_top(#[case] write: WritePolicy) {
    const LEN: usize = 64 << 10;
    const N: usize = 64; // 4 MiB through a 1 MiB top tier
    let h = dram_over_dram(1 << 20, write).unwrap();
    for chunk in (0..N).collect::<Vec<_>>().chunks(8) {
        let pages: Vec<Page<'static>> = chunk
            .iter()
            .map(|&i| Page::new(key(i), content::page(&key(i), 1, LEN)))
            .collect();
        for r in h.put(&pages).await {
            r.unwrap();
        }
    }
    h.flush().await.unwrap();
    let top = &h.tiers()[0];
    assert!(top.stats().evictions > 0, "the top tier must have evicted");
    for (i, (r, buf)) in read_all(&h, N, LEN).await.into_iter().enumerate() {
        assert_eq!(r.unwrap(), Lookup::Hit, "page {i} lost under {write:?}");
        content::verify(&key(i), 1, &buf).unwrap();
    }
    let s = h.hierarchy_stats();
    assert!(
        s.levels[1].served > 0,
        "some pages came from the lower tier"
    );
    assert!(s.promotions > 0, "lower hits were promoted");
    if write == WritePolicy::WriteBack {
        assert!(s.demotions > 0 && s.demotions_dropped == 0, "{s:?}");
    } else {
        assert_eq!(s.copied_down as usize, N);
    }
    assert_eq!(
        h.exists(&(0..N).map(key).collect::<Vec<_>>())
            .await
            .unwrap(),
        N
    );
    h.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_lower_tier_never_fails_what_the_top_serves() {
    let lower = Arc::new(FaultyTier::new(
        Arc::new(MemTier::open(MemTierConfig::new(64 << 20)).unwrap()),
        Faults::default(),
    ));
    lower.set_failing(true);
    // No breaker: every call reaches the failing tier (the breaker has cases of its own).
    let h = Hierarchy::builder("dram/faulty")
        .policy(HierarchyPolicy {
            health: HealthPolicy {
                trip_after: 0,
                ..HealthPolicy::default()
            },
            ..HierarchyPolicy::default()
        })
        .tier(Arc::new(
            MemTier::open(MemTierConfig::new(64 << 20)).unwrap(),
        ))
        .tier(lower.clone())
        .build()
        .unwrap();
    let pages: Vec<Page<'static>> = (0..16)
        .map(|i| Page::new(key(i), content::page(&key(i), 2, 4096)))
        .collect();
    for r in h.put(&pages).await {
        r.unwrap();
    }
    h.flush().await.unwrap();
    for (i, (r, buf)) in read_all(&h, 16, 4096).await.into_iter().enumerate() {
        assert_eq!(r.unwrap(), Lookup::Hit);
        content::verify(&key(i), 2, &buf).unwrap();
    }
    assert_eq!(
        h.exists(&(0..17).map(key).collect::<Vec<_>>())
            .await
            .unwrap(),
        16
    );
    // A key no tier holds: the lower tier's failure is the answer, typed.
    let mut buf = vec![0u8; 4096];
    let r = h
        .get(&mut [ReadSlot::new(key(99), &mut buf)])
        .await
        .pop()
        .unwrap();
    assert!(matches!(r, Err(TierError::Backend { .. })), "{r:?}");
    let s = h.hierarchy_stats();
    assert!(s.lower_errors >= 16, "lower failures are counted: {s:?}");
    assert!(lower.injected() > 0);
    h.close().await.unwrap();
}

/// A lower tier made slow by the fault-injecting tier (every call 150 ms, `slow_after` 50 ms):
/// the hierarchy marks it slow (not down), still asks it without a deadline (its pages are
/// hits, byte-exact), and a get with a 30 ms deadline, which the tier's estimate cannot meet,
/// skips it at once: the top's page a hit, the rest misses, counted as skipped; fast again,
/// it is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_lower_tier_is_marked_slow_and_skipped_by_calls_it_cannot_serve_in_time() {
    use std::time::Instant;
    use tier_hierarchy::TierState;

    let lower = Arc::new(FaultyTier::new(
        Arc::new(MemTier::open(MemTierConfig::new(64 << 20)).unwrap()),
        Faults::default(),
    ));
    let h = Hierarchy::builder("dram/slow")
        .policy(HierarchyPolicy {
            health: HealthPolicy {
                slow_after: Some(Duration::from_millis(50)),
                ..HealthPolicy::default()
            },
            ..HierarchyPolicy::default()
        })
        .tier(Arc::new(
            MemTier::open(MemTierConfig::new(64 << 10)).unwrap(),
        ))
        .tier(lower.clone())
        .build()
        .unwrap();
    // 64 pages of 4 KiB into 64 KiB of DRAM: the first ones live only below.
    let pages: Vec<Page<'static>> = (0..64)
        .map(|i| Page::new(key(i), content::page(&key(i), 5, 4096)))
        .collect();
    for r in h.put(&pages).await {
        r.unwrap();
    }
    h.flush().await.unwrap();
    lower.set_faults(Faults {
        latency: Duration::from_millis(150),
        ..Faults::default()
    });
    for i in 0..8 {
        let mut buf = vec![0u8; 4096];
        let r = h
            .get(&mut [ReadSlot::new(key(i), &mut buf)])
            .await
            .pop()
            .unwrap();
        assert_eq!(r.unwrap(), Lookup::Hit, "page {i} from the slow tier");
        content::verify(&key(i), 5, &buf).unwrap();
    }
    assert_eq!(h.health()[1].state, TierState::Slow, "{:?}", h.health()[1]);
    let (mut top, mut below) = (vec![0u8; 4096], vec![0u8; 4096]);
    let started = Instant::now();
    let results = h
        .get_by(
            &mut [
                ReadSlot::new(key(63), &mut top),
                ReadSlot::new(key(20), &mut below),
            ],
            started + Duration::from_millis(30),
        )
        .await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(30) + Duration::from_millis(100),
        "took {took:?}"
    );
    assert!(matches!(results[0], Ok(Lookup::Hit)), "{results:?}");
    assert!(matches!(results[1], Ok(Lookup::Miss)), "{results:?}");
    content::verify(&key(63), 5, &top).unwrap();
    assert!(h.health()[1].reads_skipped >= 1, "{:?}", h.health()[1]);
    lower.set_faults(Faults::default());
    for i in 8..48 {
        let mut buf = vec![0u8; 4096];
        h.get(&mut [ReadSlot::new(key(i), &mut buf)])
            .await
            .pop()
            .unwrap()
            .unwrap();
    }
    assert_eq!(h.health()[1].state, TierState::Up, "{:?}", h.health()[1]);
    h.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_settings_that_cannot_work_are_config_errors() {
    let zero = Duration::ZERO;
    let d = HealthPolicy::default();
    let cases = [
        (
            HealthPolicy {
                probe_backoff: zero,
                ..d.clone()
            },
            "health.probe_backoff",
        ),
        (
            HealthPolicy {
                probe_timeout: zero,
                ..d.clone()
            },
            "health.probe_timeout",
        ),
        (
            HealthPolicy {
                stall_after: zero,
                ..d.clone()
            },
            "health.stall_after",
        ),
        (
            HealthPolicy {
                slow_after: Some(zero),
                ..d.clone()
            },
            "health.slow_after",
        ),
        (
            HealthPolicy {
                probe_backoff_max: Duration::from_millis(1),
                ..d.clone()
            },
            "health.probe_backoff_max",
        ),
    ];
    for (health, field) in cases {
        let built = Hierarchy::builder("bad-health")
            .policy(HierarchyPolicy {
                health,
                ..HierarchyPolicy::default()
            })
            .tier(Arc::new(
                MemTier::open(MemTierConfig::new(1 << 20)).unwrap(),
            ))
            .build();
        match built {
            Err(TierError::Config { field: f, .. }) => assert_eq!(f, field),
            Err(e) => panic!("{field}: {e}"),
            Ok(_) => panic!("{field}: accepted"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_compositions_are_config_errors() {
    assert!(matches!(
        Hierarchy::builder("empty").build(),
        Err(TierError::Config { field, .. }) if field == "tiers"
    ));
    let one = || Arc::new(MemTier::open(MemTierConfig::new(1 << 20)).unwrap()) as DynTier;
    let never_admitting = HierarchyPolicy {
        admit_after: 0,
        ..HierarchyPolicy::default()
    };
    assert!(matches!(
        Hierarchy::builder("b").policy(never_admitting).tier(one()).build(),
        Err(TierError::Config { field, .. }) if field == "admit_after"
    ));
    let failing = Hierarchy::builder("c")
        .tier_with(|_| Err(TierError::config("capacity", "must be at least 1 byte")))
        .tier(one())
        .build();
    assert!(matches!(failing, Err(TierError::Config { field, .. }) if field == "capacity"));
}

/// DRAM with room for one 4 KiB page (LRU) over DRAM, wired for `write`.
fn one_page_over_dram(write: WritePolicy) -> Hierarchy {
    one_page_over(write, 1).0
}

/// As [`one_page_over_dram`], writing below only from a key's `admit_after`th request; also
/// returns the lower tier.
fn one_page_over(write: WritePolicy, admit_after: u32) -> (Hierarchy, DynTier) {
    let lower: DynTier = Arc::new(
        MemTier::open(MemTierConfig {
            name: "lower".into(),
            ..MemTierConfig::new(64 << 20)
        })
        .unwrap(),
    );
    let policy = HierarchyPolicy {
        admit_after,
        ..policy(write)
    };
    let h = Hierarchy::builder("one/dram")
        .policy(policy)
        .tier_with(|on_evict| {
            let upper = MemTierConfig {
                name: "one-page".into(),
                policy: Some(tier_mem::PolicyKind::Lru),
                on_evict,
                ..MemTierConfig::new(4096 + 512)
            };
            Ok(Arc::new(MemTier::open(upper)?) as DynTier)
        })
        .tier(Arc::clone(&lower))
        .build()
        .unwrap();
    (h, lower)
}

async fn put_one(h: &Hierarchy, k: &PageKey, version: u64) {
    let page = [Page::new(k.clone(), content::page(k, version, 4096))];
    for r in h.put(&page).await {
        r.unwrap();
    }
}

/// Write-back once served the older of two demoted versions: the newer one was on its way
/// down (not readable in flight) while the older one was already below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_back_serves_the_newest_version_while_demotions_land() {
    for trial in 0..200 {
        let h = one_page_over_dram(WritePolicy::WriteBack);
        let (k, other) = (key(1), key(2));
        put_one(&h, &k, 1).await;
        put_one(&h, &other, 1).await; // v1 demoted
        put_one(&h, &k, 2).await;
        put_one(&h, &other, 2).await; // v2 demoted
        for when in ["at once", "after flush"] {
            if when == "after flush" {
                h.flush().await.unwrap();
            }
            let (r, buf) = tier_tests::read_page(&h, k.clone(), 4096).await;
            assert_eq!(r.unwrap(), Lookup::Hit, "trial {trial}, {when}");
            content::verify(&k, 2, &buf)
                .unwrap_or_else(|e| panic!("trial {trial}, {when}: an older version: {e}"));
        }
        h.close().await.unwrap();
    }
}

/// A write-through put dropped while it waited for room in the queue once left its page in
/// flight for good: after `remove`, `get` still hit it, and `flush` never finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_dropped_while_waiting_leaves_nothing_behind() {
    let lower = Arc::new(FaultyTier::new(
        Arc::new(MemTier::open(MemTierConfig::new(64 << 20)).unwrap()),
        Faults {
            latency: std::time::Duration::from_millis(200),
            ..Faults::default()
        },
    ));
    let policy = HierarchyPolicy {
        queue_bytes: Some(4096),
        flush_timeout: std::time::Duration::from_secs(10),
        ..HierarchyPolicy::default()
    };
    let h = Hierarchy::builder("dram/slow")
        .policy(policy)
        .tier(Arc::new(
            MemTier::open(MemTierConfig::new(64 << 20)).unwrap(),
        ))
        .tier(lower)
        .build()
        .unwrap();
    // The first copy down takes 200 ms; the second fills the queue behind it.
    put_one(&h, &key(1), 1).await;
    put_one(&h, &key(3), 1).await;
    let k = key(2);
    let page = [Page::new(k.clone(), content::page(&k, 1, 4096))];
    let waited = tokio::time::timeout(std::time::Duration::from_millis(20), h.put(&page)).await;
    assert!(waited.is_err(), "the put should still wait for room");
    h.remove(std::slice::from_ref(&k)).await[0]
        .as_ref()
        .expect("remove");
    let (r, _) = tier_tests::read_page(&h, k.clone(), 4096).await;
    assert_eq!(r.unwrap(), Lookup::Miss, "a removed page came back");
    tokio::time::timeout(std::time::Duration::from_secs(5), h.flush())
        .await
        .expect("flush must finish")
        .unwrap();
    let (r, _) = tier_tests::read_page(&h, k, 4096).await;
    assert_eq!(r.unwrap(), Lookup::Miss);
    h.close().await.unwrap();
}

/// With `admit_after = 2` a page seen once never reaches the lower tier; seen twice it does:
/// in write-through at its next put, in write-back when it is evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_are_written_below_only_from_their_nth_request() {
    for write in [WritePolicy::WriteThrough, WritePolicy::WriteBack] {
        let (h, lower) = one_page_over(write, 2);
        let (once, twice) = (key(1), key(2));
        put_one(&h, &once, 1).await;
        put_one(&h, &twice, 1).await; // evicts `once` from the one-page top
        put_one(&h, &twice, 2).await; // the second request of `twice`
        put_one(&h, &once, 2).await; // the second of `once`: evicts `twice`
        h.flush().await.unwrap();
        let below = |k: &PageKey| {
            let (lower, k) = (Arc::clone(&lower), k.clone());
            async move { lower.exists(&[k]).await.unwrap() == 1 }
        };
        assert!(below(&twice).await, "{write:?}: twice-requested page below");
        match write {
            // The put that was `once`'s second request copied it down.
            WritePolicy::WriteThrough => assert!(below(&once).await, "{write:?}"),
            // `once` is in the top tier and has not been evicted since its second request.
            WritePolicy::WriteBack => assert!(!below(&once).await, "{write:?}"),
        }
        let stats = h.hierarchy_stats();
        assert!(stats.not_admitted >= 1, "{write:?}: {stats:?}");
        let (r, buf) = tier_tests::read_page(&h, twice.clone(), 4096).await;
        assert_eq!(r.unwrap(), Lookup::Hit, "{write:?}");
        content::verify(&twice, 2, &buf).unwrap();
        h.close().await.unwrap();
    }
}

/// Engines put a page once and read it again: in write-through with `admit_after = 2` the read
/// that admits the page copies it down (it used to stay in the top tier only, for good), and
/// a later put's version is the one that stays below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_that_admits_a_page_copies_it_down() {
    let (h, lower) = one_page_over(WritePolicy::WriteThrough, 2);
    let k = key(5);
    let below = |k: &PageKey| {
        let (lower, k) = (Arc::clone(&lower), k.clone());
        async move { tier_tests::read_page(&*lower, k, 4096).await }
    };
    put_one(&h, &k, 1).await;
    h.flush().await.unwrap();
    assert_eq!(
        below(&k).await.0.unwrap(),
        Lookup::Miss,
        "not admitted at its put"
    );
    let (r, _) = tier_tests::read_page(&h, k.clone(), 4096).await;
    assert_eq!(r.unwrap(), Lookup::Hit);
    h.flush().await.unwrap();
    let (r, buf) = below(&k).await;
    assert_eq!(r.unwrap(), Lookup::Hit, "the admitting read copied it down");
    content::verify(&k, 1, &buf).unwrap();
    put_one(&h, &k, 2).await;
    let (r, _) = tier_tests::read_page(&h, k.clone(), 4096).await;
    assert_eq!(r.unwrap(), Lookup::Hit);
    h.flush().await.unwrap();
    let (r, buf) = below(&k).await;
    assert_eq!(r.unwrap(), Lookup::Hit);
    content::verify(&k, 2, &buf).expect("the newest version below");
    assert_eq!(
        h.hierarchy_stats().copied_down,
        2,
        "one copy per admitted version"
    );
    h.close().await.unwrap();
}

/// Admission never makes a stale page readable: a page admitted below, then rewritten while
/// the sketch no longer admits it (a fresh hierarchy over the same lower tier), is served in
/// its newest version or not at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_not_admitted_leaves_no_stale_copy_below() {
    let (h, lower) = one_page_over(WritePolicy::WriteThrough, 2);
    let k = key(7);
    put_one(&h, &k, 1).await;
    put_one(&h, &k, 2).await; // admitted: v2 goes below
    h.flush().await.unwrap();
    assert_eq!(lower.exists(std::slice::from_ref(&k)).await.unwrap(), 1);
    h.close().await.unwrap();
    // A new hierarchy (fresh counts) over the same lower tier: v3 is its first request.
    let top: DynTier = Arc::new(
        MemTier::open(MemTierConfig {
            policy: Some(tier_mem::PolicyKind::Lru),
            ..MemTierConfig::new(4096 + 512)
        })
        .unwrap(),
    );
    let policy = HierarchyPolicy {
        admit_after: 2,
        ..policy(WritePolicy::WriteThrough)
    };
    let h = Hierarchy::builder("again")
        .policy(policy)
        .tier(top)
        .tier(Arc::clone(&lower))
        .build()
        .unwrap();
    put_one(&h, &k, 3).await;
    put_one(&h, &key(8), 1).await; // evicts v3 from the top
    h.flush().await.unwrap();
    let (r, buf) = tier_tests::read_page(&h, k.clone(), 4096).await;
    if r.unwrap() == Lookup::Hit {
        content::verify(&k, 3, &buf).expect("only the newest version may be served");
    }
    assert_eq!(
        lower.exists(std::slice::from_ref(&k)).await.unwrap(),
        0,
        "v2 removed below"
    );
    h.close().await.unwrap();
}

/// Write-back with a 1 MiB top tier (queue bound 256 KiB): a batch of 3 MiB, then a batch
/// read whose promotions evict in turn. Evictions beyond four times the queue bound were once
/// dropped, and their copies below removed: 15 of 48 acknowledged pages lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_back_loses_no_page_to_big_batches_or_promotions() {
    let h = dram_over_dram(1 << 20, WritePolicy::WriteBack).unwrap();
    let ks: Vec<PageKey> = (0..48).map(key).collect();
    let contents: Vec<Vec<u8>> = ks
        .iter()
        .map(|k| content::page(k, 5, 65536).to_vec())
        .collect();
    let pages: Vec<Page<'_>> = ks
        .iter()
        .zip(&contents)
        .map(|(k, c)| Page::lent(k.clone(), vec![&c[..1000], &c[1000..]]))
        .collect();
    for r in h.put(&pages).await {
        r.unwrap();
    }
    let mut bufs: Vec<Vec<u8>> = ks.iter().map(|_| vec![0u8; 65536]).collect();
    let mut slots: Vec<ReadSlot<'_>> = ks
        .iter()
        .zip(bufs.iter_mut())
        .map(|(k, b)| ReadSlot::new(k.clone(), b))
        .collect();
    for r in h.get(&mut slots).await {
        assert_eq!(r.unwrap(), Lookup::Hit);
    }
    drop(slots);
    for k in &ks {
        let (r, buf) = tier_tests::read_page(&h, k.clone(), 65536).await;
        assert_eq!(r.unwrap(), Lookup::Hit, "{k} lost");
        content::verify(k, 5, &buf).unwrap();
    }
    assert_eq!(h.hierarchy_stats().demotions_dropped, 0);
    h.close().await.unwrap();
}

/// The suite's cases reach below the 1 MiB top: it evicts, lower levels serve, pages are
/// promoted, and copied down (write-through) or demoted (write-back).
#[rstest::rstest]
#[case(WritePolicy::WriteThrough)]
#[case(WritePolicy::WriteBack)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_moves_pages_between_levels(#[case] write: WritePolicy) {
    let factory = tier_tests::movement::Recording::new(move || dram_over_dram(1 << 20, write));
    let m = factory
        .run(&["integrity_batches", "integrity_page_sizes", "overwrite"])
        .await
        .unwrap();
    eprintln!("{write:?}: {m:?}");
    assert!(m.top_evictions > 0, "{m:?}");
    assert!(m.served_below > 0, "{m:?}");
    assert!(m.promotions > 0, "{m:?}");
    match write {
        WritePolicy::WriteThrough => assert!(m.copied_down > 0, "{m:?}"),
        WritePolicy::WriteBack => assert!(m.demotions > 0, "{m:?}"),
    }
}

/// What a call made while the top tier is evicting a page does.
#[derive(Debug, Clone, Copy)]
enum DuringEviction {
    Read,
    Check,
    Remove,
}

/// moka takes an evicted page out of its map before it calls the listener, and this crate's
/// map once called it after releasing its lock: a read in between missed a page on its way
/// down (neither in the top, nor in motion, nor below), and a remove in between found nothing
/// and finished before the listener, which then carried the removed page down. The listener
/// here sleeps, so "in between" lasts 100 ms.
#[rstest::rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_being_evicted_is_neither_missed_nor_resurrected(
    #[values(tier_mem::PolicyKind::Lru, tier_mem::PolicyKind::Sieve)] engine: tier_mem::PolicyKind,
    #[values(DuringEviction::Read, DuringEviction::Check, DuringEviction::Remove)]
    call: DuringEviction,
) {
    let lower: DynTier = Arc::new(MemTier::open(MemTierConfig::new(64 << 20)).unwrap());
    let h = Hierarchy::builder("slow-evictions")
        .policy(policy(WritePolicy::WriteBack))
        .tier_with(move |on_evict| {
            let demote = on_evict.expect("write-back hands the top tier a hook");
            let upper = MemTierConfig {
                policy: Some(engine),
                on_evict: Some(Arc::new(move |page| {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    demote(page)
                })),
                ..MemTierConfig::new(4096 + 512)
            };
            Ok(Arc::new(MemTier::open(upper)?) as DynTier)
        })
        .tier(lower)
        .build()
        .unwrap();
    let h = Arc::new(h);
    let (k, other) = (key(1), key(2));
    put_one(&h, &k, 1).await;
    // Evicts `k`: the listener holds it for 100 ms on a worker thread.
    let evicting = tokio::spawn({
        let (h, other) = (Arc::clone(&h), other.clone());
        async move { put_one(&h, &other, 1).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    let removed = match call {
        DuringEviction::Read => {
            let (r, buf) = tier_tests::read_page(&*h, k.clone(), 4096).await;
            assert_eq!(
                r.unwrap(),
                Lookup::Hit,
                "{engine:?}: a page on its way down was missed"
            );
            content::verify(&k, 1, &buf).unwrap();
            false
        }
        DuringEviction::Check => {
            let n = h.exists(std::slice::from_ref(&k)).await.unwrap();
            assert_eq!(n, 1, "{engine:?}: exists missed a page on its way down");
            false
        }
        DuringEviction::Remove => {
            let r = h.remove(std::slice::from_ref(&k)).await.pop().unwrap();
            assert!(
                r.unwrap(),
                "{engine:?}: remove found nothing of a page being evicted"
            );
            true
        }
    };
    evicting.await.unwrap();
    h.flush().await.unwrap();
    let (r, buf) = tier_tests::read_page(&*h, k.clone(), 4096).await;
    if removed {
        assert_eq!(
            r.unwrap(),
            Lookup::Miss,
            "{engine:?}: the removed page came back"
        );
    } else {
        assert_eq!(r.unwrap(), Lookup::Hit, "{engine:?}: the page was lost");
        content::verify(&k, 1, &buf).unwrap();
    }
    h.close().await.unwrap();
}

/// A hierarchy dropped lets go of its tiers at once (a FILE tier's folder locks with them), not
/// once its background tasks have seen their abort: its tasks hold the tiers weakly between
/// their steps. (The probe at open and the background writer held them: a tier reopened right
/// after the drop found its folders still locked, the flaky `persistence` case.)
#[tokio::test]
async fn a_dropped_hierarchy_lets_go_of_its_tiers_at_once() {
    for write in [WritePolicy::WriteThrough, WritePolicy::WriteBack] {
        let lower = Arc::new(MemTier::open(MemTierConfig::new(1 << 20)).unwrap());
        let held = Arc::downgrade(&lower);
        let hierarchy = Hierarchy::builder("dropped")
            .policy(policy(write))
            .tier_with(|on_evict| {
                let top = MemTierConfig {
                    on_evict,
                    ..MemTierConfig::new(1 << 20)
                };
                Ok(Arc::new(MemTier::open(top)?) as DynTier)
            })
            .tier(lower)
            .build()
            .unwrap();
        // The tasks it spawned have not run yet (one thread, no await since).
        drop(hierarchy);
        assert!(
            held.upgrade().is_none(),
            "{write:?}: the lower tier outlived its dropped hierarchy"
        );
    }
}
