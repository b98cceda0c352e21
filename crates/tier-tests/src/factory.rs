//! What the suites run against: a tier handle, the [`TierFactory`] that opens tiers for one
//! conformance test, and the [`S3TierFactory`] that opens S3-backed tiers on an [`S3Target`]
//! for the outage cases.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tier_core::{async_trait, StorageTier, TierError};

use crate::s3::S3Server;

/// A shared tier handle.
pub type DynTier = Arc<dyn StorageTier>;

/// Opens the tiers a suite run checks. One factory serves one test: repeated [`open`] calls
/// must reach the same storage, so a persistent tier's pages survive a drop and a reopen.
///
/// [`open`]: TierFactory::open
#[async_trait]
pub trait TierFactory: Send + Sync {
    /// Opens the tier under test.
    async fn open(&self) -> Result<DynTier, TierError>;

    /// Opens a tier of the same kind bounded to `capacity_bytes`, on fresh storage; `None` if
    /// the kind has no byte bound.
    async fn open_bounded(&self, _capacity_bytes: u64) -> Option<Result<DynTier, TierError>> {
        None
    }

    /// The folder the tier's files must stay inside, if it keeps files.
    fn root(&self) -> Option<PathBuf> {
        None
    }

    /// The names the tier's storage holds outside the place the tier owns, where the factory
    /// can list them (an object tier: its bucket's names not under its prefix); `None` if it
    /// cannot. The hostile-keys case compares them around its puts: a tier writes only under
    /// its own prefix.
    async fn names_outside(&self) -> Option<Result<BTreeSet<String>, String>> {
        None
    }

    /// Descriptors the tier may legitimately keep open after a call, such as a pool of idle
    /// network connections (0 for tiers that hold none). The fd-leak case then runs enough
    /// rounds that a per-call leak exceeds it.
    fn fd_slack(&self) -> usize {
        0
    }

    /// Makes the storage under the last opened tier fail its I/O (for example by removing its
    /// folders), so the fd-leak case can count descriptors around failing calls. Returns what
    /// it did, or `None` if this kind cannot be made to fail.
    async fn break_storage(&self) -> Option<String> {
        None
    }
}

/// Where a tier under test reaches S3, and the bound on each of its calls.
#[derive(Debug, Clone)]
pub struct S3Target {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// Bucket.
    pub bucket: String,
    /// Access key.
    pub access_key: String,
    /// Secret key.
    pub secret_key: String,
    /// The tier's namespace.
    pub prefix: String,
    /// Every call of the tier must end within this (plus one second of slack).
    pub bound: Duration,
}

impl S3Target {
    /// The target of `server`'s bucket under `prefix`, each call bounded by 5 s.
    pub fn of(server: &S3Server, prefix: &str) -> Self {
        Self {
            endpoint: server.endpoint(),
            bucket: server.bucket.clone(),
            access_key: server.access_key.clone(),
            secret_key: server.secret_key.clone(),
            prefix: prefix.into(),
            bound: Duration::from_secs(5),
        }
    }
}

/// Opens S3-backed tiers for the outage cases.
#[async_trait]
pub trait S3TierFactory: Send + Sync {
    /// A tier on `target`, each call bounded by `target.bound` (give its client short request
    /// timeouts and few retries).
    async fn open(&self, target: &S3Target) -> Result<DynTier, TierError>;
}
