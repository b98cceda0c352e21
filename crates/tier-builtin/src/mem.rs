//! The `mem` kind: a DRAM tier ([`tier_mem::MemTier`]).
//!
//! ```toml
//! [[tiers]]
//! kind = "mem"
//! capacity = "8GiB"      # required
//! policy = "prefix"      # auto (the default; lru with ttl or tti), lru, tinylfu, sieve,
//!                        # s3fifo, arc, prefix, radix, lfu or sampled
//! ttl = "10m"            # optional time to live (lru and tinylfu only)
//! tti = "2m"             # optional time to idle (lru and tinylfu only)
//! ```

use serde::Deserialize;
use tier_core::{EvictionListener, TierError};
use tier_hierarchy::config::{ByteSize, OpenFuture, Registry, TierContext, TierPlan, TimeSpan};
use tier_mem::{MemTier, MemTierConfig, PolicyKind};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemParams {
    capacity: ByteSize,
    policy: Option<PolicyKind>,
    ttl: Option<TimeSpan>,
    tti: Option<TimeSpan>,
}

fn to_config(name: &str, p: MemParams) -> MemTierConfig {
    MemTierConfig {
        name: name.to_owned(),
        policy: p.policy,
        ttl: p.ttl.map(|t| t.0),
        tti: p.tti.map(|t| t.0),
        ..MemTierConfig::new(p.capacity.0)
    }
}

struct MemPlan(MemTierConfig);

impl TierPlan for MemPlan {
    fn describe(&self) -> String {
        let c = &self.0;
        let mut out = format!(
            "mem: capacity {}, policy {}",
            ByteSize(c.capacity_bytes),
            c.resolved_policy()
        );
        if let Some(ttl) = c.ttl {
            out += &format!(", ttl {ttl:?}");
        }
        if let Some(tti) = c.tti {
            out += &format!(", tti {tti:?}");
        }
        out
    }

    fn evicts(&self) -> bool {
        true
    }

    fn open(self: Box<Self>, on_evict: Option<EvictionListener>) -> OpenFuture {
        let config = MemTierConfig { on_evict, ..self.0 };
        Box::pin(async move { Ok(std::sync::Arc::new(MemTier::open(config)?) as _) })
    }
}

/// Registers the `mem` kind.
pub fn register(registry: &mut Registry) {
    registry.register("mem", |ctx: &TierContext| {
        let config = to_config(&ctx.name, ctx.params()?);
        config.validate().map_err(|e| crate::field_error(ctx, e))?;
        if let Some(total) = machine_memory() {
            if config.capacity_bytes > total {
                return Err(TierError::config(
                    format!("{}.capacity", ctx.field),
                    format!(
                        "{} is more than this machine's memory ({})",
                        ByteSize(config.capacity_bytes),
                        ByteSize(total)
                    ),
                ));
            }
        }
        Ok(Box::new(MemPlan(config)) as Box<dyn TierPlan>)
    });
}

/// Physical memory of this machine (`MemTotal` in `/proc/meminfo`), if known.
fn machine_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}
