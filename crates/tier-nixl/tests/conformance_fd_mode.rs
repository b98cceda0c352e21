//! The whole conformance suite on the real NIXL runtime, fd mode (forced by config).
mod common;
tier_tests::conformance_suite!(common::FileFactory::new(tier_nixl::PathModeChoice::Off));
