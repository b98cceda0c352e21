//! [`NixlObjConfig`]: a NIXL OBJ tier's settings, and how the S3 SDK inside NIXL checksums.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tier_core::{PageKey, TierError};
use tier_object::S3Settings;

use super::transfer::MAX_OBJECT;
/// How the S3 SDK inside NIXL checksums requests (`req_checksum`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestChecksum {
    /// Checksum every request body (plain bodies; works on every S3-compatible server).
    #[default]
    Required,
    /// Only where the operation requires it (the SDK may send `aws-chunked` bodies, which some
    /// S3-compatible servers store verbatim).
    Supported,
}

/// Configuration of a [`NixlObjTier`](super::NixlObjTier).
#[derive(Debug, Clone)]
pub struct NixlObjConfig {
    /// Instance name, for logs and stats.
    pub name: String,
    /// Namespace inside the bucket: `/`-separated parts of `[A-Za-z0-9._-]`, none `.` or `..`.
    pub prefix: String,
    /// Bucket, endpoint, credentials, region, addressing style; also the `object_store`
    /// client's timeouts and retries.
    pub s3: S3Settings,
    /// Request checksum mode of NIXL's S3 client.
    pub checksum: RequestChecksum,
    /// CA bundle for HTTPS endpoints.
    pub ca_bundle: Option<PathBuf>,
    /// Objects at least this large go through NIXL's S3 CRT client (multipart, parallel
    /// ranges); `None` leaves the plugin's default.
    pub crt_min_bytes: Option<u64>,
    /// Further OBJ plugin parameters, applied last (e.g. `num_threads`).
    pub plugin_params: BTreeMap<String, String>,
    /// NIXL agents, i.e. batches moving at once.
    pub lanes: usize,
    /// Requests in flight per batch: `object_store` HEADs and deletes, and the threads of NIXL's
    /// S3 client (`num_threads`, unless `plugin_params` sets it).
    pub concurrency: usize,
    /// Largest page accepted.
    pub max_page_bytes: usize,
    /// Bound on each NIXL transfer and each `object_store` call.
    pub transfer_timeout: Duration,
    /// Bytes that transfers which never finished may keep for good (NIXL's S3 client may
    /// still finish a request kvtier gave up on) before the tier refuses new ones with an
    /// error: an outage costs errors, not unbounded memory.
    pub max_abandoned_bytes: usize,
    /// Folder holding `libnixl_capi.so`, searched before `$NIXL_LIB_DIR` and the defaults.
    pub runtime_dir: Option<PathBuf>,
    /// Bytes of pages the tier holds under its prefix; beyond it, `policy` evicts (the
    /// catalog is the object_store tier's, see [`tier_object`]). `None`: unbounded.
    pub capacity_bytes: Option<u64>,
    /// Which pages go first when the capacity is reached.
    pub policy: tier_policy::PolicyKind,
    /// Whether the capacity is this process's or the prefix's (see [`tier_object`]).
    pub access: tier_object::PrefixAccess,
    /// Lease, watermark and listing period of a shared prefix.
    pub shared: tier_object::SharedPrefix,
}

impl NixlObjConfig {
    /// Defaults for the bucket `s3` names, under `prefix`.
    pub fn new(s3: S3Settings, prefix: impl Into<String>) -> Self {
        Self {
            name: "nixl-obj".into(),
            prefix: prefix.into(),
            s3,
            checksum: RequestChecksum::Required,
            ca_bundle: None,
            crt_min_bytes: None,
            plugin_params: BTreeMap::new(),
            lanes: 2,
            concurrency: 16,
            max_page_bytes: 256 << 20,
            transfer_timeout: Duration::from_secs(30),
            max_abandoned_bytes: crate::nixl::DEFAULT_ABANDON_LIMIT,
            runtime_dir: None,
            capacity_bytes: None,
            policy: tier_policy::PolicyKind::default(),
            access: tier_object::PrefixAccess::Private,
            shared: tier_object::SharedPrefix::default(),
        }
    }

    /// Checks the settings that need no I/O.
    pub fn validate(&self) -> Result<(), TierError> {
        tier_object::check_prefix(&self.prefix)?;
        if self.capacity_bytes == Some(0) {
            return Err(TierError::config(
                "capacity",
                "must be at least 1 byte (or unset)",
            ));
        }
        if self.capacity_bytes.is_some() && self.policy.build::<PageKey>().is_none() {
            return Err(TierError::config(
                "policy",
                "tinylfu is moka's, for DRAM tiers; an object tier takes auto, lru, sieve, s3fifo, arc, prefix, radix, lfu or sampled",
            ));
        }
        if self.s3.access_key.is_empty() || self.s3.secret_key.is_empty() {
            return Err(TierError::config(
                "access_key",
                "S3 credentials are missing: set access_key and secret_key, or \
                 AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            ));
        }
        if !(1..=crate::file::MAX_LANES).contains(&self.lanes) {
            return Err(TierError::config(
                "lanes",
                format!(
                    "must be 1 to {} (one NIXL agent each)",
                    crate::file::MAX_LANES
                ),
            ));
        }
        if !(1..=1024).contains(&self.concurrency) {
            return Err(TierError::config("concurrency", "must be 1 to 1024"));
        }
        if !(1..=MAX_OBJECT - tier_format::TRAILER as usize).contains(&self.max_page_bytes) {
            return Err(TierError::config(
                "max_page",
                "must be 1 byte to 5 GiB less the page's 32-byte trailer (the largest single \
                 S3 PUT)",
            ));
        }
        if self.transfer_timeout.is_zero() {
            return Err(TierError::config("transfer_timeout", "must be positive"));
        }
        if self.s3.bucket.is_empty() {
            return Err(TierError::config("bucket", "a bucket is required"));
        }
        if let Some(endpoint) = &self.s3.endpoint {
            if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
                return Err(TierError::config(
                    "endpoint",
                    format!("{endpoint:?} must start with http:// or https://"),
                ));
            }
        }
        Ok(())
    }

    /// The OBJ plugin's backend parameters.
    pub fn backend_params(&self) -> BTreeMap<String, String> {
        let s3 = &self.s3;
        let mut p = BTreeMap::new();
        p.insert("bucket".into(), s3.bucket.clone());
        p.insert("region".into(), s3.region.clone());
        p.insert("access_key".into(), s3.access_key.clone());
        p.insert("secret_key".into(), s3.secret_key.expose().to_string());
        p.insert(
            "use_virtual_addressing".into(),
            s3.virtual_hosted.to_string(),
        );
        let scheme = match &s3.endpoint {
            Some(e) if e.starts_with("http://") => "http",
            _ => "https",
        };
        p.insert("scheme".into(), scheme.into());
        if let Some(endpoint) = &s3.endpoint {
            p.insert("endpoint_override".into(), endpoint.clone());
        }
        let checksum = match self.checksum {
            RequestChecksum::Required => "required",
            RequestChecksum::Supported => "supported",
        };
        p.insert("req_checksum".into(), checksum.into());
        if let Some(ca) = &self.ca_bundle {
            p.insert("ca_bundle".into(), ca.display().to_string());
        }
        if let Some(min) = self.crt_min_bytes {
            p.insert("crtMinLimit".into(), min.to_string());
        }
        // The plugin's thread pool bounds its requests in flight; its default is one thread
        // per core (2 here), which left gets at a tenth of an object_store client's rate.
        p.insert("num_threads".into(), self.concurrency.to_string());
        p.extend(self.plugin_params.clone());
        p
    }
}
