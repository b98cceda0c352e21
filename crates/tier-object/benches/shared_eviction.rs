//! Eviction from a shared prefix on a real S3 server (s3s-fs on loopback): `N` pages of 4 KiB
//! stored; a node opening the prefix is timed to its first call answered and to its usage
//! listed (in the background), then a node whose capacity is half of them stores one more and
//! evicts to its low watermark (one listing, a HEAD per victim to spare what changed, the
//! deletes; timed to the end of the eviction the put started). Beside it, on a prefix just as full,
//! a direct object_store loop doing what the tier did before: one listing (bucket after
//! bucket), then a HEAD and a DELETE per victim, one at a time, as many (at most 2,000).
//! Objects evicted per second, medians of interleaved rounds.
//!
//! `cargo bench -p tier-object --bench shared_eviction` (pages: `$KVTIER_BENCH_PAGES`, default
//! 4000; rounds: `$KVTIER_BENCH_ROUNDS`, default 3). With `KVTIER_BENCH_STORE=memory` the
//! prefix is in object_store's in-memory store instead: no server, so what is left is the
//! tier's own cost. (s3s-fs walks and `stat`s a listing's whole folder per request: a flat
//! prefix of 200,000 objects took it about a quarter of an hour to list; a bucket's folder
//! holds a 256th of them.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::{ObjectStore, ObjectStoreExt};
use tier_core::{Page, PageKey, StorageTier};
use tier_object::{ObjectTier, ObjectTierConfig, PrefixAccess, S3Settings, SharedPrefix};
use tier_tests::s3::S3Server;

const LEN: usize = 4096;
/// Victims the one-at-a-time baseline evicts at most.
const BASELINE_VICTIMS: usize = 2000;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn page(i: usize) -> Page<'static> {
    Page::new(
        PageKey::new(format!("{i:064x}")).expect("a key"),
        vec![i as u8; LEN],
    )
}

fn shared(prefix: &str, pages: Option<usize>) -> ObjectTierConfig {
    let mut config = ObjectTierConfig::new(prefix);
    config.access = PrefixAccess::Shared;
    config.capacity_bytes = pages.map(|p| (p * LEN) as u64);
    config.shared.relist = Duration::from_nanos(1);
    config
}

/// Stores pages `0..n` under `prefix` (no capacity: nothing evicted).
async fn fill(store: &Arc<dyn ObjectStore>, prefix: &str, n: usize) {
    let t = ObjectTier::open(Arc::clone(store), shared(prefix, None)).expect("a tier");
    for first in (0..n).step_by(64) {
        let pages: Vec<Page<'static>> = (first..(first + 64).min(n)).map(page).collect();
        for r in t.put(&pages).await {
            r.expect("a put");
        }
    }
}

/// The page objects of each of `prefix`'s buckets, as a direct client lists them (one
/// bucket after another).
async fn bucket_listings(
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
) -> Vec<object_store::ObjectMeta> {
    let mut objects = Vec::new();
    for b in 0..256 {
        let bucket = object_store::path::Path::from(format!("{prefix}/{b:02x}"));
        let listing = store
            .list_with_delimiter(Some(&bucket))
            .await
            .expect("a listing");
        objects.extend(listing.objects);
    }
    objects
}

async fn objects_under(store: &Arc<dyn ObjectStore>, prefix: &str) -> usize {
    bucket_listings(store, prefix).await.len()
}

/// How long a node (its capacity above the `n` pages there) takes to open the full prefix and
/// answer a first call (an `exists`), and to know its usage from a listing (in the
/// background until [`ObjectTier::settle`]).
async fn open(store: &Arc<dyn ObjectStore>, prefix: &str, n: usize) -> (Duration, Duration) {
    let started = Instant::now();
    let t = ObjectTier::open(Arc::clone(store), shared(prefix, Some(2 * n))).expect("a tier");
    t.load_catalog().await.expect("the prefix lists");
    let held = t.exists(&[page(0).key]).await.expect("an exists");
    assert_eq!(held, 1, "the first page is there");
    let served = started.elapsed();
    t.settle().await.expect("the prefix lists");
    (served, started.elapsed())
}

/// The tier: one more page stored by a node whose capacity is half the prefix, and the
/// eviction it starts in the background, waited for.
async fn by_tier(store: &Arc<dyn ObjectStore>, prefix: &str, n: usize) -> (Duration, usize) {
    let t = ObjectTier::open(Arc::clone(store), shared(prefix, Some(n / 2))).expect("a tier");
    let started = Instant::now();
    t.put(&[page(n)])
        .await
        .pop()
        .expect("a result")
        .expect("a put");
    t.settle().await.expect("the prefix settles");
    let took = started.elapsed();
    (took, n + 1 - objects_under(store, prefix).await)
}

/// LIST requests a node writing to the full prefix makes: one whole listing (what each
/// periodic listing cost before), and the mean of `rounds` periodic listings (a window of
/// buckets each), each started by a put once the last is `relist` old.
async fn list_requests(store: &Arc<dyn ObjectStore>, prefix: &str, n: usize) -> (f64, f64) {
    let mut config = shared(prefix, Some(2 * n));
    config.shared.relist = Duration::from_millis(1);
    let t = ObjectTier::open(Arc::clone(store), config).expect("a tier");
    let requests = || t.prefix_stats().expect("a shared prefix").list_requests;
    t.settle().await.expect("the prefix lists");
    let before = requests();
    t.settle().await.expect("the prefix lists");
    let whole = requests() - before;
    let rounds = 32;
    let before = requests();
    for i in 0..rounds {
        t.put(&[page(n + 1 + i)])
            .await
            .pop()
            .expect("a result")
            .expect("a put");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let periodic = (requests() - before) as f64 / rounds as f64;
    (whole as f64, periodic)
}

/// What the tier did before: one listing, then HEAD and DELETE per victim, one at a time, as
/// many (at most `BASELINE_VICTIMS`: its rate is the same, and at 200,000 objects evicting
/// half that way takes about an hour).
async fn one_at_a_time(
    store: &Arc<dyn ObjectStore>,
    prefix: &str,
    count: usize,
) -> (Duration, usize) {
    let unquoted = |e: &Option<String>| e.as_deref().map(|e| e.trim_matches('"').to_string());
    let started = Instant::now();
    let mut listed = bucket_listings(store, prefix).await;
    listed.sort_by_key(|m| m.last_modified);
    let mut evicted = 0;
    for meta in &listed {
        if evicted >= count {
            break;
        }
        let now = store.head(&meta.location).await.expect("a HEAD");
        let same = (meta.e_tag.is_none() || unquoted(&now.e_tag) == unquoted(&meta.e_tag))
            && now.last_modified.timestamp() == meta.last_modified.timestamp();
        if same {
            store.delete(&meta.location).await.expect("a DELETE");
            evicted += 1;
        }
    }
    (started.elapsed(), evicted)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n = env("KVTIER_BENCH_PAGES", 4000);
    let rounds = env("KVTIER_BENCH_ROUNDS", 3);
    let in_memory = std::env::var("KVTIER_BENCH_STORE").is_ok_and(|s| s == "memory");
    let (_server, store, where_) = if in_memory {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        (None, store, "object_store's in-memory store")
    } else {
        let server = S3Server::start();
        let store = S3Settings::endpoint(
            &server.endpoint(),
            &server.bucket,
            &server.access_key,
            &server.secret_key,
        )
        .build()
        .expect("an S3 client");
        (Some(server), store, "s3s-fs")
    };
    fill(&store, "requests", n).await;
    let (whole, periodic) = list_requests(&store, "requests", n).await;
    let (mut tier, mut loop_, mut opens) = (Vec::new(), Vec::new(), Vec::new());
    let mut listings = Vec::new();
    for r in 0..rounds {
        let (a, b) = (format!("tier-{r}"), format!("loop-{r}"));
        let started = Instant::now();
        fill(&store, &a, n).await;
        println!("round {r}: {n} pages stored in {:?}", started.elapsed());
        fill(&store, &b, n).await;
        let (served, listed) = open(&store, &a, n).await;
        opens.push(served.as_secs_f64());
        listings.push(listed.as_secs_f64());
        println!("round {r}: a node opened the prefix and answered in {served:?}, listed it in {listed:?}");
        let (took, by_tier_count) = by_tier(&store, &a, n).await;
        tier.push(by_tier_count as f64 / took.as_secs_f64());
        println!(
            "round {r}: tier evicted {by_tier_count} in {took:?}, leaving {:.3} of its capacity",
            (n + 1 - by_tier_count) as f64 / (n / 2) as f64
        );
        let (took, evicted) = one_at_a_time(&store, &b, by_tier_count.min(BASELINE_VICTIMS)).await;
        loop_.push(evicted as f64 / took.as_secs_f64());
        println!("round {r}: one at a time evicted {evicted} in {took:?}");
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (t, l, o) = (median(&mut tier), median(&mut loop_), median(&mut opens));
    let listed = median(&mut listings);
    println!(
        "shared prefix of {n} pages of 4 KiB on {where_}, over half evicted, medians of {rounds} rounds:"
    );
    println!(
        "  tier (buckets listed in parallel, HEADs concurrent, multi-object delete): {t:>8.0} objects/s"
    );
    println!("  one HEAD and one DELETE at a time (before):                                {l:>8.0} objects/s");
    println!("  ratio: {:.1}x", t / l);
    println!(
        "  a node's open to its first call answered: {o:.2} s (its usage listed: {listed:.2} s)"
    );
    let hourly = 3600.0 / SharedPrefix::default().relist.as_secs_f64();
    println!(
        "  LIST requests of a writing node, relist {:?}: {:.0} per listing, {:.0} an hour \
         (the whole prefix each time, before: {whole:.0} per listing, {:.0} an hour)",
        SharedPrefix::default().relist,
        periodic,
        periodic * hourly,
        whole * hourly
    );
}
