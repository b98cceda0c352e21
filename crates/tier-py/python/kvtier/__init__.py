"""kvtier: tiered KV-cache storage for LLM inference.

A :class:`Store` is a hierarchy of tiers (DRAM, NIXL FILE, NIXL OBJ, object storage) opened
from the same TOML/JSON schema as the ``kvtier`` command. Batch calls answer per key and move
page bytes between the caller's memory and storage without passing them through Python; the
GIL is released while they wait.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union


def _nixl_packages() -> list:
    """The nixl wheels to look in: the one already imported (a process has one NIXL runtime),
    else cu12 first. cu13's OBJ plugin needs CUDA's object client library and cannot load
    without it; cu12's loads anywhere. A NIXL imported later in the process (SGLang's own
    backend) then shares the runtime loaded first: the libraries have the same sonames."""
    loaded = [n for n in ("nixl_cu13", "nixl_cu12") if n in sys.modules]
    return loaded or ["nixl_cu12", "nixl_cu13"]


# Where kvtier records the NIXL_LIB_DIR value it chose itself (inherited by child processes
# with it), to tell it from one the user set.
_AUTO = "KVTIER_NIXL_LIB_DIR_AUTO"


def _nixl_from_pip() -> None:
    """Points kvtier at the NIXL runtime of an installed ``nixl`` package (its ``nixl-cu12``
    or ``nixl-cu13`` wheel ships ``libnixl_capi.so``), unless the user set ``NIXL_LIB_DIR``.
    Called again as each store opens (the runtime loads with the first NIXL tier), so a NIXL
    that SGLang imported meanwhile is the one kvtier uses: one runtime per process."""
    current = os.environ.get("NIXL_LIB_DIR")
    if current and current != os.environ.get(_AUTO):
        return
    for name in _nixl_packages():
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.submodule_search_locations:
            continue
        site = Path(next(iter(spec.submodule_search_locations))).parent
        libs = site / f".{name}.mesonpy.libs"
        if (libs / "libnixl_capi.so").is_file():
            os.environ["NIXL_LIB_DIR"] = os.environ[_AUTO] = str(libs)
            return


_nixl_from_pip()

from ._kvtier import (  # noqa: E402
    ConfigError,
    InvalidBuffer,
    InvalidKey,
    InvalidPage,
    KvtierError,
    Timeout,
    Unavailable,
    __version__,
)
from ._kvtier import Store as _Store  # noqa: E402

__all__ = [
    "Store",
    "CompletionQueue",
    "KvtierError",
    "ConfigError",
    "InvalidKey",
    "InvalidPage",
    "InvalidBuffer",
    "Unavailable",
    "Timeout",
    "__version__",
]

Config = Union[str, "os.PathLike[str]", Mapping[str, Any]]


def _region(obj: Any) -> Any:
    """One region as the extension takes it: an ``(address, length)`` pair or a buffer of
    format ``B``. CPU tensors give their memory; other buffers are viewed as bytes."""
    if isinstance(obj, tuple):
        return obj
    if hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous"):
        if getattr(obj, "device", None) is not None and obj.device.type != "cpu":
            raise InvalidBuffer(f"a tensor on {obj.device} is not host memory")
        if not obj.is_contiguous():
            raise InvalidBuffer("the tensor is not contiguous")
        return (obj.data_ptr(), obj.numel() * obj.element_size())
    try:
        view = memoryview(obj)
    except TypeError as e:
        raise InvalidBuffer(f"not a buffer, tensor or (address, length): {e}") from None
    if view.format == "B" and view.ndim == 1:
        return view
    try:
        return view.cast("B")
    except TypeError as e:
        raise InvalidBuffer(f"the buffer cannot be viewed as bytes: {e}") from None


def _page(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_region(r) for r in obj]
    return _region(obj)


class Store:
    """A tier hierarchy.

    ``config`` is a path to a TOML or JSON file, or a mapping with the config-file schema
    (``{"hierarchy": {...}, "tiers": [{"kind": "mem", ...}, ...]}``).

    A page (in :meth:`put`) or a buffer (in :meth:`get_into`) is a bytes-like object, a CPU
    tensor, an ``(address, length)`` pair of host memory the caller keeps valid for the call,
    or a list of those: the regions of one page, stored as one page and present only whole.
    """

    def __init__(self, config: Config):
        _nixl_from_pip()
        if isinstance(config, Mapping):
            self._store = _Store.from_json(json.dumps(config))
        else:
            path = Path(config)
            try:
                text = path.read_text()
            except OSError as e:
                raise ConfigError(f"cannot read config {path}: {e}") from None
            if path.suffix == ".json":
                self._store = _Store.from_json(text)
            else:
                self._store = _Store.from_toml(text)

    def put(self, keys: Sequence[str], pages: Sequence[Any]) -> list:
        """Stores pages; per key ``None`` (stored) or the exception for that key."""
        return self._store.put(list(keys), [_page(p) for p in pages])

    def get_into(self, keys: Sequence[str], bufs: Sequence[Any]) -> list:
        """Reads pages into writable buffers of exactly the page's length; per key ``True``
        (hit), ``False`` (miss) or the exception for that key."""
        return self._store.get_into(list(keys), [_page(b) for b in bufs])

    def put_regions(self, keys: Sequence[str], addresses: Sequence[int], lengths: Sequence[int]) -> list:
        """Stores pages of raw host memory: the same number of regions per key, consecutive
        per page, as ``(addresses[i], lengths[i])`` (an engine's page-buffer metadata)."""
        return self._store.put_regions(list(keys), list(addresses), list(lengths))

    def get_into_regions(self, keys: Sequence[str], addresses: Sequence[int], lengths: Sequence[int]) -> list:
        """Reads pages into raw host regions laid out as for :meth:`put_regions`."""
        return self._store.get_into_regions(list(keys), list(addresses), list(lengths))

    def exists(self, keys: Iterable[str]) -> int:
        """The number of leading keys that are all present (the reusable prefix)."""
        return self._store.exists(list(keys))

    def remove(self, keys: Iterable[str]) -> list:
        """Removes pages; per key ``True`` (was present), ``False``, or the exception."""
        return self._store.remove(list(keys))

    def clear(self) -> None:
        """Removes every page the store's tiers hold, and nothing they do not own."""
        self._store.clear()

    def flush(self) -> None:
        """Waits until queued copies reached the lower tiers."""
        self._store.flush()

    def close(self) -> None:
        """Drains queued copies and stops background work."""
        self._store.close()

    def stats(self) -> dict:
        """Counters of the store, of each level, and of copies made of callers' bytes."""
        return self._store.stats()

    def metrics_text(self) -> str:
        """Prometheus metrics (OpenMetrics text): per tier and operation, call durations,
        pages, bytes and errors by kind; each tier's and the hierarchy's counters."""
        return self._store.metrics_text()

    def serve_metrics(self, addr: str = "127.0.0.1:0") -> tuple:
        """Serves :meth:`metrics_text` at ``http://ADDR/metrics`` for Prometheus until the
        store is dropped; returns the bound ``(host, port)`` (port 0 picks a free one)."""
        return self._store.serve_metrics(addr)

    def completion_queue(self, max_pending: int = 4096) -> "CompletionQueue":
        """A queue of non-blocking calls on this store (for engines whose threads must not
        wait): each ``submit_*`` returns an id at once, its completion is announced on
        :meth:`CompletionQueue.event_fd` and taken with :meth:`CompletionQueue.drain`."""
        return CompletionQueue(self._store.completion_queue(max_pending))

    @property
    def max_page_bytes(self) -> "int | None":
        """Largest page every tier takes (``None``: no limit)."""
        return self._store.max_page_bytes

    @property
    def kinds(self) -> list:
        """The levels' kinds, fastest first."""
        return self._store.kinds

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class CompletionQueue:
    """Non-blocking calls on a :class:`Store`, completed in kvtier's runtime.

    Each ``submit_*`` returns an id at once (or raises at once on bad input, or when
    ``max_pending`` calls are running or undrained). A finished call makes :meth:`event_fd`
    readable; :meth:`drain` takes every finished call as ``(id, per-key results)``, results as
    in :class:`Store`'s blocking calls (:meth:`submit_exists` answers per key whether it is in
    the leading run of present keys). The buffers a call uses are held until it is drained.
    """

    def __init__(self, queue: Any):
        self._queue = queue

    def event_fd(self) -> int:
        """An eventfd, readable while completions wait to be drained."""
        return self._queue.event_fd()

    def submit_put(self, keys: Sequence[str], pages: Sequence[Any]) -> int:
        """Stores pages (as :meth:`Store.put` takes them)."""
        return self._queue.submit_put(list(keys), [_page(p) for p in pages])

    def submit_get_into(self, keys: Sequence[str], bufs: Sequence[Any]) -> int:
        """Reads pages into writable buffers (as :meth:`Store.get_into` takes them)."""
        return self._queue.submit_get_into(list(keys), [_page(b) for b in bufs])

    def submit_put_regions(self, keys: Sequence[str], addresses: Sequence[int], lengths: Sequence[int]) -> int:
        """Stores pages of raw host regions (as :meth:`Store.put_regions` takes them)."""
        return self._queue.submit_put_regions(list(keys), list(addresses), list(lengths))

    def submit_get_into_regions(self, keys: Sequence[str], addresses: Sequence[int], lengths: Sequence[int]) -> int:
        """Reads pages into raw host regions (as :meth:`Store.get_into_regions` takes them)."""
        return self._queue.submit_get_into_regions(list(keys), list(addresses), list(lengths))

    def submit_exists(self, keys: Iterable[str]) -> int:
        """Checks presence; per key ``True`` when it is in the leading run of present keys."""
        return self._queue.submit_exists(list(keys))

    def submit_remove(self, keys: Iterable[str]) -> int:
        """Removes pages; per key ``True`` (was present) or ``False``."""
        return self._queue.submit_remove(list(keys))

    def drain(self) -> list:
        """Every finished call as ``(id, per-key results)``, in completion order."""
        return self._queue.drain()

    @property
    def pending(self) -> int:
        """Calls submitted and not yet drained."""
        return self._queue.pending

    def close(self, timeout: float = 60.0) -> None:
        """Refuses new calls and waits up to ``timeout`` seconds for the running ones."""
        self._queue.close(timeout)

