//! `kvtier.Store`: a tier hierarchy opened from a config, called from any Python thread with
//! the GIL released around all I/O.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyMapping, PyTuple};
use tier_builtin::registry;
use tier_core::{StorageTier, TierError, TierStats};
use tier_hierarchy::config::HierarchyConfig;
use tier_hierarchy::{serve_metrics, Hierarchy, TierHealth};
use tokio::task::JoinHandle;

use crate::buffers::{lent_pages, read_slots, Lent};
use crate::calls::{self, deadline, each_present, key_list};
use crate::completions::{read_results, CompletionQueue, Outcome};
use crate::errors::{config_error, to_py};
use crate::handle::OpenHierarchy;
use crate::runtime::runtime;

/// A tier hierarchy; the page bytes never pass through Python.
///
/// ``config`` is a path to a TOML or JSON file, or a mapping with the config-file schema
/// (``{"hierarchy": {...}, "tiers": [{"kind": "mem", ...}, ...]}``).
///
/// A page (in :meth:`put`) or a buffer (in :meth:`get_into`) is a bytes-like object, a CPU
/// tensor, an ``(address, length)`` pair of host memory the caller keeps valid for the call,
/// or a list of those: the regions of one page, stored as one page and present only whole.
/// Batch calls answer per key and release the GIL while they wait.
#[pyclass(module = "kvtier", frozen)]
pub struct Store {
    hierarchy: OpenHierarchy,
    /// The metrics endpoint, while one is served; stopped when the store goes.
    metrics_server: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Store {
    /// Stops the metrics endpoint and, unless a completion queue still uses the hierarchy,
    /// closes it: queued pages reach the lower tiers (bounded by `flush_timeout`) or are
    /// logged as lost.
    fn drop(&mut self) {
        let server = self
            .metrics_server
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(task) = server.take() {
            if self.hierarchy.forked() {
                // The parent's task: aborting it here would reach for the parent's runtime.
                std::mem::forget(task);
            } else {
                task.abort();
            }
        }
        if let Some(hierarchy) = self.hierarchy.take() {
            if Arc::strong_count(&hierarchy) == 1 {
                Python::with_gil(|py| {
                    py.allow_threads(move || {
                        close_or_warn(&hierarchy, "dropped");
                        drop(hierarchy);
                    })
                });
            }
        }
    }
}

/// Every hierarchy a `Store` opened in this process (with the process's id: a forked child
/// inherits its parent's list), to close at interpreter exit.
fn open_hierarchies() -> &'static Mutex<Vec<(u32, Weak<Hierarchy>)>> {
    static OPEN: Mutex<Vec<(u32, Weak<Hierarchy>)>> = Mutex::new(Vec::new());
    &OPEN
}

/// Closes a hierarchy (its queued pages written below, at most `flush_timeout`); when that
/// fails, logs how many queued pages are lost and why.
fn close_or_warn(hierarchy: &Hierarchy, when: &str) {
    if let Err(e) = runtime().block_on(hierarchy.close()) {
        let h = hierarchy.hierarchy_stats();
        tracing::warn!(
            "kvtier store {:?} {when}: {} pages ({} bytes) queued for its lower tiers were \
             not written there and are lost: {e}",
            hierarchy.info().name,
            h.queue_depth,
            h.queue_bytes,
        );
    }
}

/// Closes every store still open: registered with `atexit` when the module loads, so pages
/// an engine was told are stored reach the lower tiers before the process ends.
#[pyfunction]
pub(crate) fn close_all_at_exit(py: Python<'_>) {
    let open: Vec<Arc<Hierarchy>> = {
        let mut open = open_hierarchies().lock().unwrap_or_else(|e| e.into_inner());
        // A forked child closes none of its parent's hierarchies: they are the parent's to close.
        let pid = std::process::id();
        open.retain(|(opened_in, h)| *opened_in == pid && h.strong_count() > 0);
        open.iter().filter_map(|(_, h)| h.upgrade()).collect()
    };
    py.allow_threads(|| {
        for hierarchy in &open {
            close_or_warn(hierarchy, "at exit");
        }
    });
}

impl Store {
    fn put_lent(
        &self,
        py: Python<'_>,
        keys: &[String],
        lent: Lent,
        timeout: Option<f64>,
    ) -> PyResult<Vec<PyObject>> {
        let page_keys = calls::keys(py, keys)?;
        let deadline = deadline(timeout)?;
        let hierarchy = self.hierarchy.get(py)?;
        let results = py.allow_threads(|| {
            // SAFETY: each region is a live buffer export held by `lent`, or memory the caller
            // vouches for (a raw pair), for this call.
            let pages = unsafe { lent_pages(&page_keys, &lent.pages) };
            runtime().block_on(async {
                match deadline {
                    Some(d) => hierarchy.put_by(&pages, d).await,
                    None => hierarchy.put(&pages).await,
                }
            })
        });
        drop(lent);
        Ok(Outcome::Put(results).to_py(py))
    }

    fn get_lent(
        &self,
        py: Python<'_>,
        keys: &[String],
        lent: Lent,
        timeout: Option<f64>,
    ) -> PyResult<Vec<PyObject>> {
        let page_keys = calls::keys(py, keys)?;
        let deadline = deadline(timeout)?;
        let hierarchy = self.hierarchy.get(py)?;
        let results = py.allow_threads(|| {
            // SAFETY: writable, disjoint regions (checked by `Lent`) of live exports held by
            // `lent`, or caller-vouched raw memory, for this call.
            let mut slots = unsafe { read_slots(&page_keys, &lent.pages) };
            runtime().block_on(async {
                match deadline {
                    Some(d) => hierarchy.get_by(&mut slots, d).await,
                    None => hierarchy.get(&mut slots).await,
                }
            })
        });
        let results = read_results(py, results, &lent);
        drop(lent);
        Ok(results)
    }

    fn open(py: Python<'_>, config: Result<HierarchyConfig, TierError>) -> PyResult<Self> {
        let config = config.map_err(|e| to_py(py, &e))?;
        let hierarchy = py
            .allow_threads(|| runtime().block_on(registry().build(&config)))
            .map_err(|e| to_py(py, &e))?;
        let hierarchy = Arc::new(hierarchy);
        let mut open = open_hierarchies().lock().unwrap_or_else(|e| e.into_inner());
        let pid = std::process::id();
        open.retain(|(opened_in, h)| *opened_in == pid && h.strong_count() > 0);
        open.push((pid, Arc::downgrade(&hierarchy)));
        drop(open);
        Ok(Self {
            hierarchy: OpenHierarchy::new(hierarchy, "store"),
            metrics_server: Mutex::new(None),
        })
    }
}

fn health_dict<'py>(py: Python<'py>, h: &TierHealth) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("state", h.state.as_str())?;
    d.set_item("reason", &h.reason)?;
    d.set_item("state_seconds", h.for_how_long.as_secs_f64())?;
    d.set_item("transitions", h.transitions)?;
    d.set_item("reads_skipped", h.reads_skipped)?;
    d.set_item("writes_skipped", h.writes_skipped)?;
    d.set_item("read_latency_s", h.read_latency.map(|l| l.as_secs_f64()))?;
    d.set_item("read_bandwidth_bps", h.read_bandwidth)?;
    Ok(d)
}

fn stats_dict<'py>(py: Python<'py>, s: &TierStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("hits", s.hits)?;
    d.set_item("misses", s.misses)?;
    d.set_item("puts", s.puts)?;
    d.set_item("removes", s.removes)?;
    d.set_item("bytes_read", s.bytes_read)?;
    d.set_item("bytes_written", s.bytes_written)?;
    d.set_item("errors", s.errors)?;
    d.set_item("evictions", s.evictions)?;
    d.set_item("resident_bytes", s.resident_bytes)?;
    Ok(d)
}

/// Points the NIXL runtime lookup at an installed `nixl` package (`kvtier._nixl_from_pip`),
/// again at each open: a NIXL another library imported meanwhile is the one used.
fn find_nixl(py: Python<'_>) {
    if let Ok(package) = py.import("kvtier") {
        let _ = package.call_method0("_nixl_from_pip");
    }
}

#[pymethods]
impl Store {
    #[new]
    fn new(py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<Self> {
        find_nixl(py);
        if config.downcast::<PyMapping>().is_ok() {
            let text: String = py
                .import("json")?
                .call_method1("dumps", (config,))
                .map_err(|e| config_error(py, format!("the config mapping is not JSON: {e}")))?
                .extract()?;
            return Self::open(py, HierarchyConfig::from_json(&text));
        }
        let path: PathBuf = config.extract().map_err(|_| {
            config_error(
                py,
                "a config is a path (str or os.PathLike) or a mapping of the config-file schema"
                    .into(),
            )
        })?;
        let text = std::fs::read_to_string(&path)
            .map_err(|e| config_error(py, format!("cannot read config {}: {e}", path.display())))?;
        let parsed = if path.extension().is_some_and(|e| e == "json") {
            HierarchyConfig::from_json(&text)
        } else {
            HierarchyConfig::from_toml(&text)
        };
        Self::open(py, parsed)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<()> {
        self.close(py)
    }

    /// Stores pages. Each page is a buffer, an (address, length) pair, or a list of those
    /// (its regions, stored as one page). Returns per key `None` (stored) or the exception.
    /// With `timeout` (seconds), a page not stored by then gets a `TimeoutError`.
    #[pyo3(signature = (keys, pages, *, timeout = None))]
    fn put(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        pages: Vec<Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<PyObject>> {
        let lent = Lent::parse(py, &keys, &pages, false)?;
        self.put_lent(py, &keys, lent, timeout)
    }

    /// Stores pages of raw host regions: `addresses[i]`, `lengths[i]`, the same number of
    /// regions per key, consecutive per page (an engine's `get_page_buffer_meta` lists).
    #[pyo3(signature = (keys, addresses, lengths, *, timeout = None))]
    fn put_regions(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        addresses: Vec<usize>,
        lengths: Vec<usize>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<PyObject>> {
        let lent = Lent::raw(py, &keys, addresses, lengths, false)?;
        self.put_lent(py, &keys, lent, timeout)
    }

    /// Reads pages into the caller's buffers (each a writable buffer, an (address, length)
    /// pair, or a list of those, filled in order). Returns per key `True` (hit), `False`
    /// (miss) or the exception.
    /// With `timeout` (seconds), it returns by then: what arrived is a hit, the rest misses
    /// (a miss's buffer holds unspecified bytes).
    #[pyo3(signature = (keys, bufs, *, timeout = None))]
    fn get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        bufs: Vec<Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<PyObject>> {
        let lent = Lent::parse(py, &keys, &bufs, true)?;
        self.get_lent(py, &keys, lent, timeout)
    }

    /// Reads pages into raw host regions laid out as for [`Store::put_regions`].
    #[pyo3(signature = (keys, addresses, lengths, *, timeout = None))]
    fn get_into_regions(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        addresses: Vec<usize>,
        lengths: Vec<usize>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<PyObject>> {
        let lent = Lent::raw(py, &keys, addresses, lengths, true)?;
        self.get_lent(py, &keys, lent, timeout)
    }

    /// The number of leading keys that are all present (the reusable prefix). With `timeout`
    /// (seconds), what is not known present by then counts as absent.
    #[pyo3(signature = (keys, *, timeout = None))]
    fn exists(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<usize> {
        let keys = calls::keys(py, &key_list(py, keys)?)?;
        let deadline = deadline(timeout)?;
        let hierarchy = self.hierarchy.get(py)?;
        py.allow_threads(|| {
            runtime().block_on(async {
                match deadline {
                    Some(d) => hierarchy.exists_by(&keys, d).await,
                    None => hierarchy.exists(&keys).await,
                }
            })
        })
        .map_err(|e| to_py(py, &e))
    }

    /// Per key, whether its page is present, each key asked on its own (whatever the keys
    /// before it). With `timeout` (seconds), what is not known present by then counts as absent.
    #[pyo3(signature = (keys, *, timeout = None))]
    fn contains(
        &self,
        py: Python<'_>,
        keys: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<PyObject>> {
        let keys = calls::keys(py, &key_list(py, keys)?)?;
        let deadline = deadline(timeout)?;
        let hierarchy = self.hierarchy.get(py)?;
        let present =
            py.allow_threads(|| runtime().block_on(each_present(&hierarchy, &keys, deadline)));
        Ok(Outcome::Present(present).to_py(py))
    }

    /// Marks the pages of `keys` as just used, as reading them would, without reading them:
    /// each tier's eviction keeps them longer. Keys not stored are ignored.
    fn touch(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<()> {
        let keys = calls::keys(py, &key_list(py, keys)?)?;
        let hierarchy = self.hierarchy.get(py)?;
        py.allow_threads(|| runtime().block_on(hierarchy.touch(&keys)))
            .map_err(|e| to_py(py, &e))
    }

    /// Per level, fastest first, the estimated seconds to read `pages` pages of `page_bytes`
    /// each in one call (`None` until the level has served reads to fit from), with its name
    /// and state (`up`, `slow`, `down`): what loading a prefix would cost, to weigh against
    /// recomputing it.
    fn estimate<'py>(
        &self,
        py: Python<'py>,
        pages: u64,
        page_bytes: u64,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let stats = self.hierarchy.get(py)?.hierarchy_stats();
        stats
            .levels
            .iter()
            .map(|l| {
                let d = PyDict::new(py);
                d.set_item("name", &l.info.name)?;
                d.set_item("state", l.health.state.as_str())?;
                let secs = l
                    .health
                    .load_time(pages, page_bytes)
                    .map(|t| t.as_secs_f64());
                d.set_item("seconds", secs)?;
                Ok(d)
            })
            .collect()
    }

    /// Removes pages; per key `True` (was present), `False`, or the exception.
    fn remove(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<Vec<PyObject>> {
        let keys = calls::keys(py, &key_list(py, keys)?)?;
        let hierarchy = self.hierarchy.get(py)?;
        let results = py.allow_threads(|| runtime().block_on(hierarchy.remove(&keys)));
        Ok(Outcome::Remove(results).to_py(py))
    }

    /// Removes every page the store's tiers hold (and nothing they do not own).
    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        let hierarchy = self.hierarchy.get(py)?;
        py.allow_threads(|| runtime().block_on(hierarchy.clear()))
            .map_err(|e| to_py(py, &e))
    }

    /// Waits until queued copies have reached the lower tiers.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let hierarchy = self.hierarchy.get(py)?;
        py.allow_threads(|| runtime().block_on(hierarchy.flush()))
            .map_err(|e| to_py(py, &e))
    }

    /// Drains the queue (pages queued for the lower tiers are written there, at most
    /// `flush_timeout`), stops background work and the metrics endpoint, and lets go of the
    /// tiers: their folders, locks and registrations are released once no running call and no
    /// open completion queue uses them, so a new store may open them at once. A call after it
    /// raises `Unavailable`; closing again does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let server = self
            .metrics_server
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = server {
            if self.hierarchy.forked() {
                std::mem::forget(task);
            } else {
                task.abort();
            }
        }
        let Some(hierarchy) = self.hierarchy.take() else {
            return Ok(());
        };
        py.allow_threads(move || {
            let closed = runtime().block_on(hierarchy.close());
            drop(hierarchy);
            closed
        })
        .map_err(|e| to_py(py, &e))
    }

    /// Counters: the store's own, each level's, and the hierarchy's moves between levels;
    /// `process_*`: copies of callers' bytes made by every store of this process (a page
    /// does not know its store), as their names say.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let hierarchy = self.hierarchy.get(py)?;
        let h = hierarchy.hierarchy_stats();
        let d = stats_dict(py, &hierarchy.stats())?;
        let levels = h
            .levels
            .iter()
            .map(|l| {
                let ld = stats_dict(py, &l.stats)?;
                ld.set_item("name", &l.info.name)?;
                ld.set_item("kind", &l.info.kind)?;
                ld.set_item("served", l.served)?;
                ld.set_item("health", health_dict(py, &l.health)?)?;
                Ok(ld)
            })
            .collect::<PyResult<Vec<_>>>()?;
        d.set_item("levels", levels)?;
        d.set_item("promotions", h.promotions)?;
        d.set_item("copied_down", h.copied_down)?;
        d.set_item("demotions", h.demotions)?;
        d.set_item("demotions_dropped", h.demotions_dropped)?;
        d.set_item("not_admitted", h.not_admitted)?;
        d.set_item("stale_below", h.stale_below)?;
        d.set_item("stale_below_all", h.stale_below_all)?;
        d.set_item("served_in_flight", h.served_in_flight)?;
        d.set_item("bytes_moved", h.bytes_moved)?;
        d.set_item("queue_depth", h.queue_depth)?;
        d.set_item("queue_bytes", h.queue_bytes)?;
        d.set_item("lower_errors", h.lower_errors)?;
        // Process-wide, and named so: the page layer counts copies without knowing the store.
        let copies = tier_core::copied_bytes();
        d.set_item("process_lent_bytes_copied", copies.lent)?;
        d.set_item("process_bytes_copied_to_callers", copies.filled)?;
        Ok(d)
    }

    /// The store's metrics in the Prometheus text format (OpenMetrics): per tier and
    /// operation, call durations, pages, bytes and errors by kind; each tier's and the
    /// hierarchy's counters.
    fn metrics_text(&self, py: Python<'_>) -> PyResult<String> {
        let hierarchy = self.hierarchy.get(py)?;
        Ok(py.allow_threads(|| hierarchy.metrics_text()))
    }

    /// Serves the metrics at `http://ADDR/metrics` (port 0: any free port) until the store
    /// is dropped or this is called again; returns the bound `(host, port)`.
    #[pyo3(signature = (addr = "127.0.0.1:0"))]
    fn serve_metrics(&self, py: Python<'_>, addr: &str) -> PyResult<(String, u16)> {
        let parsed: SocketAddr = addr.parse().map_err(|e| {
            to_py(
                py,
                &TierError::config("metrics_addr", format!("{addr:?} is not HOST:PORT: {e}")),
            )
        })?;
        // Held weakly: a scrape in progress never keeps a closed store's tiers (its folders'
        // locks) open.
        let source = Arc::downgrade(&self.hierarchy.get(py)?);
        let text = move || {
            source
                .upgrade()
                .map_or_else(String::new, |h| h.metrics_text())
        };
        let (bound, task) = py
            .allow_threads(|| runtime().block_on(serve_metrics(parsed, text)))
            .map_err(|e| to_py(py, &e))?;
        let mut server = self
            .metrics_server
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(previous) = server.replace(task) {
            previous.abort();
        }
        Ok((bound.ip().to_string(), bound.port()))
    }

    /// A queue of non-blocking calls on this store, with its own eventfd; at most
    /// `max_pending` calls running or awaiting `drain` at once (beyond: `Unavailable`).
    #[pyo3(signature = (max_pending = 4096))]
    fn completion_queue(&self, py: Python<'_>, max_pending: usize) -> PyResult<CompletionQueue> {
        CompletionQueue::new(py, self.hierarchy.get(py)?, max_pending)
    }

    /// Largest page every tier takes, in bytes (`None`: no limit).
    #[getter]
    fn max_page_bytes(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        Ok(self.hierarchy.get(py)?.info().max_page_bytes)
    }

    /// The levels' kinds, fastest first.
    #[getter]
    fn kinds(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        Ok(self
            .hierarchy
            .get(py)?
            .tiers()
            .iter()
            .map(|t| t.info().kind)
            .collect())
    }
}
