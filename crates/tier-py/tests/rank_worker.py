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
barrier:NAME (waits, bounded, until every rank reached it), state_write:SEED@SET,
state_read:SEED@SET and state_gone:@SET (with ``mamba`` in SPEC: this rank's Mamba state of the
set's last page, stored, read back byte-exact with the set's KV prefix a hit, or no hit), write_forever:SEED (seeds SEED and
SEED+1 in turn, counting each acknowledged write in SYNC/NAME.writes, until killed). On start
it records how long opening the backend took in SYNC/NAME.opened. Exits 0 when every step
passed."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from conftest import backend, make_mamba_pool, make_mla_pool, make_pool

N = 8
READ_WITHIN = {"prefetch_timeout_base": 60.0, "prefetch_timeout_per_ki_token": 0.0}


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


class States:
    """A hybrid model's Mamba state pool, registered with the backend: one state (row 1) for
    the last page of a key set, as SGLang's hybrid controller stores it."""

    def __init__(self, b):
        from sglang.srt.mem_cache.hicache_storage import PoolName

        self.b, self.pool = b, make_mamba_pool()
        b.register_mem_host_pool_v2(self.pool, PoolName.MAMBA)

    def transfer(self, keyset):
        from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

        return PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([1]), keys=keys(keyset)[-1:],
                            hit_policy=PoolHitPolicy.TRAILING_PAGES)

    def content(self, seed):
        g = torch.Generator().manual_seed(seed)
        flat = self.pool.get_dummy_flat_data_page()
        return torch.randint(0, 256, flat.view(torch.uint8).shape, generator=g, dtype=torch.uint8)

    def write(self, seed, keyset):
        self.pool.set_from_flat_data_page(1, self.content(seed).view(self.pool.get_dummy_flat_data_page().dtype))
        got = self.b.batch_set_v2([self.transfer(keyset)])
        assert list(got.values()) == [[True]], f"state write {got}"

    def read(self, seed, keyset):
        t = self.transfer(keyset)
        hits = self.b.batch_exists_v2(keys(keyset), [t]).kv_hit_pages
        assert hits == N, f"{hits} of {N} pages a hit with the state"
        self.pool.set_from_flat_data_page(1, self.pool.get_dummy_flat_data_page())
        got = self.b.batch_get_v2([t])
        assert list(got.values()) == [[True]], f"state read {got}"
        data = self.pool.get_data_page(1, flat=True).view(torch.uint8)
        assert torch.equal(data, self.content(seed)), "the state read back is not the one stored"

    def gone(self, keyset):
        hits = self.b.batch_exists_v2(keys(keyset), [self.transfer(keyset)]).kv_hit_pages
        assert hits == 0, f"{hits} pages a hit without the state"


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
    # SGLang answers a read that outlasts its prefetch timeout (1 s and a bit) as a miss; these
    # ranks check what is shared, not how fast four of them read a network filesystem on a
    # loaded machine (test_health checks the timeout).
    b = backend(spec["tiers"], pages.pool, extra=READ_WITHIN, mla=spec.get("mla", False), **spec.get("cfg", {}))
    (sync / f"{name}.opened").write_text(f"{time.monotonic() - started:.3f}")
    states = States(b) if spec.get("mamba") else None
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
        elif op.startswith("state_"):
            assert states is not None, f"{name}: {step} needs mamba in the spec"
            if op == "state_write":
                states.write(int(arg), keyset)
            elif op == "state_read":
                states.read(int(arg), keyset)
            else:
                states.gone(keyset)
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
