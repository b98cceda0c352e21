//! `kvtier`: replay real request traces through a tier hierarchy, probe NIXL, check configs.

mod bench;
mod replay;
mod sim;
mod sweep;
mod trace;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use tier_builtin::registry;
use tier_core::TierError;
use tier_hierarchy::config::HierarchyConfig;
use tier_hierarchy::{serve_metrics, Hierarchy};

#[derive(Parser)]
#[command(
    name = "kvtier",
    version,
    about = "Tiered KV-cache storage: replay, probe, check"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Log as JSON lines (the level comes from `RUST_LOG`, default `warn`).
    #[arg(long, global = true)]
    log_json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a Mooncake-format trace through a hierarchy and report hit ratios per tier.
    Replay {
        /// Hierarchy config (TOML or JSON). Default: DRAM over a NIXL FILE tier in a temp folder.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Trace (JSONL with `hash_ids`). Default: a built-in generated workload.
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Bytes per page (block).
        #[arg(long, default_value_t = 16 << 10)]
        page_bytes: usize,
        /// Replay only the first N requests.
        #[arg(long)]
        limit: Option<usize>,
        /// Write the hit ratio over requests as an SVG picture.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Sweep eviction policies x capacities on one DRAM tier (ignores --config).
        #[arg(long)]
        sweep: bool,
        /// Policies the sweep runs, comma-separated (default: all).
        #[arg(long, value_delimiter = ',')]
        policies: Vec<tier_mem::PolicyKind>,
        /// Capacities the sweep runs, in pages, comma-separated (default: 2.5% to 40% of the
        /// trace's distinct blocks).
        #[arg(long, value_delimiter = ',')]
        capacities: Vec<usize>,
        /// Sweep a hierarchy instead: DRAM (of each `--capacities` size, default 1000 pages)
        /// over a lower tier of this many pages, the lower tier's policy x write mode x
        /// `--admit-after`.
        #[arg(long, requires = "sweep")]
        lower_pages: Option<usize>,
        /// `admit_after` values the hierarchy sweep runs, comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "1,2",
            requires = "lower_pages"
        )]
        admit_after: Vec<u32>,
        /// Also write the report (or the sweep's table) as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Serve Prometheus metrics at http://ADDR/metrics while replaying (e.g. 127.0.0.1:9464).
        #[arg(long)]
        metrics_addr: Option<std::net::SocketAddr>,
    },
    /// Measure a hierarchy: put, get, exists and remove of fixed-size pages, beside a baseline
    /// on the top tier's medium (memcpy, plain files, a direct object_store loop).
    Bench {
        /// Hierarchy config (TOML or JSON). Default: one DRAM tier holding every page.
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        settings: bench::Settings,
        /// Also write the report as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Is the NIXL runtime there, which plugins, and does it have path mode?
    Probe,
    /// Validate a config and print the resolved hierarchy (opens nothing).
    Check {
        /// The config file.
        config: PathBuf,
    },
}

const DEFAULT_REQUESTS: usize = 3000;

/// The default hierarchy: 32 MiB of DRAM over a NIXL FILE tier in `dir`, or over an
/// object_store tier on a local folder (with a notice) where the NIXL runtime is missing.
fn default_config(dir: &Path) -> HierarchyConfig {
    let dram = "[[tiers]]\nkind = \"mem\"\nname = \"dram\"\ncapacity = \"32MiB\"\n";
    let text = match tier_nixl::runtime::load(None) {
        Ok(_) => format!(
            "{dram}\n[[tiers]]\nkind = \"nixl-file\"\nname = \"disk\"\ndirs = [{:?}]\n",
            dir.display().to_string()
        ),
        Err(e) => {
            eprintln!("notice: NIXL runtime not found ({e}); replaying on DRAM over a local object_store folder");
            format!(
                "{dram}\n[[tiers]]\nkind = \"object\"\nname = \"objects\"\nstore = \"local\"\nprefix = \"replay\"\ndir = {:?}\n",
                dir.display().to_string()
            )
        }
    };
    HierarchyConfig::from_toml(&text)
        .unwrap_or_else(|e| unreachable!("the built-in config parses: {e}"))
}

async fn run(cli: Cli) -> Result<(), String> {
    let command = cli.command.unwrap_or(Command::Replay {
        config: None,
        trace: None,
        page_bytes: 16 << 10,
        limit: None,
        plot: None,
        sweep: false,
        policies: Vec::new(),
        capacities: Vec::new(),
        lower_pages: None,
        admit_after: vec![1, 2],
        json: None,
        metrics_addr: None,
    });
    match command {
        Command::Probe => {
            let p = tier_nixl::probe(None).map_err(|e| e.to_string())?;
            println!("NIXL runtime: found ({})", p.source);
            println!(
                "version: {}",
                p.version
                    .as_deref()
                    .unwrap_or("unknown (not recorded by the install)")
            );
            println!("plugins: {}", p.plugins.join(", "));
            println!(
                "path mode: {}",
                if p.path_mode { "yes" } else { "no (fd mode)" }
            );
            Ok(())
        }
        Command::Bench {
            config,
            settings,
            json,
        } => run_bench(config, settings, json).await,
        Command::Check { config } => {
            let config = HierarchyConfig::from_file(&config).map_err(|e| e.to_string())?;
            let plans = registry().plan(&config).map_err(|e| e.to_string())?;
            let policy = config.policy();
            println!(
                "hierarchy: {:?}, promote {}, queue {}, flush timeout {:?}, written below from request {}",
                policy.write,
                policy.promote,
                policy.queue_bytes.map_or(
                    "a quarter of the top tier's capacity (1GiB if it has none)".into(),
                    |b| { tier_hierarchy::config::ByteSize(b).to_string() }
                ),
                policy.flush_timeout,
                policy.admit_after
            );
            for (i, (name, plan)) in plans.iter().enumerate() {
                println!("  tier {i}: {name:<10} {}", plan.describe());
            }
            Ok(())
        }
        Command::Replay {
            config,
            trace,
            page_bytes,
            limit,
            plot,
            sweep,
            policies,
            capacities,
            lower_pages,
            admit_after,
            json,
            metrics_addr,
        } => {
            if page_bytes == 0 {
                return Err("--page-bytes must be at least 1".into());
            }
            let mut requests = match &trace {
                Some(path) => trace::load(path)?,
                None => {
                    eprintln!("no --trace given: replaying a built-in generated workload ({DEFAULT_REQUESTS} requests)");
                    trace::generated(DEFAULT_REQUESTS)
                }
            };
            if let Some(limit) = limit {
                requests.truncate(limit);
            }
            check_replay_memory(&requests, page_bytes, machine_memory())?;
            if let Some(lower_pages) = lower_pages {
                let sweep = HierarchySweep {
                    policies,
                    capacities,
                    lower_pages,
                    admit_after,
                };
                return run_hierarchy_sweep(&requests, page_bytes, sweep, json).await;
            }
            if sweep {
                return run_sweep(&requests, page_bytes, policies, capacities, json, plot).await;
            }
            let tmp = tempfile::tempdir().map_err(|e| format!("cannot make a temp folder: {e}"))?;
            let config = match &config {
                Some(path) => HierarchyConfig::from_file(path).map_err(|e| e.to_string())?,
                None => default_config(&tmp.path().join("tier")),
            };
            let hierarchy = Arc::new(registry().build(&config).await.map_err(|e| e.to_string())?);
            let server = match metrics_addr {
                Some(addr) => {
                    let source = Arc::clone(&hierarchy);
                    let (bound, task) = serve_metrics(addr, move || source.metrics_text())
                        .await
                        .map_err(|e| e.to_string())?;
                    eprintln!("metrics: http://{bound}/metrics");
                    Some(task)
                }
                None => None,
            };
            let report = replay_with_progress(&hierarchy, &requests, page_bytes)
                .await
                .map_err(|e| e.to_string())?;
            if let Some(server) = server {
                server.abort();
            }
            print!(
                "{}",
                replay::render(
                    &hierarchy,
                    &requests,
                    &report,
                    page_bytes,
                    replay::top_policy(&config)
                )
            );
            if let Some(path) = plot {
                std::fs::write(
                    &path,
                    replay::svg(
                        &report,
                        &requests,
                        replay::top_pages(&hierarchy, page_bytes),
                    )?,
                )
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                println!("plot: {}", path.display());
            }
            write_json(json, &replay::summary(&hierarchy, &report, page_bytes))?;
            let failed = replay::failed_tiers(&hierarchy);
            hierarchy.close().await.map_err(|e| e.to_string())?;
            if !failed.is_empty() {
                return Err(format!("every write to {} failed", failed.join(", ")));
            }
            if report.corrupt > 0 {
                return Err(format!("{} reused pages were corrupt", report.corrupt));
            }
            Ok(())
        }
    }
}

async fn run_bench(
    config: Option<PathBuf>,
    s: bench::Settings,
    json: Option<PathBuf>,
) -> Result<(), String> {
    for (name, value, least) in [
        ("--page-bytes", s.page_bytes, 1),
        ("--batch", s.batch, 1),
        ("--pages", s.pages, 1),
        ("--concurrency", s.concurrency, 1),
        ("--rounds", s.rounds, 1),
    ] {
        if value < least {
            return Err(format!("{name} must be at least {least}"));
        }
    }
    if let Some(d) = s.duration {
        if !(d > 0.0 && d <= 86_400.0) {
            return Err(format!(
                "--duration {d}: a number of seconds above 0, at most a day"
            ));
        }
    }
    if s.concurrency > 1024 {
        return Err(format!("--concurrency {}: at most 1024", s.concurrency));
    }
    if s.ops.is_empty() {
        return Err("--ops names no operation".into());
    }
    // Read buffers, the page, and (for the memcpy baseline) a copy of every page.
    let need = (s.pages as u64)
        .saturating_mul(s.page_bytes as u64)
        .saturating_mul(3);
    if let Some(total) = machine_memory() {
        if need > total / 2 {
            return Err(format!(
                "--pages {} x --page-bytes {} needs about {need} bytes of memory; this machine has {total}",
                s.pages, s.page_bytes
            ));
        }
    }
    let config = match &config {
        Some(path) => HierarchyConfig::from_file(path).map_err(|e| e.to_string())?,
        None => {
            let capacity = (s.pages as u64) * (s.page_bytes as u64 + 256) + (1 << 20);
            HierarchyConfig::from_toml(&format!(
                "[[tiers]]\nkind = \"mem\"\nname = \"dram\"\ncapacity = {capacity}\n"
            ))
            .map_err(|e| e.to_string())?
        }
    };
    let terminal = std::io::stderr().is_terminal();
    let rounds = s.rounds;
    let reports = bench::bench(&registry(), &config, &s, |done| {
        if terminal {
            eprint!("\rbench: round {done} (at least {rounds})");
        }
    })
    .await?;
    if terminal {
        eprintln!();
    }
    print!("{}", bench::render(&reports, &s));
    write_json(json, &reports)
}

/// Writes `value` as JSON to `path`, if one was given, and says where.
fn write_json(path: Option<PathBuf>, value: &impl serde::Serialize) -> Result<(), String> {
    let Some(path) = path else {
        return Ok(());
    };
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("json: {}", path.display());
    Ok(())
}

async fn run_sweep(
    requests: &[trace::Request],
    page_bytes: usize,
    mut policies: Vec<tier_mem::PolicyKind>,
    mut capacities: Vec<usize>,
    json: Option<PathBuf>,
    plot: Option<PathBuf>,
) -> Result<(), String> {
    if policies.is_empty() {
        policies = tier_mem::PolicyKind::ALL.to_vec();
    }
    if capacities.is_empty() {
        capacities = sweep::default_capacities(requests);
    }
    if let Some(zero) = capacities.iter().find(|c| **c == 0) {
        return Err(format!(
            "--capacities: {zero} pages: each capacity must be at least 1 page"
        ));
    }
    let largest = capacities.iter().max().copied().unwrap_or(0) as u64;
    let need = largest.saturating_mul(page_bytes as u64 + 64);
    if let Some(total) = machine_memory() {
        if need > total / 2 {
            return Err(format!(
                "--capacities {largest} x --page-bytes {page_bytes} needs {need} bytes of DRAM; this machine has {total}: use smaller pages (the hit ratio does not depend on them)"
            ));
        }
    }
    let terminal = std::io::stderr().is_terminal();
    let rows = sweep::sweep(
        &registry(),
        requests,
        page_bytes,
        &policies,
        &capacities,
        |done, total| {
            if terminal {
                eprint!("\rsweep: {done}/{total} cells");
                if done == total {
                    eprintln!();
                }
            }
        },
    )
    .await
    .map_err(|e| e.to_string())?;
    print!("{}", sweep::render(&rows));
    if let Some(path) = plot {
        let svg = sweep::plot(&rows)?;
        std::fs::write(&path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("plot: {}", path.display());
    }
    write_json(json, &rows)
}

/// What `replay --sweep --lower-pages` runs.
struct HierarchySweep {
    policies: Vec<tier_mem::PolicyKind>,
    capacities: Vec<usize>,
    lower_pages: usize,
    admit_after: Vec<u32>,
}

async fn run_hierarchy_sweep(
    requests: &[trace::Request],
    page_bytes: usize,
    mut sweep: HierarchySweep,
    json: Option<PathBuf>,
) -> Result<(), String> {
    use sweep::hierarchy::{Lower, Shape};
    if sweep.policies.is_empty() {
        // TinyLFU is moka's, for DRAM tiers only.
        sweep.policies = tier_mem::PolicyKind::ALL
            .into_iter()
            .filter(|p| *p != tier_mem::PolicyKind::Tinylfu)
            .collect();
    }
    if sweep.capacities.is_empty() {
        sweep.capacities = vec![1000];
    }
    if let Some(zero) = sweep.admit_after.iter().find(|a| **a == 0) {
        return Err(format!(
            "--admit-after {zero}: a key is requested at least once"
        ));
    }
    if sweep.lower_pages == 0 || sweep.capacities.contains(&0) {
        return Err("--lower-pages and --capacities: each must be at least 1 page".into());
    }
    let lower = match tier_nixl::runtime::load(None) {
        Ok(_) => Lower::NixlFile,
        Err(e) => {
            eprintln!(
                "notice: NIXL runtime not found ({e}); the lower tier is an object_store folder"
            );
            Lower::LocalObject
        }
    };
    let writes = [
        tier_hierarchy::WritePolicy::WriteThrough,
        tier_hierarchy::WritePolicy::WriteBack,
    ];
    let terminal = std::io::stderr().is_terminal();
    let mut all = Vec::new();
    for &top_pages in &sweep.capacities {
        let shape = Shape {
            top_pages,
            lower_pages: sweep.lower_pages,
            page_bytes,
            lower,
        };
        let cells = sweep::hierarchy::sweep(
            &registry(),
            requests,
            shape,
            &sweep.policies,
            &writes,
            &sweep.admit_after,
            |done, total| {
                if terminal {
                    eprint!("\rsweep: {done}/{total} cells");
                    if done == total {
                        eprintln!();
                    }
                }
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        print!("{}", sweep::hierarchy::render(shape, &cells));
        all.extend(cells);
    }
    write_json(json, &all)
}

async fn replay_with_progress(
    hierarchy: &Hierarchy,
    requests: &[trace::Request],
    page_bytes: usize,
) -> Result<replay::Report, TierError> {
    let terminal = std::io::stderr().is_terminal();
    let total = requests.len();
    let report = replay::replay(hierarchy, requests, page_bytes, |done| {
        if terminal && (done % 50 == 0 || done == total) {
            let filled = done * 40 / total.max(1);
            eprint!(
                "\r[{}{}] {done}/{total}",
                "#".repeat(filled),
                " ".repeat(40 - filled)
            );
            if done == total {
                eprintln!();
            }
        }
    })
    .await?;
    Ok(report)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_json);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kvtier: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvtier: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr at the level `RUST_LOG` names (default: warnings and errors, what a user must
/// act on), as text or as JSON lines.
fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// Largest page the replay takes (no tier stores a bigger one).
const MAX_PAGE_BYTES: usize = 1 << 30;

/// Refuses a replay whose buffers cannot fit: the longest request holds a read buffer and a
/// page for each of its blocks; together they must fit in half the machine's memory.
fn check_replay_memory(
    requests: &[trace::Request],
    page_bytes: usize,
    memory: Option<u64>,
) -> Result<(), String> {
    if page_bytes > MAX_PAGE_BYTES {
        return Err(format!(
            "--page-bytes {page_bytes} is over the {MAX_PAGE_BYTES}-byte (1 GiB) page limit"
        ));
    }
    let blocks = requests.iter().map(|r| r.hash_ids.len()).max().unwrap_or(0) as u64;
    let need = blocks.saturating_mul(page_bytes as u64).saturating_mul(2);
    match memory {
        Some(total) if need > total / 2 => Err(format!(
            "--page-bytes {page_bytes}: the longest request ({blocks} blocks) needs {:.1} GiB of \
             buffers, over half of this machine's {:.1} GiB of memory",
            need as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64
        )),
        _ => Ok(()),
    }
}

/// Physical memory in bytes (`MemTotal` of /proc/meminfo), if readable.
fn machine_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod config_property;

#[cfg(test)]
mod tests {
    use super::*;

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
        let bad =
            HierarchyConfig::from_toml("[[tiers]]\nkind = \"nixl-file\"\ndirs = []\n").unwrap();
        let err = registry().plan(&bad).err().unwrap().to_string();
        assert!(err.contains("tiers[0].dirs"), "{err}");
        let bad = HierarchyConfig::from_toml("[[tiers]]\nkind = \"nixl-file\"\ndirz = [\"/x\"]\n")
            .unwrap();
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
            ("[[tiers]]\nkind = \"object\"\nstore = \"s3\"\nprefix = \"p\"\nbucket = \"b\"\n".into(), "access_key"),
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
}
