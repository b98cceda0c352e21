//! The whole conformance suite on the NIXL OBJ tier, against a real S3 server (s3s-fs on
//! loopback) and the real NIXL runtime.

mod common;

tier_tests::conformance_suite!(crate::common::ObjFactory::new());
