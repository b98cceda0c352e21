use std::sync::Arc;

use bytes::Bytes;

use crate::PageKey;

/// Why a bounded tier let a page go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionCause {
    /// Room was needed for other pages.
    Capacity,
    /// The page outlived its time-to-live or time-to-idle.
    Expired,
}

/// A page a tier evicted, handed to a listener (typically to demote it to the next tier).
#[derive(Debug, Clone)]
pub struct EvictedPage {
    /// The page's key.
    pub key: PageKey,
    /// The page's bytes.
    pub data: Bytes,
    /// Why it was evicted.
    pub cause: EvictionCause,
}

/// Receives evicted pages. Called synchronously from the evicting tier: it must be quick, must
/// not block (push into a bounded queue and return) and must not call the tier.
///
/// A tier calls it no later than its own calls can miss the page: a `get`, `exists` or
/// `remove` that does not find an evicted page returns only after the listener has returned
/// for it. A hierarchy relies on that to find a page on its way down, and to count an
/// eviction that races a remove as part of the remove rather than carry it down after.
pub type EvictionListener = Arc<dyn Fn(EvictedPage) + Send + Sync>;
