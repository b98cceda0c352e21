//! `kvtier replay --nodes N`: the trace's requests dealt to N engine instances, each a
//! `kvtier replay` process of its own with its own DRAM tier, run at the same moment, twice:
//! once over one NIXL FILE folder they all share (`access = "shared"`, the folder's capacity
//! for all of them), once over private folders of the same total size (each a 1/N share).
//! What sharing gains is the difference in prefix reuse.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde::Serialize;

use crate::trace::Request;

/// How requests are dealt to instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Route {
    /// Request i to instance i mod N.
    RoundRobin,
    /// By a stable hash of the request's first block (a router that keeps a system prompt on
    /// one instance).
    FirstBlock,
}

/// The fleet a `--nodes` replay simulates.
#[derive(Debug, Clone, Copy)]
pub struct Fleet {
    /// Instances.
    pub nodes: usize,
    /// How requests are dealt.
    pub route: Route,
    /// DRAM pages of each instance.
    pub top_pages: usize,
    /// Lower-tier pages in all: one shared folder of this size, or N private ones of 1/N each.
    pub lower_pages: usize,
    /// Bytes per page.
    pub page_bytes: usize,
}

/// One instance's reuse in both runs.
#[derive(Debug, Serialize)]
pub struct Instance {
    pub requests: usize,
    pub blocks_requested: u64,
    pub private_reused: u64,
    pub shared_reused: u64,
    /// Of the shared run's reused blocks, those another instance stored.
    pub shared_reused_from_others: u64,
}

/// The report, for `--json`.
#[derive(Debug, Serialize)]
pub struct NodesReport {
    pub nodes: usize,
    pub route: Route,
    pub top_pages: usize,
    pub lower_pages: usize,
    pub page_bytes: usize,
    pub instances: Vec<Instance>,
    /// Prefix reuse over all instances, percent of requested blocks.
    pub private_reuse: f64,
    pub shared_reuse: f64,
    /// Shared reuse over private reuse.
    pub gain: f64,
    /// Of the blocks the shared run reused, the percentage another instance stored.
    pub shared_from_others: f64,
}

/// Deals `requests` to `nodes` instances by `route`.
pub fn deal(requests: &[Request], nodes: usize, route: Route) -> Vec<Vec<Request>> {
    let mut parts = vec![Vec::new(); nodes];
    for (i, request) in requests.iter().enumerate() {
        let node = match route {
            Route::RoundRobin => i % nodes,
            Route::FirstBlock => {
                let first = request.hash_ids.first().copied().unwrap_or(0);
                (mix(first) % nodes as u64) as usize
            }
        };
        parts[node].push(request.clone());
    }
    parts
}

/// splitmix64's finaliser: a stable hash of a block id.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The config of instance `node`: DRAM over the shared folder, or over its private one.
fn config(fleet: &Fleet, root: &Path, node: usize, shared: bool) -> String {
    let dram = fleet.top_pages * fleet.page_bytes;
    let lower = if shared {
        format!(
            "dirs = [{:?}]\naccess = \"shared\"\ncapacity = {}\n# hits refresh their pages' use time (at most every ms): LRU across the instances\ntouch_interval = \"1ms\"\n",
            root.join("shared").display().to_string(),
            // A shared folder counts its files' bytes (page and trailer), an owner its pages':
            // both hold `lower_pages` pages.
            fleet.lower_pages as u64 * (fleet.page_bytes as u64 + tier_nixl::PAGE_TRAILER)
        )
    } else {
        format!(
            "dirs = [{:?}]\ncapacity = {}\npolicy = \"lru\"\n",
            root.join(format!("private{node}")).display().to_string(),
            fleet.lower_pages / fleet.nodes * fleet.page_bytes
        )
    };
    format!(
        "[[tiers]]\nkind = \"mem\"\nname = \"dram\"\ncapacity = {dram}\n\n[[tiers]]\nkind = \"nixl-file\"\nname = \"disk\"\n{lower}"
    )
}

fn write_trace(path: &Path, requests: &[Request]) -> Result<(), String> {
    let mut text = String::new();
    for r in requests {
        let line = serde_json::json!({ "hash_ids": r.hash_ids });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// What one instance's replay reported.
#[derive(Debug, Default, Clone, Copy)]
struct Reuse {
    requested: u64,
    reused: u64,
    /// Reused blocks it never stored itself.
    from_others: u64,
}

/// Runs every instance's replay at once, each in a process of its own; returns what each
/// one reported.
fn run_instances(
    fleet: &Fleet,
    root: &Path,
    parts: &[PathBuf],
    shared: bool,
) -> Result<Vec<Reuse>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find kvtier itself: {e}"))?;
    let label = if shared { "shared" } else { "private" };
    let mut children = Vec::new();
    for (node, part) in parts.iter().enumerate() {
        if std::fs::metadata(part).map_or(true, |m| m.len() == 0) {
            children.push(None);
            continue;
        }
        let config_path = root.join(format!("{label}{node}.toml"));
        std::fs::write(&config_path, config(fleet, root, node, shared))
            .map_err(|e| format!("cannot write {}: {e}", config_path.display()))?;
        let json = root.join(format!("{label}{node}.json"));
        let child = Command::new(&exe)
            .arg("replay")
            .arg("--config")
            .arg(&config_path)
            .arg("--trace")
            .arg(part)
            .arg("--page-bytes")
            .arg(fleet.page_bytes.to_string())
            .arg("--json")
            .arg(&json)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start instance {node}: {e}"))?;
        children.push(Some((child, json)));
    }
    let mut out = Vec::new();
    for (node, running) in children.into_iter().enumerate() {
        let Some((child, json)) = running else {
            out.push(Reuse::default());
            continue;
        };
        let done = child
            .wait_with_output()
            .map_err(|e| format!("instance {node} ({label}): {e}"))?;
        if !done.status.success() {
            return Err(format!(
                "instance {node} ({label}) failed ({}): {}",
                done.status,
                String::from_utf8_lossy(&done.stderr).trim()
            ));
        }
        let text = std::fs::read_to_string(&json)
            .map_err(|e| format!("instance {node} ({label}) wrote no report: {e}"))?;
        let summary: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| format!("instance {node} ({label}): unreadable report: {e}"))?;
        let field = |name: &str| summary[name].as_u64().unwrap_or(0);
        if field("corrupt") > 0 || field("errors") > 0 {
            return Err(format!(
                "instance {node} ({label}): {} corrupt pages, {} errors",
                field("corrupt"),
                field("errors")
            ));
        }
        out.push(Reuse {
            requested: field("blocks_requested"),
            reused: field("blocks_reused"),
            from_others: field("blocks_reused_from_others"),
        });
    }
    Ok(out)
}

/// Replays `requests` on the fleet, shared and private; prints the table.
pub fn run(requests: &[Request], fleet: Fleet) -> Result<NodesReport, String> {
    if fleet.nodes < 2 {
        return Err("--nodes needs at least 2 instances".into());
    }
    if fleet.lower_pages < fleet.nodes {
        return Err(format!(
            "--lower-pages {} cannot be shared out to {} instances",
            fleet.lower_pages, fleet.nodes
        ));
    }
    tier_nixl::runtime::load(None)
        .map_err(|e| format!("--nodes replays over NIXL FILE folders: {e}"))?;
    let tmp = tempfile::tempdir().map_err(|e| format!("cannot make a temp folder: {e}"))?;
    let root = tmp.path();
    let parts = deal(requests, fleet.nodes, fleet.route);
    let paths: Vec<PathBuf> = (0..fleet.nodes)
        .map(|n| root.join(format!("part{n}.jsonl")))
        .collect();
    for (part, path) in parts.iter().zip(&paths) {
        write_trace(path, part)?;
    }
    if parts.iter().any(Vec::is_empty) {
        eprintln!(
            "note: the route left some instances without requests (their private lower tiers \
             sit idle, as a router that sends every request of one prefix to one instance makes them)"
        );
    }
    let started = Instant::now();
    let private = run_instances(&fleet, root, &paths, false)?;
    let private_secs = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let shared = run_instances(&fleet, root, &paths, true)?;
    let shared_secs = started.elapsed().as_secs_f64();

    let instances: Vec<Instance> = parts
        .iter()
        .zip(private.iter().zip(&shared))
        .map(|(part, (p, s))| Instance {
            requests: part.len(),
            blocks_requested: p.requested,
            private_reused: p.reused,
            shared_reused: s.reused,
            shared_reused_from_others: s.from_others,
        })
        .collect();
    let private_from_others: u64 = private.iter().map(|p| p.from_others).sum();
    if private_from_others > 0 {
        return Err(format!(
            "instances over private folders reused {private_from_others} blocks they never stored"
        ));
    }
    let requested: u64 = instances.iter().map(|i| i.blocks_requested).sum();
    let pct = |reused: u64| 100.0 * reused as f64 / requested.max(1) as f64;
    let private_reuse = pct(instances.iter().map(|i| i.private_reused).sum());
    let shared_reused: u64 = instances.iter().map(|i| i.shared_reused).sum();
    let shared_reuse = pct(shared_reused);
    let from_others: u64 = instances.iter().map(|i| i.shared_reused_from_others).sum();
    let report = NodesReport {
        nodes: fleet.nodes,
        route: fleet.route,
        top_pages: fleet.top_pages,
        lower_pages: fleet.lower_pages,
        page_bytes: fleet.page_bytes,
        gain: shared_reuse / private_reuse.max(f64::MIN_POSITIVE),
        instances,
        private_reuse,
        shared_reuse,
        shared_from_others: 100.0 * from_others as f64 / shared_reused.max(1) as f64,
    };
    print!("{}", render(&report, private_secs, shared_secs));
    Ok(report)
}

fn render(r: &NodesReport, private_secs: f64, shared_secs: f64) -> String {
    let route = match r.route {
        Route::RoundRobin => "round robin",
        Route::FirstBlock => "by first block",
    };
    let mut out = format!(
        "{} instances (requests dealt {route}), each a process with {} DRAM pages, over {} NIXL FILE pages in all ({} B pages)\n\n",
        r.nodes, r.top_pages, r.lower_pages, r.page_bytes
    );
    out.push_str(&format!(
        "{:>8} {:>9} {:>10} {:>14} {:>13} {:>16}\n",
        "instance", "requests", "blocks", "private reuse", "shared reuse", "of it, others'"
    ));
    for (n, i) in r.instances.iter().enumerate() {
        let pct = |x: u64| 100.0 * x as f64 / i.blocks_requested.max(1) as f64;
        let others = 100.0 * i.shared_reused_from_others as f64 / i.shared_reused.max(1) as f64;
        out.push_str(&format!(
            "{n:>8} {:>9} {:>10} {:>13.2}% {:>12.2}% {others:>15.2}%\n",
            i.requests,
            i.blocks_requested,
            pct(i.private_reused),
            pct(i.shared_reused)
        ));
    }
    out.push_str(&format!(
        "{:>8} {:>9} {:>10} {:>13.2}% {:>12.2}% {:>15.2}%\n\nsharing one lower tier reuses {:.2}x the blocks of private lower tiers of the same total size \
         (private run {private_secs:.1} s, shared run {shared_secs:.1} s); {:.2}% of the blocks the shared run reused were stored by another instance\n",
        "all",
        r.instances.iter().map(|i| i.requests).sum::<usize>(),
        r.instances.iter().map(|i| i.blocks_requested).sum::<u64>(),
        r.private_reuse,
        r.shared_reuse,
        r.shared_from_others,
        r.gain,
        r.shared_from_others
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(ids: &[u64]) -> Request {
        Request {
            hash_ids: ids.to_vec(),
        }
    }

    #[test]
    fn dealing_keeps_every_request_once_and_first_block_keeps_a_prefix_on_one_instance() {
        let requests: Vec<Request> = (0..100u64).map(|i| request(&[i % 7, 100 + i])).collect();
        for route in [Route::RoundRobin, Route::FirstBlock] {
            let parts = deal(&requests, 4, route);
            assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), 100, "{route:?}");
        }
        let rr = deal(&requests, 4, Route::RoundRobin);
        assert!(rr.iter().all(|p| p.len() == 25));
        let by_first = deal(&requests, 4, Route::FirstBlock);
        for first in 0..7u64 {
            let holders = by_first
                .iter()
                .filter(|p| p.iter().any(|r| r.hash_ids[0] == first))
                .count();
            assert_eq!(
                holders, 1,
                "block {first} starts requests on one instance only"
            );
        }
    }
}
