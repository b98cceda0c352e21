//! The object tier against a real S3 server under faults: unreachable endpoint, wrong
//! credentials, the server killed and restarted mid-run, and `clear` confined to its prefix.

use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier, TierError};
use tier_object::{ObjectTier, ObjectTierConfig, S3Settings};
use tier_tests::content;
use tier_tests::s3::S3Server;

fn key(i: usize) -> PageKey {
    PageKey::new(format!("{i:064x}")).unwrap()
}

fn pages(range: std::ops::Range<usize>, len: usize) -> Vec<Page> {
    range
        .map(|i| Page::new(key(i), content::page(&key(i), 1, len)))
        .collect()
}

fn quick(settings: &mut S3Settings) {
    settings.request_timeout = Duration::from_millis(500);
    settings.max_retries = 1;
    settings.retry_timeout = Duration::from_secs(1);
}

fn tier(store: Arc<dyn ObjectStore>, prefix: &str, op_timeout: Duration) -> ObjectTier {
    let mut config = ObjectTierConfig::new(prefix);
    config.op_timeout = op_timeout;
    ObjectTier::new(store, config).unwrap()
}

async fn read(tier: &ObjectTier, i: usize, len: usize) -> (Result<Lookup, TierError>, Vec<u8>) {
    let mut buf = vec![0u8; len];
    let r = tier
        .get(&mut [ReadSlot::new(key(i), &mut buf)])
        .await
        .pop()
        .unwrap();
    (r, buf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_gives_typed_errors_within_the_bound() {
    // A port nobody listens on: take a free one and close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut settings =
        S3Settings::endpoint(&format!("http://127.0.0.1:{port}"), "kvtier", "k", "s");
    quick(&mut settings);
    let bound = Duration::from_secs(3);
    let t = tier(settings.build().unwrap(), "down", bound);
    let started = Instant::now();
    let put = t.put(&pages(0..2, 4096)).await;
    let (get, _) = read(&t, 0, 4096).await;
    let exists = t.exists(&[key(0)]).await;
    let removed = t.remove(&[key(0)]).await;
    let cleared = t.clear().await;
    let took = started.elapsed();
    assert!(
        put.iter().all(|r| matches!(
            r,
            Err(TierError::Backend { .. } | TierError::Timeout { .. })
        )),
        "{put:?}"
    );
    assert!(
        matches!(
            get,
            Err(TierError::Backend { .. } | TierError::Timeout { .. })
        ),
        "{get:?}"
    );
    assert!(exists.is_err() && removed[0].is_err() && cleared.is_err());
    assert!(took < 5 * bound, "five calls took {took:?}");
    println!(
        "unreachable server: 5 calls failed with typed errors in {took:?} (bound {bound:?} each)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_a_clear_auth_error() {
    let server = S3Server::start();
    let mut settings = S3Settings::endpoint(
        &server.endpoint(),
        &server.bucket,
        &server.access_key,
        "not-the-secret",
    );
    quick(&mut settings);
    let t = tier(settings.build().unwrap(), "auth", Duration::from_secs(5));
    let r = t.put(&pages(0..1, 4096)).await.pop().unwrap();
    match r {
        Err(TierError::Backend { message, .. }) => {
            let m = message.to_lowercase();
            assert!(
                m.contains("auth")
                    || m.contains("signature")
                    || m.contains("403")
                    || m.contains("denied"),
                "{message}"
            );
            println!("wrong secret: {message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        S3Settings::endpoint(&server.endpoint(), "b", "", "")
            .build()
            .is_err(),
        "missing credentials"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_serves_again_and_nothing_read_is_corrupt() {
    let mut server = S3Server::start();
    let mut settings = S3Settings::endpoint(
        &server.endpoint(),
        &server.bucket,
        &server.access_key,
        &server.secret_key,
    );
    quick(&mut settings);
    let t = tier(settings.build().unwrap(), "restart", Duration::from_secs(3));
    for r in t.put(&pages(0..32, 65536)).await {
        r.unwrap();
    }
    server.stop();
    let started = Instant::now();
    let during = t.put(&pages(32..40, 65536)).await;
    let (get_during, _) = read(&t, 0, 65536).await;
    let outage = started.elapsed();
    assert!(during.iter().all(|r| r.is_err()) && get_during.is_err());
    server.restart();
    for r in t.put(&pages(32..40, 65536)).await {
        r.unwrap();
    }
    for i in 0..40 {
        let (r, buf) = read(&t, i, 65536).await;
        assert_eq!(r.unwrap(), Lookup::Hit, "page {i}");
        content::verify(&key(i), 1, &buf).unwrap();
    }
    println!("outage: calls failed in {outage:?}; after restart 40 pages read back exact");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clear_removes_only_the_tiers_prefix() {
    let server = S3Server::start();
    let store = S3Settings::endpoint(
        &server.endpoint(),
        &server.bucket,
        &server.access_key,
        &server.secret_key,
    )
    .build()
    .unwrap();
    let outside = ["other/model/page", "mine-not/x", "mine2/y"];
    for name in outside {
        store
            .put(
                &object_store::path::Path::from(name),
                PutPayload::from_static(b"keep"),
            )
            .await
            .unwrap();
    }
    let t = tier(Arc::clone(&store), "mine", Duration::from_secs(10));
    for r in t.put(&pages(0..8, 4096)).await {
        r.unwrap();
    }
    t.clear().await.unwrap();
    assert_eq!(t.exists(&[key(0)]).await.unwrap(), 0);
    for name in outside {
        let kept = store
            .get(&object_store::path::Path::from(name))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(&kept[..], b"keep", "{name} must survive clear()");
    }
}

#[test]
fn bad_prefixes_and_settings_are_config_errors() {
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    for bad in ["", "a/../b"] {
        assert!(
            matches!(ObjectTier::new(Arc::clone(&store), ObjectTierConfig::new(bad)), Err(TierError::Config { field, .. }) if field == "prefix")
        );
    }
    let mut config = ObjectTierConfig::new("p");
    config.concurrency = 0;
    assert!(
        matches!(ObjectTier::new(store, config), Err(TierError::Config { field, .. }) if field == "concurrency")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_over_the_threshold_go_up_in_parts() {
    let server = S3Server::start();
    let store = S3Settings::endpoint(
        &server.endpoint(),
        &server.bucket,
        &server.access_key,
        &server.secret_key,
    )
    .build()
    .unwrap();
    let mut config = ObjectTierConfig::new("parts");
    config.multipart_threshold = 8 << 20;
    let t = ObjectTier::new(Arc::clone(&store), config).unwrap();
    let len = 20 << 20;
    let batch = vec![
        Page::new(key(1), content::page(&key(1), 3, len)),
        Page::new(key(2), content::page(&key(2), 3, 4096)),
    ];
    for r in t.put(&batch).await {
        r.unwrap();
    }
    let (r, buf) = read(&t, 1, len).await;
    assert_eq!(r.unwrap(), Lookup::Hit);
    content::verify(&key(1), 3, &buf).unwrap();
    // A multipart upload's ETag ends in "-<parts>"; a single PUT's does not.
    let etag = |i: usize| {
        let path = t.object_path(&key(i)).unwrap();
        let store = Arc::clone(&store);
        async move { store.head(&path).await.unwrap().e_tag.unwrap_or_default() }
    };
    let (big, small) = (etag(1).await, etag(2).await);
    println!("ETags: 20 MiB page {big}, 4 KiB page {small}");
    assert!(big.trim_matches('"').ends_with("-3"), "{big}");
    assert!(!small.contains('-'), "{small}");
}
