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

/// The object `key`'s page is stored as under `prefix`.
fn object_path(prefix: &str, key: &PageKey) -> Path {
    let store = Arc::new(object_store::memory::InMemory::new());
    let tier = ObjectTier::open(store, ObjectTierConfig::new(prefix)).unwrap();
    tier.object_path(key).unwrap()
}

/// The page bytes the objects under `prefix` hold (each less its trailer), as a prefix's
/// capacity counts them.
async fn bytes_under(store: &Arc<dyn ObjectStore>, prefix: &str) -> u64 {
    store
        .list(Some(&Path::from(prefix)))
        .filter_map(|m| async move { m.ok() })
        .filter(|m| std::future::ready(!m.location.as_ref().contains("/.")))
        .map(|m| m.size - tier_format::TRAILER)
        .fold(0, |a, b| async move { a + b })
        .await
}

/// A lease of `holder` expiring `ms` from now, written as another node would.
async fn plant_lease(store: &Arc<dyn ObjectStore>, holder: &str, ms: u64) {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    store
        .put(
            &Path::from("kv/.kvtier-lease"),
            PutPayload::from(format!("{holder} {}\n", now_ms + ms).into_bytes()),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_dead_holders_lease_is_taken_over_once_it_expires() {
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    plant_lease(&store, "ghost:1:0", 400).await;

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

/// A live lease of a node whose host name and pid are this node's (containers sharing a host
/// name, each with its entrypoint at pid 1) is another's: nothing is evicted under it. (With
/// holders named `host:pid:n`, this process's first node took it as its own.)
#[tokio::test]
async fn a_live_lease_of_another_node_with_this_hosts_name_and_pid_is_not_taken() {
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let twin = format!("{}:{}:0", host.trim(), std::process::id());
    plant_lease(&store, &twin, 60_000).await;
    let tier = ObjectTier::open(Arc::clone(&store), shared("kv", 10)).unwrap();
    for i in 0..20 {
        assert!(tier.put(&[page(i)]).await[0].is_ok());
    }
    let stats = tier.prefix_stats().unwrap();
    assert_eq!(
        (stats.evicted, stats.eviction_runs),
        (0, 0),
        "a live lease of {twin} was taken: {stats:?}"
    );
    assert_eq!(bytes_under(&store, "kv").await, 20 * PAGE as u64);
}

/// A lease written by a node whose clock runs an hour ahead, left as it is for a whole lease
/// (its ETag unchanged), is taken over: eviction waits a lease, not the skew.
#[tokio::test]
async fn a_lease_from_a_clock_far_ahead_is_taken_over_once_it_stays_unchanged_a_lease() {
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    plant_lease(&store, "ahead:1:0", 3_600_000).await;
    let mut config = shared("kv", 10);
    config.shared.lease = Duration::from_millis(300);
    let tier = ObjectTier::open(Arc::clone(&store), config).unwrap();
    for i in 0..20 {
        assert!(tier.put(&[page(i)]).await[0].is_ok());
    }
    assert_eq!(
        tier.prefix_stats().unwrap().evicted,
        0,
        "held when first seen"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(tier.put(&[page(20)]).await[0].is_ok());
    tier.flush().await.unwrap();
    let stats = tier.prefix_stats().unwrap();
    assert_eq!(stats.takeovers, 1, "{stats:?}");
    assert!(bytes_under(&store, "kv").await <= 10 * PAGE as u64);
}

fn shared(prefix: &str, pages: u64) -> ObjectTierConfig {
    let mut config = ObjectTierConfig::new(prefix);
    config.access = PrefixAccess::Shared;
    config.capacity_bytes = Some(pages * PAGE as u64);
    config.shared.relist = Duration::from_nanos(1);
    config
}

#[tokio::test]
async fn a_page_read_here_outlives_later_writes_and_each_prefix_keeps_its_own_bound() {
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let a = ObjectTier::open(Arc::clone(&store), shared("models/a", 10)).unwrap();
    let b = ObjectTier::open(Arc::clone(&store), shared("models/b", 5)).unwrap();
    let nested =
        ObjectTier::open(Arc::clone(&store), ObjectTierConfig::new("models/a/nested")).unwrap();
    for i in 0..5 {
        assert!(nested.put(&[page(i)]).await[0].is_ok());
    }
    assert!(a.put(&[page(0)]).await[0].is_ok());
    tokio::time::sleep(Duration::from_millis(5)).await;
    for i in 1..10 {
        assert!(a.put(&[page(i)]).await[0].is_ok());
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Page 0, written first, is read here: it is used more recently than pages 1 to 9.
    let mut buf = vec![0u8; PAGE];
    let mut slots = [tier_core::ReadSlot::new(page(0).key, &mut buf)];
    assert!(matches!(
        a.get(&mut slots).await[0],
        Ok(tier_core::Lookup::Hit)
    ));
    for i in 10..15 {
        assert!(a.put(&[page(i)]).await[0].is_ok());
    }
    assert_eq!(
        a.exists(&[page(0).key]).await.unwrap(),
        1,
        "read here: kept"
    );
    assert_eq!(
        a.exists(&[page(1).key]).await.unwrap(),
        0,
        "the oldest write: evicted"
    );
    for i in 0..12 {
        assert!(b.put(&[page(i)]).await[0].is_ok());
    }
    let (in_a, in_b) = (
        bytes_under(&store, "models/a").await,
        bytes_under(&store, "models/b").await,
    );
    let in_nested = bytes_under(&store, "models/a/nested").await;
    // (`bytes_under` of models/a counts the nested prefix too.)
    assert!(
        in_a - in_nested <= 10 * PAGE as u64,
        "models/a holds {} bytes",
        in_a - in_nested
    );
    assert!(in_b <= 5 * PAGE as u64, "models/b holds {in_b} bytes");
    assert_eq!(
        in_nested,
        5 * PAGE as u64,
        "a nested prefix is not the shared prefix's"
    );
}

#[tokio::test]
async fn a_page_stored_again_after_the_listing_is_not_deleted_on_its_strength() {
    let store = Arc::new(Scripted {
        restored: Some(object_path("kv", &page(0).key)),
        ..Scripted::default()
    });
    let tier =
        ObjectTier::open(Arc::clone(&store) as Arc<dyn ObjectStore>, shared("kv", 10)).unwrap();
    for i in 0..10 {
        assert!(tier.put(&[page(i)]).await[0].is_ok());
    }
    // Over the capacity: the listing names page 0 the oldest; another node stores it again
    // before its HEAD (the in-memory store's ETag tells).
    assert!(tier.put(&[page(10)]).await[0].is_ok());
    let stats = tier.prefix_stats().unwrap();
    assert!(
        stats.spared >= 1,
        "the re-stored page was spared: {stats:?}"
    );
    assert_eq!(
        tier.exists(&[page(0).key]).await.unwrap(),
        1,
        "the page stored again stays"
    );
    assert_eq!(
        tier.exists(&[page(1).key]).await.unwrap(),
        0,
        "the next oldest went instead"
    );
}

/// A shared prefix of 10 pages on `store`, 11 pages put and flushed: one eviction's worth over.
async fn over_by_one(store: Scripted) -> (Arc<Scripted>, ObjectTier) {
    let store = Arc::new(store);
    let tier =
        ObjectTier::open(Arc::clone(&store) as Arc<dyn ObjectStore>, shared("kv", 10)).unwrap();
    for i in 0..11 {
        assert!(tier.put(&[page(i)]).await[0].is_ok());
    }
    tier.flush().await.unwrap();
    (store, tier)
}

#[tokio::test]
async fn an_evictor_whose_lease_another_node_wrote_over_deletes_nothing() {
    let (_store, tier) = over_by_one(Scripted {
        usurp: true,
        ..Scripted::default()
    })
    .await;
    let stats = tier.prefix_stats().unwrap();
    assert_eq!(
        stats.eviction_runs, 1,
        "the node took the lease and began: {stats:?}"
    );
    assert_eq!(
        stats.evicted, 0,
        "its lease was another's before its first DELETE: {stats:?}"
    );
    let keys: Vec<PageKey> = (0..11).map(|i| page(i).key).collect();
    assert_eq!(tier.exists(&keys).await.unwrap(), 11, "every page is left");
}

/// A node whose listing found the prefix over its capacity, and whose claim finds the lease
/// just released by another node that evicted meanwhile, lists again before it evicts: the
/// prefix stays at the low watermark the other node left. (Sized from the listing made
/// before the claim, it evicted another step below it.)
#[tokio::test]
async fn an_evictor_lists_again_after_its_claim() {
    let (store, tier) = over_by_one(Scripted {
        evicted_elsewhere: (0..2).map(|i| object_path("kv", &page(i).key)).collect(),
        ..Scripted::default()
    })
    .await;
    let left = bytes_under(&(Arc::clone(&store) as Arc<dyn ObjectStore>), "kv").await;
    assert!(
        store
            .evicted_elsewhere_done
            .load(std::sync::atomic::Ordering::SeqCst),
        "the other node's eviction was scripted in"
    );
    assert_eq!(
        left,
        9 * PAGE as u64,
        "evicted below the low watermark the other node left: {:?}",
        tier.prefix_stats()
    );
}

/// An in-memory store with what the tests script into it:
/// - `restored`: stored again right before its first HEAD, as another node would store a page
///   again right after the evictor listed the prefix (the store's ETag tells);
/// - `usurp`: the lease written over right before the first HEAD of a page;
/// - listings taken when asked for, then held back while the test holds `gate` closed: a
///   listing that misses the puts made while it was under way (as a paginated S3 listing may).
#[derive(Debug, Default)]
struct Scripted {
    inner: Arc<object_store::memory::InMemory>,
    restored: Option<Path>,
    restore_done: std::sync::atomic::AtomicBool,
    /// The lease written over by another node's holder right before the first HEAD of a page,
    /// as a racing claim the store let through lands after the evictor read its lease back.
    usurp: bool,
    usurp_done: std::sync::atomic::AtomicBool,
    gate: Arc<tokio::sync::RwLock<()>>,
    /// Told when a listing was taken.
    taken: Arc<tokio::sync::Notify>,
    /// Deleted right before the first read of the lease, as another node's eviction that
    /// ended (its lease released) between this node's listing and its claim.
    evicted_elsewhere: Vec<Path>,
    evicted_elsewhere_done: std::sync::atomic::AtomicBool,
    /// LIST requests made (a recursive listing counted once, as one page of it).
    lists: Arc<std::sync::atomic::AtomicU64>,
    /// Milliseconds each answer of a listing after its first takes (an answer per 1,000
    /// entries, as on S3).
    page_delay_ms: Arc<std::sync::atomic::AtomicU64>,
}

/// Entries in one answer of an S3 listing.
const LIST_PAGE: usize = 1000;

impl std::fmt::Display for Scripted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scripted({})", self.inner)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Scripted {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        let restored = options.head && self.restored.as_ref() == Some(location);
        if restored
            && !self
                .restore_done
                .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            // Page 0 again, whole: its bytes and their trailer.
            let mut again = vec![0u8; PAGE];
            let key = PageKey::new(location.filename().unwrap_or_default()).unwrap();
            again.extend_from_slice(&tier_format::seal(&key, [&again[..]]));
            let again = PutPayload::from(again);
            self.inner.put(location, again).await?;
        }
        if !options.head
            && location.as_ref() == "kv/.kvtier-lease"
            && !self.evicted_elsewhere.is_empty()
            && !self
                .evicted_elsewhere_done
                .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            for gone in &self.evicted_elsewhere {
                self.inner.delete(gone).await?;
            }
        }
        if options.head
            && self.usurp
            && !self
                .usurp_done
                .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let lease = Path::from("kv/.kvtier-lease");
            let held = format!("another-node:1:0 {}\n", u64::MAX / 2);
            self.inner.put(&lease, PutPayload::from(held)).await?;
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<'static, object_store::Result<Path>>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.lists.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (inner, gate, taken, prefix) = (
            Arc::clone(&self.inner),
            Arc::clone(&self.gate),
            Arc::clone(&self.taken),
            prefix.cloned(),
        );
        let delay =
            Duration::from_millis(self.page_delay_ms.load(std::sync::atomic::Ordering::SeqCst));
        futures::stream::once(async move {
            let listing: Vec<_> = inner.list(prefix.as_ref()).collect().await;
            taken.notify_one();
            drop(gate.read().await);
            let answers: Vec<Vec<_>> = listing
                .chunks(LIST_PAGE)
                .map(|c| {
                    c.iter()
                        .map(|m| {
                            m.as_ref()
                                .map_err(|e| object_store::Error::Generic {
                                    store: "scripted",
                                    source: e.to_string().into(),
                                })
                                .cloned()
                        })
                        .collect()
                })
                .collect();
            futures::stream::iter(answers.into_iter().enumerate())
                .then(move |(i, answer)| async move {
                    if i > 0 {
                        tokio::time::sleep(delay).await;
                    }
                    futures::stream::iter(answer)
                })
                .flatten()
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.lists.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let listing = self.inner.list_with_delimiter(prefix).await;
        self.taken.notify_one();
        drop(self.gate.read().await);
        // The client gathers every answer of the listing before it returns.
        if let Ok(listed) = &listing {
            let answers = (listed.objects.len() + listed.common_prefixes.len()).div_ceil(LIST_PAGE);
            let delay = self.page_delay_ms.load(std::sync::atomic::Ordering::SeqCst);
            let further = answers.saturating_sub(1) as u32;
            tokio::time::sleep(Duration::from_millis(delay) * further).await;
        }
        listing
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A shared prefix of `capacity` pages on a store whose listings are held back (until the
/// guard returned is dropped), opened, with `pages` pages put one at a time: the open and
/// each put must return within 10 s while the open's listing is held.
async fn opened_with_listing_held(
    capacity: u64,
    pages: usize,
) -> (
    Arc<dyn ObjectStore>,
    ObjectTier,
    tokio::sync::OwnedRwLockWriteGuard<()>,
) {
    let gated = Arc::new(Scripted::default());
    let closed = Arc::clone(&gated.gate).write_owned().await;
    let store: Arc<dyn ObjectStore> = Arc::clone(&gated) as Arc<dyn ObjectStore>;
    let tier = ObjectTier::open(Arc::clone(&store), shared("kv", capacity)).unwrap();
    let bound = Duration::from_secs(10);
    tokio::time::timeout(bound, tier.load_catalog())
        .await
        .expect("an open does not wait for the listing")
        .unwrap();
    tokio::time::timeout(bound, gated.taken.notified())
        .await
        .expect("the open's listing is taken");
    for i in 0..pages {
        let put = tokio::time::timeout(bound, tier.put(&[page(i)]))
            .await
            .expect("a put that does not take the prefix 2% past its capacity does not wait");
        assert!(put[0].is_ok());
    }
    (store, tier, closed)
}

/// The listing of a shared prefix runs beside the calls: an open, and puts that find the
/// listing stale (every put here), return while it is under way; a put that takes the prefix
/// past its capacity by more than 2% (by this node's count) waits for it, and then the prefix
/// is within its capacity, though the listing missed every page (the puts it did not see stay
/// counted).
#[tokio::test]
async fn opens_and_puts_do_not_wait_for_the_listing_of_a_shared_prefix() {
    let bound = Duration::from_secs(10);
    let (store, tier, closed) = opened_with_listing_held(10, 10).await;
    // One page past the capacity: 10% over it.
    let past = [page(10)];
    let over = tier.put(&past);
    tokio::pin!(over);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut over)
            .await
            .is_err(),
        "a put past the capacity by more than 2% waits for the listing"
    );
    drop(closed);
    let put = tokio::time::timeout(bound, over)
        .await
        .expect("the listing done, the put returns");
    assert!(put[0].is_ok());
    let held = bytes_under(&store, "kv").await;
    assert!(
        held <= 10 * PAGE as u64,
        "within the capacity: {held} bytes"
    );
    assert_eq!(
        tier.exists(&[page(10).key]).await.unwrap(),
        1,
        "the newest stays"
    );
}

/// A flush of a shared prefix does what the puts left to the background: with the prefix past
/// its capacity by less than the 2% a put waits for, a flush waits for the listing under way
/// and the eviction it calls for, so a node that flushes before it exits leaves the prefix
/// within its capacity (a flush that returned at once left it over).
#[tokio::test]
async fn a_flush_settles_what_the_puts_of_a_shared_prefix_left_to_the_background() {
    let bound = Duration::from_secs(10);
    // One page past the capacity: 1% over it, so no put waits.
    let (store, tier, closed) = opened_with_listing_held(100, 101).await;
    let flush = tier.flush();
    tokio::pin!(flush);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut flush)
            .await
            .is_err(),
        "a flush waits for the listing under way"
    );
    drop(closed);
    tokio::time::timeout(bound, flush)
        .await
        .expect("the listing done, the flush returns")
        .unwrap();
    let held = bytes_under(&store, "kv").await;
    assert!(
        held <= 100 * PAGE as u64,
        "within the capacity after the flush: {held} bytes"
    );
    assert!(tier.prefix_stats().unwrap().evicted > 0);
}

/// A node that writes looks at a window of the prefix's buckets per `relist`, about 16 LIST
/// requests, not the whole prefix (257 with all 256 buckets: about 92,000 requests an hour at
/// the default 10 s, per node); the windows go round, so another node's pages in every bucket
/// are counted within 16 listings, as a whole listing counts them.
#[tokio::test]
async fn a_writing_node_lists_a_window_of_buckets_per_relist_and_counts_every_bucket_in_turn() {
    let store = Arc::new(Scripted::default());
    let shared_store = Arc::clone(&store) as Arc<dyn ObjectStore>;
    let mut quiet = shared("kv", 1 << 20);
    quiet.shared.relist = Duration::from_secs(3600);
    let other = ObjectTier::open(Arc::clone(&shared_store), quiet).unwrap();
    let fill: Vec<Page<'static>> = (0..3072).map(page).collect();
    assert!(other.put(&fill).await.iter().all(Result::is_ok));
    let mut config = shared("kv", 1 << 20);
    config.shared.relist = Duration::from_millis(1);
    let tier = ObjectTier::open(Arc::clone(&shared_store), config).unwrap();
    tier.settle().await.unwrap();
    // Another node's pages, in every bucket, after this node's whole listing.
    let more: Vec<Page<'static>> = (3072..3584).map(page).collect();
    assert!(other.put(&more).await.iter().all(Result::is_ok));
    other.flush().await.unwrap();
    let lists = || store.lists.load(std::sync::atomic::Ordering::SeqCst);
    let at_open = lists();
    let rounds = 32;
    for i in 0..rounds {
        assert!(tier.put(&[page(10_000 + i)]).await[0].is_ok());
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let periodic = lists() - at_open;
    let counted = tier.prefix_stats().unwrap().usage_bytes;
    tier.settle().await.unwrap();
    let whole = tier.prefix_stats().unwrap().usage_bytes;
    println!(
        "{periodic} LIST requests in {rounds} periodic listings; counted {counted} bytes, a whole \
         listing {whole}"
    );
    assert!(
        (16..=rounds as u64 * 16).contains(&periodic),
        "{periodic} LIST requests for {rounds} periodic listings"
    );
    assert_eq!(counted, whole, "the windows went round every bucket");
    assert_eq!(whole, (3584 + rounds) as u64 * PAGE as u64);
}

/// Each request of a bucket's listing is bounded by `op_timeout`, not the bucket's whole
/// listing: a bucket of over 3,000 pages, listed in 4 answers each taking 0.4 s after the
/// first, lists within an `op_timeout` of 1 s. (Under one bound for a bucket's whole listing,
/// every listing failed past about 100,000 objects a bucket on S3, and the prefix grew
/// without eviction.)
#[tokio::test]
async fn each_request_of_a_buckets_listing_is_bounded_not_the_whole_bucket() {
    let store = Arc::new(Scripted::default());
    let shared_store = Arc::clone(&store) as Arc<dyn ObjectStore>;
    let mut quiet = shared("kv", 1 << 20);
    quiet.shared.relist = Duration::from_secs(3600);
    let other = ObjectTier::open(Arc::clone(&shared_store), quiet).unwrap();
    // Pages in every bucket, and 3,000 more in bucket 00.
    let mut fill: Vec<Page<'static>> = (0..3072).map(page).collect();
    fill.extend(
        (0..)
            .map(|i| PageKey::new(format!("bucket-00-{i:07}")).unwrap())
            .filter(|k| {
                let path = other.object_path(k).unwrap();
                path.parts().nth(1).is_some_and(|b| b.as_ref() == "00")
            })
            .take(3000)
            .map(|k| Page::new(k, vec![7u8; PAGE])),
    );
    for batch in fill.chunks(512) {
        assert!(other.put(batch).await.iter().all(Result::is_ok));
    }
    store
        .page_delay_ms
        .store(400, std::sync::atomic::Ordering::SeqCst);
    let mut config = shared("kv", 1 << 20);
    config.op_timeout = Duration::from_secs(1);
    let tier = ObjectTier::open(Arc::clone(&shared_store), config).unwrap();
    let started = std::time::Instant::now();
    tier.settle()
        .await
        .expect("a bucket whose listing outlasts op_timeout lists, each request within it");
    println!("listed {} pages in {:?}", fill.len(), started.elapsed());
    assert_eq!(
        tier.prefix_stats().unwrap().usage_bytes,
        fill.len() as u64 * PAGE as u64
    );
}
