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
    config.capacity_bytes = Some(1 << 20);
    config
}

#[tokio::test]
async fn pages_land_in_buckets_named_by_two_hex_digits() {
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let tier = ObjectTier::open(Arc::clone(&store), config(PrefixAccess::Private)).unwrap();
    let pages: Vec<_> = (0..64).map(page).collect();
    for r in tier.put(&pages).await {
        r.unwrap();
    }
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
    // Reopened, it finds them all.
    let reopened = ObjectTier::open(Arc::clone(&store), config(PrefixAccess::Private)).unwrap();
    assert_eq!(reopened.load_catalog().await.unwrap(), 64);
}

#[tokio::test]
async fn a_prefix_of_the_flat_layout_is_refused_naming_it() {
    for access in [PrefixAccess::Private, PrefixAccess::Shared] {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
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
            Err(TierError::Backend { message, .. }) => {
                assert!(message.contains("flat layout"), "{message}");
                assert!(message.contains(flat.as_ref()), "{message}");
            }
            other => panic!("{access:?}: a flat prefix was used: {other:?}"),
        }
    }
}
