//! kvtier tiers on NVIDIA NIXL.

// Link nixl-sys's library (its C API forwarders) even though only raw symbols are called.
extern crate nixl_sys;

mod batch;
pub mod file;
mod nixl;
pub mod obj;
pub mod runtime;
mod staging;

pub use file::{
    probe_folder, route_hash, BoundedIo, DirectIo, Durability, FileAccess, FileEngine, FileMode,
    FilePlugin, FleetStats, FolderMode, FolderProbe, LockReach, NixlFileConfig, NixlFileTier,
    PageChecksum, PathModeChoice, SharedFolder, SharedLocks, VerifyReads, BUCKETS, PAGE_TRAILER,
};
pub use nixl::{live_registrations, live_transfers};
pub use obj::{NixlObjConfig, NixlObjTier, RequestChecksum};

/// Reads of a page file replaced while it was read (checked by the file's identity),
/// before it is answered as a miss; attempt `n` waits `2^n` ms for the writer first.
const READ_ATTEMPTS: u32 = 6;

/// What `kvtier probe` reports about the NIXL runtime.
#[derive(Debug, Clone)]
pub struct Probe {
    /// Where the runtime was loaded from.
    pub source: runtime::RuntimeSource,
    /// The runtime version, when the install recorded one (the C API has no version call).
    pub version: Option<String>,
    /// Plugins the runtime can load.
    pub plugins: Vec<String>,
    /// Whether the POSIX plugin opens files from registration paths (NIXL >= 1.3).
    pub path_mode: bool,
}

/// Loads the runtime, lists its plugins and probes path mode on a POSIX backend.
pub fn probe(runtime_dir: Option<&std::path::Path>) -> Result<Probe, tier_core::TierError> {
    let source = runtime::load(runtime_dir)?;
    let backend_err = |e: nixl::NixlError| tier_core::TierError::Backend {
        backend: "nixl".into(),
        key: None,
        message: e.to_string(),
    };
    let agent =
        nixl::Agent::new(&format!("kvtier-probe-{}", std::process::id())).map_err(backend_err)?;
    let plugins = agent.plugins().map_err(backend_err)?;
    let backend = agent
        .create_backend("POSIX", &Default::default())
        .map_err(backend_err)?;
    let path_mode = file::probe_path_mode(&backend) == FileMode::Path;
    let version = match &source {
        runtime::RuntimeSource::Config(d)
        | runtime::RuntimeSource::Env(d)
        | runtime::RuntimeSource::Default(d) => {
            std::fs::read_dir(d.join("..")).ok().and_then(|entries| {
                entries.flatten().find_map(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .strip_prefix(".installed-")
                        .map(str::to_string)
                })
            })
        }
        runtime::RuntimeSource::SystemLoader => None,
    };
    Ok(Probe {
        source,
        version,
        plugins,
        path_mode,
    })
}
