//! The catalog: files and entries change together; generations guard every change.

use super::*;
use crate::file::FolderMode;
use tier_policy::PolicyKind;

fn key(s: &str) -> PageKey {
    PageKey::new(s).expect("a valid key")
}

fn owner() -> (tempfile::TempDir, Catalog) {
    let dir = tempfile::tempdir().expect("a temp folder");
    let layout = Layout::create(&[dir.path().to_path_buf()], FolderMode::Owner).expect("a layout");
    let index = PageIndex::new(PolicyKind::Lru).expect("an index");
    let (catalog, _) = Catalog::owned(layout, index).expect("a catalog");
    (dir, catalog)
}

/// Writes `bytes` to a temp file and commits it as `key`'s page, with `ok` as its write's
/// result; returns the page's path and the temp file's.
fn commit(catalog: &Catalog, key: &PageKey, bytes: &[u8], ok: bool) -> (PathBuf, PathBuf) {
    let path = catalog.layout().page_path(key).expect("a page path");
    let temp = catalog.layout().temp_path(&path);
    fs::write(&temp, bytes).expect("a temp file");
    let xfer = Xfer {
        key: key.clone(),
        path: temp.clone(),
        len: bytes.len(),
        direct: false,
        parts: Vec::new(),
        checksum: None,
    };
    let result = if ok {
        Ok(())
    } else {
        Err(TierError::Unavailable("the write failed".into()))
    };
    let mut outcome = BatchOutcome {
        results: vec![result],
        poisoned: false,
    };
    catalog.commit(
        &[xfer],
        std::slice::from_ref(&path),
        &mut outcome,
        &[Some(7)],
    );
    (path, temp)
}

/// A read of `key`'s page (planned with `generation`) that found it gone.
fn settled<'r>(key: &'r PageKey, generation: u64, path: &'r Path) -> SettledRead<'r> {
    SettledRead {
        key,
        generation,
        mtime_ns: None,
        path,
        found: Some(false),
    }
}

fn generation_of(catalog: &Catalog, key: &PageKey) -> Option<u64> {
    let (_pins, stored) = catalog.pin([key]);
    stored[0].map(|s| s.generation)
}

#[test]
fn a_committed_page_is_its_file_and_its_entry_and_a_failed_one_neither() {
    let (_dir, catalog) = owner();
    let (a, b) = (key("a"), key("b"));
    let (path, temp) = commit(&catalog, &a, b"page a", true);
    assert_eq!(fs::read(&path).expect("the page file"), b"page a");
    assert!(!temp.exists(), "the temp file was renamed into place");
    let (_pins, stored) = catalog.pin([&a]);
    let stored = stored[0].expect("a is stored");
    assert_eq!((stored.len, stored.checksum), (6, Some(7)));

    let (path, temp) = commit(&catalog, &b, b"page b", false);
    assert!(
        !path.exists() && !temp.exists(),
        "a failed write leaves no file"
    );
    assert_eq!(catalog.leading(&[a, b]), 1);
    assert_eq!(catalog.bytes(), 6);
}

#[test]
fn a_read_planned_with_an_old_generation_never_drops_the_new_page() {
    let (_dir, catalog) = owner();
    let k = key("k");
    let (path, _) = commit(&catalog, &k, b"first", true);
    let old = generation_of(&catalog, &k).expect("k is stored");
    commit(&catalog, &k, b"second", true);
    let new = generation_of(&catalog, &k).expect("k is stored");
    assert_ne!(old, new);

    // A read of the first file found bad bytes: the second file is not its fault.
    catalog.discard(&k, old, &path, None);
    assert_eq!(fs::read(&path).expect("the new file stays"), b"second");
    assert!(catalog.is_current(&k, new));
    // A read of the first file found it gone: the second file's entry stays.
    fs::remove_file(&path).expect("deleted by hand");
    catalog.settle_reads([settled(&k, old, &path)]);
    assert_eq!(catalog.leading(std::slice::from_ref(&k)), 1);
    // The same with the entry's own generation: forgotten.
    catalog.settle_reads([settled(&k, new, &path)]);
    assert_eq!(catalog.leading(std::slice::from_ref(&k)), 0);

    let (path, _) = commit(&catalog, &k, b"third", true);
    let third = generation_of(&catalog, &k).expect("k is stored");
    catalog.discard(&k, third, &path, None);
    assert!(!path.exists(), "a bad page's file goes with its entry");
    assert_eq!(catalog.leading(std::slice::from_ref(&k)), 0);
}

#[test]
fn a_clear_never_unlinks_a_page_put_after_it() {
    let (_dir, catalog) = owner();
    let (a, b) = (key("a"), key("b"));
    let (path_a, _) = commit(&catalog, &a, b"old a", true);
    let (path_b, _) = commit(&catalog, &b, b"old b", true);
    let mut forgotten = catalog.forget_all();
    forgotten.sort();
    assert_eq!(forgotten, vec![a.clone(), b.clone()]);
    assert_eq!(
        catalog.leading(std::slice::from_ref(&a)),
        0,
        "forgotten at once"
    );

    commit(&catalog, &a, b"new a", true);
    for key in &forgotten {
        catalog.unlink_forgotten(key).expect("unlinked");
    }
    assert_eq!(fs::read(&path_a).expect("the new page stays"), b"new a");
    assert_eq!(catalog.leading(std::slice::from_ref(&a)), 1);
    assert!(!path_b.exists(), "the forgotten page's file is gone");
}

#[test]
fn removes_and_evictions_unlink_and_pins_hold_pages() {
    let (_dir, catalog) = owner();
    let (a, b) = (key("a"), key("b"));
    let (path_a, _) = commit(&catalog, &a, b"aaaa", true);
    let (path_b, _) = commit(&catalog, &b, b"bbbb", true);
    assert!(catalog.remove(&a).expect("removed"));
    assert!(!path_a.exists());
    assert!(!catalog.remove(&a).expect("absent"));

    let pins = catalog.pin([&b]);
    assert_eq!(catalog.evict_to(0), 0, "a pinned page stays");
    assert!(path_b.exists());
    drop(pins);
    assert_eq!(catalog.evict_to(0), 1);
    assert!(!path_b.exists());
    assert_eq!((catalog.pages(), catalog.bytes()), (0, 0));
}
