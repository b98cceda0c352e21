//! The whole conformance suite on the real NIXL runtime, path mode: with the default
//! durability, and with `durability = "power"` (synchronous writes, folders synced).
mod common;
tier_tests::conformance_suite!(common::FileFactory::new(tier_nixl::PathModeChoice::On));

mod power {
    tier_tests::conformance_suite!(
        super::common::FileFactory::new(tier_nixl::PathModeChoice::On)
            .durability(tier_nixl::Durability::Power)
    );
}
