//! A backend written outside kvtier's crates: registered by kind, named in a config file,
//! composed under DRAM, and validated by the conformance suite.
//!
//! `cargo run --example custom_tier` (exits non-zero if any conformance case fails)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use tier_core::{
    async_trait, Bytes, EvictionListener, GetResult, Page, PageKey, PutResult, ReadSlot,
    RemoveResult, StatsRecorder, StorageTier, TierError, TierInfo, TierStats,
};
use tier_hierarchy::config::{HierarchyConfig, OpenFuture, Registry, TierContext, TierPlan};
use tier_tests::suite::{run_all, DynTier};
use tier_tests::TierFactory;

/// Pages spread over `shards` mutex-guarded maps, so concurrent callers rarely contend.
struct ShardedMapTier {
    name: String,
    shards: Vec<Mutex<HashMap<PageKey, Bytes>>>,
    stats: StatsRecorder,
}

impl ShardedMapTier {
    fn new(name: &str, shards: usize) -> Self {
        Self {
            name: name.into(),
            shards: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
            stats: StatsRecorder::default(),
        }
    }

    fn shard(&self, key: &PageKey) -> std::sync::MutexGuard<'_, HashMap<PageKey, Bytes>> {
        let h = key
            .as_str()
            .bytes()
            .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize));
        self.shards[h % self.shards.len()]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl StorageTier for ShardedMapTier {
    fn info(&self) -> TierInfo {
        TierInfo {
            name: self.name.clone(),
            kind: "sharded-map".into(),
            capacity_bytes: None,
            max_page_bytes: Some(16 << 20),
            persistent: false,
        }
    }

    fn stats(&self) -> TierStats {
        let resident = self
            .shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .values()
                    .map(|p| p.len() as u64)
                    .sum::<u64>()
            })
            .sum();
        self.stats.snapshot(Some(resident))
    }

    async fn put(&self, pages: &[Page<'_>]) -> Vec<PutResult> {
        pages
            .iter()
            .map(|p| {
                p.check_len(self.info().max_page_bytes)
                    .inspect_err(|_| self.stats.errors(1))?;
                self.shard(&p.key).insert(p.key.clone(), p.data.to_bytes());
                self.stats.put(p.data.len());
                Ok(())
            })
            .collect()
    }

    async fn get(&self, slots: &mut [ReadSlot<'_>]) -> Vec<GetResult> {
        slots
            .iter_mut()
            .map(|slot| {
                let page = self.shard(&slot.key).get(&slot.key).cloned();
                slot.answer(page.as_deref(), &self.stats)
            })
            .collect()
    }

    async fn exists(&self, keys: &[PageKey]) -> Result<usize, TierError> {
        Ok(keys
            .iter()
            .take_while(|k| self.shard(k).contains_key(*k))
            .count())
    }

    async fn remove(&self, keys: &[PageKey]) -> Vec<RemoveResult> {
        keys.iter()
            .map(|k| {
                let present = self.shard(k).remove(k).is_some();
                if present {
                    self.stats.removed();
                }
                Ok(present)
            })
            .collect()
    }

    async fn clear(&self) -> Result<(), TierError> {
        for shard in &self.shards {
            shard.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
        Ok(())
    }
}

/// Config parameters of the new kind.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Params {
    shards: usize,
}

struct Plan {
    name: String,
    shards: usize,
}

impl TierPlan for Plan {
    fn describe(&self) -> String {
        format!("sharded-map: {} shards", self.shards)
    }

    fn open(self: Box<Self>, _on_evict: Option<EvictionListener>) -> OpenFuture {
        Box::pin(async move { Ok(Arc::new(ShardedMapTier::new(&self.name, self.shards)) as _) })
    }
}

/// One call registers the kind.
fn register(registry: &mut Registry) {
    registry.register("sharded-map", |ctx: &TierContext| {
        let p: Params = ctx.params()?;
        Ok(Box::new(Plan {
            name: ctx.name.clone(),
            shards: p.shards,
        }) as Box<dyn TierPlan>)
    });
}

const CONFIG: &str = r#"
[hierarchy]
write = "write-through"

[[tiers]]
kind = "mem"
name = "dram"
capacity = "4MiB"

[[tiers]]
kind = "sharded-map"
name = "shards"
shards = 16
"#;

struct Factory;

#[async_trait]
impl TierFactory for Factory {
    async fn open(&self) -> Result<DynTier, TierError> {
        Ok(Arc::new(ShardedMapTier::new("suite", 8)))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut registry = tier_builtin::registry();
    register(&mut registry);
    let config = HierarchyConfig::from_toml(CONFIG)?;
    for (name, plan) in registry.plan(&config)? {
        println!("tier {name}: {}", plan.describe());
    }
    let hierarchy = registry.build(&config).await?;
    let pages: Vec<Page<'static>> = (0..256)
        .map(|i| {
            let key = PageKey::new(format!("{i:064x}")).expect("hex keys are valid");
            let data = tier_tests::content::page(&key, 1, 64 << 10);
            Page::new(key, data)
        })
        .collect();
    for r in hierarchy.put(&pages).await {
        r?;
    }
    hierarchy.flush().await?;
    let keys: Vec<PageKey> = pages.iter().map(|p| p.key.clone()).collect();
    println!(
        "stored 256 pages of 64 KiB through a 4 MiB DRAM tier; reusable prefix: {}",
        hierarchy.exists(&keys).await?
    );
    let s = hierarchy.hierarchy_stats();
    println!(
        "copied down {}, dram evictions {}",
        s.copied_down, s.levels[0].stats.evictions
    );
    hierarchy.close().await?;

    println!("conformance suite on sharded-map:");
    let mut failed = 0;
    for (case, verdict) in run_all(&Factory).await {
        match verdict {
            Ok(()) => println!("  ok    {case}"),
            Err(f) => {
                failed += 1;
                println!("  FAIL  {case}: {}", f.message);
            }
        }
    }
    if failed > 0 {
        return Err(format!("{failed} conformance cases failed").into());
    }
    Ok(())
}
