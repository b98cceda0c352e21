"""kvtier as LMCache's native L2 plugin, proven by LMCache's own code on CPU: its L2 adapter
checker, and a store, L1 clear and prefetch round trip through its multi-process
``StorageManager`` with every byte compared, on DRAM, NIXL FILE and object_store on s3s-fs.
Runs in the LMCache venv (``make pytests-lmcache``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from conftest import tier_configs, two_instances

KINDS = ["mem", "nixl-file-path", "object"]


def plugin_spec(tiers, **params):
    return {"type": "native_plugin", "module_path": "kvtier.lmcache", "class_name": "KvtierL2Connector",
            "adapter_params": {"tiers": tiers, **params}}


@pytest.mark.parametrize("kind", KINDS)
def test_lmcaches_l2_adapter_checker_passes(kind, tmp, s3):
    spec = plugin_spec(tier_configs(kind, tmp, s3))
    out = subprocess.run(
        [sys.executable, "-m", "lmcache.v1.basic_check", "--mode", "test_l2_adapter", "--num-keys", "8",
         "--l2-adapter", json.dumps(spec)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    for line in ("Validation: 8/8 correctly absent", "Batch store OK", "Validation: 8/8 found",
                 "Validation (loaded): 8/8", "Validation (content): 8/8"):
        assert line in out.stdout, log
    assert "Fail" not in out.stdout and "FAIL" not in out.stdout, log
    print(f"{kind}: LMCache's checker: 8/8 absent, stored, found, loaded, content equal")


def wait_until(what, check, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.mark.parametrize("kind", KINDS)
def test_store_clear_and_prefetch_through_lmcaches_storage_manager(kind, tmp, s3):
    from lmcache.v1.distributed.api import GroupedObjectKeys, MemoryLayoutDesc, ObjectKey, PrefetchTaskSpec
    from lmcache.v1.distributed.config import parse_args
    from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import _object_key_to_string
    from lmcache.v1.distributed.storage_manager import StorageManager

    spec = plugin_spec(tier_configs(kind, tmp, s3))
    sm = StorageManager(parse_args(["--l1-size-gb", "0.05", "--eviction-policy", "LRU",
                                    "--l2-adapter", json.dumps(spec)]))
    try:
        n = 12
        (_, adapter), = sm.l2_adapters()
        connector = adapter._client
        copies_before = connector.store.stats()
        keys = [ObjectKey(chunk_hash=ObjectKey.IntHash2Bytes(7000 + i), model_name="org/model", kv_rank=3)
                for i in range(n)]
        layout = MemoryLayoutDesc(shapes=[torch.Size([2, 8192])], dtypes=[torch.float16])
        objs = sm.reserve_write(keys, layout)
        assert len(objs) == n
        g = torch.Generator().manual_seed(11)
        want = {}
        for k in keys:
            t = objs[k].tensor
            t.copy_(torch.randint(-30000, 30000, t.shape, generator=g, dtype=torch.int16).view(t.dtype))
            want[k] = t.clone()
        sm.finish_write(keys)

        # LMCache's store controller copies the new objects to L2 (kvtier) in the background.
        names = [_object_key_to_string(k) for k in keys]
        wait_until("the pages in kvtier", lambda: connector.store.exists(names) == n)

        # Dropping L1 leaves kvtier as the only copy; L1 objects stay locked until LMCache has
        # seen the store complete.
        def cleared():
            sm.clear()
            return sm.get_l1_usage()[0] == 0

        wait_until("L1 empty", cleared)
        before = connector.store.stats()["hits"]
        handle = sm.submit_prefetch_task(PrefetchTaskSpec(
            key_groups=[GroupedObjectKeys(keys=keys, object_group_id=0, layout_desc=layout)]))
        assert sm.wait_prefetch_status(handle, 60)
        result = sm.query_prefetch_status(handle)
        assert (result.l1_hit_count, result.l2_hit_count) == (0, n)
        assert connector.store.stats()["hits"] - before == n
        with sm.read_prefetched_results(keys, result.l1_owners) as got:
            assert got is not None
            for k, obj in zip(keys, got):
                # Bit patterns, not values (random bits hold NaNs).
                assert torch.equal(obj.tensor.view(torch.int16), want[k].view(torch.int16)), k
        if kind == "nixl-file-path":
            # Zero copy both ways: NIXL moved the bytes between LMCache's L1 and the files.
            copies = connector.store.stats()
            for counter in ("process_lent_bytes_copied", "process_bytes_copied_to_callers"):
                assert copies[counter] == copies_before[counter], counter
        print(f"{kind}: LMCache StorageManager: {n} chunks stored, L1 cleared, {n} L2 hits, bytes equal")
    finally:
        sm.close()


def test_failures_are_failed_completions_never_exceptions(silent_endpoint):
    """Storage that never answers, and input kvtier refuses: every submit returns an id and
    every call completes with ``ok`` false and the cause, nothing raises into LMCache."""
    import select

    from conftest import silent_object_tier
    from kvtier.lmcache import KvtierL2Connector

    c = KvtierL2Connector(tiers=[silent_object_tier(silent_endpoint)])
    try:
        buf = memoryview(bytearray(4096))
        ids = {
            "set": c.submit_batch_set(["m@00000000@0@aa"], [buf]),
            "get": c.submit_batch_get(["m@00000000@0@aa"], [memoryview(bytearray(4096))]),
            "exists": c.submit_batch_exists(["m@00000000@0@aa"]),
            # Every LMCache key is one (salts of any text included); a batch whose keys and
            # buffers differ in number is refused.
            "bad batch": c.submit_batch_set(["m@00000000@0@cc", "m@00000000@0@dd"], [buf]),
            "read-only": c.submit_batch_get(["m@00000000@0@aa"], [memoryview(b"\0" * 4096)]),
        }
        assert len(set(ids.values())) == len(ids)
        got = {}
        poller = select.poll()
        poller.register(c.event_fd(), select.POLLIN)
        deadline = time.monotonic() + 60
        while len(got) < len(ids) and time.monotonic() < deadline:
            poller.poll(1000)
            for fid, ok, error, per_key in c.drain_completions():
                got[fid] = (ok, error, per_key)
        by_name = {name: got[fid] for name, fid in ids.items()}
        for name, (ok, error, per_key) in by_name.items():
            keys = 2 if name == "bad batch" else 1
            assert ok is False and per_key == [False] * keys, (name, ok, error, per_key)
        # The server never answers: a timeout (an Unavailable and a TimeoutError in Python).
        assert by_name["set"][1].startswith("Timeout"), by_name["set"]
        assert by_name["bad batch"][1].startswith("InvalidBuffer"), by_name["bad batch"]
        assert by_name["read-only"][1].startswith("InvalidBuffer")
    finally:
        c.close()


RACE = """
import select, sys, threading, time
from kvtier.lmcache import KvtierL2Connector

ROUNDS = 100
c = KvtierL2Connector(tiers=[{"kind": "mem", "capacity": "64MiB"}], max_pending=2)
sys.setswitchinterval(1e-5)  # threads interleave often


class SlowDrain:
    # The queue, with the demux thread descheduled for a moment as it drains: submits
    # refused meanwhile land in the middle of drain_completions.

    def __init__(self, queue):
        self.queue = queue

    def drain(self):
        time.sleep(0.0005)
        return self.queue.drain()

    def __getattr__(self, name):
        return getattr(self.queue, name)


c.queue = SlowDrain(c.queue)
page = memoryview(bytearray(256))
poller = select.poll()
poller.register(c.event_fd(), select.POLLIN)
refused_total = 0
for round_no in range(ROUNDS):
    submitted, lock = [], threading.Lock()

    def submit(t):
        for i in range(6):
            fid = c.submit_batch_set([f"m@{t:08x}@0@{round_no:x}{i:x}"], [page])
            with lock:
                submitted.append(fid)

    threads = [threading.Thread(target=submit, args=(t,)) for t in range(3)]
    got = []
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) or len(got) < len(submitted):
        ready = poller.poll(2000)
        if not ready and not any(t.is_alive() for t in threads) and len(got) < len(submitted):
            missing = sorted(set(submitted) - set(got))
            sys.exit(f"round {round_no}: the drainer slept on pending completions {missing}")
        got.extend(fid for fid, *_ in c.drain_completions())
    for t in threads:
        t.join()
    assert sorted(got) == sorted(submitted), f"round {round_no}: lost or doubled completions"
    refused_total += sum(1 for fid in got if fid < 0)
assert refused_total > 0, "no submit was ever refused: the race was never run"
c.close()
print(f"{ROUNDS} rounds, {refused_total} refused submits, every completion woke the drainer")
"""


def test_refused_submits_racing_a_drain_always_wake_the_drainer():
    """Submitters saturate ``max_pending`` (so many submits are refused and complete at once)
    while LMCache's demux thread drains: every id completes, and the drainer never sleeps on
    the eventfd while a completion waits for it. A burst ends each round, so a completion left
    behind by a drain without its wake-up shows as a poll that times out with work pending.
    In a process of its own: a hang (submits deadlocked on the GIL) is a failure, not a stall."""
    try:
        out = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"submits and drains hung: {e.stdout} {e.stderr}") from None
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    print(out.stdout.strip())


TWO_SERVERS = """
import select, sys, time
from pathlib import Path
from kvtier.lmcache import KvtierL2Connector

sync, shared = Path(SYNC), SHARED
started = time.monotonic()
c = KvtierL2Connector(tiers=TIERS_BY[ME - 1])
(sync / f"opened.{ME}").write_text(f"{time.monotonic() - started:.3f}")

def barrier(name):
    (sync / f"{name}.{ME}").touch()
    deadline = time.monotonic() + 120
    while len(list(sync.glob(f"{name}.*"))) < 2:  # both servers are up at once
        assert time.monotonic() < deadline, f"the other server never reached {name}"
        time.sleep(0.02)

barrier("open")
poller = select.poll()
poller.register(c.event_fd(), select.POLLIN)

def wait(fid):
    deadline = time.monotonic() + 60
    while True:
        for got, ok, error, per_key in c.drain_completions():
            if got == fid:
                return ok, error, per_key
        assert time.monotonic() < deadline, "no completion"
        poller.poll(1000)

def keys_of(server):
    return [f"m@{server:08x}@0@{k:x}" for k in range(16)]

def pages_of(server):
    return [bytes([(server * 31 + k) % 256]) * 65536 for k in range(16)]

ok, error, _ = wait(c.submit_batch_set(keys_of(ME), [memoryview(bytearray(p)) for p in pages_of(ME)]))
assert ok, error
barrier("written")
other = 3 - ME
for server in (ME, other):
    deadline = time.monotonic() + 30
    while True:  # a DRAM tier above writes the shared folder in the background
        bufs = [bytearray(65536) for _ in range(16)]
        ok, error, per_key = wait(c.submit_batch_get(keys_of(server), [memoryview(b) for b in bufs]))
        if all(per_key) or server != other or not shared or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if server == other and not shared:
        assert not any(per_key), f"an owned folder showed the other server's pages: {per_key}"
        continue
    assert ok and all(per_key), (server, error, per_key)
    assert [bytes(b) for b in bufs] == pages_of(server), f"not server {server}'s bytes"
barrier("read")
c.close()
print("server", ME, "ok")
"""


@pytest.mark.parametrize("kind, access", [
    ("nixl-file-path", None), ("mem-over-nixl-file", None), ("gluster", None), ("nixl-file-path", "owner"),
])
def test_two_servers_on_one_config_start_at_once_and_share_their_pages(kind, access, tmp, gluster):
    """Two LMCache servers (two processes) started from one config at the same moment (on
    GlusterFS, each through a mount of its own: two nodes): both open at once, and each reads
    the pages the other stored, byte-exact (NIXL FILE folders are shared by default). With
    ``access = "owner"`` named, each gets folders of its own and the other's pages are misses."""
    from conftest import run_instances

    tiers_by = two_instances(kind, tmp, gluster, access)
    sync = tmp / "sync"
    sync.mkdir()
    code = (TWO_SERVERS.replace("SYNC", repr(str(sync))).replace("TIERS_BY", repr(tiers_by))
            .replace("SHARED", repr(access is None)))
    opened = run_instances(code, sync)
    print(f"{kind} (access {access or 'default'}): two LMCache servers opened in {opened} s; "
          f"{'each read the other' + chr(39) + 's pages' if access is None else 'each kept its own'}")


def test_metrics_addr_serves_kvtiers_metrics_and_a_taken_port_is_refused_unless_fallback(tmp):
    """``metrics_addr`` serves kvtier's Prometheus metrics (per tier and level) over HTTP; a
    second server on the node asking for the same port is refused naming it (it fell back to a
    free port without a word to its scraper), or with ``metrics_port_fallback`` gets a free
    one, and starts."""
    import socket
    import urllib.request

    import kvtier
    from kvtier.lmcache import KvtierL2Connector

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tiers = tier_configs("nixl-file-path", tmp)
    first = KvtierL2Connector(tiers=tiers, metrics_addr=f"127.0.0.1:{port}")
    with pytest.raises(kvtier.ConfigError, match=f"127.0.0.1:{port}.*metrics_port_fallback"):
        KvtierL2Connector(tiers=tiers, metrics_addr=f"127.0.0.1:{port}")
    second = KvtierL2Connector(tiers=tiers, metrics_addr=f"127.0.0.1:{port}", metrics_port_fallback=True)
    try:
        assert first.metrics_addr[1] == port
        assert second.metrics_addr[1] not in (0, port)
        for c in (first, second):
            host, bound = c.metrics_addr[:2]
            text = urllib.request.urlopen(f"http://{host}:{bound}/metrics", timeout=10).read().decode()
            assert "kvtier_" in text and "nixl-file" in text, text[:500]
    finally:
        first.close()
        second.close()
    with pytest.raises(kvtier.ConfigError, match="metrics_addr"):
        KvtierL2Connector(tiers=tiers, metrics_addr="no-port")


def test_a_folder_that_cannot_be_one_is_a_config_error(tmp):
    """A configured folder that is a file: opening says which path and why, as kvtier's
    ConfigError, before any engine instance is claimed."""
    import kvtier
    from kvtier.lmcache import KvtierL2Connector

    not_a_folder = tmp / "plain-file"
    not_a_folder.write_text("x")
    with pytest.raises(kvtier.ConfigError, match="plain-file"):
        KvtierL2Connector(tiers=[{"kind": "nixl-file", "dirs": [str(not_a_folder)]}])


def test_a_nixl_file_tier_naming_no_lanes_loads_on_four_under_lmcache(tmp, monkeypatch):
    """LMCache's process is full of torch threads: a NIXL FILE tier whose config names no
    ``staging_buffers`` opens with 4 lanes (a load on 4 threads, as ``fs_native``'s 4 workers);
    one that names them keeps its own; and a load on the 4 lanes is byte-exact."""
    import select

    import kvtier.lmcache as plugin

    opened = []
    real = plugin.open_instance

    def recording(config):
        opened.append(config)
        return real(config)

    monkeypatch.setattr(plugin, "open_instance", recording)
    size, n = 1 << 20, 16
    src = torch.randint(0, 255, (n * size,), dtype=torch.uint8)
    dst = torch.zeros(n * size, dtype=torch.uint8)
    keys = [f"m@w@0@{i:064x}" for i in range(n)]
    for name, lanes in (("default", None), ("named", 1)):
        tier = {"kind": "nixl-file", "dirs": [str(tmp / name)], "capacity": "1GiB"}
        if lanes:
            tier["staging_buffers"] = lanes
        connector = plugin.KvtierL2Connector(tiers=[tier])
        try:
            for submit, views in ((connector.submit_batch_set, src), (connector.submit_batch_get, dst)):
                fid = submit(keys, [memoryview(views[i * size:(i + 1) * size].numpy()) for i in range(n)])
                done = []
                while not done:
                    select.select([connector.event_fd()], [], [], 5.0)
                    done = [c for c in connector.drain_completions() if c[0] == fid]
                assert done[0][1] and all(done[0][3]), done
            assert torch.equal(dst, src)
            dst.zero_()
        finally:
            connector.close()
    assert [c["tiers"][0]["staging_buffers"] for c in opened] == [plugin.LMCACHE_LANES, 1]
    assert plugin.LMCACHE_LANES == 4


def test_tenants_sharing_a_prefix_never_see_each_others_pages(tmp, s3):
    """Two tenants' connectors on one bucket prefix: a page one stores is absent and a miss for
    the other, present for the same tenant's next connector."""
    import select

    from kvtier.lmcache import KvtierL2Connector

    def call(c, submit):
        fid = submit()
        poller = select.poll()
        poller.register(c.event_fd(), select.POLLIN)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            poller.poll(1000)
            for done, ok, error, per_key in c.drain_completions():
                if done == fid:
                    assert ok, error
                    return per_key
        raise AssertionError("no completion")

    tiers = tier_configs("object", tmp, s3)
    key = "model@00000000@0@feedbeef"
    page = bytes(range(256)) * 16
    a = KvtierL2Connector(tiers=tiers, tenant="tenant-a")
    b = KvtierL2Connector(tiers=tiers, tenant="tenant-b")
    again = KvtierL2Connector(tiers=tiers, tenant="tenant-a")
    try:
        assert call(a, lambda: a.submit_batch_set([key], [memoryview(page)])) == [True]
        assert call(b, lambda: b.submit_batch_exists([key])) == [False], "tenant b sees a's page"
        out = bytearray(len(page))
        assert call(b, lambda: b.submit_batch_get([key], [memoryview(out)])) == [False]
        assert call(again, lambda: again.submit_batch_exists([key])) == [True]
        assert call(again, lambda: again.submit_batch_get([key], [memoryview(out)])) == [True]
        assert bytes(out) == page
    finally:
        for c in (a, b, again):
            c.close()


def test_reads_and_writes_end_by_the_adapters_bounds(silent_endpoint):
    """Storage that never answers (its own bound 30 s): with ``read_timeout_ms`` and
    ``write_timeout_ms`` (as LMCache's own L2 adapters take), a get and an exists complete by
    the read bound with misses and a set by the write bound as failed; a bound that is not a
    positive whole number of milliseconds is a config error naming it."""
    import select

    import kvtier
    from conftest import silent_object_tier
    from kvtier.lmcache import KvtierL2Connector

    tiers = [silent_object_tier(silent_endpoint, timeout="30s")]
    c = KvtierL2Connector(tiers=tiers, read_timeout_ms=300, write_timeout_ms=300)
    try:
        started = time.monotonic()
        ids = {
            "get": c.submit_batch_get(["m@00000000@0@aa"], [memoryview(bytearray(4096))]),
            "exists": c.submit_batch_exists(["m@00000000@0@aa"]),
            "set": c.submit_batch_set(["m@00000000@0@bb"], [memoryview(bytearray(4096))]),
        }
        got = {}
        poller = select.poll()
        poller.register(c.event_fd(), select.POLLIN)
        while len(got) < len(ids) and time.monotonic() - started < 20:
            poller.poll(100)
            for fid, ok, error, per_key in c.drain_completions():
                got[fid] = (ok, error, per_key, time.monotonic() - started)
        by_name = {name: got.get(fid) for name, fid in ids.items()}
        assert all(by_name.values()), by_name
        for name, (ok, error, per_key, took) in by_name.items():
            assert per_key == [False] and took < 1.3, (name, ok, error, per_key, took)
        assert by_name["set"][0] is False, by_name["set"]
        print({name: f"{v[3]:.3f} s" for name, v in by_name.items()})
    finally:
        c.close()
    for wrong in (0, -1, 0.5, "300"):
        with pytest.raises(kvtier.ConfigError, match="read_timeout_ms"):
            KvtierL2Connector(tiers=tiers, read_timeout_ms=wrong)


def test_a_lookup_answers_each_key_of_lmcaches_grid(tmp):
    """LMCache's own L2 adapter asks about a grid of keys (a row per object group and KV rank,
    flattened) and reads each key's bit: a key missing in one row must not hide the keys after
    it, nor the other rows' keys. Stored: ranks 0 and 1 of chunks 0..3, but for rank 0's chunk
    1; every other key of the grid is found."""
    from lmcache.v1.distributed.api import ObjectKey
    from lmcache.v1.distributed.config import parse_args
    from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import _object_key_to_string
    from lmcache.v1.distributed.storage_manager import StorageManager

    spec = plugin_spec(tier_configs("mem", tmp))
    sm = StorageManager(parse_args(["--l1-size-gb", "0.05", "--eviction-policy", "LRU",
                                    "--l2-adapter", json.dumps(spec)]))
    try:
        (_, adapter), = sm.l2_adapters()
        grid = [ObjectKey(chunk_hash=ObjectKey.IntHash2Bytes(9000 + chunk), model_name="org/model",
                          kv_rank=rank)
                for rank in (0, 1) for chunk in range(4)]
        stored = [k for i, k in enumerate(grid) if i != 1]
        names = [_object_key_to_string(k) for k in stored]
        assert adapter._client.store.put(names, [b"\x07" * 4096] * len(names)) == [None] * len(names)
        task = adapter.submit_lookup_and_lock_task(grid, {})
        answers = []

        def answered():
            bits = adapter.query_lookup_and_lock_result(task)
            if bits is not None:
                answers.append(bits)
            return bool(answers)

        wait_until("the lookup", answered, timeout=30)
        found = sorted(answers[0].get_indices_list())
        assert found == [0, 2, 3, 4, 5, 6, 7], found
        print(f"LMCache's lookup of a 2 x 4 grid with one key missing: bits {found}")
    finally:
        sm.close()



def test_every_cache_salt_lmcache_accepts_is_a_namespace_of_its_own(tmp):
    """LMCache takes ``cache_salt`` values of up to 128 characters with spaces and any Unicode
    (a tenant's isolation); kvtier keys hold printable ASCII only. Every such key stores and
    loads, and two salts never see each other's pages (nor the unsalted key's)."""
    import select

    from lmcache.v1.distributed.api import ObjectKey
    from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter import _object_key_to_string
    from kvtier.lmcache import KvtierL2Connector

    salts = ["", "tenant a", "tenant b", ("Ünïcødé 租户 🙂 " * 10)[:128], "x" * 128]
    assert len(salts[3]) == 128
    keys = [_object_key_to_string(ObjectKey(chunk_hash=ObjectKey.IntHash2Bytes(42), model_name="org/model",
                                            kv_rank=0, cache_salt=salt)) for salt in salts]
    c = KvtierL2Connector(tiers=tier_configs("mem", tmp))

    def run(submit):
        fid = submit()
        poller = select.poll()
        poller.register(c.event_fd(), select.POLLIN)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            poller.poll(100)
            for done, ok, error, per_key in c.drain_completions():
                if done == fid:
                    return ok, error, per_key
        raise AssertionError("no completion")

    try:
        pages = [memoryview(bytes([i + 1]) * 4096) for i in range(len(keys))]
        for i, key in enumerate(keys[:-1]):
            assert run(lambda: c.submit_batch_set([key], [pages[i]])) == (True, "", [True]), key
        ok, _, present = run(lambda: c.submit_batch_exists(keys))
        assert ok and present == [True] * (len(keys) - 1) + [False], present
        for i, key in enumerate(keys[:-1]):
            buf = memoryview(bytearray(4096))
            assert run(lambda: c.submit_batch_get([key], [buf]))[2] == [True]
            assert bytes(buf) == bytes(pages[i]), f"salt {salts[i]!r} read another salt's page"
        print(f"{len(salts)} salts (up to 128 characters, spaces, Unicode): each its own page")
    finally:
        c.close()


def test_close_never_returns_while_a_call_may_write_into_lmcaches_memory(silent_endpoint):
    """A read into LMCache's memory still running at ``close`` (storage that never answers,
    its own bound 30 s): ``close`` cancels it and returns in seconds, not after the read's 30
    s, and nothing writes into the memory after it returned."""
    from conftest import silent_object_tier
    from kvtier.lmcache import KvtierL2Connector

    c = KvtierL2Connector(tiers=[silent_object_tier(silent_endpoint, timeout="30s")])
    memory = bytearray(b"\xaa" * 4096)
    c.submit_batch_get(["m@00000000@0@aa"], [memoryview(memory)])
    started = time.monotonic()
    c.close()
    took = time.monotonic() - started
    assert took < 10.0, f"close took {took:.1f} s"
    time.sleep(0.5)
    assert memory == b"\xaa" * 4096
    print(f"close cancelled the running read in {took:.1f} s")


def test_chunks_stored_are_published_as_kv_events_for_routers(tmp):
    """With ``kv_events``, the chunks LMCache's storage manager stored through kvtier come out
    on a publisher of kvtier's own as KV events a router reads (``BlockStored``, medium
    ``DISK``, one event hash per chunk: its first KV rank's key), built from the engine classes
    importable here (SGLang's: LMCache publishes its CPU tier's events only), and read with
    them."""
    import msgspec
    import zmq
    from conftest import free_port
    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
    from lmcache.v1.distributed.config import parse_args
    from lmcache.v1.distributed.storage_manager import StorageManager
    from sglang.srt.disaggregation.kv_events import BlockStored, KVEventBatch

    port = free_port()
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    decode = msgspec.msgpack.Decoder(type=KVEventBatch).decode
    spec = plugin_spec(tier_configs("nixl-file-path", tmp),
                       kv_events={"endpoint": f"tcp://*:{port}"}, kv_events_block_size=16)
    sm = StorageManager(parse_args(["--l1-size-gb", "0.05", "--eviction-policy", "LRU",
                                    "--l2-adapter", json.dumps(spec)]))
    layout = MemoryLayoutDesc(shapes=[torch.Size([2, 1024])], dtypes=[torch.float16])

    def store(first, n, kv_rank=0):
        keys = [ObjectKey(chunk_hash=ObjectKey.IntHash2Bytes(first + i), model_name="org/model",
                          kv_rank=kv_rank) for i in range(n)]
        objs = sm.reserve_write(keys, layout)
        for k in keys:
            objs[k].tensor.fill_(1.0)
        sm.finish_write(keys)
        return keys

    try:
        # A subscriber joins a publisher a moment after it binds: chunks are stored until it has.
        deadline = time.monotonic() + 30
        warm = 0
        while not sub.poll(300):
            store(90_000 + warm, 1)
            warm += 1
            assert time.monotonic() < deadline, "the subscriber joined the publisher"
        while sub.poll(500):
            sub.recv_multipart()

        store(5000, 3, kv_rank=1)  # another KV rank's copies of chunks: no event of their own
        keys = store(7000, 4)
        seen = []
        wanted = {int.from_bytes(k.chunk_hash[:8], "big", signed=True) for k in keys}
        while not wanted <= set(seen):
            assert sub.poll(10_000), f"events for every chunk stored: saw {seen}"
            _topic, _seq, payload = sub.recv_multipart()
            for event in decode(payload).events:
                assert isinstance(event, BlockStored)
                assert (event.medium, event.block_size) == ("DISK", 16)
                seen.extend(event.block_hashes)
        while sub.poll(500):
            _topic, _seq, payload = sub.recv_multipart()
            seen.extend(h for e in decode(payload).events for h in e.block_hashes)
        others = {int.from_bytes(ObjectKey.IntHash2Bytes(5000 + i)[:8], "big", signed=True)
                  for i in range(3)}
        assert not others & set(seen), "a chunk's other KV ranks publish nothing of their own"
        print(f"LMCache: {len(keys)} chunks stored, {len(seen)} BlockStored hashes published")
    finally:
        sm.close()
        sub.close(linger=0)


def test_with_the_integrity_secret_no_file_name_carries_a_chunk_hash(tmp, monkeypatch):
    """With the tiers' integrity secret, the files of LMCache's chunks are named by keyed
    digests: a co-tenant listing the folder reads no chunk hash (without it the names are
    LMCache's keys, hashes in clear); the chunk reads back whole."""
    from kvtier.lmcache import KvtierL2Connector

    monkeypatch.setenv("KVTIER_TEST_TENANT_SECRET", "the fleet's secret, 32 bytes long")
    folder = tmp / "sealed"
    c = KvtierL2Connector(tiers=[{"kind": "nixl-file", "dirs": [str(folder)], "access": "shared",
                                  "integrity": {"key_env": "KVTIER_TEST_TENANT_SECRET"}}])
    chunk = "0123456789abcdef" * 4
    key = f"org/model@00000000@0@{chunk}"
    page = bytes(range(256)) * 16

    def done(fid):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for got, ok, error, per_key in c.drain_completions():
                if got == fid:
                    return ok, per_key
            time.sleep(0.01)
        raise AssertionError("the call completed")

    try:
        assert done(c.submit_batch_set([key], [memoryview(page)])) == (True, [True])
        names = [n for _, _, files in os.walk(folder) for n in files if not n.startswith(".")]
        assert len(names) == 1, names
        assert chunk[:16] not in names[0] and "org" not in names[0], names
        back = bytearray(len(page))
        assert done(c.submit_batch_get([key], [memoryview(back)])) == (True, [True])
        assert bytes(back) == page
    finally:
        c.close()
