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
