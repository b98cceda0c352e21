//! A shared prefix's bytes as one node knows them: each bucket's as last listed, plus what
//! this node put there since; and which buckets its next periodic listing looks at.
//!
//! A periodic listing (to see other nodes' puts) of a prefix whose every bucket holds pages
//! (about 1,500 pages or more: its whole listing takes a request per bucket) looks at a
//! window of buckets, not the whole prefix: as many as [`WINDOW_REQUESTS`] LIST requests cover (1,000 objects a request on S3,
//! as the last listing of each bucket counted them), the next window starting where the last
//! one ended. A bucket larger than that budget is listed alone and the next window waits the
//! longer, so a node's periodic listings cost about [`WINDOW_REQUESTS`] requests per `relist`
//! however much the prefix holds. An eviction lists the whole prefix, and so does a periodic
//! listing of a smaller prefix (one recursive listing: a request or two).

use std::time::{Duration, Instant};

use crate::objects::BUCKETS;

/// LIST requests one periodic listing spends, about.
pub(crate) const WINDOW_REQUESTS: u64 = 16;
/// Objects one LIST request returns at most (S3's page).
const PER_REQUEST: u64 = 1000;

/// One node's count of a shared prefix's bytes, bucket by bucket.
pub(crate) struct PrefixUsage {
    /// Each bucket's bytes as last listed.
    listed: Box<[u64]>,
    /// Each bucket's objects as last listed (the requests its next listing takes).
    objects: Box<[u64]>,
    /// Each bucket's bytes this node put since that listing.
    since: Box<[u64]>,
    /// When the last listing (whole or a window) ended; `None` before the first.
    listed_at: Option<Instant>,
    /// How many `relist` periods the next periodic listing waits (a window over budget).
    pace: f64,
    /// The first bucket of the next window.
    next: usize,
}

impl PrefixUsage {
    pub fn new() -> Self {
        Self {
            listed: vec![0; BUCKETS].into(),
            objects: vec![0; BUCKETS].into(),
            since: vec![0; BUCKETS].into(),
            listed_at: None,
            pace: 1.0,
            next: 0,
        }
    }

    /// The prefix's bytes as last listed, plus this node's puts since.
    pub fn bytes(&self) -> u64 {
        self.listed_bytes() + self.since.iter().sum::<u64>()
    }

    /// The prefix's bytes as last listed.
    pub fn listed_bytes(&self) -> u64 {
        self.listed.iter().sum()
    }

    /// Whether this node put anything since the buckets' last listings.
    pub fn wrote(&self) -> bool {
        self.since.iter().any(|&b| b > 0)
    }

    /// Counts `bytes` this node put in `bucket`.
    pub fn written(&mut self, bucket: usize, bytes: u64) {
        self.since[bucket] += bytes;
    }

    /// Takes `bytes` an eviction deleted from `bucket` off its listed bytes.
    pub fn freed(&mut self, bucket: usize, bytes: u64) {
        self.listed[bucket] = self.listed[bucket].saturating_sub(bytes);
    }

    /// Whether the prefix was ever listed.
    pub fn ever_listed(&self) -> bool {
        self.listed_at.is_some()
    }

    /// Whether a periodic listing is due: none yet, or the last is `relist` old (times the
    /// pace a large bucket set).
    pub fn stale(&self, relist: Duration) -> bool {
        self.listed_at
            .is_none_or(|at| at.elapsed() >= relist.mul_f64(self.pace))
    }

    /// This node's puts so far, per bucket: what a listing begun now may or may not hold.
    pub fn before(&self) -> Box<[u64]> {
        self.since.clone()
    }

    /// The buckets of the next periodic listing: from where the last ended, as many as
    /// [`WINDOW_REQUESTS`] requests cover (at least one); `None` where a bucket held no page
    /// when last listed (the whole prefix then lists in one recursive listing, cheaper).
    pub fn window(&self) -> Option<Vec<usize>> {
        if self.objects.contains(&0) {
            return None;
        }
        let mut window = Vec::new();
        let mut requests = 0;
        for b in (self.next..self.next + BUCKETS).map(|b| b % BUCKETS) {
            let cost = self.objects[b].div_ceil(PER_REQUEST).max(1);
            if !window.is_empty() && requests + cost > WINDOW_REQUESTS {
                break;
            }
            requests += cost;
            window.push(b);
        }
        Some(window)
    }

    /// Sets `buckets` from a listing of them that began when this node's puts were `before`:
    /// each bucket's bytes and objects as `pages` (bucket, bytes) of the listing say, and its
    /// puts since less those the listing may hold (an overestimate the next listing of it
    /// corrects, never a put lost from the count). A window moves the next one on.
    pub fn set_listed(
        &mut self,
        buckets: &[usize],
        pages: impl IntoIterator<Item = (usize, u64)>,
        before: &[u64],
        window: bool,
    ) {
        for &b in buckets {
            self.listed[b] = 0;
            self.objects[b] = 0;
            self.since[b] = self.since[b].saturating_sub(before[b]);
        }
        for (b, bytes) in pages {
            self.listed[b] += bytes;
            self.objects[b] += 1;
        }
        self.listed_at = Some(Instant::now());
        self.pace = 1.0;
        if window {
            let requests: u64 = buckets
                .iter()
                .map(|&b| self.objects[b].div_ceil(PER_REQUEST).max(1))
                .sum();
            self.pace = (requests as f64 / WINDOW_REQUESTS as f64).max(1.0);
            if let Some(&last) = buckets.last() {
                self.next = (last + 1) % BUCKETS;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Windows cover every bucket in turn, as many as the request budget allows; a bucket
    /// over the budget goes alone and the next listing waits the longer.
    #[test]
    fn windows_go_round_the_buckets_within_their_request_budget() {
        let mut usage = PrefixUsage::new();
        let before = usage.before();
        let all: Vec<usize> = (0..BUCKETS).collect();
        // 3,500 objects in bucket 20 (4 requests), 10 in every other.
        let pages = all
            .iter()
            .flat_map(|&b| std::iter::repeat_n((b, 1u64), if b == 20 { 3500 } else { 10 }));
        usage.set_listed(&all, pages, &before, false);
        let first = usage.window().unwrap();
        assert_eq!(first, (0..16).collect::<Vec<_>>());
        usage.set_listed(&first, first.iter().map(|&b| (b, 1)), &before, true);
        let second = usage.window().unwrap();
        assert_eq!(second, (16..29).collect::<Vec<_>>(), "bucket 20 costs 4");
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..40 {
            let w = usage.window().unwrap();
            seen.extend(w.iter().copied());
            usage.set_listed(&w, w.iter().map(|&b| (b, 1)), &before, true);
        }
        assert_eq!(seen.len(), BUCKETS, "every bucket is listed in turn");
        // One bucket of 40,000 objects: listed alone, and the next listing waits 2.5 periods.
        usage.set_listed(&[7], std::iter::repeat_n((7, 1), 40_000), &before, false);
        usage.next = 7;
        assert_eq!(usage.window(), Some(vec![7]));
        usage.set_listed(&[7], std::iter::repeat_n((7, 1), 40_000), &before, true);
        assert!((usage.pace - 2.5).abs() < 1e-9, "{}", usage.pace);
    }

    /// A prefix with an empty bucket is listed whole: a window would cost more than that.
    #[test]
    fn a_prefix_with_an_empty_bucket_is_listed_whole() {
        let mut usage = PrefixUsage::new();
        let before = usage.before();
        assert_eq!(usage.window(), None, "never listed");
        let all: Vec<usize> = (0..BUCKETS).collect();
        usage.set_listed(&all, (1..BUCKETS).map(|b| (b, 1)), &before, false);
        assert_eq!(usage.window(), None, "bucket 0 is empty");
        usage.set_listed(&all, (0..BUCKETS).map(|b| (b, 1)), &before, false);
        assert!(usage.window().is_some());
    }

    /// A listing keeps the puts it may have missed counted: those made after it began.
    #[test]
    fn a_listing_keeps_the_puts_made_while_it_ran() {
        let mut usage = PrefixUsage::new();
        usage.written(3, 100);
        let before = usage.before();
        usage.written(3, 50);
        usage.written(9, 70);
        usage.set_listed(&[3], [(3, 100)], &before, true);
        assert_eq!(usage.bytes(), 100 + 50 + 70);
        usage.freed(3, 40);
        assert_eq!(usage.listed_bytes(), 60);
    }
}
