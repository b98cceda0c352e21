//! What an index entry costs in memory, held to its documentation.

use super::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

/// The system allocator, counting the bytes live on the heap: a measure that, unlike the
/// resident set, no other process or page cache moves.
struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Heap bytes per page of an index of `PAGES` 64-character keys under `policy`, in its
/// exact order up to `ordered` pages.
fn per_page(policy: PolicyKind, ordered: usize, prefix: &str) -> f64 {
    const PAGES: usize = 500_000;
    let before = LIVE.load(Relaxed);
    let mut idx = PageIndex::new(policy).unwrap().ordered_up_to(ordered);
    for i in 0..PAGES {
        let hash = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let key = format!("{prefix}{hash:064x}");
        idx.insert(PageKey::new(key).unwrap(), 65536, Some(i as u32), None);
    }
    assert_eq!(idx.pages(), PAGES);
    let per_page = (LIVE.load(Relaxed) - before) as f64 / PAGES as f64;
    println!(
        "page index, {policy}, ordered up to {ordered} pages, keys {prefix:?} + 64 hex \
         digits: {per_page:.0} heap bytes per page ({PAGES} pages)"
    );
    per_page
}

/// The documented cost (module documentation), counted as heap bytes the index holds,
/// keys included. Alone in a process of its own, so no other test allocates meanwhile.
#[test]
fn index_costs_what_its_documentation_says() {
    if !tier_tests::fd::in_own_process() {
        return;
    }
    let default = per_page(PolicyKind::default(), ORDERED_PAGES, "");
    assert!(default <= 66.0, "default: {default} bytes per page");
    // As the SGLang adapter names pages: a namespace, then the block's digest.
    let named = per_page(
        PolicyKind::default(),
        ORDERED_PAGES,
        "sgl-0123456789abcdef-",
    );
    assert!(
        named <= 66.0,
        "default, namespaced keys: {named} bytes per page"
    );
    let auto = per_page(PolicyKind::Auto, usize::MAX, "");
    assert!(auto < 680.0, "auto, ordered: {auto} bytes per page");
    let lru = per_page(PolicyKind::Lru, usize::MAX, "");
    assert!(lru < 210.0, "lru, ordered: {lru} bytes per page");
    let sampled = per_page(PolicyKind::Sampled, ORDERED_PAGES, "");
    assert!(sampled <= 66.0, "sampled: {sampled} bytes per page");
}
