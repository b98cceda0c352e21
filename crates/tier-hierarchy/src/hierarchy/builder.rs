//! [`HierarchyBuilder`]: the one way to compose tiers into a [`Hierarchy`].

use std::sync::Arc;

use tier_core::{EvictionListener, StorageTier, TierError};

use super::queue::DemotionQueue;
use super::{Hierarchy, HierarchyPolicy, WritePolicy};

/// Makes a tier given the hook its evicted pages must go to (`None` when nothing goes down).
type MakeTier =
    Box<dyn FnOnce(Option<EvictionListener>) -> Result<Arc<dyn StorageTier>, TierError> + Send>;

enum Level {
    Built(Arc<dyn StorageTier>),
    Make(MakeTier),
}

/// Composes tiers, fastest first, into a [`Hierarchy`]. In write-back it creates the queue
/// that carries evicted pages down and hands each tier added with
/// [`tier_with`](Self::tier_with) the hook for it.
///
/// ```
/// # use std::sync::Arc;
/// # use tier_core::{async_trait, StorageTier};
/// # use tier_hierarchy::{Hierarchy, HierarchyPolicy, WritePolicy};
/// # async fn demo(top: Arc<dyn StorageTier>, disk: Arc<dyn StorageTier>) -> Result<(), tier_core::TierError> {
/// let hierarchy = Hierarchy::builder("dram/disk")
///     .policy(HierarchyPolicy { write: WritePolicy::WriteThrough, ..Default::default() })
///     .tier(top)
///     .tier(disk)
///     .build()?;
/// # Ok(()) }
/// ```
pub struct HierarchyBuilder {
    name: String,
    policy: HierarchyPolicy,
    levels: Vec<Level>,
}

impl HierarchyBuilder {
    pub(super) fn new(name: String) -> Self {
        Self {
            name,
            policy: HierarchyPolicy::default(),
            levels: Vec::new(),
        }
    }

    /// How pages move (default: [`HierarchyPolicy::default`]).
    pub fn policy(mut self, policy: HierarchyPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Adds a tier below those added so far. In write-back, a tier added this way above the
    /// last hands nothing down when it evicts (use [`tier_with`](Self::tier_with)).
    pub fn tier(mut self, tier: Arc<dyn StorageTier>) -> Self {
        self.levels.push(Level::Built(tier));
        self
    }

    /// Adds a tier made at [`build`](Self::build) from the hook its evicted pages go to:
    /// `Some` in write-back for every tier but the last, `None` otherwise.
    pub fn tier_with(
        mut self,
        make: impl FnOnce(Option<EvictionListener>) -> Result<Arc<dyn StorageTier>, TierError>
            + Send
            + 'static,
    ) -> Self {
        self.levels.push(Level::Make(Box::new(make)));
        self
    }

    /// Makes the tiers and composes them. Must run inside a tokio runtime (it starts the
    /// background writer).
    pub fn build(self) -> Result<Hierarchy, TierError> {
        let queue = DemotionQueue::new();
        let last = self.levels.len().saturating_sub(1);
        let write_back = self.policy.write == WritePolicy::WriteBack;
        let mut tiers = Vec::with_capacity(self.levels.len());
        for (i, level) in self.levels.into_iter().enumerate() {
            tiers.push(match level {
                Level::Built(tier) => tier,
                Level::Make(make) => make((write_back && i < last).then(|| queue.listener(i)))?,
            });
        }
        Hierarchy::compose(self.name, tiers, self.policy, queue)
    }
}
