"""A dead or slow tier costs a request nothing: the breaker, deadlines (`timeout=`) and the
load estimate, through `kvtier.Store`, on a real S3 server frozen with SIGSTOP."""

from __future__ import annotations

import math
import os
import signal
import time

import pytest

import kvtier
from conftest import S3Server, s3_params

PAGE = 64 << 10
FAST = 0.1


def page(i: int) -> bytes:
    return (i.to_bytes(4, "little") * (PAGE // 4))


def key(i: int) -> str:
    return f"{i:064x}"


def all_stopped(pid: int) -> bool:
    tasks = os.listdir(f"/proc/{pid}/task")
    for task in tasks:
        with open(f"/proc/{pid}/task/{task}/stat") as f:
            # `pid (comm) S ...`: the state follows the last `)`.
            if f.read().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                return False
    return True


def freeze(server) -> None:
    """SIGSTOP, returning once every thread of the server is stopped: `kill` returns when the
    signal is queued, and a thread running on another core may answer a request or two first."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while not all_stopped(server.proc.pid):
        assert time.monotonic() < deadline, "the S3 server did not stop within 10 s"
        time.sleep(0.001)


@pytest.fixture
def own_s3(tmp_path):
    server = S3Server(tmp_path)
    yield server
    if server.proc:
        os.kill(server.proc.pid, signal.SIGCONT)
    server.stop()


def dram_over_s3(server, op_timeout="2s"):
    tiers = [{"kind": "mem", "capacity": "4MiB", "policy": "lru"},
             {"kind": "object", "store": "s3", "prefix": "kv", "op_timeout": op_timeout,
              **s3_params(server, server.bucket())}]
    health = {"probe_backoff": "100ms", "probe_backoff_max": "500ms", "probe_timeout": "1s"}
    return kvtier.Store({"hierarchy": {"health": health}, "tiers": tiers})


def stock(store):
    for first in range(0, 256, 32):
        keys = [key(i) for i in range(first, first + 32)]
        assert store.put(keys, [page(i) for i in range(first, first + 32)]) == [None] * 32
    store.flush()


def lower_health(store):
    return store.stats()["levels"][1]["health"]


def wait_for(store, state, within=10.0):
    deadline = time.monotonic() + within
    while lower_health(store)["state"] != state:
        assert time.monotonic() < deadline, lower_health(store)
        time.sleep(0.02)


def get(store, i, timeout=None):
    buf = bytearray(PAGE)
    started = time.monotonic()
    r = store.get_into([key(i)], [buf], timeout=timeout)[0]
    return r, bytes(buf), time.monotonic() - started


def test_a_frozen_store_is_skipped_once_down_and_found_back_up(own_s3):
    with dram_over_s3(own_s3) as store:
        stock(store)
        # Pages 0..63 left the 4 MiB of DRAM: only S3 holds them.
        assert get(store, 0)[0] is True
        freeze(own_s3)
        took = []
        for i in range(1, 7):
            r, _, t = get(store, i)
            assert r is not True
            took.append(t)
        print("gets of pages only S3 holds, frozen:", [f"{t:.3f}s" for t in took])
        assert all(t < FAST for t in took[1:]), took
        h = lower_health(store)
        assert h["state"] == "down" and h["reads_skipped"] >= 5, h
        up = [line for line in store.metrics_text().splitlines() if line.startswith("kvtier_tier_up{")]
        assert any('kind="object"' in line and line.endswith(" 0") for line in up), up
        # Puts go on at DRAM's pace.
        started = time.monotonic()
        assert store.put([key(900)], [page(900)]) == [None]
        assert time.monotonic() - started < FAST
        os.kill(own_s3.proc.pid, signal.SIGCONT)
        wait_for(store, "up")
        for i in range(1, 7):
            r, data, _ = get(store, i)
            assert r is True and data == page(i)


def test_a_timeout_returns_what_arrived_by_then(own_s3):
    with dram_over_s3(own_s3, op_timeout="10s") as store:
        stock(store)
        freeze(own_s3)
        top, below = bytearray(PAGE), bytearray(PAGE)
        started = time.monotonic()
        results = store.get_into([key(255), key(0)], [top, below], timeout=0.3)
        took = time.monotonic() - started
        assert results == [True, False] and bytes(top) == page(255)
        assert took < 0.3 + FAST, took
        started = time.monotonic()
        assert store.exists([key(0)], timeout=0.3) == 0
        assert time.monotonic() - started < 0.3 + FAST


def test_timeouts_are_checked_not_panicked_on():
    with kvtier.Store({"tiers": [{"kind": "mem", "capacity": "1MiB"}]}) as store:
        for bad in (-1.0, math.nan, math.inf, -math.inf):
            with pytest.raises(ValueError, match="timeout"):
                store.get_into(["a"], [bytearray(1)], timeout=bad)
            with pytest.raises(ValueError, match="timeout"):
                store.exists(["a"], timeout=bad)
            with pytest.raises(ValueError, match="timeout"):
                store.put(["a"], [b"x"], timeout=bad)
        # Too far to represent: no deadline.
        assert store.put(["a"], [b"x"], timeout=1e300) == [None]
        assert store.get_into(["a"], [bytearray(1)], timeout=1e19) == [True]
        assert store.exists(["a"], timeout=0.0) in (0, 1)


def test_the_estimate_is_fitted_from_reads(own_s3):
    with dram_over_s3(own_s3) as store:
        assert [e["seconds"] for e in store.estimate(16, PAGE)] == [None, None]
        stock(store)
        for i in range(64):
            assert get(store, i)[0] is True
        estimate = store.estimate(16, PAGE)
        assert [e["state"] for e in estimate] == ["up", "up"]
        dram, s3 = (e["seconds"] for e in estimate)
        assert s3 is not None and s3 > 0, estimate
        h = lower_health(store)
        assert h["read_bandwidth_bps"] > 0 and h["read_latency_s"] >= 0, h
        print(f"estimated load of 16 pages of 64 KiB: DRAM {dram}, S3 {s3:.4f} s")


def test_sglang_reads_stop_at_its_prefetch_timeout(own_s3):
    """SGLang gives up a prefetch at its own bound (base + per 1,024 tokens): kvtier's read
    for it returns by then too, on a store that does not answer."""
    from conftest import fill_pages, make_pool, storage_config
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    pool = make_pool(pages=16)
    tiers = [{"kind": "object", "store": "s3", "prefix": "sg", "op_timeout": "10s",
              **s3_params(own_s3, own_s3.bucket())}]
    extra = {"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierStorage",
             "interface_v1": 1, "tiers": tiers, "prefetch_timeout_base": 0.3,
             "prefetch_timeout_per_ki_token": 0.0}
    b = StorageBackendFactory.create_backend("dynamic", storage_config(extra), pool)
    b.register_mem_pool_host(pool)
    idx = fill_pages(pool, 0, 4, seed=3)
    keys = [f"{i:064x}" for i in range(4)]
    assert b.batch_set_v1(keys, idx) == [True] * 4
    freeze(own_s3)
    started = time.monotonic()
    assert b.batch_get_v1(keys, idx) == [False] * 4
    assert time.monotonic() - started < 0.3 + FAST
    started = time.monotonic()
    assert b.batch_exists(keys) == 0
    assert time.monotonic() - started < 0.3 + FAST
    os.kill(own_s3.proc.pid, signal.SIGCONT)


def test_queued_calls_carry_deadlines_too(own_s3):
    with dram_over_s3(own_s3, op_timeout="10s") as store:
        stock(store)
        q = store.completion_queue()
        freeze(own_s3)
        started = time.monotonic()
        ids = {q.submit_get_into([key(255), key(0)], [bytearray(PAGE), bytearray(PAGE)], timeout=0.3): "get",
               q.submit_exists([key(0)], timeout=0.3): "exists"}
        done: dict[str, list[object]] = {}
        while len(done) < 2:
            assert time.monotonic() - started < 0.3 + 2 * FAST, done
            for qid, results in q.drain():
                done[ids[qid]] = results
            time.sleep(0.005)
        os.kill(own_s3.proc.pid, signal.SIGCONT)
        assert done == {"get": [True, False], "exists": [False]}
        with pytest.raises(ValueError, match="timeout"):
            q.submit_exists([key(0)], timeout=-1.0)
        # Timeouts past what an Instant can hold wait "for ever" (bounded), never panic.
        q.close(1e20)
        q.close(1e19)
