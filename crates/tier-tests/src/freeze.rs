//! Freezing a process with SIGSTOP, as a store or mount whose server is gone behaves, and
//! letting it go on. `kill` returns once the signal is queued, and a thread of the target
//! running on another core may answer a request or two before the stop reaches it:
//! [`freeze`] returns only once every thread is stopped.

use std::fs;
use std::time::{Duration, Instant};

/// How long [`freeze`] waits for every thread to stop before it fails the test.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// Stops process `pid` (SIGSTOP) and returns once every thread of it is stopped; panics,
/// naming the process, if that takes longer than 10 s.
pub fn freeze(pid: libc::pid_t) {
    signal(pid, libc::SIGSTOP);
    let deadline = Instant::now() + STOP_WAIT;
    while !all_stopped(pid) {
        assert!(
            Instant::now() < deadline,
            "process {pid} was sent SIGSTOP and did not stop within {STOP_WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Lets a frozen process go on (SIGCONT); one already gone is left alone.
pub fn thaw(pid: libc::pid_t) {
    // SAFETY: kill(2) on a process the test started; no memory is involved.
    unsafe { libc::kill(pid, libc::SIGCONT) };
}

fn signal(pid: libc::pid_t, signal: libc::c_int) {
    // SAFETY: as in `thaw`.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {signal}) failed: {}",
        std::io::Error::last_os_error()
    );
}

/// Whether every thread of process `pid` is stopped (state `T` or `t` in its `stat`).
pub fn all_stopped(pid: libc::pid_t) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // `pid (comm) S ...`: the state follows the last `)`.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_some_and(|state| state == 'T' || state == 't')
        })
    })
}
