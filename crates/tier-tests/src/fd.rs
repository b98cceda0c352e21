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
