"""Several SGLang ranks in separate processes on one config (one folder, one bucket), as
SGLang's one-process-per-rank launch runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import tier_configs

HERE = Path(__file__).resolve().parent


def start(rank, tp, mla, tiers, sync, *steps):
    return subprocess.Popen(
        [sys.executable, str(HERE / "rank_worker.py"), str(rank), str(tp), "1" if mla else "0",
         json.dumps(tiers), str(sync), *steps],
        cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def finish(procs):
    # Every rank's output on a failure: the first rank to fail explains the others' timeouts.
    outs = [p.communicate(timeout=300)[0] for p in procs]
    failed = [(rank, p.returncode, out) for rank, (p, out) in enumerate(zip(procs, outs)) if p.returncode != 0]
    assert not failed, "\n".join(f"rank {rank} failed ({code}):\n{out[-2000:]}" for rank, code, out in failed)


@pytest.mark.parametrize("kind", ["nixl-file-path", "object"])
def test_tp_ranks_keep_private_pages_and_clear_only_their_own(kind, tmp, s3):
    tiers = tier_configs(kind, tmp, s3)
    sync = tmp / "sync"
    sync.mkdir()
    # Both ranks store the same page keys (SGLang's hashes are rank-independent), each its own
    # shard; each reads back its own; rank 1 clears; rank 0's pages stay.
    r0 = start(0, 2, False, tiers, sync, "write:100", "barrier:written", "read:100",
               "barrier:cleared", "read:100")
    r1 = start(1, 2, False, tiers, sync, "write:101", "barrier:written", "read:101", "clear",
               "absent", "barrier:cleared")
    finish([r0, r1])


def test_mla_rank0_writes_every_rank_reads(tmp):
    tiers = [{"kind": "mem", "capacity": "64MiB"}] + tier_configs("nixl-file-path", tmp)
    sync = tmp / "sync"
    sync.mkdir()
    # The writer's DRAM tier copies pages to the files in the background: it flushes before
    # telling the readers (without it a reader raced the copy and missed, once in CI).
    procs = [start(0, 3, True, tiers, sync, "barrier:open", "write:7", "flush", "barrier:written",
                   "barrier:cleared", "read:7")]
    for rank in (1, 2):
        # Readers open before the writer writes, and see its pages as they appear.
        procs.append(start(rank, 3, True, tiers, sync, "absent", "barrier:open", "barrier:written",
                           "read:7", "clear", "barrier:cleared", "read:7"))
    finish(procs)


def test_a_crashed_rank_harms_no_other(tmp):
    tiers = tier_configs("nixl-file-path", tmp)
    sync = tmp / "sync"
    sync.mkdir()
    r0 = start(0, 2, False, tiers, sync, "write:200", "barrier:a", "barrier:b", "read:200")
    r1 = start(1, 2, False, tiers, sync, "write:201", "barrier:a", "write_forever:202")
    deadline = time.monotonic() + 120
    while not (sync / "a.1").exists():
        assert time.monotonic() < deadline and r1.poll() is None, "rank 1 never got going"
        time.sleep(0.02)
    time.sleep(0.5)
    r1.send_signal(signal.SIGKILL)
    r1.wait(timeout=30)
    (sync / "b.1").touch()  # stands in for the dead rank at the barrier
    finish([r0])
    # The restarted rank 1 finds its pages (of one of its writes) and its temp files are gone.
    r1 = start(1, 2, False, tiers, sync, "present", "barrier:c")
    (sync / "c.0").touch()
    finish([r1])
    leftovers = [f for _, _, fs in os.walk(tmp / "disk") for f in fs if f.startswith(".tmp-")]
    assert not leftovers, leftovers
