"""A process that forks after using kvtier (``multiprocessing``'s default start method on Linux):
a store opened in the child works; a store carried across the fork fails at once with an error
naming fork. Each run is a real process under a bound: a hang fails the test."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

# Every child must have finished long before this (each took about a second with spawn).
BOUND = 120


def run(code: str) -> str:
    try:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=HERE, capture_output=True,
                             text=True, timeout=BOUND)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"a forked child hung for {BOUND} s: {e.stdout!r} {e.stderr!r}")
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


# Pages big enough that a batch is split over the helper threads (a 4-page batch of 1 MiB).
SETUP = """
import multiprocessing as mp
import kvtier

PAGE = 1 << 20
KEYS = [f"{i:064x}" for i in range(4)]
PAGES = [bytes([i + 1]) * PAGE for i in range(4)]


def config(kind, folder):
    if kind == "mem":
        return {"tiers": [{"kind": "mem", "capacity": "64MiB"}]}
    tier = {"kind": "nixl-file", "dirs": [folder], "capacity": "256MiB"}
    if kind == "syscalls":
        tier["engine"] = "syscalls"
    return {"tiers": [tier]}
"""


@pytest.mark.parametrize("kind", ["mem", "nixl-file", "syscalls"])
def test_a_store_opened_in_forked_workers_works(tmp_path, kind):
    """The parent opens a store, puts, reads and closes it, then forks 4 workers; each opens its
    own store on the same folder and reads the parent's pages (a DRAM store: puts its own)."""
    out = run(SETUP + f"""
FOLDER = "{tmp_path / 'disk'}"


def worker(n, results):
    with kvtier.Store(config("{kind}", FOLDER)) as store:
        if "{kind}" == "mem":
            assert store.put(KEYS, PAGES) == [None] * 4
        bufs = [bytearray(PAGE) for _ in KEYS]
        found = store.get_into(KEYS, bufs)
        results.put((n, found == [True] * 4 and bufs == [bytearray(p) for p in PAGES]))


if __name__ == "__main__":
    with kvtier.Store(config("{kind}", FOLDER)) as store:
        assert store.put(KEYS, PAGES) == [None] * 4
        bufs = [bytearray(PAGE) for _ in KEYS]
        assert store.get_into(KEYS, bufs) == [True] * 4
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    workers = [ctx.Process(target=worker, args=(n, results)) for n in range(4)]
    for w in workers:
        w.start()
    got = sorted(results.get(timeout={BOUND // 2}) for _ in workers)
    for w in workers:
        w.join({BOUND // 4})
        assert w.exitcode == 0, w.exitcode
    print(got)
""")
    assert out.strip() == str([(n, True) for n in range(4)])


@pytest.mark.parametrize("kind", ["mem", "nixl-file"])
def test_a_store_carried_across_a_fork_fails_at_once_naming_fork(tmp_path, kind):
    """A child calling the parent's open store gets a kvtier error naming fork and the remedy
    for every call, at once; closing and dropping it there lets go without waiting; the
    child's own store works, and so does the parent's."""
    out = run(SETUP + f"""
import os
import time

if __name__ == "__main__":
    store = kvtier.Store(config("{kind}", "{tmp_path / 'disk'}"))
    assert store.put(KEYS, PAGES) == [None] * 4
    pid = os.fork()
    if pid == 0:
        code = 0
        started = time.monotonic()
        for call in (lambda: store.get_into(KEYS, [bytearray(PAGE) for _ in KEYS]),
                     lambda: store.put(KEYS, PAGES), lambda: store.exists(KEYS),
                     lambda: store.stats()):
            try:
                call()
                print("a call on the parent's store answered in the child")
                code = 1
            except kvtier.Unavailable as e:
                if "fork" not in str(e) or "open a new" not in str(e):
                    print("unclear error:", e)
                    code = 1
        if time.monotonic() - started > 5:
            print("the calls took", time.monotonic() - started)
            code = 1
        store.close()  # lets go of it in the child: the parent's process owns it
        if time.monotonic() - started > 5:
            print("the close took", time.monotonic() - started)
            code = 1
        del store
        # The child's own store works.
        with kvtier.Store(config("{kind}", "{tmp_path / 'child'}")) as own:
            if own.put(KEYS[:1], PAGES[:1]) != [None]:
                code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status
    bufs = [bytearray(PAGE) for _ in KEYS]
    assert store.get_into(KEYS, bufs) == [True] * 4, "the parent's store still works"
    store.close()
    print("ok")
""")
    assert out.strip().endswith("ok"), out
