//! The `kvtier._kvtier` extension module: `Store` and the exception tree. The
//! Python package around it (`python/kvtier`) adds config loading and engine adapters.

mod buffers;
mod calls;
mod completions;
mod config;
mod errors;
mod handle;
mod runtime;
mod store;

use pyo3::prelude::*;

#[pymodule]
fn _kvtier(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // kvtier's log records (warnings and up) go to Python's `logging`, under loggers named
    // after the Rust modules (`tier_core.metrics`, ...). Another extension may have set the
    // process's logger first; then that one receives them.
    let _ = pyo3_log::Logger::new(m.py(), pyo3_log::Caching::LoggersAndLevels)?
        .filter(log::LevelFilter::Info)
        .install();
    m.add_class::<store::Store>()?;
    // Stores still open when the interpreter exits are closed first: their queued pages
    // reach the lower tiers (bounded by each hierarchy's `flush_timeout`) or are logged.
    let close_all = wrap_pyfunction!(store::close_all_at_exit, m)?;
    m.py()
        .import("atexit")?
        .call_method1("register", (close_all,))?;
    m.add_class::<completions::CompletionQueue>()?;
    m.add_function(wrap_pyfunction!(config::config_json, m)?)?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
