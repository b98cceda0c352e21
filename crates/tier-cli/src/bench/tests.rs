use super::*;

fn settings() -> Settings {
    Settings {
        page_bytes: 4096,
        batch: 8,
        pages: 64,
        concurrency: 2,
        ops: vec![Op::Put, Op::Get, Op::Exists, Op::Remove],
        rounds: 2,
        duration: None,
        fault: None,
    }
}

/// With `--duration`, rounds go on until the time has passed: more than `--rounds`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duration_runs_rounds_until_it_has_passed() {
    let settings = Settings {
        rounds: 1,
        duration: Some(0.3),
        ..settings()
    };
    let config =
        HierarchyConfig::from_toml("[[tiers]]\nkind = \"mem\"\ncapacity = \"16MiB\"\n").unwrap();
    let started = Instant::now();
    let reports = bench(&crate::registry(), &config, &settings, |_| {})
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(reports.iter().all(|r| r.rounds > 1), "{reports:?}");
}

/// A DRAM tier one page too small misses a page per round: the bench says so beside its
/// report (it used to stop with no report at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_too_small_reports_its_misses() {
    let settings = Settings {
        ops: vec![Op::Put, Op::Get, Op::Exists],
        ..settings()
    };
    // 63 pages of key and bytes fit, the 64th does not.
    let page = (PageKey::new("bench-0-00000000").unwrap().len() + 4096) as u64;
    let config = HierarchyConfig::from_toml(&format!(
        "[[tiers]]\nkind = \"mem\"\npolicy = \"lru\"\ncapacity = {}\n",
        page * 64 - 1
    ))
    .unwrap();
    let reports = bench(&crate::registry(), &config, &settings, |_| {})
        .await
        .unwrap();
    let missed: Vec<u64> = reports.iter().map(|r| r.missed).collect();
    // LRU lets the first page go: a get misses it, an exists finds none of its batch of 8
    // (the leading run stops at it).
    assert_eq!(missed, [0, 2, 16], "{reports:?}");
    let text = render(&reports, &settings);
    assert!(
        text.contains("get: 2 of 128 pages missed over 2 round(s)"),
        "{text}"
    );
}

async fn run(config: &str) -> Vec<OpReport> {
    let settings = settings();
    let config = HierarchyConfig::from_toml(config).unwrap();
    let reports = bench(&crate::registry(), &config, &settings, |_| {})
        .await
        .unwrap();
    print!("{}", render(&reports, &settings));
    assert_eq!(reports.len(), 4);
    for r in &reports {
        assert!(r.pages_per_s > 0.0 && r.latency_us.p50 > 0.0, "{r:?}");
    }
    reports
}

/// The bench runs on DRAM, NIXL FILE and object_store on a real S3 server, every page
/// read back checked, each beside its baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_on_dram_nixl_file_and_s3() {
    let dram = run("[[tiers]]\nkind = \"mem\"\ncapacity = \"8MiB\"\n").await;
    assert_eq!(dram[0].baseline.as_deref(), Some("memcpy"));
    assert!(dram[1].baseline_pages_per_s.is_some() && dram[2].baseline.is_none());
    let dir = tempfile::tempdir().unwrap();
    let file = run(&format!(
        "[[tiers]]\nkind = \"nixl-file\"\ndirs = [{:?}]\n",
        dir.path().join("disk").display().to_string()
    ))
    .await;
    assert!(file
        .iter()
        .all(|r| r.baseline.as_deref() == Some("plain file per page")));
    let s3 = tier_tests::s3::S3Server::shared();
    let objects = run(&format!(
        "[[tiers]]\nkind = \"object\"\nstore = \"s3\"\nprefix = \"bench\"\nendpoint = {:?}\nbucket = {:?}\naccess_key = {:?}\nsecret_key = {:?}\n",
        s3.endpoint(), s3.bucket, s3.access_key, s3.secret_key
    ))
    .await;
    assert!(objects
        .iter()
        .all(|r| r.baseline.as_deref() == Some("object_store loop")));
}
