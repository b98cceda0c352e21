use std::fs::File;
use std::path::Path;
use std::time::Duration;

use tier_core::PageKey;
use tier_folder::format::{self, Trailer};

use super::super::{Created, Syscalls};
use super::files::replaced;
use super::*;
use crate::file::NixlFileConfig;

/// A POSIX backend of a tier on `dir` (the NIXL runtime loaded), which has path mode.
fn backend(dir: &Path) -> Arc<Backend> {
    crate::runtime::load(None).expect("the NIXL runtime");
    let config = NixlFileConfig::new([dir]);
    let backend = super::super::super::open::create_backend(&config, 0).expect("a backend");
    assert_eq!(
        probe_path_mode(&backend),
        FileMode::Path,
        "NIXL has path mode"
    );
    backend
}

/// An engine of `backend` in `mode`, on an owner's folder (on a filesystem whose clients
/// cache apart if `remote`), checksums on.
fn engine(backend: &Arc<Backend>, mode: FileMode, remote: bool) -> NixlEngine {
    NixlEngine {
        backend: Arc::clone(backend),
        mode,
        timeout: Duration::from_secs(10),
        sync: false,
        checksums: true,
        file_mode: FolderMode::Owner,
        remote,
    }
}

/// `page`'s memory, registered with `engine`'s backend as a caller's lent for a batch: its
/// region and what holds the registration.
fn lent(engine: &NixlEngine, page: &[u8]) -> ((usize, usize), Arc<Held>) {
    let region = (page.as_ptr() as usize, page.len());
    let mut held = Held::default();
    held.lend(
        engine
            .backend
            .register_dram(&[region])
            .expect("the page's memory registered"),
    );
    (region, held.seal())
}

/// A write run twice, as a batch that failed is retried page by page, creates its temp
/// file twice (the second unlinks the first): the file kept for the seal is the one the
/// last run created, the one renamed in, so the page lands with its trailer.
#[test]
fn a_write_run_again_is_sealed_in_the_file_it_created_last() {
    for mode in [FileMode::Path, FileMode::Fd] {
        let dir = tempfile::tempdir().expect("a temp folder");
        let engine = engine(&backend(dir.path()), mode, false);
        let page = vec![0x5a_u8; 4096];
        let (region, memory) = lent(&engine, &page);
        let key = PageKey::new("k").expect("a key");
        let path = dir.path().join("temp");
        let mut xfer = Xfer {
            key: key.clone(),
            path: path.clone(),
            len: page.len(),
            direct: false,
            parts: vec![region],
            checksum: None,
            created: Some(Created::default()),
            opened: None,
        };
        for _ in 0..2 {
            let moved = engine.transfer(XferOp::Write, std::slice::from_ref(&xfer), &[0], &memory);
            assert!(moved.is_ok(), "{mode} mode: the write ran");
        }
        let created = xfer.created.as_mut().and_then(Created::take);
        assert!(created.is_some(), "{mode} mode: the created file was kept");
        format::seal(created, &path, &key, page.len(), Some(7), false).expect("sealed");
        let file = File::open(&path).expect("the temp file");
        assert_eq!(
            format::read_from(&file, &key).expect("its trailer read"),
            Trailer::Page(Some(7)),
            "{mode} mode: the file under the temp name has the trailer"
        );
    }
}

/// A read's file another GlusterFS client replaced between kvtier's open and NIXL's
/// (NIXL's open through `/proc/self/fd/N` answers `ESTALE`) is opened again by its name
/// and registered: the new file. One the other client removed fails alone, as a file not
/// there (a miss to the reader), never as an error of its batch. (Gets in the GlusterFS
/// soak failed with "registering files" on such pages.)
#[test]
fn a_read_file_another_client_replaced_before_nixl_opened_it_is_opened_again() {
    let (a, b) = tier_tests::gluster::mounts().folder("reopen");
    let engine = engine(&backend(&a), FileMode::Path, true);
    let items = [Xfer {
        key: PageKey::new("k").expect("a key"),
        path: a.join("page"),
        len: 4096,
        direct: false,
        parts: Vec::new(),
        checksum: None,
        created: None,
        opened: None,
    }];
    let store = |v: u8| {
        std::fs::write(b.join("page.new"), vec![v; 4096]).expect("written on b");
        std::fs::rename(b.join("page.new"), b.join("page")).expect("renamed in on b");
    };
    store(1);
    for round in 0..4 {
        let opened = engine
            .open_files(XferOp::Read, &items, &[0])
            .expect("opened");
        store(2 + round);
        let (_, fd) = opened.by_descriptor[0];
        assert!(
            replaced(fd),
            "round {round}: the file held is gone for NIXL's open"
        );
        let (registration, files, _) = engine
            .register_opened(XferOp::Read, &items, &[0], opened)
            .unwrap_or_else(|e| panic!("round {round}: not registered: {e:?}"));
        let mut bytes = vec![0u8; 4096];
        use std::os::unix::fs::FileExt;
        files[0].read_exact_at(&mut bytes, 0).expect("read");
        assert_eq!(bytes, vec![2 + round; 4096], "round {round}: the new file");
        drop(registration);
    }
    let opened = engine
        .open_files(XferOp::Read, &items, &[0])
        .expect("opened");
    std::fs::remove_file(b.join("page")).expect("removed on b");
    match engine.register_opened(XferOp::Read, &items, &[0], opened) {
        Err(Failure::Item(0, e)) => assert!(super::super::gone(&e), "{e}"),
        Err(e) => panic!("a removed file fails its batch: {e:?}"),
        Ok(_) => panic!("a removed file is registered"),
    }
    let _ = std::fs::remove_dir_all(&a);
}

/// A transfer is posted only within room in its backend's pool of I/O requests: while every
/// request's room is held elsewhere it waits (NIXL's pool itself free, so it is kvtier that
/// waits), and it goes ahead as soon as room is given back.
#[test]
fn a_transfer_waits_for_room_in_the_backends_pool_of_io_requests() {
    let dir = tempfile::tempdir().expect("a temp folder");
    let engine = engine(&backend(dir.path()), FileMode::Path, false);
    let page = vec![0x5a_u8; 4096];
    let (region, memory) = lent(&engine, &page);
    let xfer = Xfer {
        key: PageKey::new("k").expect("a key"),
        path: dir.path().join("temp"),
        len: page.len(),
        direct: false,
        parts: vec![region],
        checksum: None,
        created: None,
        opened: None,
    };
    let pool = engine.backend.io_pool_size().expect("POSIX has a pool");
    let taken = engine
        .backend
        .io_room(pool, Duration::ZERO)
        .expect("all of the pool's room");
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let moved = engine.transfer(XferOp::Write, std::slice::from_ref(&xfer), &[0], &memory);
            let _ = done.send(moved.is_ok());
        });
        assert!(
            finished.recv_timeout(Duration::from_millis(300)).is_err(),
            "the write waits while the pool has no room"
        );
        drop(taken);
        assert_eq!(
            finished.recv_timeout(Duration::from_secs(10)),
            Ok(true),
            "the write goes ahead once room is given back"
        );
    });
}

/// A read handed the file the tier holds open (`Xfer::opened`) reads that very file, not
/// the one its name holds by then, on each engine: NIXL in path and in fd mode (registered
/// by descriptor, never opened again), and the system calls.
#[test]
fn a_read_reads_the_file_held_open_not_the_one_its_name_holds_now() {
    let dir = tempfile::tempdir().expect("a temp folder");
    let backend = backend(dir.path());
    let path = dir.path().join("page");
    let syscalls = Syscalls {
        sync: false,
        mode: FolderMode::Owner,
    };
    let nixl = [
        engine(&backend, FileMode::Path, false),
        engine(&backend, FileMode::Fd, false),
    ];
    let engines: [&dyn PageEngine<Arc<Held>>; 3] = [&nixl[0], &nixl[1], &syscalls];
    for (n, engine) in engines.into_iter().enumerate() {
        // Page files of one page's length (the trailer's bytes are not read here).
        let file_len = format::file_len(4096) as usize;
        std::fs::write(&path, vec![0x11_u8; file_len]).expect("the held version written");
        let (held, _) = tier_folder::io::pin(&path).expect("the page file held open");
        std::fs::write(dir.path().join("new"), vec![0x22_u8; file_len]).expect("written");
        std::fs::rename(dir.path().join("new"), &path).expect("a new version renamed in");
        let page = vec![0_u8; 4096];
        let (region, memory) = lent(&nixl[0], &page);
        let xfer = Xfer {
            key: PageKey::new("k").expect("a key"),
            path: path.clone(),
            len: page.len(),
            direct: false,
            parts: vec![region],
            checksum: None,
            created: None,
            opened: Some(Arc::new(held)),
        };
        let outcome = engine.move_all(XferOp::Read, std::slice::from_ref(&xfer), &memory);
        assert!(!outcome.poisoned, "{}", engine.describe());
        assert!(
            outcome.results[0].is_ok(),
            "{}: {:?}",
            engine.describe(),
            outcome.results[0].as_ref().err()
        );
        let versions: std::collections::BTreeSet<u8> = page.iter().copied().collect();
        assert_eq!(
            versions,
            [0x11].into(),
            "engine {n} ({}) read the held file's bytes only",
            engine.describe()
        );
    }
}
