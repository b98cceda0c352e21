//! kvtier's exceptions: one small tree under `kvtier.KvtierError`, each carrying the page key
//! it concerns (or `None`) as `.key`.

use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyTuple, PyType};
use tier_core::TierError;

/// kvtier's exception classes, made once per interpreter. Each subclasses the builtin that
/// matches it as well as `KvtierError`, so `except ValueError` and `except OSError` catch what
/// they should: `ConfigError`, `InvalidKey` and `InvalidPage` are `ValueError`s,
/// `InvalidBuffer` a `BufferError`, `Unavailable` an `OSError` and `Timeout` (an `Unavailable`)
/// a `TimeoutError`.
struct Classes {
    base: Py<PyType>,
    config: Py<PyType>,
    invalid_key: Py<PyType>,
    invalid_page: Py<PyType>,
    invalid_buffer: Py<PyType>,
    unavailable: Py<PyType>,
    timeout: Py<PyType>,
}

static CLASSES: GILOnceCell<Classes> = GILOnceCell::new();

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let builtins = py.import("builtins")?;
        let make = |name: &str, bases: Vec<Bound<'_, PyAny>>, doc: &str| -> PyResult<Py<PyType>> {
            let namespace = PyDict::new(py);
            namespace.set_item("__doc__", doc)?;
            namespace.set_item("__module__", "kvtier")?;
            let class = builtins
                .getattr("type")?
                .call1((name, PyTuple::new(py, bases)?, namespace))?;
            Ok(class.downcast_into::<PyType>()?.unbind())
        };
        let builtin = |name: &str| builtins.getattr(name);
        let base = make("KvtierError", vec![builtin("Exception")?], "Base of every kvtier error.")?;
        let with = |builtin_name: &str| -> PyResult<Vec<Bound<'_, PyAny>>> {
            Ok(vec![base.bind(py).clone().into_any(), builtin(builtin_name)?])
        };
        let unavailable = make(
            "Unavailable",
            with("OSError")?,
            "Storage that failed or did not answer in time (I/O, backend, timeout, closed store).",
        )?;
        let timeout = make(
            "Timeout",
            vec![unavailable.bind(py).clone().into_any(), builtin("TimeoutError")?],
            "Storage that did not answer within its bound.",
        )?;
        Ok(Classes {
            config: make("ConfigError", with("ValueError")?, "A configuration kvtier refuses.")?,
            invalid_key: make(
                "InvalidKey",
                with("ValueError")?,
                "A page key kvtier or a tier refuses.",
            )?,
            invalid_page: make(
                "InvalidPage",
                with("ValueError")?,
                "A page or buffer of the wrong size (empty, too large, another length than stored).",
            )?,
            invalid_buffer: make(
                "InvalidBuffer",
                with("BufferError")?,
                "A buffer kvtier cannot use: read-only where it must write, not contiguous, overlapping.",
            )?,
            unavailable,
            timeout,
            base,
        })
    })
}

/// Which of kvtier's exceptions.
#[derive(Clone, Copy)]
enum Kind {
    Config,
    InvalidKey,
    InvalidPage,
    InvalidBuffer,
    Unavailable,
    Timeout,
}

impl Classes {
    fn of(&self, kind: Kind) -> &Py<PyType> {
        match kind {
            Kind::Config => &self.config,
            Kind::InvalidKey => &self.invalid_key,
            Kind::InvalidPage => &self.invalid_page,
            Kind::InvalidBuffer => &self.invalid_buffer,
            Kind::Unavailable => &self.unavailable,
            Kind::Timeout => &self.timeout,
        }
    }
}

/// An exception of `kind` with `message` and `.key`.
fn raise(py: Python<'_>, kind: Kind, key: Option<&str>, message: String) -> PyErr {
    let err = match classes(py) {
        Ok(c) => PyErr::from_type(c.of(kind).bind(py).clone(), message),
        Err(e) => return e,
    };
    // Setting an attribute on a fresh exception instance cannot fail in practice; if it did,
    // the exception is still raised, without `.key`.
    let _ = err.value(py).setattr("key", key);
    err
}

/// The Python exception for a tier error, with `.key` set.
pub fn to_py(py: Python<'_>, e: &TierError) -> PyErr {
    let kind = match e {
        TierError::Config { .. } => Kind::Config,
        TierError::InvalidKey { .. } | TierError::KeyRejected { .. } => Kind::InvalidKey,
        TierError::LengthMismatch { .. }
        | TierError::PageTooLarge { .. }
        | TierError::EmptyPage { .. }
        | TierError::Unaligned { .. }
        | TierError::BadBatch(_) => Kind::InvalidPage,
        TierError::Timeout { .. } => Kind::Timeout,
        _ => Kind::Unavailable,
    };
    let key = e.key().map(|k| k.as_str().to_owned());
    raise(py, kind, key.as_deref(), e.to_string())
}

/// A buffer problem, with `.key` set.
pub fn buffer_error(py: Python<'_>, key: Option<&str>, message: String) -> PyErr {
    raise(py, Kind::InvalidBuffer, key, message)
}

/// A configuration refused, with no key.
pub fn config_error(py: Python<'_>, message: String) -> PyErr {
    raise(py, Kind::Config, None, message)
}

/// Registers the exception classes in the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let c = classes(m.py())?;
    m.add("KvtierError", &c.base)?;
    m.add("ConfigError", &c.config)?;
    m.add("InvalidKey", &c.invalid_key)?;
    m.add("InvalidPage", &c.invalid_page)?;
    m.add("InvalidBuffer", &c.invalid_buffer)?;
    m.add("Unavailable", &c.unavailable)?;
    m.add("Timeout", &c.timeout)?;
    Ok(())
}
