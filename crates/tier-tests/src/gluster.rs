//! A real distributed filesystem for sharing tests: one GlusterFS volume on a local brick,
//! mounted twice through FUSE. The two mounts are two clients with caches of their own, as two
//! nodes see one shared filesystem (a file written through one shows through the other; an
//! attribute may take about a second to).
//!
//! [`mounts`] starts what is missing (glusterd, the volume, the mounts), once per machine, and
//! leaves it running for later tests and runs, as the shared S3 server is. It needs root and
//! the Debian packages `glusterfs-server` and `glusterfs-client` (`scripts/setup.sh` installs
//! them); without them it panics saying so, so a test that needs it fails rather than skips.

use std::fs;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const VOLUME: &str = "kvtier-test";
const BRICK: &str = "/srv/kvtier-gluster/brick";
const MOUNTS: [&str; 2] = ["/mnt/kvtier-gluster-a", "/mnt/kvtier-gluster-b"];
const LOCK: &str = "/run/kvtier-gluster.lock";

/// The two mounts of the test volume.
#[derive(Debug, Clone)]
pub struct Mounts {
    /// The first client's mount.
    pub a: PathBuf,
    /// The second client's mount.
    pub b: PathBuf,
}

impl Mounts {
    /// A fresh folder of the volume for one test: its path through each mount.
    pub fn folder(&self, name: &str) -> (PathBuf, PathBuf) {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let unique = format!("{name}-{}-{nanos}", std::process::id());
        let a = self.a.join(&unique);
        fs::create_dir_all(&a).expect("a test folder on the GlusterFS volume");
        let b = self.b.join(&unique);
        wait_for(
            &format!("{} to show through the second mount", a.display()),
            || b.is_dir(),
        );
        (a, b)
    }
}

/// The volume's two mounts, started if needed (see the module docs).
pub fn mounts() -> &'static Mounts {
    static MOUNTS_UP: OnceLock<Mounts> = OnceLock::new();
    MOUNTS_UP.get_or_init(|| {
        let lock = fs::File::create(LOCK).expect("the GlusterFS setup lock (tests run as root)");
        // SAFETY: a valid open fd; the lock is dropped with the file.
        assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
        start();
        Mounts {
            a: PathBuf::from(MOUNTS[0]),
            b: PathBuf::from(MOUNTS[1]),
        }
    })
}

fn start() {
    assert!(
        Path::new("/usr/sbin/glusterd").exists(),
        "GlusterFS is not installed: run scripts/setup.sh (glusterfs-server, glusterfs-client)"
    );
    if !gluster(&["volume", "info"]).0 {
        let out = Command::new("glusterd")
            .args(["-p", "/run/kvtier-glusterd.pid"])
            .output()
            .expect("glusterd runs");
        assert!(
            out.status.success(),
            "glusterd: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        wait_for("glusterd to answer", || gluster(&["volume", "info"]).0);
    }
    if !gluster(&["volume", "info", VOLUME]).0 {
        fs::create_dir_all(BRICK).expect("the brick folder");
        let brick = format!("{}:{BRICK}", hostname());
        let (ok, out) = gluster(&["volume", "create", VOLUME, &brick, "force"]);
        assert!(ok, "gluster volume create: {out}");
    }
    let (_, status) = gluster(&["volume", "status", VOLUME]);
    if !status.contains("Online") || status.contains("not started") {
        let (ok, out) = gluster(&["volume", "start", VOLUME, "force"]);
        assert!(ok, "gluster volume start: {out}");
    }
    for mount in MOUNTS {
        if mounted(mount) {
            if fs::read_dir(mount).is_ok() {
                continue;
            }
            // A mount whose client died (the machine's processes were stopped, the mount
            // stayed): it answers "Transport endpoint is not connected" until replaced.
            let out = Command::new("umount")
                .args(["-l", mount])
                .output()
                .expect("umount runs");
            assert!(
                out.status.success(),
                "unmounting the dead mount {mount}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        fs::create_dir_all(mount).expect("a mount point");
        let out = Command::new("mount")
            .args([
                "-t",
                "glusterfs",
                &format!("{}:/{VOLUME}", hostname()),
                mount,
            ])
            .output()
            .expect("mount runs");
        assert!(
            out.status.success(),
            "mounting the volume at {mount}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Runs the gluster CLI: whether it succeeded, and what it printed.
fn gluster(args: &[&str]) -> (bool, String) {
    match Command::new("gluster")
        .arg("--mode=script")
        .args(args)
        .output()
    {
        Ok(out) => (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Err(e) => (false, e.to_string()),
    }
}

fn mounted(path: &str) -> bool {
    fs::read_to_string("/proc/mounts").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split_whitespace().nth(1) == Some(path) && l.contains("fuse.glusterfs"))
    })
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it.
    assert_eq!(
        unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) },
        0
    );
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

fn wait_for(what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        assert!(Instant::now() < deadline, "waited over a minute for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
