//! The object tier against a real S3 server: the outage cases (unreachable endpoint, wrong
//! credentials, the server killed and restarted mid-run, `clear` confined to its prefix),
//! multipart uploads, and config errors.

use std::sync::Arc;
use std::time::Duration;

use object_store::{ObjectStore, ObjectStoreExt};
use tier_core::{Lookup, Page, PageKey, StorageTier, TierError};
use tier_object::{ObjectTier, ObjectTierConfig, S3Settings};
use tier_tests::content;
use tier_tests::s3::S3Server;
use tier_tests::s3_faults::{S3Target, S3TierFactory};
use tier_tests::suite::DynTier;

fn key(i: usize) -> PageKey {
    PageKey::new(format!("{i:064x}")).unwrap()
}

/// A client of `server` with its keys and default settings.
fn store_of(server: &S3Server) -> Arc<dyn ObjectStore> {
    S3Settings::endpoint(
        &server.endpoint(),
        &server.bucket,
        &server.access_key,
        &server.secret_key,
    )
    .build()
    .unwrap()
}

fn quick(settings: &mut S3Settings) {
    settings.request_timeout = Duration::from_millis(500);
    settings.max_retries = 1;
    settings.retry_timeout = Duration::from_secs(1);
}

fn tier(store: Arc<dyn ObjectStore>, prefix: &str, op_timeout: Duration) -> ObjectTier {
    let mut config = ObjectTierConfig::new(prefix);
    config.op_timeout = op_timeout;
    ObjectTier::open(store, config).unwrap()
}

async fn read(tier: &ObjectTier, i: usize, len: usize) -> (Result<Lookup, TierError>, Vec<u8>) {
    tier_tests::read_page(tier, key(i), len).await
}

/// Object tiers with short client timeouts and one retry, each call bounded by the target's.
struct Objects;

#[tier_core::async_trait]
impl S3TierFactory for Objects {
    async fn open(&self, t: &S3Target) -> Result<DynTier, TierError> {
        let mut settings =
            S3Settings::endpoint(&t.endpoint, &t.bucket, &t.access_key, &t.secret_key);
        quick(&mut settings);
        Ok(Arc::new(tier(settings.build()?, &t.prefix, t.bound)))
    }
}

tier_tests::s3_outage_suite!(Objects);

#[test]
fn half_given_credentials_are_a_config_error() {
    for (id, secret) in [("id", ""), ("", "secret")] {
        assert!(matches!(
            S3Settings::endpoint("http://127.0.0.1:9", "b", id, secret).build(),
            Err(TierError::Config { .. })
        ));
    }
}

#[test]
fn bad_prefixes_and_settings_are_config_errors() {
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    for bad in ["", "a/../b"] {
        assert!(
            matches!(ObjectTier::open(Arc::clone(&store), ObjectTierConfig::new(bad)), Err(TierError::Config { field, .. }) if field == "prefix")
        );
    }
    let mut config = ObjectTierConfig::new("p");
    config.concurrency = 0;
    assert!(
        matches!(ObjectTier::open(store, config), Err(TierError::Config { field, .. }) if field == "concurrency")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_over_the_threshold_go_up_in_parts() {
    let server = S3Server::shared();
    let store = store_of(&server);
    let mut config = ObjectTierConfig::new("parts");
    config.multipart_threshold = 8 << 20;
    let t = ObjectTier::open(Arc::clone(&store), config).unwrap();
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

/// Multipart uploads the server holds unfinished (s3s-fs keeps `.upload-<id>.json` per upload).
fn unfinished_uploads(server: &S3Server) -> usize {
    files_named(server, ".upload-")
}

/// Files of the server's data folder whose names start with `prefix`.
fn files_named(server: &S3Server, prefix: &str) -> usize {
    std::fs::read_dir(server.data_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .count()
}

/// A multipart put whose call times out (the server stalls mid-upload) leaves no unfinished
/// upload once the server answers again: it is aborted, not left holding its parts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_upload_cut_short_is_aborted() {
    let server = S3Server::start();
    let store = store_of(&server);
    let mut config = ObjectTierConfig::new("cut");
    config.multipart_threshold = 8 << 20;
    config.op_timeout = Duration::from_secs(1);
    let t = ObjectTier::open(store, config).unwrap();
    let page = Page::new(key(5), content::page(&key(5), 1, 64 << 20));
    let put = tokio::spawn(async move { t.put(std::slice::from_ref(&page)).await });
    // Frozen as soon as the upload's first part has landed (s3s-fs: `.upload_id-<id>.part-N`),
    // so the client holds the upload's id; the other parts take far longer to go up than this
    // waits. (An upload whose creation is answered after its call gave up has no id to abort
    // it by: object_store cannot list uploads, so that case is the bucket lifecycle rule's.)
    let started = std::time::Instant::now() + Duration::from_secs(30);
    while files_named(&server, ".upload_id-") == 0 && std::time::Instant::now() < started {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(unfinished_uploads(&server), 1, "the upload never started");
    server.freeze();
    let outcome = put.await.unwrap().pop().unwrap();
    assert!(
        outcome.is_err(),
        "the put outlived a frozen server: {outcome:?}"
    );
    server.thaw();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while unfinished_uploads(&server) > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        unfinished_uploads(&server),
        0,
        "the cut upload was never aborted"
    );
}

#[test]
fn a_secret_key_never_prints() {
    let s = S3Settings::endpoint("http://127.0.0.1:9", "b", "id", "hunter2-secret");
    let shown = format!("{s:?} {}", s.secret_key);
    assert!(
        !shown.contains("hunter2") && shown.contains("***"),
        "{shown}"
    );
    assert_eq!(s.secret_key.expose(), "hunter2-secret");
}

/// No key in the config: the environment's (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`) are
/// used, by object_store's provider chain and by `keys_from_env` (for NIXL OBJ); one key
/// without the other is a config error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_come_from_the_environment_when_the_config_gives_none() {
    let server = S3Server::shared();
    // No other test of this binary reads these variables.
    std::env::set_var("AWS_ACCESS_KEY_ID", &server.access_key);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", &server.secret_key);
    let settings = S3Settings::endpoint(&server.endpoint(), &server.bucket, "", "");
    let t = tier(settings.build().unwrap(), "env", Duration::from_secs(5));
    let page = Page::new(key(7), content::page(&key(7), 1, 4096));
    for r in t.put(std::slice::from_ref(&page)).await {
        r.unwrap();
    }
    let (r, buf) = read(&t, 7, 4096).await;
    assert_eq!(r.unwrap(), Lookup::Hit);
    content::verify(&key(7), 1, &buf).unwrap();
    let mut filled = settings.clone();
    filled.keys_from_env();
    assert_eq!(filled.access_key, server.access_key);
    assert_eq!(filled.secret_key.expose(), server.secret_key);
    let one = S3Settings::endpoint(&server.endpoint(), &server.bucket, "id-only", "");
    assert!(matches!(one.build(), Err(TierError::Config { .. })));
}
