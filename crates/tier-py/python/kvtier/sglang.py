"""kvtier as SGLang's HiCache L3 storage backend.

Loaded by SGLang's ``StorageBackendFactory`` as a dynamic backend::

    --enable-hierarchical-cache --hicache-mem-layout page_first
    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang", "class_name": "KvtierStorage",
        "interface_v1": 1, "config": "/etc/kvtier/hierarchy.toml"}'

The hierarchy comes from ``extra_config["config"]`` (a TOML or JSON path) or inline from
``extra_config["tiers"]`` (and optional ``extra_config["hierarchy"]``). Each page is stored
whole with all of its host regions (an MHA page's K and V), moved straight between SGLang's
host pool and storage for the ``page_first`` layouts. Keys are namespaced by model, ranks and
page geometry (and ``extra_config["tenant"]`` and ``["model_revision"]`` where given), so
deployments sharing a folder or bucket never read each other's pages. The
data path never raises: a failure is ``False`` or a shorter prefix, logged at a bounded rate.
With ``extra_config["kv_events"]`` (SGLang's KV events publisher config, on an endpoint of
its own) the pages stored are published as SGLang's KV events, medium ``DISK`` (or
``["kv_events_medium"]``), for routers: see :mod:`kvtier.events`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

from . import ConfigError, Store
from ._engine import (
    PageNames,
    RateLimitedLog,
    close_all,
    integrity_secret,
    load_config,
    namespace,
    owned_file_tiers,
    serve_metrics,
    shared_by_default,
)
from ._sglang_metrics import BackupMetrics
from ._sglang_pools import HybridPools, PageMover, SidePool
from .events import PageEvents, runs

logger = logging.getLogger(__name__)


def _event_hash(key: str) -> int | None:
    """SGLang's event hash of a page's key (its chain hash in hex), as SGLang's own events name
    that page; ``None`` for a key that is not such a hash."""
    from sglang.srt.mem_cache.utils import hash_str_to_int64

    try:
        return int(hash_str_to_int64(key))
    except ValueError:
        return None


# Layouts whose pools SGLang can describe page by page (``get_page_buffer_meta``); a pool
# that cannot (MLA page_head) takes the generic flat-page path.
ZERO_COPY_LAYOUTS = ("page_first", "page_first_direct", "page_head", "layer_first")

# The extra_config keys kvtier reads, and those SGLang reads itself for a dynamic backend.
KVTIER_KEYS = frozenset(
    {
        "config",
        "tiers",
        "hierarchy",
        "tenant",
        "model_revision",
        "metrics_addr",
        "metrics_port_fallback",
        "kv_cache_dtype",
        "prefetch_timeout_base",
        "prefetch_timeout_per_ki_token",
        "kv_events",
        "kv_events_medium",
    }
)
SGLANG_KEYS = frozenset(
    {
        "backend_name",
        "module_path",
        "class_name",
        "interface_v1",
        "tp_lcm_size",
        "should_split_heads",
        "prefetch_threshold",
        "hicache_storage_pass_prefix_keys",
        "enable_metadata_cache",
        "metadata_ttl",
    }
)


def kv_cache_dtype(extra: dict[str, Any]) -> str | None:
    """The KV cache's format as the operator chose it (``--kv-cache-dtype``), which names the
    pages: SGLang's host pool holds every fp8 format as ``uint8``, so its dtype cannot tell
    e4m3 pages from e5m2 ones. From ``extra_config["kv_cache_dtype"]``, else from SGLang's
    server args; ``None`` where neither says or it is ``auto`` (the pool's dtype is then the
    model's, which names the pages)."""
    value = extra.get("kv_cache_dtype")
    if not value:
        try:
            from sglang.srt.runtime_context import get_server_args

            value = get_server_args().kv_cache_dtype
        except Exception:  # not in a server (no published args), or an older SGLang
            return None
    return None if value in (None, "", "auto") else str(value)


class KvtierStorage(HybridPools, BackupMetrics, HiCacheStorage):
    """A kvtier hierarchy behind SGLang HiCache."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict[str, Any] | None = None):
        extra = dict(storage_config.extra_config or {})
        unknown = sorted(set(extra) - KVTIER_KEYS - SGLANG_KEYS)
        if unknown:
            logger.warning(
                "kvtier: ignoring unknown extra_config keys %s (kvtier reads %s)",
                unknown,
                sorted(KVTIER_KEYS),
            )
        self.config = storage_config
        self.is_mla = bool(storage_config.is_mla_model)
        writer = getattr(storage_config, "is_storage_writer", None)
        self.is_writer = (
            bool(writer) if writer is not None else (not self.is_mla or storage_config.tp_rank == 0)
        )
        # Tenants sharing storage never meet: the tenant and the model revision name the pages,
        # keyed by the tiers' integrity secret where there is one.
        self.tenant = str(extra["tenant"]) if extra.get("tenant") else None
        self.revision = str(extra.get("model_revision") or "")
        self.kv_cache_dtype = kv_cache_dtype(extra)
        config = shared_by_default(load_config(extra))
        # Folders one process owns (access = "owner" named in the config): each DP group's
        # writer owns folders of its own. Shared folders (the default) are one cache for
        # every replica, DP group and node.
        self.owned_folders = bool(owned_file_tiers(config))
        # SGLang's `tp_lcm_size`: MHA instances of different TP sizes share pages split into
        # head groups of the least common multiple of their TP sizes (`page_head` pools), in
        # one folder for all TP ranks (so only where folders are shared).
        lcm, tp_size = int(storage_config.tp_lcm_size or 0), int(storage_config.tp_size or 1)
        self.tp_lcm = lcm if lcm and not self.is_mla and lcm % tp_size == 0 else 0
        if self.tp_lcm and self.owned_folders:
            logger.warning(
                'kvtier: tp_lcm_size needs shared folders (access = "shared", the default); '
                "with owned folders each TP rank keeps its own pages"
            )
            self.tp_lcm = 0
        # The namespaces of this rank's head groups, once its pool splits pages into them.
        self.head_groups: list[str] = []
        self.secret = integrity_secret(config)
        # With the secret, page names carry no chain hash in clear.
        self.page_names = PageNames(self.secret)
        self._config = config
        self.events = self._page_events(extra)
        self.store = Store(self._rank_config(config))
        # Where an MLA group's writer owns the folders, a reader rank's own shards of rank-
        # sharded side pools (Mamba) go to folders it owns (opened with the first such pool).
        self.shard_store: Store | None = None
        # Prometheus metrics of this rank's store, at the port given plus the rank.
        self.metrics_addr: Any = None
        if extra.get("metrics_addr"):
            fallback = bool(extra.get("metrics_port_fallback", False))
            try:
                self.metrics_addr = self._serve_metrics(str(extra["metrics_addr"]), fallback)
            except ConfigError:
                self.store.close()
                raise
        self.mem_pool_host: Any = None
        # How the KV pool's pages move (once the pool is registered).
        self.mover: PageMover | None = None
        # Side pools of hybrid models (Mamba, SWA, indexers), by SGLang's pool name.
        self.side_pools: dict[str, SidePool] = {}
        self.prefix = self._namespace(None)
        self.log = RateLimitedLog(logger)
        self._lock = threading.Lock()
        self._prefetch_pgs: list[int] = []
        self._backup_pgs: list[int] = []
        self._prefetch_bw: list[float] = []
        self._backup_bw: list[float] = []
        # SGLang's own prefetch bound (its defaults where the extra config names none): a read
        # kvtier has not finished by then is one SGLang has given up on, so kvtier stops it.
        self.timeout_base = float(extra.get("prefetch_timeout_base", 1.0))
        self.timeout_per_ki_token = float(extra.get("prefetch_timeout_per_ki_token", 0.25))

    def _page_events(self, extra: dict[str, Any]) -> PageEvents | None:
        """The publisher of the KV pages this backend stores (``kv_events``: SGLang's
        publisher config, its port offset by the DP group as SGLang's are; see
        :mod:`kvtier.events`), on the rank SGLang publishes from: the page writer at pipeline
        stage, attention TP and CP rank 0."""
        if not extra.get("kv_events"):
            return None
        c = self.config
        ranks = (getattr(c, f, 0) or 0 for f in ("tp_rank", "pp_rank", "attn_cp_rank"))
        if not self.is_writer or any(ranks):
            return None
        return PageEvents(
            "sglang",
            extra["kv_events"],
            block_size=int(getattr(c, "logical_page_size", None) or 1),
            medium=str(extra.get("kv_events_medium", "DISK")),
            dp_rank=int(getattr(c, "dp_rank", 0) or 0),
        )

    def _publish_stored(self, keys: list[str], ok: list[bool]) -> None:
        """Publishes the pages of ``keys`` that were stored (``ok``), run by run of a prefix,
        by SGLang's event hash of each page's key."""
        if self.events is None:
            return
        hashes = [_event_hash(k) for k in keys]
        for start, end in runs(
            [good and h is not None for good, h in zip(ok, hashes, strict=True)]
        ):
            parent = hashes[start - 1] if start else None
            self.events.stored([h for h in hashes[start:end] if h is not None], parent)

    def _read_timeout(self, pages: int) -> float:
        """SGLang's prefetch timeout for ``pages`` pages: base + per 1,024 tokens."""
        page_size = getattr(self.mem_pool_host, "page_size", 1) or 1
        return self.timeout_base + pages * page_size / 1024 * self.timeout_per_ki_token

    def _serve_metrics(self, addr: str, fallback: bool) -> tuple[Any, ...]:
        """Serves this rank's metrics at the port given plus the rank's index among the
        processes (TP rank, then attention CP rank, PP stage and DP group); a port taken by
        another process is a ``ConfigError`` naming it, unless ``fallback``
        (``metrics_port_fallback``): then it is logged and any free port served instead."""
        c = self.config

        def of(name: str, default: int) -> int:
            return int(getattr(c, name, default) or default)

        host, _, port = addr.rpartition(":")
        # One port per process: TP rank within its CP rank, PP stage and DP group.
        group = of("dp_rank", 0) * of("pp_size", 1) + of("pp_rank", 0)
        group = group * of("attn_cp_size", 1) + of("attn_cp_rank", 0)
        rank = of("tp_rank", 0) + of("tp_size", 1) * group
        return serve_metrics(self.store, host, int(port) + rank if int(port) else 0, fallback)

    # ------------------------------------------------------------------ ranks

    @property
    def zero_copy(self) -> bool:
        """Whether the KV pool's pages move straight between the pool and storage."""
        return self.mover is not None and self.mover.zero_copy

    def _rank_config(self, config: dict[str, Any], shards: bool = False) -> dict[str, Any]:
        """SGLang runs one process per rank, each with this same config. Each namespace (see
        :meth:`_namespace`) gets a folder (NIXL FILE) or prefix (object tiers) of its own
        under the configured ones, so ranks never contend for a folder's ownership and one
        rank's ``clear`` or crash touches only its own pages. NIXL FILE folders are shared
        (``access = "shared"``, the default): the ranks whose pages hold the same bytes in
        every replica, DP group and node store into and read from one folder. Where the
        config names ``access = "owner"``, an MLA attention group's writer (SGLang's
        ``is_storage_writer``) owns its folders and the group's other ranks open them as
        readers. ``shards``: the folders of this rank's own shards of rank-sharded side
        pools (Mamba), which it owns (see ``shard_store``), without the DRAM tiers (the
        rank's main store holds the one DRAM budget)."""
        if shards:
            ns = self._namespace(None, rank_sharded=True)
        else:
            ns = self._namespace(None, heads=f"heads-of{self.tp_lcm}" if self.tp_lcm else None)
        tiers = []
        for tier in config.get("tiers", []):
            tier = dict(tier)
            kind = tier.get("kind")
            if shards and kind == "mem":
                continue
            if kind == "nixl-file" and isinstance(tier.get("dirs"), list):
                tier["dirs"] = [os.path.join(str(d), ns) for d in tier["dirs"]]
                if not shards and not self.is_writer and tier.get("access", "owner") == "owner":
                    tier["access"] = "reader"
            elif kind in ("object", "nixl-obj") and isinstance(tier.get("prefix"), str):
                tier["prefix"] = f"{tier['prefix'].rstrip('/')}/{ns}" if tier["prefix"] else ns
            tiers.append(tier)
        return {**config, "tiers": tiers}

    # ------------------------------------------------------------------ keys

    def _namespace(
        self, geometry: str | None, rank_sharded: bool = False, heads: str | None = None
    ) -> str:
        """The pages' namespace: the model, the ranks whose pages hold the same bytes, and
        (once the host pool is known) the page geometry, layout and dtype.

        - MHA: every (attention) TP rank holds its own heads: ``tp_rank`` of ``tp_size``.
        - MLA: the latent is replicated over the attention TP group: no TP rank.
        - DP attention: ``tp_rank`` is local to the DP group, and its pages are the same in
          every group (MLA: one copy for all groups; MHA: one per attention TP rank). Only
          where folders are owned (``access = "owner"``) is the group (``dp_rank``) named, so
          that each group's writer owns folders of its own.
        - Attention context parallel and DCP: each rank holds a disjoint slice of a page.
        - PP: each stage holds its own layers.
        - ``rank_sharded``: a side pool whose state each TP rank holds a shard of even where
          the KV pool is replicated (Mamba): named by TP rank.
        - ``heads``: a head group of ``tp_lcm_size`` (MHA pages split by heads), whatever the
          TP size that stored it."""
        c = self.config
        ranks = "mla" if self.is_mla and not rank_sharded else f"tp{c.tp_rank}of{c.tp_size}"
        if heads is not None:
            ranks = heads
        if self.owned_folders:
            ranks += f"-dp{int(getattr(c, 'dp_rank', 0) or 0)}"
        if int(getattr(c, "attn_cp_size", 1) or 1) > 1:
            ranks += f"-cp{c.attn_cp_rank}of{c.attn_cp_size}"
        if int(getattr(c, "dcp_size", 1) or 1) > 1:
            ranks += f"-dcp{c.dcp_rank}of{c.dcp_size}"
        parts = [c.model_name or "", ranks, f"pp{c.pp_rank}of{c.pp_size}", geometry or "generic"]
        if self.revision:
            parts.append(f"revision={self.revision}")
        return namespace("sgl", parts, self.tenant, self.secret)

    def _key(self, key: str) -> str:
        return self.page_names(self.prefix, key)

    def _keys(self, keys: list[str]) -> list[str]:
        return [self._key(k) for k in keys]

    # ------------------------------------------------------------------ pool

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        layout = getattr(mem_pool_host, "layout", "unknown")
        page_size = mem_pool_host.page_size
        self.mover = PageMover(
            mem_pool_host, f"{layout} pool", zero_copy=layout in ZERO_COPY_LAYOUTS
        )
        dtype = str(getattr(mem_pool_host, "dtype", ""))
        geometry = f"{layout}/{page_size}/{self.mover.regions}/{dtype}"
        if self.kv_cache_dtype:
            geometry += f"/kv={self.kv_cache_dtype}"
        elif dtype == str(torch.uint8):
            logger.warning(
                "kvtier: the host pool holds bytes (uint8, as for every fp8 KV format) and the "
                "KV cache dtype is unknown: set extra_config kv_cache_dtype, or deployments of "
                "two fp8 formats on one storage read each other's pages"
            )
        self.prefix = self._namespace(geometry)
        self.head_groups = self._head_groups(mem_pool_host, page_size)
        if self.events is not None:
            self.events.block_size = page_size
        logger.info(
            "kvtier: host pool registered (layout %s, zero copy %s, tiers %s)",
            layout,
            self.zero_copy,
            self.store.kinds,
        )

    def _head_groups(self, pool: Any, page_size: int) -> list[str]:
        """With ``tp_lcm_size``, the namespaces of the head groups this rank's pages split into
        (``tp_lcm_size / tp_size`` of them, numbered among ``tp_lcm_size``), each stored as a
        page of its own (its K and V); none where the pool cannot split its pages."""
        if not self.tp_lcm:
            return []
        if getattr(pool, "layout", None) != "page_head" or not hasattr(
            pool, "get_split_heads_page_buffer_meta"
        ):
            logger.warning("kvtier: tp_lcm_size needs a page_head pool; pages are kept per TP rank")
            return []
        c = self.config
        split = self.tp_lcm // int(c.tp_size)
        probe = torch.arange(0, page_size, dtype=torch.int64)
        _, sizes = pool.get_split_heads_page_buffer_meta(probe, split)
        dtype = str(getattr(pool, "dtype", ""))
        geometry = f"page_head/{page_size}/{sizes[0]}x{sizes[1]}/{dtype}"
        if self.kv_cache_dtype:
            geometry += f"/kv={self.kv_cache_dtype}"
        first = int(c.tp_rank) * split
        return [
            self._namespace(geometry, heads=f"heads{g}of{self.tp_lcm}")
            for g in range(first, first + split)
        ]

    def _split_names(self, keys: list[str]) -> list[str]:
        """Each page's head-group names, page by page (as SGLang lists the regions)."""
        return [self.page_names(group, k) for k in keys for group in self.head_groups]

    def _per_page(self, results: list[Any], ok: Any) -> list[Any]:
        """Per page: the first head group's result that is not ``ok``, else ``ok``'s."""
        n = len(self.head_groups)
        pages = []
        for i in range(0, len(results), n):
            group = results[i : i + n]
            pages.append(next((r for r in group if not ok(r)), group[0]))
        return pages

    # ------------------------------------------------------------------ v1 (zero copy)

    def batch_set_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None
    ) -> list[bool]:
        if not keys:
            return []
        if not self.is_writer:
            return [True] * len(keys)
        start = time.perf_counter()
        try:
            if self.head_groups:
                ptrs, sizes = self.mem_pool_host.get_split_heads_page_buffer_meta(
                    host_indices, len(self.head_groups)
                )
                split = self.store.put_regions(self._split_names(keys), ptrs, sizes)
                results = self._per_page(split, lambda r: r is None)
            else:
                results = self._kv_mover().store(self.store, self._keys(keys), host_indices)
        except Exception as e:
            self.log.warn("batch_set_v1", e)
            return [False] * len(keys)
        ok = [r is None for r in results]
        for r in results:
            if r is not None:
                self.log.warn("put", r)
        self._record(self._backup_pgs, self._backup_bw, sum(ok), host_indices, len(keys), start)
        self._publish_stored(keys, ok)
        return ok

    def batch_get_v1(
        self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None
    ) -> list[bool]:
        if not keys:
            return []
        start = time.perf_counter()
        try:
            if self.head_groups:
                ptrs, sizes = self.mem_pool_host.get_split_heads_page_buffer_meta(
                    host_indices, len(self.head_groups)
                )
                split = self.store.get_into_regions(
                    self._split_names(keys), ptrs, sizes, timeout=self._read_timeout(len(keys))
                )
                results = self._per_page(split, lambda r: r is True)
            else:
                results = self._kv_mover().load(
                    self.store, self._keys(keys), host_indices, self._read_timeout(len(keys))
                )
        except Exception as e:
            self.log.warn("batch_get_v1", e)
            return [False] * len(keys)
        ok = []
        for r in results:
            if r is not True and r is not False:
                self.log.warn("get", r)
            ok.append(r is True)
        self._record(self._prefetch_pgs, self._prefetch_bw, sum(ok), host_indices, len(keys), start)
        return ok

    def _kv_mover(self) -> PageMover:
        if self.mover is None:
            raise RuntimeError("no host pool registered (register_mem_pool_host)")
        return self.mover

    def _kv_names(self, keys: list[str]) -> list[str]:
        """The names the KV pages of ``keys`` are stored as: each page's head groups, page by
        page, with ``tp_lcm_size``; one name per page otherwise."""
        return self._split_names(keys) if self.head_groups else self._keys(keys)

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        if not keys:
            return 0
        try:
            found = self.store.exists(self._kv_names(keys), timeout=self.timeout_base)
            return int(found) // max(1, len(self.head_groups))
        except Exception as e:
            self.log.warn("batch_exists", e)
            return 0

    # ------------------------------------------------------------------ v2 (hybrid models)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """A side pool of a hybrid model (Mamba states, SWA, an indexer): its pages are stored
        beside the KV pages, each under its KV page's key in a namespace of the pool's own."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._register_side_pool(host_pool, str(host_pool_name))

    # ------------------------------------------------------------------ generic API

    def get(
        self, key: str, target_location: Any = None, target_sizes: Any = None
    ) -> torch.Tensor | None:
        got = self.batch_get([key], [target_location] if target_location is not None else None)
        return got[0] if got else None

    def batch_get(
        self, keys: list[str], target_locations: Any = None, target_sizes: Any = None
    ) -> list[torch.Tensor | None]:
        try:
            if target_locations is None:
                target_locations = [self.mem_pool_host.get_dummy_flat_data_page() for _ in keys]
            results = self.store.get_into(
                self._keys(keys), list(target_locations), timeout=self._read_timeout(len(keys))
            )
        except Exception as e:
            self.log.warn("batch_get", e)
            return [None] * len(keys)
        out = []
        for r, t in zip(results, target_locations, strict=True):
            if r is not True and r is not False:
                self.log.warn("get", r)
            out.append(t if r is True else None)
        return out

    def set(
        self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None
    ) -> bool:
        return self.batch_set([key], [value])

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        if not keys:
            return True
        if not self.is_writer:
            return True
        try:
            results = self.store.put(
                self._keys(keys),
                [v.contiguous() if hasattr(v, "contiguous") else v for v in values],
            )
        except Exception as e:
            self.log.warn("batch_set", e)
            return False
        for r in results:
            if r is not None:
                self.log.warn("put", r)
        self._publish_stored(keys, [r is None for r in results])
        return all(r is None for r in results)

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def clear(self) -> None:
        """Removes this namespace's pages: a rank's own (MHA), or its attention group's
        (MLA, from the group's writer). Other ranks', groups' and models' pages stay; an MLA
        reader rank removes only its own Mamba shards' pages (``shard_store``). A failure
        raises (SGLang then reports the clear failed)."""
        stores = [self.store] if self.is_writer else []
        if self.shard_store is not None:
            stores.append(self.shard_store)
        try:
            for store in stores:
                store.clear()
        except Exception as e:
            # SGLang reports the clear failed (and keeps what it believes storage holds).
            self.log.warn("clear", e)
            raise
        if self.events is not None:
            self.events.cleared()

    def close(self) -> None:
        """Writes the pages still queued for the lower tiers (bounded by the hierarchy's
        ``flush_timeout``; what did not land is logged) and stops background work. SGLang
        calls it when it detaches the backend; at interpreter exit kvtier does."""
        closes = [self.store.close]
        if self.shard_store is not None:
            closes.append(self.shard_store.close)
        if self.events is not None:
            closes.append(self.events.close)
        close_all(self.log, "close", *closes)
