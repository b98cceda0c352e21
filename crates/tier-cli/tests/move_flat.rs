//! `kvtier move-flat CONFIG`: a prefix an earlier kvtier filled in the flat layout (pages
//! directly under the prefix) is moved into its buckets on a real S3 server, so a tier opens
//! it; a page its bucket already holds (stored there later) stays. Before, such a prefix was
//! refused and had to be cleared by hand.

use std::process::Command;
use std::sync::Arc;

use futures::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier, TierError};
use tier_object::{ObjectTier, ObjectTierConfig, S3Settings};
use tier_tests::s3::S3Server;

fn key(i: usize) -> PageKey {
    PageKey::new(format!("{:064x}", i + 0xf1a7)).unwrap()
}

async fn put(store: &Arc<dyn ObjectStore>, i: usize, fill: u8) {
    let tier = ObjectTier::open(Arc::clone(store), ObjectTierConfig::new("kv")).unwrap();
    let page = Page::new(key(i), vec![fill; 4096]);
    tier.put(&[page]).await.pop().unwrap().unwrap();
}

async fn read(store: &Arc<dyn ObjectStore>, i: usize) -> Option<u8> {
    let tier = ObjectTier::open(Arc::clone(store), ObjectTierConfig::new("kv")).unwrap();
    let mut buf = vec![0u8; 4096];
    let got = tier.get(&mut [ReadSlot::new(key(i), &mut buf)]).await;
    matches!(got[0], Ok(Lookup::Hit)).then(|| buf[0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flat_prefix_is_moved_into_its_buckets_and_then_opens() {
    let server = S3Server::shared();
    let store = S3Settings::endpoint(
        &server.endpoint(),
        &server.bucket,
        &server.access_key,
        &server.secret_key,
    )
    .build()
    .unwrap();
    // Three pages stored, then moved up out of their buckets: the flat layout of before.
    for i in 0..3 {
        put(&store, i, i as u8 + 1).await;
    }
    let stored: Vec<Path> = store
        .list(Some(&Path::from("kv")))
        .map(|m| m.unwrap().location)
        .collect()
        .await;
    assert_eq!(stored.len(), 3);
    for from in &stored {
        let flat = Path::from("kv").join(from.filename().unwrap());
        store.copy(from, &flat).await.unwrap();
        store.delete(from).await.unwrap();
    }
    // Page 0 stored again by a later kvtier, in its bucket.
    put(&store, 0, 9).await;
    let mut capped = ObjectTierConfig::new("kv");
    capped.capacity_bytes = Some(1 << 20);
    let refused = ObjectTier::open(Arc::clone(&store), capped.clone())
        .unwrap()
        .load_catalog()
        .await;
    match refused {
        Err(TierError::Config { field, message }) => {
            assert_eq!(field, "prefix");
            assert!(message.contains("kvtier move-flat"), "{message}");
        }
        other => panic!("a flat prefix opened: {other:?}"),
    }

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kvtier.toml");
    std::fs::write(
        &config,
        format!(
            "[[tiers]]\nkind = \"object\"\nname = \"s3\"\nstore = \"s3\"\nprefix = \"kv\"\n\
             bucket = {:?}\nendpoint = {:?}\naccess_key = {:?}\nsecret_key = {:?}\n",
            server.bucket,
            server.endpoint(),
            server.access_key,
            server.secret_key
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .arg("move-flat")
        .arg(&config)
        .output()
        .expect("kvtier runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{stdout}");
    assert!(
        stdout.contains(
            "tier s3: prefix \"kv\": 2 page(s) moved into buckets, 1 flat page(s) removed"
        ),
        "{stdout}"
    );
    let opened = ObjectTier::open(Arc::clone(&store), capped).unwrap();
    assert_eq!(
        opened.load_catalog().await.unwrap(),
        3,
        "every page, in its bucket"
    );
    assert_eq!(read(&store, 0).await, Some(9), "the later page stays");
    assert_eq!(read(&store, 1).await, Some(2));
    assert_eq!(read(&store, 2).await, Some(3));
}
