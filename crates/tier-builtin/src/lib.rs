//! The tier kinds kvtier ships, registered in one place: what a config file may name under
//! `kind` in the `kvtier` command and in the Python package alike. Each kind's module reads
//! its entry's parameters into the tier's own config and opens the tier; the tier crates know
//! nothing of config files.

mod mem;
mod nixl;
mod object;

pub use object::store_of;

use std::sync::Arc;

use object_store::ObjectStore;
use tier_core::TierError;
use tier_hierarchy::config::{HierarchyConfig, Registry, TierContext};

/// A registry of every built-in kind: `mem` (DRAM), `nixl-file`, `nixl-obj` and `object`.
pub fn registry() -> Registry {
    let mut registry = Registry::default();
    mem::register(&mut registry);
    nixl::register(&mut registry);
    object::register(&mut registry);
    registry
}

/// A prefix of an object store a config's tier keeps its pages under.
pub struct ObjectPrefix {
    /// The tier's name.
    pub tier: String,
    /// The store, as the tier builds it.
    pub store: Arc<dyn ObjectStore>,
    /// The prefix.
    pub prefix: String,
}

/// The object store and prefix of each `object` and `nixl-obj` tier of `config`, in order
/// (for tools that work on a prefix beside the tiers, such as `kvtier move-flat`).
pub fn object_prefixes(config: &HierarchyConfig) -> Result<Vec<ObjectPrefix>, TierError> {
    let mut prefixes = Vec::new();
    for (i, spec) in config.tiers.iter().enumerate() {
        let ctx = TierContext {
            name: spec.name.clone().unwrap_or_else(|| spec.kind.clone()),
            field: format!("tiers[{i}]"),
            params: spec.params.clone(),
        };
        let (store, prefix) = match spec.kind.as_str() {
            "object" => {
                let (store, _, prefix) = store_of(&ctx)?;
                (store, prefix)
            }
            "nixl-obj" => nixl::obj_store_of(&ctx)?,
            _ => continue,
        };
        prefixes.push(ObjectPrefix {
            tier: ctx.name,
            store,
            prefix,
        });
    }
    Ok(prefixes)
}

/// `e` with its field placed under the entry's (`capacity` -> `tiers[1].capacity`).
fn field_error(ctx: &TierContext, e: TierError) -> TierError {
    match e {
        TierError::Config { field, message } => {
            TierError::config(format!("{}.{field}", ctx.field), message)
        }
        other => other,
    }
}

/// The README's Rust examples, run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    #[test]
    fn every_built_in_kind_is_registered() {
        let registry = super::registry();
        let mut kinds = registry.kinds();
        kinds.sort_unstable();
        assert_eq!(kinds, ["mem", "nixl-file", "nixl-obj", "object"]);
    }

    /// The error `tier` (a TOML table's fields) gets, as text.
    fn refused(tier: &str) -> String {
        let text = format!("[[tiers]]\n{tier}\n");
        let config = tier_hierarchy::config::HierarchyConfig::from_toml(&text).expect("parses");
        match super::registry().plan(&config) {
            Ok(_) => panic!("{tier} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn shared_access_refuses_what_it_does_not_use_and_the_others_its_settings() {
        let folder = "kind = \"nixl-file\"\ndirs = [\"/tmp/kvtier-unused\"]";
        let prefix = "kind = \"object\"\nstore = \"memory\"\nprefix = \"p\"\ncapacity = 1024";
        let cases = [
            (
                format!("{folder}\naccess = \"shared\"\npolicy = \"lru\""),
                "tiers[0].policy",
            ),
            (format!("{folder}\nlease = \"5s\""), "tiers[0].lease"),
            (format!("{folder}\nlocks = \"none\""), "tiers[0].locks"),
            (
                format!("{folder}\naccess = \"shared\"\nlocks = \"posix\""),
                "unknown variant `posix`, expected `flock` or `none`",
            ),
            (
                format!("{folder}\naccess = \"reader\"\nlow_watermark = 0.5"),
                "tiers[0].low_watermark",
            ),
            (
                format!("{prefix}\naccess = \"shared\"\npolicy = \"lru\""),
                "tiers[0].policy",
            ),
            (format!("{prefix}\nrelist = \"1s\""), "tiers[0].relist"),
            (
                format!("{prefix}\naccess = \"shared\"\nlow_watermark = 1.5"),
                "tiers[0].low_watermark",
            ),
        ];
        for (tier, field) in cases {
            let err = refused(&tier);
            assert!(err.contains(field), "{tier}: {err}");
        }
        assert!(refused(&format!("{folder}\nlease = \"5s\"")).contains("access is \"owner\""));
    }
}
