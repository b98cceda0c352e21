//! kvtier's exceptions: one small tree under `kvtier.KvtierError`, each carrying the page key
//! it concerns (or `None`) as `.key`.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use tier_core::TierError;

create_exception!(
    kvtier,
    KvtierError,
    PyException,
    "Base of every kvtier error."
);
create_exception!(
    kvtier,
    ConfigError,
    KvtierError,
    "A configuration kvtier refuses."
);
create_exception!(
    kvtier,
    InvalidKey,
    KvtierError,
    "A page key kvtier or a tier refuses."
);
create_exception!(
    kvtier,
    InvalidPage,
    KvtierError,
    "A page or buffer of the wrong size (empty, too large, another length than stored)."
);
create_exception!(
    kvtier,
    InvalidBuffer,
    KvtierError,
    "A buffer kvtier cannot use: read-only where it must write, not contiguous, overlapping."
);
create_exception!(
    kvtier,
    Unavailable,
    KvtierError,
    "Storage that failed or did not answer in time (I/O, backend, timeout, closed store)."
);

/// The Python exception for a tier error, with `.key` set.
pub fn to_py(py: Python<'_>, e: &TierError) -> PyErr {
    let message = e.to_string();
    let err = match e {
        TierError::Config { .. } => ConfigError::new_err(message),
        TierError::InvalidKey { .. } | TierError::KeyRejected { .. } => {
            InvalidKey::new_err(message)
        }
        TierError::LengthMismatch { .. }
        | TierError::PageTooLarge { .. }
        | TierError::EmptyPage { .. }
        | TierError::Unaligned { .. }
        | TierError::BadBatch(_) => InvalidPage::new_err(message),
        _ => Unavailable::new_err(message),
    };
    let key = e.key().map(|k| k.as_str().to_owned());
    // Setting an attribute on a fresh exception instance cannot fail in practice; if it did,
    // the exception is still raised, without `.key`.
    let _ = err.value(py).setattr("key", key);
    err
}

/// A buffer problem, with `.key` set.
pub fn buffer_error(py: Python<'_>, key: Option<&str>, message: String) -> PyErr {
    let err = InvalidBuffer::new_err(message);
    let _ = err.value(py).setattr("key", key);
    err
}

/// Registers the exception classes in the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("KvtierError", py.get_type::<KvtierError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("InvalidKey", py.get_type::<InvalidKey>())?;
    m.add("InvalidPage", py.get_type::<InvalidPage>())?;
    m.add("InvalidBuffer", py.get_type::<InvalidBuffer>())?;
    m.add("Unavailable", py.get_type::<Unavailable>())?;
    Ok(())
}
