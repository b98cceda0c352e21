"""The backend's storage metrics for SGLang (``get_stats``: pages and bandwidth of each
prefetch and backup) and kvtier's own counters; a part of
:class:`kvtier.sglang.KvtierStorage`."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from . import Store


class BackupMetrics:
    """What SGLang's storage metrics take from a backend. A part of ``KvtierStorage``, which
    holds what it uses (below)."""

    config: Any
    store: Store
    mem_pool_host: Any
    _lock: threading.Lock
    _prefetch_pgs: list[int]
    _backup_pgs: list[int]
    _prefetch_bw: list[float]
    _backup_bw: list[float]

    def _record(
        self,
        pgs: list[Any],
        bws: list[Any],
        ok: int,
        host_indices: torch.Tensor,
        n: int,
        start: float,
    ) -> None:
        elapsed = time.perf_counter() - start
        if not getattr(self.config, "enable_storage_metrics", False) or n == 0:
            return
        page_bytes = self._page_bytes()
        with self._lock:
            pgs.append(ok)
            bws.append(ok * page_bytes / max(elapsed, 1e-9) / 1e9)

    def _page_bytes(self) -> int:
        pool = self.mem_pool_host
        if pool is None:
            return 0
        per_token = getattr(pool, "get_size_per_token", None)
        return int(per_token() * pool.page_size) if per_token else 0

    def get_stats(self) -> Any:
        with self._lock:
            prefetch, backup = self._prefetch_pgs, self._backup_pgs
            pbw, bbw = self._prefetch_bw, self._backup_bw
            self._prefetch_pgs, self._backup_pgs, self._prefetch_bw, self._backup_bw = (
                [],
                [],
                [],
                [],
            )
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics
        except ImportError:
            return {"prefetch_pgs": prefetch, "backup_pgs": backup, "kvtier": self.store.stats()}
        metrics = StorageMetrics()
        metrics.prefetch_pgs.extend(prefetch)
        metrics.backup_pgs.extend(backup)
        metrics.prefetch_bandwidth.extend(pbw)
        metrics.backup_bandwidth.extend(bbw)
        return metrics

    def kvtier_stats(self) -> dict[str, Any]:
        """kvtier's own counters (per tier and per level)."""
        return self.store.stats()
