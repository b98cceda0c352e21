//! A start prints only what the user must act on: the NIXL path-mode probe leaves no error
//! line on stderr (NIXL logs glog-style lines such as `E1129 12:00:00 ... failed`).

use std::process::Command;

/// NIXL's error and warning lines: a level letter, then the month and day.
fn nixl_complaints(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            let b = l.as_bytes();
            b.len() > 5
                && matches!(b[0], b'E' | b'W' | b'F')
                && b[1..5].iter().all(u8::is_ascii_digit)
        })
        .collect()
}

#[test]
fn probe_and_a_replay_through_nixl_file_print_no_nixl_errors() {
    let kvtier = env!("CARGO_BIN_EXE_kvtier");
    let probe = Command::new(kvtier).arg("probe").output().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&probe.stdout),
        String::from_utf8_lossy(&probe.stderr),
    );
    assert!(probe.status.success(), "{out}\n{err}");
    assert!(out.contains("path mode: yes"), "{out}");
    assert_eq!(nixl_complaints(&err), Vec::<&str>::new(), "{err}");
    // The default replay: DRAM over a NIXL FILE tier (path mode probed at open).
    let replay = Command::new(kvtier)
        .args(["replay", "--limit", "50", "--page-bytes", "4096"])
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&replay.stdout),
        String::from_utf8_lossy(&replay.stderr),
    );
    assert!(replay.status.success(), "{out}\n{err}");
    assert!(out.contains("nixl-file"), "{out}");
    assert_eq!(nixl_complaints(&err), Vec::<&str>::new(), "{err}");
}

#[test]
fn complaints_are_recognised() {
    let stderr =
        "E1129 10:00:00.1 1 posix_backend.cpp:1] POSIX path-mode open failed\nno --trace given\n";
    assert_eq!(nixl_complaints(stderr).len(), 1);
}
