//! The `mem` kind for config files.
//!
//! ```toml
//! [[tiers]]
//! kind = "mem"
//! capacity = "8GiB"      # required
//! policy = "prefix"      # auto (the default; lru with ttl or tti), lru, tinylfu, sieve,
//!                        # s3fifo, arc, prefix or radix
//! ttl = "10m"            # optional time to live (lru and tinylfu only)
//! tti = "2m"             # optional time to idle (lru and tinylfu only)
//! ```

use serde::Deserialize;
use tier_core::config::{ByteSize, OpenFuture, Registry, TierContext, TierPlan, TimeSpan};
use tier_core::{EvictionListener, TierError};

use crate::{resolve_policy, MemTier, PolicyKind};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemParams {
    capacity: ByteSize,
    policy: Option<PolicyKind>,
    ttl: Option<TimeSpan>,
    tti: Option<TimeSpan>,
}

struct MemPlan {
    name: String,
    params: MemParams,
}

impl TierPlan for MemPlan {
    fn describe(&self) -> String {
        let p = &self.params;
        let policy = resolve_policy(p.policy, p.ttl.is_some() || p.tti.is_some());
        let mut out = format!("mem: capacity {}, policy {policy}", p.capacity);
        if let Some(ttl) = p.ttl {
            out += &format!(", ttl {:?}", ttl.0);
        }
        if let Some(tti) = p.tti {
            out += &format!(", tti {:?}", tti.0);
        }
        out
    }

    fn evicts(&self) -> bool {
        true
    }

    fn open(self: Box<Self>, on_evict: Option<EvictionListener>) -> OpenFuture {
        Box::pin(async move {
            let p = self.params;
            let mut builder = MemTier::builder(p.capacity.0).name(self.name);
            if let Some(policy) = p.policy {
                builder = builder.policy(policy);
            }
            if let Some(ttl) = p.ttl {
                builder = builder.time_to_live(ttl.0);
            }
            if let Some(tti) = p.tti {
                builder = builder.time_to_idle(tti.0);
            }
            if let Some(listener) = on_evict {
                builder = builder.on_evict(listener);
            }
            Ok(std::sync::Arc::new(builder.build()?) as _)
        })
    }
}

/// Registers the `mem` kind.
pub fn register(registry: &mut Registry) {
    registry.register("mem", |ctx: &TierContext| {
        let params: MemParams = ctx.params()?;
        if params.capacity.0 == 0 {
            return Err(TierError::config(
                format!("{}.capacity", ctx.field),
                "must be at least 1 byte",
            ));
        }
        let expiring = [("ttl", params.ttl), ("tti", params.tti)]
            .into_iter()
            .find_map(|(f, d)| d.map(|_| f));
        let policy = resolve_policy(params.policy, expiring.is_some());
        if let (Some(f), false) = (
            expiring,
            matches!(policy, PolicyKind::Lru | PolicyKind::Tinylfu),
        ) {
            return Err(TierError::config(
                format!("{}.{f}", ctx.field),
                format!(
                    "expiry needs policy \"lru\" or \"tinylfu\"; policy \"{policy}\" has none",
                ),
            ));
        }
        if let Some(total) = machine_memory() {
            if params.capacity.0 > total {
                return Err(TierError::config(
                    format!("{}.capacity", ctx.field),
                    format!(
                        "{} is more than this machine's memory ({})",
                        params.capacity,
                        ByteSize(total)
                    ),
                ));
            }
        }
        Ok(Box::new(MemPlan {
            name: ctx.name.clone(),
            params,
        }) as Box<dyn TierPlan>)
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
