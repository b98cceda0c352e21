"""One SGLang rank in its own process, as SGLang runs them: builds kvtier's backend from the
shared config through SGLang's factory and runs steps given on the command line.

    python rank_worker.py RANK TP_SIZE MLA TIERS_JSON SYNC_DIR STEP...

Steps: write:SEED, read:SEED (every byte), present, absent, clear, flush (the store's background
writes landed), barrier:NAME (waits, bounded, until every rank reached it), write_forever:SEED (until
killed). Exits 0 when every step passed."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from conftest import backend, fill_pages, make_pool

N = 8


def keys():
    return [f"{i:064x}" for i in range(N)]


def main():
    rank, tp, mla, tiers, sync = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", json.loads(sys.argv[4]), Path(sys.argv[5])
    pool = make_pool(pages=N + 1)
    b = backend(tiers, pool, tp_rank=rank, tp_size=tp, mla=mla)
    idx = torch.arange(0, N * pool.page_size, dtype=torch.int64)
    for step in sys.argv[6:]:
        op, _, arg = step.partition(":")
        if op == "write":
            fill_pages(pool, 0, N, int(arg))
            assert b.batch_set_v1(keys(), idx) == [True] * N, f"rank {rank}: write failed"
        elif op == "read":
            fill_pages(pool, 0, N, int(arg))
            want = pool.kv_buffer[:, idx].clone()
            pool.kv_buffer[:, idx] = 0
            got = b.batch_get_v1(keys(), idx)
            assert got == [True] * N, f"rank {rank}: read {got}"
            assert torch.equal(pool.kv_buffer[:, idx].view(torch.int16), want.view(torch.int16)), f"rank {rank}: wrong bytes"
        elif op == "present":
            assert b.batch_exists(keys()) == N, f"rank {rank}: its pages are gone"
        elif op == "absent":
            assert b.batch_exists(keys()) == 0, f"rank {rank}: sees pages it should not"
        elif op == "clear":
            b.clear()
        elif op == "flush":
            # Lower tiers are written in the background: other processes see them after this.
            b.store.flush()
        elif op == "barrier":
            (sync / f"{arg}.{rank}").touch()
            deadline = time.monotonic() + 120
            while len(list(sync.glob(f"{arg}.*"))) < tp:
                assert time.monotonic() < deadline, f"rank {rank}: barrier {arg} timed out"
                time.sleep(0.02)
        elif op == "write_forever":
            seed = int(arg)
            while True:
                fill_pages(pool, 0, N, seed)
                b.batch_set_v1(keys(), idx)
        else:
            raise SystemExit(f"unknown step {step}")
    print(f"rank {rank}: ok", flush=True)


if __name__ == "__main__":
    main()
