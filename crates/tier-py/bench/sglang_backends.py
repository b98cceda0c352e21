"""kvtier's SGLang backend (a NIXL FILE tier, with its NIXL engine and with its syscall engine)
beside SGLang's own NIXL backend (HiCacheNixl, POSIX plugin), all
created by SGLang's StorageBackendFactory on one MHATokenToKVPoolHost (page_first layout), in
128-page batch_set_v1 / batch_get_v1 calls, interleaved round by round. Each batch uses host
pages of its own; a round's puts, then its gets, run back to back in the timed region, and
content is made, the pool zeroed and every page verified outside it. Prints the medians
(pages/s), each one's ratio to SGLang's backend and to a memcpy of the same bytes measured in
the same run, beside the baseline of plain files (one file per page, `preadv` on two threads,
nothing checked): what the page cache gives anyone on this machine.

Ratios move by 10-20% from run to run on a small VM: every row's two-thread copies slow down
when the guest scheduler puts both threads on one vCPU after an idle pause (as between rounds),
and puts depend on how fast the host backs fresh guest memory. Compare rows of one run.

With ``--second-instance [--owner]``: two instances of each backend on one config at once (as
two SGLang servers, or two DP groups, on one storage folder), each with its own host pool: the
first stores a round's pages, the second looks them up (``batch_exists``) and reads what it
finds; prints the pages the second hit and its read rate, kvtier's against SGLang's backend.

Run: make bench-sglang   (or python crates/tier-py/bench/sglang_backends.py [--rounds N]
     [--second-instance [--owner]])
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import make_pool, storage_config  # noqa: E402

from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

BATCH = 128
# (label, layers, heads, head_dim, page tokens): 2 x layers x tokens x heads x dim x 2 bytes.
GEOMETRIES = [("64 KiB", 8, 2, 128, 8), ("512 KiB", 8, 8, 128, 16), ("2 MiB", 8, 8, 128, 64)]


def sglang_nixl(pool, folder):
    os.environ["SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR"] = str(folder)
    extra = {"plugin": {"posix": {"active": True}}, "use_direct_io": False}
    b = StorageBackendFactory.create_backend("nixl", storage_config(extra), pool)
    b.register_mem_pool_host(pool)
    return b


def kvtier_backend(pool, folder, engine, access=None, lanes=None):
    tier = {"kind": "nixl-file", "dirs": [str(folder)], "engine": engine}
    if lanes:
        tier["staging_buffers"] = lanes
    if access:
        tier["access"] = access
    extra = {"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierStorage",
             "interface_v1": 1, "tiers": [tier]}
    b = StorageBackendFactory.create_backend("dynamic", storage_config(extra), pool)
    b.register_mem_pool_host(pool)
    return b


class PlainFiles:
    """The baseline of raw file I/O: each page's regions in one file of its own (`os.pwritev`
    to a temp name, then a rename), read back with `os.preadv` on two threads (both cores),
    like kvtier's syscall engine, but with no index, no checksum and no checks."""

    def __init__(self, pool, folder):
        self.pool, self.folder = pool, folder
        self.threads = ThreadPoolExecutor(2)

    def _views(self, host_indices):
        ptrs, sizes = self.pool.get_page_buffer_meta(host_indices)
        per = len(ptrs) // (len(host_indices) // self.pool.page_size)
        views = [memoryview((ctypes.c_char * n).from_address(p)).cast("B") for p, n in zip(ptrs, sizes)]
        return [views[i:i + per] for i in range(0, len(views), per)]

    def batch_set_v1(self, keys, host_indices):
        for key, regions in zip(keys, self._views(host_indices)):
            tmp = self.folder / f".tmp-{key}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.pwritev(fd, regions, 0)
            finally:
                os.close(fd)
            os.rename(tmp, self.folder / key)
        return [True] * len(keys)

    def _read(self, keys, pages):
        for key, regions in zip(keys, pages):
            fd = os.open(self.folder / key, os.O_RDONLY)
            try:
                os.preadv(fd, regions, 0)
            finally:
                os.close(fd)

    def batch_get_v1(self, keys, host_indices):
        pages = self._views(host_indices)
        mid = len(keys) // 2
        half = self.threads.submit(self._read, keys[mid:], pages[mid:])
        self._read(keys[:mid], pages[:mid])
        half.result()
        return [True] * len(keys)

    def clear(self):
        self.threads.shutdown()


def run_round(b, pool, batches, tag):
    """Writes `batches` batches of distinct pages (each batch from host pages of its own), then
    reads them all back; returns (put seconds, get seconds). Content is made and checked, and
    the pool zeroed, outside the timed regions, which hold only the backend's calls."""
    P = pool.page_size
    idx = [torch.arange(n * BATCH * P, (n + 1) * BATCH * P, dtype=torch.int64) for n in range(batches)]
    keys = [[f"{tag}{n:04x}{i:056x}" for i in range(BATCH)] for n in range(batches)]
    everything = torch.arange(0, batches * BATCH * P, dtype=torch.int64)
    g = torch.Generator().manual_seed(hash(tag) & 0xFFFF_FFFF)
    want = torch.randint(-30000, 30000, pool.kv_buffer[:, everything].shape, generator=g, dtype=torch.int16)
    pool.kv_buffer[:, everything] = want.view(pool.dtype)
    os.sync()  # no writeback of earlier rounds' files competes with the timed calls
    t = time.perf_counter()
    ok = [b.batch_set_v1(keys[n], idx[n]) for n in range(batches)]
    put_s = time.perf_counter() - t
    assert all(all(o) for o in ok), f"{tag}: set failed"
    pool.kv_buffer[:, everything] = 0
    os.sync()
    t = time.perf_counter()
    ok = [b.batch_get_v1(keys[n], idx[n]) for n in range(batches)]
    get_s = time.perf_counter() - t
    assert all(all(o) for o in ok), f"{tag}: get failed"
    assert torch.equal(pool.kv_buffer[:, everything].view(torch.int16), want), f"{tag}: wrong bytes"
    return put_s, get_s


def memcpy_s(pool, batches):
    idx = torch.arange(0, BATCH * pool.page_size, dtype=torch.int64)
    src = pool.kv_buffer[:, idx].clone()
    dst = torch.empty_like(src)
    dst.copy_(src)  # touched before timing: no page faults in the timed copies
    t = time.perf_counter()
    for _ in range(batches):
        dst.copy_(src)
    return time.perf_counter() - t


def second_instance(args, root):
    """Two instances of each backend on one folder at once: the second's hits on the pages
    the first stored, and its read rate (pages verified outside the timed region)."""
    label, layers, heads, dim, tokens = next(g for g in GEOMETRIES if g[0] == (args.only or "512 KiB"))
    page_bytes = 2 * layers * tokens * heads * dim * 2
    batches = max(2, (args.mib << 20) // (page_bytes * BATCH))
    P, pages = tokens, batches * BATCH
    pools = [make_pool(layers=layers, heads=heads, head_dim=dim, page=tokens, pages=pages + 1) for _ in range(2)]
    access = "owner" if args.owner else None
    makers = {
        "sglang": lambda pool, folder: sglang_nixl(pool, folder),
        "kvtier": lambda pool, folder: kvtier_backend(pool, folder, "syscalls", access),
    }
    hits = {name: [] for name in makers}
    rates = {name: [] for name in makers}
    refused: dict[str, str] = {}
    everything = torch.arange(0, pages * P, dtype=torch.int64)
    idx = [torch.arange(n * BATCH * P, (n + 1) * BATCH * P, dtype=torch.int64) for n in range(batches)]
    for r in range(-1, args.rounds):  # round -1 warms up
        for name, make in makers.items():
            folder = root / f"{name}-second-{r + 1}"
            folder.mkdir(parents=True)
            first = make(pools[0], folder)
            try:
                second = make(pools[1], folder)
            except Exception as e:  # owned folders: the second instance cannot open them
                refused[name] = f"{type(e).__name__}: {e}"
                first.close() if name == "kvtier" else first.clear()
                continue
            keys = [[f"{name[:1]}{r + 1:02x}{n:04x}{i:054x}" for i in range(BATCH)] for n in range(batches)]
            g = torch.Generator().manual_seed(r + 7)
            want = torch.randint(-30000, 30000, pools[0].kv_buffer[:, everything].shape, generator=g,
                                 dtype=torch.int16)
            pools[0].kv_buffer[:, everything] = want.view(pools[0].dtype)
            assert all(all(first.batch_set_v1(keys[n], idx[n])) for n in range(batches)), f"{name}: set failed"
            pools[1].kv_buffer[:, everything] = 0
            os.sync()
            t = time.perf_counter()
            found = [second.batch_exists(keys[n]) for n in range(batches)]
            got = [second.batch_get_v1(keys[n][:f], idx[n][: f * P]) if f else [] for n, f in enumerate(found)]
            elapsed = time.perf_counter() - t
            hit = sum(found)
            assert all(all(o) for o in got), f"{name}: a page it found did not read"
            for n, f in enumerate(found):
                rows = idx[n][: f * P]
                assert torch.equal(pools[1].kv_buffer[:, rows].view(torch.int16), want[:, n * BATCH * P:][:, : f * P]), \
                    f"{name}: wrong bytes"
            if r >= 0:
                hits[name].append(hit)
                if hit:
                    rates[name].append(hit / elapsed)
            for b in (second, first):
                b.clear() if name == "sglang" else b.close()
            shutil.rmtree(folder, ignore_errors=True)
    print(f"two instances on one folder at once, {pages} pages of {label} per round, {args.rounds} rounds "
          f"(kvtier access {'owner' if args.owner else 'default'})\n")
    print(f"{'backend':>8} | {'pages the second hit (median)':>30} | {'its lookup + read, pages/s':>27}")
    for name, why in refused.items():
        print(f"{name}: the second instance did not start ({why})")
    for name in makers:
        if not hits[name]:
            continue
        rate = statistics.median(rates[name]) if rates[name] else 0.0
        print(f"{name:>8} | {statistics.median(hits[name]):>24,.0f} of {pages} | {rate:>27,.0f}")
    if rates["kvtier"] and rates["sglang"]:
        print(f"kvtier / sglang: {statistics.median(rates['kvtier']) / statistics.median(rates['sglang']):.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--mib", type=int, default=256, help="MiB each backend writes and reads per round")
    ap.add_argument("--only", default=None, help="one page size label, e.g. '512 KiB'")
    ap.add_argument("--lanes", type=int, default=None,
                    help="kvtier's NIXL FILE lanes (staging_buffers; default: the tier's default, 2)")
    ap.add_argument("--dir", default=None, help="folder for both backends' files (default: a temp folder)")
    ap.add_argument("--second-instance", action="store_true",
                    help="two instances of each backend on one folder at once: the second's hits and reads")
    ap.add_argument("--owner", action="store_true", help="kvtier's folder with access = \"owner\"")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="kvtier-bench-"))
    if args.second_instance:
        try:
            second_instance(args, root)
        finally:
            if not args.dir:
                shutil.rmtree(root, ignore_errors=True)
        return
    print(f"{BATCH}-page batch_set_v1/batch_get_v1 on one MHATokenToKVPoolHost (page_first), files in {root}")
    print(f"medians of {args.rounds} interleaved rounds, pages/s; every page verified outside the timed region\n")
    rows = []
    for label, layers, heads, dim, tokens in GEOMETRIES:
        if args.only and label != args.only:
            continue
        page_bytes = 2 * layers * tokens * heads * dim * 2
        batches = max(2, (args.mib << 20) // (page_bytes * BATCH))
        pool = make_pool(layers=layers, heads=heads, head_dim=dim, page=tokens, pages=batches * BATCH + 1)
        pages = batches * BATCH
        names = ("sglang", "kvtier-nixl", "kvtier-syscalls", "plain-files")
        folders = {name: root / f"{name}-{label.replace(' ', '')}" for name in names}
        for f in folders.values():
            shutil.rmtree(f, ignore_errors=True)
            f.mkdir(parents=True)
        backends = {
            "sglang": sglang_nixl(pool, folders["sglang"]),
            "kvtier-nixl": kvtier_backend(pool, folders["kvtier-nixl"], "nixl", lanes=args.lanes),
            "kvtier-syscalls": kvtier_backend(pool, folders["kvtier-syscalls"], "syscalls",
                                              lanes=args.lanes),
            "plain-files": PlainFiles(pool, folders["plain-files"]),
        }
        times = {name: ([], []) for name in backends}
        copies = []
        for r in range(args.rounds):
            for name, b in backends.items():
                put_s, get_s = run_round(b, pool, batches, f"{name[:1]}{name[-1]}{r}")
                times[name][0].append(pages / put_s)
                times[name][1].append(pages / get_s)
            copies.append(pages / memcpy_s(pool, batches))
        med = {name: (statistics.median(p), statistics.median(g)) for name, (p, g) in times.items()}
        mc = statistics.median(copies)
        rows.append((label, med, mc))
        for b in backends.values():
            b.clear()
        del backends
        for f in folders.values():
            shutil.rmtree(f, ignore_errors=True)

    print(f"{'page':>8} {'backend':>16} | {'put':>9} {'vs SGLang':>9} | {'get':>9} {'vs SGLang':>9} | {'memcpy':>9} {'get/memcpy':>10}")
    for label, med, mc in rows:
        sp, sg = med["sglang"]
        for name, (p, g) in med.items():
            print(f"{label:>8} {name:>16} | {p:>9,.0f} {p / sp:>8.2f}x | {g:>9,.0f} {g / sg:>8.2f}x | {mc:>9,.0f} {g / mc:>9.2f}x")
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
