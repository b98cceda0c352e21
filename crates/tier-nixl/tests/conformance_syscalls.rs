//! The whole conformance suite on the NIXL FILE tier with the syscall engine (pread/pwrite by
//! the tier, no NIXL transfer), buffered and with O_DIRECT required.
mod common;

mod buffered {
    tier_tests::conformance_suite!(
        super::common::FileFactory::new(tier_nixl::PathModeChoice::Off).syscalls()
    );
}

mod direct {
    tier_tests::conformance_suite!(
        super::common::FileFactory::new(tier_nixl::PathModeChoice::Off)
            .syscalls()
            .direct()
    );
}
