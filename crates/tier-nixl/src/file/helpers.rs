//! The helper threads that move parts of big batches beside the calling thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The threads that move the other parts of big batches while the calling thread moves the
/// first: started once, one per core, kept for the process (a thread started per batch often
/// began on its caller's core, and after an idle pause ran the batch up to half again slower).
struct Helpers {
    pool: rayon::ThreadPool,
    /// Helpers running no part now. A part goes to a helper only by claiming one, so it never
    /// queues behind other calls' parts (one may be a transfer stuck until its timeout).
    idle: AtomicUsize,
}

/// Gives a claimed helper back when its part ends, however it ends.
struct Claimed<'a>(&'a AtomicUsize);

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

impl Helpers {
    /// The process's helpers; `None` if none could be started. A child forked from a process
    /// that started them starts its own: the parent's threads do not cross a fork (a part
    /// given to them would wait for ever), and their pool is left untouched, never dropped.
    fn get() -> Option<&'static Helpers> {
        static HELPERS: Mutex<Option<(u32, &'static Option<Helpers>)>> = Mutex::new(None);
        let pid = std::process::id();
        let mut held = HELPERS.lock().unwrap_or_else(|e| e.into_inner());
        match *held {
            Some((owner, helpers)) if owner == pid => helpers.as_ref(),
            _ => {
                let helpers: &'static Option<Helpers> = Box::leak(Box::new(Self::start()));
                *held = Some((pid, helpers));
                helpers.as_ref()
            }
        }
    }

    fn start() -> Option<Helpers> {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|_| "kvtier-io".into())
            .build()
            .ok()?;
        Some(Helpers {
            pool,
            idle: AtomicUsize::new(threads),
        })
    }

    /// Claims an idle helper, if one is.
    fn claim(&self) -> Option<Claimed<'_>> {
        self.idle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .ok()
            .map(|_| Claimed(&self.idle))
    }
}

/// Pages of a batch worth a thread of their own.
pub(super) const SPLIT_PAGES: usize = 32;

/// Bytes of a batch worth a thread of their own: the page cache takes or gives a page's bytes
/// at memory speed, a core's worth each (writes until the kernel throttles writers, then each
/// writer waits its turn).
pub(super) const SPLIT_BYTES: usize = 4 << 20;

/// The parts a batch of `pages` pages of `bytes` bytes in all is split in to run on as many
/// threads: one per [`SPLIT_PAGES`] pages or [`SPLIT_BYTES`] bytes, whichever makes more, at
/// least one and at most one per lane (and per page).
pub(super) fn split_parts(pages: usize, bytes: usize, lanes: usize) -> usize {
    (pages / SPLIT_PAGES)
        .max(bytes / SPLIT_BYTES)
        .clamp(1, lanes.max(1))
        .min(pages.max(1))
}

/// Runs `first` on the calling thread while other threads run `others`, and returns when all
/// are done: `first`'s result, and each other's or why it has none (it panicked or could not
/// run). Each other part runs on an idle helper, or on a thread of its own when every helper
/// is busy; without helpers, after `first`, here. So a call waits only for its own parts.
pub(super) fn run_split<T: Send, F: FnOnce() -> T + Send>(
    first: impl FnOnce() -> T,
    others: Vec<F>,
) -> (T, Vec<Result<T, String>>) {
    let Some(helpers) = Helpers::get() else {
        return (first(), others.into_iter().map(|f| Ok(f())).collect());
    };
    let caught = |f: F| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .map_err(|_| "a kvtier-io thread panicked".to_string())
    };
    let mut results: Vec<Option<Result<T, String>>> = others.iter().map(|_| None).collect();
    let first = std::thread::scope(|own_threads| {
        helpers.pool.in_place_scope(|scope| {
            for (f, out) in others.into_iter().zip(results.iter_mut()) {
                match helpers.claim() {
                    Some(claimed) => scope.spawn(move |_| {
                        let _claimed = claimed;
                        *out = Some(caught(f));
                    }),
                    None => {
                        let spawned = std::thread::Builder::new()
                            .name("kvtier-io-extra".into())
                            .spawn_scoped(own_threads, move || *out = Some(caught(f)));
                        if let Err(e) = spawned {
                            tracing::warn!(error = %e, "could not start a thread for part of a batch");
                        }
                    }
                }
            }
            first()
        })
    });
    let others = results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err("no kvtier-io thread could run it".to_string())))
        .collect();
    (first, others)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::{mpsc, Arc, Mutex};
    use std::time::{Duration, Instant};

    /// The tests share the process's helpers: one at a time, so each knows who holds them.
    static HELPERS_IN_USE: Mutex<()> = Mutex::new(());

    /// Every helper held by another call's part that does not end (as a transfer stuck until
    /// its timeout would): a new call's parts still run at once, on threads of their own.
    #[test]
    fn a_part_never_waits_behind_busy_helpers() {
        let _alone = HELPERS_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
        let helpers = Helpers::get().expect("helper threads");
        let release = Arc::new(AtomicBool::new(false));
        let stuck = |release: Arc<AtomicBool>| {
            std::thread::spawn(move || {
                let hold = || {
                    let until = Instant::now() + Duration::from_secs(60);
                    while !release.load(Ordering::Acquire) && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                };
                run_split(|| (), vec![hold]);
            })
        };
        let mut holders = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while helpers.idle.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            holders.push(stuck(Arc::clone(&release)));
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            helpers.idle.load(Ordering::Acquire),
            0,
            "every helper is held"
        );

        let (done, answered) = mpsc::channel();
        std::thread::spawn(move || {
            let (first, others) = run_split(|| 1, vec![(|| 2) as fn() -> i32, || 3]);
            let _ = done.send((first, others));
        });
        let answer = answered.recv_timeout(Duration::from_secs(5));
        release.store(true, Ordering::Release);
        for holder in holders {
            holder.join().expect("a holder ends once released");
        }
        let (first, others) = answer.expect("the call ran while every helper was busy");
        assert_eq!(first, 1);
        assert_eq!(others, vec![Ok(2), Ok(3)]);
    }

    #[test]
    fn a_panicking_part_is_an_error_for_its_pages_only() {
        let _alone = HELPERS_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
        let parts: Vec<Box<dyn FnOnce() -> u32 + Send>> =
            vec![Box::new(|| 2), Box::new(|| panic!("a part fails"))];
        let (first, others) = run_split(|| 1, parts);
        assert_eq!(first, 1);
        assert_eq!(others[0], Ok(2));
        assert!(others[1].as_ref().is_err_and(|e| e.contains("panicked")));
    }

    /// A batch is split by pages or by bytes, whichever makes more parts, never into more
    /// than the lanes or the pages: a load of 16 LMCache chunks of 2 MiB runs on both lanes
    /// (reads were split only from 32 pages up, and such a load ran on one thread).
    #[test]
    fn a_batch_is_split_by_pages_or_bytes_up_to_the_lanes() {
        const MIB: usize = 1 << 20;
        assert_eq!(split_parts(16, 32 * MIB, 2), 2, "16 chunks of 2 MiB");
        assert_eq!(split_parts(1_000, 4_000 * 1024, 2), 2, "many small pages");
        assert_eq!(split_parts(8, 8 * 4096, 2), 1, "a small batch");
        assert_eq!(split_parts(1, 64 * MIB, 4), 1, "one page is one part");
        assert_eq!(split_parts(16, 32 * MIB, 8), 8, "up to one part per lane");
        assert_eq!(split_parts(0, 0, 2), 1);
    }
}
