//! Room in a POSIX backend's pool of I/O requests. NIXL's POSIX plugin allocates a fixed
//! pool of them (`ios_pool_size`) and takes one per descriptor posted. One queued past the
//! pool's end fails the post and leaves the requests queued before it taken for good, never
//! submitted (every later transfer of that backend then fails; a later poll may submit them
//! into memory and files long given back). So every transfer takes room for its descriptors
//! here first, and gives it back only once NIXL has released the transfer; one that never
//! settles keeps its room for good, as it keeps its memory.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::NixlError;

/// NIXL's own bounds on `ios_pool_size` (0 takes its default, the largest).
const NIXL_MIN_POOL: usize = 64;
const NIXL_MAX_POOL: usize = 64 * 1024;

/// The pool a POSIX backend created with `ios_pool_size = value` has, as NIXL sizes it.
pub fn pool_size(value: Option<&str>) -> Result<usize, NixlError> {
    let asked = match value {
        None => 0,
        Some(v) => v.trim().parse::<usize>().map_err(|_| NixlError {
            call: "nixl_capi_create_backend",
            status: 0,
            detail: format!("ios_pool_size = {v:?} is not a count of I/O requests"),
        })?,
    };
    Ok(match asked {
        0 => NIXL_MAX_POOL,
        n => n.clamp(NIXL_MIN_POOL, NIXL_MAX_POOL),
    })
}

/// A backend's pool of I/O requests, as kvtier accounts for it.
#[derive(Debug)]
pub struct IoPool {
    size: usize,
    state: Mutex<Room>,
    room: Condvar,
}

/// Requests free now, and kept for good by transfers that never settled.
#[derive(Debug)]
struct Room {
    free: usize,
    kept: usize,
}

impl IoPool {
    /// A pool of `size` requests, all free.
    pub fn new(size: usize) -> Arc<Self> {
        Arc::new(Self {
            size,
            state: Mutex::new(Room {
                free: size,
                kept: 0,
            }),
            room: Condvar::new(),
        })
    }

    /// Its size.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Takes room for `n` requests, waiting up to `wait` for transfers to give theirs back;
    /// refused at once where no wait could give it (more than the pool, or more than what
    /// transfers that never settled left of it).
    pub fn take(self: &Arc<Self>, n: usize, wait: Duration) -> Result<IoRoom, NixlError> {
        let refused = |detail: String| NixlError {
            call: "post",
            status: 0,
            detail,
        };
        if n > self.size {
            return Err(refused(format!(
                "{n} descriptors in one posting are more than the backend's pool of {} I/O \
                 requests holds",
                self.size
            )));
        }
        let deadline = Instant::now() + wait;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while state.free < n {
            if self.size - state.kept < n {
                return Err(refused(format!(
                    "transfers that never finished keep {} of the backend's pool of {} I/O \
                     requests for good: no room for {n}",
                    state.kept, self.size
                )));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(refused(format!(
                    "no room for {n} I/O requests in the backend's pool of {} ({} free) {}",
                    self.size,
                    state.free,
                    if wait.is_zero() {
                        "now".to_string()
                    } else {
                        format!("after waiting {wait:?}: its transfers did not finish")
                    }
                )));
            }
            state = self
                .room
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        state.free -= n;
        Ok(IoRoom {
            pool: Some(Arc::clone(self)),
            n,
        })
    }

    fn give_back(&self, n: usize) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.free = (state.free + n).min(self.size - state.kept);
        self.room.notify_all();
    }

    fn keep(&self, n: usize) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.kept = (state.kept + n).min(self.size);
        // Waiters for room that can no longer come are refused now.
        self.room.notify_all();
    }

    /// Requests free now.
    #[cfg(test)]
    pub fn free(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .free
    }
}

/// Room taken in a pool, given back when dropped (see [`IoRoom::keep`]). Room of a backend
/// without a pool is nothing.
#[derive(Debug, Default)]
pub struct IoRoom {
    pool: Option<Arc<IoPool>>,
    n: usize,
}

impl IoRoom {
    /// Requests it holds room for.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether it holds room for none (a backend without a pool).
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Splits off room for `n` of its requests (all it has if fewer).
    pub fn split(&mut self, n: usize) -> IoRoom {
        let n = n.min(self.n);
        self.n -= n;
        IoRoom {
            pool: self.pool.clone(),
            n,
        }
    }

    /// Never gives its room back: NIXL may still hold the requests.
    pub fn keep(mut self) {
        if let Some(pool) = &self.pool {
            pool.keep(self.n);
        }
        self.n = 0;
    }
}

impl Drop for IoRoom {
    fn drop(&mut self) {
        if let (Some(pool), n @ 1..) = (&self.pool, self.n) {
            pool.give_back(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_sizes_follow_nixls_bounds() {
        assert_eq!(pool_size(None).unwrap(), 65_536);
        assert_eq!(pool_size(Some("0")).unwrap(), 65_536);
        assert_eq!(pool_size(Some("8")).unwrap(), 64);
        assert_eq!(pool_size(Some("8192")).unwrap(), 8_192);
        assert_eq!(pool_size(Some("1000000")).unwrap(), 65_536);
        assert!(pool_size(Some("many"))
            .unwrap_err()
            .detail
            .contains("ios_pool_size"));
    }

    #[test]
    fn room_is_given_back_on_drop_and_kept_when_kept() {
        let pool = IoPool::new(64);
        let mut room = pool.take(40, Duration::ZERO).unwrap();
        assert_eq!(pool.free(), 24);
        let part = room.split(10);
        assert_eq!((room.len(), part.len()), (30, 10));
        drop(part);
        assert_eq!(pool.free(), 34);
        room.keep();
        assert_eq!(pool.free(), 34, "kept room is never given back");
        // Room that no wait could give is refused at once.
        let start = Instant::now();
        let e = pool.take(40, Duration::from_secs(60)).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5), "refused at once");
        assert!(e.detail.contains("never finished"), "{e}");
        assert_eq!(pool.take(34, Duration::ZERO).unwrap().len(), 34);
    }

    #[test]
    fn a_take_past_the_pool_is_refused_at_once_and_a_full_pool_waits_a_bounded_time() {
        let pool = IoPool::new(64);
        let e = pool.take(65, Duration::from_secs(60)).unwrap_err();
        assert!(e.detail.contains("more than"), "{e}");
        let held = pool.take(60, Duration::ZERO).unwrap();
        let start = Instant::now();
        let e = pool.take(10, Duration::from_millis(50)).unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert!(e.detail.contains("did not finish"), "{e}");
        // Room given back by another thread wakes a waiter.
        let waiter = {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || pool.take(10, Duration::from_secs(30)).map(|r| r.len()))
        };
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        assert_eq!(waiter.join().unwrap().unwrap(), 10);
    }
}
