/// What a tier is and what it can do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierInfo {
    /// Instance name (from config), for logs and stats.
    pub name: String,
    /// Backend kind, e.g. `"mem"` or `"nixl-file"`.
    pub kind: String,
    /// Byte capacity, if the tier is bounded.
    pub capacity_bytes: Option<u64>,
    /// Largest page the tier accepts, if limited.
    pub max_page_bytes: Option<usize>,
    /// Whether pages survive dropping and reopening the tier, once [`flush`] has returned.
    ///
    /// [`flush`]: crate::StorageTier::flush
    pub persistent: bool,
}

impl TierInfo {
    /// Whether the tier has a byte capacity it enforces.
    pub fn bounded(&self) -> bool {
        self.capacity_bytes.is_some()
    }
}
