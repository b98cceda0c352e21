//! The `nixl-file` kind for config files.
//!
//! ```toml
//! [[tiers]]
//! kind = "nixl-file"
//! dirs = ["/mnt/nvme0/kv", "/mnt/nvme1/kv"]   # required; one per disk
//! capacity = "1TiB"             # optional; LRU eviction beyond it
//! plugin = "POSIX"              # POSIX, GDS, GDS_MT or HF3FS
//! plugin_params = { use_uring = "true" }
//! path_mode = "auto"            # auto, on or off
//! direct_io = "off"             # off, required or preferred
//! sync_writes = false
//! staging_bytes = "16MiB"
//! staging_buffers = 2
//! transfer_timeout = "30s"
//! runtime_dir = "/opt/kvtier/nixl/lib"
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use tier_core::config::{ByteSize, OpenFuture, Registry, Seconds, TierContext, TierPlan};
use tier_core::{EvictionListener, TierError};

use crate::{DirectIo, FilePlugin, NixlFileConfig, NixlFileTier, PathModeChoice};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileParams {
    dirs: Vec<PathBuf>,
    capacity: Option<ByteSize>,
    #[serde(default)]
    plugin: PluginName,
    #[serde(default)]
    plugin_params: BTreeMap<String, String>,
    #[serde(default)]
    path_mode: PathModeName,
    #[serde(default)]
    direct_io: DirectName,
    #[serde(default)]
    sync_writes: bool,
    staging_bytes: Option<ByteSize>,
    staging_buffers: Option<usize>,
    transfer_timeout: Option<Seconds>,
    runtime_dir: Option<PathBuf>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
enum PluginName {
    #[default]
    #[serde(rename = "POSIX")]
    Posix,
    #[serde(rename = "GDS")]
    Gds,
    #[serde(rename = "GDS_MT")]
    GdsMt,
    #[serde(rename = "HF3FS")]
    Hf3fs,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum PathModeName {
    #[default]
    Auto,
    On,
    Off,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum DirectName {
    #[default]
    Off,
    Required,
    Preferred,
}

fn to_config(name: &str, p: FileParams) -> NixlFileConfig {
    let mut c = NixlFileConfig::new(p.dirs);
    c.name = name.to_string();
    c.capacity_bytes = p.capacity.map(|b| b.0);
    c.plugin = match p.plugin {
        PluginName::Posix => FilePlugin::Posix,
        PluginName::Gds => FilePlugin::Gds,
        PluginName::GdsMt => FilePlugin::GdsMt,
        PluginName::Hf3fs => FilePlugin::Hf3fs,
    };
    c.plugin_params = p.plugin_params;
    c.path_mode = match p.path_mode {
        PathModeName::Auto => PathModeChoice::Auto,
        PathModeName::On => PathModeChoice::On,
        PathModeName::Off => PathModeChoice::Off,
    };
    c.direct_io = match p.direct_io {
        DirectName::Off => DirectIo::Off,
        DirectName::Required => DirectIo::Required,
        DirectName::Preferred => DirectIo::Preferred,
    };
    c.sync_writes = p.sync_writes;
    if let Some(b) = p.staging_bytes {
        c.staging_bytes = b.0 as usize;
    }
    if let Some(n) = p.staging_buffers {
        c.staging_buffers = n;
    }
    if let Some(t) = p.transfer_timeout {
        c.transfer_timeout = t.0;
    }
    c.runtime_dir = p.runtime_dir;
    c
}

struct FilePlan(NixlFileConfig);

impl TierPlan for FilePlan {
    fn describe(&self) -> String {
        let c = &self.0;
        format!(
            "nixl-file: {} folder(s) {:?}, plugin {}, path mode {:?}, direct I/O {:?}, capacity {}, staging {} x {}",
            c.dirs.len(),
            c.dirs,
            c.plugin.nixl_name(),
            c.path_mode,
            c.direct_io,
            c.capacity_bytes.map_or("unbounded".into(), |b| ByteSize(b).to_string()),
            c.staging_buffers,
            ByteSize(c.staging_bytes as u64),
        )
    }

    fn open(self: Box<Self>, _on_evict: Option<EvictionListener>) -> OpenFuture {
        Box::pin(async move { Ok(Arc::new(NixlFileTier::open(self.0).await?) as _) })
    }
}

/// Registers the `nixl-file` kind.
pub fn register(registry: &mut Registry) {
    registry.register("nixl-file", |ctx: &TierContext| {
        let params: FileParams = ctx.params()?;
        let config = to_config(&ctx.name, params);
        config.validate().map_err(|e| match e {
            TierError::Config { field, message } => {
                TierError::config(format!("{}.{field}", ctx.field), message)
            }
            other => other,
        })?;
        Ok(Box::new(FilePlan(config)) as Box<dyn TierPlan>)
    });
}
