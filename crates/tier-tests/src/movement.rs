//! What a hierarchy suite moved between levels: a hierarchy suite whose cases never evict from
//! the top, never read from below and never copy up proves nothing about the hierarchy.

use std::sync::{Arc, Mutex};

use tier_core::{async_trait, TierError};
use tier_hierarchy::Hierarchy;

use crate::suite::{self, DynTier, TierFactory};

/// Opens hierarchies and keeps each one, so their counters can be summed after the cases ran.
pub struct Recording<F> {
    open: F,
    opened: Mutex<Vec<Arc<Hierarchy>>>,
}

/// Counters summed over every hierarchy a [`Recording`] factory opened.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Movement {
    /// Pages the top level evicted.
    pub top_evictions: u64,
    /// Keys levels below the top served.
    pub served_below: u64,
    /// Pages copied up after a lower hit.
    pub promotions: u64,
    /// Pages copied down by write-through.
    pub copied_down: u64,
    /// Pages demoted by write-back.
    pub demotions: u64,
}

impl<F> Recording<F>
where
    F: Fn() -> Result<Hierarchy, TierError> + Send + Sync,
{
    /// A factory opening hierarchies with `open`.
    pub fn new(open: F) -> Self {
        Self {
            open,
            opened: Mutex::new(Vec::new()),
        }
    }

    /// Runs the cases named, then sums what every hierarchy opened meanwhile moved.
    pub async fn run(&self, cases: &[&str]) -> Result<Movement, suite::Failure> {
        for case in cases {
            suite::run(case, self).await?;
        }
        let opened = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        let mut m = Movement::default();
        for h in opened.iter() {
            let s = h.hierarchy_stats();
            m.top_evictions += s.levels.first().map_or(0, |l| l.stats.evictions);
            m.served_below += s.levels.iter().skip(1).map(|l| l.served).sum::<u64>();
            m.promotions += s.promotions;
            m.copied_down += s.copied_down;
            m.demotions += s.demotions;
        }
        Ok(m)
    }
}

#[async_trait]
impl<F> TierFactory for Recording<F>
where
    F: Fn() -> Result<Hierarchy, TierError> + Send + Sync,
{
    async fn open(&self) -> Result<DynTier, TierError> {
        let h = Arc::new((self.open)()?);
        self.opened
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::clone(&h));
        Ok(h)
    }
}
