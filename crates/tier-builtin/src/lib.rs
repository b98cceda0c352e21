//! The tier kinds kvtier ships, registered in one place: what a config file may name under
//! `kind` in the `kvtier` command and in the Python package alike.

use tier_core::config::Registry;

/// A registry of every built-in kind: `mem` (DRAM), `nixl-file`, `nixl-obj` and `object`.
pub fn registry() -> Registry {
    let mut registry = Registry::default();
    tier_mem::config::register(&mut registry);
    tier_nixl::config::register(&mut registry);
    tier_object::config::register(&mut registry);
    registry
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_built_in_kind_is_registered() {
        let registry = super::registry();
        let mut kinds = registry.kinds();
        kinds.sort_unstable();
        assert_eq!(kinds, ["mem", "nixl-file", "nixl-obj", "object"]);
    }
}
