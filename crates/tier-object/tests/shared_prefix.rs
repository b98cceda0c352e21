//! A shared prefix's capacity is kept by one node at a time: a node finding the lease held by
//! another (a holder that died) leaves the prefix over its capacity until the lease expires,
//! then takes it over and evicts the oldest objects.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tier_core::{Page, PageKey, StorageTier};
use tier_object::{ObjectTier, ObjectTierConfig, PrefixAccess};

const PAGE: usize = 1024;

fn page(i: usize) -> Page<'static> {
    Page::new(
        PageKey::new(format!("page-{i:04}")).unwrap(),
        vec![i as u8; PAGE],
    )
}

async fn bytes_under(store: &Arc<dyn ObjectStore>, prefix: &str) -> u64 {
    store
        .list(Some(&Path::from(prefix)))
        .filter_map(|m| async move { m.ok() })
        .filter(|m| std::future::ready(!m.location.as_ref().contains("/.")))
        .map(|m| m.size)
        .fold(0, |a, b| async move { a + b })
        .await
}

#[tokio::test]
async fn a_dead_holders_lease_is_taken_over_once_it_expires() {
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let lease = format!("ghost:1:0 {}\n", now_ms + 400);
    store
        .put(
            &Path::from("kv/.kvtier-lease"),
            PutPayload::from(lease.into_bytes()),
        )
        .await
        .unwrap();

    let mut config = ObjectTierConfig::new("kv");
    config.access = PrefixAccess::Shared;
    config.capacity_bytes = Some(10 * PAGE as u64);
    config.shared.relist = Duration::from_millis(1);
    let tier = ObjectTier::open(Arc::clone(&store), config).unwrap();
    for i in 0..20 {
        assert!(tier.put(&[page(i)]).await[0].is_ok());
    }
    let stats = tier.prefix_stats().unwrap();
    assert_eq!(
        stats.evicted, 0,
        "the lease is another's: nothing evicted yet"
    );
    assert_eq!(bytes_under(&store, "kv").await, 20 * PAGE as u64);

    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(tier.put(&[page(20)]).await[0].is_ok());
    let stats = tier.prefix_stats().unwrap();
    assert_eq!(stats.takeovers, 1, "the expired lease was taken over");
    assert!(stats.evicted > 0);
    let left = bytes_under(&store, "kv").await;
    assert!(left <= 9 * PAGE as u64, "down to the low watermark: {left}");
    // The oldest went first: the newest page is still there.
    assert_eq!(tier.exists(&[page(20).key]).await.unwrap(), 1);
    assert_eq!(tier.exists(&[page(0).key]).await.unwrap(), 0);
}
