//! The NIXL OBJ tier on the real runtime and a real S3 server (s3s-fs on loopback): the outage
//! cases (unreachable server, wrong credentials, the server killed and restarted mid-run,
//! `clear` confined to its prefix), objects shared with the object_store tier, objects that are
//! not whole pages of their key, large pages, a dead server under DRAM, hostile keys and config.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStoreExt;
use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier, TierError};
use tier_nixl::{NixlObjConfig, NixlObjTier};
use tier_object::{ObjectTier, ObjectTierConfig, S3Settings};
use tier_tests::content;
use tier_tests::s3::S3Server;
use tier_tests::s3_faults::{S3Target, S3TierFactory};
use tier_tests::suite::DynTier;

use common::ObjFactory;

fn key(i: usize) -> PageKey {
    PageKey::new(format!("{i:064x}")).unwrap()
}

fn pages(range: std::ops::Range<usize>, len: usize) -> Vec<Page<'static>> {
    range
        .map(|i| Page::new(key(i), content::page(&key(i), 1, len)))
        .collect()
}

/// Short timeouts, one retry: outage tests finish quickly.
fn quick(config: &mut NixlObjConfig) {
    config.s3.request_timeout = Duration::from_millis(500);
    config.s3.max_retries = 1;
    config.s3.retry_timeout = Duration::from_secs(1);
    config.transfer_timeout = Duration::from_secs(5);
}

async fn read(
    tier: &dyn StorageTier,
    i: usize,
    len: usize,
) -> (Result<Lookup, TierError>, Vec<u8>) {
    tier_tests::read_page(tier, key(i), len).await
}

fn store_of(server: &S3Server) -> Arc<dyn object_store::ObjectStore> {
    S3Settings::endpoint(
        &server.endpoint(),
        &server.bucket,
        &server.access_key,
        &server.secret_key,
    )
    .build()
    .unwrap()
}

/// NIXL OBJ tiers with short client timeouts and one retry, each transfer bounded by the
/// target's bound.
struct NixlObj;

#[tier_core::async_trait]
impl S3TierFactory for NixlObj {
    async fn open(&self, t: &S3Target) -> Result<DynTier, TierError> {
        let s3 = S3Settings::endpoint(&t.endpoint, &t.bucket, &t.access_key, &t.secret_key);
        let mut config = NixlObjConfig::new(s3, &t.prefix);
        quick(&mut config);
        config.transfer_timeout = t.bound;
        Ok(Arc::new(NixlObjTier::open(config).await?))
    }
}

tier_tests::s3_outage_suite!(NixlObj);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_are_objects_shared_with_the_object_store_tier() {
    let f = ObjFactory::new();
    let nixl = NixlObjTier::open(f.config()).await.unwrap();
    let plain = ObjectTier::open(store_of(&f.server), ObjectTierConfig::new(&f.prefix)).unwrap();
    for r in nixl.put(&pages(0..16, 65536)).await {
        r.unwrap();
    }
    for r in plain.put(&pages(16..32, 65536)).await {
        r.unwrap();
    }
    // Each tier reads what the other wrote, byte for byte.
    for i in 0..32 {
        for tier in [&nixl as &dyn StorageTier, &plain] {
            let (r, buf) = read(tier, i, 65536).await;
            assert_eq!(r.unwrap(), Lookup::Hit, "page {i}");
            content::verify(&key(i), 1, &buf).unwrap();
        }
    }
    // The bytes NIXL wrote are the object, exactly: the page, then its trailer (no
    // aws-chunked framing); `ObjectTier` writes the same.
    for i in [3, 19] {
        let object = f
            .server
            .data_dir()
            .join(&f.server.bucket)
            .join(nixl.object_name(&key(i)).unwrap());
        let page = content::page(&key(i), 1, 65536).to_vec();
        let mut sealed = page.clone();
        sealed.extend_from_slice(&tier_format::seal(&key(i), [page.as_slice()]));
        assert!(std::fs::read(&object).unwrap() == sealed, "object {i}");
    }
    assert_eq!(nixl.exists(&[key(0), key(20), key(99)]).await.unwrap(), 2);
}

/// An object that is not a whole page of its key, whoever wrote it, is never a hit for either
/// client: a flipped byte, another key's object under this key's name, and (for `ObjectTier`,
/// which has no length to check first) a page of format 1 with no trailer are misses. Before
/// objects carried a trailer, all three were hits of wrong bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_that_are_not_whole_pages_of_their_key_are_never_hits() {
    const LEN: usize = 4096;
    let f = ObjFactory::new();
    let nixl = NixlObjTier::open(f.config()).await.unwrap();
    let store = store_of(&f.server);
    let plain = ObjectTier::open(Arc::clone(&store), ObjectTierConfig::new(&f.prefix)).unwrap();
    for r in plain.put(&pages(0..4, LEN)).await {
        r.unwrap();
    }
    let path = |i: usize| object_store::path::Path::from(nixl.object_name(&key(i)).unwrap());
    let stored = |i: usize| {
        let store = Arc::clone(&store);
        async move {
            let object = store.get(&path(i)).await.unwrap();
            object.bytes().await.unwrap().to_vec()
        }
    };
    // Page 0: one byte of the page flipped.
    let mut flipped = stored(0).await;
    flipped[LEN / 2] ^= 1;
    store.put(&path(0), flipped.into()).await.unwrap();
    // Page 1: page 2's object, whole, under page 1's name.
    let foreign = stored(2).await;
    store.put(&path(1), foreign.into()).await.unwrap();
    // Page 3: the page's bytes alone, as format 1 stored them.
    let unsealed = content::page(&key(3), 1, LEN).to_vec();
    store.put(&path(3), unsealed.into()).await.unwrap();
    for tier in [&plain as &dyn StorageTier, &nixl] {
        let kind = tier.info().kind;
        for i in [0, 1] {
            let (r, _) = read(tier, i, LEN).await;
            assert_eq!(r.unwrap(), Lookup::Miss, "{kind}: page {i}");
        }
        let (r, _) = read(tier, 3, LEN).await;
        assert!(!matches!(r, Ok(Lookup::Hit)), "{kind}: page 3: {r:?}");
        let (r, buf) = read(tier, 2, LEN).await;
        assert_eq!(r.unwrap(), Lookup::Hit, "{kind}: page 2");
        content::verify(&key(2), 1, &buf).unwrap();
    }
    assert_eq!(
        read(&plain, 3, LEN).await.0.unwrap(),
        Lookup::Miss,
        "object: a page of format 1 is a miss"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_pages_round_trip_through_both_s3_clients() {
    let f = ObjFactory::new();
    let len = 20 << 20;
    // Default client, then NIXL's CRT client (multipart) for objects from 8 MiB.
    for crt in [None, Some(8u64 << 20)] {
        let mut config = f.config();
        config.crt_min_bytes = crt;
        let tier = NixlObjTier::open(config).await.unwrap();
        let batch = vec![
            Page::new(key(1), content::page(&key(1), 7, len)),
            Page::new(key(2), content::page(&key(2), 7, 4096)),
        ];
        for r in tier.put(&batch).await {
            r.unwrap();
        }
        let mut big = vec![0u8; len];
        let mut small = vec![0u8; 4096];
        let got = tier
            .get(&mut [
                ReadSlot::new(key(1), &mut big),
                ReadSlot::new(key(2), &mut small),
            ])
            .await;
        assert!(
            got.iter().all(|r| matches!(r, Ok(Lookup::Hit))),
            "crt {crt:?}: {got:?}"
        );
        content::verify(&key(1), 7, &big).unwrap();
        content::verify(&key(2), 7, &small).unwrap();
        // A multipart upload's ETag ends in "-<parts>": the CRT client split the big page.
        let path = object_store::path::Path::from(tier.object_name(&key(1)).unwrap());
        let etag = store_of(&f.server)
            .head(&path)
            .await
            .unwrap()
            .e_tag
            .unwrap_or_default();
        println!("20 MiB page, CRT from {crt:?}: ETag {etag}");
        assert_eq!(etag.contains('-'), crt.is_some(), "{etag}");
        tier.clear().await.unwrap();
    }
}

#[tokio::test]
async fn bad_settings_are_config_errors() {
    let s3 = || S3Settings::endpoint("http://127.0.0.1:9", "kvtier", "k", "s");
    let cases: Vec<(&str, NixlObjConfig)> = vec![
        ("prefix", NixlObjConfig::new(s3(), "a/../b")),
        ("prefix", NixlObjConfig::new(s3(), "")),
        (
            "lanes",
            NixlObjConfig {
                lanes: 0,
                ..NixlObjConfig::new(s3(), "p")
            },
        ),
        (
            "endpoint",
            NixlObjConfig::new(S3Settings::endpoint("127.0.0.1:9", "b", "k", "s"), "p"),
        ),
        (
            "access_key",
            NixlObjConfig::new(S3Settings::endpoint("http://127.0.0.1:9", "b", "", ""), "p"),
        ),
        (
            "bucket",
            NixlObjConfig::new(
                S3Settings::endpoint("http://127.0.0.1:9", "", "k", "s"),
                "p",
            ),
        ),
    ];
    for (field, config) in cases {
        match NixlObjTier::open(config).await {
            Err(TierError::Config { field: f, .. }) => assert_eq!(f, field),
            Err(other) => panic!("{field}: {other}"),
            Ok(_) => panic!("{field}: opened"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_puts_dram_over_nixl_obj() {
    let f = ObjFactory::new();
    let s = &f.server;
    let toml = format!(
        "[[tiers]]\nkind = \"mem\"\ncapacity = \"1MiB\"\n\
         [[tiers]]\nkind = \"nixl-obj\"\nname = \"s3\"\nprefix = \"cfg\"\nbucket = {:?}\nendpoint = {:?}\naccess_key = {:?}\nsecret_key = {:?}\ntransfer_timeout = \"10s\"\n",
        s.bucket,
        s.endpoint(),
        s.access_key,
        s.secret_key
    );
    let registry = tier_builtin::registry();
    let config = tier_hierarchy::config::HierarchyConfig::from_toml(&toml).unwrap();
    let h = registry.build(&config).await.unwrap();
    // 64 pages of 64 KiB: four times the DRAM tier, so most are read back from S3.
    for chunk in pages(0..64, 65536).chunks(16) {
        for r in h.put(chunk).await {
            r.unwrap();
        }
    }
    h.flush().await.unwrap();
    for i in 0..64 {
        let (r, buf) = read(&h, i, 65536).await;
        assert_eq!(r.unwrap(), Lookup::Hit, "page {i}");
        content::verify(&key(i), 1, &buf).unwrap();
    }
    let prefix = s.data_dir().join(&s.bucket).join("cfg");
    let objects: usize = std::fs::read_dir(prefix)
        .unwrap()
        .map(|bucket| std::fs::read_dir(bucket.unwrap().path()).unwrap().count())
        .sum();
    assert_eq!(
        objects, 64,
        "every page is an object, in the prefix's buckets"
    );
    h.close().await.unwrap();

    for (params, field) in [
        (
            "prefix = \"a/../b\"\nbucket = \"b\"\naccess_key = \"k\"\nsecret_key = \"s\"\n",
            "prefix",
        ),
        (
            "prefix = \"p\"\nbucket = \"b\"\naccess_key = \"\"\nsecret_key = \"\"\n",
            "access_key",
        ),
        (
            "prefix = \"p\"\nbucket = \"b\"\naccess_key = \"k\"\n",
            "secret_key",
        ),
        (
            "prefix = \"p\"\nbucket = \"b\"\naccess_key = \"k\"\nsecret_key = \"s\"\nlanes = -1\n",
            "lanes",
        ),
    ] {
        let text = format!("[[tiers]]\nkind = \"nixl-obj\"\n{params}");
        let err = registry
            .plan(&tier_hierarchy::config::HierarchyConfig::from_toml(&text).unwrap())
            .err()
            .unwrap_or_else(|| panic!("{params} was accepted"))
            .to_string();
        assert!(
            err.contains(&format!("tiers[0].{field}")) || err.contains(field),
            "{field}: {err}"
        );
    }
}

/// DRAM over an object tier while the S3 server is down: the hierarchy keeps serving what DRAM
/// holds and takes new pages; calls that need the server fail with typed errors within the
/// bound; after the restart the object tier works again and nothing read is corrupt.
#[rstest::rstest]
#[case::nixl_obj("nixl-obj")]
#[case::object_store("object")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_under_a_hierarchy(#[case] kind: &str) {
    let mut f = ObjFactory::with_own_server();
    let mut config = f.config();
    quick(&mut config);
    let bound = config.transfer_timeout;
    let lower: Arc<dyn StorageTier> = if kind == "object" {
        let mut c = ObjectTierConfig::new(&f.prefix);
        c.op_timeout = bound;
        Arc::new(ObjectTier::open(config.s3.build().unwrap(), c).unwrap())
    } else {
        Arc::new(NixlObjTier::open(config).await.unwrap())
    };
    let dram: Arc<dyn StorageTier> =
        Arc::new(tier_mem::MemTier::open(tier_mem::MemTierConfig::new(8 << 20)).unwrap());
    let h = Arc::new(
        tier_hierarchy::Hierarchy::builder("dram/s3")
            .tier(dram)
            .tier(Arc::clone(&lower))
            .build()
            .unwrap(),
    );
    let held = pages(0..64, 65536);
    for chunk in held.chunks(16) {
        for r in h.put(chunk).await {
            r.unwrap();
        }
    }
    h.flush().await.unwrap();
    // In S3 only: written straight to the object tier.
    for r in lower.put(&pages(500..504, 65536)).await {
        r.unwrap();
    }

    f.server.stop();
    let mut longest = Duration::ZERO;
    let mut calls = 0;
    let mut timed = |started: Instant| {
        calls += 1;
        longest = longest.max(started.elapsed());
    };
    for i in 0..64 {
        let started = Instant::now();
        let (r, buf) = read(h.as_ref(), i, 65536).await;
        timed(started);
        assert_eq!(
            r.unwrap(),
            Lookup::Hit,
            "DRAM serves page {i} during the outage"
        );
        content::verify(&key(i), 1, &buf).unwrap();
    }
    let fresh = pages(100..116, 65536);
    let started = Instant::now();
    for r in h.put(&fresh).await {
        r.expect("the top tier takes pages during the outage");
    }
    timed(started);
    let started = Instant::now();
    let _ = h.flush().await;
    timed(started);
    assert!(
        h.hierarchy_stats().lower_errors > 0,
        "failed copies are counted"
    );
    let started = Instant::now();
    let (r, _) = read(h.as_ref(), 500, 65536).await;
    timed(started);
    // A typed error, or a miss once the failures marked the tier down (skipped at once).
    let down = h.health()[1].state == tier_hierarchy::TierState::Down;
    assert!(
        matches!(
            r,
            Err(TierError::Backend { .. } | TierError::Timeout { .. })
        ) || (down && matches!(r, Ok(Lookup::Miss))),
        "a page only S3 holds: {r:?}"
    );
    let started = Instant::now();
    let put = lower.put(&pages(600..604, 65536)).await;
    timed(started);
    assert!(
        put.iter().all(|r| matches!(
            r,
            Err(TierError::Backend { .. } | TierError::Timeout { .. })
        )),
        "{put:?}"
    );
    let started = Instant::now();
    assert!(lower.exists(&[key(0)]).await.is_err());
    timed(started);
    assert!(
        tier_tests::answered_within(longest, bound),
        "a call took {longest:?}, bound {bound:?}"
    );

    f.server.restart();
    for i in (0..64).chain(500..504) {
        let (r, buf) = read(lower.as_ref(), i, 65536).await;
        assert_eq!(r.unwrap(), Lookup::Hit, "page {i} after the restart");
        content::verify(&key(i), 1, &buf).unwrap();
    }
    for i in 100..116 {
        // Their copies down failed during the outage: absent below, never corrupt.
        let (r, buf) = read(lower.as_ref(), i, 65536).await;
        if r.unwrap() == Lookup::Hit {
            content::verify(&key(i), 1, &buf).unwrap();
        }
    }
    for r in lower.put(&pages(600..604, 65536)).await {
        r.unwrap();
    }
    h.close().await.unwrap();
    println!("{kind}: {calls} calls during the outage, longest {longest:?} (bound {bound:?}); DRAM served all 64 pages; after restart 68 pages exact");
}

/// Keys shaped like paths never leave the prefix: every object the two tiers write is one plain
/// name directly under it, and keys that cannot be a valid object name are rejected, typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_stay_single_objects_under_the_prefix() {
    let f = ObjFactory::new();
    let store = store_of(&f.server);
    let nixl = NixlObjTier::open(f.config()).await.unwrap();
    let plain = ObjectTier::open(Arc::clone(&store), ObjectTierConfig::new("plain/ns")).unwrap();
    let names = [
        "../../etc/passwd",
        "a/b",
        "..",
        "/abs",
        "a/../../b",
        "%2e%2e%2f",
        "x=2F",
        "tmp.partial",
    ];
    let long = "/..".repeat(66); // escapes past 200 bytes
    for tier in [&nixl as &dyn StorageTier, &plain] {
        let keys: Vec<PageKey> = names
            .iter()
            .copied()
            .chain([long.as_str()])
            .map(|n| PageKey::new(n).unwrap())
            .collect();
        let batch: Vec<Page<'static>> = keys
            .iter()
            .map(|k| Page::new(k.clone(), content::page(k, 4, 4096)))
            .collect();
        let results = tier.put(&batch).await;
        for (k, r) in keys.iter().zip(&results) {
            match r {
                Ok(()) => {
                    let mut buf = vec![0u8; 4096];
                    let got = tier.get(&mut [ReadSlot::new(k.clone(), &mut buf)]).await;
                    assert!(matches!(got[0], Ok(Lookup::Hit)), "{k}");
                    content::verify(k, 4, &buf).unwrap();
                }
                Err(TierError::KeyRejected { .. }) => assert_eq!(k.as_str(), long),
                Err(e) => panic!("{k}: {e}"),
            }
        }
    }
    let listed: Vec<object_store::ObjectMeta> =
        futures::TryStreamExt::try_collect(store.list(None))
            .await
            .unwrap();
    assert_eq!(listed.len(), 2 * names.len());
    for meta in listed {
        // Under the prefix's buckets: the prefix, then a bucket, then one name.
        let parts: Vec<_> = meta.location.parts().collect();
        let under = parts[..parts.len() - 2]
            .iter()
            .map(|p| p.as_ref())
            .collect::<Vec<_>>()
            .join("/");
        assert!(
            under == f.prefix || under == "plain/ns",
            "{} is outside the prefixes",
            meta.location
        );
    }
}

/// Every NIXL OBJ backend initialises the AWS SDK and shuts it down when it is destroyed; the
/// SDK counts those, so the last backend dropped shuts it down for the process. Tiers opened
/// and dropped while others move pages, as the suites do, must never see a shut-down SDK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_opened_and_dropped_while_others_move_pages() {
    let f = Arc::new(ObjFactory::new());
    let mut tasks = Vec::new();
    for task in 0..3usize {
        let f = Arc::clone(&f);
        tasks.push(tokio::spawn(async move {
            for round in 0..8usize {
                let mut config = f.config();
                config.lanes = 2;
                let tier = NixlObjTier::open(config).await.unwrap();
                let first = task * 1000 + round * 8;
                for r in tier.put(&pages(first..first + 8, 256 << 10)).await {
                    r.unwrap();
                }
                for i in first..first + 8 {
                    let (r, buf) = read(&tier, i, 256 << 10).await;
                    assert_eq!(r.unwrap(), Lookup::Hit, "page {i}");
                    content::verify(&key(i), 1, &buf).unwrap();
                }
                drop(tier);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// A get whose batch holds a page that times out (a 256 MiB object, 300 ms allowed) still
/// serves its other pages, whole: each has a transfer of its own that finished, and is copied
/// out of the batch's buffer (which the timed-out transfer keeps). Before, no page of such a
/// batch was copied out, yet the others answered hits: the caller's buffer as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_page_leaves_its_batch_mates_served_whole() {
    let f = ObjFactory::new();
    let big = 256 << 20;
    let plain = ObjectTier::open(store_of(&f.server), ObjectTierConfig::new(&f.prefix)).unwrap();
    for r in plain
        .put(&[Page::new(key(1), content::page(&key(1), 1, big))])
        .await
    {
        r.unwrap();
    }
    let mut config = f.config();
    config.transfer_timeout = Duration::from_millis(300);
    let tier = NixlObjTier::open(config).await.unwrap();
    for r in tier.put(&pages(2..3, 65536)).await {
        r.unwrap();
    }
    let mut large = vec![0u8; big];
    let mut small = vec![0u8; 65536];
    let got = tier
        .get(&mut [
            ReadSlot::new(key(1), &mut large),
            ReadSlot::new(key(2), &mut small),
        ])
        .await;
    assert!(
        matches!(got[0], Err(TierError::Timeout { .. })),
        "the 256 MiB page must time out in 300 ms for this test to show anything: {:?}",
        got[0]
    );
    assert_eq!(got[1].as_ref().unwrap(), &Lookup::Hit);
    content::verify(&key(2), 1, &small).unwrap();
}

/// During an outage (here a server that takes connections and never answers) each timed-out
/// put keeps its pages for good; past `max_abandoned_bytes` of them, puts are refused before
/// any transfer, with an error naming the bound, instead of keeping ever more memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_keeps_at_most_max_abandoned_bytes() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let mut config = NixlObjConfig::new(
        S3Settings::endpoint(&endpoint, "bucket", "key", "secret"),
        "outage",
    );
    quick(&mut config);
    config.transfer_timeout = Duration::from_millis(300);
    config.max_abandoned_bytes = 100_000;
    config.lanes = 1;
    let tier = NixlObjTier::open(config).await.unwrap();
    let mut refused = None;
    for round in 0..4 {
        let started = Instant::now();
        let results = tier.put(&pages(round..round + 1, 65536)).await;
        match &results[0] {
            Err(TierError::Timeout { .. }) => assert!(round < 2, "round {round} timed out"),
            Err(TierError::Backend { message, .. }) if message.contains("over the bound") => {
                refused.get_or_insert((round, started.elapsed(), message.clone()));
            }
            other => panic!("round {round}: {other:?}"),
        }
    }
    let (round, took, message) = refused.expect("puts past the bound are refused");
    println!("refused from round {round} in {took:?}: {message}");
    assert_eq!(round, 2, "two 64 KiB puts reach the 100,000-byte bound");
    assert!(message.contains("100000"), "{message}");
}
