"""KV events for routers, from the engines that publish none for their storage tier.

vLLM's own KV events carry what kvtier stores (``enable_kv_events`` in :mod:`kvtier.vllm`).
SGLang publishes its GPU and host tiers' events only, and LMCache its CPU tier's only, so a
router routing by cached prefix never learns what their storage tier holds. Here kvtier
publishes the pages it stored (``BlockStored``, medium ``DISK`` by default) and its clears
(``AllBlocksCleared``) on a publisher of its own, configured as the engine's own publisher
is (``{"publisher": "zmq", "endpoint": "tcp://*:5560", "topic": "kvtier"}``), built from the
engine's own classes: a router subscribes to it as to the engine's. Evictions inside kvtier
are not published: a router's entry for a page kvtier has since evicted costs a lookup miss.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from . import ConfigError
from ._engine import RateLimitedLog

logger = logging.getLogger(__name__)

# The media a storage tier's events may name: SGLang's L3 (local disk) and L4 (shared pool).
_MEDIA = ("DISK", "EXTERNAL")


class PageEvents:
    """A publisher of the pages kvtier stored, as KV events of ``engine`` (``"sglang"`` or
    ``"vllm"``): its ``EventPublisherFactory``, ``KVEventBatch``, ``BlockStored`` and
    ``AllBlocksCleared``. ``config`` is the engine's publisher config (a mapping or its JSON
    text); ``dp_rank`` offsets the endpoint's port as the engine's own publishers do."""

    def __init__(
        self,
        engine: str,
        config: Any,
        *,
        block_size: int,
        medium: str = "DISK",
        dp_rank: int = 0,
    ):
        if isinstance(config, str):
            try:
                config = json.loads(config)
            except ValueError as e:
                raise ConfigError(f"kv_events must be a JSON object: {e}") from None
        if not isinstance(config, dict):
            raise ConfigError(f"kv_events must be a mapping, not {type(config).__name__}")
        if medium not in _MEDIA:
            raise ConfigError(f"kv_events_medium must be one of {list(_MEDIA)}, not {medium!r}")
        config = {"publisher": "zmq", **config}
        self.engine = engine
        self.block_size = int(block_size)
        self.medium = medium
        self.log = RateLimitedLog(logger)
        try:
            if engine == "sglang":
                from sglang.srt.disaggregation.kv_events import (
                    AllBlocksCleared,
                    BlockStored,
                    EventPublisherFactory,
                    KVEventBatch,
                )

                self.publisher = EventPublisherFactory.create(json.dumps(config), dp_rank)
            elif engine == "vllm":
                from vllm.config.kv_events import KVEventsConfig
                from vllm.distributed.kv_events import (
                    AllBlocksCleared,
                    BlockStored,
                    EventPublisherFactory,
                    KVEventBatch,
                )

                made = KVEventsConfig(enable_kv_cache_events=True, **config)
                self.publisher = EventPublisherFactory.create(made, dp_rank)
            else:
                raise ConfigError(f"no KV events for engine {engine!r}")
        except ConfigError:
            raise
        except (TypeError, ValueError) as e:
            raise ConfigError(f"kv_events: {e}") from None
        self._batch, self._stored, self._cleared = KVEventBatch, BlockStored, AllBlocksCleared

    @classmethod
    def of_any_engine(cls, config: Any, **kwargs: Any) -> PageEvents:
        """With the classes of whichever engine is importable: vLLM's, else SGLang's (an
        engine-agnostic host such as LMCache's server)."""
        for engine, module in (
            ("vllm", "vllm.distributed.kv_events"),
            ("sglang", "sglang.srt.disaggregation.kv_events"),
        ):
            try:
                __import__(module)
            except ImportError:
                continue
            return cls(engine, config, **kwargs)
        raise ConfigError(
            "kv_events needs vLLM's or SGLang's KV event classes (vllm.distributed.kv_events "
            "or sglang.srt.disaggregation.kv_events) importable"
        )

    def digest_hash(self, digest: bytes) -> int | bytes:
        """The event hash of a page named by ``digest`` (LMCache's chunk hash): the digest
        itself where the engine's events carry bytes (vLLM's), else its first 64 bits as a
        signed integer (SGLang's events, which reduce a hex chain hash the same way)."""
        if self.engine == "vllm":
            return digest
        return int.from_bytes(digest[:8], "big", signed=True)

    def stored(self, hashes: Sequence[int | bytes], parent: int | bytes | None = None) -> None:
        """Publishes that kvtier holds the pages of ``hashes``, a run of one prefix in order
        (``parent``: the page before the run, where known)."""
        if not hashes:
            return
        event = self._stored(
            block_hashes=list(hashes),
            parent_block_hash=parent,
            token_ids=[],
            block_size=self.block_size,
            lora_id=None,
            medium=self.medium,
            lora_name=None,
        )
        self._publish(event)

    def cleared(self) -> None:
        """Publishes that kvtier dropped every page it held."""
        self._publish(self._cleared())

    def _publish(self, event: Any) -> None:
        try:
            self.publisher.publish(self._batch(ts=time.time(), events=[event]))
        except Exception as e:
            self.log.warn("publish a KV event", e)

    def close(self) -> None:
        """Stops the publisher (the engine's own bound on sending what is queued)."""
        try:
            self.publisher.shutdown()
        except Exception as e:
            self.log.warn("close the KV event publisher", e)


def runs(ok: Sequence[bool]) -> list[tuple[int, int]]:
    """The ``(start, end)`` ranges of consecutive ``True`` in ``ok``."""
    out: list[tuple[int, int]] = []
    start = None
    for i, good in enumerate([*ok, False]):
        if good and start is None:
            start = i
        elif not good and start is not None:
            out.append((start, i))
            start = None
    return out
