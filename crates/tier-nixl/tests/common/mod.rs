//! Factories opening NIXL FILE tiers on the real runtime, for the conformance suite.

use std::path::PathBuf;
use std::sync::Arc;

use tier_core::TierError;
use tier_nixl::{FileMode, NixlFileConfig, NixlFileTier, PathModeChoice};
use tier_tests::suite::DynTier;
use tier_tests::TierFactory;

/// Opens tiers over two storage folders in a private temp folder, in one mode.
pub struct FileFactory {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    mode: PathModeChoice,
    direct: tier_nixl::DirectIo,
    engine: tier_nixl::FileEngine,
    policy: tier_policy::PolicyKind,
    durability: tier_nixl::Durability,
    access: tier_nixl::FileAccess,
    bounded_io: tier_nixl::BoundedIo,
    bounded: std::sync::atomic::AtomicUsize,
}

impl FileFactory {
    #[allow(dead_code)]
    pub fn new(mode: PathModeChoice) -> Self {
        let tmp = tempfile::tempdir().expect("a temp folder");
        // Two levels down, so the suite's escape check watches folders nobody else touches.
        let root = tmp.path().join("a").join("tier");
        Self {
            _tmp: tmp,
            root,
            mode,
            direct: tier_nixl::DirectIo::Off,
            engine: tier_nixl::FileEngine::Nixl,
            policy: tier_policy::PolicyKind::default(),
            durability: tier_nixl::Durability::Process,
            access: tier_nixl::FileAccess::Owner,
            bounded_io: tier_nixl::BoundedIo::Auto,
            bounded: Default::default(),
        }
    }

    /// Requires O_DIRECT for every page.
    #[allow(dead_code)]
    pub fn direct(mut self) -> Self {
        self.direct = tier_nixl::DirectIo::Required;
        self
    }

    /// Evicts by `policy` when bounded.
    #[allow(dead_code)]
    pub fn policy(mut self, policy: tier_policy::PolicyKind) -> Self {
        self.policy = policy;
        self
    }

    /// Acknowledges pages as durable as `durability` says.
    #[allow(dead_code)]
    pub fn durability(mut self, durability: tier_nixl::Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Opens its folders in shared access (beside other processes).
    #[allow(dead_code)]
    pub fn shared(mut self) -> Self {
        self.access = tier_nixl::FileAccess::Shared;
        self
    }

    /// Moves bytes with the tier's own syscalls instead of NIXL.
    #[allow(dead_code)]
    pub fn syscalls(mut self) -> Self {
        self.engine = tier_nixl::FileEngine::Syscalls;
        self
    }

    /// Bounds every call's file I/O (reads through staging), as on a network filesystem.
    #[allow(dead_code)]
    pub fn bounded_io(mut self) -> Self {
        self.bounded_io = tier_nixl::BoundedIo::On;
        self
    }

    pub fn config(&self, dirs: &[PathBuf]) -> NixlFileConfig {
        let mut config = NixlFileConfig::new(dirs.iter().cloned());
        config.path_mode = self.mode;
        config.direct_io = self.direct;
        config.engine = self.engine;
        config.policy = self.policy;
        config.durability = self.durability;
        config.access = self.access;
        config.bounded_io = self.bounded_io;
        config
    }

    fn dirs(&self) -> Vec<PathBuf> {
        vec![self.root.join("disk0"), self.root.join("disk1")]
    }

    async fn open_with(&self, config: NixlFileConfig) -> Result<DynTier, TierError> {
        let tier = NixlFileTier::open(config).await?;
        let want = match self.mode {
            PathModeChoice::Off => FileMode::Fd,
            _ => FileMode::Path,
        };
        assert_eq!(
            tier.mode(),
            want,
            "NIXL 1.5.1 must be used in {want} mode here"
        );
        Ok(Arc::new(tier))
    }
}

#[tier_core::async_trait]
impl TierFactory for FileFactory {
    async fn open(&self) -> Result<DynTier, TierError> {
        self.open_with(self.config(&self.dirs())).await
    }

    async fn open_bounded(&self, capacity_bytes: u64) -> Option<Result<DynTier, TierError>> {
        let n = self
            .bounded
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut config = self.config(&[self.root.join(format!("bounded{n}"))]);
        config.capacity_bytes = Some(capacity_bytes);
        Some(self.open_with(config).await)
    }

    fn root(&self) -> Option<PathBuf> {
        Some(self.root.clone())
    }

    async fn break_storage(&self) -> Option<String> {
        for dir in self.dirs() {
            for entry in std::fs::read_dir(&dir).ok()?.flatten() {
                if entry.path().is_dir() {
                    std::fs::remove_dir_all(entry.path()).ok()?;
                }
            }
        }
        Some("its bucket folders were deleted".into())
    }
}

/// Opens NIXL OBJ tiers on one s3s-fs bucket (the run's shared server unless said), all under
/// one prefix.
pub struct ObjFactory {
    pub server: tier_tests::s3::S3Server,
    pub prefix: String,
}

impl ObjFactory {
    /// On a bucket of the run's shared server.
    #[allow(dead_code)]
    pub fn new() -> Self {
        Self::on(tier_tests::s3::S3Server::shared())
    }

    /// On a server of the factory's own, for tests that stop or restart it.
    #[allow(dead_code)]
    pub fn with_own_server() -> Self {
        Self::on(tier_tests::s3::S3Server::start())
    }

    fn on(server: tier_tests::s3::S3Server) -> Self {
        Self {
            server,
            prefix: "suite/run".into(),
        }
    }

    /// The tier's config for this server.
    #[allow(dead_code)]
    pub fn config(&self) -> tier_nixl::NixlObjConfig {
        let s = &self.server;
        let mut s3 = tier_object::S3Settings::endpoint(
            &s.endpoint(),
            &s.bucket,
            &s.access_key,
            &s.secret_key,
        );
        s3.max_idle_connections = Some(OBJ_POOL);
        tier_nixl::NixlObjConfig::new(s3, &self.prefix)
    }
}

/// Idle `object_store` connections an OBJ tier keeps.
pub const OBJ_POOL: usize = 2;

#[tier_core::async_trait]
impl TierFactory for ObjFactory {
    fn fd_slack(&self) -> usize {
        // Idle pooled object_store connections (NIXL's S3 client kept none open here).
        OBJ_POOL
    }

    async fn open(&self) -> Result<DynTier, TierError> {
        Ok(Arc::new(tier_nixl::NixlObjTier::open(self.config()).await?))
    }

    async fn names_outside(&self) -> Option<Result<std::collections::BTreeSet<String>, String>> {
        use futures::TryStreamExt;
        let listed = async {
            let store = self.config().s3.build().map_err(|e| e.to_string())?;
            let all: Vec<object_store::ObjectMeta> = store
                .list(None)
                .try_collect()
                .await
                .map_err(|e| format!("listing the bucket: {e}"))?;
            let ours = format!("{}/", self.prefix);
            Ok(all
                .into_iter()
                .map(|m| m.location.to_string())
                .filter(|name| !name.starts_with(&ours))
                .collect())
        };
        Some(listed.await)
    }

    /// A bounded tier under a prefix of its own (its catalog starts empty).
    async fn open_bounded(&self, capacity_bytes: u64) -> Option<Result<DynTier, TierError>> {
        static OPENED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = OPENED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut config = self.config();
        config.prefix = format!("{}/bounded-{}-{n}", self.prefix, std::process::id());
        config.capacity_bytes = Some(capacity_bytes);
        Some(
            tier_nixl::NixlObjTier::open(config)
                .await
                .map(|t| Arc::new(t) as DynTier),
        )
    }
}
