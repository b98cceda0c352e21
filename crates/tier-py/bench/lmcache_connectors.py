"""Loads through the two native L2 connectors alone: kvtier's `KvtierL2Connector` and LMCache's
`LMCacheFSClient` (what its `fs_native` adapter wraps), each submitting a batch get and waiting
on its event fd, into the same memoryviews, from the page cache. Rounds are interleaved (the same
keys each round), medians quoted, with the CPU a load took (every thread of the process) and the
cores it kept busy.

``--between torch`` (the default) zeroes the destination and compares it with the source with
torch between loads, as `lmcache_l2.py` does, so torch's OpenMP threads are awake when a load
starts; ``--between none`` runs the loads back to back.

    python crates/tier-py/bench/lmcache_connectors.py [--chunks 32] [--chunk-mib 2]
        [--rounds 41] [--between torch|none] [--fs-native-workers 4] [--engine nixl|syscalls]
"""

from __future__ import annotations

import select
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import engine_bench
import torch
from kvtier.lmcache import KvtierL2Connector
from lmcache.lmcache_fs import LMCacheFSClient


def wait(client, fid: int) -> bool:
    """Waits on the client's event fd until call `fid` completes; whether it succeeded."""
    while True:
        for done in client.drain_completions():
            if done[0] == fid:
                return bool(done[1])
        select.select([client.event_fd()], [], [], 1.0)


def main() -> None:
    ap = engine_bench.parser(__doc__)
    ap.set_defaults(rounds=41)
    ap.add_argument("--between", choices=["torch", "none"], default="torch")
    ap.add_argument("--fs-native-workers", type=int, default=4)
    args = ap.parse_args()
    size = int(args.chunk_mib * (1 << 20))
    n = args.chunks
    root = Path(tempfile.mkdtemp(prefix="kvtier-connectors-bench-"))
    tier = {"kind": "nixl-file", "dirs": [str(root / "kvtier")], "capacity": "8GiB",
            **engine_bench.tier_tuning(args)}
    clients = {
        "lmcache fs_native": LMCacheFSClient(str(root / "fs-native"), args.fs_native_workers, "",
                                             False, 0),
        "kvtier nixl-file": KvtierL2Connector(tiers=[tier]),
    }
    src = torch.randint(0, 255, (n * size,), dtype=torch.uint8)
    dst = torch.zeros(n * size, dtype=torch.uint8)
    sources = [memoryview(src[i * size:(i + 1) * size].numpy()) for i in range(n)]
    views = [memoryview(dst[i * size:(i + 1) * size].numpy()) for i in range(n)]
    keys = [f"bench@model@0@{i:064x}" for i in range(n)]
    times: dict[str, list[float]] = {name: [] for name in clients}
    cpu: dict[str, list[float]] = {name: [] for name in clients}
    try:
        for client in clients.values():
            assert wait(client, client.submit_batch_set(keys, sources)), "store failed"
        for r in range(args.rounds + 1):  # round 0 warms up
            for name, client in clients.items():
                if args.between == "torch":
                    dst.zero_()
                c0, t0 = time.process_time(), time.perf_counter()
                ok = wait(client, client.submit_batch_get(keys, views))
                t1, c1 = time.perf_counter(), time.process_time()
                assert ok, f"{name}: load failed"
                if args.between == "torch":
                    assert torch.equal(dst, src), f"{name}: bytes differ"
                if r:
                    times[name].append(t1 - t0)
                    cpu[name].append(c1 - c0)
        assert torch.equal(dst, src), "bytes differ"
    finally:
        for client in clients.values():
            client.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{n} chunks of {args.chunk_mib:g} MiB from the page cache, {args.rounds} interleaved "
          f"rounds, medians; between loads: {args.between}; fs_native workers: "
          f"{args.fs_native_workers}\n")
    print("| connector | MiB/s | CPU ms a load | cores busy |")
    print("|---|---:|---:|---:|")
    for name, (rate, cpu_s, busy) in engine_bench.load_figures(times, cpu, n * size).items():
        print(f"| {name} | {rate / 2**20:,.0f} | {cpu_s * 1e3:.2f} | {busy:.2f} |")
    theirs, ours = (statistics.median(times[k]) for k in ("lmcache fs_native", "kvtier nixl-file"))
    ratio = theirs / ours
    print(f"kvtier / lmcache fs_native: load {ratio:.2f}x")


if __name__ == "__main__":
    main()
