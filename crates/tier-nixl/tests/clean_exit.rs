//! A process that used a NIXL tier exits cleanly: status 0, no abort from the runtime's own
//! teardown. Each child (this test binary, running the ignored `exit_child`) opens a tier,
//! uses it, drops it and returns at once, so anything the tier left running races the
//! process's exit. A closer thread left destroying NIXL OBJ agents once did: the AWS SDK's
//! static teardown then met it and aborted the process (about one exit in sixty). A tier
//! whose last clone is dropped while the process exits (a thread late to let go of it, an
//! `atexit` handler, a static's destructor) must not call NIXL after its statics are gone.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier};
use tier_nixl::{NixlFileConfig, NixlFileTier, NixlObjConfig, NixlObjTier};
use tier_object::S3Settings;
use tier_tests::content;
use tier_tests::s3::S3Server;

const CHILDREN: usize = 12;
const PAGE: usize = 64 << 10;

fn key(i: usize) -> PageKey {
    PageKey::new(format!("exit{i:060x}")).unwrap()
}

fn obj_config(endpoint: &str, timeout: Duration) -> NixlObjConfig {
    let s3 = S3Settings::endpoint(endpoint, "kvtier", "kvtier-test-key", "kvtier-test-secret");
    let mut config = NixlObjConfig::new(s3, "exit");
    config.transfer_timeout = timeout;
    config
}

/// Puts 16 pages and reads them back exact.
async fn round_trip(tier: &dyn StorageTier) {
    let pages: Vec<Page<'static>> = (0..16)
        .map(|i| Page::new(key(i), content::page(&key(i), 1, PAGE)))
        .collect();
    for r in tier.put(&pages).await {
        r.unwrap();
    }
    let mut bufs = vec![vec![0u8; PAGE]; 16];
    let mut slots: Vec<ReadSlot<'_>> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| ReadSlot::new(key(i), b))
        .collect();
    for r in tier.get(&mut slots).await {
        assert_eq!(r.unwrap(), Lookup::Hit);
    }
    for (i, b) in bufs.iter().enumerate() {
        content::verify(&key(i), 1, b).unwrap();
    }
}

/// A tier the exit drops: after NIXL's statics are destroyed, by a handler registered before
/// the tier opened (before NIXL made them).
static PARKED: Mutex<Option<Arc<dyn StorageTier>>> = Mutex::new(None);

extern "C" fn drop_parked() {
    let parked = PARKED.lock().unwrap_or_else(|e| e.into_inner()).take();
    drop(parked);
}

/// Parks `tier` for the exit to drop (see [`PARKED`]).
fn park(tier: Arc<dyn StorageTier>) {
    *PARKED.lock().unwrap() = Some(tier);
}

/// The child: `file:<dir>` and `nixl-obj:<endpoint>` round-trip pages; `nixl-obj-down:<endpoint>`
/// puts to an endpoint nobody listens on until the transfer times out. Then the tier is
/// dropped and the process exits; with `parked-` before the case (`parked-file:<dir>`), the
/// tier is left to the exit to drop, after NIXL's statics. Does nothing unless the parent set
/// `KVTIER_EXIT_CASE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by the clean-exit tests as their child process"]
async fn exit_child() {
    let Ok(case) = std::env::var("KVTIER_EXIT_CASE") else {
        return;
    };
    let (kind, place) = case.split_once(':').unwrap();
    let (kind, parked) = match kind.strip_prefix("parked-") {
        Some(kind) => {
            // SAFETY: registers a plain function taking nothing, run once the process exits.
            assert_eq!(unsafe { libc::atexit(drop_parked) }, 0);
            (kind, true)
        }
        None => (kind, false),
    };
    let tier: Arc<dyn StorageTier> = match kind {
        "file" => {
            let config = NixlFileConfig::new([PathBuf::from(place)]);
            Arc::new(NixlFileTier::open(config).await.unwrap())
        }
        "nixl-obj" => {
            let config = obj_config(place, Duration::from_secs(10));
            Arc::new(NixlObjTier::open(config).await.unwrap())
        }
        "nixl-obj-down" => {
            let tier = Arc::new(
                NixlObjTier::open(obj_config(place, Duration::from_millis(500)))
                    .await
                    .unwrap(),
            );
            let page = [Page::new(key(0), content::page(&key(0), 1, PAGE))];
            assert!(tier.put(&page).await[0].is_err());
            return;
        }
        other => panic!("unknown case {other}"),
    };
    round_trip(tier.as_ref()).await;
    if parked {
        park(tier);
    }
}

/// Runs `CHILDREN` children on `case`; each must exit with status 0 within 60 s.
fn children_exit_cleanly(case: &str) {
    let started = Instant::now();
    let log = tempfile::NamedTempFile::new().unwrap();
    for n in 0..CHILDREN {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["exit_child", "--exact", "--ignored", "--test-threads=1"])
            .env("KVTIER_EXIT_CASE", case)
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("child {n} on {case} did not exit within 60 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let stderr = String::from_utf8_lossy(&std::fs::read(log.path()).unwrap()).into_owned();
        log.as_file().set_len(0).unwrap();
        let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
        assert!(
            status.success(),
            "child {n} on {case} exited with {status}; the end of its stderr:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    println!(
        "{case}: {CHILDREN} children used a tier, dropped it and exited with status 0 in {:.1?}",
        started.elapsed()
    );
}

#[test]
fn processes_exit_cleanly_after_a_nixl_file_tier() {
    let dir = tempfile::tempdir().unwrap();
    children_exit_cleanly(&format!("file:{}", dir.path().display()));
}

#[test]
fn processes_exit_cleanly_after_a_nixl_obj_tier() {
    let server = S3Server::start();
    children_exit_cleanly(&format!("nixl-obj:{}", server.endpoint()));
}

#[test]
fn processes_exit_cleanly_after_a_timed_out_nixl_obj_transfer() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    children_exit_cleanly(&format!("nixl-obj-down:http://127.0.0.1:{port}"));
}

/// A NIXL FILE tier dropped after the exit destroyed NIXL's statics: the teardown is skipped,
/// the exit clean (it died of SIGSEGV, in a shared pointer's release inside libnixl).
#[test]
fn a_nixl_file_tier_dropped_after_nixls_statics_leaves_the_exit_clean() {
    let dir = tempfile::tempdir().unwrap();
    children_exit_cleanly(&format!("parked-file:{}", dir.path().display()));
}

/// The same for a NIXL OBJ tier (the OBJ plugin and the AWS SDK's statics).
#[test]
fn a_nixl_obj_tier_dropped_after_nixls_statics_leaves_the_exit_clean() {
    let server = S3Server::start();
    children_exit_cleanly(&format!("parked-nixl-obj:{}", server.endpoint()));
}
