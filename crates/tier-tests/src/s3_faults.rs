//! Outage cases every S3-backed tier must pass, against s3s-fs ([`S3Server`]: a bucket of the
//! run's shared server, or a server of the case's own where it is stopped or restarted):
//! an unreachable endpoint, wrong credentials, the server killed and restarted mid-run, and
//! `clear` confined to the tier's prefix.
//!
//! ```text
//! tier_tests::s3_outage_suite!(MyS3Factory);
//! ```
//! expands to one test per case, each printing what it measured.

use std::time::{Duration, Instant};

use tier_core::{Lookup, Page, PageKey, TierError};

use crate::content;
use crate::factory::DynTier;
use crate::s3::S3Server;
use crate::suite::read_page;

pub use crate::factory::{S3Target, S3TierFactory};

fn key(i: usize) -> PageKey {
    PageKey::new(format!("{i:064x}")).expect("valid key")
}

fn pages(range: std::ops::Range<usize>, len: usize) -> Vec<Page<'static>> {
    range
        .map(|i| Page::new(key(i), content::page(&key(i), 1, len)))
        .collect()
}

async fn open(f: &dyn S3TierFactory, target: &S3Target) -> Result<DynTier, String> {
    f.open(target)
        .await
        .map_err(|e| format!("could not open the tier: {e}"))
}

async fn read(tier: &DynTier, i: usize, len: usize) -> (Result<Lookup, TierError>, Vec<u8>) {
    read_page(tier.as_ref(), key(i), len).await
}

async fn store(tier: &DynTier, batch: &[Page<'_>]) -> Result<(), String> {
    for (page, r) in batch.iter().zip(tier.put(batch).await) {
        r.map_err(|e| format!("put of {} failed: {e}", page.key))?;
    }
    Ok(())
}

async fn expect_exact(
    tier: &DynTier,
    range: std::ops::Range<usize>,
    len: usize,
) -> Result<(), String> {
    for i in range {
        match read(tier, i, len).await {
            (Ok(Lookup::Hit), buf) => content::verify(&key(i), 1, &buf)?,
            (other, _) => return Err(format!("page {i}: {other:?}")),
        }
    }
    Ok(())
}

fn typed(r: &Result<(), TierError>) -> bool {
    matches!(
        r,
        Err(TierError::Backend { .. } | TierError::Timeout { .. })
    )
}

/// Nobody listens on the endpoint: put, get, exists, remove and clear each return a typed error
/// within the bound. Returns the longest call.
pub async fn unreachable_server(f: &dyn S3TierFactory) -> Result<Duration, String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let target = S3Target {
        endpoint: format!("http://127.0.0.1:{port}"),
        bucket: "kvtier".into(),
        access_key: "k".into(),
        secret_key: "s".into(),
        prefix: "down".into(),
        bound: Duration::from_secs(5),
    };
    let tier = open(f, &target).await?;
    let mut longest = Duration::ZERO;
    let mut failures = Vec::new();
    let started = Instant::now();
    failures.extend(tier.put(&pages(0..4, 4096)).await);
    longest = longest.max(started.elapsed());
    let started = Instant::now();
    failures.push(read(&tier, 0, 4096).await.0.map(|_| ()));
    longest = longest.max(started.elapsed());
    let started = Instant::now();
    failures.push(tier.exists(&[key(0)]).await.map(|_| ()));
    longest = longest.max(started.elapsed());
    let started = Instant::now();
    failures.extend(
        tier.remove(&[key(0)])
            .await
            .into_iter()
            .map(|r| r.map(|_| ())),
    );
    longest = longest.max(started.elapsed());
    let started = Instant::now();
    failures.push(tier.clear().await);
    longest = longest.max(started.elapsed());
    if let Some(bad) = failures.iter().find(|r| !typed(r)) {
        return Err(format!("a call to an unreachable server gave {bad:?}"));
    }
    if !crate::answered_within(longest, target.bound) {
        return Err(format!("a call took {longest:?}, bound {:?}", target.bound));
    }
    Ok(longest)
}

/// A wrong secret: put and get fail with a backend error that says authentication failed.
/// Returns the messages.
pub async fn wrong_credentials(f: &dyn S3TierFactory) -> Result<Vec<String>, String> {
    let server = S3Server::shared();
    let mut target = S3Target::of(&server, "auth");
    target.secret_key = "not-the-secret".into();
    let tier = open(f, &target).await?;
    let put = tier.put(&pages(0..1, 4096)).await.pop();
    let get = read(&tier, 0, 4096).await.0.map(|_| ());
    let mut messages = Vec::new();
    for (op, r) in [("put", put.unwrap_or(Ok(()))), ("get", get)] {
        match r {
            Err(TierError::Backend { message, .. })
                if message.contains("authentication failed") =>
            {
                messages.push(format!("{op}: {message}"))
            }
            other => return Err(format!("{op} with a wrong secret gave {other:?}")),
        }
    }
    Ok(messages)
}

/// The server is killed mid-run: calls fail (typed, within the bound); after a restart, writes
/// succeed again and every page reads back exact. Returns how long the outage calls took.
pub async fn restarted_server(f: &dyn S3TierFactory) -> Result<Duration, String> {
    let mut server = S3Server::start();
    let target = S3Target::of(&server, "restart");
    let tier = open(f, &target).await?;
    store(&tier, &pages(0..32, 65536)).await?;
    server.stop();
    let started = Instant::now();
    let during = tier.put(&pages(32..40, 65536)).await;
    let get = read(&tier, 0, 65536).await.0.map(|_| ());
    let outage = started.elapsed();
    if !during.iter().chain([&get]).all(typed) {
        return Err(format!(
            "calls during the outage gave {during:?} and {get:?}"
        ));
    }
    if !crate::answered_within(outage, 2 * target.bound) {
        return Err(format!("two calls during the outage took {outage:?}"));
    }
    server.restart();
    store(&tier, &pages(32..40, 65536)).await?;
    expect_exact(&tier, 0..40, 65536).await?;
    Ok(outage)
}

/// `clear` removes the tier's prefix and nothing else: pages of tiers on a sibling prefix, a
/// prefix sharing its leading characters, and its parent survive.
pub async fn clear_keeps_other_prefixes(f: &dyn S3TierFactory) -> Result<(), String> {
    let server = S3Server::shared();
    let others = ["other/model", "suite/run-not", "suite"];
    for prefix in others {
        store(
            &open(f, &S3Target::of(&server, prefix)).await?,
            &pages(0..4, 4096),
        )
        .await?;
    }
    let tier = open(f, &S3Target::of(&server, "suite/run")).await?;
    store(&tier, &pages(0..8, 4096)).await?;
    tier.clear()
        .await
        .map_err(|e| format!("clear failed: {e}"))?;
    let left = tier
        .exists(&[key(0)])
        .await
        .map_err(|e| format!("exists failed: {e}"))?;
    if left != 0 {
        return Err("a page survived clear()".into());
    }
    for prefix in others {
        expect_exact(&open(f, &S3Target::of(&server, prefix)).await?, 0..4, 4096)
            .await
            .map_err(|e| format!("{prefix} must survive clear() of suite/run: {e}"))?;
    }
    Ok(())
}

/// Expands to one test per outage case, each opening tiers from `$factory`.
#[macro_export]
macro_rules! s3_outage_suite {
    ($factory:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_unreachable_server_gives_typed_errors_within_the_bound() {
            let longest = $crate::s3_faults::unreachable_server(&$factory).await.unwrap();
            println!("unreachable server: put, get, exists, remove, clear all failed typed; longest {longest:?} (bound 5s)");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn wrong_credentials_are_a_clear_auth_error() {
            for message in $crate::s3_faults::wrong_credentials(&$factory).await.unwrap() {
                println!("wrong secret, {message}");
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_restarted_server_serves_again_and_nothing_read_is_corrupt() {
            let outage = $crate::s3_faults::restarted_server(&$factory).await.unwrap();
            println!("outage: put and get failed in {outage:?}; after the restart 40 pages read back exact");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_frozen_server_costs_nothing_once_its_tier_is_down() {
            let f = $crate::outage::frozen_server(&$factory, true).await.unwrap();
            println!("frozen server, gets of pages only below: {:?}", f.gets);
            println!("puts while down: {:?}; back up {:?} after the thaw", f.puts, f.back_up_in);
            for line in f.metrics {
                println!("{line}");
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_killed_server_is_skipped_then_found_back_up() {
            let skipped = $crate::outage::killed_server(&$factory).await.unwrap();
            println!("killed server: a get of the down tier took {skipped:?}; restarted, 64 pages read back exact");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_deadline_bounds_a_get_on_a_frozen_server() {
            let took = $crate::outage::deadline_on_a_frozen_server(&$factory).await.unwrap();
            println!("get with a 300 ms deadline on a frozen server: {took:?}, the top tier's page a hit");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn write_back_keeps_its_queue_while_the_tier_is_down() {
            let demoted = $crate::outage::write_back_keeps_its_queue(&$factory).await.unwrap();
            println!("write-back through a frozen server: {demoted} pages demoted after the thaw, none dropped");
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn clear_removes_only_the_tiers_prefix() {
            $crate::s3_faults::clear_keeps_other_prefixes(&$factory).await.unwrap();
        }
    };
}
