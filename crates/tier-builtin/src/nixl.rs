//! The `nixl-file` and `nixl-obj` kinds: NIXL's FILE and OBJ tiers ([`tier_nixl`]).
//!
//! ```toml
//! [[tiers]]
//! kind = "nixl-file"
//! dirs = ["/mnt/nvme0/kv", "/mnt/nvme1/kv"]   # required; one per disk
//! capacity = "1TiB"             # optional; eviction beyond it, by `policy`
//! policy = "auto"               # auto (default), lru, sieve, s3fifo, arc, prefix, radix, lfu, sampled
//! ordered_pages = 65536         # owner: pages kept in the policy's exact order; past them
//!                               # eviction is sampled LRU (about 63 B a page, not up to 670)
//! plugin = "POSIX"              # POSIX, GDS, GDS_MT or HF3FS
//! plugin_params = { use_uring = "true" }
//! path_mode = "auto"            # auto, on or off
//! direct_io = "off"             # off, required or preferred
//! durability = "process"        # process (survives kill -9) or power (fsync, slower)
//! page_checksum = "crc32c"      # crc32c (in each page file's trailer) or off
//! verify = "once"               # once per file version (pages >= 64 KiB), or every-read
//! staging_bytes = "16MiB"
//! staging_buffers = 2
//! transfer_timeout = "30s"
//! bounded_io = "auto"           # give up on file I/O after transfer_timeout: auto (network
//!                               # and FUSE filesystems), on, off (reads in place)
//! max_abandoned = "1GiB"        # kept for good by transfers that never finished; then errors
//! runtime_dir = "/opt/kvtier/nixl/lib"
//! access = "owner"             # owner; reader (reads what an owner stores there); shared:
//!                               # any number of processes and machines store and read there
//! mode = "owner"                # owner: folders 0700, files 0600 (this user only); group:
//!                               # 2770/0660, for a cache several users of a group share
//! lease = "10s"                 # shared: an evictor that dies or stalls is taken over after it
//! touch_interval = "60s"        # shared: a hit refreshes its page's use time at most this often
//! low_watermark = 0.9           # shared: an eviction brings the folders down to this fraction
//! locks = "flock"               # shared: flock, or none for a filesystem without locks (3FS):
//!                               # usage and evictor agreed without them (capacity less exact)
//! engine = "nixl"               # nixl, or syscalls: pread/pwrite by kvtier (host memory only)
//!
//! [[tiers]]
//! kind = "nixl-obj"
//! prefix = "models/llama-8b"    # the tier's namespace; clear() touches nothing else
//! bucket = "kv"
//! endpoint = "http://127.0.0.1:9000"   # optional (AWS when absent); http:// or https://
//! access_key = "..."
//! secret_key = "..."
//! region = "us-east-1"
//! virtual_hosted = false
//! bulk_delete = true            # false where DeleteObjects is missing (GCS's S3 API)
//! checksum = "required"         # required or supported
//! ca_bundle = "/etc/ssl/certs/ca-certificates.crt"
//! crt_min_bytes = "8MiB"        # objects from this size go through the S3 CRT client
//! plugin_params = { num_threads = "8" }
//! lanes = 2
//! concurrency = 16
//! max_page = "256MiB"
//! transfer_timeout = "30s"
//! max_abandoned = "1GiB"        # kept for good by requests that never finished; then errors
//! capacity = "2TiB"             # optional bound on the prefix's pages, evicting by `policy`
//! policy = "auto"               # auto (default), lru, sieve, s3fifo, arc, prefix, radix, lfu, sampled
//! access = "private"            # or shared, as for `object` (one evictor per prefix)
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use tier_core::EvictionListener;
use tier_core::{TierError, TierInfo};
use tier_hierarchy::config::{ByteSize, OpenFuture, Registry, TierContext, TierPlan, TimeSpan};
use tier_nixl::{
    BoundedIo, DirectIo, Durability, FileAccess, FileEngine, FilePlugin, FolderMode,
    NixlFileConfig, NixlFileTier, NixlObjConfig, NixlObjTier, PageChecksum, PathModeChoice,
    RequestChecksum, SharedLocks, VerifyReads,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileParams {
    dirs: Vec<PathBuf>,
    capacity: Option<ByteSize>,
    policy: Option<tier_policy::PolicyKind>,
    ordered_pages: Option<usize>,
    #[serde(default)]
    plugin: FilePlugin,
    #[serde(default)]
    plugin_params: BTreeMap<String, String>,
    #[serde(default)]
    path_mode: PathModeChoice,
    #[serde(default)]
    direct_io: DirectIo,
    #[serde(default)]
    durability: Durability,
    #[serde(default)]
    page_checksum: PageChecksum,
    #[serde(default)]
    verify: VerifyReads,
    #[serde(default)]
    bounded_io: BoundedIo,
    staging_bytes: Option<ByteSize>,
    staging_buffers: Option<usize>,
    transfer_timeout: Option<TimeSpan>,
    max_abandoned: Option<ByteSize>,
    runtime_dir: Option<PathBuf>,
    #[serde(default)]
    access: FileAccess,
    #[serde(default)]
    mode: FolderMode,
    lease: Option<TimeSpan>,
    touch_interval: Option<TimeSpan>,
    low_watermark: Option<f64>,
    locks: Option<SharedLocks>,
    #[serde(default)]
    engine: FileEngine,
}

fn to_config(name: &str, p: FileParams) -> Result<NixlFileConfig, TierError> {
    let mut c = NixlFileConfig::new(p.dirs);
    c.name = name.to_string();
    c.capacity_bytes = p.capacity.map(|b| b.0);
    if let Some(pages) = p.ordered_pages {
        if p.access != FileAccess::Owner {
            return Err(TierError::config(
                "ordered_pages",
                "is a setting of access = \"owner\" (only an owner keeps an index)",
            ));
        }
        c.ordered_pages = pages;
    }
    let shared_only = [
        ("lease", p.lease.is_some()),
        ("touch_interval", p.touch_interval.is_some()),
        ("low_watermark", p.low_watermark.is_some()),
        ("locks", p.locks.is_some()),
    ];
    if p.access == FileAccess::Shared {
        if p.policy.is_some() {
            return Err(TierError::config(
                "policy",
                "shared folders evict the pages least recently used by any process; \
                 policy is for access = \"owner\"",
            ));
        }
    } else if let Some((field, _)) = shared_only.iter().find(|(_, set)| *set) {
        return Err(TierError::config(
            *field,
            format!(
                "is a setting of access = \"shared\" (this tier's access is \"{}\")",
                if p.access == FileAccess::Reader {
                    "reader"
                } else {
                    "owner"
                }
            ),
        ));
    }
    if let Some(policy) = p.policy {
        c.policy = policy;
    }
    if let Some(t) = p.lease {
        c.shared.lease = t.0;
    }
    if let Some(t) = p.touch_interval {
        c.shared.touch_interval = t.0;
    }
    if let Some(f) = p.low_watermark {
        c.shared.low_watermark = f;
    }
    if let Some(locks) = p.locks {
        c.shared.locks = locks;
    }
    c.plugin = p.plugin;
    c.plugin_params = p.plugin_params;
    c.path_mode = p.path_mode;
    c.direct_io = p.direct_io;
    c.durability = p.durability;
    c.page_checksum = p.page_checksum;
    c.verify = p.verify;
    c.bounded_io = p.bounded_io;
    c.access = p.access;
    c.mode = p.mode;
    c.engine = p.engine;
    if let Some(b) = p.staging_bytes {
        c.staging_bytes = b.0 as usize;
    }
    if let Some(n) = p.staging_buffers {
        c.staging_buffers = n;
    }
    if let Some(t) = p.transfer_timeout {
        c.transfer_timeout = t.0;
    }
    if let Some(b) = p.max_abandoned {
        c.max_abandoned_bytes = usize::try_from(b.0).unwrap_or(usize::MAX);
    }
    c.runtime_dir = p.runtime_dir;
    Ok(c)
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
            c.capacity_bytes.map_or("unbounded".into(), |b| format!("{} ({})", ByteSize(b), c.policy)),
            c.staging_buffers,
            ByteSize(c.staging_bytes as u64),
        )
    }

    fn others_may_write(&self) -> Option<String> {
        (self.0.mode == FolderMode::Group).then(|| "the folders' group (mode = \"group\")".into())
    }

    /// Known before it opens: a folder on a mount that hangs opens in the background.
    fn info(&self) -> Option<TierInfo> {
        Some(self.0.tier_info())
    }

    fn open(self: Box<Self>, _on_evict: Option<EvictionListener>) -> OpenFuture {
        Box::pin(async move { Ok(Arc::new(NixlFileTier::open(self.0).await?) as _) })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ObjParams {
    prefix: String,
    bucket: String,
    endpoint: Option<String>,
    #[serde(default)]
    access_key: String,
    #[serde(default)]
    secret_key: tier_object::Secret,
    region: Option<String>,
    #[serde(default)]
    virtual_hosted: bool,
    bulk_delete: Option<bool>,
    #[serde(default)]
    checksum: RequestChecksum,
    ca_bundle: Option<PathBuf>,
    crt_min_bytes: Option<ByteSize>,
    #[serde(default)]
    plugin_params: BTreeMap<String, String>,
    lanes: Option<usize>,
    concurrency: Option<usize>,
    max_page: Option<ByteSize>,
    transfer_timeout: Option<TimeSpan>,
    max_abandoned: Option<ByteSize>,
    runtime_dir: Option<PathBuf>,
    capacity: Option<ByteSize>,
    policy: Option<tier_policy::PolicyKind>,
    #[serde(default)]
    access: tier_object::PrefixAccess,
    lease: Option<TimeSpan>,
    low_watermark: Option<f64>,
    relist: Option<TimeSpan>,
}

fn to_obj_config(name: &str, p: ObjParams) -> Result<NixlObjConfig, TierError> {
    let mut s3 = tier_object::S3Settings::endpoint("", &p.bucket, &p.access_key, "");
    s3.secret_key = p.secret_key;
    s3.keys_from_env();
    s3.endpoint = p.endpoint;
    s3.virtual_hosted = p.virtual_hosted;
    if let Some(bulk) = p.bulk_delete {
        s3.bulk_delete = bulk;
    }
    if let Some(region) = p.region {
        s3.region = region;
    }
    let mut c = NixlObjConfig::new(s3, p.prefix);
    c.name = name.to_string();
    c.checksum = p.checksum;
    c.ca_bundle = p.ca_bundle;
    c.crt_min_bytes = p.crt_min_bytes.map(|b| b.0);
    c.plugin_params = p.plugin_params;
    if let Some(n) = p.lanes {
        c.lanes = n;
    }
    if let Some(n) = p.concurrency {
        c.concurrency = n;
    }
    if let Some(b) = p.max_page {
        c.max_page_bytes = usize::try_from(b.0).unwrap_or(usize::MAX);
    }
    if let Some(t) = p.transfer_timeout {
        c.transfer_timeout = t.0;
    }
    if let Some(b) = p.max_abandoned {
        c.max_abandoned_bytes = usize::try_from(b.0).unwrap_or(usize::MAX);
    }
    c.runtime_dir = p.runtime_dir;
    c.capacity_bytes = p.capacity.map(|b| b.0);
    let sharing = crate::object::PrefixParams {
        access: p.access,
        lease: p.lease,
        low_watermark: p.low_watermark,
        relist: p.relist,
    };
    (c.access, c.shared, c.policy) = sharing.resolve(p.policy, c.policy)?;
    Ok(c)
}

/// The store a `nixl-obj` entry's prefix is in (through object_store, as its control
/// requests go), and the prefix.
pub(crate) fn obj_store_of(
    ctx: &TierContext,
) -> Result<(Arc<dyn object_store::ObjectStore>, String), TierError> {
    let c = to_obj_config(&ctx.name, ctx.params()?).map_err(|e| crate::field_error(ctx, e))?;
    let store =
        c.s3.build()
            .map_err(|e| TierError::config(format!("{}.bucket", ctx.field), e.to_string()))?;
    Ok((store, c.prefix))
}

struct ObjPlan(NixlObjConfig);

impl TierPlan for ObjPlan {
    fn advice(&self) -> Option<String> {
        Some(crate::object::multipart_advice(
            &self.0.s3.bucket,
            &self.0.prefix,
        ))
    }

    fn others_may_write(&self) -> Option<String> {
        (self.0.access == tier_object::PrefixAccess::Shared)
            .then(|| "every node holding the bucket's credentials (access = \"shared\")".into())
    }

    fn describe(&self) -> String {
        let c = &self.0;
        format!(
            "nixl-obj: bucket {} at {}, prefix {:?}, {} lane(s), max page {}, capacity {}",
            c.s3.bucket,
            c.s3.endpoint.as_deref().unwrap_or("AWS"),
            c.prefix,
            c.lanes,
            ByteSize(c.max_page_bytes as u64),
            c.capacity_bytes.map_or("unbounded".into(), |b| format!(
                "{} ({})",
                ByteSize(b),
                c.policy
            )),
        )
    }

    fn open(self: Box<Self>, _on_evict: Option<EvictionListener>) -> OpenFuture {
        Box::pin(async move { Ok(Arc::new(NixlObjTier::open(self.0).await?) as _) })
    }
}

/// Registers the `nixl-file` and `nixl-obj` kinds.
pub fn register(registry: &mut Registry) {
    registry.register("nixl-obj", |ctx: &TierContext| {
        let params: ObjParams = ctx.params()?;
        let config = to_obj_config(&ctx.name, params).map_err(|e| crate::field_error(ctx, e))?;
        config.validate().map_err(|e| crate::field_error(ctx, e))?;
        Ok(Box::new(ObjPlan(config)) as Box<dyn TierPlan>)
    });
    registry.register("nixl-file", |ctx: &TierContext| {
        let params: FileParams = ctx.params()?;
        let config = to_config(&ctx.name, params).map_err(|e| crate::field_error(ctx, e))?;
        config.validate().map_err(|e| crate::field_error(ctx, e))?;
        Ok(Box::new(FilePlan(config)) as Box<dyn TierPlan>)
    });
}
