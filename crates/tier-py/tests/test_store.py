"""kvtier.Store: buffers, per-key outcomes, typed errors, the GIL released during I/O."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import kvtier

MEM = {"tiers": [{"kind": "mem", "capacity": "64MiB"}]}


def test_buffers_of_every_kind_round_trip():
    with kvtier.Store(MEM) as s:
        a = np.arange(4096, dtype=np.float16)
        t = torch.arange(1024, dtype=torch.int32)
        regions = [b"head", bytearray(b"-tail")]
        assert s.put(["a", "t", "r"], [a, t, regions]) == [None, None, None]
        out_a, out_t, out_r = np.zeros_like(a), torch.zeros_like(t), bytearray(9)
        assert s.get_into(["a", "t", "r", "missing"], [out_a, out_t, out_r, bytearray(1)]) == [True, True, True, False]
        assert (out_a == a).all() and torch.equal(out_t, t) and out_r == b"head-tail"
        # A stored page may be read into regions cut at other boundaries.
        x, y = bytearray(2), bytearray(7)
        assert s.get_into(["r"], [[x, y]]) == [True] and x + y == b"head-tail"
        assert s.exists(["a", "t", "missing", "r"]) == 2
        assert s.remove(["a", "missing"]) == [True, False]


def test_raw_address_regions():
    with kvtier.Store(MEM) as s:
        src = torch.arange(256, dtype=torch.uint8)
        assert s.put(["k"], [[(src.data_ptr(), 100), (src.data_ptr() + 100, 156)]]) == [None]
        dst = torch.zeros(256, dtype=torch.uint8)
        assert s.get_into(["k"], [(dst.data_ptr(), 256)]) == [True]
        assert torch.equal(src, dst)


def test_bad_buffers_are_errors_not_crashes():
    with kvtier.Store(MEM) as s:
        s.put(["k"], [b"x" * 100])
        with pytest.raises(kvtier.InvalidBuffer, match="read-only"):
            s.get_into(["k"], [b"y" * 100])
        short = s.get_into(["k"], [bytearray(50)])
        assert isinstance(short[0], kvtier.InvalidPage) and short[0].key == "k"
        with pytest.raises(kvtier.InvalidBuffer, match="contiguous"):
            s.put(["k"], [torch.zeros(10, 10)[:, 0]])
        with pytest.raises(kvtier.InvalidBuffer):
            s.put(["k"], [np.zeros((10, 10))[:, 0]])
        with pytest.raises(kvtier.InvalidBuffer, match="overlap"):
            buf = bytearray(100)
            view = memoryview(buf)
            s.get_into(["k", "k"], [view, view])
        with pytest.raises(kvtier.InvalidBuffer):
            s.put(["k"], [12345])
        with pytest.raises(kvtier.InvalidBuffer, match="keys"):
            s.put(["a", "b"], [b"x"])
        empty = s.put(["e"], [b""])
        assert isinstance(empty[0], kvtier.InvalidPage)


def test_bad_keys_and_configs_are_typed():
    with kvtier.Store(MEM) as s:
        with pytest.raises(kvtier.InvalidKey):
            s.put(["bad\x00key"], [b"x"])
        with pytest.raises(kvtier.InvalidKey):
            s.exists(["x" * 500])
    with pytest.raises(kvtier.ConfigError):
        kvtier.Store({"tiers": [{"kind": "mem"}]})
    with pytest.raises(kvtier.ConfigError):
        kvtier.Store("/no/such/config.toml")
    assert issubclass(kvtier.ConfigError, kvtier.KvtierError)


def test_errors_are_the_matching_builtins_too():
    """Code that catches builtins catches kvtier's errors: a refused config or key is a
    ValueError, an unusable buffer a BufferError, failed storage an OSError (a timeout a
    TimeoutError), each still a KvtierError with its ``.key``."""
    for cls, builtin in [(kvtier.ConfigError, ValueError), (kvtier.InvalidKey, ValueError),
                         (kvtier.InvalidPage, ValueError), (kvtier.InvalidBuffer, BufferError),
                         (kvtier.Unavailable, OSError), (kvtier.Timeout, TimeoutError),
                         (kvtier.Timeout, kvtier.Unavailable)]:
        assert issubclass(cls, builtin) and issubclass(cls, kvtier.KvtierError), cls
    with pytest.raises(ValueError, match="capacity"):
        kvtier.Store({"tiers": [{"kind": "mem"}]})
    with kvtier.Store(MEM) as s:
        with pytest.raises(ValueError) as bad_key:
            s.put(["bad\x00key"], [b"x"])
        assert isinstance(bad_key.value, kvtier.InvalidKey)
        with pytest.raises(BufferError):
            s.get_into(["k"], [b"read-only"])


def test_a_toml_config_needs_no_python_toml_reader(tmp_path):
    """Engine configs are parsed by kvtier's own reader (Python 3.10 has no tomllib)."""
    from kvtier._engine import load_config
    path = tmp_path / "h.toml"
    path.write_text('[hierarchy]\nadmit_after = 2\n[[tiers]]\nkind = "mem"\ncapacity = "1MiB"\n')
    assert load_config({"config": str(path)}) == {
        "hierarchy": {"admit_after": 2}, "tiers": [{"kind": "mem", "capacity": "1MiB"}]}
    path.write_text("[[tiers]\nkind =")
    with pytest.raises(kvtier.ConfigError, match="h.toml"):
        load_config({"config": str(path)})


def test_inline_tiers_that_are_no_list_of_tables_are_a_config_error_naming_them():
    """Inline ``tiers`` (an engine's extra config) of another shape is a ConfigError naming
    where it was given, never an AttributeError from deep inside an adapter."""
    from kvtier._engine import load_config
    for bad in ("x", [{"kind": "mem"}, "x"], {"kind": "mem"}):
        with pytest.raises(kvtier.ConfigError, match=r'adapter_params\["tiers"\]'):
            load_config({"tiers": bad}, "adapter_params")
    with pytest.raises(kvtier.ConfigError, match=r'extra_config\["hierarchy"\]'):
        load_config({"tiers": [{"kind": "mem"}], "hierarchy": "x"})


def test_config_from_toml_file(tmp_path):
    path = tmp_path / "h.toml"
    path.write_text('[[tiers]]\nkind = "mem"\ncapacity = "1MiB"\n')
    with kvtier.Store(path) as s:
        assert s.kinds == ["mem"]
        assert s.put(["k"], [b"abc"]) == [None]


def test_gil_released_during_large_get(tmp_path):
    """A Python thread keeps running while another waits in a large get."""
    cfg = {"tiers": [{"kind": "nixl-file", "dirs": [str(tmp_path / "d")]}]}
    with kvtier.Store(cfg) as s:
        page = np.random.default_rng(1).integers(0, 255, 4 << 20, dtype=np.uint8)
        keys = [f"big{i}" for i in range(32)]
        assert s.put(keys, [page] * 32) == [None] * 32
        outs = [np.zeros_like(page) for _ in keys]
        ticks = []
        done = threading.Event()

        def spin():
            while not done.is_set():
                ticks.append(time.perf_counter())
                time.sleep(0.0005)

        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.01)
        start = time.perf_counter()
        rounds = 0
        while time.perf_counter() - start < 0.3 or rounds < 3:
            assert s.get_into(keys, outs) == [True] * 32
            rounds += 1
        end = time.perf_counter()
        done.set()
        t.join()
        during = [x for x in ticks if start <= x <= end]
        # With the GIL held for the whole get, the spinner could not tick at all meanwhile.
        assert len(during) >= 5, f"{len(during)} ticks in {end - start:.3f}s of gets"
        assert all((o == page).all() for o in outs)


def test_stats_per_level():
    cfg = {"tiers": [{"kind": "mem", "capacity": "1MiB", "name": "top"}, {"kind": "mem", "capacity": "64MiB", "name": "below"}]}
    with kvtier.Store(cfg) as s:
        s.put(["a"], [b"x" * 1000])
        s.flush()
        st = s.stats()
        assert st["puts"] == 1 and [l["name"] for l in st["levels"]] == ["top", "below"]
        assert st["copied_down"] == 1
        assert st["not_admitted"] == 0 and st["stale_below"] == 0 and st["stale_below_all"] is False


def test_admission_and_policies_from_a_dict():
    cfg = {
        "hierarchy": {"admit_after": 2},
        "tiers": [
            {"kind": "mem", "capacity": "1MiB", "policy": "prefix"},
            {"kind": "mem", "capacity": "64MiB", "policy": "s3fifo", "name": "below"},
        ],
    }
    with kvtier.Store(cfg) as s:
        s.put(["a"], [b"x" * 1000])
        s.flush()
        assert s.stats()["not_admitted"] == 1 and s.stats()["copied_down"] == 0
        s.put(["a"], [b"y" * 1000])
        s.flush()
        assert s.stats()["copied_down"] == 1
    with pytest.raises(kvtier.ConfigError, match="admit_after"):
        kvtier.Store({"hierarchy": {"admit_after": 0}, "tiers": [{"kind": "mem", "capacity": "1MiB"}]})
    with pytest.raises(kvtier.ConfigError, match="policy"):
        kvtier.Store({"tiers": [{"kind": "mem", "capacity": "1MiB", "policy": "fifo"}]})


def test_flat_region_lists():
    with kvtier.Store(MEM) as s:
        src = torch.arange(512, dtype=torch.uint8)
        base = src.data_ptr()
        # Two pages of two regions each, listed flat (an engine's page-buffer metadata).
        assert s.put_regions(["a", "b"], [base, base + 300, base + 100, base + 400], [100, 50, 200, 112]) == [None, None]
        dst = torch.zeros(462, dtype=torch.uint8)
        d = dst.data_ptr()
        assert s.get_into_regions(["a", "b"], [d, d + 100, d + 150, d + 350], [100, 50, 200, 112]) == [True, True]
        want = torch.cat([src[0:100], src[300:350], src[100:300], src[400:512]])
        assert torch.equal(dst, want)
        with pytest.raises(kvtier.InvalidBuffer, match="evenly"):
            s.put_regions(["a", "b"], [base, base, base], [1, 1, 1])
        with pytest.raises(kvtier.InvalidBuffer, match="overlap"):
            s.get_into_regions(["a", "b"], [d, d + 10, d, d + 10], [100, 50, 200, 112])
        with pytest.raises(kvtier.InvalidBuffer, match="address 0"):
            s.put_regions(["a"], [0], [10])


def test_metrics_endpoint_and_warnings_reach_python(caplog):
    """The store serves Prometheus metrics, and a failing tier's warning reaches Python's
    ``logging`` (logger named after the Rust module)."""
    import logging
    import urllib.request

    nowhere = {
        "kind": "object", "name": "nowhere", "store": "s3", "prefix": "p", "bucket": "b",
        "endpoint": "http://127.0.0.1:9", "access_key": "k", "secret_key": "s", "op_timeout": "200ms",
    }
    config = {"tiers": [{"kind": "mem", "name": "top", "capacity": "1MiB"}, nowhere]}
    caplog.set_level(logging.WARNING)
    with kvtier.Store(config) as s:
        host, port = s.serve_metrics("127.0.0.1:0")
        assert s.put(["a", "b"], [b"x" * 1024, b"y" * 2048]) == [None, None]
        assert s.get_into(["a"], [bytearray(1024)]) == [True]
        s.flush()
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert "# TYPE kvtier_tier_call_seconds histogram" in text

        def sample(name, **labels):
            total = 0.0
            for line in text.splitlines():
                if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                    total += float(line.rsplit(" ", 1)[1])
            return total

        assert sample("kvtier_tier_call_pages_total", tier="top", op="put") == 2
        assert sample("kvtier_tier_call_bytes_total", tier="top", op="put") == 3072
        assert sample("kvtier_tier_call_bytes_total", tier="top", op="get") == 1024
        assert sample("kvtier_tier_hits_total", tier="top") == 1
        assert sample("kvtier_tier_call_errors_total", tier="nowhere", op="put") >= 2
        with pytest.raises(kvtier.ConfigError):
            s.serve_metrics("not an address")
    failed = [r for r in caplog.records if r.name.startswith("tier_hierarchy") and "tier call failed" in r.getMessage()]
    assert failed, [r.getMessage() for r in caplog.records]
    assert "nowhere" in failed[0].getMessage()


def test_a_closed_store_lets_a_new_one_open_its_folder_at_once(tmp_path):
    """``close()`` (or a ``with`` block) releases the tiers, though the Python object lives on:
    a store opened next on the same folder, in the same process, opens at once and finds the
    pages (SGLang detaches and attaches storage backends at run time). Calls on the closed
    store and its queue raise ``Unavailable``."""
    config = {"tiers": [{"kind": "nixl-file", "dirs": [str(tmp_path / "disk")]}]}
    page = bytes(range(256)) * 16
    with kvtier.Store(config) as first:
        assert first.put(["p0"], [page]) == [None]
        queue = first.completion_queue(8)
        queue.submit_put(["p1"], [page])
        queue.close()
    # A queue left open also lets go once the store is closed and the queue closed.
    second_dir = {"tiers": [{"kind": "nixl-file", "dirs": [str(tmp_path / "disk2")]}]}
    other = kvtier.Store(second_dir)
    other_queue = other.completion_queue(8)
    other.close()
    other_queue.close()
    for cfg, key in ((config, "p1"), (second_dir, None)):
        started = time.monotonic()
        again = kvtier.Store(cfg)
        took = time.monotonic() - started
        assert took < 2.0, f"reopening waited {took:.1f} s for the closed store's lock"
        if key:
            buf = bytearray(len(page))
            assert again.get_into(["p0", key], [bytearray(len(page)), buf]) == [True, True]
            assert bytes(buf) == page
        again.close()
    with pytest.raises(kvtier.Unavailable, match="store is closed"):
        first.put(["p2"], [page])
    with pytest.raises(kvtier.Unavailable, match="closed"):
        queue.submit_exists(["p0"])
    first.close()  # closing again does nothing


def test_contains_answers_each_key_on_its_own():
    """``exists`` counts the leading run; ``contains`` (and the queue's ``submit_contains``)
    answer each key, whatever the keys before it."""
    with kvtier.Store({"tiers": [{"kind": "mem", "capacity": "1MiB"}]}) as s:
        assert s.put(["a", "c"], [b"x" * 64, b"y" * 64]) == [None, None]
        assert s.exists(["a", "b", "c"]) == 1
        assert s.contains(["a", "b", "c"]) == [True, False, True]
        assert s.contains(["c", "a"], timeout=5.0) == [True, True]
        with pytest.raises(ValueError):
            s.contains(["a"], timeout=-1.0)
        q = s.completion_queue(4)
        qid = q.submit_contains(["b", "c", "a"])
        deadline = time.monotonic() + 10
        done = {}
        while qid not in done and time.monotonic() < deadline:
            done.update(q.drain())
            time.sleep(0.005)
        assert done[qid] == [False, True, True]
        q.close()


def test_a_held_metrics_connection_never_keeps_a_closed_store_open(tmp_path):
    """A scraper's connection still open when the store closes: the store's folders are let go
    of at once, so a store opened on them right after opens and writes. (The connection held
    the hierarchy until it ended, up to 10 s: the reopen waited for the folder's lock.)"""
    import socket

    config = {"tiers": [{"kind": "nixl-file", "dirs": [str(tmp_path / "disk")], "access": "owner"}]}
    store = kvtier.Store(config)
    host, port = store.serve_metrics("127.0.0.1:0")
    held = socket.create_connection((host, port))
    held.sendall(b"GET /metrics HTTP/1.1\r\n")  # an unfinished request head: it stays open
    time.sleep(0.2)
    store.close()
    started = time.monotonic()
    try:
        with kvtier.Store(config) as again:
            assert again.put(["k"], [b"x" * 64]) == [None]
        took = time.monotonic() - started
    finally:
        held.close()
    assert took < 2, f"the reopen waited {took:.1f} s for the closed store's folders"
