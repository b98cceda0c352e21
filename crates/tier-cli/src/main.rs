//! `kvtier`: replay real request traces through a tier hierarchy, probe NIXL, check configs.

mod bench;
mod commands;
mod nodes;
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
use tier_hierarchy::config::{HierarchyConfig, Registry, TimeSpan};
use tier_hierarchy::serve_metrics;

use commands::{
    check_replay_memory, machine_memory, replay_with_progress, run_bench, run_hierarchy_sweep,
    run_sweep, write_json, HierarchySweep,
};

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
        /// `--admit-after`. With `--nodes`: the lower tier's pages in all (default 8000).
        #[arg(long)]
        lower_pages: Option<usize>,
        /// Deal the trace to this many instances, each a process with its own DRAM tier, run at
        /// once over one shared NIXL FILE folder and again over private folders of the same
        /// total size (ignores --config): what sharing a lower tier gains.
        #[arg(long, conflicts_with_all = ["sweep", "config"])]
        nodes: Option<usize>,
        /// How `--nodes` deals requests.
        #[arg(long, value_enum, default_value = "round-robin", requires = "nodes")]
        route: nodes::Route,
        /// DRAM pages of each `--nodes` instance.
        #[arg(long, default_value_t = 1000, requires = "nodes")]
        top_pages: usize,
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
        /// Tokens per block of the trace (Mooncake's hash ids: 512), for the prefill saved.
        #[arg(long, default_value_t = 512)]
        block_tokens: u64,
        /// Prefill throughput of the model on its GPU, tokens per second, for the prefill
        /// saved (default: 10,000, a mid-size model on one datacenter GPU; state yours).
        #[arg(long, default_value_t = 10_000.0)]
        prefill_tokens_per_sec: f64,
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
    /// Is the NIXL runtime there, which plugins, and does it have path mode? Given a folder:
    /// what its filesystem gives a FILE tier (locks, extended attributes, O_DIRECT, links).
    Probe {
        /// A folder to probe (it must exist and be writable; the probe leaves nothing).
        dir: Option<PathBuf>,
        /// The same folder through another mount (another client): tries whether a lock taken
        /// through one excludes through the other.
        #[arg(long, requires = "dir")]
        other: Option<PathBuf>,
        /// How long the folder's mount may take to answer (a hung mount fails the probe by
        /// then, naming the folder).
        #[arg(long, default_value = "10s", value_parser = TimeSpan::parse, requires = "dir")]
        timeout: TimeSpan,
    },
    /// Validate a config and print the resolved hierarchy (opens nothing).
    Check {
        /// The config file.
        config: PathBuf,
    },
    /// Move the pages of each object tier's prefix that an earlier kvtier stored in the flat
    /// layout (directly under the prefix) into the prefix's buckets. Run it while no node
    /// uses the prefixes.
    MoveFlat {
        /// The config file naming the object tiers.
        config: PathBuf,
    },
    /// Derive a tenant's own integrity secret from an operator's master secret: hand each
    /// tenant its own (as its tiers' `integrity` key file), never the master, and no tenant
    /// can forge, probe or name another's pages.
    TenantKey {
        /// The master secret's file (this user's, mode 600).
        #[arg(long)]
        secret_file: PathBuf,
        /// The tenant's name.
        #[arg(long)]
        tenant: String,
        /// Write it to this new file (mode 600) instead of printing it.
        #[arg(long)]
        out: Option<PathBuf>,
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
        nodes: None,
        route: nodes::Route::RoundRobin,
        top_pages: 1000,
        admit_after: vec![1, 2],
        json: None,
        metrics_addr: None,
        block_tokens: 512,
        prefill_tokens_per_sec: 10_000.0,
    });
    match command {
        Command::Probe {
            dir: Some(dir),
            other,
            timeout,
        } => {
            let p = commands::probe_folder_within(dir, other, timeout.0)?;
            print!("{}", commands::describe_folder(&p));
            Ok(())
        }
        Command::Probe { dir: None, .. } => {
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
            for (i, name, warning) in Registry::unsealed_shared(&config, &plans) {
                println!("WARNING: tier {i} ({name}): {warning}");
            }
            for (i, (name, plan)) in plans.iter().enumerate() {
                if let Some(advice) = plan.advice() {
                    println!("NOTE: tier {i} ({name}): {advice}");
                }
            }
            Ok(())
        }
        Command::MoveFlat { config } => {
            let config = HierarchyConfig::from_file(&config).map_err(|e| e.to_string())?;
            commands::move_flat(&config).await
        }
        Command::TenantKey {
            secret_file,
            tenant,
            out,
        } => commands::tenant_key(&secret_file, &tenant, out.as_deref()),
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
            nodes,
            route,
            top_pages,
            block_tokens,
            prefill_tokens_per_sec,
        } => {
            if !(prefill_tokens_per_sec.is_finite() && prefill_tokens_per_sec > 0.0) {
                return Err("--prefill-tokens-per-sec must be a positive number".into());
            }
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
            if let Some(nodes) = nodes {
                let fleet = nodes::Fleet {
                    nodes,
                    route,
                    top_pages,
                    lower_pages: lower_pages.unwrap_or(8000),
                    page_bytes,
                };
                let report = tokio::task::block_in_place(|| nodes::run(&requests, fleet))?;
                return write_json(json, &report);
            }
            if lower_pages.is_some() && !sweep {
                return Err("--lower-pages goes with --sweep or --nodes".into());
            }
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
                    replay::top_policy(&config),
                    replay::Prefill {
                        block_tokens,
                        tokens_per_sec: prefill_tokens_per_sec,
                    },
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

#[cfg(test)]
mod config_property;

#[cfg(test)]
mod tests;
