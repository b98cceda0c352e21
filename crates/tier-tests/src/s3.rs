//! A real S3 server on loopback for tests: s3s-fs over a temp folder, on a free port, with
//! one bucket, stopped by PID on drop. Installed by `scripts/setup.sh s3`; a missing binary
//! fails the test that needs it.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where `scripts/setup.sh s3` installs s3s-fs (override with `KVTIER_S3S_BIN`).
pub const DEFAULT_BIN: &str = "/opt/kvtier/s3s/bin/s3s-fs";

/// A running s3s-fs.
pub struct S3Server {
    child: Option<Child>,
    data: tempfile::TempDir,
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
    /// Starts a server with bucket `kvtier`; panics with the reason if it cannot.
    pub fn start() -> Self {
        let data = tempfile::tempdir().expect("a temp folder for the S3 server");
        std::fs::create_dir(data.path().join("kvtier")).expect("the bucket folder");
        let port = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = Self {
            child: None,
            data,
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

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The folder the bucket lives in.
    pub fn data_dir(&self) -> PathBuf {
        self.data.path().to_path_buf()
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
            .arg(self.data.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        self.child = Some(child);
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

    /// Kills the server (data kept).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and data.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}
