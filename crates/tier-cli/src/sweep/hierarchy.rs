//! `kvtier replay --sweep --lower-pages N`: a DRAM tier over a bounded lower tier, the lower
//! tier's policy x the hierarchy's write mode x `admit_after`, each cell a real replay that
//! reports the hierarchy's prefix reuse and what it wrote to the lower tier (its wear).

use std::path::Path;

use serde::Serialize;
use tier_core::TierError;
use tier_hierarchy::config::{HierarchyConfig, Registry};
use tier_hierarchy::WritePolicy;
use tier_mem::PolicyKind;

use crate::replay;
use crate::trace::Request;

/// The lower tier of each cell: a NIXL FILE folder, or an object_store folder where the NIXL
/// runtime is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Lower {
    /// `nixl-file`.
    NixlFile,
    /// `object` with `store = "local"`.
    LocalObject,
}

/// The shape every cell shares.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Pages the DRAM tier holds (its policy is the default).
    pub top_pages: usize,
    /// Pages the lower tier holds.
    pub lower_pages: usize,
    /// Bytes per page.
    pub page_bytes: usize,
    /// The lower tier's kind.
    pub lower: Lower,
}

/// One cell.
#[derive(Debug, Serialize)]
pub struct Cell {
    /// The lower tier's policy.
    pub policy: String,
    /// `write-through` or `write-back`.
    pub write: String,
    /// Requests of a key before its page is written below.
    pub admit_after: u32,
    /// Prefix reuse of the hierarchy, percent of requested blocks.
    pub reuse: f64,
    /// Of which the lower tier served (percent of requested blocks).
    pub lower_served: f64,
    /// Pages written to the lower tier.
    pub pages_written: u64,
    /// Bytes written to the lower tier.
    pub bytes_written: u64,
}

fn write_name(write: WritePolicy) -> &'static str {
    match write {
        WritePolicy::WriteThrough => "write-through",
        WritePolicy::WriteBack => "write-back",
    }
}

/// The config of one cell, its lower tier in `dir`.
fn config(
    shape: Shape,
    policy: PolicyKind,
    write: WritePolicy,
    admit_after: u32,
    dir: &Path,
) -> Result<HierarchyConfig, TierError> {
    // A DRAM page weighs its key and its bytes; a lower tier's page its bytes.
    let entry = (replay::key(0).len() + shape.page_bytes) as u64;
    let top = shape.top_pages as u64 * entry;
    let lower = shape.lower_pages as u64 * shape.page_bytes as u64;
    let dir = dir.display().to_string();
    let lower = match shape.lower {
        Lower::NixlFile => format!(
            "kind = \"nixl-file\"\nname = \"disk\"\ndirs = [{dir:?}]\ncapacity = {lower}\npolicy = \"{policy}\"\n"
        ),
        Lower::LocalObject => format!(
            "kind = \"object\"\nname = \"objects\"\nstore = \"local\"\nprefix = \"sweep\"\ndir = {dir:?}\ncapacity = {lower}\npolicy = \"{policy}\"\n"
        ),
    };
    HierarchyConfig::from_toml(&format!(
        "[hierarchy]\nwrite = \"{}\"\nadmit_after = {admit_after}\n\n[[tiers]]\nkind = \"mem\"\nname = \"dram\"\ncapacity = {top}\n\n[[tiers]]\n{lower}",
        write_name(write)
    ))
}

/// Replays `trace` once per lower policy x write mode x `admit_after`, each on a fresh
/// hierarchy of `shape` in a folder of its own.
pub async fn sweep(
    registry: &Registry,
    trace: &[Request],
    shape: Shape,
    policies: &[PolicyKind],
    writes: &[WritePolicy],
    admit_afters: &[u32],
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<Cell>, TierError> {
    let total = policies.len() * writes.len() * admit_afters.len();
    let mut cells = Vec::with_capacity(total);
    for &write in writes {
        for &admit_after in admit_afters {
            for &policy in policies {
                let dir = tempfile::tempdir().map_err(|e| {
                    TierError::Unavailable(format!("cannot make a temp folder: {e}"))
                })?;
                let config = config(shape, policy, write, admit_after, dir.path())?;
                let hierarchy = registry.build(&config).await?;
                let report = replay::replay(&hierarchy, trace, shape.page_bytes, |_| {}).await?;
                hierarchy.flush().await?;
                let stats = hierarchy.hierarchy_stats();
                hierarchy.close().await?;
                let name = format!("{policy} {} admit_after {admit_after}", write_name(write));
                if report.corrupt > 0 || report.errors > 0 {
                    return Err(TierError::Unavailable(format!(
                        "{name}: {} corrupt pages, {} errors",
                        report.corrupt, report.errors
                    )));
                }
                let lower = stats.levels.last().ok_or_else(|| {
                    TierError::Unavailable(format!("{name}: the hierarchy has no levels"))
                })?;
                let requested = report.ratio.requested.max(1) as f64;
                cells.push(Cell {
                    policy: policy.to_string(),
                    write: write_name(write).into(),
                    admit_after,
                    reuse: 100.0 * report.ratio.value(),
                    lower_served: 100.0 * lower.served as f64 / requested,
                    pages_written: lower.stats.puts,
                    bytes_written: lower.stats.bytes_written,
                });
                progress(cells.len(), total);
            }
        }
    }
    Ok(cells)
}

/// The cells as a table, the best reuse marked and, among cells within 0.1 points of it, the
/// one that wrote the least.
pub fn render(shape: Shape, cells: &[Cell]) -> String {
    let best = cells.iter().map(|c| c.reuse).fold(f64::MIN, f64::max);
    let frugal = cells
        .iter()
        .filter(|c| c.reuse >= best - 0.1)
        .min_by_key(|c| c.bytes_written);
    let mut out = format!(
        "prefix reuse of DRAM ({} pages) over {} ({} pages), % of requested blocks, and what the lower tier wrote\n",
        shape.top_pages,
        match shape.lower {
            Lower::NixlFile => "NIXL FILE",
            Lower::LocalObject => "object_store (local folder)",
        },
        shape.lower_pages
    );
    out += &format!(
        "{:<8} {:<14} {:>11} {:>8} {:>12} {:>13} {:>12}\n",
        "policy", "write", "admit_after", "reuse", "lower served", "pages written", "MiB written"
    );
    for c in cells {
        let mark = match frugal {
            Some(f) if std::ptr::eq(f, c) => "+",
            _ if c.reuse == best => "*",
            _ => " ",
        };
        out += &format!(
            "{:<8} {:<14} {:>11} {:>7.2}{mark} {:>12.2} {:>13} {:>12.1}\n",
            c.policy,
            c.write,
            c.admit_after,
            c.reuse,
            c.lower_served,
            c.pages_written,
            c.bytes_written as f64 / (1 << 20) as f64
        );
    }
    out += "* most reuse. + least written among cells within 0.1 points of the most reuse.\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace;

    /// Every cell serves from the lower tier and counts what it wrote there, and admission
    /// moves the wear: `admit_after = 2` writes fewer pages below than 1 in both write modes.
    /// On both lower kinds, real tiers in a temp folder.
    async fn admission_and_write_mode_move_the_wear(lower: Lower) {
        let trace = trace::generated(600);
        let shape = Shape {
            top_pages: 30,
            lower_pages: 200,
            page_bytes: 64,
            lower,
        };
        let writes = [WritePolicy::WriteThrough, WritePolicy::WriteBack];
        let policies = [PolicyKind::Lru, PolicyKind::default()];
        let cells = sweep(
            &tier_builtin::registry(),
            &trace,
            shape,
            &policies,
            &writes,
            &[1, 2],
            |_, _| {},
        )
        .await
        .unwrap();
        assert_eq!(cells.len(), 8);
        let cell = |policy: PolicyKind, write: &str, admit_after: u32| {
            cells
                .iter()
                .find(|c| {
                    c.policy == policy.name() && c.write == write && c.admit_after == admit_after
                })
                .unwrap()
        };
        for c in &cells {
            assert!(c.lower_served > 0.0, "{c:?}");
            assert!(c.reuse > c.lower_served, "{c:?}");
            assert_eq!(c.bytes_written, c.pages_written * 64, "{c:?}");
        }
        for policy in policies {
            for write in ["write-through", "write-back"] {
                let (one, two) = (cell(policy, write, 1), cell(policy, write, 2));
                assert!(two.pages_written < one.pages_written, "{one:?} {two:?}");
            }
        }
        let text = render(shape, &cells);
        let marked = text
            .lines()
            .skip(2)
            .filter(|l| l.contains('+') && !l.starts_with('*'));
        assert_eq!(marked.count(), 1, "{text}");
    }

    #[tokio::test]
    async fn admission_and_write_mode_move_the_wear_on_nixl_file() {
        admission_and_write_mode_move_the_wear(Lower::NixlFile).await;
    }

    #[tokio::test]
    async fn admission_and_write_mode_move_the_wear_on_an_object_store() {
        admission_and_write_mode_move_the_wear(Lower::LocalObject).await;
    }
}
