//! The whole conformance suite on DRAM over the NIXL FILE tier (write-through), and pages
//! demoted by write-back reaching the files.
mod common;

use std::sync::Arc;

use tier_core::{StorageTier, TierError};
use tier_hierarchy::{Hierarchy, HierarchyPolicy, WritePolicy};
use tier_mem::{MemTier, MemTierConfig};
use tier_nixl::{NixlFileConfig, NixlFileTier, PathModeChoice};
use tier_tests::suite::DynTier;
use tier_tests::TierFactory;

struct DramOverFile(common::FileFactory);

#[tier_core::async_trait]
impl TierFactory for DramOverFile {
    async fn open(&self) -> Result<DynTier, TierError> {
        let file = self.0.open().await?;
        // 1 MiB: the suite's cases write far more, so pages are read from the files.
        let dram: DynTier = Arc::new(MemTier::open(MemTierConfig::new(1 << 20))?);
        Ok(Arc::new(
            Hierarchy::builder("dram/nixl-file")
                .tier(dram)
                .tier(file)
                .build()?,
        ))
    }

    fn root(&self) -> Option<std::path::PathBuf> {
        self.0.root()
    }
}

tier_tests::conformance_suite!(DramOverFile(common::FileFactory::new(PathModeChoice::On)));

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_back_demotes_evicted_pages_into_files() {
    let tmp = tempfile::tempdir().unwrap();
    let file = Arc::new(
        NixlFileTier::open(NixlFileConfig::new([tmp.path().join("d")]))
            .await
            .unwrap(),
    );
    let policy = HierarchyPolicy {
        write: WritePolicy::WriteBack,
        ..HierarchyPolicy::default()
    };
    let h = Hierarchy::builder("wb")
        .policy(policy)
        .tier_with(|on_evict| {
            let dram = MemTierConfig {
                on_evict,
                ..MemTierConfig::new(1 << 20)
            };
            Ok(Arc::new(MemTier::open(dram)?) as _)
        })
        .tier(file.clone())
        .build()
        .unwrap();
    let pages: Vec<tier_core::Page> = (0..64)
        .map(|i| {
            let k = tier_core::PageKey::new(format!("wb{i:062x}")).unwrap();
            tier_core::Page::new(k.clone(), tier_tests::content::page(&k, 1, 64 << 10))
        })
        .collect();
    for chunk in pages.chunks(8) {
        for r in h.put(chunk).await {
            r.unwrap();
        }
    }
    h.flush().await.unwrap();
    let demoted = h.hierarchy_stats().demotions as usize;
    assert!(demoted > 0);
    assert_eq!(file.pages(), demoted, "every demoted page is a file");
    for p in &pages {
        let mut buf = vec![0u8; p.data.len()];
        let r = h
            .get(&mut [tier_core::ReadSlot::new(p.key.clone(), &mut buf)])
            .await
            .pop()
            .unwrap();
        assert_eq!(r.unwrap(), tier_core::Lookup::Hit);
        assert_eq!(buf, p.data);
    }
    h.close().await.unwrap();
}

/// The suite's cases reach the files below the 1 MiB DRAM top: it evicts, the file tier
/// serves, pages are promoted and copied down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_moves_pages_between_levels() {
    let files = common::FileFactory::new(PathModeChoice::On);
    let file = files.open().await.unwrap();
    let factory = tier_tests::movement::Recording::new(move || {
        let dram: DynTier = Arc::new(MemTier::open(MemTierConfig::new(1 << 20))?);
        Hierarchy::builder("dram/nixl-file")
            .tier(dram)
            .tier(Arc::clone(&file))
            .build()
    });
    let m = factory
        .run(&["integrity_batches", "integrity_page_sizes", "overwrite"])
        .await
        .unwrap();
    eprintln!("{m:?}");
    assert!(m.top_evictions > 0, "{m:?}");
    assert!(m.served_below > 0, "{m:?}");
    assert!(m.promotions > 0, "{m:?}");
    assert!(m.copied_down > 0, "{m:?}");
}
