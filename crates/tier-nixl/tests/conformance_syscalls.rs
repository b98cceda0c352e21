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

/// A tier on the syscalls engine moves every byte itself: it creates no NIXL agent and maps
/// none of NIXL's libraries (run alone in a process, so nothing else loaded them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_syscalls_tier_loads_no_nixl() {
    if !tier_tests::fd::in_own_process() {
        return;
    }
    let dir = tempfile::tempdir().expect("a temp folder");
    let before = tier_tests::fd::resident_bytes().expect("the resident bytes");
    let mut config = tier_nixl::NixlFileConfig::new([dir.path()]);
    config.engine = tier_nixl::FileEngine::Syscalls;
    let tier = tier_nixl::NixlFileTier::open(config).await.expect("opens");
    tier.opened().await;
    let grown = tier_tests::fd::resident_bytes()
        .expect("the resident bytes")
        .saturating_sub(before);
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    let nixl: Vec<&str> = maps
        .lines()
        .filter(|l| l.contains("nixl"))
        .filter_map(|l| l.split_whitespace().nth(5))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    println!(
        "an empty syscalls-engine folder's open grew RSS by {:.1} MiB; NIXL files mapped: {}",
        grown as f64 / (1 << 20) as f64,
        nixl.len()
    );
    assert!(
        nixl.is_empty(),
        "{} NIXL files mapped by a syscalls tier, among them {:?}",
        nixl.len(),
        &nixl[..nixl.len().min(3)]
    );
    // (NIXL's agents and libraries took 42 MiB here.)
    assert!(
        grown < 16 << 20,
        "an empty syscalls tier's open grew RSS by {grown} bytes"
    );
    drop(tier);
}
