//! kill -9 survival: a child process (this test binary, running the ignored `crash_writer`)
//! writes, overwrites and removes pages in a loop; the test kills it with SIGKILL at random
//! moments, reopens the storage in this process and checks that every page `exists` reports is
//! complete and byte-exact, that no temporary file survives start-up, and that the tier still
//! works. For the NIXL FILE tier, the NIXL OBJ tier and the object_store tier.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier};
use tier_nixl::{NixlFileConfig, NixlFileTier, NixlObjConfig, NixlObjTier};
use tier_object::{ObjectTier, ObjectTierConfig, S3Settings};
use tier_tests::content;
use tier_tests::rng::Rng;
use tier_tests::s3::S3Server;

const PAGE: usize = 64 << 10;
const KEYSPACE: usize = 256;
const VERSIONS: [u64; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
const PREFIX: &str = "crash";

fn key(i: usize) -> PageKey {
    PageKey::new(format!("crash{i:04}{:055x}", (i as u64 + 1) * 0x9e37_79b9)).unwrap()
}

/// What the child writes to: `file:<dir>`, or `nixl-obj:<endpoint>` / `object:<endpoint>`.
fn open_target(
    target: &str,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Arc<dyn StorageTier>> + Send + '_>> {
    Box::pin(async move {
        let (kind, place) = target.split_once(':').unwrap();
        let s3 = || S3Settings::endpoint(place, "kvtier", "kvtier-test-key", "kvtier-test-secret");
        match kind {
            "file" => Arc::new(
                NixlFileTier::open(NixlFileConfig::new([PathBuf::from(place)]))
                    .await
                    .unwrap(),
            ) as Arc<dyn StorageTier>,
            "nixl-obj" => Arc::new(
                NixlObjTier::open(NixlObjConfig::new(s3(), PREFIX))
                    .await
                    .unwrap(),
            ),
            "object" => Arc::new(
                ObjectTier::open(s3().build().unwrap(), ObjectTierConfig::new(PREFIX)).unwrap(),
            ),
            other => panic!("unknown target {other}"),
        }
    })
}

/// The child: writes until killed (or 60 s pass). Does nothing unless the parent set
/// `KVTIER_CRASH_TARGET`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the kill -9 tests as their child process"]
async fn crash_writer() {
    let Ok(target) = std::env::var("KVTIER_CRASH_TARGET") else {
        return;
    };
    let seed: u64 = std::env::var("KVTIER_CRASH_SEED").unwrap().parse().unwrap();
    let tier = open_target(&target).await;
    println!("\nkvtier-writer-ready");
    let mut rng = Rng::new(seed);
    let started = Instant::now();
    let mut batch_no = 0u64;
    while started.elapsed() < Duration::from_secs(60) {
        batch_no += 1;
        let version = VERSIONS[(batch_no % VERSIONS.len() as u64) as usize];
        let batch: Vec<Page<'static>> = (0..16)
            .map(|_| {
                let k = key(rng.below(KEYSPACE as u64) as usize);
                Page::new(k.clone(), content::page(&k, version, PAGE))
            })
            .collect();
        let _ = tier.put(&batch).await;
        if batch_no.is_multiple_of(4) {
            let gone = [key(rng.below(KEYSPACE as u64) as usize)];
            let _ = tier.remove(&gone).await;
        }
    }
}

/// Starts a child writing to `target`; returns it once it has opened the tier.
fn spawn_writer(target: &str, seed: u64) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "crash_writer",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KVTIER_CRASH_TARGET", target)
        .env("KVTIER_CRASH_SEED", seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("kvtier-writer-ready") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = child.kill();
        panic!("the writer did not open its tier within 30 s");
    }
    child
}

/// Reads every key of the key space that `exists` reports (in batches); each must be a whole
/// page of one version. Returns how many were verified.
async fn verify_present(tier: &dyn StorageTier) -> usize {
    let mut present = Vec::new();
    for i in 0..KEYSPACE {
        let k = key(i);
        if tier.exists(std::slice::from_ref(&k)).await.unwrap() == 1 {
            present.push(k);
        }
    }
    for chunk in present.chunks(64) {
        let mut bufs = vec![vec![0u8; PAGE]; chunk.len()];
        let mut slots: Vec<ReadSlot<'_>> = chunk
            .iter()
            .zip(bufs.iter_mut())
            .map(|(k, b)| ReadSlot::new(k.clone(), b))
            .collect();
        let results = tier.get(&mut slots).await;
        drop(slots);
        for ((k, buf), r) in chunk.iter().zip(&bufs).zip(results) {
            // Present a moment ago and the writer is dead: it must still be there.
            assert_eq!(r.unwrap(), Lookup::Hit, "{k} exists but reads as a miss");
            assert!(
                content::which_version(k, &VERSIONS, buf).is_some(),
                "{k} exists but is not a complete page of any version written"
            );
        }
    }
    present.len()
}

/// The tier still works after the crash: a fresh page round-trips.
async fn still_works(tier: &dyn StorageTier, round: usize) {
    let k = PageKey::new(format!("after-crash-{round}")).unwrap();
    tier.put(&[Page::new(k.clone(), content::page(&k, 9, 4096))])
        .await
        .pop()
        .unwrap()
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let r = tier
        .get(&mut [ReadSlot::new(k.clone(), &mut buf)])
        .await
        .pop()
        .unwrap();
    assert_eq!(r.unwrap(), Lookup::Hit);
    content::verify(&k, 9, &buf).unwrap();
    tier.remove(&[k]).await.pop().unwrap().unwrap();
}

fn temp_files(dir: &Path) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(e.path());
            } else if name.starts_with(".tmp-") {
                n += 1;
            }
        }
    }
    n
}

/// Kills a writer `kills` times at random moments; after each kill, `check` inspects the
/// storage in this process. Returns (kills, pages verified).
async fn kill_loop<F, Fut>(target: &str, kills: usize, seed: u64, mut check: F) -> (usize, usize)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    // Printed, and replaced by KVTIER_SEED when set: a failing run can be replayed.
    let seed = tier_tests::rng::seed(seed);
    let mut rng = Rng::new(seed);
    let mut verified = 0;
    for round in 0..kills {
        let mut child = spawn_writer(target, seed + round as u64);
        tokio::time::sleep(Duration::from_millis(20 + rng.below(400))).await;
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        assert!(!status.success(), "the writer ended on its own: {status}");
        verified += check(round).await;
    }
    (kills, verified)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nixl_file_tier_survives_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tier");
    let target = format!("file:{}", dir.display());
    let mut temps_seen = 0;
    let started = Instant::now();
    let (kills, verified) = kill_loop(&target, 20, 11, |round| {
        let dir = dir.clone();
        temps_seen += temp_files(&dir);
        async move {
            let tier = NixlFileTier::open(NixlFileConfig::new([dir.clone()]))
                .await
                .unwrap();
            tier.opened().await;
            assert_eq!(temp_files(&dir), 0, "a temp file survived start-up");
            let n = verify_present(&tier).await;
            still_works(&tier, round).await;
            n
        }
    })
    .await;
    assert!(verified > 0, "no page was ever stored before a kill");
    // A temp file left behind is a write the kill cut: the kills did hit writes in progress.
    assert!(
        temps_seen > 0,
        "no kill interrupted a write: the test proved nothing"
    );
    println!(
        "NIXL FILE: {kills} kills survived in {:?}; {verified} pages verified after kills; {temps_seen} temp leftovers found, all removed at start",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_tiers_survive_kill_9() {
    let server = S3Server::start();
    let s3 = S3Settings::endpoint(
        &server.endpoint(),
        &server.bucket,
        &server.access_key,
        &server.secret_key,
    );
    let store = s3.build().unwrap();
    let started = Instant::now();
    let mut total = (0, 0);
    for (kind, seed) in [("nixl-obj", 21), ("object", 31)] {
        let target = format!("{kind}:{}", server.endpoint());
        let (kills, verified) = kill_loop(&target, 10, seed, |round| {
            let store = Arc::clone(&store);
            let s3 = s3.clone();
            async move {
                // Every object under the prefix is a whole page: nothing partial is visible.
                let listed: Vec<object_store::ObjectMeta> = store
                    .list(Some(&PREFIX.into()))
                    .try_collect()
                    .await
                    .unwrap();
                for meta in &listed {
                    assert_eq!(
                        meta.size,
                        tier_format::sealed_len(PAGE),
                        "{} is a partial object",
                        meta.location
                    );
                }
                let tier: Arc<dyn StorageTier> = if kind == "object" {
                    Arc::new(
                        ObjectTier::open(Arc::clone(&store), ObjectTierConfig::new(PREFIX))
                            .unwrap(),
                    )
                } else {
                    Arc::new(
                        NixlObjTier::open(NixlObjConfig::new(s3, PREFIX))
                            .await
                            .unwrap(),
                    )
                };
                let n = verify_present(tier.as_ref()).await;
                still_works(tier.as_ref(), round).await;
                n
            }
        })
        .await;
        println!("{kind}: {kills} kills survived; {verified} pages verified after kills");
        assert!(
            verified > 0,
            "{kind}: no page was ever stored before a kill"
        );
        total = (total.0 + kills, total.1 + verified);
    }
    println!(
        "object tiers: {} kills survived in {:?}; {} pages verified after kills",
        total.0,
        started.elapsed(),
        total.1
    );
}
