//! [`ObjectTierConfig`]: an object tier's settings.

use std::time::Duration;

use tier_policy::PolicyKind;

use crate::SharedPrefix;

/// Whether a bounded tier's capacity is its own or its prefix's (in config files: `access`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefixAccess {
    /// This process bounds what it stored and found at open, by its `policy`.
    #[default]
    Private,
    /// Many nodes write the prefix: the capacity is the prefix's, one node evicts at a time
    /// (a lease object taken with conditional puts), victims by age of last write.
    Shared,
}

/// Configuration of an [`ObjectTier`](crate::ObjectTier).
#[derive(Debug, Clone)]
pub struct ObjectTierConfig {
    /// Instance name.
    pub name: String,
    /// Namespace: `/`-separated parts of `[A-Za-z0-9._-]`, none `.` or `..`.
    pub prefix: String,
    /// Requests in flight per batch.
    pub concurrency: usize,
    /// Hard bound on each request (on top of the store's own retries).
    pub op_timeout: Duration,
    /// Pages larger than this are uploaded in parts.
    pub multipart_threshold: usize,
    /// Largest page accepted.
    pub max_page_bytes: usize,
    /// Write with `PutMode::Create`: the first complete page of a key wins.
    pub create_only: bool,
    /// Bytes of pages the tier holds under its prefix; beyond it, `policy` evicts. `None`:
    /// unbounded.
    pub capacity_bytes: Option<u64>,
    /// Which pages go first when the capacity is reached (any but TinyLFU, which is moka's).
    /// A shared prefix evicts the objects written longest ago instead.
    pub policy: PolicyKind,
    /// Whether the capacity is this process's or the prefix's.
    pub access: PrefixAccess,
    /// Lease, watermark and listing period of a shared prefix.
    pub shared: SharedPrefix,
}

impl ObjectTierConfig {
    /// Defaults under `prefix`.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            name: "object".into(),
            prefix: prefix.into(),
            concurrency: 16,
            op_timeout: Duration::from_secs(30),
            multipart_threshold: 16 << 20,
            max_page_bytes: 256 << 20,
            create_only: false,
            capacity_bytes: None,
            policy: PolicyKind::Lru,
            access: PrefixAccess::Private,
            shared: SharedPrefix::default(),
        }
    }
}
