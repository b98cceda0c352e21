//! tier-mem passes the whole conformance suite.

use std::sync::Arc;

use tier_core::TierError;
use tier_mem::MemTier;
use tier_tests::suite::DynTier;
use tier_tests::TierFactory;

/// Fresh DRAM tiers: 256 MiB for the general cases, the asked bound for capacity cases.
struct MemFactory;

#[tier_core::async_trait]
impl TierFactory for MemFactory {
    async fn open(&self) -> Result<DynTier, TierError> {
        Ok(Arc::new(MemTier::builder(256 << 20).build()?))
    }

    async fn open_bounded(&self, capacity_bytes: u64) -> Option<Result<DynTier, TierError>> {
        Some(
            MemTier::builder(capacity_bytes)
                .build()
                .map(|t| Arc::new(t) as DynTier),
        )
    }
}

tier_tests::conformance_suite!(MemFactory);
