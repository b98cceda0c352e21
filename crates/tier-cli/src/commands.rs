//! What the subcommands run: bench, the sweeps, a replay with its progress line, and the
//! checks before a replay.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tier_builtin::registry;
use tier_core::TierError;
use tier_hierarchy::config::HierarchyConfig;
use tier_hierarchy::Hierarchy;

use crate::{bench, replay, sweep, trace};
pub(crate) async fn run_bench(
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
    if let Some(fault) = &s.fault {
        let report = bench::fault::run(&registry(), &config, &s, fault).await?;
        print!("{}", bench::fault::render(&report, &s));
        return write_json(json, &report);
    }
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
pub(crate) fn write_json(
    path: Option<PathBuf>,
    value: &impl serde::Serialize,
) -> Result<(), String> {
    let Some(path) = path else {
        return Ok(());
    };
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("json: {}", path.display());
    Ok(())
}

pub(crate) async fn run_sweep(
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
pub(crate) struct HierarchySweep {
    pub(crate) policies: Vec<tier_mem::PolicyKind>,
    pub(crate) capacities: Vec<usize>,
    pub(crate) lower_pages: usize,
    pub(crate) admit_after: Vec<u32>,
}

pub(crate) async fn run_hierarchy_sweep(
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

pub(crate) async fn replay_with_progress(
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

/// Largest page the replay takes (no tier stores a bigger one).
pub(crate) const MAX_PAGE_BYTES: usize = 1 << 30;

/// Refuses a replay whose buffers cannot fit: the longest request holds a read buffer and a
/// page for each of its blocks; together they must fit in half the machine's memory.
pub(crate) fn check_replay_memory(
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
pub(crate) fn machine_memory() -> Option<u64> {
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

/// `kvtier move-flat`: moves each object tier's flat-layout pages into its buckets, saying
/// what it did per tier.
pub(crate) async fn move_flat(config: &HierarchyConfig) -> Result<(), String> {
    let prefixes = tier_builtin::object_prefixes(config).map_err(|e| e.to_string())?;
    if prefixes.is_empty() {
        return Err("the config has no object or nixl-obj tier".into());
    }
    for p in prefixes {
        let tier =
            tier_object::ObjectTier::open(p.store, tier_object::ObjectTierConfig::new(&p.prefix))
                .map_err(|e| format!("tier {}: {e}", p.tier))?;
        let done = tier
            .move_flat_layout()
            .await
            .map_err(|e| format!("tier {}: prefix {:?}: {e}", p.tier, p.prefix))?;
        println!(
            "tier {}: prefix {:?}: {} page(s) moved into buckets, {} flat page(s) removed that \
             their bucket already held",
            p.tier, p.prefix, done.moved, done.superseded
        );
    }
    Ok(())
}

/// Probes `dir` (and `other`, the same folder through another mount) on a thread of its own,
/// waiting at most `timeout`: a hung mount fails the probe, naming the folder, instead of
/// holding the command.
pub(crate) fn probe_folder_within(
    dir: PathBuf,
    other: Option<PathBuf>,
    timeout: Duration,
) -> Result<tier_nixl::FolderProbe, String> {
    let (done, probed) = std::sync::mpsc::channel();
    let folder = dir.display().to_string();
    std::thread::Builder::new()
        .name("kvtier-probe".into())
        .spawn(move || {
            let _ = done.send(tier_nixl::probe_folder(&dir, other.as_deref()));
        })
        .map_err(|e| format!("probing {folder}: starting the probe: {e}"))?;
    match probed.recv_timeout(timeout) {
        Ok(probe) => probe.map_err(|e| format!("probing {folder}: {e}")),
        Err(_) => Err(format!(
            "probing {folder}: its filesystem did not answer within {timeout:?} (a hung mount? \
             a network filesystem whose server is gone?); the probe's files may be left there \
             once it answers (--timeout sets the wait)"
        )),
    }
}

/// What `kvtier probe DIR` prints of a folder.
pub(crate) fn describe_folder(p: &tier_nixl::FolderProbe) -> String {
    use tier_nixl::LockReach;
    let yes = |b: bool| if b { "yes" } else { "no" };
    let locks = match &p.locks {
        LockReach::AcrossClients => "across clients (tried through the second mount)".to_string(),
        LockReach::LocalFilesystem => "across processes (a local filesystem: one machine)".into(),
        LockReach::ThisNodeOnly(why) => format!("this node only ({why})"),
        LockReach::LikelyAcrossClients(fs) => {
            format!("across clients as {fs} says (not tried: give --other MOUNT)")
        }
        LockReach::Unknown(why) => format!("unknown across clients ({why}; give --other MOUNT)"),
        LockReach::None(why) => {
            format!("none ({why}): access = \"shared\" needs locks = \"none\" here")
        }
    };
    format!(
        "folder: {}\nfilesystem: {} ({})\nlocal: {}\nlocks: {locks}\nextended attributes: {}\n\
         O_DIRECT: {}\nhard links: {}\nrename without replace: {}\n",
        p.dir.display(),
        p.filesystem,
        p.mount_options,
        yes(p.local),
        yes(p.xattrs),
        yes(p.direct_io),
        yes(p.hard_links),
        yes(p.rename_noreplace),
    )
}

/// `kvtier tenant-key`: `tenant`'s secret derived from the master secret in `secret_file`,
/// printed, or written to `out` (a new file of this user's, mode 600, never through a link).
pub(crate) fn tenant_key(
    secret_file: &Path,
    tenant: &str,
    out: Option<&Path>,
) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if tenant.is_empty() {
        return Err("--tenant must name a tenant".into());
    }
    let master = tier_hierarchy::sealed::IntegrityConfig {
        key_env: None,
        key_file: Some(secret_file.to_path_buf()),
    }
    .secret("--secret-file")
    .map_err(|e| e.to_string())?;
    let secret = tier_hierarchy::sealed::tenant_secret(&master, tenant);
    let Some(out) = out else {
        println!("{secret}");
        return Ok(());
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(out)
        .map_err(|e| {
            format!(
                "{}: cannot be made (a new file, mode 600): {e}",
                out.display()
            )
        })?;
    writeln!(file, "{secret}").map_err(|e| format!("{}: {e}", out.display()))?;
    file.sync_all()
        .map_err(|e| format!("{}: {e}", out.display()))
}
