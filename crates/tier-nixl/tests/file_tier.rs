//! NIXL FILE tier behaviour on the real runtime, beyond the shared suite: the probe, bucket
//! pre-creation, fd counts under 10,000 operations with injected failures, crash leftovers,
//! exclusive ownership, capacity eviction, direct I/O, and typed errors for bad setups.

use std::path::{Path, PathBuf};

use rstest::rstest;
use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier, TierError};
use tier_nixl::runtime::{self, RuntimeSource};
use tier_nixl::{
    DirectIo, FileAccess, FileMode, NixlFileConfig, NixlFileTier, PageChecksum, PathModeChoice,
    BUCKETS, PAGE_TRAILER,
};
use tier_tests::{content, fd};

fn key(i: usize) -> PageKey {
    PageKey::new(format!(
        "{:064x}",
        (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    ))
    .unwrap()
}

fn page(i: usize, version: u64, len: usize) -> Page<'static> {
    let k = key(i);
    let data = content::page(&k, version, len);
    Page::new(k, data)
}

/// Overwrites the start of a page file in place (its trailer stays), as a bad disk or a hand
/// would.
fn write_in_place(path: &Path, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.write_all_at(bytes, 0))
        .unwrap();
}

async fn put_ok(tier: &NixlFileTier, pages: &[Page<'_>]) {
    for (p, r) in pages.iter().zip(tier.put(pages).await) {
        r.unwrap_or_else(|e| panic!("put {}: {e}", p.key));
    }
}

async fn get_one(
    tier: &NixlFileTier,
    k: &PageKey,
    len: usize,
) -> (Result<Lookup, TierError>, Vec<u8>) {
    let mut buf = vec![0u8; len];
    let mut slots = [ReadSlot::new(k.clone(), &mut buf)];
    let r = tier.get(&mut slots).await.pop().unwrap();
    (r, buf)
}

async fn open(dirs: &[PathBuf], mode: PathModeChoice) -> NixlFileTier {
    let mut config = NixlFileConfig::new(dirs.iter().cloned());
    config.path_mode = mode;
    NixlFileTier::open(config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_is_real_and_the_probe_picks_path_mode() {
    let source =
        runtime::load(None).expect("the NIXL runtime must be installed (scripts/setup.sh nixl)");
    let tmp = tempfile::tempdir().unwrap();
    let tier = open(&[tmp.path().join("d")], PathModeChoice::Auto).await;
    assert_eq!(tier.mode(), FileMode::Path, "NIXL 1.5.1 supports path mode");
    println!(
        "NIXL runtime: real (nixl-sys is not a stub), loaded from {source}; probe chose {} mode",
        tier.mode()
    );
}

#[tokio::test]
async fn a_missing_runtime_is_a_typed_error_naming_where_it_looked() {
    let nowhere = [
        RuntimeSource::Config(PathBuf::from("/nonexistent/kvtier-nixl")),
        RuntimeSource::Env(PathBuf::from("/also/missing")),
    ];
    match runtime::search(&nowhere) {
        Err(TierError::Unavailable(msg)) => {
            assert!(
                msg.contains("/nonexistent/kvtier-nixl/libnixl_capi.so"),
                "{msg}"
            );
            assert!(msg.contains("/also/missing"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
}

#[rstest]
#[case::path(PathModeChoice::On)]
#[case::fd(PathModeChoice::Off)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bucket_folder_exists_right_after_start(#[case] mode: PathModeChoice) {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = [
        tmp.path().join("d0"),
        tmp.path().join("d1"),
        tmp.path().join("d2"),
    ];
    let _tier = open(&dirs, mode).await;
    for dir in &dirs {
        let buckets = (0..BUCKETS)
            .filter(|b| dir.join(format!("{b:02x}")).is_dir())
            .count();
        assert_eq!(buckets, BUCKETS, "{}", dir.display());
    }
}

/// Ten thousand operations of every kind, with injected failures; the fd count never grows.
#[rstest]
#[case::path(PathModeChoice::On)]
#[case::fd(PathModeChoice::Off)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fd_count_is_flat_over_10000_operations_with_injected_failures(
    #[case] mode: PathModeChoice,
) {
    if !fd::in_own_process() {
        return;
    }
    const OPS: usize = 10_000;
    const KEYS: usize = 48;
    const LEN: usize = 4096;
    let tmp = tempfile::tempdir().unwrap();
    let tier = open(&[tmp.path().join("d0"), tmp.path().join("d1")], mode).await;
    put_ok(
        &tier,
        &(0..KEYS).map(|i| page(i, 0, LEN)).collect::<Vec<_>>(),
    )
    .await;
    // The scan that follows the open holds a folder open while it runs.
    tier.opened().await;
    let baseline = fd::open_fds().unwrap();
    let mut injected = [0usize; 4];
    for op in 0..OPS {
        let i = (op * 7) % KEYS;
        match op % 10 {
            0..=2 => {
                put_ok(
                    &tier,
                    &[page(i, op as u64, LEN), page(i + 1, op as u64, LEN)],
                )
                .await
            }
            3 | 4 => {
                let (r, _) = get_one(&tier, &key(i), LEN).await;
                assert!(matches!(r, Ok(Lookup::Hit) | Ok(Lookup::Miss)), "{r:?}");
            }
            5 => {
                tier.exists(&[key(i), key(i + 1), key(i + 2)])
                    .await
                    .unwrap();
                let (r, _) = get_one(&tier, &key(i), LEN + 1).await;
                assert!(
                    matches!(r, Err(TierError::LengthMismatch { .. }) | Ok(Lookup::Miss)),
                    "{r:?}"
                );
            }
            6 => {
                tier.remove(&[key(i)]).await;
            }
            7 => {
                // A page file deleted behind the tier's back reads as a miss.
                put_ok(&tier, &[page(i, 1, LEN)]).await;
                std::fs::remove_file(tier.page_path(&key(i)).unwrap()).unwrap();
                let (r, _) = get_one(&tier, &key(i), LEN).await;
                assert_eq!(r.unwrap(), Lookup::Miss);
                injected[0] += 1;
            }
            8 => {
                // A transfer that fails: the page file replaced by a folder.
                put_ok(&tier, &[page(i, 1, LEN)]).await;
                let path = tier.page_path(&key(i)).unwrap();
                std::fs::remove_file(&path).unwrap();
                std::fs::create_dir(&path).unwrap();
                let (r, _) = get_one(&tier, &key(i), LEN).await;
                assert!(
                    r.is_err(),
                    "reading a folder as a page must fail, got {r:?}"
                );
                std::fs::remove_dir(&path).unwrap();
                injected[1] += 1;
            }
            _ => {
                // An unwritable bucket: its folder replaced by a file for one put.
                let path = tier.page_path(&key(i)).unwrap();
                let bucket = path.parent().unwrap().to_path_buf();
                let aside = bucket.with_extension("aside");
                std::fs::rename(&bucket, &aside).unwrap();
                std::fs::write(&bucket, b"not a folder").unwrap();
                let results = tier
                    .put(&[page(i, 2, LEN), page(KEYS + 1000 + op, 2, LEN)])
                    .await;
                assert!(
                    results[0].is_err(),
                    "a put into an unwritable bucket must fail"
                );
                std::fs::remove_file(&bucket).unwrap();
                std::fs::rename(&aside, &bucket).unwrap();
                injected[2] += 1;
                injected[3] += usize::from(results[1].is_ok());
            }
        }
        if op % 1000 == 999 {
            let now = fd::open_fds().unwrap();
            assert_eq!(now, baseline, "open fds after {} operations", op + 1);
        }
    }
    let end = fd::open_fds().unwrap();
    assert_eq!(end, baseline);
    println!(
        "{mode:?}: {OPS} operations, fds {baseline} -> {end}; injected: {} deleted files, {} failing transfers, {} unwritable-bucket puts ({} neighbour pages still stored)",
        injected[0], injected[1], injected[2], injected[3]
    );
}

/// An owner reopened on a folder of pages serves at once while its index is built in the
/// background: stored pages are found and read byte-exact, and pages removed or put
/// meanwhile come out of the load removed and stored; once it is done the index holds exactly
/// the pages on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_serves_while_its_index_is_built_and_ends_up_with_the_pages_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = [tmp.path().join("d0")];
    let (n, len) = (3000, 4096);
    let tier = open(&dirs, PathModeChoice::Auto).await;
    for first in (0..n).step_by(500) {
        put_ok(
            &tier,
            &(first..first + 500)
                .map(|i| page(i, 1, len))
                .collect::<Vec<_>>(),
        )
        .await;
    }
    drop(tier);
    let tier = open(&dirs, PathModeChoice::Auto).await;
    let removed = tier.remove(&(0..100).map(key).collect::<Vec<_>>()).await;
    assert!(removed.iter().all(|r| matches!(r, Ok(true))), "{removed:?}");
    put_ok(
        &tier,
        &(n..n + 100).map(|i| page(i, 2, len)).collect::<Vec<_>>(),
    )
    .await;
    for i in (100..n).step_by(97).chain(n..n + 100) {
        let (r, buf) = get_one(&tier, &key(i), len).await;
        assert_eq!(r.unwrap(), Lookup::Hit, "page {i}");
        assert_eq!(
            buf[..],
            page(i, if i < n { 1 } else { 2 }, len).data.contiguous()[..],
            "page {i}"
        );
    }
    tier.opened().await;
    assert_eq!(
        tier.pages(),
        n,
        "pages indexed once the open's scan is done"
    );
    for i in 0..100 {
        assert_eq!(
            tier.exists(&[key(i)]).await.unwrap(),
            0,
            "removed page {i} is back"
        );
    }
    assert_eq!(
        tier.exists(&(100..n + 100).map(key).collect::<Vec<_>>())
            .await
            .unwrap(),
        n
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_leftovers_are_removed_at_start_and_never_visible() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = [tmp.path().join("d0")];
    let tier = open(&dirs, PathModeChoice::Auto).await;
    put_ok(&tier, &[page(1, 1, 8192)]).await;
    let stored = tier.page_path(&key(1)).unwrap();
    let victim = tier.page_path(&key(2)).unwrap();
    drop(tier);
    // A crashed writer's temp file for key 2, half written.
    let temp = victim.with_file_name(format!(
        ".tmp-4242-7-{}",
        victim.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&temp, vec![7u8; 100]).unwrap();
    let tier = open(&dirs, PathModeChoice::Auto).await;
    tier.opened().await;
    assert!(!temp.exists(), "leftover removed at start");
    assert_eq!(tier.exists(&[key(2)]).await.unwrap(), 0);
    assert_eq!(tier.exists(&[key(1)]).await.unwrap(), 1);
    let (r, buf) = get_one(&tier, &key(1), 8192).await;
    assert_eq!(r.unwrap(), Lookup::Hit);
    content::verify(&key(1), 1, &buf).unwrap();
    assert!(stored.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_tier_on_the_same_folders_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = [tmp.path().join("d0")];
    let _first = open(&dirs, PathModeChoice::Auto).await;
    match NixlFileTier::open(NixlFileConfig::new(dirs.iter().cloned())).await {
        Err(TierError::Unavailable(msg)) => assert!(msg.contains("in use"), "{msg}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn duplicate_folders_by_real_path_are_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("disk");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, tmp.path().join("alias")).unwrap();
    let config = NixlFileConfig::new([real, tmp.path().join("alias")]);
    match NixlFileTier::open(config).await {
        Err(TierError::Config { field, message }) => {
            assert_eq!(field, "dirs[1]");
            assert!(message.contains("same folder"), "{message}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[tokio::test]
async fn bad_settings_are_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = NixlFileConfig::new([tmp.path().join("d")]);
    config.staging_buffers = 0;
    assert!(
        matches!(NixlFileTier::open(config).await, Err(TierError::Config { field, .. }) if field == "staging_buffers")
    );
    let mut config = NixlFileConfig::new([tmp.path().join("d")]);
    config.capacity_bytes = Some(0);
    assert!(
        matches!(NixlFileTier::open(config).await, Err(TierError::Config { field, .. }) if field == "capacity_bytes")
    );
    let config = NixlFileConfig::new(Vec::<PathBuf>::new());
    assert!(
        matches!(NixlFileTier::open(config).await, Err(TierError::Config { field, .. }) if field == "dirs")
    );
}

#[tokio::test]
async fn an_unavailable_plugin_is_named_in_the_error() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = NixlFileConfig::new([tmp.path().join("d")]);
    config.plugin = tier_nixl::FilePlugin::Hf3fs;
    match NixlFileTier::open(config).await {
        Err(TierError::Backend {
            backend, message, ..
        }) => {
            assert!(
                backend.contains("HF3FS") && message.contains("HF3FS"),
                "{backend}: {message}"
            );
        }
        Ok(_) => {} // a runtime that ships HF3FS and has a 3FS mount may open it
        Err(other) => panic!("{other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_evicts_least_recently_used_pages_and_their_files() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = NixlFileConfig::new([tmp.path().join("d")]);
    config.capacity_bytes = Some(4 * 65536);
    let tier = NixlFileTier::open(config).await.unwrap();
    put_ok(
        &tier,
        &(0..4).map(|i| page(i, 1, 65536)).collect::<Vec<_>>(),
    )
    .await;
    // Page 0 is read, so page 1 is now the least recently used.
    assert_eq!(get_one(&tier, &key(0), 65536).await.0.unwrap(), Lookup::Hit);
    put_ok(&tier, &[page(4, 1, 65536)]).await;
    assert_eq!(tier.exists(&[key(0)]).await.unwrap(), 1);
    assert_eq!(tier.exists(&[key(1)]).await.unwrap(), 0);
    assert!(
        !tier.page_path(&key(1)).unwrap().exists(),
        "evicted page's file deleted"
    );
    assert_eq!(tier.stats().evictions, 1);
    assert_eq!(tier.stats().resident_bytes, Some(4 * 65536));
}

/// Under the prefix-aware policy a full tier cuts a chain (one batch) from its tail, where
/// LRU would delete its head and so waste every page after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefix_policy_evicts_a_chain_from_its_tail() {
    let tmp = tempfile::tempdir().unwrap();
    for (policy, gone) in [
        (tier_policy::PolicyKind::Prefix, 3),
        (tier_policy::PolicyKind::Lru, 0),
    ] {
        let mut config = NixlFileConfig::new([tmp.path().join(policy.name())]);
        config.capacity_bytes = Some(4 * 65536);
        config.policy = policy;
        let tier = NixlFileTier::open(config).await.unwrap();
        put_ok(
            &tier,
            &(0..4).map(|i| page(i, 1, 65536)).collect::<Vec<_>>(),
        )
        .await;
        put_ok(&tier, &[page(9, 1, 65536)]).await;
        for i in 0..4 {
            let held = tier.exists(&[key(i)]).await.unwrap() == 1;
            assert_eq!(held, i != gone, "{policy}: page {i}");
            assert_eq!(
                tier.page_path(&key(i)).unwrap().exists(),
                held,
                "{policy}: file {i}"
            );
        }
    }
    let mut config = NixlFileConfig::new([tmp.path().join("t")]);
    config.policy = tier_policy::PolicyKind::Tinylfu;
    assert!(
        matches!(NixlFileTier::open(config).await, Err(TierError::Config { field, .. }) if field == "policy")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_hold_the_page_bytes_and_reads_come_from_disk() {
    let tmp = tempfile::tempdir().unwrap();
    for mode in [PathModeChoice::On, PathModeChoice::Off] {
        let tier = open(&[tmp.path().join(format!("{mode:?}"))], mode).await;
        let pages: Vec<Page<'static>> = (0..130).map(|i| page(i, 3, 16384)).collect();
        put_ok(&tier, &pages).await;
        for p in &pages {
            let file = std::fs::read(tier.page_path(&p.key).unwrap()).unwrap();
            assert_eq!(file.len() as u64, 16384 + PAGE_TRAILER);
            assert_eq!(file[..16384].to_vec(), p.data, "{mode:?} file of {}", p.key);
        }
        // A file changed on disk (same length, in place) no longer matches its checksum: a
        // miss and a counted error, never a hit, and the file is gone.
        let changed = content::page(&key(5), 99, 16384);
        let path = tier.page_path(&key(5)).unwrap();
        write_in_place(&path, &changed);
        let errors = tier.stats().errors;
        let (r, _) = get_one(&tier, &key(5), 16384).await;
        assert_eq!(r.unwrap(), Lookup::Miss, "{mode:?}");
        assert_eq!(tier.stats().errors, errors + 1, "{mode:?}");
        assert!(!path.exists(), "{mode:?}");
        assert_eq!(tier.exists(&[key(5)]).await.unwrap(), 0);
        // A zeroed page (a write lost to a power loss) is a miss too.
        let zeroed = vec![0u8; 16384 + PAGE_TRAILER as usize];
        std::fs::write(tier.page_path(&key(6)).unwrap(), zeroed).unwrap();
        assert_eq!(
            get_one(&tier, &key(6), 16384).await.0.unwrap(),
            Lookup::Miss
        );
        drop(tier);
        // Without checksums the tier returns whatever the file holds: its bytes are read.
        let mut config = NixlFileConfig::new([tmp.path().join(format!("{mode:?}-off"))]);
        config.path_mode = mode;
        config.page_checksum = PageChecksum::Off;
        let tier = NixlFileTier::open(config).await.unwrap();
        put_ok(&tier, &pages[..8]).await;
        write_in_place(&tier.page_path(&key(5)).unwrap(), &changed);
        let (r, buf) = get_one(&tier, &key(5), 16384).await;
        assert_eq!(r.unwrap(), Lookup::Hit);
        assert_eq!(buf, changed, "{mode:?} read must come from the file");
    }
}

/// Each engine's buffered and direct read paths.
const READ_PATHS: [(tier_nixl::FileEngine, DirectIo); 4] = [
    (tier_nixl::FileEngine::Nixl, DirectIo::Off),
    (tier_nixl::FileEngine::Nixl, DirectIo::Required),
    (tier_nixl::FileEngine::Syscalls, DirectIo::Off),
    (tier_nixl::FileEngine::Syscalls, DirectIo::Required),
];

/// Every read is checked against the page's checksum, also with direct I/O (staged reads) and
/// the syscall engine, whether the index knows it (pages this process wrote) or the file's is
/// read (after a restart); a file without one (written by hand, or by an older kvtier) is a
/// miss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_and_foreign_page_files_are_misses_on_every_read_path() {
    let tmp = tempfile::tempdir().unwrap();
    for (n, (engine, direct)) in READ_PATHS.into_iter().enumerate() {
        let mut config = direct_config(&tmp.path().join(format!("e{n}")), direct);
        config.engine = engine;
        let tier = NixlFileTier::open(config.clone()).await.unwrap();
        let pages: Vec<Page<'static>> = (0..4).map(|i| page(i, 1, 65536)).collect();
        put_ok(&tier, &pages).await;
        // One byte flipped in place.
        let path = tier.page_path(&key(1)).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[40_000] ^= 4;
        std::fs::write(&path, &bytes).unwrap();
        // A file put in place by hand, holding another version.
        let other = tier.page_path(&key(2)).unwrap();
        std::fs::remove_file(&other).unwrap();
        let mut another = page(2, 2, 65536).data.to_bytes().to_vec();
        another.extend([0u8; PAGE_TRAILER as usize]);
        std::fs::write(&other, another).unwrap();
        for i in 0..4 {
            let (r, buf) = get_one(&tier, &key(i), 65536).await;
            let want = if i == 1 || i == 2 {
                Lookup::Miss
            } else {
                Lookup::Hit
            };
            assert_eq!(r.unwrap(), want, "{engine:?} {direct:?} page {i}");
            if want == Lookup::Hit {
                content::verify(&key(i), 1, &buf).unwrap();
            }
        }
        assert_eq!(tier.stats().errors, 2, "{engine:?} {direct:?}");
        // Put there by hand with the page's very bytes, but a zeroed trailer (no checksum):
        // after a restart, which reads each page's checksum from its file, a miss. So is
        // another key's whole page file copied in (its trailer names its own key).
        let foreign = tier.page_path(&key(3)).unwrap();
        let copied = tier.page_path(&key(2)).unwrap();
        let donor = tier.page_path(&key(0)).unwrap();
        drop(tier);
        std::fs::remove_file(&foreign).unwrap();
        let mut untrailed = pages[3].data.to_bytes().to_vec();
        untrailed.extend([0u8; PAGE_TRAILER as usize]);
        std::fs::write(&foreign, untrailed).unwrap();
        let _ = std::fs::remove_file(&copied);
        std::fs::copy(&donor, &copied).unwrap();
        let tier = NixlFileTier::open(config).await.unwrap();
        let expected = [
            (0, Lookup::Hit),
            (3, Lookup::Miss),
            (2, Lookup::Miss),
            (0, Lookup::Hit),
        ];
        for (i, want) in expected {
            let (r, buf) = get_one(&tier, &key(i), 65536).await;
            assert_eq!(
                r.unwrap(),
                want,
                "{engine:?} {direct:?} page {i} after a restart"
            );
            if want == Lookup::Hit {
                content::verify(&key(i), 1, &buf).unwrap();
            }
        }
        assert_eq!(
            tier.stats().errors,
            2,
            "{engine:?} {direct:?} after a restart"
        );
    }
}

/// A page written with `page_checksum = "off"` (whole: its trailer names its key and length,
/// but no checksum) is read by a tier that checks, on every read path, owner or sharing, and
/// its file stays. (It was taken for a mismatch and unlinked: a fleet of mixed settings
/// deleted every page its unchecking writers stored.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_written_without_checksums_are_read_by_tiers_that_check_and_kept() {
    let tmp = tempfile::tempdir().unwrap();
    for (n, (engine, direct)) in READ_PATHS.into_iter().enumerate() {
        for access in [FileAccess::Owner, FileAccess::Shared] {
            let dir = tmp.path().join(format!("e{n}-{access:?}"));
            let mut config = direct_config(&dir, direct);
            config.engine = engine;
            config.access = access;
            let pages: Vec<Page<'static>> = (0..4).map(|i| page(i, 1, 65536)).collect();
            let mut unchecked = config.clone();
            unchecked.page_checksum = PageChecksum::Off;
            let writer = NixlFileTier::open(unchecked).await.unwrap();
            put_ok(&writer, &pages).await;
            let paths: Vec<PathBuf> = (0..4).map(|i| writer.page_path(&key(i)).unwrap()).collect();
            drop(writer);
            let reader = NixlFileTier::open(config).await.unwrap();
            for i in 0..4 {
                let (r, buf) = get_one(&reader, &key(i), 65536).await;
                assert_eq!(
                    r.unwrap(),
                    Lookup::Hit,
                    "{engine:?} {direct:?} {access:?} page {i}"
                );
                content::verify(&key(i), 1, &buf).unwrap();
            }
            assert!(
                paths.iter().all(|p| p.exists()),
                "{engine:?} {direct:?} {access:?}: a page without a checksum was removed"
            );
            assert_eq!(reader.stats().errors, 0, "{engine:?} {direct:?} {access:?}");
        }
    }
}

/// Pages are verified once per file version by default: a page rewritten in place after it
/// was verified and read again (same inode, new bytes, same length) is verified again and a
/// miss, on every engine and read path; so is one rewritten between two reads of a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_rewritten_in_place_after_it_was_verified_is_verified_again() {
    const LEN: usize = 128 << 10;
    let tmp = tempfile::tempdir().unwrap();
    for (what, config) in every_read_path(tmp.path()) {
        let tier = NixlFileTier::open(config.clone()).await.unwrap();
        put_ok(&tier, &[page(1, 1, LEN), page(2, 1, LEN)]).await;
        for _ in 0..3 {
            let (r, buf) = get_one(&tier, &key(1), LEN).await;
            assert_eq!(r.unwrap(), Lookup::Hit);
            content::verify(&key(1), 1, &buf).unwrap();
        }
        let path = tier.page_path(&key(1)).unwrap();
        write_in_place(&path, &content::page(&key(1), 9, LEN));
        let errors = tier.stats().errors;
        let (r, _) = get_one(&tier, &key(1), LEN).await;
        assert_eq!(r.unwrap(), Lookup::Miss, "{what}: rewritten in place");
        assert_eq!(tier.stats().errors, errors + 1, "{what}");
        // Changed by one byte only, with the whole page read in between.
        let path = tier.page_path(&key(2)).unwrap();
        let (r, _) = get_one(&tier, &key(2), LEN).await;
        assert_eq!(r.unwrap(), Lookup::Hit, "{what}");
        write_in_place(&path, &[0xA5]);
        let (r, _) = get_one(&tier, &key(2), LEN).await;
        assert_eq!(r.unwrap(), Lookup::Miss, "{what}: one byte rewritten");
    }
}

/// A page this process stored is read without checksumming it again, on every engine and read
/// path, owner or sharing: the version it wrote (its file held open across the rename) counts
/// as verified (`verify = "once"`). Rewritten after, it is checksummed again and a miss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_this_process_stored_is_read_without_checksumming_it_again() {
    // Alone in a process: the count of bytes checksummed is the process's.
    if !fd::in_own_process() {
        return;
    }
    const LEN: usize = 128 << 10;
    let tmp = tempfile::tempdir().unwrap();
    for (what, config) in every_read_path(tmp.path()) {
        let tier = NixlFileTier::open(config).await.unwrap();
        let pages: Vec<Page<'static>> = (0..8).map(|i| page(i, 1, LEN)).collect();
        put_ok(&tier, &pages).await;
        let before = tier_format::checksum::checksummed_bytes();
        for i in 0..8 {
            let (r, buf) = get_one(&tier, &key(i), LEN).await;
            assert_eq!(r.unwrap(), Lookup::Hit, "{what}");
            content::verify(&key(i), 1, &buf).unwrap();
        }
        let summed = tier_format::checksum::checksummed_bytes() - before;
        assert!(
            summed < LEN as u64,
            "{what}: {summed} bytes checksummed reading 8 pages of {LEN} it stored"
        );
        let path = tier.page_path(&key(1)).unwrap();
        write_in_place(&path, &content::page(&key(1), 9, LEN));
        let before = tier_format::checksum::checksummed_bytes();
        let (r, _) = get_one(&tier, &key(1), LEN).await;
        assert_eq!(r.unwrap(), Lookup::Miss, "{what}: rewritten in place");
        let summed = tier_format::checksum::checksummed_bytes() - before;
        assert!(summed >= LEN as u64, "{what}: {summed} bytes checksummed");
    }
}

/// In a shared folder, a page file showing a length other than the caller's buffer is a miss
/// (counted as an error) when it holds no whole page: another client's write as this client's
/// caches still show it, as GlusterFS's do for a moment. A whole page of another length is
/// still a `LengthMismatch`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_page_file_shown_short_is_a_miss_and_a_whole_page_of_another_length_mismatches() {
    const LEN: usize = 16 << 10;
    let tmp = tempfile::tempdir().unwrap();
    let mut config = NixlFileConfig::new([tmp.path().join("t")]);
    config.access = FileAccess::Shared;
    let tier = NixlFileTier::open(config).await.unwrap();
    put_ok(&tier, &[page(1, 1, LEN), page(2, 1, LEN / 2)]).await;
    let path = tier.page_path(&key(1)).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(LEN as u64 / 2))
        .unwrap();
    let errors = tier.stats().errors;
    let (r, _) = get_one(&tier, &key(1), LEN).await;
    assert_eq!(r.unwrap(), Lookup::Miss, "a file cut short is a miss");
    assert_eq!(tier.stats().errors, errors + 1, "and counted as an error");
    let (r, _) = get_one(&tier, &key(2), LEN).await;
    match r {
        Err(TierError::LengthMismatch { stored, buffer, .. }) => {
            assert_eq!((stored, buffer), (LEN / 2, LEN));
        }
        other => panic!("a whole page of another length: {other:?}"),
    }
}

/// A folder of pages without the format marker holds pages of format 1 (page bytes only,
/// checksums in extended attributes): every access refuses it with an error saying so, and a
/// marker naming another format is refused too; an empty folder is marked and opens. (Pages
/// of this format, whose trailers say so, are not taken for format 1: see `marker.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_of_an_older_page_format_is_refused_never_misread() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("t");
    let tier = NixlFileTier::open(NixlFileConfig::new([dir.clone()]))
        .await
        .unwrap();
    put_ok(&tier, &[page(1, 1, 4096)]).await;
    let file = tier.page_path(&key(1)).unwrap();
    drop(tier);
    let marker = dir.join(".kvtier.format");
    let text = std::fs::read_to_string(&marker).unwrap();
    assert!(text.contains("format 2"), "{text}");
    std::fs::remove_file(&marker).unwrap();
    // Format 1 stored the page's bytes alone.
    let stored = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    stored.set_len(4096).unwrap();
    drop(stored);
    for access in [FileAccess::Owner, FileAccess::Shared, FileAccess::Reader] {
        let mut config = NixlFileConfig::new([dir.clone()]);
        config.access = access;
        match NixlFileTier::open(config).await {
            Err(TierError::Config { field, message }) => {
                assert_eq!(field, "dirs");
                assert!(message.contains("format 1"), "{access:?}: {message}");
            }
            other => panic!("{access:?}: {:?}", other.map(|_| ())),
        }
    }
    std::fs::write(&marker, "kvtier page format 3\n").unwrap();
    let refused = NixlFileTier::open(NixlFileConfig::new([dir.clone()])).await;
    assert!(
        matches!(&refused, Err(TierError::Config { message, .. }) if message.contains("format 3")),
        "{:?}",
        refused.map(|_| ())
    );
    // Emptied, the folder opens again and is marked.
    std::fs::remove_dir_all(&dir).unwrap();
    let tier = NixlFileTier::open(NixlFileConfig::new([dir.clone()]))
        .await
        .unwrap();
    assert!(marker.exists());
    drop(tier);
}

/// A tier config per read path (engine and direct I/O), owner and sharing, each in its own
/// folder under `root`, with what it is called.
fn every_read_path(root: &Path) -> Vec<(String, NixlFileConfig)> {
    let mut configs = Vec::new();
    for (n, (engine, direct)) in READ_PATHS.into_iter().enumerate() {
        for access in [FileAccess::Owner, FileAccess::Shared] {
            let mut config = direct_config(&root.join(format!("e{n}-{access:?}")), direct);
            config.engine = engine;
            config.access = access;
            configs.push((format!("{engine:?} {direct:?} {access:?}"), config));
        }
    }
    configs
}

fn direct_config(dir: &Path, choice: DirectIo) -> NixlFileConfig {
    let mut config = NixlFileConfig::new([dir.to_path_buf()]);
    config.direct_io = choice;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_io_round_trips_aligned_pages_and_refuses_unaligned_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let tier =
        match NixlFileTier::open(direct_config(&tmp.path().join("d"), DirectIo::Required)).await {
            Ok(tier) => tier,
            Err(TierError::Config { message, .. }) => {
                panic!("this test needs a temp folder with O_DIRECT: {message}")
            }
            Err(e) => panic!("{e}"),
        };
    assert!(tier.direct_io());
    let pages: Vec<Page<'static>> = (0..20).map(|i| page(i, 5, 4096 * (1 + i % 4))).collect();
    put_ok(&tier, &pages).await;
    for p in &pages {
        let (r, buf) = get_one(&tier, &p.key, p.data.len()).await;
        assert_eq!(r.unwrap(), Lookup::Hit);
        assert_eq!(buf, p.data);
    }
    let results = tier.put(&[page(50, 1, 5000), page(51, 1, 8192)]).await;
    assert!(
        matches!(
            &results[0],
            Err(TierError::Unaligned {
                len: 5000,
                align: 4096,
                ..
            })
        ),
        "{:?}",
        results[0]
    );
    assert!(results[1].is_ok());
}

/// A filesystem mounted on a temp folder for one test, unmounted on drop. Needs root, as CI runs:
/// a failed mount fails the test.
struct Mount(tempfile::TempDir);

impl Mount {
    fn new(fstype: &str, options: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", fstype, "-o", options, "kvtier-test"])
            .arg(dir.path())
            .status()
            .expect("running mount");
        assert!(
            status.success(),
            "this test mounts a {fstype} and needs root (CI runs as root)"
        );
        Self(dir)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // Lazily: a failed transfer may hold its files open for a transfer timeout, and a plain
        // unmount would then fail (busy) and leave the mount behind.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_io_without_fs_support_is_an_error_when_required_and_buffered_when_preferred() {
    // ramfs has no O_DIRECT, and no extended attributes (checksums live in the page files).
    let ramfs = Mount::new("ramfs", "mode=0755");
    let sums = ramfs.0.path().join("sum");
    let tier = NixlFileTier::open(NixlFileConfig::new([sums.clone()]))
        .await
        .unwrap();
    put_ok(&tier, &[page(1, 1, 5000), page(2, 1, 5000)]).await;
    write_in_place(&tier.page_path(&key(2)).unwrap(), b"changed");
    let (r, buf) = get_one(&tier, &key(1), 5000).await;
    assert_eq!(r.unwrap(), Lookup::Hit);
    content::verify(&key(1), 1, &buf).unwrap();
    let (r, _) = get_one(&tier, &key(2), 5000).await;
    assert_eq!(
        r.unwrap(),
        Lookup::Miss,
        "verified without extended attributes"
    );
    drop(tier);
    match NixlFileTier::open(direct_config(
        &ramfs.0.path().join("req"),
        DirectIo::Required,
    ))
    .await
    {
        Err(TierError::Config { field, message }) => {
            assert_eq!(field, "direct_io");
            assert!(message.contains("O_DIRECT"), "{message}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    let tier = NixlFileTier::open(direct_config(
        &ramfs.0.path().join("pref"),
        DirectIo::Preferred,
    ))
    .await
    .unwrap();
    assert!(!tier.direct_io(), "falls back to buffered I/O");
    put_ok(&tier, &[page(1, 1, 5000)]).await;
    let (r, buf) = get_one(&tier, &key(1), 5000).await;
    assert_eq!(r.unwrap(), Lookup::Hit);
    content::verify(&key(1), 1, &buf).unwrap();
    drop(tier);
}

#[rstest]
#[case::path_mode(PathModeChoice::On)]
#[case::fd_mode(PathModeChoice::Off)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_pages_that_do_not_fit_and_loses_nothing(
    #[case] mode: PathModeChoice,
) {
    let disk = Mount::new("tmpfs", "size=16m");
    let dir = disk.0.path().join("tier");
    let tier = open(std::slice::from_ref(&dir), mode).await;
    const LEN: usize = 64 << 10;
    // 400 pages of 64 KiB: 25 MiB onto a 16 MiB disk.
    let mut stored = Vec::new();
    let mut failed = 0;
    for batch in 0..25 {
        let pages: Vec<Page<'static>> = (batch * 16..batch * 16 + 16)
            .map(|i| page(i, 1, LEN))
            .collect();
        for (p, r) in pages.iter().zip(tier.put(&pages).await) {
            match r {
                Ok(()) => stored.push(p.key.clone()),
                Err(e) => {
                    assert_eq!(e.key(), Some(&p.key), "the error names its page: {e}");
                    assert!(
                        e.to_string().contains("No space left on device"),
                        "a clear out-of-space error: {e}"
                    );
                    failed += 1;
                }
            }
        }
    }
    assert!(
        failed > 0 && stored.len() > 100,
        "stored {}, failed {failed}",
        stored.len()
    );
    // Earlier pages stay exact; nothing partial is visible or left behind.
    let check_all = |tier: &NixlFileTier| {
        let tier_pages = tier.pages();
        assert_eq!(
            tier_pages,
            stored.len(),
            "the index holds exactly the stored pages"
        );
    };
    check_all(&tier);
    for k in &stored {
        let (r, buf) = get_one(&tier, k, LEN).await;
        assert_eq!(r.unwrap(), Lookup::Hit, "{k}");
        content::verify(k, 1, &buf).unwrap();
    }
    let files: usize = walk_files(&dir)
        .iter()
        .filter(|n| !n.starts_with(".kvtier"))
        .count();
    assert_eq!(
        files,
        stored.len(),
        "one file per stored page, no temp files left"
    );
    // Removing pages frees space: as many pages as were removed fit again, also after a batch
    // too big for that space failed (its temp files, held open by its transfer for a transfer
    // timeout, kept the blocks written into them until then).
    let freed: Vec<PageKey> = stored.drain(..64).collect();
    for r in tier.remove(&freed).await {
        assert!(r.unwrap());
    }
    let too_big: Vec<Page<'static>> = (2000..2100).map(|i| page(i, 2, LEN)).collect();
    let took = tier
        .put(&too_big)
        .await
        .iter()
        .filter(|r| r.is_ok())
        .count();
    assert!(took < 64, "{took} of 100 pages fit where 64 were removed");
    let again: Vec<Page<'static>> = (1000..1064 - took).map(|i| page(i, 2, LEN)).collect();
    put_ok(&tier, &again).await;
    for p in &again {
        let (r, buf) = get_one(&tier, &p.key, LEN).await;
        assert_eq!(r.unwrap(), Lookup::Hit);
        content::verify(&p.key, 2, &buf).unwrap();
    }
    println!(
        "{mode:?}: 16 MiB tmpfs took {} pages of 64 KiB, {failed} failed with out-of-space errors; after removing 64, a batch of 100 stored {took}, and {} more fit",
        stored.len() + 64,
        again.len()
    );
    drop(tier);
}

fn walk_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_sees_the_owners_pages_and_never_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs = [tmp.path().join("a"), tmp.path().join("b")];
    let owner = open(&dirs, PathModeChoice::Auto).await;
    put_ok(&owner, &[page(1, 1, 16 << 10), page(2, 1, 8 << 10)]).await;
    // The owner holds the folders' lock; a reader opens beside it anyway.
    let mut config = NixlFileConfig::new(dirs.iter().cloned());
    config.access = tier_nixl::FileAccess::Reader;
    let reader = NixlFileTier::open(config).await.unwrap();
    assert_eq!(reader.exists(&[key(1), key(2), key(3)]).await.unwrap(), 2);
    let (r, buf) = get_one(&reader, &key(1), 16 << 10).await;
    assert_eq!(r.unwrap(), Lookup::Hit);
    content::verify(&key(1), 1, &buf).unwrap();
    // Pages the owner writes later are seen at once; overwrites and removals too.
    put_ok(&owner, &[page(3, 1, 4 << 10), page(1, 2, 12 << 10)]).await;
    assert_eq!(reader.exists(&[key(1), key(2), key(3)]).await.unwrap(), 3);
    let (r, buf) = get_one(&reader, &key(1), 12 << 10).await;
    assert_eq!(r.unwrap(), Lookup::Hit);
    content::verify(&key(1), 2, &buf).unwrap();
    assert!(matches!(
        get_one(&reader, &key(1), 16 << 10).await.0,
        Err(TierError::LengthMismatch { stored, .. }) if stored == 12 << 10
    ));
    owner.remove(&[key(2)]).await;
    assert_eq!(
        get_one(&reader, &key(2), 8 << 10).await.0.unwrap(),
        Lookup::Miss
    );
    // It never writes, removes or clears what it does not own.
    assert!(reader.put(&[page(9, 1, 4096)]).await[0].is_err());
    assert_eq!(
        reader.remove(&[key(1)]).await[0].as_ref().ok(),
        Some(&false)
    );
    reader.clear().await.unwrap();
    assert_eq!(owner.exists(&[key(1), key(3)]).await.unwrap(), 2);
    assert!(!owner.page_path(&key(9)).unwrap().exists());
}

/// A direct read pins its page against eviction while a blocking thread reads it; a get
/// dropped at that await point once left the pin behind for good, so the page could never be
/// evicted again and the tier stayed over its capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_read_leaves_its_page_evictable() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = direct_config(&tmp.path().join("d"), DirectIo::Required);
    config.capacity_bytes = Some(4 * 65536);
    let tier = NixlFileTier::open(config).await.unwrap();
    put_ok(&tier, &[page(0, 1, 65536)]).await;
    // Each get dropped right after its first poll: suspended while the read runs (a read that
    // finished before that poll drops nothing; it is tried again).
    let mut dropped = 0;
    for _ in 0..200 {
        let mut buf = vec![0u8; 65536];
        let mut slots = [ReadSlot::new(key(0), &mut buf)];
        let mut get = std::pin::pin!(tier.get(&mut slots));
        if futures::poll!(get.as_mut()).is_pending() {
            dropped += 1;
            if dropped == 8 {
                break;
            }
        }
    }
    assert!(
        dropped > 0,
        "no direct read was still running after its first poll"
    );
    // Let the abandoned reads finish, then fill the tier: page 0 is the oldest.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    put_ok(
        &tier,
        &(1..5).map(|i| page(i, 1, 65536)).collect::<Vec<_>>(),
    )
    .await;
    assert_eq!(
        tier.exists(&[key(0)]).await.unwrap(),
        0,
        "page 0 was never evicted"
    );
    assert_eq!(tier.stats().resident_bytes, Some(4 * 65536));
}

/// A batch read checksums each page where it landed, also when the batch moves in several
/// transfers (the NIXL engine checksums a few MiB at a time) and on both threads of a big batch:
/// exactly the pages changed on disk are misses, every other page a hit with its own bytes;
/// against the checksums the index knows (pages in the page cache), and against the files' own
/// after a restart (pages from the disk, several transfers in flight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_batch_checksums_every_page_as_its_own() {
    const LEN: usize = 512 << 10;
    const PAGES: usize = 40;
    fn flip(tier: &NixlFileTier, i: usize) {
        let path = tier.page_path(&key(i)).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[LEN / 2 + i] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
    }
    async fn read_all(tier: &NixlFileTier, misses: &[usize], what: &str) {
        let mut bufs = vec![vec![0u8; LEN]; PAGES];
        let mut slots: Vec<ReadSlot<'_>> = bufs
            .iter_mut()
            .enumerate()
            .map(|(i, b)| ReadSlot::new(key(i), b))
            .collect();
        let results = tier.get(&mut slots).await;
        drop(slots);
        for (i, r) in results.into_iter().enumerate() {
            let want = if misses.contains(&i) {
                Lookup::Miss
            } else {
                Lookup::Hit
            };
            assert_eq!(r.unwrap(), want, "{what}: page {i}");
            if want == Lookup::Hit {
                content::verify(&key(i), 1, &bufs[i]).unwrap();
            }
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    for (n, engine) in [tier_nixl::FileEngine::Nixl, tier_nixl::FileEngine::Syscalls]
        .into_iter()
        .enumerate()
    {
        let mut config = NixlFileConfig::new([tmp.path().join(format!("e{n}"))]);
        config.engine = engine;
        let tier = NixlFileTier::open(config.clone()).await.unwrap();
        let pages: Vec<Page<'static>> = (0..PAGES).map(|i| page(i, 1, LEN)).collect();
        put_ok(&tier, &pages).await;
        flip(&tier, 3);
        flip(&tier, 25);
        read_all(&tier, &[3, 25], &format!("{engine:?}")).await;
        assert_eq!(tier.stats().errors, 2, "{engine:?}");
        flip(&tier, 9);
        flip(&tier, 38);
        drop(tier);
        let tier = NixlFileTier::open(config).await.unwrap();
        // SAFETY: plain syscall: the files are written out, then dropped from the page cache.
        unsafe { libc::sync() };
        for i in (0..PAGES).filter(|i| ![3, 25].contains(i)) {
            use std::os::unix::io::AsRawFd;
            let file = std::fs::File::open(tier.page_path(&key(i)).unwrap()).unwrap();
            // SAFETY: plain syscall on an open fd.
            unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
        read_all(&tier, &[3, 9, 25, 38], &format!("{engine:?} restarted")).await;
        assert_eq!(tier.stats().errors, 2, "{engine:?} restarted");
    }
}

/// A batch read in place into the caller's memory, one of whose files is cut short (a short
/// read fails its descriptor): every other page is a hit with its own bytes, the cut one is
/// not, and the call returns as soon as the reads ended, each region read a transfer of its
/// own whose end NIXL reports; so with pages lent as one region and as two (SGLang's K and V).
/// (One transfer of every descriptor stopped reporting the others once one failed: the call
/// then waited out a whole transfer timeout before it gave the caller's memory back, and still
/// could not know the others had ended.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_into_caller_memory_ends_when_its_reads_end_not_a_timeout_later() {
    const LEN: usize = 65536;
    for regions in [1, 2] {
        let tmp = tempfile::tempdir().unwrap();
        let mut config = NixlFileConfig::new([tmp.path().join("d")]);
        config.path_mode = PathModeChoice::On;
        config.transfer_timeout = std::time::Duration::from_secs(4);
        let tier = NixlFileTier::open(config).await.unwrap();
        let pages: Vec<Page<'static>> = (0..8).map(|i| page(i, 1, LEN)).collect();
        put_ok(&tier, &pages).await;
        let cut = tier.page_path(&key(3)).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&cut)
            .and_then(|f| f.set_len(LEN as u64 * 3 / 4))
            .unwrap();
        let mut bufs = vec![vec![0u8; LEN]; 8];
        let mut slots: Vec<ReadSlot<'_>> = bufs
            .iter_mut()
            .enumerate()
            .map(|(i, b)| {
                let parts: Vec<&mut [u8]> = b.chunks_mut(LEN / regions).collect();
                ReadSlot::regions(key(i), parts)
            })
            .collect();
        let started = std::time::Instant::now();
        let results = tier.get(&mut slots).await;
        let took = started.elapsed();
        drop(slots);
        println!("{regions} region(s) a page, a batch of 8 with one file cut short: {took:?}, {results:?}");
        for (i, (r, buf)) in results.iter().zip(&bufs).enumerate() {
            if i == 3 {
                assert!(
                    !matches!(r, Ok(Lookup::Hit)),
                    "the cut page is no hit: {r:?}"
                );
            } else {
                assert!(matches!(r, Ok(Lookup::Hit)), "page {i}: {r:?}");
                content::verify(&key(i), 1, buf).unwrap();
            }
        }
        assert!(
            took < std::time::Duration::from_secs(2),
            "{regions} region(s): the call took {took:?}, with a transfer timeout of 4 s"
        );
    }
}
