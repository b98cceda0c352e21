"""kvtier as a vLLM secondary offloading tier, proven through vLLM's own code on CPU: the tier
is created by vLLM's ``OffloadingSpecFactory`` / ``TieringOffloadingSpec`` from a
``secondary_tiers`` entry naming its module, then driven by vLLM's
``TieringOffloadingManager``: stores cascade from the primary CPU tier into kvtier, the
primary tier is reset, lookups answer ``HIT_PENDING`` while kvtier loads the chunks back
and ``HIT`` once they are in, and every byte is compared. Runs in the vLLM venv
(``make pytests``)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import tier_configs, two_instances

KINDS = ["mem", "nixl-file-path", "object"]
BLOCK_BYTES = 16384


def make_manager(secondary_tiers, chunks=64, engine_id="kvtier-test", tp_size=1, agnostic=False,
                 kv_events=False):
    """vLLM's tiering manager on CPU; with ``tp_size`` workers each holding its share of a
    block's ``BLOCK_BYTES``."""
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
        worker_kv_bytes_per_block=BLOCK_BYTES // tp_size,
        enable_kv_cache_events=kv_events,
        extra_config={"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": chunks * BLOCK_BYTES,
                      "secondary_tiers": secondary_tiers},
        engine_id=engine_id,
        model=OffloadingModelConfig(name="org/model", dtype="float16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=tp_size, tp_size=tp_size, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=agnostic),
    )
    spec = OffloadingSpecFactory.create_spec(config)
    return spec, spec.get_manager()


def kvtier_entry(tiers):
    return {"type": "KvtierSecondaryTier", "module_path": "kvtier.vllm", "tiers": tiers}


def primary_view(manager):
    view = manager.primary_tier.get_kv_memoryview()
    assert view.format == "b" and view.ndim == 2
    return np.asarray(view)


def step_until(manager, what, check, timeout=60.0):
    """Runs scheduler steps (``check``, then the step's end) until ``check`` holds."""
    from vllm.v1.kv_offload.base import ScheduleEndContext

    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        # The end of a scheduler step: vLLM submits the promotions lookups started.
        with manager.lock:
            manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
        time.sleep(0.005)


def load_and_compare(manager, primary, want, req):
    """Loads chunks that lookups found (HIT) from the primary tier, as the worker would copy
    them to GPU, and compares every byte."""
    keys = list(want)
    with manager.lock:
        spec = manager.prepare_load(keys, req)
    for k, chunk in zip(keys, spec.chunk_ids):
        assert np.array_equal(primary[chunk], want[k]), k
    with manager.lock:
        manager.complete_load(keys, req)
        manager.on_request_finished(req)


def store_chunks(manager, primary, want):
    """The scheduler stores chunks into the primary CPU tier (the worker's copy from GPU is a
    write into the primary view); complete_store cascades them to the secondary tiers."""
    from vllm.v1.kv_offload.base import ReqContext

    keys = list(want)
    req = ReqContext(req_id=f"writer-{time.monotonic_ns()}")
    with manager.lock:
        manager.on_new_request(req)
        out = manager.prepare_store(keys, req)
        assert list(out.keys_to_store) == keys
        for k, chunk in zip(keys, out.store_spec.chunk_ids):
            primary[chunk] = want[k]
        manager.complete_store(keys, req)
        manager.on_request_finished(req)


def stored_by_an_engine(tiers, want, **engine):
    """An engine on `tiers` stores the chunks of `want` into kvtier, drains and shuts down."""
    _, manager = make_manager([kvtier_entry(tiers)], **engine)
    try:
        primary = primary_view(manager)
        store_chunks(manager, primary, want)
        with manager.lock:
            manager.reset_cache()
    finally:
        primary = None
        manager.shutdown()


@pytest.mark.parametrize("kind", KINDS)
def test_store_cascade_reset_and_promotion_through_vllms_tiering_manager(kind, tmp, s3):
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
    from kvtier.vllm import KvtierSecondaryTier

    spec, manager = make_manager([kvtier_entry(tier_configs(kind, tmp, s3))])
    try:
        (tier,) = manager.secondary_tiers
        assert isinstance(tier, KvtierSecondaryTier)
        primary = primary_view(manager)
        n = 12
        keys = [make_offload_key(bytes([i]) * 32, 0) for i in range(n)]
        rng = np.random.default_rng(5)
        want = {k: rng.integers(-128, 128, BLOCK_BYTES, dtype=np.int8) for k in keys}

        store_chunks(manager, primary, want)

        # reset_cache drains kvtier's jobs and empties the primary tier: kvtier holds the
        # only copy.
        with manager.lock:
            manager.reset_cache()
            manager.on_reset_flushed()
        primary[:] = 0
        assert tier.store.exists([tier._name(k) for k in keys]) == n

        reader = ReqContext(req_id="reader")
        with manager.lock:
            manager.on_new_request(reader)
        seen = set()

        def lookups():
            with manager.lock:
                results = [manager.lookup(k, reader) for k in keys]
            seen.update(results)
            return all(r is LookupResult.HIT for r in results)

        step_until(manager, "every chunk promoted back (HIT)", lookups)
        assert LookupResult.HIT_PENDING in seen, seen
        load_and_compare(manager, primary, want, reader)
        print(f"{kind}: vLLM tiering: {n} chunks cascaded, primary reset, "
              f"lookups {sorted(r.name for r in seen)}, {n} loaded back, bytes equal")
    finally:
        primary = None
        manager.shutdown()


@pytest.mark.parametrize("kind", ["nixl-file-path", "object"])
def test_a_restarted_engine_finds_what_the_last_one_stored(kind, tmp, s3):
    """A new engine (a new manager and tier on the same config) knows nothing of the chunks:
    its lookups answer RETRY while kvtier checks, then HIT_PENDING, then HIT; a chunk never
    stored is a MISS."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key

    tiers = tier_configs(kind, tmp, s3)
    n = 8
    keys = [make_offload_key(bytes([100 + i]) * 32, 0) for i in range(n)]
    absent = make_offload_key(b"\xee" * 32, 0)
    rng = np.random.default_rng(9)
    want = {k: rng.integers(-128, 128, BLOCK_BYTES, dtype=np.int8) for k in keys}

    stored_by_an_engine(tiers, want)

    _, second = make_manager([kvtier_entry(tiers)])
    try:
        primary = primary_view(second)
        reader = ReqContext(req_id="second")
        with second.lock:
            second.on_new_request(reader)
        seen = []

        def lookups():
            with second.lock:
                results = [second.lookup(k, reader) for k in keys + [absent]]
            seen.append(results)
            return all(r is LookupResult.HIT for r in results[:n]) and results[n] is LookupResult.MISS

        step_until(second, "every stored chunk promoted and the absent one a miss", lookups)
        assert seen[0] == [LookupResult.RETRY] * (n + 1), seen[0]
        assert any(LookupResult.HIT_PENDING in r for r in seen), seen
        load_and_compare(second, primary, want, reader)
        print(f"{kind}: vLLM restart: lookups RETRY -> HIT_PENDING -> HIT over {len(seen)} steps, "
              f"{n} chunks loaded, bytes equal; never-stored chunk MISS")
    finally:
        primary = None
        second.shutdown()


def standalone_tier(tiers, chunks=4, **options):
    """The tier alone, as vLLM's factory builds it, over a primary region of its own."""
    from kvtier.vllm import KvtierSecondaryTier

    region = bytearray(chunks * BLOCK_BYTES)
    view = memoryview(region).cast("b", shape=[chunks, BLOCK_BYTES])
    return KvtierSecondaryTier(None, view, "KvtierSecondaryTier", tiers=tiers, **options), np.asarray(view)


def finished(tier, job_ids, timeout=60.0):
    got = {}
    deadline = time.monotonic() + timeout
    while set(job_ids) - got.keys():
        assert time.monotonic() < deadline, f"jobs {set(job_ids) - got.keys()} never finished"
        for r in tier.get_finished_jobs():
            got[r.job_id] = r
        time.sleep(0.005)
    return got


def test_a_load_reports_the_chunks_that_did_load(tmp):
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob

    tier, primary = standalone_tier(tier_configs("mem", tmp))
    try:
        req = ReqContext(req_id="r")
        keys = [make_offload_key(bytes([i]) * 32, 0) for i in range(4)]
        primary[0] = 7
        primary[1] = -7
        tier.submit_store(TransferJob(1, keys[:2], np.array([0, 1]), False, req))
        assert finished(tier, [1])[1].success
        primary[:] = 0
        tier.submit_load(TransferJob(2, [keys[1], keys[3], keys[0]], np.array([2, 3, 0]), True, req))
        r = finished(tier, [2])[2]
        assert r.success is False and set(r.successful_keys) == {keys[0], keys[1]}
        assert (primary[2] == -7).all() and (primary[0] == 7).all()
    finally:
        tier.shutdown()


def test_failures_are_failed_jobs_and_misses_never_exceptions(silent_endpoint):
    from conftest import silent_object_tier
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob

    tier, _ = standalone_tier([silent_object_tier(silent_endpoint)])
    try:
        req = ReqContext(req_id="r")
        key = make_offload_key(b"\x01" * 32, 0)
        tier.submit_store(TransferJob(1, [key], np.array([0]), False, req))
        tier.submit_load(TransferJob(2, [key], np.array([1]), True, req))
        # A job vLLM should never send (more keys than chunks) fails as a job too.
        tier.submit_store(TransferJob(3, [key, key], np.array([2]), False, req))
        assert tier.lookup(key, req) is LookupResult.RETRY
        jobs = finished(tier, [1, 2, 3])
        assert [jobs[i].success for i in (1, 2, 3)] == [False, False, False]
        deadline = time.monotonic() + 60
        while (answer := tier.lookup(key, req)) is LookupResult.RETRY:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert answer is LookupResult.MISS
        tier.drain_jobs()
    finally:
        tier.shutdown()


def test_drained_chunks_are_vllms_again_even_when_storage_stalls(silent_endpoint):
    """A store still reading vLLM's chunks when ``drain_timeout`` passes: ``drain_jobs`` must
    not return before it ends, since vLLM reuses the chunks at once. The lower tier never
    answers, so the first store fills the hierarchy's queue and the second waits for room (up
    to ``flush_timeout``) before it copies its chunk: overwriting that chunk as soon as
    ``drain_jobs`` returns must never change what was stored."""
    from conftest import silent_object_tier
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob

    tiers = [{"kind": "mem", "capacity": "4MiB"}, silent_object_tier(silent_endpoint, timeout="60s")]
    tier, primary = standalone_tier(tiers, drain_timeout=0.3,
                                    hierarchy={"queue_bytes": BLOCK_BYTES, "flush_timeout": "3s"})
    try:
        req = ReqContext(req_id="r")
        keys = [make_offload_key(bytes([i + 1]) * 32, 0) for i in range(2)]
        primary[0] = 11
        primary[1] = 22
        tier.submit_store(TransferJob(1, keys[:1], np.array([0]), False, req))
        assert finished(tier, [1])[1].success
        tier.submit_store(TransferJob(2, keys[1:], np.array([1]), False, req))
        started = time.monotonic()
        tier.drain_jobs()
        waited = time.monotonic() - started
        primary[1] = -33  # vLLM reuses the chunk for another block
        done = finished(tier, [2]) if tier.has_pending_work() else {}
        tier.submit_load(TransferJob(3, keys[1:], np.array([2]), True, req))
        assert finished(tier, [3])[3].success
        assert (primary[2] == 22).all(), f"the stored chunk holds bytes vLLM wrote after drain_jobs ({waited:.1f} s)"
        assert waited >= 2.0, f"drain_jobs returned after {waited:.1f} s, before the store ended"
        print(f"drain_jobs waited {waited:.1f} s for a store past its 0.3 s drain_timeout; the chunk stayed whole {done}")
    finally:
        tier.shutdown()


TWO_ENGINES = """
import sys, time
from pathlib import Path
sys.path[:0] = [TESTS, TESTS + "/engines/vllm"]
import numpy as np
from test_vllm import BLOCK_BYTES, kvtier_entry, load_and_compare, make_manager, primary_view, step_until, store_chunks
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key

# What the engine imports is loaded first: the time measured is opening, not importing.
import kvtier.vllm, vllm.v1.kv_offload.config, vllm.v1.kv_offload.factory, vllm.v1.kv_offload.tiering.spec

sync, shared = Path(SYNC), SHARED
started = time.monotonic()
# Engines have ids of their own (vLLM names the primary tier's shared memory after it).
_, manager = make_manager([kvtier_entry(TIERS_BY[ME - 1])], engine_id=f"kvtier-engine-{ME}")
(sync / f"opened.{ME}").write_text(f"{time.monotonic() - started:.3f}")

def barrier(name):
    (sync / f"{name}.{ME}").touch()
    deadline = time.monotonic() + 120
    while len(list(sync.glob(f"{name}.*"))) < 2:  # both engines are up at once
        assert time.monotonic() < deadline, f"the other engine never reached {name}"
        time.sleep(0.02)

def chunks_of(engine):
    rng = np.random.default_rng(engine)
    keys = [make_offload_key(bytes([engine * 16 + i]) * 32, 0) for i in range(8)]
    return {k: rng.integers(-128, 128, BLOCK_BYTES, dtype=np.int8) for k in keys}

barrier("open")
try:
    primary = primary_view(manager)
    store_chunks(manager, primary, chunks_of(ME))
    with manager.lock:  # drains kvtier's jobs and empties the primary tier
        manager.reset_cache()
        manager.on_reset_flushed()
    primary[:] = 0
    barrier("written")
    other = 3 - ME
    for engine in (other, ME):
        want = chunks_of(engine)
        reader = ReqContext(req_id=f"reader-{engine}")
        with manager.lock:
            manager.on_new_request(reader)
        if engine == other and not shared:
            def settled():
                with manager.lock:
                    results = [manager.lookup(k, reader) for k in want]
                return all(r is not LookupResult.RETRY for r in results) and results
            results = step_until(manager, "the other engine's chunks looked up", settled)
            assert all(r is LookupResult.MISS for r in results), f"an owned folder showed them: {results}"
            with manager.lock:
                manager.on_request_finished(reader)
            continue

        def hits():
            with manager.lock:
                return all(manager.lookup(k, reader) is LookupResult.HIT for k in want)

        step_until(manager, f"every chunk of engine {engine} from kvtier", hits)
        load_and_compare(manager, primary, want, reader)
    barrier("read")
finally:
    primary = None
    manager.shutdown()
print("engine", ME, "ok")
"""


@pytest.mark.parametrize("kind, access", [
    ("nixl-file-path", None), ("mem-over-nixl-file", None), ("gluster", None), ("nixl-file-path", "owner"),
])
def test_two_engines_on_one_config_start_at_once_and_share_their_chunks(kind, access, tmp, gluster):
    """Two vLLM engines (two processes) started from one config at the same moment (on
    GlusterFS, each through a mount of its own: two nodes): both open at once, and each loads
    the chunks the other stored, byte-exact (NIXL FILE folders are shared by default, as
    vLLM's own ``fs`` tier shares its root). With ``access = "owner"`` named, each gets folders
    of its own and the other's chunks are misses."""
    import json
    from pathlib import Path

    from conftest import run_instances

    tiers_by = two_instances(kind, tmp, gluster, access)
    tests = Path(__file__).resolve().parents[2]
    sync = tmp / "sync"
    sync.mkdir()
    code = (TWO_ENGINES.replace("TESTS", repr(str(tests))).replace("SYNC", repr(str(sync)))
            .replace("TIERS_BY", json.dumps(tiers_by)).replace("SHARED", repr(access is None)))
    opened = run_instances(code, sync)
    print(f"{kind} (access {access or 'default'}): two vLLM engines opened in {opened} s; "
          f"{'each loaded the other' + chr(39) + 's chunks' if access is None else 'each kept its own'}")


@pytest.mark.parametrize("agnostic", [True, False])
def test_parallelism_agnostic_chunks_are_shared_across_tp_sizes(agnostic, tmp):
    """vLLM certifies a layout parallelism-agnostic: a chunk (every worker's share of its blocks,
    in rank order) holds the same bytes whatever the TP size, and kvtier names it without the
    parallelism, as vLLM's own fs and obj tiers do, so a TP-2 engine loads what a TP-1 engine
    stored, byte-exact. Otherwise the TP size is in the name and the chunks are misses."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key

    tiers = tier_configs("nixl-file-path", tmp)
    keys = [make_offload_key(bytes([200 + i]) * 32, 0) for i in range(4)]
    rng = np.random.default_rng(17)
    want = {k: rng.integers(-128, 128, BLOCK_BYTES, dtype=np.int8) for k in keys}
    stored_by_an_engine(tiers, want, agnostic=agnostic)
    _, second = make_manager([kvtier_entry(tiers)], tp_size=2, agnostic=agnostic, engine_id="kvtier-tp2")
    try:
        primary = primary_view(second)
        reader = ReqContext(req_id="tp2")
        with second.lock:
            second.on_new_request(reader)

        def settled():
            with second.lock:
                results = [second.lookup(k, reader) for k in keys]
            if agnostic:
                return all(r is LookupResult.HIT for r in results) and results
            return all(r is not LookupResult.RETRY for r in results) and results

        results = step_until(second, "the TP-1 engine's chunks looked up", settled)
        if agnostic:
            load_and_compare(second, primary, want, reader)
        else:
            assert all(r is LookupResult.MISS for r in results), results
    finally:
        primary = None
        second.shutdown()


def test_a_long_prompts_lookups_take_one_check_per_step_and_never_exhaust_the_queue(tmp):
    """A prompt of 300 chunks looked up on a tier whose queue holds 4 calls: the lookups of a
    step are checked together in one call at the step's end, so every stored chunk is a HIT
    and none is ever answered MISS for want of room (one check per chunk filled the queue
    after 4 and answered the rest MISS)."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key

    tiers = tier_configs("nixl-file-path", tmp)
    stored = [make_offload_key(bytes([250]) * 28 + i.to_bytes(4, "big"), 0) for i in range(6)]
    rng = np.random.default_rng(23)
    want = {k: rng.integers(-128, 128, BLOCK_BYTES, dtype=np.int8) for k in stored}
    stored_by_an_engine(tiers, want)
    absent = [make_offload_key(bytes([251]) * 28 + i.to_bytes(4, "big"), 0) for i in range(294)]
    keys = absent + stored  # the stored chunks last, past the queue's room
    _, second = make_manager([{**kvtier_entry(tiers), "max_pending": 4}])
    try:
        (tier,) = second.secondary_tiers
        req = ReqContext(req_id="long")
        with second.lock:
            second.on_new_request(req)
        answers = []

        def settled():
            with second.lock:
                results = [tier.lookup(k, req) for k in keys]
            answers.append(results)
            return all(r is not LookupResult.RETRY for r in results) and results

        results = step_until(second, "every chunk of the prompt answered", settled)
        assert results[-6:] == [LookupResult.HIT] * 6, results[-6:]
        assert results[:-6] == [LookupResult.MISS] * 294
        assert not any(LookupResult.MISS in a[-6:] for a in answers), "a stored chunk answered MISS"
        assert len(answers) <= 4, f"{len(answers)} steps to answer one prompt"
    finally:
        second.shutdown()


def test_kv_events_say_which_chunks_storage_holds(tmp):
    """With ``enable_kv_events`` (and the engine's KV events on), the chunks kvtier stored come
    out of vLLM's ``take_events`` as STORAGE events with the tier's ``locality``, so KV-aware
    routers see what storage holds; a ``locality`` vLLM does not know is a ConfigError."""
    import kvtier
    from vllm.v1.kv_offload.base import Locality, Medium, make_offload_key

    entry = {**kvtier_entry(tier_configs("nixl-file-path", tmp)), "enable_kv_events": True,
             "locality": "REMOTE"}
    keys = [make_offload_key(bytes([180 + i]) * 32, 0) for i in range(5)]
    rng = np.random.default_rng(29)
    want = {k: rng.integers(-128, 128, BLOCK_BYTES, dtype=np.int8) for k in keys}
    _, manager = make_manager([entry], kv_events=True)
    try:
        primary = primary_view(manager)
        store_chunks(manager, primary, want)
        with manager.lock:
            manager.reset_cache()  # drains kvtier's jobs
            events = [e for e in manager.take_events() if e.medium is Medium.STORAGE]
        assert [k for e in events for k in e.keys] == keys, events
        assert all(e.removed is False and e.locality is Locality.REMOTE for e in events), events
    finally:
        primary = None
        manager.shutdown()
    with pytest.raises(kvtier.ConfigError, match="locality"):
        make_manager([{**entry, "locality": "nearby"}])


@pytest.mark.parametrize("namespace", [None, "x"])
def test_another_tenant_on_the_same_storage_finds_nothing(tmp, s3, namespace):
    """Engines of two tenants on one bucket prefix: what tenant a stored is a MISS for tenant
    b's engine, and a HIT for tenant a's next engine; with the same explicit ``namespace`` too
    (it dropped the tenant: both tenants' chunks were named alike)."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key

    tiers = tier_configs("object", tmp, s3)
    keys = [make_offload_key(bytes([40 + i]) * 32, 0) for i in range(4)]
    rng = np.random.default_rng(4)
    want = {k: rng.integers(-128, 128, BLOCK_BYTES, dtype=np.int8) for k in keys}

    def entry(tenant):
        named = {"namespace": namespace} if namespace else {}
        return {**kvtier_entry(tiers), "tenant": tenant, **named}

    _, writer = make_manager([entry("tenant-a")])
    try:
        store_chunks(writer, primary_view(writer), want)
    finally:
        writer.shutdown()
    for tenant, expect in (("tenant-b", LookupResult.MISS), ("tenant-a", LookupResult.HIT)):
        _, reader = make_manager([entry(tenant)])
        try:
            req = ReqContext(req_id=tenant)
            with reader.lock:
                reader.on_new_request(req)

            def settled():
                with reader.lock:
                    results = [reader.lookup(k, req) for k in keys]
                return all(r is expect for r in results)

            step_until(reader, f"{tenant}: every chunk {expect}", settled)
        finally:
            reader.shutdown()


def test_lookups_and_loads_on_storage_that_hangs_end_by_the_tiers_bounds(silent_endpoint):
    """Storage that never answers (its own bound 30 s): a lookup is a ``MISS`` by
    ``lookup_timeout_ms`` (default 1000, as vLLM's KVCR tier's ``operation_timeout_ms``),
    never ``RETRY`` for the store's 30 s; a load fails by ``transfer_timeout_ms``."""
    import kvtier
    from conftest import silent_object_tier
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob

    req = ReqContext(req_id="r")

    def lookup_time(tier, key):
        started = time.monotonic()
        while (answer := tier.lookup(key, req)) is LookupResult.RETRY:
            assert time.monotonic() - started < 20, "a lookup still RETRY after 20 s"
            tier.on_schedule_end(None)  # the step's end, as vLLM's tiering manager calls it
            time.sleep(0.005)
        return answer, time.monotonic() - started

    tiers = [silent_object_tier(silent_endpoint, timeout="30s")]
    for options, bound in (({"lookup_timeout_ms": 300, "transfer_timeout_ms": 300}, 0.3), ({}, 1.0)):
        tier, _ = standalone_tier(tiers, **options)
        try:
            key = make_offload_key(bytes([len(options)]) * 32, 0)
            answer, took = lookup_time(tier, key)
            assert answer is LookupResult.MISS and took < bound + 1.0, (options, answer, took)
            if options:
                started = time.monotonic()
                tier.submit_load(TransferJob(1, [key], np.array([0]), True, req))
                job = finished(tier, [1], timeout=20)[1]
                load_took = time.monotonic() - started
                assert job.success is False and load_took < bound + 1.0, (job, load_took)
                print(f"bounded: lookup MISS in {took:.3f} s, load failed in {load_took:.3f} s")
            else:
                print(f"default: lookup MISS in {took:.3f} s")
        finally:
            tier.shutdown()
    for wrong in (0, -5, 1.5, "100"):
        with pytest.raises(kvtier.ConfigError, match="lookup_timeout_ms"):
            standalone_tier(tiers, lookup_timeout_ms=wrong)


def test_a_chunk_id_outside_the_primary_view_fails_its_job_and_touches_nothing(tmp):
    """vLLM names chunks by id in its primary region; an id outside it must fail the job before
    any address is formed (kvtier would store bytes past the region, or load into them)."""
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob

    tier, primary = standalone_tier(tier_configs("mem", tmp), chunks=4)
    try:
        req = ReqContext(req_id="r")
        keys = [make_offload_key(bytes([i + 1]) * 32, 0) for i in range(3)]
        tier.submit_store(TransferJob(1, keys[:1], np.array([4]), False, req))
        tier.submit_store(TransferJob(2, keys[1:2], np.array([-1]), False, req))
        tier.submit_load(TransferJob(3, keys[2:], np.array([7]), True, req))
        jobs = finished(tier, [1, 2, 3])
        assert [jobs[i].success for i in (1, 2, 3)] == [False, False, False], jobs
        assert tier.store.contains([tier._name(k) for k in keys]) == [False, False, False]
    finally:
        tier.shutdown()


@pytest.mark.parametrize("kind", ["mem", "nixl-file-owner", "nixl-file-shared"])
def test_chunks_vllm_touches_outlive_older_untouched_ones_in_kvtiers_eviction(kind, tmp):
    """vLLM touches the chunks a request reuses; kvtier's tiers must see it: four chunks fill a
    tier that holds four, the oldest is touched, and a fifth evicts the second (least recently
    used), not the touched one (a touch that did nothing lost the hot chunk)."""
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.base import TransferJob

    capacity = 4 * BLOCK_BYTES + BLOCK_BYTES // 2
    disk = {"kind": "nixl-file", "dirs": [str(tmp / "disk")], "capacity": capacity}
    tiers = {
        "mem": [{"kind": "mem", "capacity": capacity, "policy": "lru"}],
        "nixl-file-owner": [{**disk, "access": "owner", "policy": "lru"}],
        "nixl-file-shared": [{**disk, "access": "shared", "touch_interval": "1ms"}],
    }[kind]
    tier, primary = standalone_tier(tiers, chunks=1)
    try:
        req = ReqContext(req_id="r")
        keys = [make_offload_key(bytes([60 + i]) * 32, 0) for i in range(5)]
        for i, k in enumerate(keys[:4]):
            primary[0] = i
            tier.submit_store(TransferJob(i, [k], np.array([0]), False, req))
            assert finished(tier, [i])[i].success
            time.sleep(0.01)  # distinct use times, for the shared folder's mtime order
        tier.touch([keys[0]], req)
        tier.on_schedule_end(None)
        deadline = time.monotonic() + 30
        while tier.has_pending_work():
            assert time.monotonic() < deadline, "the touch never finished"
            tier.get_finished_jobs()
            time.sleep(0.005)
        time.sleep(0.01)
        tier.submit_store(TransferJob(4, [keys[4]], np.array([0]), False, req))
        assert finished(tier, [4])[4].success
        present = tier.store.contains([tier._name(k) for k in keys])
        assert present[0] is True, f"the touched chunk was evicted: {present}"
        assert present[1] is False and present[4] is True, present
    finally:
        primary = None
        tier.shutdown()


def test_kvtiers_metrics_reach_vllms_stats_per_level(tmp):
    """vLLM collects each tier's ``get_stats`` into its Prometheus metrics, declared by
    ``build_metric_definitions``: kvtier reports per level what it counted since the last call
    (bytes written and read, hits) and its bytes held and state, every series declared with its
    labels (vLLM's Prometheus layer asserts that)."""
    from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    tiers = tier_configs("mem-over-nixl-file", tmp)
    entry = kvtier_entry(tiers)
    spec, manager = make_manager([entry])
    keys = [make_offload_key(bytes([90 + i]) * 32, 0) for i in range(4)]
    rng = np.random.default_rng(31)
    want = {k: rng.integers(-128, 128, BLOCK_BYTES, dtype=np.int8) for k in keys}
    try:
        defined = TieringOffloadingSpec.build_metric_definitions(
            {"spec_name": "TieringOffloadingSpec", "secondary_tiers": [entry]})
        primary = primary_view(manager)
        store_chunks(manager, primary, want)
        with manager.lock:
            manager.reset_cache()
            manager.on_reset_flushed()
        (tier,) = manager.secondary_tiers
        tier.store.flush()  # the lower level written too
        req = ReqContext(req_id="reader")
        with manager.lock:
            manager.on_new_request(req)

        def all_hit():
            with manager.lock:
                return all(manager.lookup(k, req) is LookupResult.HIT for k in keys)

        step_until(manager, "every chunk a HIT", all_hit)
        load_and_compare(manager, primary, want, req)
        with manager.lock:
            stats = manager.get_stats().reduce()
        mine = {k: v for k, v in stats.items() if k.startswith("vllm:kv_offload_kvtier_")}
        for k in mine:
            name = k.split(":('")[0]
            assert name in defined and defined[name].labelnames == ("level",), k
        written = {k: v for k, v in mine.items() if "bytes_written" in k}
        assert sorted(written.values()) == [4 * BLOCK_BYTES] * 2, mine
        assert sum(v for k, v in mine.items() if "_hits" in k) == 4, mine
        assert all(v == 1 for k, v in mine.items() if "_up" in k), mine
        with manager.lock:
            again = manager.get_stats()
        again = {} if again is None else again.reduce()
        assert not any("bytes_written" in k for k in again), "counted twice"
    finally:
        primary = None
        manager.shutdown()


def test_page_events_publish_with_vllms_own_classes_where_vllm_is_importable():
    """Where vLLM is importable (an LMCache server beside vLLM), kvtier's own KV events
    (:mod:`kvtier.events`, for the engines whose events leave out their storage tier) are built
    from vLLM's publisher and event classes: a chunk's hash goes out as LMCache's digest bytes,
    as LMCache's own events name chunks, and a subscriber decodes them with vLLM's classes."""
    import msgspec
    import zmq
    from conftest import free_port
    from vllm.distributed.kv_events import AllBlocksCleared, BlockStored, KVEventBatch

    from kvtier.events import PageEvents

    decode = msgspec.msgpack.Decoder(type=KVEventBatch).decode
    port = free_port()
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    events = PageEvents.of_any_engine({"endpoint": f"tcp://*:{port}"}, block_size=256,
                                      medium="EXTERNAL")
    assert events.engine == "vllm"
    digest = bytes(range(32))
    try:
        deadline = time.monotonic() + 20
        while True:
            events.stored([events.digest_hash(digest)])
            if sub.poll(200):
                break
            assert time.monotonic() < deadline, "the subscriber joined the publisher"
        _topic, _seq, payload = sub.recv_multipart()
        (stored,) = decode(payload).events
        assert isinstance(stored, BlockStored)
        assert (stored.block_hashes, stored.medium, stored.block_size) == ([digest], "EXTERNAL", 256)
        events.cleared()
        while True:
            assert sub.poll(5000), "the clear is published"
            _topic, _seq, payload = sub.recv_multipart()
            if any(isinstance(e, AllBlocksCleared) for e in decode(payload).events):
                break
    finally:
        events.close()
        sub.close(linger=0)


def test_with_the_integrity_secret_no_file_name_carries_a_chunk_hash(tmp, monkeypatch):
    """With the tiers' integrity secret, kvtier names vLLM's chunks by keyed digests: a
    co-tenant listing the folder reads no chunk hash (each name carried it in hex before); a
    later engine still finds every chunk."""
    import os

    from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key

    monkeypatch.setenv("KVTIER_TEST_TENANT_SECRET", "the fleet's secret, 32 bytes long")
    folder = tmp / "sealed"
    tiers = [{"kind": "nixl-file", "dirs": [str(folder)], "access": "shared",
              "integrity": {"key_env": "KVTIER_TEST_TENANT_SECRET"}}]
    hashes = [bytes([60 + i]) * 32 for i in range(3)]
    keys = [make_offload_key(h, 0) for h in hashes]
    rng = np.random.default_rng(5)
    want = {k: rng.integers(-128, 128, BLOCK_BYTES, dtype=np.int8) for k in keys}
    _, writer = make_manager([kvtier_entry(tiers)])
    try:
        store_chunks(writer, primary_view(writer), want)
    finally:
        writer.shutdown()
    names = [n for _, _, files in os.walk(folder) for n in files if not n.startswith(".")]
    assert len(names) == len(keys), names
    for h in hashes:
        assert not any(h.hex()[:16] in n for n in names), f"a chunk hash in {names}"
    _, reader = make_manager([kvtier_entry(tiers)])
    try:
        req = ReqContext(req_id="r")
        with reader.lock:
            reader.on_new_request(req)

        def found():
            with reader.lock:
                return all(reader.lookup(k, req) is LookupResult.HIT for k in keys)

        step_until(reader, "every chunk found", found)
    finally:
        reader.shutdown()
