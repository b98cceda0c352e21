//! `kvtier.CompletionQueue`: calls that return at once with an id and complete in kvtier's
//! runtime, for engines that must not block (LMCache's L2 plugins, vLLM's secondary tiers).
//!
//! A completion is announced on an eventfd (readable while completions wait to be drained)
//! and taken with `drain`. The buffers a call reads or writes stay held by the queue until
//! its completion is drained: the caller's memory cannot be released while kvtier uses it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBool;
use tier_core::{Lookup, PageKey, StorageTier, TierError};
use tier_hierarchy::Hierarchy;
use tokio::task::AbortHandle;

use crate::buffers::{lent_pages, read_slots, Lent};
use crate::errors::to_py;
use crate::handle::OpenHierarchy;
use crate::runtime::runtime;

fn py_bool(py: Python<'_>, b: bool) -> PyObject {
    PyBool::new(py, b).to_owned().into_any().unbind()
}

/// What one call came to, per key.
pub(crate) enum Outcome {
    Put(Vec<Result<(), TierError>>),
    Get(Vec<Result<Lookup, TierError>>),
    /// The leading run of present keys, of `of`.
    Exists(Result<usize, TierError>, usize),
    Remove(Vec<Result<bool, TierError>>),
    /// Each key's own presence.
    Present(Vec<Result<bool, TierError>>),
    /// A touch of `of` keys.
    Touch(Result<(), TierError>, usize),
    /// The call's task ended before it finished (the runtime shut down).
    Dropped(usize),
}

impl Outcome {
    /// Per key: `None` (stored), `True`/`False` (hit or miss; present or not), or the
    /// exception for that key.
    pub(crate) fn to_py(&self, py: Python<'_>) -> Vec<PyObject> {
        let err = |e: &TierError| to_py(py, e).into_value(py).into_any();
        match self {
            Outcome::Put(r) => r
                .iter()
                .map(|r| r.as_ref().map_or_else(err, |()| py.None()))
                .collect(),
            Outcome::Get(r) => r
                .iter()
                .map(|r| {
                    r.as_ref()
                        .map_or_else(err, |l| py_bool(py, *l == Lookup::Hit))
                })
                .collect(),
            Outcome::Exists(Ok(n), of) => (0..*of).map(|i| py_bool(py, i < *n)).collect(),
            Outcome::Exists(Err(e), of) => (0..*of).map(|_| err(e)).collect(),
            Outcome::Remove(r) | Outcome::Present(r) => r
                .iter()
                .map(|r| r.as_ref().map_or_else(err, |b| py_bool(py, *b)))
                .collect(),
            Outcome::Touch(Ok(()), of) => (0..*of).map(|_| py.None()).collect(),
            Outcome::Touch(Err(e), of) => (0..*of).map(|_| err(e)).collect(),
            Outcome::Dropped(of) => {
                let e = TierError::Unavailable(
                    "the call was cancelled (its queue closed, or kvtier's runtime stopped) \
                     before it finished"
                        .into(),
                );
                (0..*of).map(|_| err(&e)).collect()
            }
        }
    }
}

/// A read's per-key results for Python, once its staged bytes are settled into their tensors
/// (a tensor that could not take them gets its error instead).
pub(crate) fn read_results(
    py: Python<'_>,
    results: Vec<Result<Lookup, TierError>>,
    lent: &Lent,
) -> Vec<PyObject> {
    let errors = lent.settle(py, &results);
    Outcome::Get(results)
        .to_py(py)
        .into_iter()
        .zip(errors)
        .map(|(result, error)| error.map_or(result, |e| e.into_value(py).into_any()))
        .collect()
}

/// A finished call, holding the buffers it used until it is drained.
struct Done {
    id: u64,
    outcome: Outcome,
    lent: Lent,
}

#[derive(Default)]
struct State {
    next_id: u64,
    running: usize,
    done: Vec<Done>,
    closed: bool,
    /// The calls' tasks, to cancel at close (finished ones are pruned as calls start).
    tasks: Vec<AbortHandle>,
}

struct Shared {
    /// Readable while completions wait; `drain` resets it.
    eventfd: OwnedFd,
    state: Mutex<State>,
    /// Signalled whenever a call finishes.
    finished: Condvar,
    max_pending: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finish(&self, id: u64, outcome: Outcome, lent: Lent) {
        let mut state = self.lock();
        state.running -= 1;
        state.done.push(Done { id, outcome, lent });
        drop(state);
        self.finished.notify_all();
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd this struct owns. A full
        // counter (EAGAIN) still reads as readable, so the result needs no handling.
        unsafe { libc::write(self.eventfd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Empties the eventfd's counter (non-blocking).
    fn reset(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd this struct owns.
        unsafe { libc::read(self.eventfd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    }

    /// Waits, up to `timeout`, until no call runs; the number still running.
    fn wait_idle(&self, timeout: Duration) -> usize {
        let now = Instant::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(MAX_WAIT_SECS as u64));
        let mut state = self.lock();
        while state.running > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            state = self
                .finished
                .wait_timeout(state, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        state.running
    }
}

/// The longest `close` waits, in seconds (a larger timeout waits this long).
const MAX_WAIT_SECS: f64 = 1e9;

/// How long `close` waits for calls it cancelled to let go of their buffers.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// A call running in the runtime: finishes as `Dropped` if its task ends without finishing,
/// so the queue always learns of it and the buffers it holds are released by a drain.
struct Ticket {
    shared: Arc<Shared>,
    id: u64,
    keys: usize,
    lent: Option<Lent>,
}

impl Ticket {
    fn finish(mut self, outcome: Outcome) {
        if let Some(lent) = self.lent.take() {
            self.shared.finish(self.id, outcome, lent);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(lent) = self.lent.take() {
            self.shared
                .finish(self.id, Outcome::Dropped(self.keys), lent);
        }
    }
}

/// Non-blocking calls on a :class:`Store`, completed in kvtier's runtime.
///
/// Each ``submit_*`` returns an id at once (or raises at once on bad input, or when
/// ``max_pending`` calls are running or undrained). A finished call makes :meth:`event_fd`
/// readable; :meth:`drain` takes every finished call as ``(id, per-key results)``, results as
/// in :class:`Store`'s blocking calls (:meth:`submit_exists` answers per key whether it is in
/// the leading run of present keys). The buffers a call uses are held until it is drained; a
/// read into a tensor torch may reallocate lands in it at the drain.
#[pyclass(module = "kvtier", frozen)]
pub struct CompletionQueue {
    hierarchy: OpenHierarchy,
    shared: Arc<Shared>,
}

impl CompletionQueue {
    pub fn new(py: Python<'_>, hierarchy: Arc<Hierarchy>, max_pending: usize) -> PyResult<Self> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new fd we own.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(to_py(
                py,
                &TierError::Unavailable(format!("cannot create an eventfd: {e}")),
            ));
        }
        Ok(Self {
            hierarchy: OpenHierarchy::new(hierarchy, "completion queue"),
            shared: Arc::new(Shared {
                // SAFETY: `fd` is a fresh descriptor owned by nothing else.
                eventfd: unsafe { OwnedFd::from_raw_fd(fd) },
                state: Mutex::new(State::default()),
                finished: Condvar::new(),
                max_pending: max_pending.max(1),
            }),
        })
    }

    /// Takes an id for a call of `keys` keys, or refuses it (queue closed or full).
    ///
    /// Nothing that may run Python code (building the exception, releasing `lent`'s buffers)
    /// happens under the state lock: Python may hand the GIL to another thread there, which
    /// would then wait for the lock while holding the GIL this one needs.
    fn ticket(&self, py: Python<'_>, keys: usize, lent: Lent) -> PyResult<Ticket> {
        let taken = {
            let mut state = self.shared.lock();
            if state.closed {
                Err("the completion queue is closed".to_string())
            } else if state.running + state.done.len() >= self.shared.max_pending {
                Err(format!(
                    "{} calls running and {} completions not drained: at the queue's \
                     max_pending of {}",
                    state.running,
                    state.done.len(),
                    self.shared.max_pending
                ))
            } else {
                state.next_id += 1;
                state.running += 1;
                Ok(state.next_id)
            }
        };
        match taken {
            Ok(id) => Ok(Ticket {
                shared: Arc::clone(&self.shared),
                id,
                keys,
                lent: Some(lent),
            }),
            Err(why) => {
                drop(lent);
                Err(to_py(py, &TierError::Unavailable(why)))
            }
        }
    }

    /// Starts a call on `keys` (a lookup, a touch, a removal) by `timeout`: `call` answers with
    /// its outcome.
    fn submit_keys<F>(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        call: impl FnOnce(Arc<Hierarchy>, Vec<PageKey>, Option<Instant>) -> F,
    ) -> PyResult<u64>
    where
        F: std::future::Future<Output = Outcome> + Send + 'static,
    {
        let keys = crate::calls::keys(py, &crate::calls::key_list(py, keys)?)?;
        let deadline = crate::calls::deadline(timeout)?;
        let hierarchy = self.hierarchy.get(py)?;
        let ticket = self.ticket(py, keys.len(), Lent::default())?;
        let id = ticket.id;
        let call = call(hierarchy, keys, deadline);
        self.track(runtime().spawn(async move {
            let outcome = call.await;
            ticket.finish(outcome);
        }));
        Ok(id)
    }

    /// Keeps a call's task, to cancel it if the queue closes before it ends.
    fn track(&self, task: tokio::task::JoinHandle<()>) {
        let mut state = self.shared.lock();
        state.tasks.retain(|t| !t.is_finished());
        state.tasks.push(task.abort_handle());
    }

    /// Starts a read into the regions (`read`), or a put of them.
    fn submit_move(
        &self,
        py: Python<'_>,
        keys: &[String],
        lent: Lent,
        read: bool,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let keys = crate::calls::keys(py, keys)?;
        let deadline = crate::calls::deadline(timeout)?;
        let regions = lent.pages.clone();
        let hierarchy = self.hierarchy.get(py)?;
        let ticket = self.ticket(py, keys.len(), lent)?;
        let id = ticket.id;
        self.track(runtime().spawn(async move {
            // The first local: were this task dropped at an await, the call's future and its
            // slices over the regions go first, the ticket (holding the buffers) last.
            let ticket = ticket;
            // SAFETY (both arms): the regions are live buffer exports held by the ticket, which
            // releases them only after the slices are gone, or memory the caller vouches for
            // until the completion is drained; a read's are writable and disjoint (checked by
            // `Lent`).
            let outcome = if read {
                let mut slots = unsafe { read_slots(&keys, &regions) };
                Outcome::Get(match deadline {
                    Some(d) => hierarchy.get_by(&mut slots, d).await,
                    None => hierarchy.get(&mut slots).await,
                })
            } else {
                let pages = unsafe { lent_pages(&keys, &regions) };
                Outcome::Put(match deadline {
                    Some(d) => hierarchy.put_by(&pages, d).await,
                    None => hierarchy.put(&pages).await,
                })
            };
            ticket.finish(outcome);
        }));
        Ok(id)
    }
}

#[pymethods]
impl CompletionQueue {
    /// The eventfd that is readable while completions wait to be drained.
    fn event_fd(&self) -> i32 {
        self.shared.eventfd.as_raw_fd()
    }

    /// Submits a put (pages as for `Store.put`); returns the call's id.
    #[pyo3(signature = (keys, pages, *, timeout = None))]
    fn submit_put(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        pages: Vec<Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let lent = Lent::parse(py, &keys, &pages, false)?;
        self.submit_move(py, &keys, lent, false, timeout)
    }

    /// Submits a put of raw host regions (laid out as for `Store.put_regions`).
    #[pyo3(signature = (keys, addresses, lengths, *, timeout = None))]
    fn submit_put_regions(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        addresses: Vec<usize>,
        lengths: Vec<usize>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let lent = Lent::raw(py, &keys, addresses, lengths, false)?;
        self.submit_move(py, &keys, lent, false, timeout)
    }

    /// Submits a read into writable buffers (as for `Store.get_into`); returns the call's id.
    #[pyo3(signature = (keys, bufs, *, timeout = None))]
    fn submit_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        bufs: Vec<Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let lent = Lent::parse(py, &keys, &bufs, true)?;
        self.submit_move(py, &keys, lent, true, timeout)
    }

    /// Submits a read into raw host regions (laid out as for `Store.put_regions`).
    #[pyo3(signature = (keys, addresses, lengths, *, timeout = None))]
    fn submit_get_into_regions(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        addresses: Vec<usize>,
        lengths: Vec<usize>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let lent = Lent::raw(py, &keys, addresses, lengths, true)?;
        self.submit_move(py, &keys, lent, true, timeout)
    }

    /// Submits a presence check; its completion answers per key whether it belongs to the
    /// leading run of present keys.
    /// With `timeout` (seconds), what is not known present by then counts as absent.
    #[pyo3(signature = (keys, *, timeout = None))]
    fn submit_exists(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        self.submit_keys(py, keys, timeout, |hierarchy, keys, deadline| async move {
            let n = match deadline {
                Some(d) => hierarchy.exists_by(&keys, d).await,
                None => hierarchy.exists(&keys).await,
            };
            Outcome::Exists(n, keys.len())
        })
    }

    /// Submits a presence check of each key on its own; its completion answers per key
    /// whether that page is present, whatever the keys before it (LMCache reads a grid of keys,
    /// a row per group and rank). With `timeout` (seconds), what is not known present by then
    /// counts as absent.
    #[pyo3(signature = (keys, *, timeout = None))]
    fn submit_contains(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        self.submit_keys(py, keys, timeout, |hierarchy, keys, deadline| async move {
            Outcome::Present(crate::calls::each_present(&hierarchy, &keys, deadline).await)
        })
    }

    /// Submits a touch (see `Store.touch`); its completion answers `None` per key, or the
    /// error for all of them.
    fn submit_touch(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<u64> {
        self.submit_keys(py, keys, None, |hierarchy, keys, _| async move {
            Outcome::Touch(hierarchy.touch(&keys).await, keys.len())
        })
    }

    /// Submits a removal; its completion answers per key whether the page was present.
    fn submit_remove(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<u64> {
        self.submit_keys(py, keys, None, |hierarchy, keys, _| async move {
            Outcome::Remove(hierarchy.remove(&keys).await)
        })
    }

    /// Takes every completion that has arrived, as `(id, per-key results)` in completion
    /// order, and releases the buffers those calls held. Resets the eventfd first, so a
    /// completion arriving meanwhile leaves it readable.
    fn drain(&self, py: Python<'_>) -> Vec<(u64, Vec<PyObject>)> {
        self.shared.reset();
        let done = std::mem::take(&mut self.shared.lock().done);
        done.into_iter()
            .map(|d| {
                let results = match d.outcome {
                    Outcome::Get(results) => read_results(py, results, &d.lent),
                    outcome => outcome.to_py(py),
                };
                (d.id, results)
            })
            .collect()
    }

    /// Calls submitted and not yet drained.
    #[getter]
    fn pending(&self) -> usize {
        let state = self.shared.lock();
        state.running + state.done.len()
    }

    /// Refuses new calls, waits up to `timeout` seconds for the running ones, cancels those
    /// still running (their completions say so; none touches its buffers after) and lets go of
    /// the store's tiers. Raises `Unavailable` if a call still runs 5 s after it was
    /// cancelled (a read stuck in the kernel: its buffers stay held). Undrained completions
    /// stay drainable.
    #[pyo3(signature = (timeout = 60.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        if !timeout.is_finite() || timeout < 0.0 {
            return Err(PyValueError::new_err(format!(
                "timeout {timeout} is not a number of seconds"
            )));
        }
        self.shared.lock().closed = true;
        if self.hierarchy.forked() {
            // The parent's calls run in the parent: nothing here to wait for.
            self.hierarchy.take();
            return Ok(());
        }
        let shared = &self.shared;
        // Past about 30 years a wait is a wait for ever: bounded there, never an overflow.
        let wait = Duration::from_secs_f64(timeout.min(MAX_WAIT_SECS));
        let mut running = py.allow_threads(|| shared.wait_idle(wait));
        if running > 0 {
            // Cancelled, a call stops at its next await and never touches its buffers after
            // (the tiers' drop-safe contract); its completion says it was cancelled. Only a
            // read in place stuck in the kernel outlasts this.
            let tasks = std::mem::take(&mut shared.lock().tasks);
            tasks.iter().for_each(AbortHandle::abort);
            running = py.allow_threads(|| shared.wait_idle(CANCEL_WAIT));
        }
        // Calls still running hold the hierarchy until they end; the queue lets go of it now.
        if let Some(hierarchy) = self.hierarchy.take() {
            py.allow_threads(move || drop(hierarchy));
        }
        if running > 0 {
            return Err(to_py(
                py,
                &TierError::Unavailable(format!(
                    "{running} calls still running {timeout} s after close, and {} s after \
                     they were cancelled: their buffers stay held",
                    CANCEL_WAIT.as_secs()
                )),
            ));
        }
        Ok(())
    }
}

impl Drop for CompletionQueue {
    /// Waits (bounded) for running calls, so the buffers they hold are released here, with
    /// the interpreter alive, rather than by a runtime thread later.
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        if self.hierarchy.forked() {
            // In a forked child the parent's calls never end here: their buffers stay held.
            self.hierarchy.take();
            return;
        }
        Python::with_gil(|py| {
            let shared = &self.shared;
            py.allow_threads(|| shared.wait_idle(Duration::from_secs(60)));
            // Taken under the lock, released (buffers, with the GIL) after it.
            let done = std::mem::take(&mut shared.lock().done);
            drop(done);
        });
    }
}
