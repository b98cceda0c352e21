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
/// How long a test waits for the setup lock: the setup from nothing (glusterd, the volume, the
/// mounts) takes well under a minute.
const LOCK_WAIT: Duration = Duration::from_secs(300);

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
        // Polled, so that a holder that never lets go (a setup stuck on a hung mount) fails the
        // tests waiting rather than hanging them.
        let deadline = Instant::now() + LOCK_WAIT;
        // SAFETY: a valid open fd; the lock is dropped with the file.
        while unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            assert!(
                Instant::now() < deadline,
                "the GlusterFS setup lock {LOCK} was held for over {LOCK_WAIT:?}: a setup stuck \
                 on a hung mount? (`fuser -v {LOCK}` names its holder)"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
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
        run(
            "glusterd",
            &["-p", "/run/kvtier-glusterd.pid"],
            "starting glusterd",
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
        ensure_mounted(Path::new(mount), MOUNT_ANSWER);
    }
}

/// How long a shared mount has to list its root before it counts as hung and is replaced
/// (under other tests' processes using it: long enough for a loaded client to answer).
const MOUNT_ANSWER: Duration = Duration::from_secs(30);

/// How long a command of the setup (the gluster CLI, `mount`, `umount`) may run.
const COMMAND_WAIT: Duration = Duration::from_secs(120);

/// Leaves a mount of the volume at `point` that answers: one already there is kept if it lists
/// its root within `within`; one that does not is replaced. A dead one (its client
/// died, the mount stayed) answers "Transport endpoint is not connected"; a hung one (its
/// client stopped or stuck) does not answer at all: its client is killed first, which ends
/// every wait on the mount, then it is unmounted.
fn ensure_mounted(point: &Path, within: Duration) {
    let shown = point.to_str().expect("a UTF-8 mount point");
    if mounted(shown) {
        if answers(point, within) {
            return;
        }
        if let Some(client) = client_of(point) {
            // SAFETY: kill(2) on the mount's FUSE client; no memory is involved.
            unsafe { libc::kill(client, libc::SIGKILL) };
        }
        run(
            "umount",
            &["-l", shown],
            &format!("unmounting the dead or hung mount {shown}"),
        );
    }
    mount_volume(point);
}

/// Whether listing `path` ends, in success, within `within`. The listing runs on a thread of
/// its own, left behind if the mount never answers (its wait ends when the mount's client is
/// killed or the mount goes).
fn answers(path: &Path, within: Duration) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = path.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("gluster-mount-check".into())
        .spawn(move || {
            let _ = tx.send(fs::read_dir(&path).is_ok());
        });
    spawned.is_ok() && rx.recv_timeout(within).unwrap_or(false)
}

/// Mounts the volume at `point` (created if missing).
fn mount_volume(point: &Path) {
    fs::create_dir_all(point).expect("a mount point");
    let point = point.to_str().expect("a UTF-8 mount point");
    let source = format!("{}:/{VOLUME}", hostname());
    let what = format!("mounting the volume at {point}");
    run("mount", &["-t", "glusterfs", &source, point], &what);
}

/// Runs `program`, panicking with its error output, saying `what` failed, if it fails or
/// runs longer than [`COMMAND_WAIT`].
fn run(program: &str, args: &[&str], what: &str) {
    let out = output(Command::new(program).args(args))
        .unwrap_or_else(|e| panic!("{what}: {program}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What `command` printed and how it ended; an error if it does not start, or if it runs
/// longer than [`COMMAND_WAIT`] (it is killed then).
fn output(command: &mut Command) -> Result<std::process::Output, String> {
    use std::io::Read;
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("does not run: {e}"))?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + COMMAND_WAIT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("ran over {COMMAND_WAIT:?} and was killed"));
            }
            Err(e) => return Err(format!("could not be waited for: {e}")),
        }
    };
    Ok(std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// A mount of the test volume for one test alone, whose client (its FUSE daemon) the test
/// may freeze to make the mount hang, as a network filesystem whose server is gone does.
/// Dropped, it is thawed and unmounted.
pub struct ClientMount {
    path: PathBuf,
    client: libc::pid_t,
}

impl ClientMount {
    /// Mounts the volume (started if needed) at a mount point of its own.
    pub fn new(name: &str) -> Self {
        mounts();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = PathBuf::from(format!(
            "/mnt/kvtier-gluster-{name}-{}-{nanos}",
            std::process::id()
        ));
        mount_volume(&path);
        let client = client_of(&path)
            .unwrap_or_else(|| panic!("no GlusterFS client process serves {}", path.display()));
        Self { path, client }
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A fresh folder of the volume for one test, through this mount.
    pub fn folder(&self, name: &str) -> PathBuf {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let folder = self
            .path
            .join(format!("{name}-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&folder).expect("a test folder on the GlusterFS volume");
        folder
    }

    /// Stops the client: every access to the mount not answered from the kernel's caches
    /// waits until [`thaw`](Self::thaw). Returns once every thread of the client is stopped.
    pub fn freeze(&self) {
        crate::freeze::freeze(self.client);
    }

    /// Lets the client go on.
    pub fn thaw(&self) {
        crate::freeze::thaw(self.client);
    }
}

impl Drop for ClientMount {
    fn drop(&mut self) {
        self.thaw();
        let _ = output(Command::new("umount").arg("-l").arg(&self.path));
        let _ = fs::remove_dir(&self.path);
    }
}

/// The GlusterFS client process whose command line names the mount point `path`.
fn client_of(path: &Path) -> Option<libc::pid_t> {
    let wanted = path.as_os_str().as_encoded_bytes();
    fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: libc::pid_t = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = fs::read(entry.path().join("cmdline")).ok()?;
        let mut args = cmdline.split(|&b| b == 0);
        let program = args.next()?;
        (program.ends_with(b"glusterfs") && args.any(|a| a == wanted)).then_some(pid)
    })
}

/// Runs the gluster CLI: whether it succeeded, and what it printed.
fn gluster(args: &[&str]) -> (bool, String) {
    match output(Command::new("gluster").arg("--mode=script").args(args)) {
        Ok(out) => (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Err(e) => (false, e),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A mount whose client is stopped (a hung mount) is told from a live one within the
    /// bound, and the setup replaces it with one that answers instead of waiting on it.
    #[test]
    fn a_hung_mount_is_replaced_not_waited_on() {
        let mount = ClientMount::new("hung-setup");
        let bound = Duration::from_secs(2);
        assert!(
            answers(mount.path(), MOUNT_ANSWER),
            "a fresh mount lists its root"
        );
        mount.freeze();
        let started = Instant::now();
        assert!(
            !answers(mount.path(), bound),
            "a mount whose client is stopped listed its root"
        );
        ensure_mounted(mount.path(), bound);
        let took = started.elapsed();
        assert!(
            answers(mount.path(), MOUNT_ANSWER),
            "the replaced mount does not list its root"
        );
        let client = client_of(mount.path()).expect("a client serves the replaced mount");
        assert_ne!(
            client, mount.client,
            "the stopped client still serves the mount"
        );
        assert!(
            took < bound * 2 + COMMAND_WAIT,
            "replacing the hung mount took {took:?}"
        );
    }
}
