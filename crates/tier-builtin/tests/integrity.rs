//! `integrity` on a shared FILE folder, built from config as users write it: pages a writer
//! without the secret plants or overwrites there are misses for the fleet that holds it.

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier};
use tier_hierarchy::config::HierarchyConfig;

fn config(dir: &std::path::Path, sealed: bool) -> HierarchyConfig {
    let integrity = if sealed {
        "integrity = { key_env = \"KVTIER_TEST_FLEET_SECRET\" }"
    } else {
        ""
    };
    HierarchyConfig::from_toml(&format!(
        "[[tiers]]\nkind = \"nixl-file\"\ndirs = [{:?}]\naccess = \"shared\"\n{integrity}\n",
        dir.display()
    ))
    .unwrap()
}

async fn read(tier: &dyn StorageTier, k: &PageKey, len: usize) -> Lookup {
    let mut buf = vec![0u8; len];
    let mut slots = [ReadSlot::new(k.clone(), &mut buf)];
    tier.get(&mut slots).await.pop().unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_planted_in_a_sealed_shared_folder_are_misses() {
    // SAFETY: the only variable this test binary sets, before any thread reads it.
    unsafe {
        std::env::set_var(
            "KVTIER_TEST_FLEET_SECRET",
            "one secret the whole fleet shares",
        )
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shared");
    let registry = tier_builtin::registry();
    let fleet = registry.build(&config(&dir, true)).await.unwrap();
    let intruder = registry.build(&config(&dir, false)).await.unwrap();
    let (ours, planted) = (
        PageKey::new("fleet-page").unwrap(),
        PageKey::new("planted-page").unwrap(),
    );
    fleet
        .put(&[Page::new(ours.clone(), vec![1u8; 4096])])
        .await
        .pop()
        .unwrap()
        .unwrap();
    assert_eq!(read(&fleet, &ours, 4096).await, Lookup::Hit);
    // The intruder writes pages of the sealed length (page + MAC) with bytes of its choosing.
    intruder
        .put(&[
            Page::new(planted.clone(), vec![9u8; 4096 + 32]),
            Page::new(ours.clone(), vec![9u8; 4096 + 32]),
        ])
        .await
        .into_iter()
        .for_each(|r| r.unwrap());
    assert_eq!(read(&fleet, &planted, 4096).await, Lookup::Miss);
    assert_eq!(read(&fleet, &ours, 4096).await, Lookup::Miss, "overwritten");
    assert_eq!(read(&intruder, &planted, 4096 + 32).await, Lookup::Hit);
}

#[test]
fn integrity_above_the_last_tier_of_a_write_back_hierarchy_is_refused() {
    let config = HierarchyConfig::from_toml(
        "[hierarchy]\nwrite = \"write-back\"\n[[tiers]]\nkind = \"mem\"\ncapacity = \"1MiB\"\n\
         integrity = { key_env = \"KVTIER_TEST_FLEET_SECRET\" }\n[[tiers]]\nkind = \"mem\"\ncapacity = \"1MiB\"\n",
    )
    .unwrap();
    let e = tier_builtin::registry()
        .plan(&config)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("tiers[0].integrity"), "{e}");
}
