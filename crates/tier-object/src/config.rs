//! [`ObjectTierConfig`]: an object tier's settings.

use std::time::Duration;

use tier_policy::PolicyKind;

/// Configuration of an [`ObjectTier`].
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
    pub policy: PolicyKind,
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
        }
    }
}
