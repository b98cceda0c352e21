//! An object tier with a capacity bounds the objects under its prefix: also those it finds
//! there when it opens, and never those of a prefix nested in its own.

use std::sync::Arc;

use futures::StreamExt;
use object_store::path::Path;
use object_store::ObjectStore;
use tier_core::{Page, PageKey, StorageTier};
use tier_object::{ObjectTier, ObjectTierConfig, PolicyKind};

fn pages(n: usize, len: usize) -> Vec<Page<'static>> {
    (0..n)
        .map(|i| {
            Page::new(
                PageKey::new(format!("page-{i}")).unwrap(),
                vec![i as u8; len],
            )
        })
        .collect()
}

async fn objects_under(store: &Arc<dyn ObjectStore>, prefix: &str) -> usize {
    store
        .list(Some(&Path::from(prefix)))
        .collect::<Vec<_>>()
        .await
        .len()
}

#[tokio::test]
async fn a_bounded_tier_evicts_what_it_found_at_open_and_leaves_nested_prefixes_alone() {
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    for prefix in ["models/a", "models/a/nested"] {
        let unbounded =
            ObjectTier::open(Arc::clone(&store), ObjectTierConfig::new(prefix)).unwrap();
        for r in unbounded.put(&pages(10, 1024)).await {
            r.unwrap();
        }
    }
    assert_eq!(objects_under(&store, "models/a").await, 20);
    let mut config = ObjectTierConfig::new("models/a");
    config.capacity_bytes = Some(4 * 1024);
    config.policy = PolicyKind::S3fifo;
    let bounded = ObjectTier::open(Arc::clone(&store), config).unwrap();
    assert_eq!(
        bounded.load_catalog().await.unwrap(),
        10,
        "its own ten objects"
    );
    assert_eq!(bounded.info().capacity_bytes, Some(4096));
    assert!(bounded.stats().resident_bytes.unwrap() <= 4096);
    assert_eq!(bounded.stats().evictions, 6);
    // Six of its own deleted; the nested prefix's ten untouched.
    assert_eq!(objects_under(&store, "models/a/nested").await, 10);
    assert_eq!(objects_under(&store, "models/a").await, 14);
    // New puts keep the bound.
    let more: Vec<Page<'static>> = (0..8)
        .map(|i| Page::new(PageKey::new(format!("more-{i}")).unwrap(), vec![7u8; 1024]))
        .collect();
    for r in bounded.put(&more).await {
        r.unwrap();
    }
    assert_eq!(objects_under(&store, "models/a").await - 10, 4);
    // A page larger than the whole bound is refused, not stored and evicted.
    assert_eq!(bounded.info().max_page_bytes, Some(4096));
    let big = Page::new(PageKey::new("big").unwrap(), vec![1u8; 8192]);
    assert!(bounded.put(&[big]).await[0].is_err());
}

#[tokio::test]
async fn capacity_zero_and_tinylfu_are_refused() {
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let mut config = ObjectTierConfig::new("p");
    config.capacity_bytes = Some(0);
    assert!(ObjectTier::open(Arc::clone(&store), config).is_err());
    let mut config = ObjectTierConfig::new("p");
    config.capacity_bytes = Some(1 << 20);
    config.policy = PolicyKind::Tinylfu;
    let err = ObjectTier::open(store, config).err().unwrap().to_string();
    assert!(err.contains("policy"), "{err}");
}
