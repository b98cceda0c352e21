//! The whole conformance suite on NIXL FILE tiers whose file I/O is bounded (as on a network
//! or FUSE filesystem): reads land in staging buffers on threads a call may give up on. Owner
//! and shared access, NIXL and the syscall engine.
mod common;

mod owner {
    tier_tests::conformance_suite!(
        super::common::FileFactory::new(tier_nixl::PathModeChoice::On).bounded_io()
    );
}

mod shared {
    tier_tests::conformance_suite!(
        super::common::FileFactory::new(tier_nixl::PathModeChoice::On)
            .shared()
            .bounded_io()
    );
}

mod syscalls {
    tier_tests::conformance_suite!(
        super::common::FileFactory::new(tier_nixl::PathModeChoice::Off)
            .syscalls()
            .bounded_io()
    );
}
