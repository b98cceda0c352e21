//! Offline simulations of the trace at a given cache size, for comparison with what the tiers
//! did: plain LRU, Belady's optimum (evict the block used farthest in the future), and an
//! unbounded cache. Each request reuses the leading run of its blocks that are cached, then all
//! its blocks are accessed.

use std::collections::{BTreeSet, HashMap};

use crate::trace::Request;

/// Reused blocks over requested blocks.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ratio {
    /// Blocks reused.
    pub reused: u64,
    /// Blocks requested.
    pub requested: u64,
}

impl Ratio {
    /// As a fraction.
    pub fn value(&self) -> f64 {
        if self.requested == 0 {
            0.0
        } else {
            self.reused as f64 / self.requested as f64
        }
    }
}

/// The cumulative ratio after each request, for plots.
pub type Curve = Vec<f64>;

/// An unbounded cache: every block seen before is present.
pub fn unbounded(trace: &[Request]) -> Ratio {
    unbounded_curve(trace, &mut Vec::new())
}

/// [`unbounded`], recording the cumulative ratio after each request into `curve`.
pub fn unbounded_curve(trace: &[Request], curve: &mut Curve) -> Ratio {
    simulate(trace, &mut Unbounded::default(), curve)
}

#[derive(Default)]
struct Unbounded(std::collections::HashSet<u64>);

impl SimCache for Unbounded {
    fn contains(&self, id: u64) -> bool {
        self.0.contains(&id)
    }
    fn access(&mut self, id: u64, _pos: usize) {
        self.0.insert(id);
    }
}

/// A cache of block ids the simulation drives: presence, then each access in trace order.
trait SimCache {
    fn contains(&self, id: u64) -> bool;
    /// Accesses `id`, the `pos`-th block access of the trace, evicting as needed.
    fn access(&mut self, id: u64, pos: usize);
}

/// Reused over requested blocks when each request reuses its cached leading run, then
/// accesses all its blocks; the cumulative ratio after each request goes to `curve`.
fn simulate(trace: &[Request], cache: &mut impl SimCache, curve: &mut Curve) -> Ratio {
    let mut r = Ratio::default();
    let mut pos = 0;
    for req in trace {
        r.requested += req.hash_ids.len() as u64;
        r.reused += req
            .hash_ids
            .iter()
            .take_while(|id| cache.contains(**id))
            .count() as u64;
        for &id in &req.hash_ids {
            cache.access(id, pos);
            pos += 1;
        }
        curve.push(r.value());
    }
    r
}

/// Blocks ordered by a rank (last use for LRU, next use for Belady), bounded in count.
struct Ranked {
    rank: HashMap<u64, u64>,
    order: BTreeSet<(u64, u64)>,
    capacity: usize,
}

impl Ranked {
    fn new(capacity: usize) -> Self {
        Self {
            rank: HashMap::new(),
            order: BTreeSet::new(),
            capacity,
        }
    }

    /// Sets `id`'s rank, then evicts the lowest (`evict_highest = false`) or highest rank.
    fn set(&mut self, id: u64, rank: u64, evict_highest: bool) {
        if let Some(old) = self.rank.insert(id, rank) {
            self.order.remove(&(old, id));
        }
        self.order.insert((rank, id));
        while self.rank.len() > self.capacity {
            let victim = if evict_highest {
                self.order.pop_last()
            } else {
                self.order.pop_first()
            };
            let Some((_, victim)) = victim else { break };
            self.rank.remove(&victim);
        }
    }
}

struct Lru(Ranked);

impl SimCache for Lru {
    fn contains(&self, id: u64) -> bool {
        self.0.rank.contains_key(&id)
    }
    fn access(&mut self, id: u64, pos: usize) {
        self.0.set(id, pos as u64, false);
    }
}

struct Belady {
    cache: Ranked,
    next_use: Vec<u64>,
}

impl SimCache for Belady {
    fn contains(&self, id: u64) -> bool {
        self.cache.rank.contains_key(&id)
    }
    fn access(&mut self, id: u64, pos: usize) {
        self.cache.set(id, self.next_use[pos], true);
    }
}

/// Every block access of the trace in order, and where each block is next used (`u64::MAX`:
/// never).
fn next_uses(trace: &[Request]) -> (Vec<u64>, Vec<u64>) {
    let accesses: Vec<u64> = trace
        .iter()
        .flat_map(|r| r.hash_ids.iter().copied())
        .collect();
    let mut next_use = vec![u64::MAX; accesses.len()];
    let mut later: HashMap<u64, u64> = HashMap::new();
    for (i, id) in accesses.iter().enumerate().rev() {
        if let Some(&n) = later.get(id) {
            next_use[i] = n;
        }
        later.insert(*id, i as u64);
    }
    (accesses, next_use)
}

/// LRU with room for `capacity` blocks.
pub fn lru(trace: &[Request], capacity: usize) -> Ratio {
    lru_curve(trace, capacity, &mut Vec::new())
}

/// [`lru`], recording the cumulative ratio after each request into `curve`.
pub fn lru_curve(trace: &[Request], capacity: usize, curve: &mut Curve) -> Ratio {
    simulate(trace, &mut Lru(Ranked::new(capacity)), curve)
}

/// Belady's next-use rule with room for `capacity` blocks (evict the block whose next use is
/// farthest away), scored by prefix reuse. Optimal for block hits, it is only a heuristic for
/// prefix reuse (capacity 1, requests `[A,B]`, `[C,B]`, `[A]`: it reuses nothing, keeping A
/// reuses one block); [`belady_blocks`] is the bound.
pub fn belady(trace: &[Request], capacity: usize) -> Ratio {
    let (_, next_use) = next_uses(trace);
    simulate(
        trace,
        &mut Belady {
            cache: Ranked::new(capacity),
            next_use,
        },
        &mut Vec::new(),
    )
}

/// Belady's block-hit ratio with room for `capacity` blocks: every block access is looked
/// up and counts as a hit if cached, whether or not the blocks before it were. Belady's rule
/// maximises these hits, and a request's reusable prefix is a subset of its hits under any
/// policy, so no policy's prefix reuse at this size exceeds it: an upper bound.
pub fn belady_blocks(trace: &[Request], capacity: usize) -> Ratio {
    belady_blocks_curve(trace, capacity, &mut Vec::new())
}

/// [`belady_blocks`], recording the cumulative ratio after each request into `curve`.
pub fn belady_blocks_curve(trace: &[Request], capacity: usize, curve: &mut Curve) -> Ratio {
    let (accesses, next_use) = next_uses(trace);
    let mut cache = Ranked::new(capacity);
    let mut r = Ratio::default();
    let mut pos = 0;
    for req in trace {
        for id in &accesses[pos..pos + req.hash_ids.len()] {
            r.requested += 1;
            r.reused += u64::from(cache.rank.contains_key(id));
            cache.set(*id, next_use[pos], true);
            pos += 1;
        }
        curve.push(r.value());
    }
    r
}

/// `kind`'s own implementation (kvtier's tier-policy) with room for `capacity` blocks, fed the
/// way a replay feeds a tier: each request reads its cached leading run (touches, linked in
/// order), then stores the rest (inserts, linked in order). `None` for TinyLFU (moka's).
pub fn policy(trace: &[Request], capacity: usize, kind: tier_policy::PolicyKind) -> Option<Ratio> {
    let mut policy = kind.build::<u64>()?;
    let mut held = std::collections::HashSet::new();
    let mut r = Ratio::default();
    for req in trace {
        let reused = req
            .hash_ids
            .iter()
            .take_while(|id| held.contains(*id))
            .count();
        r.requested += req.hash_ids.len() as u64;
        r.reused += reused as u64;
        let (read, stored) = req.hash_ids.split_at(reused);
        for (i, id) in read.iter().enumerate() {
            policy.touch(id, i.checked_sub(1).map(|p| &read[p]));
        }
        for (i, id) in stored.iter().enumerate() {
            policy.insert(id, 1, i.checked_sub(1).map(|p| &stored[p]));
            held.insert(*id);
            while held.len() > capacity {
                match policy.victim(&mut |_| false) {
                    Some(v) => held.remove(&v),
                    None => break,
                };
            }
        }
    }
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ids: &[u64]) -> Request {
        Request {
            hash_ids: ids.to_vec(),
        }
    }

    /// The policy simulation of LRU is the LRU simulation.
    #[test]
    fn the_lru_policy_simulates_as_lru() {
        let trace = crate::trace::generated(400);
        for capacity in [10, 100, 1000] {
            let own = policy(&trace, capacity, tier_policy::PolicyKind::Lru).unwrap();
            let lru = lru(&trace, capacity);
            assert_eq!(
                (own.reused, own.requested),
                (lru.reused, lru.requested),
                "{capacity}"
            );
        }
    }

    #[test]
    fn prefix_semantics_and_bounds() {
        let trace = vec![
            req(&[1, 2, 3]),
            req(&[1, 2, 4]),
            req(&[5, 1, 2]),
            req(&[1, 2, 3]),
        ];
        let inf = unbounded(&trace);
        // Reused: none, then 1 and 2, then none (5 is new), then 1, 2 and 3.
        assert_eq!((inf.reused, inf.requested), (5, 12));
        for cap in 1..6 {
            let (l, b) = (lru(&trace, cap), belady(&trace, cap));
            assert!(
                b.reused >= l.reused,
                "Belady is never worse than LRU (cap {cap})"
            );
            assert!(inf.reused >= b.reused);
        }
        for cap in 1..6 {
            let bound = belady_blocks(&trace, cap);
            assert!(bound.reused >= belady(&trace, cap).reused, "cap {cap}");
            assert!(bound.reused >= lru(&trace, cap).reused, "cap {cap}");
        }
        assert_eq!(lru(&trace, 100).reused, inf.reused);
        assert_eq!(belady(&trace, 100).reused, inf.reused);
    }

    /// The example: Belady's next-use rule keeps B and reuses nothing; keeping A
    /// reuses one block, which the block-hit bound allows for.
    #[test]
    fn the_next_use_rule_is_not_a_bound_on_prefix_reuse() {
        let trace = vec![req(&[1, 2]), req(&[3, 2]), req(&[1])];
        assert_eq!(belady(&trace, 1).reused, 0);
        assert_eq!(optimum(&trace, 1), 1);
        assert!(belady_blocks(&trace, 1).reused >= 1);
    }

    /// The best prefix reuse any policy reaches, by trying every choice: after each access
    /// the cache may keep or skip the block and may evict any block for it.
    fn optimum(trace: &[Request], capacity: usize) -> u64 {
        use std::collections::BTreeSet;
        let mut states: HashMap<BTreeSet<u64>, u64> = HashMap::from([(BTreeSet::new(), 0)]);
        for request in trace {
            let mut next: HashMap<BTreeSet<u64>, u64> = HashMap::new();
            for (state, reused) in states {
                let lead = request
                    .hash_ids
                    .iter()
                    .take_while(|id| state.contains(id))
                    .count();
                let mut frontier = vec![state];
                for id in &request.hash_ids {
                    let mut grown = Vec::new();
                    for s in frontier {
                        if !s.contains(id) {
                            let mut with = s.clone();
                            with.insert(*id);
                            if with.len() > capacity {
                                for victim in s.iter() {
                                    let mut w = with.clone();
                                    w.remove(victim);
                                    grown.push(w);
                                }
                            } else {
                                grown.push(with);
                            }
                        }
                        grown.push(s);
                    }
                    grown.sort();
                    grown.dedup();
                    frontier = grown;
                }
                for s in frontier {
                    let best = next.entry(s).or_insert(0);
                    *best = (*best).max(reused + lead as u64);
                }
            }
            states = next;
        }
        states.into_values().max().unwrap_or(0)
    }

    /// On small random traces the block-hit bound is never below the true optimum, and LRU and
    /// Belady's next-use rule never above it.
    #[test]
    fn the_block_hit_bound_holds_against_brute_force() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for round in 0..300 {
            let trace: Vec<Request> = (0..1 + next(6))
                .map(|_| {
                    let len = 1 + next(3) as usize;
                    let mut ids: Vec<u64> = Vec::new();
                    while ids.len() < len {
                        let id = next(5);
                        if !ids.contains(&id) {
                            ids.push(id);
                        }
                    }
                    req(&ids)
                })
                .collect();
            for cap in 1..=3 {
                let best = optimum(&trace, cap);
                let bound = belady_blocks(&trace, cap).reused;
                assert!(
                    bound >= best,
                    "round {round}, cap {cap}: bound {bound} < optimum {best}"
                );
                assert!(
                    lru(&trace, cap).reused <= best,
                    "round {round}, cap {cap}: lru"
                );
                assert!(
                    belady(&trace, cap).reused <= best,
                    "round {round}, cap {cap}: next-use"
                );
            }
        }
    }
}
