use std::hash::Hash;

use crate::{hash_of, Lru, Policy, Prefix};

/// Most keys each miniature simulation holds; past it the sample rate halves.
const SAMPLED_KEYS: usize = 16384;

/// The policy a KV cache should use when nobody knows its trace: LRU or [`Prefix`],
/// whichever has lately been the better one on this very stream of requests.
///
/// Traces differ: some reward recency (a conversation's next turn comes soon), others
/// frequency (a system prompt shared by every request), and a policy tuned to one loses on
/// the other. `Auto` keeps both orders of the keys it holds and evicts by the leader's. Which
/// one leads is decided by two miniature simulations (spatial sampling, as in SHARDS by
/// Waldspurger et al., FAST '15): every request for a sampled key (one whose hash falls below a
/// threshold) is replayed on a small LRU cache and a small prefix cache, each scaled to the
/// real one's occupancy by the sample rate, and their hits, halved now and then so the past
/// fades, elect the leader. LRU leads until the prefix simulation has clearly more hits, so
/// on a trace where neither wins `Auto` is LRU exactly. The simulations hold at most
/// `SAMPLED_KEYS` (16,384) keys each: when more are sampled the threshold halves and the keys above
/// it are dropped, so the cost stays bounded whatever the cache's size.
pub struct Auto<K> {
    lru: Lru<K>,
    prefix: Prefix<K>,
    /// Whether the prefix order leads (else LRU's).
    prefix_leads: bool,
    held: usize,
    /// A key is sampled when its hash is below this; halves as the sample grows.
    threshold: u64,
    lru_sim: Miniature<Lru<K>>,
    prefix_sim: Miniature<Prefix<K>>,
    /// Sampled requests since the simulations' hits were last halved.
    since_decay: usize,
}

/// What a miniature simulation asks of its policy beyond ordering: which keys it holds.
pub(crate) trait Held<K>: Policy<K> {
    /// Whether `key` is held.
    fn holds(&self, key: &K) -> bool;
    /// How many keys are held.
    fn count(&self) -> usize;
    /// The keys held (for a change of sample rate, rare).
    fn held_keys(&self) -> Vec<K>;
}

/// A small cache of sampled keys under one policy, counting its hits.
struct Miniature<P> {
    policy: P,
    hits: u64,
}

impl<P> Miniature<P> {
    fn new(policy: P) -> Self {
        Miniature { policy, hits: 0 }
    }

    fn request<K>(&mut self, key: &K, after: Option<&K>, room: usize)
    where
        P: Held<K>,
    {
        if self.policy.holds(key) {
            self.hits += 1;
            self.policy.touch(key, after);
            return;
        }
        self.policy.insert(key, 1, after);
        self.shrink(room);
    }

    fn shrink<K>(&mut self, room: usize)
    where
        P: Held<K>,
    {
        while self.policy.count() > room.max(1) {
            if self.policy.victim(&mut |_| false).is_none() {
                break;
            }
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Default for Auto<K> {
    fn default() -> Self {
        Auto {
            lru: Lru::default(),
            prefix: Prefix::default(),
            prefix_leads: false,
            held: 0,
            threshold: u64::MAX,
            lru_sim: Miniature::new(Lru::default()),
            prefix_sim: Miniature::new(Prefix::default()),
            since_decay: 0,
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Auto<K> {
    /// Whether the prefix order currently chooses victims.
    pub fn prefix_leads(&self) -> bool {
        self.prefix_leads
    }

    fn sampled(&self, key: &K) -> bool {
        hash_of(key) <= self.threshold
    }

    /// The real cache's occupancy at the sample rate: each simulation's room.
    fn room(&self) -> usize {
        let rate = self.threshold as f64 / u64::MAX as f64;
        (self.held as f64 * rate).round() as usize
    }

    /// Replays one request for `key` on both simulations, if it is sampled.
    fn simulate(&mut self, key: &K, after: Option<&K>) {
        if !self.sampled(key) {
            return;
        }
        let after = after.filter(|a| self.sampled(a));
        let room = self.room();
        self.lru_sim.request(key, after, room);
        self.prefix_sim.request(key, after, room);
        if self
            .lru_sim
            .policy
            .count()
            .max(self.prefix_sim.policy.count())
            > SAMPLED_KEYS
        {
            self.halve_rate();
        }
        self.since_decay += 1;
        if self.since_decay >= 8 * SAMPLED_KEYS {
            self.since_decay = 0;
            self.lru_sim.hits /= 2;
            self.prefix_sim.hits /= 2;
        }
        let (lru, prefix) = (&self.lru_sim, &self.prefix_sim);
        // A margin, so the leader does not flap on noise: LRU unless prefix is clearly ahead.
        self.prefix_leads = if self.prefix_leads {
            prefix.hits * 50 >= lru.hits * 49
        } else {
            prefix.hits * 50 > lru.hits * 51 + 50
        };
    }

    fn halve_rate(&mut self) {
        self.threshold /= 2;
        let threshold = self.threshold;
        let room = self.room();
        fn drop_above<K: Hash, P: Held<K>>(sim: &mut Miniature<P>, threshold: u64, room: usize) {
            for k in sim.policy.held_keys() {
                if hash_of(&k) > threshold {
                    sim.policy.remove(&k);
                }
            }
            sim.shrink(room);
        }
        drop_above(&mut self.lru_sim, threshold, room);
        drop_above(&mut self.prefix_sim, threshold, room);
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Policy<K> for Auto<K> {
    fn insert(&mut self, key: &K, weight: u64, after: Option<&K>) {
        self.simulate(key, after);
        let before = self.lru.len();
        self.lru.insert(key, weight, after);
        self.prefix.insert(key, weight, after);
        self.held += self.lru.len() - before;
    }

    fn touch(&mut self, key: &K, after: Option<&K>) {
        self.simulate(key, after);
        self.lru.touch(key, after);
        self.prefix.touch(key, after);
    }

    fn remove(&mut self, key: &K) {
        let before = self.lru.len();
        self.lru.remove(key);
        self.prefix.remove(key);
        self.held -= before - self.lru.len();
        self.lru_sim.policy.remove(key);
        self.prefix_sim.policy.remove(key);
    }

    fn victim(&mut self, keep: &mut dyn FnMut(&K) -> bool) -> Option<K> {
        let key = if self.prefix_leads {
            let key = self.prefix.victim(keep)?;
            self.lru.remove(&key);
            key
        } else {
            let key = self.lru.victim(keep)?;
            self.prefix.evicted(&key);
            key
        };
        self.held -= 1;
        Some(key)
    }

    fn clear(&mut self) {
        *self = Auto::default();
    }
}
