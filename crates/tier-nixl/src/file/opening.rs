//! What an open leaves to a background thread, so the tier serves its first call at once
//! whatever its folders hold: an owner's index of the pages already in its folders (their
//! files looked at until then, see [`Catalog::owned`](super::catalog::Catalog::owned)), and a
//! sharer's scan that removes dead writers' leftovers and corrects the folders' usage.
//!
//! The thread holds the catalog, not the tier: a tier dropped meanwhile lets go of its folders'
//! locks at once, and the thread stops at its next bucket (or batch of index entries).

use std::sync::{Arc, Weak};
use std::time::Instant;

use tokio::sync::watch;

use tier_core::TierError;

use super::catalog::Catalog;
use super::layout::ScanReport;
use super::{FileAccess, Shared};

/// Index entries loaded per hold of the index's lock.
const LOAD_BATCH: usize = 4096;

/// Starts the work the open of `shared` left; `done` is told `true` when it is finished (and
/// dropped untold if the tier went first).
pub(super) fn spawn(shared: &Arc<Shared>, done: watch::Sender<bool>) {
    let work = Work {
        catalog: Arc::clone(&shared.catalog),
        access: shared.config.access,
        tier: Arc::downgrade(shared),
    };
    let name = shared.config.name.clone();
    let spawned = std::thread::Builder::new()
        .name("kvtier-open-scan".into())
        .spawn(move || {
            let started = Instant::now();
            if let Some(what) = work.run() {
                tracing::info!(tier = %name, elapsed = ?started.elapsed(), "{what}");
                let _ = done.send(true);
            }
        });
    if let Err(e) = spawned {
        // The index stays loading: lookups keep looking at the files.
        tracing::error!(error = %e, "cannot start the scan that follows an open");
    }
}

/// The work, holding the catalog but not the tier: a tier dropped meanwhile lets go of its
/// folders' locks at once, and the work stops at the next bucket.
struct Work {
    catalog: Arc<Catalog>,
    access: FileAccess,
    tier: Weak<Shared>,
}

impl Work {
    fn alive(&self) -> Option<()> {
        (self.tier.strong_count() > 0).then_some(())
    }

    fn failed(&self, e: &TierError, what: &str) {
        if let Some(tier) = self.tier.upgrade() {
            tier.stats.errors(1);
        }
        tracing::warn!(error = %e, "{what}");
    }

    /// Does the work; what it did, or `None` if the tier was dropped first.
    fn run(&self) -> Option<String> {
        let layout = self.catalog.layout();
        let buckets = layout.buckets();
        match self.access {
            FileAccess::Reader => Some("a reader's open leaves nothing to do".into()),
            FileAccess::Owner => {
                let mut report = ScanReport::default();
                for bucket in &buckets {
                    self.alive()?;
                    if let Err(e) = layout.scan_owned_bucket(bucket, &mut report) {
                        self.failed(
                            &e,
                            "a bucket could not be scanned: its pages stay unindexed",
                        );
                    }
                }
                report.pages.sort_by_key(|(_, _, mtime)| *mtime);
                let found: Vec<_> = report
                    .pages
                    .into_iter()
                    .map(|(k, len, _)| (k, len))
                    .collect();
                self.catalog.expect(found.len());
                for batch in found.chunks(LOAD_BATCH) {
                    self.alive()?;
                    self.catalog.load(batch);
                }
                let pages = found.len();
                drop(found);
                self.catalog.loaded();
                super::index::release_freed_memory();
                self.tier.upgrade()?.enforce_capacity();
                Some(format!(
                    "the pages found at open are indexed: {} pages, {} leftover temp files removed, {} foreign files left",
                    pages,
                    report.temps_removed,
                    report.foreign
                ))
            }
            FileAccess::Shared => {
                let fleet = self.catalog.fleet()?;
                let mut scan = match fleet.begin_open_scan() {
                    Ok(scan) => scan,
                    Err(e) => {
                        return Some(format!("the shared folders' usage cannot be read: {e}"))
                    }
                };
                for bucket in &buckets {
                    self.alive()?;
                    if let Err(e) = fleet.open_scan_bucket(layout, bucket, &mut scan) {
                        self.failed(&e, "a bucket could not be scanned: the usage may stay off until the next open");
                    }
                }
                self.alive()?;
                match fleet.end_open_scan(layout, scan) {
                    Ok(()) => Some(format!(
                        "the shared folders are scanned: usage {} bytes, {} leftover temp files removed",
                        fleet.usage(),
                        fleet.stats().temps_removed
                    )),
                    Err(e) => Some(format!("the shared folders' usage could not be settled: {e}")),
                }
            }
        }
    }
}
