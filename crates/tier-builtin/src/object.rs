//! The `object` kind: an object_store tier ([`tier_object::ObjectTier`]).
//!
//! ```toml
//! [[tiers]]
//! kind = "object"
//! store = "s3"                  # s3, local or memory
//! prefix = "models/llama-8b"    # the tier's namespace; clear() touches nothing else
//! endpoint = "http://127.0.0.1:9000"
//! bucket = "kv"
//! access_key = "..."
//! secret_key = "..."
//! region = "us-east-1"
//! bulk_delete = true            # false where DeleteObjects is missing (GCS's S3 API)
//! concurrency = 16
//! op_timeout = "30s"
//! capacity = "2TiB"             # optional bound on the prefix's pages, evicting by `policy`
//! policy = "auto"               # auto (default), lru, sieve, s3fifo, arc, prefix, radix, lfu, sampled
//! access = "private"            # private, or shared: the capacity is the prefix's, for every
//!                               # node writing it (one evictor at a time, by a lease object)
//! lease = "30s"                 # shared: an evictor that dies or stalls is taken over after it
//! low_watermark = 0.9           # shared: an eviction brings the prefix down to this fraction
//! relist = "10s"                # shared: how often a writing node lists some of its buckets
//! # store = "local": dir = "/mnt/shared/kv"
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use object_store::ObjectStore;
use serde::Deserialize;
use tier_core::{EvictionListener, TierError};
use tier_hierarchy::config::{ByteSize, OpenFuture, Registry, TierContext, TierPlan, TimeSpan};
use tier_object::{ObjectTier, ObjectTierConfig, PrefixAccess, S3Settings, Secret, SharedPrefix};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ObjectParams {
    store: StoreKind,
    prefix: String,
    endpoint: Option<String>,
    bucket: Option<String>,
    access_key: Option<String>,
    secret_key: Option<Secret>,
    region: Option<String>,
    bulk_delete: Option<bool>,
    dir: Option<PathBuf>,
    concurrency: Option<usize>,
    op_timeout: Option<TimeSpan>,
    #[serde(default)]
    create_only: bool,
    capacity: Option<ByteSize>,
    policy: Option<tier_policy::PolicyKind>,
    #[serde(default)]
    access: PrefixAccess,
    lease: Option<TimeSpan>,
    low_watermark: Option<f64>,
    relist: Option<TimeSpan>,
}

/// A prefix's access and, when shared, its lease, watermark and listing period (the
/// `object` and `nixl-obj` kinds).
#[derive(Debug, Default)]
pub(crate) struct PrefixParams {
    pub access: PrefixAccess,
    pub lease: Option<TimeSpan>,
    pub low_watermark: Option<f64>,
    pub relist: Option<TimeSpan>,
}

impl PrefixParams {
    /// The access and shared settings, and the policy to use; refuses a policy on a shared
    /// prefix and shared settings on a private one.
    pub(crate) fn resolve(
        self,
        policy: Option<tier_policy::PolicyKind>,
        default_policy: tier_policy::PolicyKind,
    ) -> Result<(PrefixAccess, SharedPrefix, tier_policy::PolicyKind), TierError> {
        let mut shared = SharedPrefix::default();
        if self.access == PrefixAccess::Shared {
            if policy.is_some() {
                return Err(TierError::config(
                    "policy",
                    "a shared prefix evicts the objects written longest ago by any node; \
                     policy is for access = \"private\"",
                ));
            }
        } else if let Some(field) = [
            ("lease", self.lease.is_some()),
            ("low_watermark", self.low_watermark.is_some()),
            ("relist", self.relist.is_some()),
        ]
        .iter()
        .find_map(|(f, set)| set.then_some(*f))
        {
            return Err(TierError::config(
                field,
                "is a setting of access = \"shared\" (this prefix is private)",
            ));
        }
        if let Some(t) = self.lease {
            shared.lease = t.0;
        }
        if let Some(f) = self.low_watermark {
            shared.low_watermark = f;
        }
        if let Some(t) = self.relist {
            shared.relist = t.0;
        }
        Ok((self.access, shared, policy.unwrap_or(default_policy)))
    }
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum StoreKind {
    S3,
    Local,
    Memory,
}

/// The lifecycle rule that ends multipart uploads a killed process left under `prefix` of
/// `bucket` (object_store cannot list uploads, so kvtier cannot sweep them).
pub(crate) fn multipart_advice(bucket: &str, prefix: &str) -> String {
    format!(
        "uploads in parts a killed process left under {prefix:?} are never swept (they cannot \
         be listed through object_store) and are billed until aborted: give bucket {bucket:?} \
         a lifecycle rule that aborts them, e.g. `aws s3api \
         put-bucket-lifecycle-configuration --bucket {bucket} --lifecycle-configuration \
         '{{\"Rules\":[{{\"ID\":\"kvtier-abort-uploads\",\"Status\":\"Enabled\",\
         \"Filter\":{{\"Prefix\":\"{prefix}/\"}},\"AbortIncompleteMultipartUpload\":\
         {{\"DaysAfterInitiation\":1}}}}]}}'` (merge it into the bucket's rules if it has \
         some)"
    )
}

struct ObjectPlan {
    store: Arc<dyn ObjectStore>,
    config: ObjectTierConfig,
    describe: String,
    /// The S3 bucket, for a store on S3.
    bucket: Option<String>,
}

impl TierPlan for ObjectPlan {
    fn others_may_write(&self) -> Option<String> {
        (self.config.access == PrefixAccess::Shared)
            .then(|| "every node holding the bucket's credentials (access = \"shared\")".into())
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn advice(&self) -> Option<String> {
        let bucket = self.bucket.as_deref()?;
        Some(multipart_advice(bucket, &self.config.prefix))
    }

    fn open(self: Box<Self>, _on_evict: Option<EvictionListener>) -> OpenFuture {
        Box::pin(async move {
            let tier = ObjectTier::open(self.store, self.config)?;
            tier.load_catalog().await?;
            Ok(Arc::new(tier) as _)
        })
    }
}

fn required(ctx: &TierContext, field: &str, value: Option<String>) -> Result<String, TierError> {
    value.ok_or_else(|| {
        TierError::config(
            format!("{}.{field}", ctx.field),
            "required for store = \"s3\"",
        )
    })
}

/// The store an `object` entry names, with a description of where it is, and its prefix (for
/// tools that measure the store directly beside the tier).
pub fn store_of(ctx: &TierContext) -> Result<(Arc<dyn ObjectStore>, String, String), TierError> {
    let p: ObjectParams = ctx.params()?;
    let prefix = p.prefix.clone();
    let (store, where_) = build_store(ctx, &p)?;
    Ok((store, where_, prefix))
}

fn build_store(
    ctx: &TierContext,
    p: &ObjectParams,
) -> Result<(Arc<dyn ObjectStore>, String), TierError> {
    let field = |f: &str| format!("{}.{f}", ctx.field);
    Ok(match p.store {
        StoreKind::S3 => {
            // Neither key: credentials from the environment (see `S3Settings::build`).
            let mut s = S3Settings::endpoint(
                "",
                &required(ctx, "bucket", p.bucket.clone())?,
                p.access_key.as_deref().unwrap_or_default(),
                "",
            );
            s.secret_key = p.secret_key.clone().unwrap_or_default();
            s.endpoint = p.endpoint.clone();
            if let Some(region) = p.region.clone() {
                s.region = region;
            }
            if let Some(bulk) = p.bulk_delete {
                s.bulk_delete = bulk;
            }
            let store = s
                .build()
                .map_err(|e| TierError::config(field("store"), e.to_string()))?;
            (
                store,
                format!(
                    "s3 bucket {} at {}",
                    s.bucket,
                    s.endpoint.as_deref().unwrap_or("AWS")
                ),
            )
        }
        StoreKind::Local => {
            let dir = p
                .dir
                .clone()
                .ok_or_else(|| TierError::config(field("dir"), "required for store = \"local\""))?;
            std::fs::create_dir_all(&dir)
                .map_err(|e| TierError::io("create object folder", None, Some(dir.clone()), e))?;
            let store = object_store::local::LocalFileSystem::new_with_prefix(&dir)
                .map_err(|e| TierError::config(field("dir"), e.to_string()))?;
            (Arc::new(store), format!("local folder {}", dir.display()))
        }
        StoreKind::Memory => (
            Arc::new(object_store::memory::InMemory::new()),
            "memory".to_string(),
        ),
    })
}

/// Registers the `object` kind.
pub fn register(registry: &mut Registry) {
    registry.register("object", |ctx: &TierContext| {
        let p: ObjectParams = ctx.params()?;
        let field = |f: &str| format!("{}.{f}", ctx.field);
        let (store, where_) = build_store(ctx, &p)?;
        let mut config = ObjectTierConfig::new(p.prefix.clone());
        config.name = ctx.name.clone();
        config.create_only = p.create_only;
        config.capacity_bytes = p.capacity.map(|c| c.0);
        let sharing = PrefixParams {
            access: p.access,
            lease: p.lease,
            low_watermark: p.low_watermark,
            relist: p.relist,
        };
        let (access, shared, policy) = sharing
            .resolve(p.policy, tier_policy::PolicyKind::default())
            .map_err(|e| crate::field_error(ctx, e))?;
        (config.access, config.shared, config.policy) = (access, shared, policy);
        if let Some(n) = p.concurrency {
            config.concurrency = n;
        }
        if let Some(t) = p.op_timeout {
            config.op_timeout = t.0;
        }
        // Checks prefix and limits now, so `kvtier check` reports them.
        ObjectTier::open(Arc::clone(&store), config.clone()).map_err(|e| match e {
            TierError::Config { field: f, message } => TierError::config(field(&f), message),
            other => other,
        })?;
        let describe = format!(
            "object: {where_}, prefix {:?}, concurrency {}, capacity {}",
            config.prefix,
            config.concurrency,
            config
                .capacity_bytes
                .map_or("unbounded".into(), |b| format!(
                    "{} ({})",
                    ByteSize(b),
                    config.policy
                )),
        );
        let bucket = matches!(p.store, StoreKind::S3)
            .then(|| p.bucket.clone())
            .flatten();
        Ok(Box::new(ObjectPlan {
            store,
            config,
            describe,
            bucket,
        }) as Box<dyn TierPlan>)
    });
}
