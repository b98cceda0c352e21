//! kvtier core: the contract every storage tier implements.
//!
//! A tier stores fixed-content *pages* (blocks of attention KV cache) under validated
//! [`PageKey`]s. Every batch operation reports **per key**: a miss is not an error, and one
//! bad page never fails its neighbours. Tiers compose into hierarchies; they are proven by the
//! conformance suite in `tier-tests`.

pub mod config;
mod error;
mod evict;
mod hierarchy;
mod info;
mod key;
mod metrics;
mod order;
mod page;
mod stats;
mod tier;

pub use error::TierError;
pub use evict::{EvictedPage, EvictionCause, EvictionListener};
pub use hierarchy::{
    DemotionQueue, Hierarchy, HierarchyPolicy, HierarchyStats, LevelStats, WritePolicy,
};
pub use info::TierInfo;
pub use key::PageKey;
pub use metrics::serve_metrics;
pub use order::{OrderGuard, WriteOrder};
pub use page::{copied_bytes, CopiedBytes, Lookup, Page, PageBuf, PageData, ReadSlot};
pub use stats::{StatsRecorder, TierStats};
pub use tier::{GetResult, PutResult, RemoveResult, StorageTier};

/// Re-exported so tier implementations use the same `async_trait` as the trait itself.
pub use async_trait::async_trait;
/// Re-exported page payload type.
pub use bytes::Bytes;
