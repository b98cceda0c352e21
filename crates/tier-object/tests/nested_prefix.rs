//! Tiers whose prefixes nest (`models` and `models/llama`) on one store: each `clear` removes
//! its own pages and nothing of the other's.

use std::sync::Arc;

use object_store::ObjectStore;
use tier_core::{Lookup, Page, PageKey, StorageTier};
use tier_object::{ObjectTier, ObjectTierConfig};

fn key(i: usize) -> PageKey {
    PageKey::new(format!("{i:064x}")).unwrap()
}

async fn check(store: Arc<dyn ObjectStore>) {
    let outer = ObjectTier::open(Arc::clone(&store), ObjectTierConfig::new("models")).unwrap();
    let inner = ObjectTier::open(store, ObjectTierConfig::new("models/llama")).unwrap();
    let pages: Vec<Page<'static>> = (0..4)
        .map(|i| Page::new(key(i), vec![i as u8; 1000]))
        .collect();
    for r in outer
        .put(&pages)
        .await
        .into_iter()
        .chain(inner.put(&pages).await)
    {
        r.unwrap();
    }
    outer.clear().await.unwrap();
    let keys: Vec<PageKey> = (0..4).map(key).collect();
    assert_eq!(
        outer.exists(&keys).await.unwrap(),
        0,
        "clear left its own pages"
    );
    assert_eq!(
        inner.exists(&keys).await.unwrap(),
        4,
        "clear of `models` removed pages of `models/llama`"
    );
    let (r, buf) = tier_tests::read_page(&inner, key(3), 1000).await;
    assert_eq!(r.unwrap(), Lookup::Hit);
    assert_eq!(buf, vec![3u8; 1000]);
    inner.clear().await.unwrap();
    assert_eq!(inner.exists(&keys).await.unwrap(), 0);
}

#[tokio::test]
async fn clear_spares_a_nested_prefix_in_memory() {
    check(Arc::new(object_store::memory::InMemory::new())).await;
}

#[tokio::test]
async fn clear_spares_a_nested_prefix_in_a_local_folder() {
    let tmp = tempfile::tempdir().unwrap();
    check(Arc::new(
        object_store::local::LocalFileSystem::new_with_prefix(tmp.path()).unwrap(),
    ))
    .await;
}
