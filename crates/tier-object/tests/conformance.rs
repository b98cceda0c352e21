//! The whole conformance suite on the object_store tier: against a real S3 server (s3s-fs on
//! loopback), a local folder, and memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use object_store::ObjectStore;
use tier_core::TierError;
use tier_object::{ObjectTier, ObjectTierConfig, S3Settings};
use tier_tests::s3::S3Server;
use tier_tests::suite::DynTier;
use tier_tests::TierFactory;

/// Idle connections the S3 client keeps.
const POOL: usize = 2;

/// Tiers over one store; `open` reuses the prefix (persistence), bounded tiers do not exist.
pub struct StoreFactory {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    _server: Option<S3Server>,
    _dir: Option<tempfile::TempDir>,
    opened: AtomicUsize,
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
        }
    }

    fn memory() -> Self {
        Self {
            store: Arc::new(object_store::memory::InMemory::new()),
            prefix: "suite/run".into(),
            _server: None,
            _dir: None,
            opened: AtomicUsize::new(0),
        }
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

    async fn open(&self) -> Result<DynTier, TierError> {
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(ObjectTier::new(
            Arc::clone(&self.store),
            ObjectTierConfig::new(&self.prefix),
        )?))
    }
}

mod s3 {
    tier_tests::conformance_suite!(super::StoreFactory::s3());
}

mod local_folder {
    tier_tests::conformance_suite!(super::StoreFactory::local());
}

mod in_memory {
    tier_tests::conformance_suite!(super::StoreFactory::memory());
}
