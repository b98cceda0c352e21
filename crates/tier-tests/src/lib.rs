//! The kvtier conformance suite: the behaviour every [`StorageTier`](tier_core::StorageTier)
//! must show, as a library any crate's tests call.
//!
//! Give the suite a [`TierFactory`] and it opens fresh tiers and checks them: per-page
//! integrity (every byte of hundreds of distinct pages), open file descriptors around every
//! operation kind, per-key batch outcomes, prefix `exists`, overwrite, remove, clear,
//! concurrent writers, bad input and hostile keys, capacity and persistence, and the tier
//! under a hierarchy while a fault injector makes it fail.
//!
//! ```text
//! tier_tests::conformance_suite!(MyFactory::new());
//! ```
//! expands to one `#[test]` per case. The fd-leak case counts the whole process's descriptors,
//! so run suites with `cargo nextest` (a process per test) or keep them in their own test
//! binary; cases of one binary serialise around it.
//!
//! S3-backed tiers also run [`s3_outage_suite!`] (see [`s3_faults`]).
//!
//! The suite proves it can fail: [`broken`] holds deliberately faulty tiers and this crate's
//! own tests assert the suite rejects each of them.

pub mod broken;
pub mod cancel;
pub mod content;
pub mod explore;
pub mod factory;
pub mod faulty;
pub mod fd;
pub mod freeze;
pub mod gluster;
pub mod history;
pub mod model;
pub mod movement;
pub mod outage;
pub mod rng;
pub mod s3;
pub mod s3_faults;
pub mod suite;

pub use suite::{read_page, Failure, TierFactory};

/// Whether a call that must answer within `bound` did, with room for a loaded machine: twice
/// the bound plus 5 s. A call that is not bounded waits far longer (object_store retries for
/// minutes, an unanswered transfer for ever), so this still tells a bounded call from a hang.
pub fn answered_within(took: std::time::Duration, bound: std::time::Duration) -> bool {
    took <= bound * 2 + std::time::Duration::from_secs(5)
}

/// Calls `$callback!` with the name of every conformance case: the one list both
/// [`suite::CASES`] and [`conformance_suite!`] are made from.
#[macro_export]
macro_rules! with_cases {
    ($callback:path $(, $arg:expr)?) => {
        $callback! {
            $($arg;)?
            integrity_batches,
            integrity_page_sizes,
            integrity_regions,
            fd_leak,
            partial_batch,
            exists_prefix,
            overwrite,
            remove,
            clear,
            concurrent_writers,
            bad_input,
            hostile_keys,
            capacity_bound,
            persistence,
            stats_count,
            hierarchy_over_faulty_tier,
            hierarchy_lower_outage,
            histories,
            cancellation,
        }
    };
}

/// Expands to one `#[test]` per conformance case, each opening tiers from a fresh `$factory`
/// (an expression evaluated once per test).
#[macro_export]
macro_rules! conformance_suite {
    ($factory:expr) => {
        $crate::with_cases!($crate::conformance_tests, $factory);
    };
}

/// One `#[test]` per case named (used by [`conformance_suite!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let factory = $factory;
                $crate::suite::run_case(stringify!($case), &factory);
            }
        )*
    };
}
