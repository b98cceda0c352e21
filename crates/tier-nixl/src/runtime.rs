//! Finding and loading the NIXL runtime (`libnixl_capi.so`) before any NIXL call.
//!
//! nixl-sys (built with `stub-api`) forwards every call to `libnixl_capi.so`, opened by bare
//! name on first use, and **aborts the process** if it cannot be found. kvtier therefore loads
//! the library itself first, by absolute path with `RTLD_GLOBAL`, from the first place that has
//! it: the configured folder, then `$NIXL_LIB_DIR`, then [`DEFAULT_DIR`], then the system
//! loader path. nixl-sys's own bare-name open then finds the loaded library. If no place has
//! it, callers get [`TierError::Unavailable`] naming every place tried, and nothing aborts.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tier_core::TierError;

use crate::nixl::sys;

/// Where `scripts/setup.sh` installs the runtime.
pub const DEFAULT_DIR: &str = "/opt/kvtier/nixl/lib";
/// Environment variable naming a folder that holds `libnixl_capi.so`.
pub const ENV_DIR: &str = "NIXL_LIB_DIR";
const LIBRARY: &str = "libnixl_capi.so";

/// Where the runtime was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeSource {
    /// The folder given in config.
    Config(PathBuf),
    /// The folder in `$NIXL_LIB_DIR`.
    Env(PathBuf),
    /// [`DEFAULT_DIR`].
    Default(PathBuf),
    /// The system loader path (`LD_LIBRARY_PATH`, `ld.so.cache`).
    SystemLoader,
}

impl std::fmt::Display for RuntimeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Config(p) => write!(f, "{} (config)", p.display()),
            Self::Env(p) => write!(f, "{} (${ENV_DIR})", p.display()),
            Self::Default(p) => write!(f, "{} (default folder)", p.display()),
            Self::SystemLoader => write!(f, "system loader path"),
        }
    }
}

static LOADED: Mutex<Option<RuntimeSource>> = Mutex::new(None);

/// Loads the NIXL runtime once per process; later calls return where it came from.
pub fn load(configured_dir: Option<&Path>) -> Result<RuntimeSource, TierError> {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(source) = loaded.as_ref() {
        return Ok(source.clone());
    }
    let source = search(&candidates(configured_dir))?;
    tracing::info!(%source, "NIXL runtime loaded");
    *loaded = Some(source.clone());
    Ok(source)
}

/// The places [`load`] searches, in order.
pub fn candidates(configured_dir: Option<&Path>) -> Vec<RuntimeSource> {
    let mut candidates = Vec::new();
    if let Some(dir) = configured_dir {
        candidates.push(RuntimeSource::Config(dir.to_path_buf()));
    }
    if let Some(dir) = std::env::var_os(ENV_DIR).filter(|d| !d.is_empty()) {
        candidates.push(RuntimeSource::Env(PathBuf::from(dir)));
    }
    candidates.push(RuntimeSource::Default(PathBuf::from(DEFAULT_DIR)));
    candidates.push(RuntimeSource::SystemLoader);
    candidates
}

/// Loads the runtime from the first of `candidates` that has it and is not a stub.
pub fn search(candidates: &[RuntimeSource]) -> Result<RuntimeSource, TierError> {
    let mut tried = Vec::new();
    for source in candidates {
        let target = match source {
            RuntimeSource::Config(d) | RuntimeSource::Env(d) | RuntimeSource::Default(d) => {
                let path = d.join(LIBRARY);
                if !path.is_file() {
                    tried.push(format!("{}: no such file", path.display()));
                    continue;
                }
                path.into_os_string()
            }
            RuntimeSource::SystemLoader => LIBRARY.into(),
        };
        match dlopen(target.as_bytes()) {
            Ok(()) => {
                // SAFETY: the library is loaded, so the stub resolves it instead of aborting;
                // `nixl_capi_is_stub` never aborts in any case.
                if unsafe { sys::nixl_capi_is_stub() } {
                    tried.push(format!("{source}: loaded, but nixl-sys still sees a stub"));
                    continue;
                }
                return Ok(source.clone());
            }
            Err(e) => tried.push(format!("{source}: {e}")),
        }
    }
    Err(TierError::Unavailable(format!(
        "the NIXL runtime ({LIBRARY}) was not found; install it (`pip install nixl`, or \
         `scripts/setup.sh nixl`) or point ${ENV_DIR} at its folder. Tried: {}",
        tried.join("; ")
    )))
}

/// Whether [`load`] has succeeded in this process.
pub fn is_loaded() -> bool {
    LOADED.lock().unwrap_or_else(|e| e.into_inner()).is_some()
}

fn dlopen(target: &[u8]) -> Result<(), String> {
    let name = CString::new(target).map_err(|_| "path holds a NUL byte".to_string())?;
    // SAFETY: `name` is a valid C string; the handle is deliberately kept for the process's
    // life (NIXL cannot be unloaded while nixl-sys holds its own handle).
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a thread-local C string or null.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            "dlopen failed".to_string()
        } else {
            // SAFETY: non-null dlerror strings are valid C strings.
            unsafe { std::ffi::CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(msg);
    }
    Ok(())
}
