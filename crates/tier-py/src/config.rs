//! Config files read for the Python package by the parser `Store` uses.

use pyo3::prelude::*;

use crate::errors::config_error;

/// The config in `text` (JSON when `path` ends in `.json`, else TOML) as JSON text; a
/// `ConfigError` naming `path` where it does not parse. Python needs no TOML reader of its own.
#[pyfunction]
pub fn config_json(py: Python<'_>, text: &str, path: &str) -> PyResult<String> {
    let parsed: Result<serde_json::Value, String> = if path.ends_with(".json") {
        serde_json::from_str(text).map_err(|e| e.to_string())
    } else {
        toml::from_str(text).map_err(|e| e.to_string())
    };
    parsed
        .map(|v| v.to_string())
        .map_err(|e| config_error(py, format!("kvtier config {path}: {e}")))
}
