"""Loads through kvtier's completion queue (what the LMCache and vLLM adapters call) beside a
plain loop of the same reads: each of T threads opens, `preadv`s and closes every T-th of
kvtier's own page files into the same memoryviews. Both read from the page cache; rounds are
interleaved, medians quoted as a fraction of the two-thread loop, with the CPU time a load
took (every thread of the process) and the cores it kept busy.

    python crates/tier-py/bench/queue_loads.py [--chunks 32] [--chunk-mib 2] [--rounds 41]
        [--engine nixl|syscalls] [--lanes N] [--page-checksum off] [--root DIR]
"""

from __future__ import annotations

import os
import resource
import select
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import kvtier

import engine_bench


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = engine_bench.parser(__doc__)
    ap.set_defaults(rounds=41)
    ap.add_argument("--root", default=None, help="folder for the files (default: a temp folder)")
    args = ap.parse_args()
    size = int(args.chunk_mib * (1 << 20))
    n = args.chunks
    root = Path(args.root or tempfile.mkdtemp(prefix="kvtier-queue-bench-"))
    tier = {"kind": "nixl-file", "dirs": [str(root)], "capacity": "8GiB",
            **engine_bench.tier_tuning(args)}
    store = kvtier.Store({"tiers": [tier]})
    queue = store.completion_queue()
    keys = [f"{i + 1:064x}" for i in range(n)]
    store.put(keys, [os.urandom(size) for _ in range(n)])
    files = {name: Path(d) / name for d, _, names in os.walk(root) for name in names}
    paths = [files[k] for k in keys]
    memory = memoryview(bytearray(n * size))
    views = [memory[i * size:(i + 1) * size] for i in range(n)]
    pools = {t: ThreadPoolExecutor(t) for t in (2, 4)}

    def kvtier_load() -> None:
        queue.submit_get_into(keys, views)
        select.select([queue.event_fd()], [], [])
        ((_, results),) = queue.drain()
        assert all(r is True for r in results), results

    def loop(threads: int) -> None:
        def part(first: int) -> None:
            for i in range(first, n, threads):
                fd = os.open(paths[i], os.O_RDONLY)
                try:
                    assert os.preadv(fd, [views[i]], 0) == size
                finally:
                    os.close(fd)
        list(pools[threads].map(part, range(threads)))

    runs = {"preadv loop, 2 threads": lambda: loop(2), "preadv loop, 4 threads": lambda: loop(4),
            "kvtier completion queue": kvtier_load}
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    try:
        for r in range(args.rounds + 1):  # round 0 warms up
            for name, load in runs.items():
                c0, t0 = cpu_seconds(), time.perf_counter()
                load()
                t1, c1 = time.perf_counter(), cpu_seconds()
                if r:
                    times[name].append(t1 - t0)
                    cpu[name].append(c1 - c0)
    finally:
        queue.close()
        store.close()
        for pool in pools.values():
            pool.shutdown()
        if args.root is None:
            shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(times["preadv loop, 2 threads"])
    print(f"\n{n} chunks of {args.chunk_mib:g} MiB from the page cache, {args.rounds} interleaved "
          f"rounds, medians (kvtier: {', '.join(f'{k} {v}' for k, v in tier.items() if k not in ('kind', 'dirs', 'capacity')) or 'defaults'})\n")
    print("| load | GB/s | of the 2-thread loop | CPU ms a load | cores busy |")
    print("|---|---:|---:|---:|---:|")
    for name, (rate, cpu_s, busy) in engine_bench.load_figures(times, cpu, n * size).items():
        print(f"| {name} | {rate / 1e9:.2f} | {rate * base / (n * size):.2f}x | "
              f"{cpu_s * 1e3:.2f} | {busy:.2f} |")


if __name__ == "__main__":
    main()
