use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of a tier's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Reads that found their page.
    pub hits: u64,
    /// Reads that did not.
    pub misses: u64,
    /// Pages stored.
    pub puts: u64,
    /// Pages removed on request.
    pub removes: u64,
    /// Bytes returned by hits.
    pub bytes_read: u64,
    /// Bytes stored.
    pub bytes_written: u64,
    /// Per-key or per-call failures.
    pub errors: u64,
    /// Pages the tier let go on its own (capacity, expiry).
    pub evictions: u64,
    /// Bytes currently held, where the tier tracks it.
    pub resident_bytes: Option<u64>,
}

/// Lock-free counters a tier updates as it works; [`StatsRecorder::snapshot`] reads them.
#[derive(Debug, Default)]
pub struct StatsRecorder {
    hits: AtomicU64,
    misses: AtomicU64,
    puts: AtomicU64,
    removes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    errors: AtomicU64,
    evictions: AtomicU64,
}

impl StatsRecorder {
    /// A read found its page of `bytes` bytes.
    pub fn hit(&self, bytes: usize) {
        self.hits.fetch_add(1, Relaxed);
        self.bytes_read.fetch_add(bytes as u64, Relaxed);
    }
    /// A read did not find its page.
    pub fn miss(&self) {
        self.misses.fetch_add(1, Relaxed);
    }
    /// Counts one read's outcome: a hit of `bytes` bytes, a miss, or an error.
    pub fn get_result(&self, result: &crate::GetResult, bytes: usize) {
        match result {
            Ok(crate::Lookup::Hit) => self.hit(bytes),
            Ok(crate::Lookup::Miss) => self.miss(),
            Err(_) => self.errors(1),
        }
    }
    /// Turns a batch's per-slot outcomes into its results, counting each; a slot nothing
    /// answered gets an `Unavailable` error.
    pub fn settle_gets(
        &self,
        results: Vec<Option<crate::GetResult>>,
        slots: &[crate::ReadSlot<'_>],
    ) -> Vec<crate::GetResult> {
        results
            .into_iter()
            .zip(slots)
            .map(|(r, slot)| {
                let r = r.unwrap_or_else(|| {
                    Err(crate::TierError::Unavailable(
                        "page was not scheduled".into(),
                    ))
                });
                self.get_result(&r, slot.buf.len());
                r
            })
            .collect()
    }
    /// A page of `bytes` bytes was stored.
    pub fn put(&self, bytes: usize) {
        self.puts.fetch_add(1, Relaxed);
        self.bytes_written.fetch_add(bytes as u64, Relaxed);
    }
    /// A page was removed on request.
    pub fn removed(&self) {
        self.removes.fetch_add(1, Relaxed);
    }
    /// `n` operations failed.
    pub fn errors(&self, n: usize) {
        self.errors.fetch_add(n as u64, Relaxed);
    }
    /// A page was evicted.
    pub fn eviction(&self) {
        self.evictions.fetch_add(1, Relaxed);
    }
    /// Reads the counters; `resident_bytes` comes from the tier.
    pub fn snapshot(&self, resident_bytes: Option<u64>) -> TierStats {
        TierStats {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            puts: self.puts.load(Relaxed),
            removes: self.removes.load(Relaxed),
            bytes_read: self.bytes_read.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            errors: self.errors.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            resident_bytes,
        }
    }
}
