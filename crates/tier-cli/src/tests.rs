use super::*;
use tier_hierarchy::Hierarchy;

fn synthetic() -> Vec<trace::Request> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/synthetic_trace.jsonl");
    trace::load(&path)
        .unwrap_or_else(|e| panic!("the committed synthetic trace could not be read: {e}"))
}

#[test]
fn pages_that_cannot_fit_are_refused_before_allocating() {
    let trace = synthetic();
    let err = check_replay_memory(&trace, 3_000_000_000, Some(24 << 30)).unwrap_err();
    assert!(err.contains("1 GiB) page limit"), "{err}");
    let err = check_replay_memory(&trace, 512 << 20, Some(24 << 30)).unwrap_err();
    assert!(
        err.contains("blocks) needs") && err.contains("24.0 GiB"),
        "{err}"
    );
    check_replay_memory(&trace, 16 << 10, Some(24 << 30)).unwrap();
    check_replay_memory(&trace, 16 << 10, None).unwrap();
}

async fn hierarchy(toml: &str) -> Hierarchy {
    registry()
        .build(&HierarchyConfig::from_toml(toml).unwrap())
        .await
        .unwrap()
}

/// With room for everything, the replayed prefix-hit ratio is exactly the offline count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synthetic_trace_hit_ratio_matches_an_independent_count() {
    let trace = synthetic();
    let h = hierarchy("[[tiers]]\nkind = \"mem\"\ncapacity = \"1GiB\"\n").await;
    let report = replay::replay(&h, &trace, 1024, |_| {}).await.unwrap();
    let expected = sim::unbounded(&trace);
    println!(
        "synthetic trace: {} requests, replay {}/{} blocks, offline count {}/{}",
        trace.len(),
        report.ratio.reused,
        report.ratio.requested,
        expected.reused,
        expected.requested
    );
    assert_eq!(report.ratio.requested, expected.requested);
    assert_eq!(report.ratio.reused, expected.reused);
    assert_eq!((report.corrupt, report.errors), (0, 0));
    // `--json` says the same, and the one tier served every reused block.
    let summary = replay::summary(&h, &report, 1024);
    assert_eq!(summary.blocks_reused, expected.reused);
    assert_eq!(summary.tiers.len(), 1);
    assert_eq!(summary.tiers[0].served, expected.reused);
    assert!(serde_json::to_string(&summary)
        .unwrap()
        .contains("\"prefix_hit_ratio\""));
}

/// GETs `path` from the metrics endpoint at `addr`; the status line and the body.
async fn scrape(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: kvtier\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    socket.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// The sum of the samples of `name` whose labels include every one of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> u64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|l| l.split_once("} "))
        .filter(|(set, _)| {
            labels
                .iter()
                .all(|(k, v)| set.split(',').any(|kv| kv == format!("{k}=\"{v}\"")))
        })
        .map(|(_, v)| v.trim().parse::<f64>().unwrap() as u64)
        .sum()
}

/// Scraped halfway through a replay and at its end, the metrics endpoint agrees with the
/// replay's own figures: the hierarchy's calls and keys, the pages it stored (requested
/// minus reused), each tier's bytes written (counted by the call meter, checked against the
/// tier's own counter) and pages served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_endpoint_agrees_with_the_replay() {
    let trace = synthetic();
    let h = Arc::new(
        hierarchy(
            "[[tiers]]\nkind = \"mem\"\nname = \"top\"\ncapacity = \"2MiB\"\n\
             [[tiers]]\nkind = \"mem\"\nname = \"below\"\ncapacity = \"64MiB\"\n",
        )
        .await,
    );
    let source = Arc::clone(&h);
    let (addr, server) = serve_metrics("127.0.0.1:0".parse().unwrap(), move || {
        source.metrics_text()
    })
    .await
    .unwrap();
    let name = tier_core::StorageTier::info(&*h).name;
    let (mut requests, mut requested, mut reused) = (0u64, 0u64, 0u64);
    for part in [&trace[..500], &trace[500..1000]] {
        let report = replay::replay(&h, part, 1024, |_| {}).await.unwrap();
        requests += report.requests as u64;
        requested += report.ratio.requested;
        reused += report.ratio.reused;
        let (status, text) = scrape(addr, "/metrics").await;
        assert_eq!(status, "HTTP/1.1 200 OK");
        let whole = [("tier", name.as_str()), ("kind", "hierarchy")];
        let op = |op| [whole[0], whole[1], ("op", op)];
        assert_eq!(
            sample(&text, "kvtier_tier_call_seconds_count", &op("exists")),
            requests
        );
        assert_eq!(
            sample(&text, "kvtier_tier_call_pages_total", &op("exists")),
            requested
        );
        assert_eq!(
            sample(&text, "kvtier_tier_call_pages_total", &op("put")),
            requested - reused
        );
        let summary = replay::summary(&h, &report, 1024);
        assert_eq!(summary.tiers.len(), 2);
        for tier in &summary.tiers {
            let labels = [("tier", tier.name.as_str())];
            let put = [labels[0], ("op", "put")];
            assert!(tier.bytes_written > 0, "{}", tier.name);
            assert_eq!(
                sample(&text, "kvtier_tier_call_bytes_total", &put),
                tier.bytes_written,
                "{}",
                tier.name
            );
            assert_eq!(
                sample(&text, "kvtier_tier_served_pages_total", &labels),
                tier.served,
                "{}",
                tier.name
            );
        }
        assert!(sample(&text, "kvtier_tier_evictions_total", &[("tier", "top")]) > 0);
    }
    let (status, _) = scrape(addr, "/elsewhere").await;
    assert_eq!(status, "HTTP/1.1 404 Not Found");
    server.abort();
}

/// A lower tier that fails every write is named, and the replay does not pass for a
/// measurement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tier_failing_every_write_is_reported() {
    let trace = synthetic();
    let h = hierarchy(
        "[[tiers]]\nkind = \"mem\"\ncapacity = \"1MiB\"\n[[tiers]]\nkind = \"object\"\nname = \"nowhere\"\nstore = \"s3\"\nprefix = \"p\"\nendpoint = \"http://127.0.0.1:9\"\nbucket = \"b\"\naccess_key = \"k\"\nsecret_key = \"s\"\nop_timeout = \"200ms\"\n",
    )
    .await;
    replay::replay(&h, &trace[..5], 1024, |_| {}).await.unwrap();
    let text = replay::render(
        &h,
        &trace[..5],
        &replay::replay(&h, &[], 1024, |_| {}).await.unwrap(),
        1024,
        None,
        replay::Prefill {
            block_tokens: 512,
            tokens_per_sec: 10_000.0,
        },
    );
    let failed = replay::failed_tiers(&h);
    assert_eq!(failed.len(), 1, "{failed:?}\n{text}");
    assert!(failed[0].starts_with("nowhere ("), "{failed:?}");
    assert!(text.contains("errors"), "{text}");
}

/// A small LRU DRAM tier lands within a point of the offline LRU simulation at its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_lru_tier_tracks_the_lru_simulation() {
    let trace = synthetic();
    let pages = 4000usize;
    let capacity = pages * (1024 + 64);
    let h = hierarchy(&format!(
        "[[tiers]]\nkind = \"mem\"\ncapacity = {capacity}\npolicy = \"lru\"\n"
    ))
    .await;
    let report = replay::replay(&h, &trace, 1024, |_| {}).await.unwrap();
    let (lru, belady) = (sim::lru(&trace, pages), sim::belady_blocks(&trace, pages));
    println!(
        "replay {:.4}, LRU sim {:.4}, Belady {:.4}",
        report.ratio.value(),
        lru.value(),
        belady.value()
    );
    assert!((report.ratio.value() - lru.value()).abs() < 0.01);
    assert!(report.ratio.value() <= belady.value() + 1e-9);
    assert_eq!(report.corrupt, 0);
}

/// DRAM over an unbounded NIXL FILE tier loses nothing: every block seen before is reused
/// (from DRAM, the write-through queue or the files), byte-exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dram_over_nixl_file_replays_without_corruption() {
    let trace = synthetic();
    let tmp = tempfile::tempdir().unwrap();
    let h = hierarchy(&format!(
        "[[tiers]]\nkind = \"mem\"\ncapacity = \"2MiB\"\n[[tiers]]\nkind = \"nixl-file\"\ndirs = [{:?}]\n",
        tmp.path().join("t").display().to_string()
    ))
    .await;
    let report = replay::replay(&h, &trace[..1500], 4096, |_| {})
        .await
        .unwrap();
    let stats = h.hierarchy_stats();
    assert_eq!((report.corrupt, report.errors), (0, 0));
    assert!(
        stats.levels[1].served > 0,
        "the file tier served reuses: {stats:?}"
    );
    assert_eq!(report.ratio.reused, sim::unbounded(&trace[..1500]).reused);
    h.close().await.unwrap();
}

#[test]
fn every_example_config_checks() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "toml")
            && path.file_name().is_some_and(|n| n != "Cargo.toml")
        {
            let config = HierarchyConfig::from_file(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            registry()
                .plan(&config)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            checked += 1;
        }
    }
    assert!(checked >= 4, "example configs checked: {checked}");
}

/// The fallback default (DRAM over a local object_store folder) loses nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dram_over_local_objects_replays_exactly() {
    let trace = synthetic();
    let tmp = tempfile::tempdir().unwrap();
    let h = hierarchy(&format!(
        "[[tiers]]\nkind = \"mem\"\ncapacity = \"1MiB\"\n[[tiers]]\nkind = \"object\"\nstore = \"local\"\nprefix = \"replay\"\ndir = {:?}\n",
        tmp.path().join("objects").display().to_string()
    ))
    .await;
    let report = replay::replay(&h, &trace[..800], 4096, |_| {})
        .await
        .unwrap();
    assert_eq!((report.corrupt, report.errors), (0, 0));
    assert_eq!(report.ratio.reused, sim::unbounded(&trace[..800]).reused);
    h.close().await.unwrap();
}

#[test]
fn config_errors_name_the_tier_and_field() {
    let bad =
        HierarchyConfig::from_toml("[[tiers]]\nkind = \"mem\"\ncapacity = \"8XB\"\n").unwrap();
    let err = registry().plan(&bad).err().unwrap().to_string();
    assert!(
        err.contains("tiers[0].capacity") && err.contains("unit"),
        "{err}"
    );
    let bad = HierarchyConfig::from_toml("[[tiers]]\nkind = \"nixl-file\"\ndirs = []\n").unwrap();
    let err = registry().plan(&bad).err().unwrap().to_string();
    assert!(err.contains("tiers[0].dirs"), "{err}");
    let bad =
        HierarchyConfig::from_toml("[[tiers]]\nkind = \"nixl-file\"\ndirz = [\"/x\"]\n").unwrap();
    let err = registry().plan(&bad).err().unwrap().to_string();
    assert!(err.contains("dirz"), "{err}");
    let bad = HierarchyConfig::from_toml(
        "[hierarchy]\nwrite = \"write-back\"\n[[tiers]]\nkind = \"nixl-file\"\ndirs = [\"/x\"]\n[[tiers]]\nkind = \"mem\"\ncapacity = 1\n",
    )
    .unwrap();
    let err = registry().plan(&bad).err().unwrap().to_string();
    assert!(err.contains("write-back"), "{err}");
}

/// Hostile and absurd configs: each is refused with an error naming what was wrong, before
/// anything is opened; none panics.
#[test]
fn hostile_configs_are_refused_with_clear_errors() {
    let s3 = "bucket = \"b\"\nendpoint = \"http://127.0.0.1:9\"\n";
    let cases: Vec<(String, &str)> = vec![
        ("[[tiers]]\nkind = \"nvme\"\n".into(), "unknown kind"),
        ("tiers = []\n".into(), "at least one tier"),
        ("[[tiers]]\nkind = \"mem\"\ncapacity = -5\n".into(), "cannot be negative"),
        ("[[tiers]]\nkind = \"mem\"\ncapacity = \"-5MiB\"\n".into(), "not a size"),
        ("[[tiers]]\nkind = \"mem\"\ncapacity = \"2EiB\"\n".into(), "unknown size unit"),
        ("[[tiers]]\nkind = \"mem\"\ncapacity = \"9999999TiB\"\n".into(), "larger than 1 EiB"),
        ("[[tiers]]\nkind = \"mem\"\ncapacity = \"512TiB\"\n".into(), "machine's memory"),
        ("[[tiers]]\nkind = \"mem\"\ncapacity = 1.5\n".into(), "whole number"),
        ("[[tiers]]\nkind = \"mem\"\ncapacity = 1\npolicy = \"lru\"\nttl = \"-1s\"\n".into(), "tiers[0].ttl"),
        ("[[tiers]]\nkind = \"mem\"\ncapacity = 1\npolicy = \"sieve\"\ntti = \"1s\"\n".into(), "`tiers[0].tti`: expiry needs policy"),
        ("[[tiers]]\nkind = \"mem\"\ncapacity = 1\npolicy = \"fifo\"\n".into(), "unknown variant `fifo`"),
        ("[[tiers]]\nkind = \"nixl-file\"\ndirs = [\"/x\"]\nstaging_bytes = \"512GiB\"\n".into(), "staging_bytes"),
        ("[[tiers]]\nkind = \"nixl-file\"\ndirs = [\"/x\"]\nstaging_buffers = 100000\n".into(), "staging_buffers"),
        ("[[tiers]]\nkind = \"nixl-file\"\ndirs = [\"/x\"]\ncapacity = 0\n".into(), "capacity"),
        ("[[tiers]]\nkind = \"nixl-file\"\ndirs = [\"/x\"]\npolicy = \"tinylfu\"\n".into(), "tinylfu is moka's"),
        ("[[tiers]]\nkind = \"nixl-file\"\ndirs = [\"/x\"]\ndurability = \"disk\"\n".into(), "unknown variant `disk`, expected `process` or `power`"),
        ("[[tiers]]\nkind = \"object\"\nstore = \"s3\"\nprefix = \"p\"\nbucket = \"b\"\naccess_key = \"k\"\n".into(), "access_key and secret_key, or neither"),
        (format!("[[tiers]]\nkind = \"object\"\nstore = \"s3\"\nprefix = \"../up\"\naccess_key = \"k\"\nsecret_key = \"s\"\n{s3}"), "prefix"),
        ("[[tiers]]\nkind = \"object\"\nstore = \"memory\"\nprefix = \"p\"\nconcurrency = 0\n".into(), "concurrency"),
        (format!("[[tiers]]\nkind = \"nixl-obj\"\nprefix = \"p\"\naccess_key = \"k\"\n{s3}"), "secret_key"),
        (format!("[[tiers]]\nkind = \"nixl-obj\"\nprefix = \"p\"\naccess_key = \"k\"\nsecret_key = \"s\"\nlanes = 100000\n{s3}"), "lanes"),
        (format!("[[tiers]]\nkind = \"nixl-obj\"\nprefix = \"p\"\naccess_key = \"k\"\nsecret_key = \"s\"\nmax_page = \"6GiB\"\n{s3}"), "max_page"),
        ("[[tiers]]\nkind = \"nixl-obj\"\nprefix = \"p\"\naccess_key = \"k\"\nsecret_key = \"s\"\nendpoint = \"ftp://x\"\nbucket = \"b\"\n".into(), "endpoint"),
        ("[[tiers]]\nkind = \"mem\"\ncapacity = 1\ncolour = \"red\"\n".into(), "colour"),
        ("[[tiers]\nkind = \"mem\"\n".into(), "not valid TOML"),
    ];
    for (text, says) in cases {
        let err = HierarchyConfig::from_toml(&text)
            .and_then(|config| registry().plan(&config).map(|_| ()))
            .expect_err(&text)
            .to_string();
        assert!(err.contains(says), "{text:?}: {err}");
    }
}
