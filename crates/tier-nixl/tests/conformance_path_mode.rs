//! The whole conformance suite on the real NIXL runtime, path mode.
mod common;
tier_tests::conformance_suite!(common::FileFactory::new(tier_nixl::PathModeChoice::On));
