//! What every call takes from Python: its keys, its deadline, and per-key presence checks;
//! shared by `Store` and `CompletionQueue`.

use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyString;
use tier_core::{PageKey, StorageTier, TierError};
use tier_hierarchy::Hierarchy;

use crate::errors::to_py;

pub(crate) fn keys(py: Python<'_>, keys: &[String]) -> PyResult<Vec<PageKey>> {
    keys.iter()
        .map(|k| PageKey::new(k.as_str()).map_err(|e| to_py(py, &e)))
        .collect()
}

/// `keys` as strings: any iterable of them, but not one string (whose characters are not keys).
pub(crate) fn key_list(py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if keys.is_instance_of::<PyString>() {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "keys are an iterable of strings, not one string",
        ));
    }
    let _ = py;
    keys.try_iter()?.map(|k| k?.extract::<String>()).collect()
}

/// Presence checks a per-key answer runs at once.
const PRESENCE_CHECKS_AT_ONCE: usize = 64;

/// Whether each of `keys` is present, each asked on its own (at most
/// [`PRESENCE_CHECKS_AT_ONCE`] at a time), by `deadline` if one is given.
pub(crate) async fn each_present(
    hierarchy: &Hierarchy,
    keys: &[PageKey],
    deadline: Option<Instant>,
) -> Vec<Result<bool, TierError>> {
    use futures::StreamExt;
    futures::stream::iter(keys.iter().cloned().map(|key| async move {
        let one = std::slice::from_ref(&key);
        let found = match deadline {
            Some(d) => hierarchy.exists_by(one, d).await,
            None => hierarchy.exists(one).await,
        };
        found.map(|n| n == 1)
    }))
    .buffered(PRESENCE_CHECKS_AT_ONCE)
    .collect()
    .await
}

/// The deadline `timeout` seconds from now (`None`: no deadline). Not a finite number of
/// seconds at least 0: a `ValueError` naming it; too far to represent: no deadline.
pub(crate) fn deadline(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    let Some(secs) = timeout else {
        return Ok(None);
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(PyValueError::new_err(format!(
            "timeout must be a finite number of seconds >= 0, not {secs}"
        )));
    }
    Ok(Duration::try_from_secs_f64(secs)
        .ok()
        .and_then(|d| Instant::now().checked_add(d)))
}
