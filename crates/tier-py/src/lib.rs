//! The `kvtier._kvtier` extension module: [`store::Store`] and the exception tree. The
//! Python package around it (`python/kvtier`) adds config loading and engine adapters.

mod buffers;
mod errors;
mod store;

use pyo3::prelude::*;

#[pymodule]
fn _kvtier(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<store::Store>()?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
