//! The spared victim and the lease, each shown to fail on its broken variant.

use super::lease::{open_rw, Lease};
use super::*;
use crate::file::FolderMode;
use std::fs::File;
use std::path::{Path, PathBuf};
use tier_core::PageKey;

fn layout() -> (tempfile::TempDir, Layout) {
    let dir = tempfile::tempdir().expect("a temp folder");
    let layout = Layout::create(&[dir.path().to_path_buf()], FolderMode::Owner).expect("a layout");
    (dir, layout)
}

fn store(layout: &Layout, name: &str, bytes: &[u8]) -> PathBuf {
    let path = layout
        .page_path(&PageKey::new(name).expect("a key"))
        .expect("a path");
    let temp = layout.temp_path(&path);
    fs::write(&temp, bytes).expect("a temp file");
    fs::rename(&temp, &path).expect("renamed into place");
    path
}

fn scanned(layout: &Layout, path: &Path) -> FolderPage {
    let scan = layout.scan_shared(|_, _| false).expect("a scan");
    scan.pages
        .into_iter()
        .find(|p| p.path == path)
        .expect("the page was scanned")
}

#[test]
fn a_victim_stored_again_or_used_after_the_scan_is_spared() {
    let (_dir, layout) = layout();
    let (old, again, used) = (
        store(&layout, "old", b"old page"),
        store(&layout, "again", b"first"),
        store(&layout, "used", b"used page"),
    );
    let victims = [
        scanned(&layout, &old),
        scanned(&layout, &again),
        scanned(&layout, &used),
    ];
    // After the scan: one page is stored again (a new file), one is read (its use time
    // refreshed, as a hit does).
    store(&layout, "again", b"second");
    let later = fs::FileTimes::new().set_modified(SystemTime::now() + Duration::from_secs(5));
    File::options()
        .write(true)
        .open(&used)
        .and_then(|f| f.set_times(later))
        .expect("use time set");

    let outcomes: Vec<_> = victims
        .iter()
        .map(|v| unlink_if_unchanged(&layout, v).expect("no I/O error"))
        .collect();
    assert!(matches!(outcomes[0], Victim::Evicted(8)));
    assert!(!old.exists(), "an unchanged victim goes");
    assert!(matches!(outcomes[1], Victim::Spared(0)));
    assert_eq!(
        fs::read(&again).expect("stays"),
        b"second",
        "the page stored again stays"
    );
    assert!(matches!(outcomes[2], Victim::Spared(0)));
    assert_eq!(
        fs::read(&used).expect("stays"),
        b"used page",
        "the page used stays"
    );
    let leftovers = layout.scan_shared(|_, _| false).expect("a scan");
    assert_eq!(leftovers.pages.len(), 2);
    assert_eq!(leftovers.temps_removed, 0);
}

#[test]
fn one_holder_at_a_time_and_an_expired_lease_is_taken_over() {
    let (dir, _layout) = layout();
    let path = dir.path().join(LEASE_FILE);
    let lease = |holder: &str, ttl| Lease {
        file: open_rw(&path, FolderMode::Owner).expect("the lease file"),
        path: path.clone(),
        holder: holder.into(),
        ttl,
    };
    let (a, b) = (
        lease("a", Duration::from_millis(200)),
        lease("b", Duration::from_secs(5)),
    );
    assert_eq!(a.claim().expect("claimed"), Some(false));
    assert_eq!(b.claim().expect("asked"), None, "a holds it");
    assert!(a.renew().expect("renewed"));
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(
        b.claim().expect("claimed"),
        Some(true),
        "taken over once expired"
    );
    assert!(
        !a.renew().expect("asked"),
        "the old holder knows it lost the lease"
    );
    a.release().expect("a no-op for a non-holder");
    assert_eq!(a.claim().expect("asked"), None, "b still holds it");
    b.release().expect("released");
    assert_eq!(
        a.claim().expect("claimed"),
        Some(false),
        "free after a release"
    );
}
