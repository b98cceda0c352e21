//! One registration + one transfer per batch, with isolation: when a batch fails as a whole,
//! each item is retried alone so one bad page does not fail its neighbours.

use std::sync::Arc;
use std::time::Duration;

use tier_core::{PageBuf, ReadSlot, TierError};

use crate::nixl::{Backend, Held, Owned, Unsettled};

/// Why an attempt at moving some items failed.
#[derive(Debug)]
pub enum Failure {
    /// One item failed before the transfer (e.g. its file would not open).
    Item(usize, TierError),
    /// The registration or transfer failed as a whole, and nothing of it is in flight.
    Batch(String),
    /// The transfer may still touch the batch's memory (see [`Finished::Unsettled`]).
    ///
    /// [`Finished::Unsettled`]: crate::nixl::Finished::Unsettled
    Unsettled(Unsettled),
    /// A write of files failed while others of its writes may still be landing: those only
    /// read the batch's memory, so it may be reused, but the files must never be committed,
    /// and no retry may write them again.
    Abandoned(String),
}

pub use tier_folder::io::BatchOutcome;

/// The buffers of the slots marked in `wanted`, in slot order.
pub fn marked_bufs<'a, 'b>(
    slots: &'a mut [ReadSlot<'b>],
    wanted: &[bool],
) -> Vec<&'a mut PageBuf<'b>> {
    slots
        .iter_mut()
        .zip(wanted)
        .filter(|(_, w)| **w)
        .map(|(slot, _)| &mut slot.buf)
        .collect()
}

/// Moves items `0..n` with `attempt` (one registration + one transfer for the items it is
/// given); on a batch failure retries each item alone. `item_error` turns a batch failure
/// message into the error of one item.
pub fn move_isolating(
    n: usize,
    timeout: Duration,
    attempt: &mut dyn FnMut(&[usize]) -> Result<(), Failure>,
    item_error: &dyn Fn(usize, String) -> TierError,
) -> BatchOutcome {
    let mut results: Vec<Result<(), TierError>> = (0..n).map(|_| Ok(())).collect();
    let all: Vec<usize> = (0..n).collect();
    let poisoned = n > 0 && isolate(&all, timeout, attempt, item_error, &mut results);
    BatchOutcome { results, poisoned }
}

fn isolate(
    which: &[usize],
    timeout: Duration,
    attempt: &mut dyn FnMut(&[usize]) -> Result<(), Failure>,
    item_error: &dyn Fn(usize, String) -> TierError,
    results: &mut [Result<(), TierError>],
) -> bool {
    match attempt(which) {
        Ok(()) => false,
        Err(Failure::Item(i, e)) if which.len() == 1 => {
            results[i] = Err(e);
            false
        }
        Err(Failure::Batch(message)) if which.len() == 1 => {
            results[which[0]] = Err(item_error(which[0], message));
            false
        }
        Err(Failure::Abandoned(message)) => {
            for &i in which {
                results[i] = Err(item_error(i, message.clone()));
            }
            false
        }
        // No retry: the memory a retry would use may still be in use.
        Err(Failure::Unsettled(why)) => {
            for &i in which {
                results[i] = Err(match &why {
                    Unsettled::TimedOut => TierError::Timeout {
                        op: "NIXL transfer",
                        after: timeout,
                    },
                    Unsettled::Failed(e) => item_error(i, format!("transfer: {e}")),
                });
            }
            true
        }
        Err(_) => {
            let mut poisoned = false;
            for &i in which {
                poisoned |= isolate(&[i], timeout, attempt, item_error, results);
            }
            poisoned
        }
    }
}

/// Moves regions out of their own bytes: registers them (zero-copy) or, when NIXL refuses (the
/// same memory may be registered by a concurrent batch), a private copy. `send` gets each
/// region's address and what its transfers must hold. `owner` keeps the regions' bytes alive
/// (the tier's own pages, held with them by a transfer that never settles); `None` says they
/// are a caller's.
pub fn send_pages(
    backend: &Arc<Backend>,
    pages: &[&[u8]],
    owner: Option<Arc<dyn Send + Sync>>,
    send: &mut dyn FnMut(&[usize], &Arc<Held>) -> BatchOutcome,
) -> BatchOutcome {
    let ranges: Vec<(usize, usize)> = pages
        .iter()
        .map(|p| (p.as_ptr() as usize, p.len()))
        .collect();
    if let Ok(registration) = backend.register_dram(&ranges) {
        let mut held = Held::default();
        match owner {
            Some(owner) => held.own(Arc::new(Owned::new(registration, owner))),
            None => held.lend(registration),
        }
        let addrs: Vec<usize> = ranges.iter().map(|r| r.0).collect();
        return send(&addrs, &held.seal());
    }
    let total: usize = pages.iter().map(|p| p.len()).sum();
    let mut owned = vec![0u8; total.max(1)].into_boxed_slice();
    let base = owned.as_ptr() as usize;
    let mut addrs = Vec::with_capacity(pages.len());
    let mut at = 0;
    for page in pages {
        owned[at..at + page.len()].copy_from_slice(page);
        addrs.push(base + at);
        at += page.len();
    }
    match backend.register_dram(&[(base, owned.len())]) {
        Ok(registration) => {
            let mut held = Held::default();
            held.own(Arc::new(Owned::new(registration, owned)));
            send(&addrs, &held.seal())
        }
        Err(e) => BatchOutcome {
            results: pages
                .iter()
                .map(|_| {
                    Err(TierError::Unavailable(format!(
                        "nixl {}: registering page memory: {e}",
                        backend.plugin()
                    )))
                })
                .collect(),
            poisoned: false,
        },
    }
}

/// Runs blocking work on the current thread, telling a multi-threaded runtime to move its
/// other tasks elsewhere meanwhile.
pub fn run_blocking<R>(work: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}
