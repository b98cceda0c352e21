//! kvtier's composition: tiers stacked into a [`Hierarchy`] (lookup, promotion, write-through
//! or write-back, demotion), built in code with [`Hierarchy::builder`] or from a TOML or JSON
//! file through a [`config::Registry`] of kinds, with Prometheus metrics of every call
//! ([`Hierarchy::metrics_text`], [`serve_metrics`]).
//!
//! The contract every tier implements lives in `tier-core`; this crate names no backend.

pub mod config;
mod health;
mod hierarchy;
mod metrics;
mod opening;
pub mod sealed;

pub use health::{HealthPolicy, TierHealth, TierState};
pub use hierarchy::{
    Hierarchy, HierarchyBuilder, HierarchyPolicy, HierarchyStats, LevelStats, WritePolicy,
};
pub use metrics::serve_metrics;

use tier_core::{
    EvictedPage, EvictionListener, GetResult, Lookup, Page, PageData, PageKey, PutResult, ReadSlot,
    RemoveResult, StatsRecorder, StorageTier, TierError, TierInfo, TierStats,
};
