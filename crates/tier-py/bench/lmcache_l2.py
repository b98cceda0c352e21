"""kvtier's LMCache L2 plugin beside LMCache's own file-system L2 adapters, through LMCache's
L2 adapter interface (the calls its StorageManager makes): store a batch of chunks, then load
them back into LMCache memory objects, every byte compared after each round. Each store starts
after `sync` (no dirty pages of earlier rounds waiting for the disk). Rounds are interleaved (each backend in turn, fresh keys each round) and medians are quoted, with the
ratio kvtier / LMCache.

    python crates/tier-py/bench/lmcache_l2.py [--chunks 32] [--chunk-mib 2] [--rounds 7]
        [--second-instance [--owner]]

With ``--second-instance``, two adapters of each backend run on one config at once (two LMCache
servers on one storage): the first stores a round's chunks, the second looks them up and loads
what it finds; prints the chunks the second hit and its lookup-and-load rate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lmcache.v1.check.check_mode_test_l2_adapter import (
    _create_l1_memory_desc,
    _create_memory_obj,
    _create_object_key,
    _run_load_phase,
    _run_lookup_phase,
    _run_store_phase,
)
from lmcache.v1.distributed.l2_adapters import create_l2_adapter
from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config

import engine_bench


def adapter_specs(root: Path, tuning: dict) -> dict:
    kv = root / "kvtier"
    return {
        "lmcache fs": {"type": "fs", "base_path": str(root / "lmcache-fs")},
        "lmcache fs_native": {"type": "fs_native", "base_path": str(root / "lmcache-fs-native")},
        "kvtier nixl-file": {"type": "native_plugin", "module_path": "kvtier.lmcache",
                             "class_name": "KvtierL2Connector",
                             "adapter_params": {"tiers": [{"kind": "nixl-file", "dirs": [str(kv)],
                                                           "capacity": "8GiB", **tuning}]}},
    }


def make_adapter(spec: dict, l1: torch.Tensor):
    cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[json.dumps(spec)]))
    return create_l2_adapter(cfg.adapters[0], l1_memory_desc=_create_l1_memory_desc(l1))


def one_round(adapter, l1, n, elems, tag):
    flat = l1.view(-1)
    keys = [_create_object_key("bench/model", f"{tag}-{i}") for i in range(n)]
    src = [_create_memory_obj(raw_data=flat[i * elems:(i + 1) * elems], fill_value=float(i % 97 + 1),
                              obj_size=elems, dtype=torch.float16) for i in range(n)]
    dst = [_create_memory_obj(raw_data=flat[(n + i) * elems:(n + i + 1) * elems], fill_value=0.0,
                              obj_size=elems, dtype=torch.float16) for i in range(n)]
    os.sync()  # every store starts with no dirty pages waiting for the disk
    t0 = time.perf_counter()
    _, ok = _run_store_phase(adapter, keys, src)
    t1 = time.perf_counter()
    _, bitmap = _run_load_phase(adapter, keys, dst)
    t2 = time.perf_counter()
    assert ok, "store failed"
    assert bitmap is not None and all(bitmap.test(i) for i in range(n)), "load missed"
    assert all(torch.equal(d.tensor, s.tensor) for d, s in zip(dst, src)), "bytes differ"
    adapter.submit_unlock(keys)
    return t1 - t0, t2 - t1


def chunks(l1, n, elems, tag, fill):
    """`n` chunks' keys and memory objects over `l1` (its first half), filled by `fill`."""
    flat = l1.view(-1)
    keys = [_create_object_key("bench/model", f"{tag}-{i}") for i in range(n)]
    objs = [_create_memory_obj(raw_data=flat[i * elems:(i + 1) * elems], fill_value=fill(i),
                               obj_size=elems, dtype=torch.float16) for i in range(n)]
    return keys, objs


def second_instance(args, root, tuning):
    """Two adapters of each backend on one config at once: the second's hits on the chunks the
    first stored, and its lookup-and-load rate (bytes compared outside the timed region)."""
    elems = int(args.chunk_mib * (1 << 20)) // 2
    n = args.chunks
    specs = adapter_specs(root, tuning)
    if args.owner:
        specs["kvtier nixl-file"]["adapter_params"]["tiers"][0]["access"] = "owner"
    l1s = [torch.empty(n * elems, dtype=torch.float16) for _ in range(2)]
    pairs = {}
    for name, spec in specs.items():
        try:
            pairs[name] = (make_adapter(spec, l1s[0]), make_adapter(spec, l1s[1]))
        except Exception as e:  # fs_native needs LMCache's native library
            print(f"{name}: not available here ({type(e).__name__}: {e})")
    hits = {name: [] for name in pairs}
    rates = {name: [] for name in pairs}
    try:
        for r in range(-1, args.rounds):  # round -1 warms up
            for name, (first, second) in pairs.items():
                keys, src = chunks(l1s[0], n, elems, f"s{r}", lambda i: float((i + r) % 97 + 1))
                _, dst = chunks(l1s[1], n, elems, f"s{r}", lambda i: 0.0)
                os.sync()
                _, ok = _run_store_phase(first, keys, src)
                assert ok, f"{name}: store failed"
                t0 = time.perf_counter()
                _, found = _run_lookup_phase(second, keys)
                present = [i for i in range(n) if found is not None and found.test(i)]
                if present:
                    _, loaded = _run_load_phase(second, [keys[i] for i in present], [dst[i] for i in present])
                    assert loaded is not None and all(loaded.test(j) for j in range(len(present))), \
                        f"{name}: a chunk it found did not load"
                elapsed = time.perf_counter() - t0
                assert all(torch.equal(dst[i].tensor, src[i].tensor) for i in present), f"{name}: bytes differ"
                second.submit_unlock([keys[i] for i in present])
                first.submit_unlock(keys)
                if r >= 0:
                    hits[name].append(len(present))
                    if present:
                        rates[name].append(len(present) * elems * 2 / (1 << 20) / elapsed)
    finally:
        for first, second in pairs.values():
            second.close()
            first.close()
    print(f"\ntwo adapters of each backend on one config at once, {n} chunks of {args.chunk_mib:g} MiB "
          f"per round, {args.rounds} rounds (kvtier access {'owner' if args.owner else 'default'})\n")
    print("| backend | chunks the second hit (median) | its lookup + load MiB/s |")
    print("|---|---:|---:|")
    for name in pairs:
        rate = statistics.median(rates[name]) if rates[name] else 0.0
        print(f"| {name} | {statistics.median(hits[name]):,.0f} of {n} | {rate:,.0f} |")
    k = rates["kvtier nixl-file"]
    for name in pairs:
        if name != "kvtier nixl-file" and k and rates[name]:
            print(f"kvtier / {name}: {statistics.median(k) / statistics.median(rates[name]):.2f}x")


def main():
    ap = engine_bench.parser(__doc__)
    ap.add_argument("--root", default=None, help="folder for the files (default: a temp folder)")
    ap.add_argument("--second-instance", action="store_true",
                    help="two adapters of each backend on one config at once: the second's hits and loads")
    ap.add_argument("--owner", action="store_true", help="kvtier's folder with access = \"owner\"")
    args = ap.parse_args()
    tuning = engine_bench.tier_tuning(args)
    root = Path(args.root or tempfile.mkdtemp(prefix="kvtier-lmcache-bench-"))
    if args.second_instance:
        try:
            second_instance(args, root, tuning)
        finally:
            if args.root is None:
                shutil.rmtree(root, ignore_errors=True)
        return
    elems = int(args.chunk_mib * (1 << 20)) // 2
    n = args.chunks
    l1 = torch.empty(2 * n * elems, dtype=torch.float16)
    adapters = {}
    for name, spec in adapter_specs(root, tuning).items():
        try:
            adapters[name] = make_adapter(spec, l1)
        except Exception as e:  # fs_native needs LMCache's native library
            print(f"{name}: not available here ({type(e).__name__}: {e})")
    times = {name: ([], []) for name in adapters}
    try:
        one_round(adapters["kvtier nixl-file"], l1, n, elems, "warm")
        for r in range(args.rounds):
            for name, adapter in adapters.items():
                store, load = one_round(adapter, l1, n, elems, f"r{r}")
                times[name][0].append(store)
                times[name][1].append(load)
    finally:
        for adapter in adapters.values():
            adapter.close()
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)
    mib = n * elems * 2 / (1 << 20)
    print(f"\n{n} chunks of {args.chunk_mib:g} MiB, {args.rounds} interleaved rounds, median MiB/s "
          "(every byte compared each round)\n")
    print(f"| backend | store MiB/s | load MiB/s |")
    print(f"|---|---:|---:|")
    med = {name: (mib / statistics.median(s), mib / statistics.median(l)) for name, (s, l) in times.items()}
    for name, (s, l) in med.items():
        print(f"| {name} | {s:,.0f} | {l:,.0f} |")
    k = med["kvtier nixl-file"]
    for name, (s, l) in med.items():
        if name != "kvtier nixl-file":
            print(f"kvtier / {name}: store {k[0] / s:.2f}x, load {k[1] / l:.2f}x")


if __name__ == "__main__":
    main()
