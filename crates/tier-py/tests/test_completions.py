"""kvtier.CompletionQueue: non-blocking calls completed in kvtier's runtime, announced on an
eventfd, drained with per-key results; the buffers a call uses held until it is drained."""

from __future__ import annotations

import os
import select
import threading

import pytest

import kvtier
from conftest import KINDS, silent_object_tier, tier_configs


def wait_readable(fd, timeout_s=30.0):
    p = select.poll()
    p.register(fd, select.POLLIN)
    assert p.poll(int(timeout_s * 1000)), "no completion within the bound"


def readable_now(fd):
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(0))


def drain_until(q, ids, timeout_s=30.0):
    """Drains until every id in `ids` completed; returns {id: results}."""
    got = {}
    while not set(ids) <= got.keys():
        wait_readable(q.event_fd(), timeout_s)
        for fid, results in q.drain():
            assert fid not in got, f"id {fid} completed twice"
            got[fid] = results
    return got


def page(i, n=4096):
    return bytes((i * 7 + j) % 251 for j in range(n))


@pytest.mark.parametrize("kind", KINDS)
def test_submitted_calls_complete_on_the_eventfd_with_per_key_results(kind, tmp, s3):
    with kvtier.Store({"tiers": tier_configs(kind, tmp, s3)}) as store:
        q = store.completion_queue()
        keys = [f"cq-{i}" for i in range(6)]
        put = q.submit_put(keys, [page(i) for i in range(6)])
        assert drain_until(q, [put])[put] == [None] * 6
        assert not readable_now(q.event_fd()), "drain resets the eventfd"
        assert q.pending == 0

        bufs = [bytearray(4096) for _ in range(7)]
        get = q.submit_get_into(keys + ["cq-absent"], bufs)
        exists = q.submit_exists(["cq-0", "cq-1", "cq-absent", "cq-2"])
        got = drain_until(q, [get, exists])
        assert get != exists
        assert got[get] == [True] * 6 + [False]
        assert all(bytes(bufs[i]) == page(i) for i in range(6))
        assert got[exists] == [True, True, False, False]

        removed = q.submit_remove(["cq-0", "cq-absent"])
        assert drain_until(q, [removed])[removed] == [True, False]
        assert store.exists(keys) == 0
        q.close()


def test_buffers_are_held_until_their_completion_is_drained(tmp):
    with kvtier.Store({"tiers": tier_configs("mem", tmp)}) as store:
        q = store.completion_queue()
        store.put(["held"], [page(1)])
        buf = bytearray(4096)
        fid = q.submit_get_into(["held"], [buf])
        wait_readable(q.event_fd())
        # Finished, not drained: the export is still held, so the buffer cannot be resized
        # (nor freed) under a call that might write it.
        with pytest.raises(BufferError):
            buf.append(0)
        assert q.drain() == [(fid, [True])]
        buf.append(0)
        assert bytes(buf[:4096]) == page(1)


def test_a_full_queue_refuses_at_once_and_a_closed_one_always(tmp):
    with kvtier.Store({"tiers": tier_configs("mem", tmp)}) as store:
        q = store.completion_queue(max_pending=2)
        a = q.submit_put(["a"], [page(1)])
        b = q.submit_put(["b"], [page(2)])
        with pytest.raises(kvtier.Unavailable, match="max_pending of 2"):
            q.submit_put(["c"], [page(3)])
        drain_until(q, [a, b])
        c = q.submit_exists(["a", "b"])
        assert drain_until(q, [c])[c] == [True, True]
        q.close()
        with pytest.raises(kvtier.Unavailable, match="closed"):
            q.submit_exists(["a"])


def test_bad_input_raises_at_submit_and_starts_nothing(tmp):
    with kvtier.Store({"tiers": tier_configs("mem", tmp)}) as store:
        q = store.completion_queue()
        with pytest.raises(kvtier.InvalidBuffer, match="read-only"):
            q.submit_get_into(["k"], [b"\0" * 16])
        with pytest.raises(kvtier.InvalidKey):
            q.submit_put(["bad key"], [page(1)])
        with pytest.raises(kvtier.InvalidBuffer, match="keys but"):
            q.submit_put(["k", "l"], [page(1)])
        assert q.pending == 0 and not readable_now(q.event_fd())


def test_signed_byte_buffers_are_read_and_written(tmp):
    """vLLM's KV views have format 'b'."""
    with kvtier.Store({"tiers": tier_configs("nixl-file-path", tmp)}) as store:
        q = store.completion_queue()
        src = memoryview(bytearray(page(5))).cast("b")
        dst = memoryview(bytearray(4096)).cast("b")
        put = q.submit_put(["signed"], [src])
        assert drain_until(q, [put])[put] == [None]
        get = q.submit_get_into(["signed"], [dst])
        assert drain_until(q, [get])[get] == [True]
        assert dst.tobytes() == page(5)


def test_many_threads_submit_while_one_drains(tmp):
    with kvtier.Store({"tiers": tier_configs("mem-over-nixl-file", tmp)}) as store:
        q = store.completion_queue()
        threads, per_thread = 6, 40
        submitted, lock = {}, threading.Lock()
        done = threading.Event()
        completed = {}

        def drainer():
            p = select.poll()
            p.register(q.event_fd(), select.POLLIN)
            while not (done.is_set() and len(completed) == len(submitted)):
                p.poll(100)
                for fid, results in q.drain():
                    assert fid not in completed
                    completed[fid] = results

        def submitter(t):
            for i in range(per_thread):
                key = f"t{t}-{i}"
                fid = q.submit_put([key], [page(t * 1000 + i, 8192)])
                with lock:
                    submitted[fid] = key

        d = threading.Thread(target=drainer)
        d.start()
        workers = [threading.Thread(target=submitter, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        done.set()
        d.join(timeout=60)
        assert not d.is_alive()
        assert completed.keys() == submitted.keys()
        assert all(r == [None] for r in completed.values())
        for t in range(threads):
            for i in range(0, per_thread, 7):
                buf = bytearray(8192)
                assert store.get_into([f"t{t}-{i}"], [buf]) == [True]
                assert bytes(buf) == page(t * 1000 + i, 8192)
        q.close()


def test_a_call_on_storage_that_never_answers_returns_at_once_and_completes_failed(silent_endpoint):
    with kvtier.Store({"tiers": [silent_object_tier(silent_endpoint)]}) as store:
        q = store.completion_queue()
        fid = q.submit_put(["k"], [page(1)])
        # The server never answers (its op_timeout is 3 s): the submit did not wait for it.
        assert q.pending == 1 and not readable_now(q.event_fd()) and q.drain() == []
        (got,) = drain_until(q, [fid]).values()
        assert isinstance(got[0], kvtier.Unavailable), got
        q.close()


def test_close_cancels_calls_still_running_and_none_writes_after_it(silent_endpoint):
    """A read on storage that never answers (its own bound 30 s) still runs when ``close``'s
    timeout passes: ``close`` cancels it and returns; its completion says it was cancelled,
    and its buffer is never written after (LMCache frees or reuses its memory then)."""
    import time

    with kvtier.Store({"tiers": [silent_object_tier(silent_endpoint, timeout="30s")]}) as store:
        q = store.completion_queue()
        buf = bytearray(b"\xaa" * 4096)
        fid = q.submit_get_into(["k"], [buf])
        started = time.monotonic()
        q.close(0.3)
        took = time.monotonic() - started
        assert took < 2.0, f"close took {took:.1f} s"
        (got,) = q.drain()
        assert got[0] == fid and isinstance(got[1][0], kvtier.Unavailable), got
        assert "cancelled" in str(got[1][0])
        time.sleep(0.5)
        assert buf == b"\xaa" * 4096
