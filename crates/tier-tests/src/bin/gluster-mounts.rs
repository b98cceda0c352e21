//! Starts the test GlusterFS volume and its two mounts if they are not up (see
//! `tier_tests::gluster`), and prints the two mount points, one per line: the Python sharing
//! tests run on the same volume as the Rust ones.

fn main() {
    let mounts = tier_tests::gluster::mounts();
    println!("{}", mounts.a.display());
    println!("{}", mounts.b.display());
}
