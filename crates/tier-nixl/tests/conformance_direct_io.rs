//! The whole conformance suite on the real NIXL runtime with O_DIRECT required (aligned staging).
mod common;
tier_tests::conformance_suite!(common::FileFactory::new(tier_nixl::PathModeChoice::On).direct());
