//! The whole conformance suite on the NIXL FILE tier (syscall engine) under each eviction
//! policy but `auto` (the default, which every other FILE suite runs: `FileFactory` defaults to
//! it) and TinyLFU (DRAM only).
mod common;

macro_rules! per_policy {
    ($($module:ident: $policy:ident),* $(,)?) => {
        $(mod $module {
            tier_tests::conformance_suite!(
                super::common::FileFactory::new(tier_nixl::PathModeChoice::Off)
                    .syscalls()
                    .policy(tier_policy::PolicyKind::$policy)
            );
        })*
    };
}

per_policy!(lru: Lru, radix: Radix, sieve: Sieve, s3fifo: S3fifo, arc: Arc, prefix: Prefix, lfu: Lfu, sampled: Sampled);
