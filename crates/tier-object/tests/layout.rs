//! A prefix's pages are spread over buckets (`<prefix>/<bucket>/<name>`), so that it lists
//! bucket by bucket; a prefix holding pages of the earlier flat layout (directly under it) is
//! refused, naming it, never half-read.

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tier_core::{Page, PageKey, StorageTier, TierError};
use tier_object::{ObjectTier, ObjectTierConfig, PrefixAccess};

fn page(i: usize) -> Page<'static> {
    Page::new(
        PageKey::new(format!("{i:064x}")).unwrap(),
        vec![i as u8; 512],
    )
}

fn config(access: PrefixAccess) -> ObjectTierConfig {
    let mut config = ObjectTierConfig::new("kv");
    config.access = access;
    config.capacity_bytes = Some(8 << 20);
    config
}

/// Puts pages `0..n` through a private tier on `store`.
async fn put(store: &Arc<dyn ObjectStore>, n: usize) {
    let tier = ObjectTier::open(Arc::clone(store), config(PrefixAccess::Private)).unwrap();
    let pages: Vec<_> = (0..n).map(page).collect();
    for r in tier.put(&pages).await {
        r.unwrap();
    }
}

/// A prefix without all its buckets lists in one recursive listing; with them, bucket by
/// bucket (4,000 pages fill all 256).
#[tokio::test]
async fn pages_land_in_buckets_named_by_two_hex_digits_and_list_either_way() {
    for n in [64, 4000] {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        put(&store, n).await;
        let top = store
            .list_with_delimiter(Some(&Path::from("kv")))
            .await
            .unwrap();
        assert!(top.objects.is_empty(), "no page directly under the prefix");
        assert!(top.common_prefixes.len() > 1, "pages spread over buckets");
        for bucket in &top.common_prefixes {
            let name = bucket.filename().unwrap();
            assert!(
                name.len() == 2 && name.bytes().all(|b| b.is_ascii_hexdigit()),
                "{name}"
            );
        }
        // Another tier's objects in a nested prefix are not this one's.
        let nested =
            ObjectTier::open(Arc::clone(&store), ObjectTierConfig::new("kv/nested")).unwrap();
        for r in nested.put(&[page(0), page(1)]).await {
            r.unwrap();
        }
        let reopened = ObjectTier::open(Arc::clone(&store), config(PrefixAccess::Private)).unwrap();
        assert_eq!(reopened.load_catalog().await.unwrap(), n, "{n} pages");
    }
}

#[tokio::test]
async fn a_prefix_of_the_flat_layout_is_refused_naming_it() {
    for (access, others) in [
        (PrefixAccess::Private, 0),
        (PrefixAccess::Shared, 0),
        (PrefixAccess::Private, 4000),
        (PrefixAccess::Shared, 4000),
    ] {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        put(&store, others).await;
        let p = page(1);
        let sealed = tier_format::seal(&p.key, [&vec![1u8; 512][..]]);
        let mut bytes = vec![1u8; 512];
        bytes.extend_from_slice(&sealed);
        let flat = Path::from(format!("kv/{}", p.key.escaped_name('=')));
        store.put(&flat, PutPayload::from(bytes)).await.unwrap();
        let tier = ObjectTier::open(Arc::clone(&store), config(access)).unwrap();
        let refused = match access {
            // Its listing (in the background after an open) fails.
            PrefixAccess::Shared => tier.settle().await,
            _ => tier.load_catalog().await.map(|_| ()),
        };
        match refused {
            Err(TierError::Config { field, message }) if field == "prefix" => {
                assert!(message.contains("flat layout"), "{message}");
                assert!(message.contains(flat.as_ref()), "{message}");
            }
            other => panic!("{access:?}, {others} pages: a flat prefix was used: {other:?}"),
        }
    }
}
