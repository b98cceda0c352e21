//! kvtier core: the contract every storage tier implements.
//!
//! A tier stores fixed-content *pages* (blocks of attention KV cache) under validated
//! [`PageKey`]s. Every batch operation reports **per key**: a miss is not an error, and one
//! bad page never fails its neighbours. This crate is the contract only: it names no backend,
//! no config format and no transport. Tiers compose into hierarchies in `tier-hierarchy`; they
//! are proven by the conformance suite in `tier-tests`.

mod error;
mod evict;
mod info;
mod key;
mod order;
mod page;
mod read_slot;
mod stats;
mod tier;

pub use error::TierError;
pub use evict::{EvictedPage, EvictionCause, EvictionListener};
pub use info::TierInfo;
pub use key::PageKey;
pub use order::{OrderGuard, WriteOrder};
pub use page::{copied_bytes, CopiedBytes, Page, PageData};
pub use read_slot::{Lookup, PageBuf, ReadSlot};
pub use stats::{StatsRecorder, TierStats};
pub use tier::{GetResult, PutResult, RemoveResult, StorageTier};

/// Re-exported so tier implementations use the same `async_trait` as the trait itself.
pub use async_trait::async_trait;
/// Re-exported page payload type.
pub use bytes::Bytes;
