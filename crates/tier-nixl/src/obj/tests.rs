use std::sync::Arc;
use std::time::Duration;

use tier_object::S3Settings;

use super::*;
use crate::nixl::{
    next_dev_id, Backend, Desc, Finished, Held, IoRoom, MemKind, Owned, Registered, Unsettled,
    XferOp,
};
use tier_tests::s3::S3Server;

fn backend(server: &S3Server) -> Arc<Backend> {
    let s3 = S3Settings::endpoint(
        &server.endpoint(),
        &server.bucket,
        &server.access_key,
        &server.secret_key,
    );
    let config = NixlObjConfig::new(s3, "unsettled");
    crate::runtime::load(None).expect("the NIXL runtime");
    create_backend("unsettled-test", 0, &config.backend_params()).expect("an OBJ backend")
}

fn object(name: &str, len: usize) -> Desc<'_> {
    Desc {
        addr: 0,
        len,
        dev_id: next_dev_id(),
        meta: name.as_bytes(),
    }
}

/// Moves one object to or from `buf` in a transfer of its own.
fn move_one(backend: &Arc<Backend>, op: XferOp, name: &str, buf: &[u8]) -> Finished {
    let remote = [object(name, buf.len())];
    let mut held = Held::default();
    held.lend(
        backend
            .register_dram(&[(buf.as_ptr() as usize, buf.len())])
            .unwrap(),
    );
    held.files(
        backend.register(MemKind::Object, &remote).unwrap(),
        Vec::new(),
    );
    let local = [Desc::dram(buf.as_ptr() as usize, buf.len())];
    let transfer = backend
        .post(
            op,
            &local,
            MemKind::Object,
            &remote,
            &held.seal(),
            &mut IoRoom::default(),
        )
        .unwrap();
    transfer.finish(Duration::from_secs(30))
}

/// A transfer to an endpoint that never answers times out: it keeps the memory it holds
/// (never freed under a late request), counts it against its backend's bound, and past the
/// bound the backend refuses new transfers. Misuse is refused too: a descriptor outside
/// what the transfer holds registered.
#[test]
fn a_transfer_that_never_settles_keeps_its_memory_and_bounds_its_backend() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let s3 = S3Settings::endpoint(&endpoint, "bucket", "key", "secret");
    let config = NixlObjConfig::new(s3, "silent");
    crate::runtime::load(None).expect("the NIXL runtime");
    let backend =
        create_backend("silent-test", 0, &config.backend_params()).expect("an OBJ backend");
    backend.limit_abandoned(4096);
    let post = |name: &str, local_offset: usize| {
        let buf = vec![7u8; 4096].into_boxed_slice();
        let addr = buf.as_ptr() as usize;
        let memory = Arc::new(Owned::new(
            backend.register_dram(&[(addr, 4096)]).unwrap(),
            buf,
        ));
        let remote = [object(name, 4096)];
        let mut held = Held::default();
        held.own(Arc::clone(&memory) as Arc<dyn Registered>);
        held.files(
            backend.register(MemKind::Object, &remote).unwrap(),
            Vec::new(),
        );
        let local = [Desc::dram(addr + local_offset, 4096)];
        let posted = backend.post(
            XferOp::Write,
            &local,
            MemKind::Object,
            &remote,
            &held.seal(),
            &mut IoRoom::default(),
        );
        (memory, posted)
    };

    let (_, outside) = post("outside", 1);
    let refused = outside
        .err()
        .expect("a descriptor past the registered range is refused");
    assert!(refused.to_string().contains("outside"), "{refused}");

    let (memory, posted) = post("first", 0);
    match posted.unwrap().finish(Duration::from_millis(300)) {
        Finished::Unsettled(Unsettled::TimedOut) => {}
        other => panic!("a request nobody answers: want timed out, got {other:?}"),
    }
    assert!(
        Arc::strong_count(&memory) > 1,
        "the timed-out transfer let go of memory its request may still read"
    );
    assert_eq!(backend.abandoned_bytes(), 4096);

    // At the bound, one more may go; past it, none.
    let (_, posted) = post("second", 0);
    assert!(matches!(
        posted.unwrap().finish(Duration::from_millis(300)),
        Finished::Unsettled(Unsettled::TimedOut)
    ));
    let (_, refused) = post("third", 0);
    let refused = refused
        .err()
        .expect("past the bound, transfers are refused");
    assert!(
        refused.to_string().contains("over the bound of 4096"),
        "{refused}"
    );
}

/// NIXL's OBJ plugin reports a transfer failed as soon as one of its requests fails, while
/// the others may still be writing into their memory: freeing or reusing that memory then
/// corrupted the heap (a "double free" abort seen once in CI). A failure among several
/// descriptors must leave the transfer unsettled; a failure of the only one is settled.
#[test]
fn a_failure_among_several_objects_leaves_the_transfer_unsettled() {
    let server = S3Server::shared();
    let backend = backend(&server);
    const BIG: usize = 32 << 20;
    let content: Vec<u8> = (0..BIG).map(|i| (i % 251) as u8 + 1).collect();
    assert!(matches!(
        move_one(&backend, XferOp::Write, "big", &content),
        Finished::Done
    ));

    let missing = vec![0u8; 4096];
    match move_one(&backend, XferOp::Read, "missing", &missing) {
        Finished::Failed(_) => {}
        other => panic!("one missing object: want a settled failure, got {other:?}"),
    }

    // Big first, missing last: the plugin looks at its requests from the last one. The
    // memory is the transfer's own: it holds it while others of its requests may run.
    let big = vec![0u8; BIG].into_boxed_slice();
    let small = vec![0u8; 4096].into_boxed_slice();
    let regions = [
        (big.as_ptr() as usize, BIG),
        (small.as_ptr() as usize, small.len()),
    ];
    let memory = Arc::new(Owned::new(
        backend.register_dram(&regions).unwrap(),
        (big, small),
    ));
    let remote = [object("big", BIG), object("missing", 4096)];
    let mut held = Held::default();
    held.own(Arc::clone(&memory) as Arc<dyn Registered>);
    held.files(
        backend.register(MemKind::Object, &remote).unwrap(),
        Vec::new(),
    );
    let local = [
        Desc::dram(regions[0].0, BIG),
        Desc::dram(regions[1].0, 4096),
    ];
    let transfer = backend
        .post(
            XferOp::Read,
            &local,
            MemKind::Object,
            &remote,
            &held.seal(),
            &mut IoRoom::default(),
        )
        .unwrap();
    match transfer.finish(Duration::from_secs(30)) {
        Finished::Unsettled(Unsettled::Failed(_)) => {}
        other => panic!("a missing object among two: want unsettled, got {other:?}"),
    }
    assert!(
        Arc::strong_count(&memory) > 1,
        "the transfer let go of memory its other request may still write"
    );
}
