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

/// An unbounded cache: every block seen before is present.
pub fn unbounded(trace: &[Request]) -> Ratio {
    let mut seen = std::collections::HashSet::new();
    let mut r = Ratio::default();
    for req in trace {
        r.requested += req.hash_ids.len() as u64;
        r.reused += req
            .hash_ids
            .iter()
            .take_while(|id| seen.contains(*id))
            .count() as u64;
        seen.extend(req.hash_ids.iter().copied());
    }
    r
}

/// LRU with room for `capacity` blocks.
pub fn lru(trace: &[Request], capacity: usize) -> Ratio {
    let mut last_use: HashMap<u64, u64> = HashMap::new();
    let mut by_age: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut clock = 0u64;
    let mut r = Ratio::default();
    for req in trace {
        r.requested += req.hash_ids.len() as u64;
        r.reused += req
            .hash_ids
            .iter()
            .take_while(|id| last_use.contains_key(*id))
            .count() as u64;
        for &id in &req.hash_ids {
            clock += 1;
            if let Some(old) = last_use.insert(id, clock) {
                by_age.remove(&(old, id));
            }
            by_age.insert((clock, id));
            while last_use.len() > capacity {
                let Some((_, victim)) = by_age.pop_first() else {
                    break;
                };
                last_use.remove(&victim);
            }
        }
    }
    r
}

/// Belady's optimal replacement with room for `capacity` blocks.
pub fn belady(trace: &[Request], capacity: usize) -> Ratio {
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
    let mut cached: HashMap<u64, u64> = HashMap::new();
    let mut by_next: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut r = Ratio::default();
    let mut pos = 0usize;
    for req in trace {
        r.requested += req.hash_ids.len() as u64;
        r.reused += req
            .hash_ids
            .iter()
            .take_while(|id| cached.contains_key(*id))
            .count() as u64;
        for &id in &req.hash_ids {
            let next = next_use[pos];
            pos += 1;
            if let Some(old) = cached.insert(id, next) {
                by_next.remove(&(old, id));
            }
            by_next.insert((next, id));
            while cached.len() > capacity {
                let Some((_, victim)) = by_next.pop_last() else {
                    break;
                };
                cached.remove(&victim);
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ids: &[u64]) -> Request {
        Request {
            hash_ids: ids.to_vec(),
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
        assert_eq!(lru(&trace, 100).reused, inf.reused);
        assert_eq!(belady(&trace, 100).reused, inf.reused);
    }
}
