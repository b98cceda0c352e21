"""One SGLang rank in its own process, as SGLang runs them: builds kvtier's backend from the
shared config through SGLang's factory and runs steps given on the command line.

    python rank_worker.py SPEC_JSON STEP...

SPEC: ``name`` (this rank's label), ``world`` (processes at each barrier), ``sync`` (a folder),
``tiers``, ``mla`` (SGLang's MLA host pool, else MHA) and ``cfg`` (``HiCacheStorageConfig``
fields: tp_rank, tp_size, dp_rank, pp_rank, pp_size, ...).

Steps: write:SEED, read:SEED (every byte), read_any:SEED,SEED... (each page whole, as one of the
seeds wrote it), present, absent, gone (absent within 10 s, as another client of a network
filesystem sees a removal, and never read), clear; each of the first five on the N keys of a key set
given after an ``@`` (``write:SEED@SET``, ``absent:@SET``: a hex prefix; none: the default set), flush (the store's background writes landed),
barrier:NAME (waits, bounded, until every rank reached it), write_forever:SEED (seeds SEED and
SEED+1 in turn, counting each acknowledged write in SYNC/NAME.writes, until killed). On start
it records how long opening the backend took in SYNC/NAME.opened. Exits 0 when every step
passed."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from conftest import backend, make_mla_pool, make_pool

N = 8


def keys(keyset=""):
    """The N keys of a key set (a hex prefix; the default set is ``""``)."""
    return [f"{keyset}{i:0{64 - len(keyset)}x}" for i in range(N)]


class Pages:
    """The first N pages of the host pool, MHA (K and V) or MLA (one latent)."""

    def __init__(self, mla):
        self.mla = mla
        self.pool = make_mla_pool(pages=N + 1) if mla else make_pool(pages=N + 1)
        self.idx = torch.arange(0, N * self.pool.page_size, dtype=torch.int64)

    def get(self):
        return (self.pool.kv_buffer[self.idx] if self.mla else self.pool.kv_buffer[:, self.idx]).clone()

    def set(self, value):
        if self.mla:
            self.pool.kv_buffer[self.idx] = value
        else:
            self.pool.kv_buffer[:, self.idx] = value

    def content(self, seed):
        g = torch.Generator().manual_seed(seed)
        shape = self.get().shape
        return torch.randint(-30000, 30000, shape, generator=g, dtype=torch.int16).view(self.pool.dtype)

    def page(self, data, i):
        """Page i of `data` (a copy of the first N pages)."""
        P = self.pool.page_size
        return data[i * P:(i + 1) * P] if self.mla else data[:, i * P:(i + 1) * P]


def same(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def main():
    spec = json.loads(sys.argv[1])
    name, world, sync = spec["name"], spec["world"], Path(spec["sync"])
    pages = Pages(spec.get("mla", False))
    # What opening imports is loaded first: the time measured is opening, not importing.
    import kvtier.sglang  # noqa: F401
    import sglang.srt.mem_cache.storage.backend_factory  # noqa: F401

    started = time.monotonic()
    b = backend(spec["tiers"], pages.pool, mla=spec.get("mla", False), **spec.get("cfg", {}))
    (sync / f"{name}.opened").write_text(f"{time.monotonic() - started:.3f}")
    for step in sys.argv[2:]:
        op, _, arg = step.partition(":")
        arg, _, keyset = arg.partition("@")
        if op == "write":
            pages.set(pages.content(int(arg)))
            assert b.batch_set_v1(keys(keyset), pages.idx) == [True] * N, f"{name}: write failed"
        elif op in ("read", "read_any"):
            seeds = [int(s) for s in arg.split(",")]
            wants = [pages.content(s) for s in seeds]
            pages.set(0)
            got = b.batch_get_v1(keys(keyset), pages.idx)
            assert got == [True] * N, f"{name}: read {got}"
            data = pages.get()
            for i in range(N):
                matches = [s for s, w in zip(seeds, wants) if same(pages.page(data, i), pages.page(w, i))]
                assert matches, f"{name}: page {i} is none of seeds {seeds} (torn or foreign bytes)"
        elif op == "present":
            assert b.batch_exists(keys(keyset)) == N, f"{name}: its pages are gone"
        elif op == "absent":
            assert b.batch_exists(keys(keyset)) == 0, f"{name}: sees pages it should not"
        elif op == "gone":
            # Removed through another client of a network filesystem: its caches may list the
            # files for a moment (GlusterFS: about a second), never serve them.
            deadline = time.monotonic() + 10
            while b.batch_exists(keys(keyset)) != 0:
                assert time.monotonic() < deadline, f"{name}: removed pages still listed after 10 s"
                time.sleep(0.1)
            assert b.batch_get_v1(keys(keyset), pages.idx) == [False] * N, f"{name}: read removed pages"
        elif op == "clear":
            b.clear()
        elif op == "flush":
            # Lower tiers are written in the background: other processes see them after this.
            b.store.flush()
        elif op == "barrier":
            (sync / f"{arg}.{name}").touch()
            deadline = time.monotonic() + 120
            while len(list(sync.glob(f"{arg}.*"))) < world:
                assert time.monotonic() < deadline, f"{name}: barrier {arg} timed out"
                time.sleep(0.02)
        elif op == "write_forever":
            seed, writes = int(arg), 0
            while True:
                pages.set(pages.content(seed + writes % 2))
                assert b.batch_set_v1(keys(keyset), pages.idx) == [True] * N, f"{name}: write failed"
                writes += 1
                (sync / f"{name}.writes").write_text(str(writes))
        else:
            raise SystemExit(f"unknown step {step}")
    print(f"{name}: ok", flush=True)


if __name__ == "__main__":
    main()
