"""Every number the Python API takes, over its whole range (NaN, infinities, negatives, values
past 64 bits): an answer or a clear exception (``ValueError``, ``OverflowError``,
``TypeError`` or kvtier's own), never a Rust panic (``PanicException``), a hang or a crash."""

from __future__ import annotations

import kvtier
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**80), 2**80)
ANY_INT = st.integers(-(2**80), 2**80)
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
ALLOWED = (ValueError, OverflowError, TypeError, kvtier.KvtierError)


@pytest.fixture(scope="module")
def store():
    with kvtier.Store({"tiers": [{"kind": "mem", "capacity": "4MiB"}]}) as s:
        s.put(["k"], [b"x" * 64])
        yield s


def answered(call):
    """Runs ``call``: its result, or the exception if it is one of the allowed kinds."""
    try:
        return call()
    except ALLOWED as e:
        return e
    except BaseException as e:  # a PanicException derives from BaseException
        raise AssertionError(f"{type(e).__name__}: {e}") from e


def bounded(timeout):
    """A timeout the tests can wait out: the huge and odd ones are for the paths that refuse or
    answer at once, so finite positive ones above a second are clipped."""
    return timeout if not isinstance(timeout, float) or not 1.0 < timeout < float("inf") else 1.0


@SETTINGS
@given(timeout=ANY_FLOAT)
def test_every_timeout_of_the_data_calls(store, timeout):
    t = bounded(timeout)
    answered(lambda: store.put(["k"], [b"x" * 64], timeout=t))
    answered(lambda: store.get_into(["k"], [bytearray(64)], timeout=t))
    answered(lambda: store.exists(["k"], timeout=t))
    answered(lambda: store.put_regions(["k"], [], [], timeout=t))


@SETTINGS
@given(timeout=ANY_FLOAT)
def test_every_timeout_of_the_completion_queue(store, timeout):
    q = store.completion_queue()
    t = bounded(timeout)
    answered(lambda: q.submit_put(["k"], [b"x" * 64], timeout=t))
    answered(lambda: q.submit_get_into(["k"], [bytearray(64)], timeout=t))
    answered(lambda: q.submit_exists(["k"], timeout=t))
    # close waits at most its timeout for running calls; every call above is over by then.
    answered(lambda: q.close(timeout))
    q.drain()


@SETTINGS
@given(max_pending=ANY_INT)
def test_every_queue_depth(store, max_pending):
    q = answered(lambda: store.completion_queue(max_pending))
    if isinstance(q, kvtier.CompletionQueue):
        q.close()


@SETTINGS
@given(pages=ANY_INT, page_bytes=ANY_INT)
def test_every_estimate(store, pages, page_bytes):
    answered(lambda: store.estimate(pages, page_bytes))


@SETTINGS
@given(address=ANY_INT, length=ANY_INT)
def test_every_region_number_that_cannot_be_memory(store, address, length):
    # Raw regions are memory the caller vouches for: only numbers that cannot be memory (no
    # address with a length, wrapping, negative, past 64 bits) are given, and each is refused.
    cannot = address == 0 and length > 0 or address < 0 or length < 0 or address + length >= 2**64
    if not cannot:
        return
    got = answered(lambda: store.put_regions(["k"], [address], [length]))
    assert isinstance(got, BaseException) or isinstance(got[0], BaseException), got
    got = answered(lambda: store.get_into_regions(["k"], [address], [length]))
    assert isinstance(got, BaseException) or isinstance(got[0], BaseException), got
