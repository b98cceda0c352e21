//! `kvtier probe DIR [--other MOUNT]`: what a folder's filesystem gives a FILE tier, on a local
//! folder and on the two mounts of the test GlusterFS volume (two clients of one folder).

use std::process::Command;

fn probe(args: &[&std::path::Path]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvtier"));
    cmd.arg("probe").arg(args[0]);
    if let Some(other) = args.get(1) {
        cmd.arg("--other").arg(other);
    }
    let out = cmd.output().expect("kvtier runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    stdout
}

#[test]
fn a_local_folder_locks_for_one_machine_and_is_left_as_found() {
    let dir = tempfile::tempdir().unwrap();
    let out = probe(&[dir.path()]);
    assert!(out.contains("local: yes"), "{out}");
    assert!(out.contains("locks: across processes"), "{out}");
    assert!(out.contains("hard links: yes"), "{out}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn two_mounts_of_a_distributed_filesystem_are_tried_for_locks_across_clients() {
    let (a, b) = tier_tests::gluster::mounts().folder("probe");
    let out = probe(&[&a, &b]);
    println!("{out}");
    assert!(out.contains("fuse.glusterfs"), "{out}");
    assert!(out.contains("local: no"), "{out}");
    assert!(out.contains("locks: across clients (tried"), "{out}");
    let alone = probe(&[&a]);
    assert!(alone.contains("locks: unknown across clients"), "{alone}");
    let _ = std::fs::remove_dir_all(&a);
}

/// A folder whose mount hangs (the GlusterFS client stopped, as a network filesystem whose
/// server is gone): `probe` fails by its `--timeout`, naming the folder, and `check` of a
/// config naming it answers at once (it opens nothing). The probe waited for the mount.
#[test]
fn a_hung_mount_fails_the_probe_by_its_timeout_and_check_answers_at_once() {
    let mount = tier_tests::gluster::ClientMount::new("hung-probe");
    let dir = mount.folder("probe");
    let scratch = tempfile::tempdir().unwrap();
    let config = scratch.path().join("kvtier.toml");
    std::fs::write(
        &config,
        format!(
            "[[tiers]]\nkind = \"nixl-file\"\ndirs = [{:?}]\n",
            dir.display()
        ),
    )
    .unwrap();
    mount.freeze();
    let run = |args: &[&std::ffi::OsStr]| {
        let started = std::time::Instant::now();
        let child = Command::new(env!("CARGO_BIN_EXE_kvtier"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("kvtier runs");
        let out = output_within(child, std::time::Duration::from_secs(30));
        (out, started.elapsed())
    };
    let (probed, probe_took) = run(&[
        "probe".as_ref(),
        dir.as_os_str(),
        "--timeout".as_ref(),
        "1s".as_ref(),
    ]);
    let (checked, check_took) = run(&["check".as_ref(), config.as_os_str()]);
    mount.thaw();
    let probed = probed.expect("the probe ends on a hung mount");
    let checked = checked.expect("the check ends on a hung mount");
    let stderr = String::from_utf8_lossy(&probed.stderr);
    println!("probe failed in {probe_took:?}: {stderr}");
    assert!(!probed.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("probing {}", dir.display()))
            && stderr.contains("did not answer within 1s"),
        "{stderr}"
    );
    assert!(
        probe_took < std::time::Duration::from_secs(5),
        "{probe_took:?}"
    );
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    assert!(
        check_took < std::time::Duration::from_secs(5),
        "{check_took:?}"
    );
}

/// A child's output once it exits, or `None` (the child killed) if it runs past `bound`.
fn output_within(
    mut child: std::process::Child,
    bound: std::time::Duration,
) -> Option<std::process::Output> {
    let deadline = std::time::Instant::now() + bound;
    while child.try_wait().expect("waits on kvtier").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Some(child.wait_with_output().expect("kvtier's output"))
}
