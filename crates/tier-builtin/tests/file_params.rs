//! NIXL FILE settings as users write them in config files.

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier};
use tier_hierarchy::config::HierarchyConfig;

fn config(dir: &std::path::Path, extra: &str) -> HierarchyConfig {
    HierarchyConfig::from_toml(&format!(
        "[[tiers]]\nkind = \"nixl-file\"\ndirs = [{:?}]\n{extra}\n",
        dir.display()
    ))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_io_is_a_setting_and_a_wrong_value_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = tier_builtin::registry();
    let tier = registry
        .build(&config(&tmp.path().join("on"), "bounded_io = \"on\""))
        .await
        .unwrap();
    let key = PageKey::new("page").unwrap();
    tier.put(&[Page::new(key.clone(), vec![3u8; 8192])])
        .await
        .pop()
        .unwrap()
        .unwrap();
    let mut buf = vec![0u8; 8192];
    let got = tier.get(&mut [ReadSlot::new(key, &mut buf)]).await;
    assert!(matches!(got[0], Ok(Lookup::Hit)), "{got:?}");
    assert_eq!(buf, vec![3u8; 8192]);
    let wrong = registry
        .build(&config(
            &tmp.path().join("wrong"),
            "bounded_io = \"sometimes\"",
        ))
        .await
        .err()
        .expect("an unknown bounded_io is refused")
        .to_string();
    assert!(
        wrong.contains("sometimes") && wrong.contains("auto"),
        "{wrong}"
    );
}

/// `ordered_pages` is an owner's setting (it sizes an index only an owner keeps): taken there,
/// refused naming itself where the access is shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_pages_is_an_owners_setting() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = tier_builtin::registry();
    registry
        .build(&config(
            &tmp.path().join("owner"),
            "capacity = \"1MiB\"\nordered_pages = 0",
        ))
        .await
        .expect("an owner takes ordered_pages");
    let shared = registry
        .build(&config(
            &tmp.path().join("shared"),
            "access = \"shared\"\ncapacity = \"1MiB\"\nordered_pages = 10",
        ))
        .await
        .err()
        .expect("a sharer refuses ordered_pages")
        .to_string();
    assert!(
        shared.contains("ordered_pages") && shared.contains("owner"),
        "{shared}"
    );
}
