//! [`OpenHierarchy`]: the hierarchy a `Store` or a `CompletionQueue` calls until it is closed.

use std::sync::{Arc, RwLock};

use pyo3::prelude::*;
use tier_core::TierError;
use tier_hierarchy::Hierarchy;

use crate::errors::to_py;

/// A hierarchy held until closed. Each call takes its own reference for as long as it runs;
/// closing lets go of this one, so the tiers (their folders' locks, registrations, threads)
/// are released once no running call and no other holder uses them.
pub(crate) struct OpenHierarchy {
    held: RwLock<Option<Arc<Hierarchy>>>,
    /// What is closed, for the error of a call after it.
    what: &'static str,
}

impl OpenHierarchy {
    pub fn new(hierarchy: Arc<Hierarchy>, what: &'static str) -> Self {
        Self {
            held: RwLock::new(Some(hierarchy)),
            what,
        }
    }

    /// The hierarchy, for one call; `Unavailable` once closed.
    pub fn get(&self, py: Python<'_>) -> PyResult<Arc<Hierarchy>> {
        self.held
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| {
                to_py(
                    py,
                    &TierError::Unavailable(format!("the {} is closed", self.what)),
                )
            })
    }

    /// Lets go of the hierarchy; `None` if it was already.
    pub fn take(&self) -> Option<Arc<Hierarchy>> {
        self.held.write().unwrap_or_else(|e| e.into_inner()).take()
    }
}
