//! A FILE tier whose mount already hangs when the hierarchy opens (a GlusterFS FUSE mount whose
//! client is stopped, as a network filesystem whose server is gone): the hierarchy opens within
//! its `open_timeout` with that tier down, its calls fail at once, and once the mount answers
//! the tier finishes opening and the health probe brings it up.

use std::time::{Duration, Instant};

use tier_builtin::registry;
use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier, TierError};
use tier_hierarchy::config::HierarchyConfig;
use tier_tests::gluster::ClientMount;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hierarchy_opens_within_its_bound_on_a_hung_mount_and_the_tier_comes_up_after() {
    let mount = ClientMount::new("hung-open");
    let dir = mount.folder("tier");
    let config = HierarchyConfig::from_toml(&format!(
        "[hierarchy]\nopen_timeout = \"1s\"\n[hierarchy.health]\nprobe_backoff = \"100ms\"\n\
         probe_backoff_max = \"500ms\"\n[[tiers]]\nkind = \"nixl-file\"\ndirs = [{:?}]\n\
         transfer_timeout = \"2s\"\n",
        dir.display()
    ))
    .expect("a config");
    mount.freeze();
    let started = Instant::now();
    let built = tokio::time::timeout(Duration::from_secs(30), registry().build(&config)).await;
    let open_took = started.elapsed();
    let key = PageKey::new("b".repeat(64)).expect("a key");
    let page = vec![5u8; 4096];
    let frozen_put = match &built {
        Ok(Ok(hierarchy)) => {
            let started = Instant::now();
            let put = hierarchy
                .put(&[Page::lent(key.clone(), [page.as_slice()])])
                .await;
            Some((put, started.elapsed()))
        }
        _ => None,
    };
    mount.thaw();
    let hierarchy = built
        .unwrap_or_else(|_| panic!("the open waited {open_took:?} on the hung mount"))
        .expect("the hierarchy opens with the tier down");
    println!("opened in {open_took:?} on a frozen mount");
    assert!(
        open_took < Duration::from_secs(3),
        "open took {open_took:?}"
    );
    let (put, put_took) = frozen_put.expect("a put while frozen");
    assert!(
        matches!(put[0], Err(TierError::Unavailable(_))),
        "a put while the tier opens: {put:?}"
    );
    assert!(put_took < Duration::from_secs(1), "put took {put_took:?}");
    // Thawed: the tier opens and comes up; a page put then reads back.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let put = hierarchy
            .put(&[Page::lent(key.clone(), [page.as_slice()])])
            .await;
        if put[0].is_ok() {
            let mut buf = vec![0u8; 4096];
            let got = hierarchy
                .get(&mut [ReadSlot::new(key.clone(), &mut buf)])
                .await;
            assert!(matches!(got[0], Ok(Lookup::Hit)), "{got:?}");
            assert_eq!(buf, page);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the tier never came up after the thaw: {put:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("up {:?} after the open", started.elapsed());
    hierarchy.close().await.expect("closed");
}
