"""Clean shutdown: pages an engine was told are stored reach the lower tiers before its
process ends, and what cannot reach them is logged, never dropped silently."""

from __future__ import annotations

import gc
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import silent_object_tier

HERE = Path(__file__).resolve().parent
PAGES, PAGE_BYTES = 192, 1 << 20


def hierarchy(tmp):
    """DRAM over NIXL FILE, write-through: a put returns once the page is in DRAM; the disk
    tier syncs each page (``durability = "power"``), so it is still writing at exit."""
    return [{"kind": "mem", "capacity": "1GiB"},
            {"kind": "nixl-file", "dirs": [str(tmp / "disk")], "path_mode": "on", "durability": "power"}]


STORE_ENGINE = """
import kvtier
store = kvtier.Store({"tiers": TIERS})
pages = [bytes([i % 251]) * PAGE_BYTES for i in range(PAGES)]
assert store.put([f"k{i}" for i in range(PAGES)], pages) == [None] * PAGES
print("stored", store.stats()["queue_depth"], "queued", flush=True)
"""

SGLANG_ENGINE = """
import torch
from conftest import backend, make_pool
pool = make_pool(layers=8, heads=8, head_dim=64, page=32, pages=PAGES)  # 1 MiB pages
pool.kv_buffer.view(torch.int16).random_(-30000, 30000, generator=torch.Generator().manual_seed(3))
b = backend(TIERS, pool)
idx = torch.arange(0, PAGES * pool.page_size, dtype=torch.int64)
torch.save(pool.kv_buffer[:, idx].clone(), "WANT")
assert b.batch_set_v1([f"{i:064x}" for i in range(PAGES)], idx) == [True] * PAGES
print("stored", b.kvtier_stats()["queue_depth"], "queued", flush=True)
"""


def run(code, **subs):
    for name, value in subs.items():
        code = code.replace(name, value)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=HERE, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


@pytest.mark.parametrize("engine", ["store", "sglang"])
def test_pages_stored_right_before_a_normal_exit_are_on_disk(engine, tmp):
    """The engine process exits as soon as its store call returns, with pages still queued
    for the disk: at interpreter exit kvtier writes them; a new process finds every one."""
    tiers = hierarchy(tmp)
    subs = {"TIERS": json.dumps(tiers), "PAGES": str(PAGES), "PAGE_BYTES": str(PAGE_BYTES),
            "WANT": str(tmp / "want.pt")}
    said = run(STORE_ENGINE if engine == "store" else SGLANG_ENGINE, **subs)
    assert "stored" in said, said
    import kvtier

    disk = kvtier.Store({"tiers": tiers[1:]})
    if engine == "store":
        assert disk.exists([f"k{i}" for i in range(PAGES)]) == PAGES, f"pages lost at exit ({said.strip()})"
        buf = bytearray(PAGE_BYTES)
        for i in (0, PAGES // 2, PAGES - 1):
            assert disk.get_into([f"k{i}"], [buf]) == [True]
            assert buf == bytes([i % 251]) * PAGE_BYTES
        print(f"store: {said.strip()}; all {PAGES} on disk after exit")
        return
    del disk
    gc.collect()
    import torch

    from conftest import backend, make_pool

    pool = make_pool(layers=8, heads=8, head_dim=64, page=32, pages=PAGES)
    b = backend(tiers[1:], pool)
    keys = [f"{i:064x}" for i in range(PAGES)]
    assert b.batch_exists(keys) == PAGES, f"pages lost at exit ({said.strip()})"
    idx = torch.arange(0, PAGES * pool.page_size, dtype=torch.int64)
    assert b.batch_get_v1(keys, idx) == [True] * PAGES
    want = torch.load(tmp / "want.pt")
    assert torch.equal(pool.kv_buffer[:, idx].view(torch.int16), want.view(torch.int16))
    print(f"sglang: {said.strip()}; all {PAGES} on disk after exit, every byte equal")


def test_a_dropped_store_says_what_it_could_not_write(caplog):
    """A store dropped while its lower tier hangs: it waits ``flush_timeout``, then logs how
    many queued pages are lost."""
    import kvtier

    class Endpoint:  # a listening socket that never answers
        def __init__(self):
            import socket

            self.sock = socket.socket()
            self.sock.bind(("127.0.0.1", 0))
            self.sock.listen(16)
            self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    hang = Endpoint()
    try:
        store = kvtier.Store({"hierarchy": {"flush_timeout": "1s"},
                              "tiers": [{"kind": "mem", "capacity": "64MiB"}, silent_object_tier(hang.url, "30s")]})
        assert store.put([f"p{i}" for i in range(3)], [b"x" * 4096] * 3) == [None] * 3
        with caplog.at_level(logging.WARNING):
            del store
            gc.collect()
        lost = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
        assert lost and "3 pages" in lost[0], [r.getMessage() for r in caplog.records]
    finally:
        hang.sock.close()
