//! Eviction policies for kvtier's capacity-bounded tiers.
//!
//! A [`Policy`] only orders keys: the tier that owns the pages keeps their bytes, counts its
//! capacity and asks the policy for a [`Policy::victim`] until it fits. So one policy serves a
//! DRAM map, a file tier's index or an object tier's catalog alike.
//!
//! Batches are chains: kvtier's callers (SGLang, the replay) put and get the pages of one
//! prompt prefix in order, so each call passes the page before a key in its batch (`after`).
//! Only the prefix-aware policy uses it; the others ignore it.

mod arc;
mod auto;
mod lfu;
mod lru;
mod prefix;
mod s3fifo;
mod sampled;
mod segments;
mod sieve;

use std::hash::Hash;

pub use arc::AdaptiveReplacement;
pub use auto::{Auto, Expert};
pub use lfu::Lfu;
pub use lru::Lru;
pub use prefix::Prefix;
pub use s3fifo::S3Fifo;
pub use sampled::{Sampled, SampledTable};
pub use sieve::Sieve;

/// The maps the policies keep per key: hashbrown's fast hasher, not SipHash (a policy hashes a
/// key several times per call).
type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A hash of `key` that is the same in every process (a fixed seed), for sampling.
fn hash_of<K: Hash>(key: &K) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one(key)
}

/// Orders the keys a bounded tier holds and names which one to let go next.
pub trait Policy<K>: Send {
    /// `key` was stored (new, or replacing its previous version) and weighs `weight` bytes;
    /// `after` is the key before it in the caller's batch, if any.
    fn insert(&mut self, key: &K, weight: u64, after: Option<&K>);
    /// `key`, held, was read; `after` as for [`Policy::insert`].
    fn touch(&mut self, key: &K, after: Option<&K>);
    /// `key` is gone (removed by the caller); a no-op for keys not held.
    fn remove(&mut self, key: &K);
    /// Chooses a held key that `keep` does not protect, forgets it and returns it; `None` when
    /// every held key is protected (or none is held).
    fn victim(&mut self, keep: &mut dyn FnMut(&K) -> bool) -> Option<K>;
    /// Forgets every key (and any history of keys no longer held).
    fn clear(&mut self);
}

/// The policies by name, as config files spell them (`policy = "s3fifo"`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// Least recently used.
    Lru,
    /// moka's admission by frequency sketch, then LRU (DRAM tiers only).
    Tinylfu,
    /// SIEVE: a FIFO with a visited bit and a moving hand (Zhang et al., NSDI '24).
    Sieve,
    /// S3-FIFO: a small probationary FIFO, a main FIFO and a ghost list (Yang et al., SOSP '23).
    S3fifo,
    /// ARC: recency and frequency lists sized by ghost hits (Megiddo and Modha, FAST '03).
    Arc,
    /// Leaf-first frequency with dynamic aging: a chain is cut from its tail, never its head,
    /// and blocks used by many requests stay (see [`Prefix`]).
    Prefix,
    /// Leaf-first LRU: a chain is cut from its tail, the least recently used leaf first.
    Radix,
    /// Least frequently used, counts never aged and kept past eviction (see [`Lfu`]).
    Lfu,
    /// Least recently used as Redis approximates it: the oldest of random samples, no order
    /// kept, so the smallest index per page (see [`Sampled`]).
    Sampled,
    /// The default: LRU, `prefix`, `lfu` or `arc`, whichever miniature simulations of the
    /// recent requests favour (see [`Auto`]); never below LRU on any trace measured.
    #[default]
    Auto,
}

impl PolicyKind {
    /// Every policy, in the order reports list them.
    pub const ALL: [PolicyKind; 10] = [
        PolicyKind::Lru,
        PolicyKind::Tinylfu,
        PolicyKind::Sieve,
        PolicyKind::S3fifo,
        PolicyKind::Arc,
        PolicyKind::Prefix,
        PolicyKind::Radix,
        PolicyKind::Lfu,
        PolicyKind::Sampled,
        PolicyKind::Auto,
    ];

    /// The name config files use.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::Tinylfu => "tinylfu",
            PolicyKind::Sieve => "sieve",
            PolicyKind::S3fifo => "s3fifo",
            PolicyKind::Arc => "arc",
            PolicyKind::Prefix => "prefix",
            PolicyKind::Radix => "radix",
            PolicyKind::Lfu => "lfu",
            PolicyKind::Sampled => "sampled",
            PolicyKind::Auto => "auto",
        }
    }

    /// This crate's implementation of the policy; `None` for TinyLFU, which is moka's.
    pub fn build<K: Clone + Eq + Hash + Send + 'static>(self) -> Option<Box<dyn Policy<K>>> {
        Some(match self {
            PolicyKind::Lru => Box::new(Lru::default()),
            PolicyKind::Tinylfu => return None,
            PolicyKind::Sieve => Box::new(Sieve::default()),
            PolicyKind::S3fifo => Box::new(S3Fifo::default()),
            PolicyKind::Arc => Box::new(AdaptiveReplacement::default()),
            PolicyKind::Prefix => Box::new(Prefix::default()),
            PolicyKind::Radix => Box::new(Prefix::leaf_lru()),
            PolicyKind::Lfu => Box::new(Lfu::default()),
            PolicyKind::Sampled => Box::new(Sampled::default()),
            PolicyKind::Auto => Box::new(Auto::default()),
        })
    }
}

impl std::fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for PolicyKind {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown policy {name:?}; one of {}", names.join(", "))
            })
    }
}

#[cfg(test)]
mod tests;
