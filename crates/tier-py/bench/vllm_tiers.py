"""kvtier's vLLM secondary tier beside vLLM's own file-system tier (``fs``), both driven by
vLLM's ``TieringOffloadingManager`` as its scheduler drives them: an engine stores chunks
(cascade from the primary CPU tier, timed until drained), then a restarted engine loads them
back (lookups and promotions, timed until every chunk is a HIT in its primary tier), every
byte compared. Each store starts after `sync` (no dirty pages of earlier rounds waiting for
the disk). Rounds are interleaved (each backend in turn, fresh chunks each round) and
medians are quoted, with the ratio kvtier / vLLM.

    python crates/tier-py/bench/vllm_tiers.py [--chunks 32] [--chunk-mib 2] [--rounds 7]
        [--second-instance [--owner]]
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import engine_bench


def make_manager(secondary, chunk_bytes, chunks):
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("model.layers.0.attn",), group_id=0),),
        worker_kv_bytes_per_block=chunk_bytes, enable_kv_cache_events=False,
        extra_config={"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": chunks * chunk_bytes,
                      "secondary_tiers": [secondary]},
        engine_id=f"kvtier-bench-{time.monotonic_ns()}",
        model=OffloadingModelConfig(name="bench/model", dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1, data_parallel_index=0,
            data_parallel_size=1, data_parallel_rank_local=None, is_parallelism_agnostic=False),
    )
    return OffloadingSpecFactory.create_spec(config).get_manager()


def store(secondary, keys, data, chunk_bytes, keep_open=None):
    """Times a store; with `keep_open` (a list), the engine stays up (appended to it) for a
    second engine to load from while it runs."""
    from vllm.v1.kv_offload.base import ReqContext

    m = make_manager(secondary, chunk_bytes, len(keys))
    kept = False
    try:
        primary = np.asarray(m.primary_tier.get_kv_memoryview())
        req = ReqContext(req_id="w")
        with m.lock:
            m.on_new_request(req)
            out = m.prepare_store(keys, req)
            for k, chunk in zip(keys, out.store_spec.chunk_ids):
                primary[chunk] = data[k]
            os.sync()  # every store starts with no dirty pages waiting for the disk
            t0 = time.perf_counter()
            m.complete_store(keys, req)
            m.on_request_finished(req)
            m.reset_cache()  # waits for the tier's jobs
            elapsed = time.perf_counter() - t0
        if keep_open is not None:
            keep_open.append(m)
            kept = True
        return elapsed
    finally:
        primary = None
        if not kept:
            m.shutdown()


def load(secondary, keys, data, chunk_bytes, give_up_s=120.0):
    """Times a new engine's lookups until every chunk is a HIT in its primary tier (bytes
    compared); ``None`` if not every chunk is one by ``give_up_s``."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext

    m = make_manager(secondary, chunk_bytes, len(keys))
    try:
        primary = np.asarray(m.primary_tier.get_kv_memoryview())
        req = ReqContext(req_id="r")
        end = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
        t0 = time.perf_counter()
        with m.lock:
            m.on_new_request(req)
        deadline = time.monotonic() + give_up_s
        while True:
            with m.lock:
                results = [m.lookup(k, req) for k in keys]
                if all(r is LookupResult.HIT for r in results):
                    break
                m.on_schedule_end(end)
            if time.monotonic() > deadline:
                return None
            time.sleep(0.0005)
        elapsed = time.perf_counter() - t0
        with m.lock:
            spec = m.prepare_load(keys, req)
        for k, chunk in zip(keys, spec.chunk_ids):
            assert np.array_equal(primary[chunk], data[k]), "bytes differ"
        with m.lock:
            m.complete_load(keys, req)
            m.on_request_finished(req)
        return elapsed
    finally:
        primary = None
        m.shutdown()


def main():
    ap = engine_bench.parser(__doc__)
    ap.add_argument("--second-instance", action="store_true",
                    help="the engine that loads runs beside the one that stored (two instances on one "
                         "config at once), not after it")
    ap.add_argument("--owner", action="store_true", help="kvtier's folder with access = \"owner\"")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    from vllm.v1.kv_offload.base import make_offload_key

    root = Path(tempfile.mkdtemp(prefix="kvtier-vllm-bench-"))
    chunk_bytes = int(args.chunk_mib * (1 << 20))
    tuning = engine_bench.tier_tuning(args)
    backends = {
        "vllm fs": {"type": "fs", "root_dir": str(root / "vllm-fs")},
        "kvtier nixl-file": {"type": "KvtierSecondaryTier", "module_path": "kvtier.vllm",
                             "tiers": [{"kind": "nixl-file", "dirs": [str(root / "kvtier")], "capacity": "16GiB",
                                        **tuning}]},
    }
    if args.owner:
        backends["kvtier nixl-file"]["tiers"][0]["access"] = "owner"
    rng = np.random.default_rng(1)
    times = {name: ([], []) for name in backends}
    missed = {name: 0 for name in backends}
    try:
        for r in range(-1, args.rounds):  # round -1 warms up
            for name, secondary in backends.items():
                keys = [make_offload_key(rng.bytes(32), 0) for _ in range(args.chunks)]
                data = {k: rng.integers(-128, 128, chunk_bytes, dtype=np.int8) for k in keys}
                running = [] if args.second_instance else None
                try:
                    s = store(secondary, keys, data, chunk_bytes, keep_open=running)
                    lo = load(secondary, keys, data, chunk_bytes, give_up_s=10.0 if running is not None else 120.0)
                finally:
                    for m in running or []:
                        m.shutdown()
                if lo is None:
                    missed[name] += 1
                    if running is None:
                        raise RuntimeError(f"{name}: a restarted engine did not load every chunk")
                    continue
                if r >= 0:
                    times[name][0].append(s)
                    times[name][1].append(lo)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.second_instance:
        print(f"\nsecond engine, running beside the one that stored (kvtier access "
              f"{'owner' if args.owner else 'default'}): rounds in which it did not hit every chunk "
              "within 10 s: " + ", ".join(f"{n} {m} of {args.rounds + 1}" for n, m in missed.items()))
        times = {n: t for n, t in times.items() if t[0]}
        if "kvtier nixl-file" not in times:
            return
    mib = args.chunks * chunk_bytes / (1 << 20)
    print(f"\n{args.chunks} chunks of {args.chunk_mib:g} MiB, {args.rounds} interleaved rounds, median MiB/s "
          "(store: cascade until drained; load: a restarted engine's lookups until all HIT, or with "
          "--second-instance another engine's while the first runs; bytes compared)\n")
    print("| backend | store MiB/s | load MiB/s |")
    print("|---|---:|---:|")
    med = {n: (mib / statistics.median(s), mib / statistics.median(l)) for n, (s, l) in times.items()}
    for n, (s, l) in med.items():
        print(f"| {n} | {s:,.0f} | {l:,.0f} |")
    k = med["kvtier nixl-file"]
    for n, (s, l) in med.items():
        if n != "kvtier nixl-file":
            print(f"kvtier / {n}: store {k[0] / s:.2f}x, load {k[1] / l:.2f}x")


if __name__ == "__main__":
    main()
