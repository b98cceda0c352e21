//! Keyed page integrity: the whole suite over a sealed tier, and pages planted, altered or
//! moved by a writer without the secret answered as misses, never hits.

use std::sync::Arc;

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier, TierError};
use tier_hierarchy::sealed::{IntegrityConfig, Sealed, TAG_BYTES};
use tier_mem::{MemTier, MemTierConfig};
use tier_tests::content;
use tier_tests::suite::DynTier;
use tier_tests::TierFactory;

fn mem() -> Arc<MemTier> {
    Arc::new(MemTier::open(MemTierConfig::new(64 << 20)).unwrap())
}

fn secret(word: &str) -> [u8; 32] {
    let var = format!("KVTIER_TEST_SECRET_{}", word.to_uppercase());
    // SAFETY (edition 2024 wording aside): tests of this binary set only their own variables.
    unsafe { std::env::set_var(&var, format!("{word}-{word}-{word}-{word}")) };
    IntegrityConfig {
        key_env: Some(var),
        key_file: None,
    }
    .key("integrity")
    .unwrap()
}

struct SealedFactory;

#[tier_core::async_trait]
impl TierFactory for SealedFactory {
    async fn open(&self) -> Result<DynTier, TierError> {
        Ok(Arc::new(Sealed::new(mem(), secret("suite"))))
    }

    async fn open_bounded(&self, capacity_bytes: u64) -> Option<Result<DynTier, TierError>> {
        let inner = MemTier::open(MemTierConfig::new(capacity_bytes));
        Some(inner.map(|t| Arc::new(Sealed::new(Arc::new(t), secret("suite"))) as DynTier))
    }
}

mod suite {
    tier_tests::conformance_suite!(super::SealedFactory);
}

fn key(i: usize) -> PageKey {
    PageKey::new(format!("s{i:063x}")).unwrap()
}

async fn read(tier: &dyn StorageTier, k: &PageKey, len: usize) -> (Lookup, Vec<u8>) {
    let mut buf = vec![0u8; len];
    let mut slots = [ReadSlot::new(k.clone(), &mut buf)];
    let r = tier.get(&mut slots).await.pop().unwrap().unwrap();
    (r, buf)
}

#[tokio::test]
async fn pages_written_without_the_secret_are_misses_never_hits() {
    let inner = mem();
    let ours = Sealed::new(inner.clone(), secret("ours"));
    let theirs = Sealed::new(inner.clone(), secret("theirs"));
    let (a, b, c) = (key(1), key(2), key(3));
    let page = |k: &PageKey, v| Page::new(k.clone(), content::page(k, v, 4096));

    ours.put(&[page(&a, 1)]).await.pop().unwrap().unwrap();
    let (hit, bytes) = read(&ours, &a, 4096).await;
    assert_eq!(hit, Lookup::Hit);
    assert_eq!(bytes, content::page(&a, 1, 4096));

    // Planted by a writer with another secret, and by one with none (the right length).
    theirs.put(&[page(&b, 1)]).await.pop().unwrap().unwrap();
    let raw = Page::new(c.clone(), content::page(&c, 1, 4096 + TAG_BYTES));
    inner.put(&[raw]).await.pop().unwrap().unwrap();
    assert_eq!(
        read(&ours, &b, 4096).await.0,
        Lookup::Miss,
        "another key's page"
    );
    assert_eq!(
        read(&ours, &c, 4096).await.0,
        Lookup::Miss,
        "a page with no MAC"
    );

    // One of ours altered in place (a bit flipped), and one of ours moved under another key.
    let (_, mut stored) = read(inner.as_ref(), &a, 4096 + TAG_BYTES).await;
    stored[17] ^= 1;
    inner
        .put(&[Page::new(a.clone(), stored.clone())])
        .await
        .pop()
        .unwrap()
        .unwrap();
    assert_eq!(
        read(&ours, &a, 4096).await.0,
        Lookup::Miss,
        "an altered page"
    );
    stored[17] ^= 1;
    inner
        .put(&[Page::new(b.clone(), stored)])
        .await
        .pop()
        .unwrap()
        .unwrap();
    assert_eq!(
        read(&ours, &b, 4096).await.0,
        Lookup::Miss,
        "a page moved to another key"
    );
    assert_eq!(ours.forged(), 4);
}

#[tokio::test]
async fn a_length_mismatch_names_the_callers_lengths() {
    let ours = Sealed::new(mem(), secret("lengths"));
    let k = key(9);
    ours.put(&[Page::new(k.clone(), vec![7u8; 1000])])
        .await
        .pop()
        .unwrap()
        .unwrap();
    let mut buf = vec![0u8; 999];
    let mut slots = [ReadSlot::new(k, &mut buf)];
    match ours.get(&mut slots).await.pop().unwrap() {
        Err(TierError::LengthMismatch { stored, buffer, .. }) => {
            assert_eq!((stored, buffer), (1000, 999))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn secrets_that_cannot_work_are_config_errors() {
    let missing = IntegrityConfig {
        key_env: Some("KVTIER_TEST_NO_SUCH_VARIABLE".into()),
        key_file: None,
    };
    assert!(missing
        .key("tiers[1].integrity")
        .unwrap_err()
        .to_string()
        .contains("KVTIER_TEST_NO_SUCH_VARIABLE"));
    let neither = IntegrityConfig::default();
    assert!(neither
        .key("x")
        .unwrap_err()
        .to_string()
        .contains("exactly one"));
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("secret");
    std::fs::write(&file, "a secret of enough bytes\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let loose = IntegrityConfig {
        key_env: None,
        key_file: Some(file.clone()),
    };
    assert!(loose
        .key("x")
        .unwrap_err()
        .to_string()
        .contains("owner only"));
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(loose.key("x").is_ok());
    std::fs::write(&file, "short").unwrap();
    assert!(loose
        .key("x")
        .unwrap_err()
        .to_string()
        .contains("at least 16"));
}

/// A key file planted as a link (to a file whose mode passes), a FIFO, or a huge file is
/// refused at once, naming what it is; nothing is read through the link. (Checked by path
/// and read by path again, a link was followed and a FIFO hung the open.)
#[test]
fn a_key_file_is_read_only_from_a_regular_file_checked_by_its_descriptor() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("someone-elses-secret");
    std::fs::write(&target, "a secret of enough bytes\n").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let fifo = tmp.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let huge = tmp.path().join("huge");
    std::fs::write(&huge, vec![b'k'; 1 << 20]).unwrap();
    std::fs::set_permissions(&huge, std::fs::Permissions::from_mode(0o600)).unwrap();
    for (path, why) in [
        (link, "is a link"),
        (fifo, "not a regular file"),
        (huge, "over 4096 bytes"),
    ] {
        let config = IntegrityConfig {
            key_env: None,
            key_file: Some(path.clone()),
        };
        let (sent, answered) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = sent.send(config.key("x").map_err(|e| e.to_string()));
        });
        let outcome = answered
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("reading {} waited", path.display()));
        let message = outcome.expect_err("a planted key file was taken");
        assert!(message.contains(why), "{message}");
    }
}
