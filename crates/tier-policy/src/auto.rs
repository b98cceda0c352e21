use std::hash::Hash;

use crate::{hash_of, AdaptiveReplacement, Lfu, Lru, Policy, Prefix};

/// Most keys each miniature simulation holds; past it the sample rate halves. Also the number
/// of sampled requests after which the simulations' hits are halved.
const SAMPLED_KEYS: usize = 16384;

/// The orders [`Auto`] chooses between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expert {
    /// Least recently used: wins where the next request comes soon after the last.
    Lru,
    /// [`Prefix`], leaf-first frequency with aging: wins where hot chains share a head.
    Prefix,
    /// [`Lfu`], frequency never aged: wins where most blocks are used once (chat traffic).
    Lfu,
    /// [`AdaptiveReplacement`]: recency and frequency lists sized by ghost hits.
    Arc,
}

impl Expert {
    /// How much more (in percent) a challenger's recent hits must exceed the leader's to take
    /// over. LFU, whose mistakes last (counts never fade), must be clearly better; the others
    /// only better than noise.
    fn margin(self) -> u64 {
        match self {
            Expert::Lfu => 10,
            Expert::Lru | Expert::Prefix | Expert::Arc => 2,
        }
    }
}

/// The policy a KV cache should use when nobody knows its trace: LRU, [`Prefix`], [`Lfu`] or
/// [`AdaptiveReplacement`], whichever has lately reused the most prefix on this very stream of requests.
///
/// Traces differ: some reward recency (a conversation's next turn comes soon), some hot heads
/// shared by many requests, chat traffic (most blocks used once) counting uses across
/// evictions, and the stream a lower tier sees (its hot blocks absorbed by the tier above)
/// ARC's balance of recency and frequency. A policy tuned to one loses on the others. `Auto`
/// keeps the four orders of the keys it holds and evicts by the leader's. The leader is
/// elected by four miniature simulations (spatial sampling, as in SHARDS by Waldspurger et
/// al., FAST '15): every request for a sampled key (one whose hash falls below a threshold) is
/// replayed on a small cache per order, scaled to the real one's occupancy by the sample rate.
/// Each counts its leading-run hits (a sampled key found while every sampled key before it in
/// its batch was found too: the prefix an engine reuses), halved every `SAMPLED_KEYS` sampled
/// requests so the past fades, and a challenger leads once its count exceeds the leader's by
/// its margin (2%, 10% for LFU) and by more than sampling noise. LRU leads at the start, so on a
/// trace where no order wins `Auto` is LRU exactly (experts, as in LeCaR and CACHEUS, but
/// elected by simulation, not regret).
///
/// Cost: per held key an LRU link, a prefix entry, an ARC entry and an LFU count (with 32
/// bytes of sketch; LFU's heap is kept only while it leads); the simulations know keys by their
/// 64-bit hash and hold at most `SAMPLED_KEYS` (16,384) each: when more are sampled the
/// threshold halves and the keys above it are dropped, whatever the cache's size.
pub struct Auto<K> {
    lru: Lru<K>,
    prefix: Prefix<K>,
    lfu: Lfu<K>,
    arc: AdaptiveReplacement<K>,
    leader: Expert,
    held: usize,
    /// A key is sampled when its hash is below this; halves as the sample grows.
    threshold: u64,
    /// The simulations know a sampled key by its 64-bit hash: cheaper to hash and compare
    /// than the key, and two sampled keys share one with odds of 2^-64.
    lru_sim: Miniature<Lru<u64>>,
    prefix_sim: Miniature<Prefix<u64>>,
    lfu_sim: Miniature<Lfu<u64>>,
    arc_sim: Miniature<AdaptiveReplacement<u64>>,
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

/// A small cache of sampled keys under one policy, counting its leading-run hits.
struct Miniature<P> {
    policy: P,
    hits: u64,
    /// Whether every sampled key of the current batch so far was a hit.
    in_run: bool,
}

impl<P> Miniature<P> {
    fn new(policy: P) -> Self {
        Miniature {
            policy,
            hits: 0,
            in_run: true,
        }
    }

    /// One request for `key`; `starts` when it is the first of its batch.
    fn request<K>(&mut self, key: &K, after: Option<&K>, starts: bool, room: usize)
    where
        P: Held<K>,
    {
        self.in_run |= starts;
        if self.policy.holds(key) {
            self.hits += u64::from(self.in_run);
            self.policy.touch(key, after);
            return;
        }
        self.in_run = false;
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
            lfu: Lfu::unordered(),
            arc: AdaptiveReplacement::default(),
            leader: Expert::Lru,
            held: 0,
            threshold: u64::MAX,
            lru_sim: Miniature::new(Lru::default()),
            prefix_sim: Miniature::new(Prefix::default()),
            lfu_sim: Miniature::new(Lfu::default()),
            arc_sim: Miniature::new(AdaptiveReplacement::default()),
            since_decay: 0,
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Auto<K> {
    /// The order that currently chooses victims.
    pub fn leader(&self) -> Expert {
        self.leader
    }

    /// The real cache's occupancy at the sample rate: each simulation's room.
    fn room(&self) -> usize {
        let rate = self.threshold as f64 / u64::MAX as f64;
        (self.held as f64 * rate).round() as usize
    }

    /// Replays one request for `key` on every simulation, if it is sampled, and elects.
    fn simulate(&mut self, key: &K, after: Option<&K>) {
        let hash = hash_of(key);
        if hash > self.threshold {
            return;
        }
        let starts = after.is_none();
        let after = after.map(hash_of).filter(|a| *a <= self.threshold);
        let (key, after) = (&hash, after.as_ref());
        let room = self.room();
        self.lru_sim.request(key, after, starts, room);
        self.prefix_sim.request(key, after, starts, room);
        self.lfu_sim.request(key, after, starts, room);
        self.arc_sim.request(key, after, starts, room);
        let most = [
            self.lru_sim.policy.count(),
            self.prefix_sim.policy.count(),
            self.lfu_sim.policy.count(),
            self.arc_sim.policy.count(),
        ];
        if most.into_iter().max().unwrap_or(0) > SAMPLED_KEYS {
            self.halve_rate();
        }
        self.since_decay += 1;
        if self.since_decay >= SAMPLED_KEYS {
            self.since_decay = 0;
            self.lru_sim.hits /= 2;
            self.prefix_sim.hits /= 2;
            self.lfu_sim.hits /= 2;
            self.arc_sim.hits /= 2;
        }
        self.elect();
    }

    /// The challenger with the most hits beyond its margin over the leader's takes over.
    fn elect(&mut self) {
        let hits = |e: Expert| match e {
            Expert::Lru => self.lru_sim.hits,
            Expert::Prefix => self.prefix_sim.hits,
            Expert::Lfu => self.lfu_sim.hits,
            Expert::Arc => self.arc_sim.hits,
        };
        let mut best = (self.leader, hits(self.leader));
        for challenger in [Expert::Lru, Expert::Prefix, Expert::Lfu, Expert::Arc] {
            let h = hits(challenger);
            let lead = h.saturating_sub(best.1);
            // Ahead by the margin, and by more than three standard deviations of the best
            // count (hits are about Poisson: lead² > 9 x hits), so noise in a small sample
            // never elects; a tie never flaps the leader.
            if challenger != self.leader
                && h * 100 > best.1 * (100 + challenger.margin()) + 100
                && lead * lead > 9 * best.1
            {
                best = (challenger, h);
            }
        }
        if best.0 != self.leader && self.leader == Expert::Lfu {
            // LFU's order costs a heap push per use: kept only while it leads.
            self.lfu.unorder();
        }
        self.leader = best.0;
    }

    fn halve_rate(&mut self) {
        self.threshold /= 2;
        let threshold = self.threshold;
        let room = self.room();
        fn drop_above<P: Held<u64>>(sim: &mut Miniature<P>, threshold: u64, room: usize) {
            for hash in sim.policy.held_keys() {
                if hash > threshold {
                    sim.policy.remove(&hash);
                }
            }
            sim.shrink(room);
        }
        drop_above(&mut self.lru_sim, threshold, room);
        drop_above(&mut self.prefix_sim, threshold, room);
        drop_above(&mut self.lfu_sim, threshold, room);
        drop_above(&mut self.arc_sim, threshold, room);
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Policy<K> for Auto<K> {
    fn insert(&mut self, key: &K, weight: u64, after: Option<&K>) {
        self.simulate(key, after);
        let before = self.lru.len();
        self.lru.insert(key, weight, after);
        self.prefix.insert(key, weight, after);
        self.lfu.insert(key, weight, after);
        self.arc.insert(key, weight, after);
        self.held += self.lru.len() - before;
    }

    fn touch(&mut self, key: &K, after: Option<&K>) {
        self.simulate(key, after);
        self.lru.touch(key, after);
        self.prefix.touch(key, after);
        self.lfu.touch(key, after);
        self.arc.touch(key, after);
    }

    fn remove(&mut self, key: &K) {
        let before = self.lru.len();
        self.lru.remove(key);
        self.prefix.remove(key);
        self.lfu.remove(key);
        self.arc.remove(key);
        self.held -= before - self.lru.len();
        let hash = hash_of(key);
        self.lru_sim.policy.remove(&hash);
        self.prefix_sim.policy.remove(&hash);
        self.lfu_sim.policy.remove(&hash);
        self.arc_sim.policy.remove(&hash);
    }

    fn victim(&mut self, keep: &mut dyn FnMut(&K) -> bool) -> Option<K> {
        let key = match self.leader {
            Expert::Lru => self.lru.victim(keep)?,
            Expert::Prefix => self.prefix.victim(keep)?,
            Expert::Lfu => self.lfu.victim(keep)?,
            Expert::Arc => self.arc.victim(keep)?,
        };
        // The followers forget the key; prefix ages as if it had chosen it, so it stays ready
        // to lead; LFU keeps its count.
        if self.leader != Expert::Lru {
            self.lru.remove(&key);
        }
        if self.leader != Expert::Prefix {
            self.prefix.evicted(&key);
        }
        if self.leader != Expert::Lfu {
            self.lfu.remove(&key);
        }
        if self.leader != Expert::Arc {
            self.arc.evicted(&key);
        }
        self.held -= 1;
        Some(key)
    }

    fn clear(&mut self) {
        *self = Auto::default();
    }
}
