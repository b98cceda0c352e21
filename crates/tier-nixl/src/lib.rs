//! kvtier tiers on NVIDIA NIXL.

// Link nixl-sys's library (its C API forwarders) even though only raw symbols are called.
extern crate nixl_sys;

pub mod file;
pub mod nixl;
pub mod runtime;
mod staging;

pub use file::{
    DirectIo, FileMode, FilePlugin, NixlFileConfig, NixlFileTier, PathModeChoice, BUCKETS,
};
