//! `kvtier tenant-key`: each tenant's own integrity secret, derived from an operator's master
//! secret, so tenants handed only their own cannot forge each other's pages.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use tier_core::{Lookup, Page, PageKey, ReadSlot, StorageTier};
use tier_hierarchy::sealed::{IntegrityConfig, Sealed};
use tier_mem::{MemTier, MemTierConfig};

fn kvtier(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtier"))
        .args(args)
        .output()
        .expect("kvtier runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn private_file(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

async fn read(tier: &Sealed, key: &PageKey) -> Lookup {
    let mut buf = vec![0u8; 4096];
    let mut slots = [ReadSlot::new(key.clone(), &mut buf)];
    tier.get(&mut slots).await.pop().unwrap().unwrap()
}

fn mac_key(file: &Path) -> [u8; 32] {
    IntegrityConfig {
        key_env: None,
        key_file: Some(file.to_path_buf()),
    }
    .key("integrity")
    .expect("a tenant's secret is a secret a tier takes")
}

/// Tenants' secrets differ from each other and from the master, the same tenant's are the
/// same every time; written with `--out`, the file is new and mode 600; a master others may
/// read is refused. A page sealed under one tenant's secret is a miss under another's.
#[tokio::test]
async fn each_tenant_gets_a_secret_of_its_own_that_no_other_tenants_pages_pass() {
    let dir = tempfile::tempdir().unwrap();
    let master = dir.path().join("master.secret");
    private_file(
        &master,
        "the operator's master secret, kept by the operator\n",
    );
    let m = master.to_str().unwrap();
    let derive = |tenant: &str| kvtier(&["tenant-key", "--secret-file", m, "--tenant", tenant]);
    let (ok_a, a, err) = derive("tenant-a");
    assert!(ok_a, "{err}");
    let (_, a_again, _) = derive("tenant-a");
    let (_, b, _) = derive("tenant-b");
    assert_eq!(a.len(), 64);
    assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
    assert_eq!(a, a_again, "the same tenant, the same secret");
    assert_ne!(a, b, "two tenants, two secrets");
    assert!(!a.contains("master"));

    let a_file = dir.path().join("tenant-a.secret");
    let out = a_file.to_str().unwrap();
    let (ok, _, err) = kvtier(&[
        "tenant-key",
        "--secret-file",
        m,
        "--tenant",
        "tenant-a",
        "--out",
        out,
    ]);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read_to_string(&a_file).unwrap().trim(), a);
    let mode = std::fs::metadata(&a_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let (again, _, err) = kvtier(&[
        "tenant-key",
        "--secret-file",
        m,
        "--tenant",
        "tenant-b",
        "--out",
        out,
    ]);
    assert!(
        !again && err.contains("cannot be made"),
        "an existing file is kept: {err}"
    );

    std::fs::set_permissions(&master, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (readable, _, err) = derive("tenant-a");
    assert!(!readable && err.contains("--secret-file"), "{err}");

    let b_file = dir.path().join("tenant-b.secret");
    private_file(&b_file, &b);
    let inner: Arc<MemTier> = Arc::new(MemTier::open(MemTierConfig::new(1 << 20)).unwrap());
    let tier_a = Sealed::new(inner.clone(), mac_key(&a_file));
    let tier_b = Sealed::new(inner, mac_key(&b_file));
    let key = PageKey::new("a-page").unwrap();
    tier_b.put(&[Page::new(key.clone(), vec![7u8; 4096])]).await[0]
        .as_ref()
        .unwrap();
    assert_eq!(read(&tier_b, &key).await, Lookup::Hit);
    assert_eq!(
        read(&tier_a, &key).await,
        Lookup::Miss,
        "tenant b's page fails tenant a's MAC"
    );
}
