//! DRAM-tier behaviour beyond the shared suite: eviction hand-off, policies, expiry, limits.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rstest::rstest;
use tier_core::{
    EvictedPage, EvictionCause, Lookup, Page, PageKey, ReadSlot, StorageTier, TierError,
};
use tier_mem::{MemTier, MemTierConfig, PolicyKind};

fn key(i: usize) -> PageKey {
    PageKey::new(format!("{i:064x}")).unwrap()
}

fn page(i: usize, len: usize) -> Page<'static> {
    Page::new(key(i), vec![(i % 251) as u8; len])
}

fn collector() -> (Arc<Mutex<Vec<EvictedPage>>>, tier_core::EvictionListener) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    (seen, Arc::new(move |p| sink.lock().unwrap().push(p)))
}

#[rstest]
#[case(PolicyKind::Tinylfu)]
#[case(PolicyKind::Lru)]
#[case(PolicyKind::Sieve)]
#[case(PolicyKind::S3fifo)]
#[case(PolicyKind::Arc)]
#[case(PolicyKind::Prefix)]
#[case(PolicyKind::Radix)]
#[case(PolicyKind::Lfu)]
#[case(PolicyKind::Auto)]
#[tokio::test]
async fn evicted_pages_reach_the_listener_with_their_bytes(#[case] policy: PolicyKind) {
    let (seen, listener) = collector();
    let tier = MemTier::open(MemTierConfig {
        policy: Some(policy),
        on_evict: Some(listener),
        ..MemTierConfig::new(1 << 20)
    })
    .unwrap();
    for i in 0..64 {
        for r in tier.put(&[page(i, 64 << 10)]).await {
            r.unwrap();
        }
    }
    assert!(tier.resident_bytes().await <= 1 << 20);
    let seen = seen.lock().unwrap();
    assert!(
        seen.len() >= 64 - 16,
        "only {} evictions reported",
        seen.len()
    );
    for evicted in seen.iter() {
        assert_eq!(evicted.cause, EvictionCause::Capacity);
        let i = usize::from_str_radix(evicted.key.as_str(), 16).unwrap();
        assert_eq!(
            evicted.data,
            page(i, 64 << 10).data.to_bytes(),
            "evicted bytes of {i}"
        );
    }
    assert_eq!(tier.stats().evictions, seen.len() as u64);
}

#[tokio::test]
async fn lru_keeps_the_recently_read_page() {
    let tier = MemTier::open(MemTierConfig {
        policy: Some(PolicyKind::Lru),
        ..MemTierConfig::new(4 * ((64 << 10) + 64))
    })
    .unwrap();
    for i in 0..4 {
        tier.put(&[page(i, 64 << 10)]).await;
    }
    let mut buf = vec![0u8; 64 << 10];
    let mut slot = [ReadSlot::new(key(0), &mut buf)];
    assert!(matches!(tier.get(&mut slot).await[0], Ok(Lookup::Hit)));
    tier.put(&[page(4, 64 << 10)]).await;
    assert_eq!(
        tier.exists(&[key(0)]).await.unwrap(),
        1,
        "recently read page kept"
    );
    assert_eq!(
        tier.exists(&[key(1)]).await.unwrap(),
        0,
        "least recently used page evicted"
    );
}

#[rstest]
#[case::lru(Some(PolicyKind::Lru))]
#[case::moka(None)]
#[tokio::test]
async fn a_touched_page_is_kept_as_a_read_one_is(#[case] policy: Option<PolicyKind>) {
    let tier = MemTier::open(MemTierConfig {
        policy,
        ..MemTierConfig::new(4 * ((64 << 10) + 64))
    })
    .unwrap();
    for i in 0..4 {
        tier.put(&[page(i, 64 << 10)]).await;
    }
    tier.touch(&[key(0), key(9)]).await.unwrap();
    for i in 4..8 {
        tier.put(&[page(i, 64 << 10)]).await;
        // Moka counts uses: a page kept must keep being used, as a read one must.
        tier.touch(&[key(0)]).await.unwrap();
    }
    assert_eq!(
        tier.exists(&[key(0)]).await.unwrap(),
        1,
        "touched page kept"
    );
    assert_eq!(
        tier.exists(&[key(9)]).await.unwrap(),
        0,
        "a touch stores nothing"
    );
}

#[tokio::test]
async fn removal_and_overwrite_are_not_evictions() {
    let (seen, listener) = collector();
    let tier = MemTier::open(MemTierConfig {
        on_evict: Some(listener),
        ..MemTierConfig::new(1 << 20)
    })
    .unwrap();
    tier.put(&[page(1, 1024)]).await;
    tier.put(&[page(1, 2048)]).await;
    tier.remove(&[key(1)]).await;
    tier.put(&[page(2, 1024)]).await;
    tier.clear().await.unwrap();
    assert!(seen.lock().unwrap().is_empty());
    assert_eq!(tier.stats().evictions, 0);
}

#[tokio::test]
async fn expired_pages_are_handed_down_as_expired() {
    let (seen, listener) = collector();
    let tier = MemTier::open(MemTierConfig {
        policy: Some(PolicyKind::Tinylfu),
        ttl: Some(Duration::from_millis(50)),
        on_evict: Some(listener),
        ..MemTierConfig::new(1 << 20)
    })
    .unwrap();
    tier.put(&[page(1, 4096)]).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(tier.exists(&[key(1)]).await.unwrap(), 0);
    tier.resident_bytes().await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].cause, EvictionCause::Expired);
}

#[tokio::test]
async fn idle_pages_expire_but_read_ones_stay() {
    let tier = MemTier::open(MemTierConfig {
        policy: Some(PolicyKind::Tinylfu),
        tti: Some(Duration::from_secs(2)),
        ..MemTierConfig::new(1 << 20)
    })
    .unwrap();
    tier.put(&[page(1, 4096), page(2, 4096)]).await;
    // Read every 100 ms for well over the idle time: a stall under 1.9 s cannot fail this.
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_millis(4500) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(tier.get_shared(&key(1)).await.is_some());
    }
    assert!(tier.get_shared(&key(1)).await.is_some());
    assert!(
        tier.get_shared(&key(2)).await.is_none(),
        "idle page expired"
    );
}

#[tokio::test]
async fn zero_capacity_is_a_config_error() {
    match MemTier::open(MemTierConfig::new(0)) {
        Err(TierError::Config { field, .. }) => assert_eq!(field, "capacity"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn a_page_larger_than_the_tier_is_refused_not_silently_dropped() {
    let tier = MemTier::open(MemTierConfig::new(64 << 10)).unwrap();
    let results = tier.put(&[page(1, 64 << 10), page(2, 1024)]).await;
    assert!(
        matches!(results[0], Err(TierError::PageTooLarge { .. })),
        "{results:?}"
    );
    assert!(results[1].is_ok());
}

#[tokio::test]
async fn shared_reads_do_not_copy() {
    let tier = MemTier::open(MemTierConfig::new(1 << 20)).unwrap();
    let p = page(1, 4096);
    tier.put(std::slice::from_ref(&p)).await;
    let shared = tier.get_shared(&key(1)).await.unwrap();
    assert_eq!(
        shared.as_ptr(),
        p.data.to_bytes().as_ptr(),
        "same allocation handed out"
    );
}

/// Expiry is moka's: asked of another policy, it is refused, naming the field.
#[tokio::test]
async fn expiry_under_a_policy_without_it_is_refused() {
    let err = MemTier::open(MemTierConfig {
        policy: Some(PolicyKind::S3fifo),
        tti: Some(Duration::from_secs(1)),
        ..MemTierConfig::new(1 << 20)
    })
    .err()
    .expect("s3fifo with tti must be refused");
    assert!(err.to_string().contains("tti"), "{err}");
    assert!(MemTier::open(MemTierConfig {
        policy: Some(PolicyKind::Lru),
        tti: Some(Duration::from_secs(1)),
        ..MemTierConfig::new(1 << 20)
    })
    .is_ok());
}
