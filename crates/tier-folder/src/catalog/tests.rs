//! The catalog: files and entries change together; generations guard every change.

use super::*;
use crate::layout::ScanReport;
use crate::FolderMode;
use tier_policy::PolicyKind;

fn key(s: &str) -> PageKey {
    PageKey::new(s).expect("a valid key")
}

fn owner() -> (tempfile::TempDir, Catalog) {
    let dir = tempfile::tempdir().expect("a temp folder");
    let layout = Layout::create(&[dir.path().to_path_buf()], FolderMode::Owner).expect("a layout");
    let index = PageIndex::new(PolicyKind::Lru).expect("an index");
    let catalog = Catalog::owned(layout, index);
    catalog.loaded();
    (dir, catalog)
}

/// A sharer's catalog of `dir`'s folder.
fn sharer(dir: &Path) -> Catalog {
    let layout = Layout::create(&[dir.to_path_buf()], FolderMode::Owner).expect("a layout");
    let fleet = Fleet::open(
        &layout,
        None,
        crate::SharedFolder::default(),
        std::time::Duration::from_secs(30),
    )
    .expect("a fleet");
    Catalog::shared(layout, fleet)
}

/// An owner catalog reopened on `dir`'s folder, its index still loading, and the pages a scan
/// of its buckets lists (oldest first), as the open's background thread has them.
fn reopened(dir: &Path) -> (Catalog, Vec<(PageKey, u32)>) {
    let layout = Layout::create(&[dir.to_path_buf()], FolderMode::Owner).expect("a layout");
    let mut report = ScanReport::default();
    for bucket in layout.buckets() {
        layout
            .scan_owned_bucket(&bucket, &mut report)
            .expect("a scan");
    }
    let found = report
        .pages
        .into_iter()
        .map(|(k, len, _)| (k, len))
        .collect();
    let index = PageIndex::new(PolicyKind::Lru).expect("an index");
    (Catalog::owned(layout, index), found)
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
        created: None,
        opened: None,
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
fn settled<'r>(key: &'r PageKey, generation: Generation, path: &'r Path) -> SettledRead<'r> {
    SettledRead {
        key,
        generation,
        mtime_ns: None,
        path,
        found: Some(false),
    }
}

fn generation_of(catalog: &Catalog, key: &PageKey) -> Option<Generation> {
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

#[test]
fn while_the_index_loads_pages_on_disk_are_served_and_a_removed_one_is_never_indexed() {
    let (dir, first) = owner();
    let (a, b) = (key("a"), key("b"));
    let (path_a, _) = commit(&first, &a, &[1; 64], true);
    commit(&first, &b, &[2; 64], true);
    drop(first);
    let (catalog, found) = reopened(dir.path());
    assert_eq!(found.len(), 2, "the scan lists both pages");
    assert_eq!(
        catalog.leading(&[a.clone(), b.clone()]),
        2,
        "unindexed pages are looked up on disk"
    );
    assert!(
        catalog.remove(&a).expect("a remove"),
        "an unindexed page is removed"
    );
    assert!(!path_a.exists());
    catalog.load(&found);
    catalog.loaded();
    assert_eq!(
        catalog.pages(),
        1,
        "the page removed while loading came back into the index"
    );
    assert_eq!(catalog.leading(&[a]), 0);
    assert_eq!(catalog.leading(&[b]), 1);
}

#[test]
fn a_clear_while_the_index_loads_unlinks_the_pages_the_scan_finds_after_it() {
    let (dir, first) = owner();
    let (a, b) = (key("a"), key("b"));
    let (path_a, _) = commit(&first, &a, &[1; 64], true);
    drop(first);
    let (catalog, found) = reopened(dir.path());
    assert!(catalog.forget_all().is_empty(), "nothing indexed yet");
    assert_eq!(
        catalog.leading(std::slice::from_ref(&a)),
        0,
        "a cleared page is absent at once"
    );
    let (path_b, _) = commit(&catalog, &b, &[2; 64], true);
    catalog.load(&found);
    catalog.loaded();
    assert!(!path_a.exists(), "the clear left a page the scan found");
    assert!(path_b.exists(), "a page put after the clear was unlinked");
    assert_eq!((catalog.pages(), catalog.leading(&[b])), (1, 1));
}

#[test]
fn the_scan_after_an_open_leaves_the_tiers_own_temp_files() {
    let (dir, catalog) = owner();
    let page = catalog.layout().page_path(&key("a")).expect("a path");
    let ours = catalog.layout().temp_path(&page);
    fs::write(&ours, b"a write in flight").expect("a temp file");
    let other = Layout::create(&[dir.path().to_path_buf()], FolderMode::Owner).expect("a layout");
    let theirs = other.temp_path(&page);
    fs::write(&theirs, b"a crashed write").expect("a temp file");
    let mut report = ScanReport::default();
    let bucket = page.parent().expect("a bucket");
    catalog
        .layout()
        .scan_owned_bucket(bucket, &mut report)
        .expect("a scan");
    assert!(
        ours.exists(),
        "the scan removed a write in flight of its own tier"
    );
    assert!(!theirs.exists(), "the scan left another tier's leftover");
    assert_eq!(report.temps_removed, 1);
}

/// Two processes storing the same new pages at the same moment (as two engines serving one
/// prompt's prefix do), each through its own folder path (`a`, `b`: on GlusterFS, two
/// clients), count each page once: the usage ends at the folder's bytes. (Each counted the page
/// whole before, when both looked before either renamed: the usage grew past the folder's
/// bytes, and eviction held the folder that much below its capacity.) Where the clients lose
/// usage updates (GlusterFS's caches: see `two_clients_of_a_distributed_filesystem_keep_one_usage_count`),
/// up to `lost` pages may go uncounted, never one counted twice.
fn sharers_storing_one_new_page_at_once_count_it_once(a: &Path, b: &Path, pages: u64, lost: u64) {
    // Where the processes meet before each page: a local folder (they run on one machine).
    let sync = tempfile::tempdir().expect("a temp folder");
    let storers: Vec<_> = [a, b]
        .iter()
        .enumerate()
        .map(|(me, dir)| {
            std::process::Command::new(std::env::current_exe().expect("this test binary"))
                .args(["--exact", "catalog::tests::same_pages_storer", "--ignored"])
                .env("KVTIER_STORER", format!("{me} {pages}"))
                .env("KVTIER_STORER_DIR", dir)
                .env("KVTIER_STORER_SYNC", sync.path())
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("a storer process")
        })
        .collect();
    for mut storer in storers {
        assert!(storer.wait().expect("it ends").success(), "a storer failed");
    }
    let page = crate::format::file_len(STORED_LEN);
    let counted = sharer(a).bytes();
    assert!(
        ((pages - lost) * page..=pages * page).contains(&counted),
        "usage of {pages} pages stored by two processes at once: {} pages counted",
        counted as f64 / page as f64
    );
}

/// The length of the pages the storer processes store.
const STORED_LEN: usize = 64;

#[test]
fn sharers_in_two_processes_storing_one_new_page_at_once_count_it_once() {
    let dir = tempfile::tempdir().expect("a temp folder");
    sharers_storing_one_new_page_at_once_count_it_once(dir.path(), dir.path(), 300, 0);
}

#[test]
fn sharers_on_two_glusterfs_clients_storing_one_new_page_at_once_count_it_once() {
    let (a, b) = tier_tests::gluster::mounts().folder("count-once");
    sharers_storing_one_new_page_at_once_count_it_once(&a, &b, 300, 30);
    let _ = fs::remove_dir_all(&a);
}

/// The storer processes' entry (see above): does nothing unless `KVTIER_STORER` ("ME PAGES")
/// is set. Opens a sharer's catalog of `KVTIER_STORER_DIR` and commits each page once the other
/// storer is at that page too (files in `KVTIER_STORER_SYNC`).
#[test]
#[ignore = "run by the sharers_..._count_it_once tests"]
fn same_pages_storer() {
    let (Ok(storer), Some(dir), Some(sync)) = (
        std::env::var("KVTIER_STORER"),
        std::env::var_os("KVTIER_STORER_DIR"),
        std::env::var_os("KVTIER_STORER_SYNC"),
    ) else {
        return;
    };
    let (me, pages) = storer.split_once(' ').expect("ME PAGES");
    let (me, pages): (u32, u64) = (me.parse().expect("ME"), pages.parse().expect("PAGES"));
    let sync = Path::new(&sync);
    let catalog = sharer(Path::new(&dir));
    let file_len = crate::format::file_len(STORED_LEN) as usize;
    for i in 0..pages {
        let key = key(&format!("page{i}"));
        let page = written(&catalog, key, &vec![i as u8; file_len], STORED_LEN);
        fs::write(sync.join(format!("{i}.{me}")), b"").expect("a sync file");
        let other = sync.join(format!("{i}.{}", 1 - me));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !other.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the other storer is not at page {i} after 60 s"
            );
            std::thread::yield_now();
        }
        let stored = commit_written(&catalog, page);
        assert!(stored.is_ok(), "{stored:?}");
    }
}

/// Writes `file` (a page of `len` bytes and its trailer, as a write leaves its temp file) under
/// a temp name of `key`'s page: its transfer, and the page's path.
fn written(catalog: &Catalog, key: PageKey, file: &[u8], len: usize) -> (Xfer, PathBuf) {
    let path = catalog.layout().page_path(&key).expect("a page path");
    let temp = catalog.layout().temp_path(&path);
    fs::write(&temp, file).expect("a temp file");
    let xfer = Xfer {
        key,
        path: temp,
        len,
        direct: false,
        parts: Vec::new(),
        checksum: None,
        created: None,
        opened: None,
    };
    (xfer, path)
}

/// Commits a page [`written`] wrote; the commit's result.
fn commit_written(catalog: &Catalog, (xfer, path): (Xfer, PathBuf)) -> Result<(), TierError> {
    let mut outcome = BatchOutcome {
        results: vec![Ok(())],
        poisoned: false,
    };
    catalog.commit(&[xfer], &[path], &mut outcome, &[None]);
    outcome.results.pop().expect("one result")
}

/// A page file that shows no page bytes (another client's write, as a distributed
/// filesystem's caches may show it) is absent to a sharer, not a page of length 0: a get of it
/// is a miss, not a length error (seen on GlusterFS under load).
#[test]
fn a_shared_page_file_without_page_bytes_is_absent() {
    let dir = tempfile::tempdir().expect("a temp folder");
    let catalog = sharer(dir.path());
    let (a, b) = (key("a"), key("b"));
    let trailer_only = vec![0u8; crate::format::TRAILER as usize];
    fs::write(
        catalog.layout().page_path(&a).expect("a path"),
        &trailer_only,
    )
    .expect("a file");
    fs::write(
        catalog.layout().page_path(&b).expect("a path"),
        [&trailer_only[..], &[1; 8]].concat(),
    )
    .expect("a file");
    let (_pins, stored) = catalog.pin([&a, &b]);
    assert!(
        stored[0].is_none(),
        "a file of no page bytes is a stored page: {:?}",
        stored[0]
    );
    assert_eq!(stored[1].map(|s| s.len), Some(8));
}

/// A writer landing a page over a name whose file an evictor moves aside at the same moment
/// counts what it replaced exactly: the counted changes of both (the writer's landings less
/// what they replaced, the evictor's files taken) always add up to what the name holds. (The
/// writer read the replaced file's length, then renamed: a file moved aside between the two
/// was subtracted by both, the usage one page low each time.)
#[test]
fn a_page_landed_while_an_evictor_moves_the_old_one_aside_is_counted_exactly() {
    use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::SeqCst};
    const LEN: usize = 64;
    const LANDINGS: usize = 20_000;
    let dir = tempfile::tempdir().expect("a temp folder");
    let path = dir.path().join("page");
    let counted = AtomicI64::new(0);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let aside = dir.path().join("aside");
            while !done.load(SeqCst) {
                if fs::rename(&path, &aside).is_ok() {
                    let len = fs::metadata(&aside).expect("the file moved aside").len();
                    fs::remove_file(&aside).expect("removed");
                    counted.fetch_sub(len as i64, SeqCst);
                }
            }
        });
        for i in 0..LANDINGS {
            let temp = dir.path().join(format!("temp-{i}"));
            fs::write(&temp, [i as u8; LEN]).expect("a temp file");
            let added = land_shared(&temp, &path, LEN as u64).expect("landed");
            counted.fetch_add(added, SeqCst);
        }
        done.store(true, SeqCst);
    });
    let held = fs::metadata(&path).map_or(0, |m| m.len()) as i64;
    assert_eq!(
        counted.load(SeqCst),
        held,
        "the counts of {LANDINGS} landings and the evictions between them add up to what the \
         name holds"
    );
}

/// The names the landing test's pages take, and the unlinker process removes.
const CONTESTED: usize = 8;

/// Pages landed by two threads of one GlusterFS client over names another client's process
/// removes at the same moment (as a remove, a clear or an eviction there does) all land: that
/// client answers some such renames `ENOENT` though it moved the page (a put of the fleet's
/// soak failed "rename page into place": No such file or directory).
#[test]
fn on_two_glusterfs_clients_pages_landed_over_names_the_other_removes_land() {
    const LANDINGS: usize = 1_500;
    let (a, b) = tier_tests::gluster::mounts().folder("land-removed");
    let stop = tempfile::tempdir().expect("a temp folder");
    let mut unlinker = std::process::Command::new(std::env::current_exe().expect("this binary"))
        .args(["--exact", "catalog::tests::page_remover", "--ignored"])
        .env("KVTIER_REMOVER_DIR", &b)
        .env("KVTIER_REMOVER_STOP", stop.path().join("stop"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("a remover process");
    let catalog = sharer(&a);
    let failed: Vec<String> = std::thread::scope(|s| {
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let catalog = &catalog;
                s.spawn(move || {
                    let mut failed = Vec::new();
                    for i in 0..LANDINGS {
                        let key = key(&format!("page{}", (i + w) % CONTESTED));
                        let page = written(catalog, key, &[w as u8; 256], 224);
                        if let Err(e) = commit_written(catalog, page) {
                            failed.push(e.to_string());
                        }
                    }
                    failed
                })
            })
            .collect();
        writers
            .into_iter()
            .flat_map(|w| w.join().expect("a writer"))
            .collect()
    });
    fs::write(stop.path().join("stop"), b"").expect("the stop file");
    assert!(
        unlinker.wait().expect("it ends").success(),
        "the remover failed"
    );
    assert!(
        failed.is_empty(),
        "{} of {} landings failed, the first: {}",
        failed.len(),
        2 * LANDINGS,
        failed[0]
    );
    let _ = fs::remove_dir_all(&a);
}

/// The remover process's entry (see above): does nothing unless `KVTIER_REMOVER_DIR` is set.
/// Removes the contested pages from a sharer's catalog of that folder until
/// `KVTIER_REMOVER_STOP` exists.
#[test]
#[ignore = "run by on_two_glusterfs_clients_pages_landed_over_names_the_other_removes_land"]
fn page_remover() {
    let (Some(dir), Some(stop)) = (
        std::env::var_os("KVTIER_REMOVER_DIR"),
        std::env::var_os("KVTIER_REMOVER_STOP"),
    ) else {
        return;
    };
    let catalog = sharer(Path::new(&dir));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while !Path::new(&stop).exists() && std::time::Instant::now() < deadline {
        for i in 0..CONTESTED {
            catalog.remove(&key(&format!("page{i}"))).expect("a remove");
        }
    }
}
