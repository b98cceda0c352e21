//! The index: eviction order, pins, the turn to sampling, bytes.

use super::*;

fn k(s: &str) -> PageKey {
    PageKey::new(s).unwrap()
}

#[test]
fn evicts_least_recent_unpinned_first() {
    let mut idx = PageIndex::default();
    for name in ["a", "b", "c", "d"] {
        idx.insert(k(name), 10, None, None);
    }
    idx.touch(&k("a"), None);
    idx.pin(&k("b"));
    assert_eq!(idx.evict_to(20), vec![k("c"), k("d")]);
    assert_eq!(idx.bytes(), 20);
    assert!(idx.contains(&k("a")) && idx.contains(&k("b")));
    idx.unpin(&k("b"));
    assert_eq!(idx.evict_to(10), vec![k("b")]);
}

/// Past its ordered pages the index turns sampled, keeping what each page was (length,
/// generation, checksum, pins) and the policy's order: the pages it evicts first are those
/// the policy held least recently used, never a pinned one.
#[test]
fn past_its_ordered_pages_the_index_turns_sampled_and_keeps_the_order() {
    let mut idx = PageIndex::new(PolicyKind::Lru)
        .unwrap()
        .ordered_up_to(1_000);
    let key = |i: u64| k(&format!("{:064x}", i * 7919));
    for i in 0..1_000 {
        idx.insert(key(i), 10, Some(i as u32), None);
    }
    assert!(idx.ordered());
    // The first half read again: the second half is now the least recently used.
    for i in 0..500 {
        idx.touch(&key(i), None);
    }
    idx.pin(&key(999));
    let generation = idx.generation(&key(3));
    idx.insert(k("not-a-digest"), 10, None, None);
    assert!(!idx.ordered(), "1,001 pages: sampled");
    assert_eq!((idx.pages(), idx.bytes()), (1_001, 10_010));
    assert_eq!(idx.checksum(&key(3)), Some(3));
    assert_eq!(idx.generation(&key(3)), generation);
    let victims = idx.evict_to(10_010 - 2_000);
    assert_eq!(victims.len(), 200);
    let recent = victims
        .iter()
        .filter(|v| (0..500).any(|i| **v == key(i)))
        .count();
    assert!(
        recent <= 2,
        "{recent} of 200 victims were read after the others"
    );
    assert!(!victims.contains(&key(999)), "a pinned page stays");
    assert!(idx.contains(&k("not-a-digest")));
    assert_eq!(idx.drain().len(), 801);
}

/// An open whose scan found more pages than the index keeps in order turns it sampled
/// before loading them; fewer leave it ordered.
#[test]
fn an_index_expecting_more_than_its_ordered_pages_turns_sampled_first() {
    let mut idx = PageIndex::new(PolicyKind::Auto).unwrap().ordered_up_to(100);
    for name in ["a", "b", "c"] {
        idx.insert(k(name), 10, None, None);
    }
    idx.expect(97);
    assert!(idx.ordered(), "100 pages fit the order");
    idx.expect(98);
    assert!(!idx.ordered(), "101 would not");
    assert_eq!((idx.pages(), idx.bytes()), (3, 30));
    assert_eq!(idx.evict_to(20), vec![k("a")], "the oldest goes first");
}

#[test]
fn replacing_a_page_updates_bytes() {
    let mut idx = PageIndex::default();
    idx.insert(k("a"), 10, Some(1), None);
    idx.insert(k("a"), 4, None, None);
    assert_eq!(
        idx.checksum(&k("a")),
        None,
        "a replaced page's checksum is the new file's"
    );
    assert_eq!((idx.bytes(), idx.pages()), (4, 1));
    assert!(idx.remove(&k("a")));
    assert_eq!(idx.bytes(), 0);
}

/// A sampled index keeps a key that is no digest whole only while it holds its page: removed,
/// evicted or cleared, the key is let go (an index that kept them grew without bound under
/// such keys), and the keys it still holds come back as they were.
#[test]
fn a_sampled_index_lets_go_of_keys_kept_whole_with_their_pages() {
    let mut idx = PageIndex::new(PolicyKind::Sampled).unwrap();
    let kept = |idx: &PageIndex| match &idx.store {
        Store::Sampled { packer, .. } => packer.kept_whole(),
        Store::Ordered { .. } => unreachable!("sampled from the start"),
    };
    for round in 0..3 {
        for i in 0..1_000 {
            idx.insert(k(&format!("page-{round}-{i}")), 10, None, None);
        }
        for i in 0..300 {
            assert!(idx.remove(&k(&format!("page-{round}-{i}"))));
        }
        let evicted = idx.evict_to(10 * 200);
        assert_eq!(evicted.len(), 500);
        assert!(evicted.iter().all(|key| key.as_str().starts_with("page-")));
        assert_eq!(kept(&idx), 200, "round {round}: only the pages held");
        let held = idx.drain();
        assert_eq!(held.len(), 200);
        let prefix = format!("page-{round}-");
        assert!(held.iter().all(|key| key.as_str().starts_with(&prefix)));
        assert_eq!(kept(&idx), 0, "round {round}: none once cleared");
    }
}

/// Pins and the checksum's mark share 16 bits: pins past their 15 bits saturate rather than
/// reach the mark, a replaced entry keeps its pins and takes the new checksum's mark.
#[test]
fn an_entrys_pins_and_checksum_mark_keep_apart() {
    for policy in [PolicyKind::Lru, PolicyKind::Sampled] {
        let mut idx = PageIndex::new(policy).unwrap();
        let a = k("a");
        idx.insert(a.clone(), 10, None, None);
        for _ in 0..40_000 {
            idx.pin(&a);
        }
        assert_eq!(idx.checksum(&a), None, "{policy}: pins reached the mark");
        idx.insert(a.clone(), 10, Some(7), None);
        assert_eq!(idx.checksum(&a), Some(7), "{policy}");
        idx.insert(a.clone(), 10, None, None);
        assert_eq!(idx.checksum(&a), None, "{policy}: the old mark was kept");
        assert!(idx.evict_to(0).is_empty(), "{policy}: a pinned page went");
        let generation = idx.generation(&a).unwrap();
        idx.learn_checksum(&a, generation, 9);
        for _ in 0..40_000 {
            idx.unpin(&a);
        }
        assert_eq!(idx.checksum(&a), Some(9), "{policy}: unpins took the mark");
        assert_eq!(idx.evict_to(0), vec![a], "{policy}");
    }
}
