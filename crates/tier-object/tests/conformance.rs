//! The whole conformance suite on the object_store tier: against a real S3 server (s3s-fs on
//! loopback), a local folder, and memory.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::ObjectStore;
use tier_core::TierError;
use tier_object::{ObjectTier, ObjectTierConfig, PolicyKind, PrefixAccess, S3Settings};
use tier_tests::s3::S3Server;
use tier_tests::suite::DynTier;
use tier_tests::TierFactory;

/// Every name in `store` not under `prefix/`.
pub async fn names_outside(
    store: &dyn ObjectStore,
    prefix: &str,
) -> Result<BTreeSet<String>, String> {
    let all: Vec<object_store::ObjectMeta> = store
        .list(None)
        .try_collect()
        .await
        .map_err(|e| format!("listing the store: {e}"))?;
    let ours = format!("{prefix}/");
    Ok(all
        .into_iter()
        .map(|m| m.location.to_string())
        .filter(|name| !name.starts_with(&ours))
        .collect())
}

/// Idle connections the S3 client keeps.
const POOL: usize = 2;

/// Tiers over one store; `open` reuses the prefix (persistence), each bounded tier gets a
/// prefix of its own and evicts by `policy`.
pub struct StoreFactory {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    _server: Option<S3Server>,
    _dir: Option<tempfile::TempDir>,
    opened: AtomicUsize,
    policy: PolicyKind,
    access: PrefixAccess,
}

impl StoreFactory {
    fn s3() -> Self {
        let server = S3Server::shared();
        let store = S3Settings::endpoint(
            &server.endpoint(),
            &server.bucket,
            &server.access_key,
            &server.secret_key,
        )
        .build()
        .unwrap();
        Self {
            store,
            prefix: "suite/run".into(),
            _server: Some(server),
            _dir: None,
            opened: AtomicUsize::new(0),
            policy: PolicyKind::Lru,
            access: PrefixAccess::Private,
        }
    }

    fn local() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        Self {
            store,
            prefix: "suite/run".into(),
            _server: None,
            _dir: Some(dir),
            opened: AtomicUsize::new(0),
            policy: PolicyKind::Lru,
            access: PrefixAccess::Private,
        }
    }

    fn memory() -> Self {
        Self {
            store: Arc::new(object_store::memory::InMemory::new()),
            prefix: "suite/run".into(),
            _server: None,
            _dir: None,
            opened: AtomicUsize::new(0),
            policy: PolicyKind::Lru,
            access: PrefixAccess::Private,
        }
    }
}

impl StoreFactory {
    fn policy(mut self, policy: PolicyKind) -> Self {
        self.policy = policy;
        self
    }

    /// Bounded tiers on shared prefixes (one evictor by lease, victims by age).
    fn shared(mut self) -> Self {
        self.access = PrefixAccess::Shared;
        self
    }
}

#[tier_core::async_trait]
impl TierFactory for StoreFactory {
    fn fd_slack(&self) -> usize {
        // Idle pooled connections to the S3 server each hold a socket.
        if self._server.is_some() {
            POOL
        } else {
            0
        }
    }

    async fn names_outside(&self) -> Option<Result<BTreeSet<String>, String>> {
        Some(names_outside(self.store.as_ref(), &self.prefix).await)
    }

    async fn open(&self) -> Result<DynTier, TierError> {
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(ObjectTier::open(
            Arc::clone(&self.store),
            ObjectTierConfig::new(&self.prefix),
        )?))
    }

    async fn open_bounded(&self, capacity_bytes: u64) -> Option<Result<DynTier, TierError>> {
        let n = self.opened.fetch_add(1, Ordering::Relaxed);
        let mut config = ObjectTierConfig::new(format!("{}/bounded-{n}", self.prefix));
        config.capacity_bytes = Some(capacity_bytes);
        config.policy = self.policy;
        config.access = self.access;
        // Every put of a shared prefix's only node lists it: its bound is then exact.
        config.shared.relist = std::time::Duration::from_nanos(1);
        let opened = async {
            let tier = ObjectTier::open(Arc::clone(&self.store), config)?;
            tier.load_catalog().await?;
            Ok(Arc::new(tier) as DynTier)
        };
        Some(opened.await)
    }
}

mod s3 {
    tier_tests::conformance_suite!(super::StoreFactory::s3());
}

mod s3_shared_prefix {
    tier_tests::conformance_suite!(super::StoreFactory::s3().shared());
}

mod local_folder {
    tier_tests::conformance_suite!(super::StoreFactory::local());
}

mod in_memory {
    tier_tests::conformance_suite!(super::StoreFactory::memory());
}

/// Bounded tiers under every policy an object tier takes, the default `auto` too (in memory: the bound is the
/// catalog's, the store's kind does not change it).
macro_rules! per_policy {
    ($($module:ident: $policy:ident),* $(,)?) => {
        $(mod $module {
            tier_tests::conformance_suite!(
                super::StoreFactory::memory().policy(super::PolicyKind::$policy)
            );
        })*
    };
}

per_policy!(lru: Lru, radix: Radix, sieve: Sieve, s3fifo: S3fifo, arc: Arc, prefix: Prefix, lfu: Lfu, sampled: Sampled, auto: Auto);
