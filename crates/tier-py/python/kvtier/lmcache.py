"""kvtier as an LMCache L2 storage plugin (LMCache's multi-process ``native_plugin`` adapter).

LMCache loads it by module path::

    --l2-adapter '{"type": "native_plugin", "module_path": "kvtier.lmcache",
        "class_name": "KvtierL2Connector",
        "adapter_params": {"config": "/etc/kvtier/hierarchy.toml"}}'

``adapter_params`` holds ``config`` (a TOML or JSON path) or inline ``tiers`` (and optional
``hierarchy``), and optionally ``max_pending`` (calls running or undrained at once, default
4096), ``tenant`` (a namespace of its own for the keys, for tenants sharing storage), and
``read_timeout_ms`` / ``write_timeout_ms``: bounds on each get and exists / each set, as
LMCache's own L2 adapters take (LMCache gives its adapters no deadline of its own), and
``metrics_addr`` (``host:port``: serves kvtier's Prometheus metrics there; a port another
process holds is a ``ConfigError`` unless ``metrics_port_fallback`` is true, which serves
any free port instead), and ``kv_events`` (a KV events publisher config, as vLLM's or
SGLang's: the chunks stored are published for routers, LMCache's own events being its CPU
tier's only; ``kv_events_medium``, ``kv_events_block_size``: see :mod:`kvtier.events`). A NIXL
FILE tier whose config names no ``staging_buffers`` opens with 4 lanes here (a load runs on 4
threads beside LMCache's torch threads; see :data:`LMCACHE_LANES`), 2 elsewhere. A read
past its bound completes with what arrived, the rest misses; kvtier stops working on it.
Submits never block: each starts a call in kvtier's runtime and returns its id; its
completion makes :meth:`KvtierL2Connector.event_fd` readable. Page bytes move straight
between LMCache's memory objects and storage. Failures are completions with ``ok`` false
(logged at a bounded rate), never exceptions into LMCache.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from collections.abc import Sequence
from typing import Any

from . import ConfigError, Unavailable
from ._engine import (
    PageNames,
    RateLimitedLog,
    bound_ms,
    close_all,
    integrity_secret,
    load_config,
    namespace,
    open_instance,
    serve_metrics,
)
from .events import PageEvents

logger = logging.getLogger(__name__)

# Seconds `close` waits for running calls before it cancels them.
_CLOSE_WAIT_S = 5.0

# What a kvtier key holds: 1 to 200 printable ASCII characters.
_PLAIN_KEY = re.compile(r"[!-~]{1,200}")

Completion = tuple[int, bool, str, list[bool] | None]

# Lanes of a NIXL FILE tier under LMCache whose config names none (``staging_buffers``): a
# load runs on as many threads. LMCache's process is full of torch threads (OpenMP workers
# spin after each CPU op), and a load from the page cache on 4 threads keeps its share of
# the cores beside them, as LMCache's own ``fs_native`` adapter does with its 4 workers.
LMCACHE_LANES = 4


def lanes_by_default(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with :data:`LMCACHE_LANES` lanes for each NIXL FILE tier that names none."""
    tiers = [
        {**t, "staging_buffers": LMCACHE_LANES}
        if isinstance(t, dict) and t.get("kind") == "nixl-file" and "staging_buffers" not in t
        else t
        for t in config.get("tiers", [])
    ]
    return {**config, "tiers": tiers}


class KvtierL2Connector:
    """A kvtier hierarchy as LMCache's native L2 connector: ``event_fd``, ``submit_batch_*``
    (set, get, exists, delete), ``drain_completions`` and ``close``."""

    def __init__(
        self,
        config: str | None = None,
        tiers: list[Any] | None = None,
        hierarchy: dict[str, Any] | None = None,
        max_pending: int = 4096,
        tenant: str | None = None,
        read_timeout_ms: int | None = None,
        write_timeout_ms: int | None = None,
        metrics_addr: str | None = None,
        metrics_port_fallback: bool = False,
        kv_events: Any = None,
        kv_events_medium: str = "DISK",
        kv_events_block_size: int = 256,
    ):
        self._read_timeout = bound_ms("read_timeout_ms", read_timeout_ms)
        self._write_timeout = bound_ms("write_timeout_ms", write_timeout_ms)
        params = {"config": config, "tiers": tiers, "hierarchy": hierarchy or {}}
        loaded = lanes_by_default(load_config(params, "adapter_params"))
        # The chunks stored, published for routers (LMCache publishes its CPU tier's only).
        self.events = (
            PageEvents.of_any_engine(
                kv_events, block_size=kv_events_block_size, medium=kv_events_medium
            )
            if kv_events
            else None
        )
        # The keys of each set under way, by future id, while events are published.
        self._sets: dict[int, list[str]] = {}
        # LMCache's keys name the model and its salts; a tenant (or the tiers' integrity
        # secret) adds a namespace of its own, so tenants sharing storage never meet.
        secret = integrity_secret(loaded)
        self._prefix = f"{namespace('lmc', [], tenant, secret)}-" if tenant or secret else ""
        # With the secret, a key's name is a keyed digest: no chunk hash in clear.
        self._page_names = PageNames(secret) if secret else None
        # LMCache servers on one config share its folders by default (`open_instance`).
        self.store, self._instance = open_instance(loaded)
        self.queue = self.store.completion_queue(max_pending)
        # kvtier's Prometheus metrics (per tier and level), as the SGLang adapter serves them:
        # `host:port`; a port another server on the node holds is refused unless
        # `metrics_port_fallback`, which serves a free one.
        self.metrics_addr: tuple[Any, ...] | None = None
        if metrics_addr:
            host, _, port = str(metrics_addr).rpartition(":")
            if not port.isdigit():
                raise ConfigError(f"metrics_addr must be host:port, not {metrics_addr!r}")
            try:
                self.metrics_addr = serve_metrics(
                    self.store, host or "127.0.0.1", int(port), metrics_port_fallback
                )
            except ConfigError:
                self.queue.close()
                self.store.close()
                raise
        self.log = RateLimitedLog(logger)
        self._lock = threading.Lock()
        # Submits refused at once complete as failures with ids of their own (negative, so
        # they never meet the queue's).
        self._refused: list[Completion] = []
        self._next_refused = -1
        self._closed = False

    def _name(self, key: str) -> str:
        """The kvtier key of an LMCache key: itself (with the tenant's prefix) where it is one,
        else a digest of it. LMCache keys may end in a ``cache_salt`` of up to 128 characters
        with spaces and any Unicode, past what a kvtier key holds (printable ASCII, 200
        bytes). A digest name has no ``@``, which every LMCache key has, so it never equals a
        key kept as is. With the tiers' integrity secret every name is a keyed digest
        (:class:`kvtier._engine.PageNames`)."""
        if self._page_names is not None:
            return self._page_names(self._prefix.rstrip("-"), key)
        name = self._prefix + key
        if _PLAIN_KEY.fullmatch(name):
            return name
        digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=32)
        return f"{self._prefix}lmc-digest-{digest.hexdigest()}"

    def event_fd(self) -> int:
        """Readable while completions wait; :meth:`drain_completions` resets it."""
        fd: int = self.queue.event_fd()
        return fd

    def _submit(self, what: str, call: Any, keys: Sequence[str], *args: Any, **bound: Any) -> int:
        try:
            submitted: int = call([self._name(k) for k in keys], *args, **bound)
            return submitted
        except Exception as e:
            self.log.warn(what, e)
            with self._lock:
                fid = self._next_refused
                self._next_refused -= 1
                self._refused.append((fid, False, f"{type(e).__name__}: {e}", [False] * len(keys)))
            os.eventfd_write(self.queue.event_fd(), 1)
            return fid

    def submit_batch_set(self, keys: list[str], memoryviews: Sequence[memoryview]) -> int:
        """Stores each memoryview as the page of its key; per key ``True`` once stored."""
        fid = self._submit(
            "set", self.queue.submit_put, keys, list(memoryviews), timeout=self._write_timeout
        )
        if self.events is not None and fid >= 0:
            with self._lock:
                self._sets[fid] = list(keys)
        return fid

    def submit_batch_get(self, keys: list[str], memoryviews: Sequence[memoryview]) -> int:
        """Reads each key's page into its memoryview; per key ``True`` on a hit."""
        return self._submit(
            "get", self.queue.submit_get_into, keys, list(memoryviews), timeout=self._read_timeout
        )

    def submit_batch_exists(self, keys: list[str]) -> int:
        """Per key ``True`` when its page is present, each key on its own: LMCache sends a grid
        (a row per object group and KV rank, flattened) and reads each key's bit."""
        return self._submit("exists", self.queue.submit_contains, keys, timeout=self._read_timeout)

    def submit_batch_delete(self, keys: list[str]) -> int:
        """Removes pages; per key ``True`` when it was present."""
        return self._submit("delete", self.queue.submit_remove, keys)

    def drain_completions(self) -> list[Completion]:
        """Every finished call as ``(future_id, ok, error, per-key results)``."""
        # The queue's drain resets the eventfd: refused submits are taken after it, so one
        # refused meanwhile is either taken here or has written the eventfd after its reset.
        done = self.queue.drain()
        with self._lock:
            out, self._refused = self._refused, []
        for fid, results in done:
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                self.log.warn("call", errors[0])
            ok = [r is True or r is None for r in results]
            out.append(
                (
                    fid,
                    not errors,
                    f"{type(errors[0]).__name__}: {errors[0]}" if errors else "",
                    ok,
                )
            )
            if self.events is not None:
                self._publish_stored(fid, ok)
        return out

    def _publish_stored(self, fid: int, ok: list[bool]) -> None:
        """Publishes the chunks a finished set stored, once per chunk (by its first KV rank's
        and object group's key)."""
        with self._lock:
            keys = self._sets.pop(fid, None)
        if keys is None or self.events is None:
            return
        hashes = [
            self.events.digest_hash(digest)
            for key, good in zip(keys, ok, strict=False)
            if good and (digest := _chunk_digest(key)) is not None
        ]
        self.events.stored(hashes)

    def close(self) -> None:
        """Waits (5 s: LMCache has waited for its own in-flight work first) for running calls,
        cancels those still running, then drains the store's queued copies. LMCache frees or
        reuses its memory once this returns, so it never returns while a call may still write
        into that memory: a call the cancel could not stop (a read in place stuck in the
        kernel) is waited for, with an error logged every few seconds."""
        if self._closed:
            return
        self._closed = True
        while True:
            try:
                self.queue.close(_CLOSE_WAIT_S)
                break
            except Unavailable as e:
                logger.error("kvtier: %s; LMCache's memory they use stays theirs: waiting", e)
        closes = [self.store.close, self._instance.release]
        if self.events is not None:
            closes.append(self.events.close)
        close_all(self.log, "close", *closes)


def _chunk_digest(key: str) -> bytes | None:
    """The chunk hash of LMCache's key ``<model>@<kv_rank>@<object_group>@<chunk_hash>[@salt]``
    (hex), for the first KV rank and object group only (one event per chunk); ``None`` else."""
    parts = key.split("@")
    if len(parts) < 4:
        return None
    try:
        if int(parts[1], 16) or int(parts[2], 16):
            return None
        return bytes.fromhex(parts[3])
    except ValueError:
        return None
