//! What the benchmarks share: a workload of distinct pages, and batched put/get through a tier.

use tier_core::{Bytes, Lookup, Page, PageKey, ReadSlot, StorageTier};

/// Distinct pages of one size.
pub struct Workload {
    /// Bytes per page.
    pub page: usize,
    /// Keys, one per page.
    pub keys: Vec<PageKey>,
    /// Page bytes.
    pub data: Vec<Bytes>,
}

impl Workload {
    /// `total` bytes of distinct pages; `tag` makes a run's keys fresh.
    pub fn new(page: usize, total: usize, tag: u64) -> Self {
        let n = total / page;
        let keys: Vec<PageKey> = (0..n)
            .map(|i| {
                let h = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                PageKey::new(format!("{tag:08x}{h:056x}")).unwrap()
            })
            .collect();
        let data = (0..n)
            .map(|i| {
                Bytes::from(
                    (0..page)
                        .map(|b| (b as u64 * 31 + i as u64) as u8)
                        .collect::<Vec<u8>>(),
                )
            })
            .collect();
        Self { page, keys, data }
    }
}

/// Puts every page, `batch` per call; every put must succeed.
pub async fn put_batches(tier: &dyn StorageTier, w: &Workload, batch: usize) {
    for (keys, data) in w.keys.chunks(batch).zip(w.data.chunks(batch)) {
        let pages: Vec<Page<'static>> = keys
            .iter()
            .zip(data)
            .map(|(k, d)| Page::new(k.clone(), d.clone()))
            .collect();
        for r in tier.put(&pages).await {
            r.unwrap();
        }
    }
}

/// Buffers for `batch` pages, touched so that no page fault lands in a timed read.
pub fn buffers(w: &Workload, batch: usize) -> Vec<Vec<u8>> {
    vec![vec![1u8; w.page]; batch]
}

/// Gets every page, one batch per call into `bufs` (one buffer per page of a batch); every get
/// must hit, and the last page read is compared.
pub async fn get_batches(tier: &dyn StorageTier, w: &Workload, bufs: &mut [Vec<u8>]) {
    let batch = bufs.len();
    for keys in w.keys.chunks(batch) {
        let mut slots: Vec<ReadSlot<'_>> = keys
            .iter()
            .zip(bufs.iter_mut())
            .map(|(k, b)| ReadSlot::new(k.clone(), b))
            .collect();
        for r in tier.get(&mut slots).await {
            assert_eq!(r.unwrap(), Lookup::Hit);
        }
    }
    let last = w.keys.len() - 1;
    assert_eq!(bufs[last % batch][..], w.data[last][..]);
}
