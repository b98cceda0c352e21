//! The conformance suite on NIXL FILE tiers in shared access: the folders are the index, and
//! a bounded tier keeps the folders' capacity through the fleet's usage file and lease.
mod common;
tier_tests::conformance_suite!(common::FileFactory::new(tier_nixl::PathModeChoice::On).shared());
