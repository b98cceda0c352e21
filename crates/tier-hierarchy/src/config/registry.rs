//! The registry of kinds: a config entry's kind names a factory that validates it into a
//! [`TierPlan`], and [`Registry::build`] opens the plans and composes them.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::{deserialize_at, HierarchyConfig};
use crate::hierarchy::DemotionQueue;
use crate::sealed::Sealed;
use crate::{EvictionListener, Hierarchy, StorageTier, TierError, TierInfo, WritePolicy};

/// What a kind's factory gets: the entry's name, where it sits and its parameters (a tier that
/// must hand evicted pages down gets its listener later, from [`TierPlan::open`]).
pub struct TierContext {
    /// Instance name.
    pub name: String,
    /// Position in the config, e.g. `tiers[1]`, for error messages.
    pub field: String,
    /// The entry's parameters (without `kind` and `name`).
    pub params: serde_json::Map<String, serde_json::Value>,
}

impl TierContext {
    /// Deserialises the parameters into the kind's typed config, naming failing fields.
    pub fn params<T: DeserializeOwned>(&self) -> Result<T, TierError> {
        deserialize_at(&self.field, serde_json::Value::Object(self.params.clone()))
    }
}

/// A boxed future opening a tier.
pub type OpenFuture = Pin<Box<dyn Future<Output = Result<Arc<dyn StorageTier>, TierError>> + Send>>;

/// A validated tier entry, ready to open.
pub trait TierPlan: Send {
    /// The resolved settings, one line, for `kvtier check`.
    fn describe(&self) -> String;
    /// Whether the kind can hand evicted pages down (needed for write-back above another tier).
    fn evicts(&self) -> bool {
        false
    }
    /// Who besides this process's user may write the tier's pages, where someone may (a
    /// folder shared with a group, a prefix shared across a fleet): without `integrity`, a
    /// page any of them forges is served as it is. `None`: this user's alone.
    fn others_may_write(&self) -> Option<String> {
        None
    }
    /// What an operator should set up beside the tier that kvtier cannot do itself (a
    /// bucket's lifecycle rule), for `kvtier check`.
    fn advice(&self) -> Option<String> {
        None
    }
    /// What the tier will be, where that is known before it opens: such a tier, if its open
    /// outlasts the hierarchy's `open_timeout`, goes on opening in the background while the
    /// hierarchy serves without it (down until it has opened).
    fn info(&self) -> Option<TierInfo> {
        None
    }
    /// Opens the tier; `on_evict` is set when evicted pages must go down.
    fn open(self: Box<Self>, on_evict: Option<EvictionListener>) -> OpenFuture;
}

/// Bound on a tier's open before it goes on in the background (see [`TierPlan::info`]).
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// A tier's instance name and its validated plan.
pub type NamedPlan = (String, Box<dyn TierPlan>);

/// Turns a config entry into a [`TierPlan`], validating it.
pub type KindFactory =
    Arc<dyn Fn(&TierContext) -> Result<Box<dyn TierPlan>, TierError> + Send + Sync>;

/// Kind name -> factory.
#[derive(Clone, Default)]
pub struct Registry {
    kinds: BTreeMap<String, KindFactory>,
}

impl Registry {
    /// Adds (or replaces) a kind.
    pub fn register(
        &mut self,
        kind: impl Into<String>,
        factory: impl Fn(&TierContext) -> Result<Box<dyn TierPlan>, TierError> + Send + Sync + 'static,
    ) {
        self.kinds.insert(kind.into(), Arc::new(factory));
    }

    /// Registered kinds.
    pub fn kinds(&self) -> Vec<&str> {
        self.kinds.keys().map(String::as_str).collect()
    }

    /// For each tier of `config` others may write without an `integrity` key: its index, name
    /// and what `kvtier check` and the open warn of.
    pub fn unsealed_shared(
        config: &HierarchyConfig,
        plans: &[NamedPlan],
    ) -> Vec<(usize, String, String)> {
        plans
            .iter()
            .zip(&config.tiers)
            .enumerate()
            .filter(|(_, (_, spec))| spec.integrity.is_none())
            .filter_map(|(i, ((name, plan), _))| {
                plan.others_may_write().map(|who| {
                    let warning = format!(
                        "{who} may write its pages, and it has no integrity key: a page any of \
                         them forges is served as it is (set integrity = {{ key_env = \"...\" }} \
                         on tiers[{i}])"
                    );
                    (i, name.clone(), warning)
                })
            })
            .collect()
    }

    /// Validates every entry of `config`; returns the plans in order.
    pub fn plan(&self, config: &HierarchyConfig) -> Result<Vec<NamedPlan>, TierError> {
        let mut plans = Vec::new();
        for (i, spec) in config.tiers.iter().enumerate() {
            let field = format!("tiers[{i}]");
            let factory = self.kinds.get(&spec.kind).ok_or_else(|| {
                TierError::config(
                    format!("{field}.kind"),
                    format!(
                        "unknown kind {:?}; registered kinds: {}",
                        spec.kind,
                        self.kinds().join(", ")
                    ),
                )
            })?;
            let name = spec.name.clone().unwrap_or_else(|| spec.kind.clone());
            let ctx = TierContext {
                name: name.clone(),
                field: field.clone(),
                params: spec.params.clone(),
            };
            let plan = factory(&ctx)?;
            if let Some(integrity) = &spec.integrity {
                if config.hierarchy.write == WritePolicy::WriteBack && i + 1 < config.tiers.len() {
                    return Err(TierError::config(
                        format!("{field}.integrity"),
                        "is for the last tier of a write-back hierarchy (a tier that evicts \
                         into the next hands its pages on as stored)",
                    ));
                }
                integrity.key(&format!("{field}.integrity"))?;
            }
            if config.hierarchy.write == WritePolicy::WriteBack
                && i + 1 < config.tiers.len()
                && !plan.evicts()
            {
                return Err(TierError::config(
                    format!("{field}.kind"),
                    format!("write-back needs every tier above the last to evict into the next, and kind {:?} has no eviction hook", spec.kind),
                ));
            }
            plans.push((name, plan));
        }
        Ok(plans)
    }

    /// Validates and opens every tier, then composes them.
    pub async fn build(&self, config: &HierarchyConfig) -> Result<Hierarchy, TierError> {
        self.build_with(config, |_, tier| tier).await
    }

    /// [`build`](Self::build), each level's tier passed through `wrap` (its index, the tier
    /// as opened and sealed) before it is composed: to measure, trace or inject faults.
    pub async fn build_with(
        &self,
        config: &HierarchyConfig,
        wrap: impl Fn(usize, Arc<dyn StorageTier>) -> Arc<dyn StorageTier>,
    ) -> Result<Hierarchy, TierError> {
        let policy = config.policy();
        let plans = self.plan(config)?;
        for (_, name, warning) in Self::unsealed_shared(config, &plans) {
            tracing::warn!(tier = %name, "{warning}");
        }
        let queue = DemotionQueue::new();
        let last = plans.len() - 1;
        let mut tiers = Vec::new();
        for (i, ((_, plan), spec)) in plans.into_iter().zip(&config.tiers).enumerate() {
            let hook =
                (policy.write == WritePolicy::WriteBack && i < last).then(|| queue.listener(i));
            let tier = match plan.info() {
                Some(info) => {
                    let bound = config.hierarchy.open_timeout.map_or(OPEN_TIMEOUT, |t| t.0);
                    crate::opening::open_within(info, bound, plan.open(hook)).await?
                }
                None => plan.open(hook).await?,
            };
            let tier = match &spec.integrity {
                Some(integrity) => {
                    let key = integrity.key(&format!("tiers[{i}].integrity"))?;
                    Arc::new(Sealed::new(tier, key))
                }
                None => tier,
            };
            tiers.push(wrap(i, tier));
        }
        Hierarchy::compose("hierarchy".to_owned(), tiers, policy, queue)
    }
}
