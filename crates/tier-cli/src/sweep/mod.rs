//! `kvtier replay --sweep`: eviction policies x capacities on one trace, each cell the prefix
//! reuse of the real DRAM tier under that policy (not a simulation of it), beside the offline
//! references at each capacity.

pub mod hierarchy;

use serde::Serialize;
use tier_core::TierError;
use tier_hierarchy::config::{HierarchyConfig, Registry};
use tier_mem::PolicyKind;

use crate::replay;
use crate::sim;
use crate::trace::Request;

/// One capacity's row.
#[derive(Debug, Serialize)]
pub struct Row {
    /// Capacity in pages.
    pub pages: usize,
    /// Prefix reuse (percent of requested blocks) per policy, in the sweep's policy order.
    pub policies: Vec<(String, f64)>,
    /// An LRU simulation at this capacity.
    pub lru_simulated: f64,
    /// Belady's block-hit ratio at this capacity: no policy's prefix reuse exceeds it.
    pub belady_block_bound: f64,
    /// An unbounded cache.
    pub unbounded: f64,
}

/// Replays `trace` on one DRAM tier of each capacity under each policy.
pub async fn sweep(
    registry: &Registry,
    trace: &[Request],
    page_bytes: usize,
    policies: &[PolicyKind],
    capacities: &[usize],
    mut progress: impl FnMut(usize, usize),
) -> Result<Vec<Row>, TierError> {
    let unbounded = 100.0 * sim::unbounded(trace).value();
    // A page weighs its key and its bytes in a DRAM tier.
    let entry = (replay::key(0).len() + page_bytes) as u64;
    let total = policies.len() * capacities.len();
    let mut rows = Vec::new();
    for &pages in capacities {
        let mut cells = Vec::new();
        for &policy in policies {
            let text = format!(
                "[[tiers]]\nkind = \"mem\"\nname = \"dram\"\ncapacity = {}\npolicy = \"{policy}\"\n",
                pages as u64 * entry
            );
            let config = HierarchyConfig::from_toml(&text)?;
            let hierarchy = registry.build(&config).await?;
            let report = replay::replay(&hierarchy, trace, page_bytes, |_| {}).await?;
            hierarchy.close().await?;
            if report.corrupt > 0 || report.errors > 0 {
                return Err(TierError::Unavailable(format!(
                    "policy {policy} at {pages} pages: {} corrupt pages, {} errors",
                    report.corrupt, report.errors
                )));
            }
            cells.push((policy.to_string(), 100.0 * report.ratio.value()));
            progress(rows.len() * policies.len() + cells.len(), total);
        }
        rows.push(Row {
            pages,
            policies: cells,
            lru_simulated: 100.0 * sim::lru(trace, pages).value(),
            belady_block_bound: 100.0 * sim::belady_blocks(trace, pages).value(),
            unbounded,
        });
    }
    Ok(rows)
}

/// Capacities covering a trace: 2.5% to 40% of its distinct blocks.
pub fn default_capacities(trace: &[Request]) -> Vec<usize> {
    let distinct: std::collections::HashSet<u64> = trace
        .iter()
        .flat_map(|r| r.hash_ids.iter().copied())
        .collect();
    [40, 20, 10, 5]
        .iter()
        .map(|d| (distinct.len() / d).max(1))
        .chain(std::iter::once((distinct.len() * 2 / 5).max(1)))
        .collect()
}

/// The sweep as a table: prefix reuse in percent of requested blocks.
pub fn render(rows: &[Row]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let mut out = String::from("prefix reuse, % of requested blocks (real DRAM tier per policy)\n");
    out += &format!("{:>8}", "pages");
    for (name, _) in &first.policies {
        out += &format!(" {name:>8}");
    }
    out += &format!(
        " | {:>8} {:>13} {:>9}\n",
        "LRU sim", "Belady bound", "unbounded"
    );
    for row in rows {
        out += &format!("{:>8}", row.pages);
        let best = row
            .policies
            .iter()
            .map(|(_, v)| *v)
            .fold(f64::MIN, f64::max);
        for (_, v) in &row.policies {
            let mark = if *v == best { "*" } else { " " };
            out += &format!(" {v:>7.2}{mark}");
        }
        out += &format!(
            " | {:>8.2} {:>13.2} {:>9.2}\n",
            row.lru_simulated, row.belady_block_bound, row.unbounded
        );
    }
    out += "* best policy at that size. Belady bound: Belady's block-hit ratio, which no policy's prefix reuse can exceed.\n";
    out
}

/// A reference curve: its label, its value in a row, its colour.
type Reference = (&'static str, fn(&Row) -> f64, plotters::style::RGBColor);

/// The sweep as an SVG picture: prefix reuse over capacity, a line per policy, with the LRU
/// simulation, Belady's block-hit bound and the unbounded cache as references.
pub fn plot(rows: &[Row]) -> Result<String, String> {
    use plotters::prelude::*;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let max_pages = rows.iter().map(|r| r.pages).max().unwrap_or(1) as f64;
        let top = rows
            .iter()
            .map(|r| r.belady_block_bound.max(r.unbounded))
            .fold(0.0, f64::max)
            .max(1.0);
        let mut chart = ChartBuilder::on(&root)
            .caption("prefix reuse by policy and capacity", ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..max_pages * 1.05, 0.0..top * 1.1)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("capacity, pages")
            .y_desc("% of requested blocks reused")
            .draw()
            .map_err(|e| e.to_string())?;
        let names: Vec<String> = rows
            .first()
            .map(|r| r.policies.iter().map(|(n, _)| n.clone()).collect())
            .unwrap_or_default();
        let line = |pick: &dyn Fn(&Row) -> f64| -> Vec<(f64, f64)> {
            rows.iter().map(|r| (r.pages as f64, pick(r))).collect()
        };
        for (i, name) in names.iter().enumerate() {
            // Past the palette's reds, which the references use.
            let color = Palette99::pick(i + 2).to_rgba();
            chart
                .draw_series(LineSeries::new(
                    line(&|r: &Row| r.policies[i].1),
                    color.stroke_width(2),
                ))
                .map_err(|e| e.to_string())?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        let references: [Reference; 3] = [
            ("LRU simulated", |r| r.lru_simulated, BLACK),
            ("Belady block-hit bound", |r| r.belady_block_bound, RED),
            ("unbounded", |r| r.unbounded, RGBColor(120, 120, 120)),
        ];
        for (label, pick, color) in references {
            chart
                .draw_series(LineSeries::new(line(&pick), color.stroke_width(1)))
                .map_err(|e| e.to_string())?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace;

    fn registry() -> Registry {
        tier_builtin::registry()
    }

    /// The real LRU tier and the LRU simulation agree exactly, at every capacity; every
    /// policy stays under Belady's bound.
    #[tokio::test]
    async fn the_real_lru_tier_agrees_with_the_simulation() {
        let trace = trace::generated(600);
        let capacities = default_capacities(&trace);
        let rows = sweep(
            &registry(),
            &trace,
            64,
            &PolicyKind::ALL,
            &capacities,
            |_, _| {},
        )
        .await
        .unwrap();
        for row in &rows {
            let of = |name: &str| row.policies.iter().find(|(n, _)| n == name).unwrap().1;
            assert_eq!(of("lru"), row.lru_simulated, "{} pages", row.pages);
            for (name, v) in &row.policies {
                assert!(
                    *v <= row.belady_block_bound,
                    "{name} at {} pages",
                    row.pages
                );
            }
        }
    }

    /// The default policy reuses at least what LRU does at every size of the built-in
    /// workload's sweep (the workload `replay` runs with no trace).
    #[tokio::test]
    async fn the_default_policy_is_never_below_lru() {
        let trace = trace::generated(3000);
        let capacities = default_capacities(&trace);
        let kinds = [PolicyKind::Lru, PolicyKind::default()];
        let rows = sweep(&registry(), &trace, 64, &kinds, &capacities, |_, _| {})
            .await
            .unwrap();
        for row in &rows {
            let [(_, lru), (_, default)] = &row.policies[..] else {
                panic!("two policies swept, got {:?}", row.policies);
            };
            assert!(default >= lru, "{} pages: {default} < lru {lru}", row.pages);
        }
    }
}
