//! `kvtier check CONFIG`: the settings each tier resolves to, and a warning for every tier
//! others may write without an integrity key.

use std::process::Command;

fn check(config: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kvtier.toml");
    std::fs::write(&path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .arg("check")
        .arg(&path)
        .output()
        .expect("kvtier runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A folder shared with a group and a prefix shared across a fleet, without `integrity`:
/// anyone who may write there can forge pages, and `check` says so of each; with `integrity`,
/// or for this user's own folder, it says nothing. (It said nothing of any.)
#[test]
fn tiers_others_may_write_without_integrity_are_warned_of() {
    let unsealed = check(
        "[[tiers]]\nkind = \"nixl-file\"\ndirs = [\"/srv/kv\"]\nmode = \"group\"\n\
         [[tiers]]\nkind = \"object\"\nstore = \"s3\"\nbucket = \"b\"\nprefix = \"kv\"\n\
         access = \"shared\"\ncapacity = \"1GiB\"\n",
    );
    assert!(
        unsealed.contains("WARNING: tier 0 (nixl-file): the folders' group"),
        "{unsealed}"
    );
    assert!(
        unsealed.contains("WARNING: tier 1 (object): every node holding the bucket's credentials"),
        "{unsealed}"
    );
    std::env::set_var("KVTIER_CHECK_TEST_SECRET", "a secret of enough bytes");
    let sealed = check(
        "[[tiers]]\nkind = \"nixl-file\"\ndirs = [\"/srv/kv\"]\nmode = \"group\"\n\
         integrity = { key_env = \"KVTIER_CHECK_TEST_SECRET\" }\n\
         [[tiers]]\nkind = \"nixl-file\"\ndirs = [\"/srv/mine\"]\n",
    );
    assert!(!sealed.contains("WARNING"), "{sealed}");
}

/// Uploads in parts a killed process left cannot be listed through object_store, so kvtier
/// cannot sweep them: `check` gives the lifecycle rule that ends them, naming the bucket and
/// the prefix, for every tier on S3 (it said nothing).
#[test]
fn tiers_on_s3_are_given_the_rule_that_ends_abandoned_uploads() {
    let out = check(
        "[[tiers]]\nkind = \"object\"\nstore = \"s3\"\nbucket = \"kv-bucket\"\nprefix = \"llama\"\n\
         [[tiers]]\nkind = \"nixl-obj\"\nbucket = \"other\"\nprefix = \"kv\"\naccess_key = \"a\"\nsecret_key = \"s\"\n\
         [[tiers]]\nkind = \"object\"\nstore = \"memory\"\nprefix = \"kv\"\n",
    );
    let notes: Vec<&str> = out.lines().filter(|l| l.starts_with("NOTE:")).collect();
    assert_eq!(notes.len(), 2, "{out}");
    assert!(
        notes[0].starts_with("NOTE: tier 0 (object)")
            && notes[0].contains("--bucket kv-bucket")
            && notes[0].contains("\"Prefix\":\"llama/\"")
            && notes[0].contains("AbortIncompleteMultipartUpload"),
        "{out}"
    );
    assert!(
        notes[1].starts_with("NOTE: tier 1 (nixl-obj)") && notes[1].contains("--bucket other"),
        "{out}"
    );
}
