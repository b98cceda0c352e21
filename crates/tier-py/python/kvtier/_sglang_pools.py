"""SGLang's host pools as kvtier moves them: a pool's pages (:class:`PageMover`), a hybrid
model's side pools (:class:`SidePool`), and the backend's side of SGLang's v2 interface for
them (:class:`HybridPools`, a part of :class:`kvtier.sglang.KvtierStorage`)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from . import Store
from ._engine import PageNames, RateLimitedLog

logger = logging.getLogger("kvtier.sglang")


# Side pools SGLang's controller backs up on every TP rank even where the KV pool is replicated
# (MLA): each rank holds a shard of their state.
RANK_SHARDED_POOLS = frozenset({"mamba"})


class PageMover:
    """How one host pool's pages move between the pool and storage: straight, where the pool
    describes its pages (``get_page_buffer_meta``), else through its flat pages."""

    def __init__(self, pool: Any, what: str, zero_copy: bool = True):
        self.pool = pool
        self.page_size = int(getattr(pool, "page_size", 1) or 1)
        self.zero_copy = False
        if zero_copy and hasattr(pool, "get_page_buffer_meta"):
            probe = torch.arange(0, self.page_size, dtype=torch.int64)
            try:
                _, sizes = pool.get_page_buffer_meta(probe)
                self.zero_copy = True
                self.regions = "x".join(str(s) for s in sizes)
            except Exception as e:  # the pool cannot describe its pages: flat pages
                logger.warning(
                    "kvtier: %s without zero-copy metadata (%s): pages are copied", what, e
                )
        if not self.zero_copy:
            self.regions = str(pool.get_dummy_flat_data_page().numel())

    def store(self, store: Store, names: list[str], rows: Any) -> list[Any]:
        """Writes the pages at host indices ``rows`` (``page_size`` per page) as ``names``."""
        if self.zero_copy:
            ptrs, sizes = self.pool.get_page_buffer_meta(rows)
            return list(store.put_regions(names, ptrs, sizes))
        pages = [
            self.pool.get_data_page(rows[i * self.page_size], flat=True).contiguous()
            for i in range(len(names))
        ]
        return list(store.put(names, pages))

    def load(self, store: Store, names: list[str], rows: Any, timeout: float) -> list[Any]:
        """Reads ``names`` into the pages at host indices ``rows``."""
        if self.zero_copy:
            ptrs, sizes = self.pool.get_page_buffer_meta(rows)
            return list(store.get_into_regions(names, ptrs, sizes, timeout=timeout))
        bufs = [self.pool.get_dummy_flat_data_page() for _ in names]
        results = list(store.get_into(names, bufs, timeout=timeout))
        for i, r in enumerate(results):
            if r is True:
                self.pool.set_from_flat_data_page(rows[i * self.page_size], bufs[i])
        return results


class SidePool:
    """A hybrid model's side pool (SGLang's host pool of Mamba states, SWA or indexer pages):
    its pages are stored under their KV pages' keys, in a namespace of the pool's own
    (``prefix``), in ``store``."""

    def __init__(self, name: str, pool: Any, store: Store, page_names: PageNames):
        self.name, self.store, self.page_names = name, store, page_names
        self.mover = PageMover(pool, f"side pool {name}")
        layout, dtype = getattr(pool, "layout", "unknown"), str(getattr(pool, "dtype", ""))
        size = self.mover.page_size
        self.geometry = f"pool={name}/{layout}/{size}/{self.mover.regions}/{dtype}"
        self.prefix = ""

    def names(self, keys: list[str]) -> list[str]:
        return [self.page_names(self.prefix, k) for k in keys]

    def rows(self, host_indices: Any, pages: int) -> Any:
        """The host indices of ``pages`` pages, checked to cover them."""
        n = 0 if host_indices is None else int(host_indices.numel())
        size = self.mover.page_size
        if n != pages * size:
            raise ValueError(f"side pool {self.name}: {n} host indices for {pages} pages of {size}")
        return host_indices


class HybridPools:
    """The side pools of a hybrid model behind SGLang's v2 interface: registered, checked,
    stored and loaded beside the KV pages. A part of ``KvtierStorage``, which holds what it
    uses (below) and the methods it calls (declared here, defined there)."""

    store: Store
    shard_store: Store | None
    side_pools: dict[str, SidePool]
    is_mla: bool
    is_writer: bool
    owned_folders: bool
    _config: dict[str, Any]
    page_names: PageNames
    head_groups: list[str]
    timeout_base: float
    log: RateLimitedLog

    def _rank_config(self, config: dict[str, Any], shards: bool = False) -> dict[str, Any]:
        raise NotImplementedError

    def _namespace(
        self, geometry: str | None, rank_sharded: bool = False, heads: str | None = None
    ) -> str:
        raise NotImplementedError

    def _kv_names(self, keys: list[str]) -> list[str]:
        raise NotImplementedError

    def _read_timeout(self, pages: int) -> float:
        raise NotImplementedError

    def _register_side_pool(self, host_pool: Any, name: str) -> None:
        """Takes a side pool SGLang registered (see ``register_mem_host_pool_v2``)."""
        sharded = name in RANK_SHARDED_POOLS
        store = self._shard_store() if sharded else self.store
        pool = SidePool(name, host_pool, store, self.page_names)
        pool.prefix = self._namespace(pool.geometry, rank_sharded=sharded)
        self.side_pools[name] = pool
        logger.info("kvtier: side pool %s registered (zero copy %s)", name, pool.mover.zero_copy)

    def batch_exists_v2(
        self, keys: list[str], pool_transfers: Any = None, extra_info: Any = None
    ) -> Any:
        """The longest KV prefix whose side pools' pages are present by each pool's hit
        policy (every page, or the trailing pages a state pool restores from), and every
        prefix length that is restorable: SGLang's own backends' semantics."""
        from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolTransferResult

        transfers = list(pool_transfers or [])
        if not keys:
            return PoolTransferResult(0, {}, [])
        try:
            # Per store, one presence check of every name it holds.
            asked: dict[int, tuple[Store, list[str]]] = {id(self.store): (self.store, [])}
            kv_names = self._kv_names(keys)
            asked[id(self.store)][1].extend(kv_names)
            for t in transfers:
                pool = self._side(str(t.name))
                asked.setdefault(id(pool.store), (pool.store, []))[1].extend(pool.names(keys))
            found: dict[str, bool] = {}
            for store, names in asked.values():
                answers = store.contains(names, timeout=self.timeout_base)
                found.update((n, r is True) for n, r in zip(names, answers, strict=True))
        except Exception as e:
            self.log.warn("batch_exists_v2", e)
            return PoolTransferResult(0, {}, [])
        groups = max(1, len(self.head_groups))
        kv = [
            all(found[n] for n in kv_names[i * groups : (i + 1) * groups]) for i in range(len(keys))
        ]
        kv_pages = kv.index(False) if False in kv else len(keys)
        hits: dict[Any, int] = {"kv": kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        for t in transfers:
            has = [found[n] for n in self._side(str(t.name)).names(keys)]
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = has.index(False) if False in has[:kv_pages] else kv_pages
                pool_restorable = set(range(1, boundary + 1))
            elif t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                trailing = max(1, len(t.keys) if t.keys else 1)
                pool_restorable = {
                    n for n in range(1, kv_pages + 1) if all(has[max(0, n - trailing) : n])
                }
                boundary = max(pool_restorable, default=0)
            else:
                self.log.warn("batch_exists_v2", ValueError(f"hit policy {t.hit_policy}"))
                pool_restorable, boundary = set(), 0
            if boundary:
                hits[t.name] = boundary
            restorable &= pool_restorable
        ordered = sorted(restorable)
        return PoolTransferResult(ordered[-1] if ordered else 0, hits, ordered)

    def batch_get_v2(self, transfers: Any, extra_info: Any = None) -> dict[str, list[bool]]:
        return self._side_io(transfers, load=True)

    def batch_set_v2(self, transfers: Any, extra_info: Any = None) -> dict[str, list[bool]]:
        # SGLang's controller picks the pools each rank backs up (a replicated pool's
        # writer only; a TP-sharded one on every rank): what it hands over is written.
        return self._side_io(transfers, load=False)

    def _shard_store(self) -> Store:
        """The store of this rank's shards of rank-sharded side pools (Mamba): the KV pages'
        store, but for an MLA reader rank whose group's writer owns the folders (it cannot
        write there): folders of its own, opened once, with the config's tiers."""
        if not (self.is_mla and not self.is_writer and self.owned_folders):
            return self.store
        if self.shard_store is None:
            self.shard_store = Store(self._rank_config(self._config, shards=True))
        return self.shard_store

    def _side(self, name: str) -> SidePool:
        pool = self.side_pools.get(name)
        if pool is None:
            raise KeyError(f"side pool {name} was never registered (register_mem_host_pool_v2)")
        return pool

    def _side_io(self, transfers: Any, load: bool) -> dict[str, list[bool]]:
        """Each transfer's pages between its side pool and storage: per page whether it
        moved. A transfer whose indices do not cover its keys moves nothing."""
        what = "batch_get_v2" if load else "batch_set_v2"
        results: dict[str, list[bool]] = {}
        for t in transfers or []:
            name, keys = str(t.name), list(t.keys or [])
            results[t.name] = [False] * len(keys)
            if not keys:
                continue
            try:
                pool = self._side(name)
                rows = pool.rows(t.host_indices, len(keys))
                names = pool.names(keys)
                if load:
                    timeout = self._read_timeout(len(keys))
                    got = pool.mover.load(pool.store, names, rows, timeout)
                else:
                    got = pool.mover.store(pool.store, names, rows)
            except Exception as e:
                self.log.warn(what, e)
                continue
            for r in got:
                if r is not True and r is not False and r is not None:
                    self.log.warn(what, r)
            results[t.name] = [r is True for r in got] if load else [r is None for r in got]
        return results
