//! A real S3 server on loopback for tests, s3s-fs (installed by `scripts/setup.sh s3`; a
//! missing binary fails the test that needs it):
//! - [`S3Server::shared`]: a fresh bucket on the server `make test` started for the whole run
//!   (`scripts/with-s3.sh` exports it as `KVTIER_S3_*`), for tests that only use a server;
//! - [`S3Server::start`]: a server of the test's own, over a temp folder, on a free port,
//!   stopped by PID on drop, for tests that stop or restart it.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Where `scripts/setup.sh s3` installs s3s-fs (override with `KVTIER_S3S_BIN`).
pub const DEFAULT_BIN: &str = "/opt/kvtier/s3s/bin/s3s-fs";

/// A running s3s-fs and a bucket on it.
pub struct S3Server {
    process: Process,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// The bucket created for tests.
    pub bucket: String,
    /// Access key.
    pub access_key: String,
    /// Secret key.
    pub secret_key: String,
}

impl S3Server {
    /// A bucket of its own on the run's shared server, removed on drop. Where `make test` did
    /// not start one (`KVTIER_S3_ENDPOINT` unset), a server of the test's own, except under
    /// CI, where that fails: the suites must run against the server CI started.
    pub fn shared() -> Self {
        let Ok(endpoint) = std::env::var("KVTIER_S3_ENDPOINT") else {
            assert!(
                std::env::var_os("CI").is_none(),
                "KVTIER_S3_ENDPOINT is not set: under CI the tests run beside the S3 server \
                 `make test` starts (scripts/with-s3.sh)"
            );
            return Self::start();
        };
        let var = |name: &str| {
            std::env::var(name)
                .unwrap_or_else(|_| panic!("{name} must be set with KVTIER_S3_ENDPOINT"))
        };
        let port = endpoint
            .strip_prefix("http://127.0.0.1:")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| {
                panic!("KVTIER_S3_ENDPOINT {endpoint:?} is not http://127.0.0.1:<port>")
            });
        static BUCKETS: AtomicUsize = AtomicUsize::new(0);
        let bucket = format!(
            "t{}-{}",
            std::process::id(),
            BUCKETS.fetch_add(1, Ordering::Relaxed)
        );
        let data = PathBuf::from(var("KVTIER_S3_DATA_DIR"));
        std::fs::create_dir(data.join(&bucket)).expect("the bucket folder on the shared server");
        Self {
            process: Process::Shared { data },
            port,
            bucket,
            access_key: var("KVTIER_S3_ACCESS_KEY"),
            secret_key: var("KVTIER_S3_SECRET_KEY"),
        }
    }

    /// Starts a server of the test's own with bucket `kvtier`; panics with the reason if it
    /// cannot.
    pub fn start() -> Self {
        let data = tempfile::tempdir().expect("a temp folder for the S3 server");
        std::fs::create_dir(data.path().join("kvtier")).expect("the bucket folder");
        let port = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = Self {
            process: Process::Own { child: None, data },
            port,
            bucket: "kvtier".into(),
            access_key: "kvtier-test-key".into(),
            secret_key: "kvtier-test-secret".into(),
        };
        server.spawn();
        server
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The server's process id, while it runs (`None` for the shared server).
    pub fn pid(&self) -> Option<u32> {
        match &self.process {
            Process::Own { child, .. } => child.as_ref().map(Child::id),
            Process::Shared { .. } => None,
        }
    }

    /// The server's data folder: the bucket is its subfolder `bucket`.
    pub fn data_dir(&self) -> PathBuf {
        match &self.process {
            Process::Own { data, .. } => data.path().to_path_buf(),
            Process::Shared { data } => data.clone(),
        }
    }

    fn own_child(&mut self) -> &mut Option<Child> {
        match &mut self.process {
            Process::Own { child, .. } => child,
            Process::Shared { .. } => {
                panic!(
                    "only a server the test started (S3Server::start) can be stopped or restarted"
                )
            }
        }
    }

    fn spawn(&mut self) {
        let bin = std::env::var_os("KVTIER_S3S_BIN")
            .map_or_else(|| PathBuf::from(DEFAULT_BIN), PathBuf::from);
        assert!(
            bin.is_file(),
            "s3s-fs not found at {} (install it with `scripts/setup.sh s3`)",
            bin.display()
        );
        let child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--access-key",
                &self.access_key,
                "--secret-key",
                &self.secret_key,
            ])
            .arg(self.data_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        *self.own_child() = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port);
        while TcpStream::connect_timeout(&addr.into(), Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "s3s-fs did not listen on port {} within 10 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (data kept). Only for a server of the test's own.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.own_child().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server (SIGSTOP): connections are accepted by the kernel and never
    /// answered, as a blackholed or overloaded store behaves. Returns once every thread of it
    /// is stopped. Only for a server of the test's own.
    pub fn freeze(&self) {
        crate::freeze::freeze(self.own_pid());
    }

    /// Lets a frozen server run again (SIGCONT).
    pub fn thaw(&self) {
        crate::freeze::thaw(self.own_pid());
    }

    fn own_pid(&self) -> libc::pid_t {
        let pid = self.pid().expect("a server of the test's own, running");
        libc::pid_t::try_from(pid).expect("a pid")
    }

    /// Starts it again on the same port and data. Only for a server of the test's own.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        match &mut self.process {
            Process::Own { child, .. } => {
                if let Some(mut child) = child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
            Process::Shared { data } => {
                let _ = std::fs::remove_dir_all(data.join(&self.bucket));
            }
        }
    }
}

/// Whose server it is.
enum Process {
    /// Started by this test: the process (while it runs) and its data folder.
    Own {
        child: Option<Child>,
        data: tempfile::TempDir,
    },
    /// The run's shared server, and its data folder.
    Shared { data: PathBuf },
}
