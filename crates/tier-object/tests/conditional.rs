//! s3s-fs (the S3 server the tests run beside) honours the conditional requests a shared
//! prefix's lease relies on, one at a time: a create that must not overwrite
//! (`If-None-Match: *`), an update that must match (`If-Match`). (Two racing updates may both
//! land: the lease reads itself back, see `shared.rs`.)

use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use tier_object::S3Settings;
use tier_tests::s3::S3Server;

#[tokio::test]
async fn the_server_honours_conditional_creates_and_updates() {
    let server = S3Server::shared();
    let store: Arc<dyn ObjectStore> = S3Settings::endpoint(
        &server.endpoint(),
        &server.bucket,
        &server.access_key,
        &server.secret_key,
    )
    .build()
    .unwrap();
    let path = Path::from("probe/lease");
    let put = |mode: PutMode, body: &'static str| {
        let store = Arc::clone(&store);
        let path = path.clone();
        async move {
            store
                .put_opts(
                    &path,
                    PutPayload::from_static(body.as_bytes()),
                    PutOptions::from(mode),
                )
                .await
        }
    };
    let first = put(PutMode::Create, "a").await.expect("created");
    let again = put(PutMode::Create, "b").await;
    assert!(
        matches!(again, Err(object_store::Error::AlreadyExists { .. })),
        "a create over an object is refused: {again:?}"
    );
    let stale = put(
        PutMode::Update(UpdateVersion {
            e_tag: Some("\"nope\"".into()),
            version: None,
        }),
        "c",
    )
    .await;
    assert!(
        matches!(stale, Err(object_store::Error::Precondition { .. })),
        "an update with a stale tag is refused: {stale:?}"
    );
    let fresh = put(PutMode::Update(UpdateVersion::from(first)), "d").await;
    assert!(
        fresh.is_ok(),
        "an update with the current tag lands: {fresh:?}"
    );
    let body = store.get(&path).await.unwrap().bytes().await.unwrap();
    assert_eq!(&body[..], b"d");
}
