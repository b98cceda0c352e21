"""kvtier's SGLang backend beside SGLang's own NIXL backend (HiCacheNixl, POSIX plugin), both
created by SGLang's StorageBackendFactory on one MHATokenToKVPoolHost (page_first layout), in
128-page batch_set_v1 / batch_get_v1 calls, interleaved round by round; every page verified
outside the timed region. Prints the medians (pages/s) and kvtier's ratio to SGLang's backend,
and, at 2 MiB, a memcpy of the same bytes measured in the same run.

Run: make bench-sglang   (or python crates/tier-py/bench/sglang_backends.py [--rounds N])
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
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


def kvtier_backend(pool, folder):
    extra = {"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierStorage",
             "interface_v1": 1, "tiers": [{"kind": "nixl-file", "dirs": [str(folder)]}]}
    b = StorageBackendFactory.create_backend("dynamic", storage_config(extra), pool)
    b.register_mem_pool_host(pool)
    return b


def run_round(b, pool, idx, batches, tag):
    """Writes `batches` batches of distinct pages, then reads them back; returns seconds."""
    keys = [[f"{tag}{n:04x}{i:056x}" for i in range(BATCH)] for n in range(batches)]
    contents = []
    for n in range(batches):
        g = torch.Generator().manual_seed(hash((tag, n)) & 0xFFFF_FFFF)
        contents.append(torch.randint(-30000, 30000, pool.kv_buffer[:, idx].shape, generator=g, dtype=torch.int16))
    put_s = 0.0
    for n in range(batches):
        pool.kv_buffer[:, idx] = contents[n].view(pool.dtype)
        t = time.perf_counter()
        ok = b.batch_set_v1(keys[n], idx)
        put_s += time.perf_counter() - t
        assert all(ok), f"{tag}: set failed"
    get_s = 0.0
    for n in range(batches):
        pool.kv_buffer[:, idx] = 0
        t = time.perf_counter()
        ok = b.batch_get_v1(keys[n], idx)
        get_s += time.perf_counter() - t
        assert all(ok), f"{tag}: get failed"
        assert torch.equal(pool.kv_buffer[:, idx].view(torch.int16), contents[n]), f"{tag}: wrong bytes"
    return put_s, get_s


def memcpy_s(pool, idx, batches):
    src = pool.kv_buffer[:, idx].clone()
    dst = torch.empty_like(src)
    dst.copy_(src)  # touched before timing: no page faults in the timed copies
    t = time.perf_counter()
    for _ in range(batches):
        dst.copy_(src)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="folder for both backends' files (default: a temp folder)")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="kvtier-bench-"))
    print(f"{BATCH}-page batch_set_v1/batch_get_v1 on one MHATokenToKVPoolHost (page_first), files in {root}")
    print(f"medians of {args.rounds} interleaved rounds, pages/s; every page verified outside the timed region\n")
    rows = []
    for label, layers, heads, dim, tokens in GEOMETRIES:
        pool = make_pool(layers=layers, heads=heads, head_dim=dim, page=tokens, pages=BATCH + 1)
        page_bytes = pool.get_size_per_token() * pool.page_size
        idx = torch.arange(0, BATCH * tokens, dtype=torch.int64)
        batches = max(2, (64 << 20) // (page_bytes * BATCH))
        pages = batches * BATCH
        folders = {name: root / f"{name}-{label.replace(' ', '')}" for name in ("sglang", "kvtier")}
        for f in folders.values():
            shutil.rmtree(f, ignore_errors=True)
            f.mkdir(parents=True)
        backends = {"sglang": sglang_nixl(pool, folders["sglang"]), "kvtier": kvtier_backend(pool, folders["kvtier"])}
        times = {name: ([], []) for name in backends}
        copies = []
        for r in range(args.rounds):
            for name, b in backends.items():
                put_s, get_s = run_round(b, pool, idx, batches, f"{name[0]}{r}")
                times[name][0].append(pages / put_s)
                times[name][1].append(pages / get_s)
            copies.append(pages / memcpy_s(pool, idx, batches))
        med = {name: (statistics.median(p), statistics.median(g)) for name, (p, g) in times.items()}
        mc = statistics.median(copies)
        rows.append((label, med, mc))
        for b in backends.values():
            b.clear()
        del backends
        shutil.rmtree(folders["sglang"], ignore_errors=True)
        shutil.rmtree(folders["kvtier"], ignore_errors=True)

    print(f"{'page':>8} | {'SGLang put':>11} {'kvtier put':>11} {'ratio':>6} | {'SGLang get':>11} {'kvtier get':>11} {'ratio':>6} | {'memcpy':>9} {'get/memcpy':>10}")
    for label, med, mc in rows:
        (sp, sg), (kp, kg) = med["sglang"], med["kvtier"]
        print(f"{label:>8} | {sp:>11,.0f} {kp:>11,.0f} {kp / sp:>5.2f}x | {sg:>11,.0f} {kg:>11,.0f} {kg / sg:>5.2f}x | {mc:>9,.0f} {kg / mc:>9.2f}x")
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
