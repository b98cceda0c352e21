//! Counting what this process holds: open file descriptors and resident memory.

/// The number of open file descriptors of this process, from `/proc/self/fd`.
pub fn open_fds() -> std::io::Result<usize> {
    // The directory handle read_dir holds is counted, the same on every call.
    Ok(std::fs::read_dir("/proc/self/fd")?.count())
}

/// Resident memory of this process in bytes (`VmRSS` from `/proc/self/status`).
pub fn resident_bytes() -> std::io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| std::io::Error::other("no VmRSS line in /proc/self/status"))
}

const CHILD: &str = "KVTIER_TEST_CHILD";

/// For tests that count what the whole process holds: under a runner that runs tests as
/// threads of one process (`cargo test`), runs the calling test again alone, in a child
/// process of the test binary, requires it to pass, and returns `false` (the caller returns).
/// Returns `true` where the caller should run its body: in that child, or under a runner that
/// gives each test a process of its own (nextest). The test is named by its thread, as
/// libtest names it.
pub fn in_own_process() -> bool {
    if std::env::var_os("NEXTEST").is_some() || std::env::var_os(CHILD).is_some() {
        return true;
    }
    let name = std::thread::current()
        .name()
        .expect("libtest names each test's thread")
        .to_string();
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .expect("the test binary runs as a child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} in its own process: {}\n{stdout}\n{stderr}",
        out.status
    );
    print!("{stdout}");
    false
}
