//! NIXL's POSIX backend holds a fixed pool of I/O requests (`ios_pool_size`). An I/O queued
//! past its end fails the whole transfer and leaves the requests queued before it in the pool
//! for good, never posted, so every later transfer of that backend failed too (a lane lost
//! for the process). The FILE tier keeps each backend's descriptors in flight within its pool:
//! big batches move in several transfers (and a transfer waits for room: see the engine's
//! unit tests).

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier};
use tier_nixl::{FileEngine, NixlFileConfig, NixlFileTier, PageChecksum};
use tier_tests::content;

fn key(i: usize) -> PageKey {
    PageKey::new(format!("{:064x}", i + 1)).unwrap()
}

async fn tier_with_pool(dir: &std::path::Path, pool: usize) -> NixlFileTier {
    let mut config = NixlFileConfig::new([dir.to_path_buf()]);
    config.engine = FileEngine::Nixl;
    config
        .plugin_params
        .insert("ios_pool_size".into(), pool.to_string());
    NixlFileTier::open(config).await.unwrap()
}

/// Puts and gets `n` pages of `len` bytes in one call each, every byte compared.
async fn round_trip(tier: &NixlFileTier, first: usize, n: usize, len: usize) {
    let pages: Vec<Page<'static>> = (first..first + n)
        .map(|i| Page::new(key(i), content::page(&key(i), 1, len)))
        .collect();
    for (p, r) in pages.iter().zip(tier.put(&pages).await) {
        r.unwrap_or_else(|e| panic!("put {}: {e}", p.key));
    }
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; len]).collect();
    let mut slots: Vec<ReadSlot<'_>> = pages
        .iter()
        .zip(bufs.iter_mut())
        .map(|(p, b)| ReadSlot::new(p.key.clone(), b))
        .collect();
    for (p, r) in pages.iter().zip(tier.get(&mut slots).await) {
        assert!(matches!(r, Ok(Lookup::Hit)), "get {}: {r:?}", p.key);
    }
    drop(slots);
    for (p, b) in pages.iter().zip(&bufs) {
        assert_eq!(b[..], p.data.to_vec()[..], "bytes of {}", p.key);
    }
}

/// A batch of many more pages than the pool holds, on each lane, is stored and read whole; and
/// the lanes still serve afterwards (a batch over the pool used to fail, and every transfer of
/// its lane after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_larger_than_nixls_io_pool_are_stored_and_read_whole() {
    let tmp = tempfile::tempdir().unwrap();
    // NIXL's smallest pool.
    let tier = tier_with_pool(tmp.path(), 64).await;
    round_trip(&tier, 0, 600, 4096).await;
    round_trip(&tier, 1_000, 1, 4096).await;
    round_trip(&tier, 2_000, 40, 256 << 10).await;
}

/// With checksums off a read moves every page in one transfer per part: it too stays within
/// the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_without_checksums_stay_within_the_pool() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = NixlFileConfig::new([tmp.path().to_path_buf()]);
    config.engine = FileEngine::Nixl;
    config.page_checksum = PageChecksum::Off;
    config
        .plugin_params
        .insert("ios_pool_size".into(), "64".into());
    let tier = NixlFileTier::open(config).await.unwrap();
    round_trip(&tier, 0, 500, 4096).await;
    round_trip(&tier, 1_000, 1, 4096).await;
}

/// A pool size that is no count is the config's error, naming the setting, before any backend
/// is made (it was an unavailable runtime, after a warning that io_uring was unavailable).
#[tokio::test]
async fn a_pool_size_that_is_no_count_is_a_config_error() {
    let tmp = tempfile::tempdir().unwrap();
    for bad in ["many", "-5", ""] {
        let mut config = NixlFileConfig::new([tmp.path().join("d")]);
        config
            .plugin_params
            .insert("ios_pool_size".into(), bad.into());
        match NixlFileTier::open(config).await {
            Err(tier_core::TierError::Config { field, message }) => {
                assert_eq!(field, "plugin_params", "{bad:?}");
                assert!(message.contains("ios_pool_size"), "{bad:?}: {message}");
            }
            other => panic!("{bad:?}: {:?}", other.map(|_| ())),
        }
    }
}
