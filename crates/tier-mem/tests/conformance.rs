//! tier-mem passes the whole conformance suite, under every eviction policy.

use std::sync::Arc;

use tier_core::TierError;
use tier_mem::{MemTier, MemTierConfig, PolicyKind};
use tier_tests::suite::DynTier;
use tier_tests::TierFactory;

/// Fresh DRAM tiers under one policy: 256 MiB for the general cases, the asked bound for
/// capacity cases.
struct MemFactory(PolicyKind);

#[tier_core::async_trait]
impl TierFactory for MemFactory {
    async fn open(&self) -> Result<DynTier, TierError> {
        Ok(Arc::new(MemTier::open(MemTierConfig {
            policy: Some(self.0),
            ..MemTierConfig::new(256 << 20)
        })?))
    }

    async fn open_bounded(&self, capacity_bytes: u64) -> Option<Result<DynTier, TierError>> {
        Some(
            MemTier::open(MemTierConfig {
                policy: Some(self.0),
                ..MemTierConfig::new(capacity_bytes)
            })
            .map(|t| Arc::new(t) as DynTier),
        )
    }
}

macro_rules! per_policy {
    ($($module:ident: $policy:ident),* $(,)?) => {
        $(mod $module {
            use super::*;
            tier_tests::conformance_suite!(MemFactory(PolicyKind::$policy));
        })*
        /// Every policy has its module above.
        #[test]
        fn every_policy_runs_the_suite() {
            assert_eq!([$(PolicyKind::$policy),*], PolicyKind::ALL);
        }
    };
}

per_policy!(lru: Lru, tinylfu: Tinylfu, sieve: Sieve, s3fifo: S3fifo, arc: Arc, prefix: Prefix, radix: Radix, lfu: Lfu, sampled: Sampled, auto: Auto);
