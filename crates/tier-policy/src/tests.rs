//! Properties every policy keeps, then what each one is for.

use std::collections::HashSet;

use crate::{Policy, PolicyKind};

fn policies() -> Vec<(PolicyKind, Box<dyn Policy<u32>>)> {
    PolicyKind::ALL
        .into_iter()
        .filter_map(|k| k.build().map(|p| (k, p)))
        .collect()
}

/// A small deterministic generator (xorshift), so failures replay.
struct Gen(u64);
impl Gen {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Random inserts, touches, removes and evictions (with some keys protected): a victim is
/// always held and unprotected, never returned twice, and every held key can be evicted.
#[test]
fn victims_are_held_unprotected_keys_and_each_goes_once() {
    for (kind, mut p) in policies() {
        let mut held = HashSet::new();
        let mut g = Gen(0x9e37_79b9_7f4a_7c15);
        for step in 0..20_000 {
            let key = g.below(300) as u32;
            match g.below(10) {
                0..=3 => {
                    let after = key.checked_sub(1);
                    p.insert(&key, 1 + g.below(4), after.as_ref());
                    held.insert(key);
                }
                4..=6 => {
                    if held.contains(&key) {
                        p.touch(&key, None);
                    }
                }
                7 => {
                    p.remove(&key);
                    held.remove(&key);
                }
                _ => {
                    let odd = g.below(2) == 0;
                    let mut keep = |k: &u32| odd && k % 2 == 1;
                    match p.victim(&mut keep) {
                        Some(v) => {
                            assert!(held.remove(&v), "{kind}: step {step}: victim {v} not held");
                            assert!(
                                !(odd && v % 2 == 1),
                                "{kind}: step {step}: evicted protected {v}"
                            );
                        }
                        None => assert!(
                            held.iter().all(|k| odd && k % 2 == 1),
                            "{kind}: step {step}: no victim among {} held keys",
                            held.len()
                        ),
                    }
                }
            }
        }
        while let Some(v) = p.victim(&mut |_| false) {
            assert!(held.remove(&v), "{kind}: draining: victim {v} not held");
        }
        assert!(
            held.is_empty(),
            "{kind}: {} keys never evictable",
            held.len()
        );
        p.clear();
        assert_eq!(p.victim(&mut |_| false), None, "{kind}: cleared yet evicts");
    }
}

/// A key that was removed, or never held, is never a victim.
#[test]
fn removed_keys_are_not_victims() {
    for (kind, mut p) in policies() {
        for k in 0..10u32 {
            p.insert(&k, 1, None);
        }
        for k in 0..5u32 {
            p.remove(&k);
        }
        p.touch(&42, None);
        let mut out: Vec<u32> = std::iter::from_fn(|| p.victim(&mut |_| false)).collect();
        out.sort();
        assert_eq!(out, (5..10).collect::<Vec<_>>(), "{kind}");
    }
}

#[test]
fn lru_evicts_the_least_recently_used() {
    let mut p = PolicyKind::Lru.build::<u32>().unwrap();
    for k in 0..4 {
        p.insert(&k, 1, None);
    }
    p.touch(&0, None);
    let order: Vec<u32> = std::iter::from_fn(|| p.victim(&mut |_| false)).collect();
    assert_eq!(order, vec![1, 2, 3, 0]);
}

/// Sampled LRU evicts old keys: of 10,000 keys, the half read again after all were stored
/// loses almost none of the first 2,000 victims, the half not read loses the rest.
#[test]
fn sampled_evicts_keys_not_used_for_long() {
    let mut p = PolicyKind::Sampled.build::<u32>().unwrap();
    for k in 0..10_000u32 {
        p.insert(&k, 1, None);
    }
    for k in 0..5_000u32 {
        p.touch(&k, None);
    }
    let victims: Vec<u32> = (0..2_000)
        .map(|_| p.victim(&mut |_| false).unwrap())
        .collect();
    let recent = victims.iter().filter(|&&k| k < 5_000).count();
    assert!(recent <= 20, "{recent} of 2,000 victims were read recently");
    let distinct: HashSet<u32> = victims.iter().copied().collect();
    assert_eq!(distinct.len(), 2_000, "each victim goes once");
}

/// The 32-bit clock running out keeps the order of uses: keys used before it ran out are
/// still older than keys used after (a clock that wrapped to 0 made the newest use the oldest).
#[test]
fn sampled_keeps_the_order_of_uses_when_its_clock_runs_out() {
    let mut table = crate::SampledTable::<u32, ()>::default();
    for k in 0..8u32 {
        table.insert(k, ());
    }
    table.set_clock(u32::MAX - 4);
    for k in 0..8u32 {
        // Uses 0 to 3 before the clock runs out, 4 to 7 after.
        table.touch(&k);
    }
    let order: Vec<u32> = std::iter::from_fn(|| table.victim(&mut |_, _| false))
        .map(|(k, ())| k)
        .collect();
    assert_eq!(order, (0..8).collect::<Vec<u32>>(), "oldest use first");
}

/// With every key but one protected, that one is found (after the samples found none).
#[test]
fn sampled_finds_the_one_unprotected_key() {
    let mut table = crate::SampledTable::<u32, bool>::default();
    for k in 0..1_000u32 {
        table.insert(k, k != 777);
    }
    assert_eq!(table.victim(&mut |_, &pinned| pinned), Some((777, false)));
    assert_eq!(table.victim(&mut |_, &pinned| pinned), None);
    assert_eq!(table.len(), 999);
    assert_eq!(table.remove(&5), Some(true));
    assert_eq!(
        table.get(&999),
        Some(&true),
        "the slot moved into 5's place is found"
    );
    assert_eq!(table.drain().count(), 998);
    assert!(table.is_empty());
}

/// A scan of keys used once, longer than the cache, does not flush keys read twice before:
/// the frequency-aware policies keep them where LRU lets every one go.
#[test]
fn a_scan_does_not_flush_keys_read_before() {
    for kind in [
        PolicyKind::Lru,
        PolicyKind::Sieve,
        PolicyKind::S3fifo,
        PolicyKind::Arc,
        PolicyKind::Prefix,
        PolicyKind::Lfu,
    ] {
        let mut p = kind.build::<u32>().unwrap();
        let mut held = HashSet::new();
        for k in 0..10u32 {
            p.insert(&k, 1, None);
            held.insert(k);
        }
        for _ in 0..2 {
            for k in 0..10u32 {
                p.touch(&k, None);
            }
        }
        for k in 100..130u32 {
            p.insert(&k, 1, None);
            held.insert(k);
            while held.len() > 20 {
                let v = p.victim(&mut |_| false).unwrap();
                held.remove(&v);
            }
        }
        let kept = (0..10u32).filter(|k| held.contains(k)).count();
        if kind == PolicyKind::Lru {
            assert_eq!(kept, 0, "lru");
        } else {
            assert!(kept >= 5, "{kind}: kept {kept} of the 10 read keys");
        }
    }
}

/// LFU counts a key's requests also while it is not held: a key read often, removed and
/// stored again outlives keys used once that came after it (with counts kept only while held
/// it would tie with them, and go first as the least recent).
#[test]
fn lfu_remembers_counts_past_eviction() {
    let mut p = PolicyKind::Lfu.build::<u32>().unwrap();
    p.insert(&7, 1, None);
    p.touch(&7, None);
    p.touch(&7, None);
    p.remove(&7);
    p.insert(&7, 1, None);
    let mut held: HashSet<u32> = [7].into();
    for k in 100..200u32 {
        p.insert(&k, 1, None);
        held.insert(k);
        while held.len() > 4 {
            let v = p.victim(&mut |_| false).unwrap();
            held.remove(&v);
        }
    }
    assert!(held.contains(&7), "the often-read key went: {held:?}");
    // Still evictable: it goes once the others are protected.
    assert_eq!(p.victim(&mut |k| *k != 7), Some(7));
}

/// Counts outlive the sketch's growth: a key counted before many more keys were held, and
/// read again after the sketch grew, keeps its lead over newer keys used once.
#[test]
fn lfu_keeps_held_counts_when_its_sketch_grows() {
    let mut p = crate::Lfu::default();
    p.insert(&0u32, 1, None);
    for _ in 0..5 {
        p.touch(&0, None);
    }
    for k in 1..20_000u32 {
        p.insert(&k, 1, None);
    }
    p.touch(&0, None);
    for k in 20_000..20_010u32 {
        p.insert(&k, 1, None);
    }
    // Only key 0 and the ten newest may go: a newest one does.
    let victim = p.victim(&mut |k| *k != 0 && *k < 20_000);
    assert_eq!(
        victim,
        Some(20_000),
        "key 0 lost its count as the sketch grew"
    );
}

/// The prefix policy cuts a chain from its tail: the head goes last, though it was used first.
#[test]
fn prefix_evicts_a_chain_from_its_tail() {
    let mut p = PolicyKind::Prefix.build::<u32>().unwrap();
    let mut prev = None;
    for k in 0..5u32 {
        p.insert(&k, 1, prev.as_ref());
        prev = Some(k);
    }
    let order: Vec<u32> = std::iter::from_fn(|| p.victim(&mut |_| false)).collect();
    assert_eq!(order, vec![4, 3, 2, 1, 0]);
    // LRU, the same batch: the head first, which wastes the whole chain.
    let mut lru = PolicyKind::Lru.build::<u32>().unwrap();
    for k in 0..5u32 {
        lru.insert(&k, 1, None);
    }
    assert_eq!(lru.victim(&mut |_| false), Some(0));
}

/// A root shared by many chains outlives their tails, and a protected leaf does not let its
/// parent go first.
#[test]
fn prefix_keeps_a_shared_root_and_respects_protection() {
    let mut p = PolicyKind::Prefix.build::<u32>().unwrap();
    p.insert(&0, 1, None);
    for branch in 1..=3u32 {
        p.touch(&0, None);
        p.insert(&(branch * 10), 1, Some(&0));
    }
    let mut keep = |k: &u32| *k == 30;
    assert_eq!(p.victim(&mut keep), Some(10));
    assert_eq!(p.victim(&mut keep), Some(20));
    // Only 0 (a parent) and 30 (protected) are left: the parent goes rather than nothing.
    assert_eq!(p.victim(&mut keep), Some(0));
    assert_eq!(p.victim(&mut keep), None);
}

/// Radix (leaf-first LRU) cuts the least recently used chain from its tail, then the next.
#[test]
fn radix_evicts_the_least_recent_chain_from_its_tail() {
    let mut p = PolicyKind::Radix.build::<u32>().unwrap();
    for head in [0u32, 10] {
        let mut prev = None;
        for k in head..head + 3 {
            p.insert(&k, 1, prev.as_ref());
            prev = Some(k);
        }
    }
    for k in 0..3u32 {
        p.touch(&k, k.checked_sub(1).as_ref());
    }
    let order: Vec<u32> = std::iter::from_fn(|| p.victim(&mut |_| false)).collect();
    assert_eq!(order, vec![12, 11, 10, 2, 1, 0]);
}

/// Requests `keys` one by one on a cache of `room` keys ordered by `p`; returns the hits.
fn hits_of(p: &mut dyn Policy<u32>, keys: &[u32], room: usize) -> usize {
    let mut held = HashSet::new();
    let mut hits = 0;
    for k in keys {
        if held.contains(k) {
            hits += 1;
            p.touch(k, None);
            continue;
        }
        p.insert(k, 1, None);
        held.insert(*k);
        while held.len() > room {
            held.remove(&p.victim(&mut |_| false).unwrap());
        }
    }
    hits
}

/// A working set sliding forward rewards recency: `auto` stays LRU, victim for victim.
#[test]
fn auto_is_lru_where_recency_wins() {
    let mut g = Gen(0x2545_f491_4f6c_dd1d);
    let keys: Vec<u32> = (0..40_000u32).map(|i| i / 8 + g.below(64) as u32).collect();
    let lru = hits_of(&mut *PolicyKind::Lru.build().unwrap(), &keys, 48);
    let prefix = hits_of(&mut *PolicyKind::Prefix.build().unwrap(), &keys, 48);
    let mut auto = crate::Auto::default();
    let got = hits_of(&mut auto, &keys, 48);
    assert!(
        prefix < lru,
        "the stream should favour LRU: {prefix} >= {lru}"
    );
    assert_eq!(got, lru, "auto {got}, lru {lru}");
    assert_eq!(auto.leader(), crate::Expert::Lru);
}

/// Hot keys among a stream of keys used once reward frequency: `auto` follows `prefix` and
/// beats LRU.
#[test]
fn auto_follows_prefix_where_frequency_wins() {
    let mut g = Gen(0x9e37_79b9_7f4a_7c15);
    let mut next_cold = 1_000u32;
    let keys: Vec<u32> = (0..40_000)
        .map(|_| {
            if g.below(2) == 0 {
                g.below(60) as u32
            } else {
                next_cold += 1;
                next_cold
            }
        })
        .collect();
    let lru = hits_of(&mut *PolicyKind::Lru.build().unwrap(), &keys, 60);
    let prefix = hits_of(&mut *PolicyKind::Prefix.build().unwrap(), &keys, 60);
    let mut auto = crate::Auto::default();
    let got = hits_of(&mut auto, &keys, 60);
    assert!(
        prefix > lru,
        "the stream should favour prefix: {prefix} <= {lru}"
    );
    assert!(
        got > lru + (prefix - lru) * 9 / 10,
        "auto {got}, lru {lru}, prefix {prefix}"
    );
    assert_ne!(auto.leader(), crate::Expert::Lru);
}

/// [`hits_of`], counting the hits of each phase apart: `phases` are the keys' end indices.
fn hits_by_phase(
    p: &mut dyn Policy<u32>,
    keys: &[u32],
    room: usize,
    phases: &[usize],
) -> Vec<usize> {
    let mut held = HashSet::new();
    let mut hits = vec![0; phases.len()];
    for (i, k) in keys.iter().enumerate() {
        if held.contains(k) {
            hits[phases.iter().position(|&end| i < end).unwrap_or(0)] += 1;
            p.touch(k, None);
            continue;
        }
        p.insert(k, 1, None);
        held.insert(*k);
        while held.len() > room {
            held.remove(&p.victim(&mut |_| false).unwrap());
        }
    }
    hits
}

/// Skewed reuse of 200 warm keys among keys used once (chat traffic), then a working set
/// sliding forward over new keys: frequency wins the first phase, recency the second.
fn two_regimes() -> (Vec<u32>, Vec<usize>) {
    let mut g = Gen(0x2545_f491_4f6c_dd1d);
    let mut keys = Vec::new();
    let mut cold = 1_000_000u32;
    for _ in 0..60_000 {
        if g.below(3) == 0 {
            // Key k of the warm set is drawn with weight about 1 / (k + 1).
            let r = g.below(1 << 20) as f64 / (1u64 << 20) as f64;
            keys.push((200f64.powf(r) - 1.0) as u32);
        } else {
            cold += 1;
            keys.push(cold);
        }
    }
    let first = keys.len();
    keys.extend((0..60_000u32).map(|i| 10_000 + i / 8 + g.below(64) as u32));
    let phases = vec![first, keys.len()];
    (keys, phases)
}

/// A trace that changes regime half way: `auto` takes most of LFU's gain in the frequency
/// phase and then, where LFU's stale counts reuse nothing, nine tenths of what LRU reuses in
/// the recency phase (the rest is the time its simulations take to see the change).
#[test]
fn auto_follows_a_trace_that_changes_regime() {
    let (keys, phases) = two_regimes();
    let room = 60;
    let by = |kind: PolicyKind| hits_by_phase(&mut *kind.build().unwrap(), &keys, room, &phases);
    let (lru, lfu) = (by(PolicyKind::Lru), by(PolicyKind::Lfu));
    let mut auto = crate::Auto::default();
    let got = hits_by_phase(&mut auto, &keys, room, &phases);
    assert!(
        lfu[0] > lru[0] * 5 / 4,
        "frequency phase: lfu {lfu:?}, lru {lru:?}"
    );
    assert!(
        lru[1] > lfu[1] * 5 / 4,
        "recency phase: lfu {lfu:?}, lru {lru:?}"
    );
    assert!(
        got[0] > lru[0] + (lfu[0] - lru[0]) * 3 / 4,
        "frequency phase: auto {got:?}, lru {lru:?}, lfu {lfu:?}"
    );
    assert!(
        got[1] * 10 >= lru[1] * 9,
        "recency phase: auto {got:?}, lru {lru:?}, lfu {lfu:?}"
    );
    assert_eq!(auto.leader(), crate::Expert::Lru);
}

/// Each new key requested `uses` times, `gap` requests apart, new keys starting one per
/// request slot in between.
fn reused_at(gap: usize, uses: usize, keys: u32) -> Vec<u32> {
    let mut slots: Vec<Option<u32>> = Vec::new();
    for k in 0..keys {
        let mut at = slots
            .iter()
            .position(Option::is_none)
            .unwrap_or(slots.len());
        for _ in 0..uses {
            if slots.len() <= at {
                slots.resize(at + 1, None);
            }
            slots[at] = Some(k);
            at += gap;
        }
    }
    slots.into_iter().flatten().collect()
}

/// Keys used exactly twice, at a distance the cache covers: T2 fills with keys never used
/// again, and only ARC's target, moved toward T1 by hits in T1's ghosts, lets those go so the
/// second uses hit (with the target fixed T1 keeps a handful of keys and almost nothing hits).
#[test]
fn arc_adapts_its_target_to_a_recency_trace() {
    let keys = reused_at(30, 2, 5_000);
    let lru = hits_of(&mut *PolicyKind::Lru.build().unwrap(), &keys, 60);
    let arc = hits_of(&mut *PolicyKind::Arc.build().unwrap(), &keys, 60);
    assert!(lru > 4_500, "lru {lru}");
    assert!(arc * 10 >= lru * 8, "arc {arc}, lru {lru}");
}

/// Keys used three times, farther apart than the small FIFO reaches but within the cache: the
/// first use is evicted from small unread, the second comes back while remembered by the ghost
/// list and goes to main, the third hits there. Without ghosts every use would miss.
#[test]
fn s3fifo_admits_keys_its_ghosts_remember() {
    let keys = reused_at(40, 3, 3_000);
    let s3fifo = hits_of(&mut *PolicyKind::S3fifo.build().unwrap(), &keys, 100);
    assert!(s3fifo >= 2_700, "s3fifo {s3fifo} hits of 3000 third uses");
}

/// Keys used often long ago give way to a new working set: the aging floor rises with each
/// victim until new keys outrank the stale ones, and the new set reuses at least a third of
/// what LRU does. Without the floor the stale keys stay for good and the new set, cycling
/// through the room left, never hits.
#[test]
fn prefix_ages_out_keys_used_often_long_ago() {
    let old = (0..50).flat_map(|_| 0..40u32);
    let new = (0..30).flat_map(|_| 1_000..1_060u32);
    let keys: Vec<u32> = old.chain(new).collect();
    let phases = [40 * 50, keys.len()];
    let lru = hits_by_phase(&mut *PolicyKind::Lru.build().unwrap(), &keys, 60, &phases);
    let prefix = hits_by_phase(
        &mut *PolicyKind::Prefix.build().unwrap(),
        &keys,
        60,
        &phases,
    );
    assert!(prefix[1] * 3 >= lru[1], "prefix {prefix:?}, lru {lru:?}");
}

/// An LFU that keeps no order until asked for a victim (as `auto` keeps it while another
/// order leads) names the same victims as one that keeps it all along.
#[test]
fn lfu_builds_the_same_order_when_asked_late() {
    let mut g = Gen(0x5851_f42d_4c95_7f2d);
    let (mut kept, mut late) = (crate::Lfu::default(), crate::Lfu::unordered());
    for round in 0..50 {
        for _ in 0..400 {
            let key = g.below(500) as u32;
            for p in [&mut kept, &mut late] {
                p.insert(&key, 1, None);
            }
        }
        let a: Vec<u32> = (0..20)
            .filter_map(|_| kept.victim(&mut |k| k % 7 == 0))
            .collect();
        let b: Vec<u32> = (0..20)
            .filter_map(|_| late.victim(&mut |k| k % 7 == 0))
            .collect();
        assert_eq!(a, b, "round {round}");
        late.unorder();
    }
}
