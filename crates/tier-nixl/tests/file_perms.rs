//! Who can read a FILE tier's pages, and what a local attacker who can write beside them can
//! make it do: owner-only modes by default, group mode on request, and no link or planted
//! file followed, truncated or served (attack tests: each failed before the fix).

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use rstest::rstest;
use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier, TierError};
use tier_folder::io::VERIFY_ONCE_MIN;
use tier_nixl::{
    DirectIo, FileAccess, FileEngine, FolderMode, NixlFileConfig, NixlFileTier, PathModeChoice,
};
use tier_tests::content;

fn key(i: usize) -> PageKey {
    PageKey::new(format!("{:064x}", i as u64 + 0x5eed)).unwrap()
}

fn config(dir: &Path, path_mode: PathModeChoice) -> NixlFileConfig {
    let mut config = NixlFileConfig::new([dir.to_path_buf()]);
    config.path_mode = path_mode;
    config
}

async fn put_one(tier: &NixlFileTier, i: usize) {
    let k = key(i);
    let page = Page::new(k.clone(), content::page(&k, 1, 4096));
    for r in tier.put(&[page]).await {
        r.unwrap_or_else(|e| panic!("put {k}: {e}"));
    }
}

async fn lookup(tier: &NixlFileTier, i: usize) -> Result<Lookup, TierError> {
    let mut buf = vec![0u8; 4096];
    let mut slots = [ReadSlot::new(key(i), &mut buf)];
    tier.get(&mut slots).await.pop().unwrap()
}

/// Every page file under `dir` (not the folders' own files).
fn page_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for bucket in fs::read_dir(dir).unwrap().flatten() {
        if bucket.file_type().unwrap().is_dir() {
            out.extend(
                fs::read_dir(bucket.path())
                    .unwrap()
                    .flatten()
                    .map(|e| e.path()),
            );
        }
    }
    out
}

fn mode_of(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[rstest]
#[case::path_mode(PathModeChoice::On, FileEngine::Nixl)]
#[case::fd_mode(PathModeChoice::Off, FileEngine::Nixl)]
#[case::syscalls(PathModeChoice::Off, FileEngine::Syscalls)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folders_and_pages_are_the_owners_alone_by_default(
    #[case] path_mode: PathModeChoice,
    #[case] engine: FileEngine,
) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kv");
    let mut c = config(&dir, path_mode);
    c.engine = engine;
    let tier = NixlFileTier::open(c).await.unwrap();
    put_one(&tier, 1).await;
    assert_eq!(mode_of(&dir), 0o700, "the storage folder");
    assert_eq!(mode_of(&dir.join("00")), 0o700, "a bucket folder");
    let pages = page_files(&dir);
    assert_eq!(pages.len(), 1);
    assert_eq!(mode_of(&pages[0]), 0o600, "a page file ({engine:?})");
    assert_eq!(mode_of(&dir.join(".kvtier.lock")), 0o600, "the lock file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_folder_open_to_others_is_narrowed_and_group_mode_opens_it_to_the_group() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kv");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let tier = NixlFileTier::open(config(&dir, PathModeChoice::Auto))
        .await
        .unwrap();
    assert_eq!(mode_of(&dir), 0o700, "narrowed to the owner");
    drop(tier);

    let shared = tmp.path().join("team");
    let mut c = config(&shared, PathModeChoice::Auto);
    c.mode = FolderMode::Group;
    let tier = NixlFileTier::open(c).await.unwrap();
    put_one(&tier, 2).await;
    assert_eq!(mode_of(&shared), 0o2770);
    assert_eq!(mode_of(&shared.join("ff")), 0o2770);
    assert_eq!(mode_of(&page_files(&shared)[0]), 0o660);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_of_another_user_is_refused() {
    // SAFETY: geteuid takes nothing.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test gives a folder to another user: it runs as root (as CI does)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("theirs");
    fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let err = NixlFileTier::open(config(&dir, PathModeChoice::Auto))
        .await
        .err()
        .expect("another user's folder is refused");
    assert!(
        matches!(&err, TierError::Config { field, message } if field == "dirs" && message.contains("uid 65534")),
        "{err}"
    );
}

/// A storage folder under a folder someone else can write is refused, naming that folder:
/// they could rename the storage folder away and put a folder of planted pages in its place
/// (`/tmp/kvtier` made `0777` by another user was accepted). Under a sticky folder (`/tmp`)
/// or in group mode under its own group's folder, it opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_folder_under_a_folder_others_can_write_is_refused_naming_it() {
    // SAFETY: geteuid takes nothing.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test gives folders to another user: it runs as root (as CI does)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let parent = |name: &str, mode: u32, owner: Option<u32>| {
        let dir = tmp.path().join(name);
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(&dir, owner, owner).unwrap();
        dir
    };
    let refused = [
        (parent("everyone", 0o777, None), "every user may write it"),
        (parent("theirs", 0o755, Some(65534)), "uid 65534"),
        (parent("their-group", 0o775, Some(65534)), "uid 65534"),
    ];
    for (above, why) in refused {
        let err = NixlFileTier::open(config(&above.join("kv"), PathModeChoice::Auto))
            .await
            .err()
            .unwrap_or_else(|| panic!("a folder under {} was taken", above.display()));
        assert!(
            matches!(&err, TierError::Config { field, message }
                if field == "dirs" && message.contains(why)
                    && message.contains(&*above.to_string_lossy())),
            "{err}"
        );
    }
    let group_writable = parent("group", 0o775, None);
    std::os::unix::fs::chown(&group_writable, None, Some(65534)).unwrap();
    let err = NixlFileTier::open(config(&group_writable.join("kv"), PathModeChoice::Auto))
        .await
        .err()
        .expect("an owner's folder under a folder its group may write is refused");
    assert!(err.to_string().contains("group 65534"), "{err}");
    let sticky = parent("sticky", 0o1777, None);
    let tier = NixlFileTier::open(config(&sticky.join("kv"), PathModeChoice::Auto))
        .await
        .expect("under a sticky folder anyone may write, a folder of one's own opens");
    drop(tier);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_replaced_by_a_link_is_refused_and_its_files_never_served() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kv");
    let tier = NixlFileTier::open(config(&dir, PathModeChoice::Auto))
        .await
        .unwrap();
    put_one(&tier, 3).await;
    let planted = page_files(&dir).pop().unwrap();
    let bucket = planted.parent().unwrap().to_path_buf();
    drop(tier);
    // An outside folder holding a file named as the page; the bucket swapped for a link to it.
    let outside = tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::copy(&planted, outside.join(planted.file_name().unwrap())).unwrap();
    fs::remove_dir_all(&bucket).unwrap();
    symlink(&outside, &bucket).unwrap();
    let err = NixlFileTier::open(config(&dir, PathModeChoice::Auto))
        .await
        .err()
        .expect("a bucket that is a link is refused");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(
        outside.join(planted.file_name().unwrap()).exists(),
        "the outside file is left alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_swapped_for_a_link_while_shared_is_not_scanned_or_cleared() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kv");
    let mut c = config(&dir, PathModeChoice::Auto);
    c.access = FileAccess::Shared;
    let tier = NixlFileTier::open(c).await.unwrap();
    put_one(&tier, 4).await;
    let page = page_files(&dir).pop().unwrap();
    let bucket = page.parent().unwrap().to_path_buf();
    let outside = tmp.path().join("victim");
    fs::create_dir(&outside).unwrap();
    let victim = outside.join(page.file_name().unwrap());
    fs::copy(&page, &victim).unwrap();
    fs::remove_dir_all(&bucket).unwrap();
    symlink(&outside, &bucket).unwrap();
    tier.clear().await.unwrap();
    assert!(victim.exists(), "clear() deleted a file outside the folder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_folders_files_are_never_opened_through_a_link() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kv");
    fs::create_dir(&dir).unwrap();
    let victim = tmp.path().join("victim");
    fs::write(&victim, b"precious").unwrap();
    symlink(&victim, dir.join(".kvtier.usage")).unwrap();
    let mut c = config(&dir, PathModeChoice::Auto);
    c.access = FileAccess::Shared;
    c.capacity_bytes = Some(1 << 20);
    let outcome = NixlFileTier::open(c).await;
    assert!(outcome.is_err(), "a usage file that is a link is refused");
    assert_eq!(
        fs::read(&victim).unwrap(),
        b"precious",
        "the link's target was written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_direct_io_probe_never_truncates_through_a_planted_link() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kv");
    fs::create_dir(&dir).unwrap();
    let victim = tmp.path().join("victim");
    fs::write(&victim, b"precious").unwrap();
    // The probe's old name was guessable: this process's id.
    symlink(
        &victim,
        dir.join(format!(".kvtier-direct-probe-{}", std::process::id())),
    )
    .unwrap();
    let mut c = config(&dir, PathModeChoice::Auto);
    c.direct_io = DirectIo::Preferred;
    let _tier = NixlFileTier::open(c).await.unwrap();
    assert_eq!(
        fs::read(&victim).unwrap(),
        b"precious",
        "the probe truncated the link's target"
    );
}

#[rstest]
#[case::path_mode(PathModeChoice::On, FileEngine::Nixl)]
#[case::fd_mode(PathModeChoice::Off, FileEngine::Nixl)]
#[case::syscalls(PathModeChoice::Off, FileEngine::Syscalls)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temp_names_cannot_be_guessed_so_a_planted_link_is_never_written_through(
    #[case] path_mode: PathModeChoice,
    #[case] engine: FileEngine,
) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kv");
    let mut c = config(&dir, path_mode);
    c.engine = engine;
    c.page_checksum = tier_nixl::PageChecksum::Off;
    let tier = NixlFileTier::open(c).await.unwrap();
    let victim = tmp.path().join("victim");
    fs::write(&victim, b"precious").unwrap();
    let k = key(6);
    // Where key 6 goes: put it once and remove it, to learn its bucket.
    let target_bucket = {
        let page = Page::new(k.clone(), content::page(&k, 1, 4096));
        tier.put(&[page]).await.pop().unwrap().unwrap();
        let path = page_files(&dir)
            .into_iter()
            .find(|p| p.file_name().unwrap().to_string_lossy() == k.as_str())
            .unwrap();
        tier.remove(std::slice::from_ref(&k))
            .await
            .pop()
            .unwrap()
            .unwrap();
        path.parent().unwrap().to_path_buf()
    };
    // Plant links at the names this process's next writes would have used before: the host
    // tag (a hash of the host name) and the pid are public, the sequence counts up from 0.
    let tag = format!(
        "{:08x}",
        tier_nixl::route_hash(hostname().as_bytes()) as u32
    );
    let pid = std::process::id();
    for seq in 0..64 {
        let old = target_bucket.join(format!(".tmp-{tag}-{pid}-{seq}-{}", k.as_str()));
        let _ = symlink(&victim, &old);
    }
    let page = Page::new(k.clone(), content::page(&k, 2, 4096));
    tier.put(&[page]).await.pop().unwrap().unwrap();
    assert_eq!(
        fs::read(&victim).unwrap(),
        b"precious",
        "a write followed a planted link"
    );
    assert_eq!(lookup(&tier, 6).await.unwrap(), Lookup::Hit);
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length.
    assert_eq!(
        unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) },
        0
    );
    let len = buf.iter().position(|&b| b == 0).unwrap();
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

/// In path mode, a link renamed over a fresh temp file (by a member of a group-mode folder's
/// group, who may write the bucket and see the temp names) is never written through: NIXL is
/// handed the file kvtier created by its descriptor, not its name. A racing thread renames a
/// link to a victim file over every temp file it sees while batches of 64 pages of one bucket
/// are put (a batch's temp files are all made before NIXL opens them). (NIXL opened the name
/// again and followed the link: the victim took page bytes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_renamed_over_a_path_mode_temp_file_is_never_written_through() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("kv");
    let mut c = config(&dir, PathModeChoice::On);
    c.page_checksum = tier_nixl::PageChecksum::Off;
    let tier = NixlFileTier::open(c).await.unwrap();
    let victim = tmp.path().join("victim");
    fs::write(&victim, b"precious").unwrap();
    let bucket = tier
        .page_path(&key(0))
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let keys: Vec<PageKey> = (0..)
        .map(key)
        .filter(|k| tier.page_path(k).unwrap().parent() == Some(bucket.as_path()))
        .take(64)
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let racer = {
        let (bucket, victim, stop) = (bucket.clone(), victim.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut swapped = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(entries) = fs::read_dir(&bucket) else {
                    continue;
                };
                for entry in entries.flatten() {
                    let name = entry.file_name();
                    if !name.to_string_lossy().starts_with(".tmp-") {
                        continue;
                    }
                    let link = bucket.with_file_name(format!("link-{swapped}"));
                    if symlink(&victim, &link).is_ok() && fs::rename(&link, entry.path()).is_ok() {
                        swapped += 1;
                    }
                    let _ = fs::remove_file(&link);
                }
            }
            swapped
        })
    };
    let mut stored = 0;
    for v in 0..40u64 {
        let pages: Vec<Page<'static>> = keys
            .iter()
            .map(|k| Page::new(k.clone(), content::page(k, v, 4096)))
            .collect();
        stored += tier.put(&pages).await.iter().filter(|r| r.is_ok()).count();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swapped = racer.join().unwrap();
    let links = fs::read_dir(&bucket)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
        .map(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
        .fold((0, 0), |(temp, page), is_temp| {
            if is_temp {
                (temp + 1, page)
            } else {
                (temp, page + 1)
            }
        });
    println!(
        "{stored} of 2,560 pages stored, {swapped} temp files swapped for links, links left (temp, page): {links:?}"
    );
    assert_eq!(
        fs::read(&victim).unwrap(),
        b"precious",
        "a page was written through a link ({swapped} swapped)"
    );
    assert_eq!(links.1, 0, "a planted link was renamed in as a page");
}

/// What a member of a group-mode folder's group plants under a page's name, in place of the
/// page file a shared folder's tier stored.
#[derive(Debug, Clone, Copy)]
enum Planted {
    /// A link to a whole page of the same key stored elsewhere (other bytes).
    LinkToAnotherPage,
    /// A FIFO, on which an open for reading waits for a writer.
    Fifo,
}

/// A link or a FIFO planted under a page's name in a group-mode folder is never read through
/// or waited on, in path mode (NIXL is handed the file kvtier opened) and in fd mode, for a
/// page checksummed at every read and one verified once per file version (whose file kvtier
/// opens to hold across the read): the get fails at once, naming the file. (A FIFO held the
/// get without bound in both modes, past its 5 s transfer timeout: the open waited for a
/// writer; for a page verified once, the open that holds the file did. The link was refused
/// before too, in path mode only once NIXL had read through it; it stays as a guard.)
#[rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_or_fifo_planted_under_a_page_name_is_never_read_or_waited_on(
    #[values(PathModeChoice::On, PathModeChoice::Off)] path_mode: PathModeChoice,
    #[values(Planted::LinkToAnotherPage, Planted::Fifo)] planted: Planted,
    #[values(4096, VERIFY_ONCE_MIN)] len: usize,
) {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = config(&tmp.path().join("kv"), path_mode);
    c.mode = FolderMode::Group;
    c.transfer_timeout = std::time::Duration::from_secs(5);
    let tier = NixlFileTier::open(c).await.unwrap();
    let k = key(0);
    let page = Page::new(k.clone(), content::page(&k, 1, len));
    tier.put(&[page]).await.pop().unwrap().unwrap();
    let elsewhere = NixlFileTier::open(config(&tmp.path().join("other"), path_mode))
        .await
        .unwrap();
    let other = Page::new(k.clone(), content::page(&k, 2, len));
    elsewhere.put(&[other]).await.pop().unwrap().unwrap();
    let path = tier.page_path(&k).unwrap();
    fs::remove_file(&path).unwrap();
    match planted {
        Planted::LinkToAnotherPage => symlink(elsewhere.page_path(&k).unwrap(), &path).unwrap(),
        Planted::Fifo => {
            let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
            // SAFETY: a valid C string.
            assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o660) }, 0);
        }
    }
    let started = std::time::Instant::now();
    let mut buf = vec![0u8; len];
    let got = tier
        .get(&mut [ReadSlot::new(k.clone(), &mut buf)])
        .await
        .pop()
        .unwrap();
    let took = started.elapsed();
    println!("{path_mode:?} {planted:?} of {len} bytes: {got:?} in {took:?}");
    assert!(
        !matches!(got, Ok(Lookup::Hit)),
        "a planted {planted:?} was served: {:?}",
        &buf[..8]
    );
    assert!(took < std::time::Duration::from_secs(2), "took {took:?}");
}
