//! The fleet: spared victims, eviction windows, open scans; each shown to fail on its broken variant.

use super::lease::{Lease, SharedFile};
use super::victim::PutBack;
use super::*;
use crate::layout::{FileStamp, FolderPage};
use crate::perms::rename_noreplace;
use crate::{FolderMode, SharedLocks};
use std::fs::File;
use std::path::{Path, PathBuf};
use tier_core::PageKey;

mod files;

fn layout() -> (tempfile::TempDir, Layout) {
    let dir = tempfile::tempdir().expect("a temp folder");
    let layout = Layout::create(&[dir.path().to_path_buf()], FolderMode::Owner).expect("a layout");
    (dir, layout)
}

/// The fleet of `layout`'s folders, with the scan that follows its open done (as the tier's
/// background thread does it).
fn opened(layout: &Layout, capacity: Option<u64>, settings: SharedFolder) -> Fleet {
    let fleet =
        Fleet::open(layout, capacity, settings, Duration::from_secs(30)).expect("the fleet");
    let mut scan = fleet.begin_open_scan().expect("a scan");
    for bucket in layout.buckets() {
        fleet
            .open_scan_bucket(layout, &bucket, &mut scan)
            .expect("a bucket scanned");
    }
    fleet
        .end_open_scan(layout, scan)
        .expect("the usage settled");
    fleet
}

fn store(layout: &Layout, name: &str, bytes: &[u8]) -> PathBuf {
    let key = PageKey::new(name).expect("a key");
    let path = layout.page_path(&key).expect("a path");
    let temp = layout.temp_path(&path);
    fs::write(&temp, bytes).expect("a temp file");
    crate::format::seal(None, &temp, &key, bytes.len(), None, false).expect("sealed");
    fs::rename(&temp, &path).expect("renamed into place");
    path
}

/// Sets a page's use time 5 s ahead, as a hit after a scan does.
fn used_later(path: &Path) {
    let later = fs::FileTimes::new().set_modified(SystemTime::now() + Duration::from_secs(5));
    File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_times(later))
        .expect("use time set");
}

/// The page a stored file holds (its trailer left off).
fn page_of(path: &Path) -> Vec<u8> {
    let mut bytes = fs::read(path).expect("the page stays");
    bytes.truncate(bytes.len() - crate::format::TRAILER as usize);
    bytes
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
    used_later(&used);

    let outcomes: Vec<_> = victims
        .iter()
        .map(|v| unlink_if_unchanged(&layout, v, put_back()).expect("no I/O error"))
        .collect();
    assert!(
        matches!(outcomes[0], Victim::Evicted(40)),
        "8 bytes and the trailer"
    );
    assert!(!old.exists(), "an unchanged victim goes");
    assert!(matches!(outcomes[1], Victim::Spared(0)));
    assert_eq!(page_of(&again), b"second", "the page stored again stays");
    assert!(matches!(outcomes[2], Victim::Spared(0)));
    assert_eq!(page_of(&used), b"used page", "the page used stays");
    let leftovers = layout.scan_shared(|_, _| false).expect("a scan");
    assert_eq!(leftovers.pages.len(), 2);
    assert_eq!(leftovers.temps_removed, 0);
}

#[test]
fn a_spared_victim_survives_a_filesystem_without_hard_links() {
    let (_dir, layout) = layout();
    let used = store(&layout, "used", b"used page");
    let victim = scanned(&layout, &used);
    used_later(&used);
    let no_links = |_: &Path, _: &Path| Err(io::Error::from_raw_os_error(libc::EPERM));
    let without_links = PutBack {
        link: no_links,
        noreplace: rename_noreplace,
    };
    let outcome = unlink_if_unchanged(&layout, &victim, without_links).expect("no I/O error");
    assert!(matches!(outcome, Victim::Spared(0)));
    assert_eq!(page_of(&used), b"used page");
}

/// Where a spared victim can be put back neither by a hard link nor by a rename that never
/// replaces, it is removed and its bytes freed, not left aside under a temp name uncounted
/// (it was never subtracted from the usage, while no one could read it).
#[test]
fn a_spared_victim_that_cannot_go_back_is_removed_and_its_bytes_freed() {
    let (dir, layout) = layout();
    let used = store(&layout, "used", b"used page");
    let victim = scanned(&layout, &used);
    used_later(&used);
    let len = fs::metadata(&used).expect("a page").len();
    let refused = |_: &Path, _: &Path| Err(io::Error::from_raw_os_error(libc::EINVAL));
    let neither = PutBack {
        link: refused,
        noreplace: refused,
    };
    let outcome = unlink_if_unchanged(&layout, &victim, neither).expect("no I/O error");
    assert!(
        matches!(outcome, Victim::Spared(freed) if freed == len),
        "its bytes are freed"
    );
    let left = layout.scan_shared(|_, _| false).expect("a scan");
    assert!(left.pages.is_empty() && left.temps_removed == 0);
    let bucket = used.parent().expect("a bucket");
    assert_eq!(
        fs::read_dir(bucket).expect("the bucket").count(),
        0,
        "nothing left aside"
    );
    drop(dir);
}

#[test]
fn only_writers_of_this_pid_space_are_looked_up_by_pid() {
    let (dir, layout) = layout();
    let path = store(&layout, "page", b"page");
    let bucket = path.parent().expect("a bucket");
    let dead = {
        let mut child = std::process::Command::new("true").spawn().expect("a child");
        child.wait().expect("it ends");
        child.id()
    };
    // A young temp file of a dead pid in this pid space: a leftover, removed. One named by a
    // process of another pid space sharing this host name (a `--net=host` container; before,
    // temp names carried the host name's tag), same dead-here pid: its writer may be alive
    // there, so it stays until it is old.
    let ours = bucket.join(format!(".tmp-{}-{dead}-0-page", layout::pid_space_tag()));
    let host = {
        let mut buf = [0u8; 256];
        // SAFETY: the buffer is valid for its length.
        unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        format!("{:08x}", layout::route_hash(&buf[..len]) as u32)
    };
    let theirs = bucket.join(format!(".tmp-{host}-{dead}-0-page"));
    fs::write(&ours, b"leftover").expect("a temp file");
    fs::write(&theirs, b"in flight").expect("a temp file");
    let fleet = opened(&layout, None, SharedFolder::default());
    assert!(
        !ours.exists(),
        "a dead writer's leftover of this pid space is removed"
    );
    assert!(
        theirs.exists(),
        "another pid space's young temp file was removed"
    );
    assert_eq!(fleet.stats().temps_removed, 1);
    drop(dir);
}

/// An eviction in a folder larger than its sample examines a window of it, not all of it, makes
/// room for the page coming and takes old pages: 2,048 pages of distinct ages, a sample of 128,
/// the oldest of one window evicted. (Examining the whole folder, as every eviction
/// did, fails the first check.)
/// Page `i`'s age in seconds in an [`aged`] folder of `n` pages: a permutation of 0..n,
/// unrelated to buckets.
fn age(i: usize, n: usize) -> usize {
    (i * 7919) % n
}

/// `n` pages of 100 bytes stored in `layout`'s folder, page `i` last used [`age`] seconds ago.
fn aged(layout: &Layout, n: usize) -> Vec<PathBuf> {
    let now = SystemTime::now();
    let age = |i: usize| age(i, n);
    (0..n)
        .map(|i| {
            let path = store(layout, &format!("page{i:05}"), &[i as u8; 100]);
            let then = fs::FileTimes::new().set_modified(now - Duration::from_secs(age(i) as u64));
            File::options()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_times(then))
                .expect("use time set");
            path
        })
        .collect()
}

#[test]
fn an_eviction_examines_windows_of_a_large_folder_and_takes_old_pages() {
    let (dir, layout) = layout();
    let n = 2048usize;
    let age = |i: usize| age(i, n);
    let paths = aged(&layout, n);
    let page_len = fs::metadata(&paths[0]).expect("a page").len();
    let total = page_len * n as u64;
    let settings = SharedFolder {
        low_watermark: 0.98,
        ..SharedFolder::default()
    };
    let mut fleet = opened(&layout, Some(total), settings);
    fleet.sample = 128;
    assert_eq!(fleet.usage(), total);
    let examined_at_open = fleet.stats().examined;
    assert_eq!(
        fleet.evict(&layout, page_len).expect("an eviction"),
        Eviction::Done
    );
    let examined = fleet.stats().examined - examined_at_open;
    let gone: Vec<usize> = (0..n).filter(|&i| !paths[i].exists()).collect();
    println!("{} victims, {examined} of {n} pages examined", gone.len());
    assert!(
        examined <= n as u64 / 8,
        "{examined} of {n} pages examined to evict {}",
        gone.len()
    );
    assert!(
        !gone.is_empty() && fleet.usage() + page_len <= total,
        "no room made: usage {} of {total}",
        fleet.usage()
    );
    assert_eq!(fleet.usage(), page_len * (n - gone.len()) as u64);
    assert!(
        gone.iter().all(|&i| age(i) >= n / 2),
        "a page younger than the median was evicted: ages {:?}",
        gone.iter().map(|&i| age(i)).collect::<Vec<_>>()
    );
    drop(dir);
}

/// A bucket holding more pages than a window has room for is sampled: only `limit` of its
/// pages, picked at random, are stat'ed, so a window costs the same however full the buckets
/// are (16 million pages put 62,500 in each).
#[test]
fn a_bucket_fuller_than_the_window_is_sampled_not_stated_whole() {
    let (dir, layout) = layout();
    let bucket_of = |name: &str| {
        let key = PageKey::new(name).expect("a key");
        layout
            .page_path(&key)
            .expect("a path")
            .parent()
            .map(Path::to_path_buf)
    };
    let bucket = bucket_of("page0").expect("a bucket");
    let names: Vec<String> = (0..)
        .map(|i| format!("page{i}"))
        .filter(|name| bucket_of(name).as_deref() == Some(bucket.as_path()))
        .take(40)
        .collect();
    for name in &names {
        store(&layout, name, name.as_bytes());
    }
    let mut some = FolderScan::default();
    layout
        .scan_bucket(&bucket, &|_, _| false, Some(10), &mut some)
        .expect("a scan");
    assert_eq!(some.pages.len(), 10);
    assert!(some.sampled);
    let mut all = FolderScan::default();
    layout
        .scan_bucket(&bucket, &|_, _| false, Some(40), &mut all)
        .expect("a scan");
    assert_eq!(all.pages.len(), 40);
    assert!(!all.sampled, "a bucket within the limit is listed whole");
    drop(dir);
}

/// Each window gives up its oldest pages in the share the folders must lose, so the victims are
/// about the folders' oldest, as an exact LRU's would be: 2,048 pages, windows of 512, a low
/// watermark of 0.9 (a tenth to free): every victim is among the oldest fifth of the folder.
/// (A window's oldest quarter, taken before, evicted pages younger than that, and lost 1.5
/// points of shared reuse against an exact LRU in `kvtier replay --nodes 4`.)
#[test]
fn victims_are_the_oldest_of_each_window_in_the_share_the_folders_must_lose() {
    let (dir, layout) = layout();
    let n = 2048usize;
    let paths = aged(&layout, n);
    let page_len = fs::metadata(&paths[0]).expect("a page").len();
    let total = page_len * n as u64;
    let settings = SharedFolder {
        low_watermark: 0.9,
        ..SharedFolder::default()
    };
    let mut fleet = opened(&layout, Some(total), settings);
    fleet.sample = 512;
    fleet.evict(&layout, page_len).expect("an eviction");
    let gone: Vec<usize> = (0..n).filter(|&i| !paths[i].exists()).collect();
    let ages: Vec<usize> = gone.iter().map(|&i| age(i, n)).collect();
    println!("{} victims, ages {ages:?}", gone.len());
    assert!(!gone.is_empty(), "nothing evicted");
    assert!(
        ages.iter().all(|&a| a >= n - n / 5),
        "a victim younger than the oldest fifth: ages {ages:?}"
    );
    drop(dir);
}

/// A put that takes the folders past their capacity by at most 2% goes on, its eviction left
/// to a thread beside it (one per process at a time), which brings them within the capacity;
/// a put that takes them further makes room before it writes. (With no margin, the first put
/// evicts before it writes: a put that evicts then pays for a window's scan.)
#[test]
fn a_put_just_past_the_capacity_leaves_its_eviction_beside_it() {
    let (_dir, layout) = layout();
    let page = vec![7u8; 1000];
    let file = crate::format::file_len(page.len());
    for i in 0..100 {
        store(&layout, &format!("p{i}"), &page);
    }
    let capacity = 100 * file;
    let fleet = opened(&layout, Some(capacity), SharedFolder::default());
    assert_eq!(fleet.usage(), capacity);
    assert_eq!(
        fleet.make_room(&layout, file).expect("room"),
        Room::EvictBeside,
        "1% past the capacity: the put goes on"
    );
    assert_eq!(fleet.stats().evicted, 0, "nothing evicted before the write");
    // The page lands, and is counted.
    store(&layout, "p100", &page);
    fleet.count(file as i64);
    assert!(fleet.over_capacity());
    assert!(fleet.begin_beside());
    assert!(
        !fleet.begin_beside(),
        "one eviction beside the puts at a time"
    );
    fleet.evict_beside(&layout);
    assert!(!fleet.over_capacity(), "usage {}", fleet.usage());
    assert!(fleet.stats().evicted > 0);
    assert!(fleet.begin_beside(), "the eviction beside ended");
    fleet.end_beside();
    let evicted = fleet.stats().evicted;
    let far = capacity - fleet.usage() + 5 * file;
    assert_eq!(fleet.make_room(&layout, far).expect("room"), Room::Made);
    assert!(
        fleet.stats().evicted > evicted,
        "5% past the capacity: evicted before the write"
    );
    assert!(fleet.usage() + far <= capacity, "usage {}", fleet.usage());
}

/// A window after the first that finds no page (the buckets left were emptied, by another
/// process's `clear` say, while the usage file still counts their pages) ends the run; the
/// evictor stays usable. (Sized by `clamp(1, 0)`, the window panicked and poisoned the
/// evictor, and every later eviction of this process answered busy.)
#[test]
fn a_window_that_finds_no_page_ends_the_run_and_the_evictor_stays_usable() {
    let (dir, layout) = layout();
    let path = store(&layout, "page", &[1u8; 100]);
    let page_len = fs::metadata(&path).expect("a page").len();
    let mut fleet = opened(&layout, Some(10 * page_len), SharedFolder::default());
    fleet.sample = 1;
    // Another process's pages, counted in the usage file but gone from the folders.
    fleet.count(100 * page_len as i64);
    for _ in 0..2 {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            fleet.evict(&layout, page_len)
        }));
        let outcome = outcome.expect("an eviction over empty windows does not panic");
        assert_eq!(outcome.expect("an eviction"), Eviction::Done);
    }
    assert!(!path.exists(), "the one page found is evicted");
    drop(dir);
}

/// Four processes opening an owner-filled folder shared at once (whose usage file, which
/// owners never write, says 0): their open scans overlap, and the usage ends at the folder's
/// bytes, not a multiple of them; nothing is evicted under a capacity of 1.5 times them.
/// (Settled as `found + (now - before)`, each scan after the first counted the ones before as
/// new puts: 4 times the bytes, and the folder evicted far under its capacity.)
#[test]
fn overlapping_open_scans_count_the_folder_once() {
    let (dir, layout) = layout();
    let paths: Vec<PathBuf> = (0..200)
        .map(|i| store(&layout, &format!("page{i:03}"), &[i as u8; 100]))
        .collect();
    let total: u64 = paths
        .iter()
        .map(|p| fs::metadata(p).expect("a page").len())
        .sum();
    let capacity = total * 3 / 2;
    let fleets: Vec<Fleet> = (0..4)
        .map(|_| {
            Fleet::open(
                &layout,
                Some(capacity),
                SharedFolder::default(),
                Duration::from_secs(30),
            )
            .expect("the fleet")
        })
        .collect();
    let mut scans: Vec<OpenScan> = fleets
        .iter()
        .map(|f| f.begin_open_scan().expect("a scan"))
        .collect();
    // A put lands during the scans, where they all find it: counted once.
    let landed = store(&layout, "landed", &[7; 100]);
    let landed = fs::metadata(&landed).expect("a page").len();
    fleets[0].count(landed as i64);
    for (fleet, scan) in fleets.iter().zip(&mut scans) {
        for bucket in layout.buckets() {
            fleet
                .open_scan_bucket(&layout, &bucket, scan)
                .expect("a bucket scanned");
        }
    }
    for (fleet, scan) in fleets.iter().zip(scans) {
        fleet
            .end_open_scan(&layout, scan)
            .expect("the usage settled");
    }
    assert_eq!(
        fleets[3].usage(),
        total + landed,
        "the folder counted more than once"
    );
    let evicted: u64 = fleets.iter().map(|f| f.stats().evicted).sum();
    assert_eq!(evicted, 0, "pages evicted under the capacity");
    assert!(paths.iter().all(|p| p.exists()));
    drop(dir);
}

/// Another process's puts and removes while an open scan looks at the folder, some before
/// the scan reaches their buckets and some after, are counted once: the usage ends at the
/// folder's bytes. (Settled as the scan's bytes plus everything counted since it began, a
/// page written before the scan reached it counted twice: three processes filling one
/// folder at once saw nearly twice its bytes, and evicted what their capacity had room for.)
#[test]
fn pages_written_while_an_open_scan_looks_are_counted_once() {
    let (dir, layout) = layout();
    let len = |p: &Path| fs::metadata(p).expect("a page").len() as i64;
    let old: Vec<PathBuf> = (0..20)
        .map(|i| store(&layout, &format!("old{i:02}"), &[i as u8; 300]))
        .collect();
    let opener = Fleet::open(
        &layout,
        None,
        SharedFolder::default(),
        Duration::from_secs(30),
    )
    .expect("the fleet");
    let writer = opened(&layout, None, SharedFolder::default());
    let mut scan = opener.begin_open_scan().expect("a scan");
    // Before the scan reaches them: 30 pages written, 5 removed.
    for i in 0..30 {
        writer.count(len(&store(&layout, &format!("early{i:02}"), &[1; 300])));
    }
    for gone in &old[..5] {
        let bytes = len(gone);
        fs::remove_file(gone).expect("removed");
        writer.count(-bytes);
    }
    for bucket in layout.buckets() {
        opener
            .open_scan_bucket(&layout, &bucket, &mut scan)
            .expect("a bucket scanned");
    }
    // After it passed them: 10 written, 5 removed.
    for i in 0..10 {
        writer.count(len(&store(&layout, &format!("late{i:02}"), &[2; 300])));
    }
    for gone in &old[5..10] {
        let bytes = len(gone);
        fs::remove_file(gone).expect("removed");
        writer.count(-bytes);
    }
    opener
        .end_open_scan(&layout, scan)
        .expect("the usage settled");
    let held: u64 = layout
        .scan_shared(|_, _| false)
        .expect("a scan")
        .pages
        .iter()
        .map(|p| p.len)
        .sum();
    assert_eq!(opener.usage(), held, "the usage is not the folder's bytes");
    drop(dir);
}

/// A sharer's discard of a page a read found corrupt removes it only if it is still the file
/// read, checked once renamed aside, where no writer lands (checked by its path and unlinked
/// after, a page stored again in between was removed); the bytes removed leave the usage.
#[test]
fn a_discard_removes_the_file_read_and_never_a_page_stored_again() {
    let (dir, layout) = layout();
    let path = store(&layout, "page", b"first!");
    let fleet = opened(&layout, None, SharedFolder::default());
    let mtime = |p: &Path| FileStamp::of(&fs::metadata(p).expect("a page")).mtime_ns;
    let read = mtime(&path);
    store(&layout, "page", b"second");
    used_later(&path);
    fleet.discard(&layout, &path, read);
    assert_eq!(page_of(&path), b"second", "the page stored again stays");
    let before = fleet.usage();
    let len = fs::metadata(&path).expect("a page").len();
    fleet.discard(&layout, &path, mtime(&path));
    assert!(!path.exists(), "the file read is removed");
    assert_eq!(fleet.usage(), before - len);
    let left = layout.scan_shared(|_, _| false).expect("a scan");
    assert!(
        left.pages.is_empty() && left.temps_removed == 0,
        "nothing left aside"
    );
    drop(dir);
}
