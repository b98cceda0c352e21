"""kvtier as a vLLM secondary offloading tier (``TieringOffloadingSpec``).

vLLM loads it by module path from ``kv_connector_extra_config``::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 8589934592,
            "secondary_tiers": [{"type": "KvtierSecondaryTier", "module_path": "kvtier.vllm",
                                 "config": "/etc/kvtier/hierarchy.toml"}]}}'

The tier's entry holds ``config`` (a TOML or JSON path) or inline ``tiers`` (and optional
``hierarchy``); optional ``namespace`` (default: derived from the model, dtype, chunk geometry
and parallelism, which chunks in vLLM's parallelism-agnostic layouts leave out, so engines
sharing a folder or bucket never read each other's chunks and share what they can; a given one
is suffixed with a digest of the ``tenant`` and the integrity secret where either is set),
``max_pending`` (calls in flight, default 4096), ``drain_timeout`` (seconds after which
:meth:`KvtierSecondaryTier.drain_jobs` logs an error while it goes on waiting, default 120),
``lookup_timeout_ms`` (bound on each presence check, default 1000, as vLLM's KVCR tier's
``operation_timeout_ms``: a lookup is a ``MISS`` past it, never ``RETRY`` for longer) and
``transfer_timeout_ms`` (bound on each load and store, default: the hierarchy's own bounds; a
load past it fails with the chunks that did load). vLLM gives its tiers no deadline of its own.
Engines on one config share its NIXL FILE folders by default (``access = "shared"``); with
``access = "owner"`` named, each gets folders of its own (``instance-<k>``).

Every method returns at once: stores, loads and lookups run in kvtier's runtime, straight
between vLLM's primary CPU chunks and storage, and finish through
:meth:`KvtierSecondaryTier.get_finished_jobs`. A lookup answers ``RETRY`` until its presence
check completes. Failures are failed jobs or misses, logged at a bounded rate, never
exceptions into vLLM.
"""

from __future__ import annotations

import logging
import select
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable
from typing import Any, ClassVar

import numpy as np
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
    OffloadingConnectorStats,
)
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from . import ConfigError, Store
from ._engine import (
    PageNames,
    RateLimitedLog,
    bound_ms,
    close_all,
    integrity_secret,
    load_config,
    open_instance,
)
from ._engine import namespace as page_namespace

logger = logging.getLogger(__name__)

# Lookup answers kept (newest last), each trusted for _ANSWER_TTL_S seconds: repeated lookups
# of a step agree without a new check, and a chunk another engine stored is seen soon.
_ANSWERS_KEPT = 65536
_ANSWER_TTL_S = 2.0
# Keys asked about in one presence check.
_CHECK_BATCH = 4096

# kvtier's own metrics in vLLM's (Prometheus) metrics, per kvtier level (`level`, its name):
# counters (what `Store.stats()` counts per level) and gauges.
_METRIC = "vllm:kv_offload_kvtier_"
_COUNTERS = {
    "hits": "Pages read from this kvtier level.",
    "misses": "Pages asked of this kvtier level and not found there.",
    "bytes_read": "Bytes read from this kvtier level.",
    "bytes_written": "Bytes written to this kvtier level.",
    "evictions": "Pages this kvtier level evicted.",
    "errors": "Failed calls of this kvtier level.",
}
_GAUGES = {
    "resident_bytes": "Bytes this kvtier level holds (where it counts them).",
    "up": "1 while this kvtier level is used, 0 while it is down and skipped.",
}
_LEVEL = "level"


class KvtierSecondaryTier(SecondaryTierManager):
    """A kvtier hierarchy as one of vLLM's secondary offloading tiers."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        config: str | None = None,
        tiers: list[Any] | None = None,
        hierarchy: dict[str, Any] | None = None,
        namespace: str | None = None,
        tenant: str | None = None,
        max_pending: int = 4096,
        drain_timeout: float = 120.0,
        lookup_timeout_ms: int | None = 1000,
        transfer_timeout_ms: int | None = None,
        enable_kv_events: bool = False,
        locality: str | None = None,
        **unused: Any,
    ):
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        if unused:
            logger.warning("kvtier: ignoring unknown secondary tier options %s", sorted(unused))
        try:
            self.locality = Locality(locality) if locality is not None else None
        except ValueError:
            raise ConfigError(
                f"locality must be one of {[m.value for m in Locality]}, not {locality!r}"
            ) from None
        # KV events (chunks this tier stored), for KV-aware routers: as vLLM's own tiers, only
        # where the engine publishes KV events at all.
        self._events: list[OffloadingEvent] | None = None
        if enable_kv_events:
            events_config = getattr(offloading_spec, "kv_events_config", None)
            if getattr(events_config, "enable_kv_cache_events", False):
                self._events = []
            else:
                logger.warning(
                    "kvtier: enable_kv_events is set but the engine's KV cache events are "
                    "off; the tier emits none"
                )
        self._lookup_timeout = bound_ms("lookup_timeout_ms", lookup_timeout_ms)
        self._transfer_timeout = bound_ms("transfer_timeout_ms", transfer_timeout_ms)
        params = {"config": config, "tiers": tiers, "hierarchy": hierarchy or {}}
        # vLLM engines on one config share its folders by default (`open_instance`).
        self.store: Store | None
        loaded = load_config(params, "the secondary tier's entry")
        self.store, self._instance = open_instance(loaded)
        self.queue: Any = self.store.completion_queue(max_pending)
        self.log = RateLimitedLog(logger)
        self.drain_timeout = float(drain_timeout)
        secret = integrity_secret(loaded)
        # With the secret, page names carry no chunk hash in clear.
        self._page_names = PageNames(secret)
        if not namespace:
            self.namespace = self._default_namespace(
                offloading_spec, self.block_size_bytes, tenant, secret
            )
        elif tenant or secret:
            # The tenant and the secret apply whatever the namespace: two tenants naming the
            # same one never meet.
            self.namespace = page_namespace(namespace, [], tenant, secret)
        else:
            self.namespace = namespace
        # The primary tier's chunks: chunk i is `stride` bytes at base + i * stride. The view is
        # held by this tier for its whole life, and no call runs past drain_jobs or shutdown.
        self._stride = self.block_size_bytes
        self._base = int(np.asarray(primary_kv_view).ctypes.data) if len(primary_kv_view) else 0
        view_bytes = memoryview(primary_kv_view).nbytes
        self._chunks = view_bytes // self._stride if self._stride else 0
        # queue id -> (job, is load, bytes)
        self._jobs: dict[int, tuple[TransferJob, bool, int]] = {}
        # Keys looked up and not yet asked about: one presence check per scheduler step asks
        # about all of them (at the step's end).
        self._unasked: dict[OffloadKey, None] = {}
        # queue id -> keys, for presence checks in flight
        self._checks: dict[int, list[OffloadKey]] = {}
        self._checking: set[Any] = set()
        # Keys vLLM touched and not yet passed on (at the step's end, in one call), and the
        # queue ids of touches in flight.
        self._untouched: dict[OffloadKey, None] = {}
        self._touches: set[int] = set()
        self._answers: OrderedDict[OffloadKey, tuple[bool, float]] = OrderedDict()
        self._finished: list[JobResult] = []
        # (level, counter) -> its value at the last get_stats
        self._counted: dict[tuple[tuple[str], str], int] = {}

    @staticmethod
    def _default_namespace(spec: Any, stride: int, tenant: str | None, secret: bytes | None) -> str:
        c = getattr(spec, "config", None)
        parts = ["vllm"]
        if c is not None:
            p = c.parallel
            replicated = bool(getattr(c, "replicated_layout", False))
            # Chunks whose bytes do not depend on the parallelism (vLLM's certified canonical
            # layout, or a replicated one) are named without it, as vLLM's own fs and obj
            # tiers do, so engines of other TP/PP sizes share them; their size is then the
            # chunk's (every worker's bytes together), not one worker's.
            chunk_bytes = c.worker_kv_bytes_per_block
            if getattr(p, "is_parallelism_agnostic", False) or replicated:
                layout = "parallel-agnostic" + ("/replicated" if replicated else "")
                chunk_bytes = stride
            else:
                layout = f"tp{p.tp_size}pp{p.pp_size}pcp{p.pcp_size}dcp{p.dcp_size}"
            parts += [
                c.model.name,
                f"revision={getattr(c.model, 'revision', None) or ''}",
                c.model.dtype,
                str(chunk_bytes),
                f"{c.cache.tokens_per_hash}x{c.cache.blocks_per_chunk}",
                layout,
                str(c.kv_cache_layout),
                str(c.canonical_layout),
            ]
        return page_namespace("vllm", parts, tenant, secret)

    def _name(self, key: OffloadKey) -> str:
        return self._page_names(self.namespace, bytes(key).hex())

    def _regions(self, chunk_ids: np.ndarray) -> tuple[list[int], list[int]]:
        """Each chunk's ``(address, length)`` in the primary view; a chunk id outside it is a
        ``ValueError`` before any address is formed (kvtier would read or write past it)."""
        ids = np.asarray(chunk_ids, dtype=np.int64).reshape(-1)
        outside = ids[(ids < 0) | (ids >= self._chunks)]
        if outside.size:
            raise ValueError(
                f"chunk ids {outside[:8].tolist()} are outside the primary KV view's "
                f"{self._chunks} chunks"
            )
        addresses = (self._base + ids * self._stride).tolist()
        return addresses, [self._stride] * len(addresses)

    # ------------------------------------------------------------ completions

    def _take_completions(self) -> None:
        for qid, results in self.queue.drain():
            if qid in self._touches:
                self._touches.discard(qid)
                if results and isinstance(results[0], BaseException):
                    self.log.warn("touch", results[0])
                continue
            checked = self._checks.pop(qid, None)
            if checked is not None:
                for key, r in zip(checked, results, strict=True):
                    self._checking.discard(key)
                    if isinstance(r, BaseException):
                        self.log.warn("lookup", r)
                    self._answer(key, r is True)
                continue
            entry = self._jobs.pop(qid, None)
            if entry is None:
                continue
            job, is_load, nbytes = entry
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                self.log.warn("load" if is_load else "store", errors[0])
            ok_keys = [k for k, r in zip(job.keys, results, strict=True) if r is True or r is None]
            for k in ok_keys:
                self._answer(k, True)
            if is_load:
                for k, r in zip(job.keys, results, strict=True):
                    if r is not True:
                        self._answer(k, False)
            success = len(ok_keys) == len(results)
            if self._events is not None and not is_load and ok_keys:
                self._events.append(
                    OffloadingEvent(
                        keys=ok_keys, medium=self.medium, removed=False, locality=self.locality
                    )
                )
            self._finished.append(
                JobResult(
                    job_id=job.job_id,
                    success=success,
                    successful_keys=None if success or not is_load else ok_keys,
                    transfer_time=time.monotonic() - job.submit_time,
                    transfer_bytes=nbytes if success else self._stride * len(ok_keys),
                )
            )

    def _answer(self, key: OffloadKey, present: bool) -> None:
        self._answers[key] = (present, time.monotonic())
        self._answers.move_to_end(key)
        while len(self._answers) > _ANSWERS_KEPT:
            self._answers.popitem(last=False)

    # ------------------------------------------------------------ vLLM's interface

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        """kvtier's per-level counters and gauges, labelled by level (see :meth:`get_stats`)."""
        metrics: dict[str, OffloadingMetricMetadata] = {
            _METRIC + name: OffloadingCounterMetadata(documentation=doc, labelnames=(_LEVEL,))
            for name, doc in _COUNTERS.items()
        }
        for name, doc in _GAUGES.items():
            metrics[_METRIC + name] = OffloadingGaugeMetadata(
                documentation=doc, labelnames=(_LEVEL,)
            )
        return metrics

    def get_stats(self) -> OffloadingConnectorStats | None:
        """What each kvtier level counted since the last call, and its bytes held and state
        now (the metrics :meth:`build_metric_definitions` declares)."""
        if self.store is None:
            return None
        stats = OffloadingConnectorStats()
        for level in self.store.stats()["levels"]:
            label = (level["name"],)
            for name in _COUNTERS:
                last = self._counted.get((label, name), 0)
                self._counted[(label, name)] = level[name]
                if level[name] > last:
                    stats.increase_counter(_METRIC + name, level[name] - last, label)
            if level["resident_bytes"] is not None:
                stats.set_gauge(_METRIC + "resident_bytes", level["resident_bytes"], label)
            stats.set_gauge(_METRIC + "up", int(level["health"]["state"] != "down"), label)
        return stats

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """``HIT`` or ``MISS`` once a presence check answered, ``RETRY`` until then. The keys
        a step looks up are checked together, in one call at the step's end."""
        self._take_completions()
        answer = self._answers.get(key)
        if answer is not None:
            present, when = answer
            if time.monotonic() - when <= _ANSWER_TTL_S:
                return LookupResult.HIT if present else LookupResult.MISS
            del self._answers[key]
        if key not in self._checking:
            self._unasked[key] = None
        return LookupResult.RETRY

    def on_schedule_end(self, context: Any) -> None:
        """Asks about every key looked up this step, in batches of at most
        ``_CHECK_BATCH`` keys: a long prompt takes one call, not one per chunk; and passes
        the step's touches on to the tiers in one call."""
        self._pass_touches_on()
        keys, self._unasked = list(self._unasked), {}
        for first in range(0, len(keys), _CHECK_BATCH):
            batch = [k for k in keys[first : first + _CHECK_BATCH] if k not in self._checking]
            if not batch:
                continue
            try:
                qid = self.queue.submit_contains(
                    [self._name(k) for k in batch], timeout=self._lookup_timeout
                )
            except Exception as e:
                # Not asked (the queue is full or closed): a miss, asked again next time.
                self.log.warn("lookup", e)
                for k in batch:
                    self._answer(k, False)
                continue
            self._checks[qid] = batch
            self._checking.update(batch)

    def _pass_touches_on(self) -> None:
        if not self._untouched:
            return
        keys, self._untouched = list(self._untouched), {}
        try:
            self._touches.add(self.queue.submit_touch([self._name(k) for k in keys]))
        except Exception as e:
            # A hint only: a touch that cannot be queued is dropped.
            self.log.warn("touch", e)

    def _submit(self, job: TransferJob, is_load: bool) -> None:
        keys = list(job.keys)
        names = [self._name(k) for k in keys]
        try:
            addresses, lengths = self._regions(job.chunk_ids)
            if len(addresses) != len(keys):
                raise ValueError(f"{len(keys)} keys but {len(addresses)} chunk ids")
            if is_load:
                qid = self.queue.submit_get_into_regions(
                    names, addresses, lengths, timeout=self._transfer_timeout
                )
            else:
                qid = self.queue.submit_put_regions(
                    names, addresses, lengths, timeout=self._transfer_timeout
                )
        except Exception as e:
            self.log.warn("load" if is_load else "store", e)
            self._finished.append(
                JobResult(job_id=job.job_id, success=False, successful_keys=[] if is_load else None)
            )
            return
        self._jobs[qid] = (job, is_load, self._stride * len(keys))

    def submit_store(self, job_metadata: TransferJob) -> None:
        """Copies the job's primary chunks into kvtier, in kvtier's runtime."""
        self._submit(job_metadata, is_load=False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        """Reads the job's chunks from kvtier into its primary chunks, in kvtier's runtime."""
        self._submit(job_metadata, is_load=True)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        """Jobs finished since the last call."""
        self._take_completions()
        finished, self._finished = self._finished, []
        return finished

    def take_events(self) -> Iterable[OffloadingEvent]:
        """The chunks stored since the last call (``enable_kv_events``), as vLLM's KV events."""
        self._take_completions()
        if not self._events:
            return []
        events, self._events = self._events, []
        return events

    def has_pending_work(self) -> bool:
        return bool(self._jobs or self._checks or self._unasked or self._untouched or self._touches)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Marks the chunks as just used in kvtier's tiers (each tier's eviction keeps them
        longer), as vLLM's own tiers do: passed on at the step's end, with no I/O now."""
        for k in keys:
            self._untouched[k] = None

    def drain_jobs(self) -> None:
        """Waits until every submitted job finished. Past ``drain_timeout`` seconds it logs an
        error and goes on waiting: a running job still reads or writes vLLM's chunks, which
        vLLM reuses once this returns. Every kvtier call ends within its tiers' own bounds
        (transfer and request timeouts, the hierarchy's ``flush_timeout``)."""
        if self.queue is None:
            return
        deadline = time.monotonic() + self.drain_timeout
        poller = select.poll()
        poller.register(self.queue.event_fd(), select.POLLIN)
        self._take_completions()
        warned = False
        while self._jobs:
            left = deadline - time.monotonic()
            if left <= 0 and not warned:
                logger.error(
                    "kvtier: %d jobs still running after %.1f s; waiting for them to end, as "
                    "they use vLLM's memory until they do",
                    len(self._jobs),
                    self.drain_timeout,
                )
                warned = True
            poller.poll(1000 if warned else int(min(left, 1.0) * 1000) + 1)
            self._take_completions()

    def shutdown(self) -> None:
        """Waits for running calls, closes the store and lets go of it (its folders' locks, its
        connections) and of the primary tier's memory, which vLLM then unmaps."""
        if self.store is None:
            return
        self.drain_jobs()
        close_all(self.log, "shutdown", self.queue.close, self.store.close, self._instance.release)
        self.queue = self.store = None
        self._primary_kv_view = None
