//! [`OpenHierarchy`]: the hierarchy a `Store` or a `CompletionQueue` calls until it is closed.

use std::sync::{Arc, RwLock};

use pyo3::prelude::*;
use tier_core::TierError;
use tier_hierarchy::Hierarchy;

use crate::errors::to_py;

/// A hierarchy held until closed. Each call takes its own reference for as long as it runs;
/// closing lets go of this one, so the tiers (their folders' locks, registrations, threads)
/// are released once no running call and no other holder uses them.
///
/// A hierarchy belongs to the process that opened it: in a child forked from that process its
/// tasks and threads do not exist, so every call there fails at once naming fork, and the
/// child's close or drop lets go of it without touching it.
pub(crate) struct OpenHierarchy {
    held: RwLock<Option<Arc<Hierarchy>>>,
    /// What is closed, for the error of a call after it.
    what: &'static str,
    /// The process that opened it.
    opened_in: u32,
}

impl OpenHierarchy {
    pub fn new(hierarchy: Arc<Hierarchy>, what: &'static str) -> Self {
        Self {
            held: RwLock::new(Some(hierarchy)),
            what,
            opened_in: std::process::id(),
        }
    }

    /// Whether this process is a child forked after the hierarchy was opened.
    pub fn forked(&self) -> bool {
        self.opened_in != std::process::id()
    }

    /// The hierarchy, for one call; `Unavailable` once closed, or in a forked child.
    pub fn get(&self, py: Python<'_>) -> PyResult<Arc<Hierarchy>> {
        if self.forked() {
            return Err(to_py(
                py,
                &TierError::Unavailable(format!(
                    "this {what} was opened in process {parent}, which forked this one: a \
                     {what} does not cross a fork (its threads stay in the parent); open a new \
                     Store in the child, or start workers with the 'spawn' method",
                    what = self.what,
                    parent = self.opened_in,
                )),
            ));
        }
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

    /// Lets go of the hierarchy; `None` if it was already. In a forked child it is let go of
    /// without being dropped (dropping would wait on the parent's threads) and `None` returned.
    pub fn take(&self) -> Option<Arc<Hierarchy>> {
        let taken = self.held.write().unwrap_or_else(|e| e.into_inner()).take();
        if self.forked() {
            std::mem::forget(taken);
            return None;
        }
        taken
    }
}
