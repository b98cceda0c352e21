"""kvtier as SGLang's HiCache L3 backend, on SGLang's own classes (no stand-ins): its ABC, its
storage config, its backend factory and its MHA host pool on CPU."""

from __future__ import annotations

import gc
import os
import threading
import time

import pytest
import torch

from conftest import KINDS, backend, fill_pages, make_mamba_pool, make_mla_pool, make_pool, tier_configs

import kvtier
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage


def same(a, b):
    """Bitwise equality (random bits include NaNs, which never compare equal)."""
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def hexkeys(prefix, n):
    return [f"{prefix}{i:060x}" for i in range(n)]


def fill_mla(pool, n, seed):
    """Distinct content in the first `n` pages of an MLA host pool; their indices and a copy."""
    idx = torch.arange(0, n * pool.page_size, dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    pool.kv_buffer[idx] = torch.randint(-30000, 30000, pool.kv_buffer[idx].shape, generator=g,
                                        dtype=torch.int16).view(pool.dtype)
    return idx, pool.kv_buffer[idx].clone()


def roundtrip(b, pool, n=8, seed=1, first=0):
    idx = fill_pages(pool, first, n, seed)
    want = pool.kv_buffer[:, idx].clone()
    keys = hexkeys(f"{seed:04x}", n)
    assert b.batch_set_v1(keys, idx) == [True] * n
    pool.kv_buffer[:, idx] = 0
    assert b.batch_exists(keys) == n
    assert b.batch_get_v1(keys, idx) == [True] * n
    assert same(pool.kv_buffer[:, idx], want), "pages differ after the round trip"
    return keys, idx, want


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_every_byte(kind, tmp, s3):
    pool = make_pool()
    b = backend(tier_configs(kind, tmp, s3), pool)
    assert isinstance(b, HiCacheStorage)
    assert b.zero_copy, "page_first must take the zero-copy path"
    # Three batches of distinct pages; the last fills the pool, the small DRAM top evicts.
    batches = [roundtrip(b, pool, n=16, seed=batch + 1, first=batch * 16) for batch in range(3)]
    if kind == "mem-over-nixl-file":
        # The first batch has left the DRAM top (16 pages of 16 KiB under 256 KiB with 48
        # stored): the lower tier serves it.
        b.store.flush()
        keys, idx, want = batches[0]
        pool.kv_buffer[:, idx] = 0
        before = b.kvtier_stats()["levels"][1]["served"]
        assert b.batch_get_v1(keys, idx) == [True] * 16
        assert same(pool.kv_buffer[:, idx], want), "pages differ when served from the lower tier"
        assert b.kvtier_stats()["levels"][1]["served"] - before >= 8, "the lower tier served nothing"


def test_zero_copy_counts(tmp):
    """Pages go straight from SGLang's pool to NIXL FILE and back: no byte copied."""
    pool = make_pool(pages=32)
    b = backend(tier_configs("nixl-file-path", tmp), pool)
    before = b.kvtier_stats()
    roundtrip(b, pool, n=16)
    after = b.kvtier_stats()
    assert after["process_lent_bytes_copied"] == before["process_lent_bytes_copied"]
    assert after["process_bytes_copied_to_callers"] == before["process_bytes_copied_to_callers"]
    # DRAM keeps a copy of each page it stores: exactly the page bytes, once.
    m = backend(tier_configs("mem", tmp), pool)
    before = m.kvtier_stats()["process_lent_bytes_copied"]
    idx = fill_pages(pool, 0, 4, 9)
    assert m.batch_set_v1(hexkeys("cc", 4), idx) == [True] * 4
    page_bytes = pool.get_size_per_token() * pool.page_size
    assert m.kvtier_stats()["process_lent_bytes_copied"] - before == 4 * page_bytes


def test_one_page_holds_both_regions(tmp):
    """An MHA page (K and V regions) is one stored page: one file per page."""
    pool = make_pool(pages=16)
    b = backend(tier_configs("nixl-file-path", tmp), pool)
    roundtrip(b, pool, n=8)
    files = [f for _, _, fs in os.walk(tmp / "disk") for f in fs if not f.startswith(".")]
    assert len(files) == 8, files


def test_batch_exists_stops_at_gap(tmp):
    pool = make_pool(pages=16)
    b = backend(tier_configs("mem", tmp), pool)
    keys, idx, _ = roundtrip(b, pool, n=6)
    assert b.batch_exists(keys[:3] + ["f" * 64] + keys[3:]) == 3
    assert b.exists(keys[0]) and not b.exists("e" * 64)


# Namespaces a page written under the first must be a miss under: the second backend differs
# from the first in one thing only. Pages of the same byte size in every variant but the TP
# rank's (so a shared name would be a hit with wrong bytes, not a size error).
NAMESPACES = {
    "model": {"cfg": {"model": "another-model"}},
    "dtype": {"pool": {"dtype": torch.bfloat16}},
    "page geometry": {"pool": {"page": 32, "heads": 1}},
    "layout": {"pool": {"layout": "layer_first"}},
    "tp rank": {"cfg": {"tp_rank": 1, "tp_size": 2}},
    "pp stage": {"cfg": {"pp_rank": 1, "pp_size": 2}},
    "attention cp rank": {"cfg": {"attn_cp_rank": 1, "attn_cp_size": 2}},
    "tenant": {"extra": {"tenant": "another-tenant"}},
    "model revision": {"extra": {"model_revision": "another-revision"}},
}


@pytest.mark.parametrize("kind", ["nixl-file-path", "object"])
@pytest.mark.parametrize("variant", NAMESPACES)
def test_a_page_is_a_miss_under_every_other_namespace(variant, kind, tmp, s3):
    """One folder (or bucket prefix) in the config; a page written under one model, dtype,
    geometry, layout or rank is a miss under another, never a hit with wrong bytes."""
    tiers = tier_configs(kind, tmp, s3)
    pool = make_pool(pages=16)
    first = backend(tiers, pool)
    keys, _, _ = roundtrip(first, pool, n=4)
    del first
    gc.collect()  # one process owns a folder at a time: the first backend lets go of it
    other_pool = make_pool(pages=16, **NAMESPACES[variant].get("pool", {}))
    assert other_pool.get_size_per_token() * other_pool.page_size == pool.get_size_per_token() * pool.page_size
    other = backend(
        tiers, other_pool, NAMESPACES[variant].get("extra"), **NAMESPACES[variant].get("cfg", {})
    )
    idx = torch.arange(0, 4 * other_pool.page_size, dtype=torch.int64)
    assert other.batch_exists(keys) == 0, f"another {variant} sees the pages"
    assert other.batch_get_v1(keys, idx) == [False] * 4, f"another {variant} reads the pages"
    del other
    gc.collect()
    again = backend(tiers, make_pool(pages=16))
    assert again.batch_exists(keys) == 4, "the pages are gone: the check above proved nothing"


@pytest.mark.parametrize("mla", [False, True])
def test_dp_groups_share_one_copy_unless_their_folders_are_owned(mla, tmp):
    """DP attention: a rank's pages are the same in every DP group (MLA pages on every rank,
    MHA pages on the same attention TP rank), so a page one group stored is a hit in another,
    from one copy on disk. With ``access = "owner"`` named, each group's writer owns folders of
    its own: there the other group's pages are a miss."""
    make = make_mla_pool if mla else make_pool
    for access, shared in ((None, True), ("owner", False)):
        tiers = tier_configs("nixl-file-path", tmp / f"{access}")
        if access:
            tiers[0]["access"] = access
        pool = make(pages=16)
        first = backend(tiers, pool, dp_rank=0, tp_rank=0, tp_size=2, mla=mla)
        if mla:
            idx, want = fill_mla(pool, 4, 3)
        else:
            idx = fill_pages(pool, 0, 4, 3)
            want = pool.kv_buffer[:, idx].clone()
        keys = hexkeys("dd", 4)
        assert first.batch_set_v1(keys, idx) == [True] * 4
        other_pool = make(pages=16)
        other = backend(tiers, other_pool, dp_rank=1, tp_rank=0, tp_size=2, mla=mla)
        if not shared:
            assert other.batch_exists(keys) == 0, "an owned group's folder is another group's"
            continue
        assert other.batch_exists(keys) == 4, "DP group 1 misses group 0's pages"
        assert other.batch_get_v1(keys, idx) == [True] * 4
        got = other_pool.kv_buffer[idx] if mla else other_pool.kv_buffer[:, idx]
        assert same(got, want), "group 1 read other bytes than group 0 stored"
        files = [f for _, _, fs in os.walk(tmp / f"{access}" / "disk") for f in fs if not f.startswith(".")]
        assert len(files) == 4, f"one copy of each page, not {len(files)} files"
        first.close()
        other.close()


def fill_side(pool, rows, seed):
    """Distinct bytes in the given page rows of a side pool; their flat pages."""
    g = torch.Generator().manual_seed(seed)
    for row in rows:
        flat = pool.get_dummy_flat_data_page()
        flat.copy_(torch.randint(0, 256, flat.shape, generator=g, dtype=torch.uint8).view(flat.dtype))
        pool.set_from_flat_data_page(row, flat)
    return [pool.get_data_page(row, flat=True).clone() for row in rows]


def side_bytes(pool, rows):
    return [pool.get_data_page(row, flat=True).view(torch.uint8).clone() for row in rows]


@pytest.mark.parametrize("zero_copy", [True, False])
@pytest.mark.parametrize("kind", ["nixl-file-path", "object"])
def test_hybrid_models_side_pools_round_trip_and_gate_the_prefix(kind, zero_copy, tmp, s3):
    """A hybrid model (KV pages plus Mamba states and SWA pages), through SGLang's v2 storage
    calls as its hybrid controller makes them, on SGLang's own host pools: the side pools'
    pages are stored beside the KV pages and read back byte-exact; ``batch_exists_v2`` answers
    the longest prefix whose trailing state pages (TRAILING_PAGES) or every page (ALL_PAGES)
    are present, and the prefix lengths a state restores. (Without v2, SGLang's hybrid
    controller logs a traceback per request and gets no L3 at all.)"""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    pool = make_pool(pages=16)
    b = backend(tier_configs(kind, tmp, s3), pool)
    mamba, swa = make_mamba_pool(), make_pool(pages=16)
    if not zero_copy:
        def cannot(indices):
            raise NotImplementedError("no zero-copy metadata")

        mamba.get_page_buffer_meta = cannot
    b.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    b.register_mem_host_pool_v2(swa, PoolName.SWA)
    keys = hexkeys("ab", 6)
    idx = fill_pages(pool, 0, 6, 41)
    assert b.batch_set_v1(keys, idx) == [True] * 6
    # The state of the prefix's last page (slot 3) and the SWA window of its last two pages.
    m_rows = [3]
    want_m = fill_side(mamba, m_rows, 42)
    s_idx = fill_pages(swa, 4, 2, 43)
    want_s = swa.kv_buffer[:, s_idx].clone()
    transfers = [
        PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor(m_rows), keys=keys[5:],
                     hit_policy=PoolHitPolicy.TRAILING_PAGES),
        PoolTransfer(name=PoolName.SWA, host_indices=s_idx, keys=keys[4:],
                     hit_policy=PoolHitPolicy.TRAILING_PAGES),
    ]
    assert b.batch_set_v2(transfers) == {PoolName.MAMBA: [True], PoolName.SWA: [True, True]}

    hit = b.batch_exists_v2(keys + hexkeys("ff", 2), transfers)
    assert hit.kv_hit_pages == 6, hit
    assert hit.extra_pool_hit_pages == {"kv": 6, PoolName.MAMBA: 6, PoolName.SWA: 6}, hit
    assert hit.restorable_prefix_pages == [6], hit
    # A state pool whose pages are missing leaves nothing restorable; an ALL_PAGES pool cuts
    # the prefix at its first missing page.
    missing = PoolTransfer(name=PoolName.MAMBA, keys=hexkeys("ee", 1), hit_policy=PoolHitPolicy.TRAILING_PAGES)
    assert b.batch_exists_v2(hexkeys("ee", 1), [missing]).kv_hit_pages == 0
    every = PoolTransfer(name=PoolName.SWA, keys=keys, hit_policy=PoolHitPolicy.ALL_PAGES)
    assert b.batch_exists_v2(keys, [every]).kv_hit_pages == 0, "SWA page 0 was never stored"
    head = PoolTransfer(name=PoolName.SWA, host_indices=fill_pages(swa, 8, 3, 44), keys=keys[:3])
    assert b.batch_set_v2([head]) == {PoolName.SWA: [True] * 3}
    assert b.batch_exists_v2(keys, [every]).kv_hit_pages == 3, "SWA page 3 was never stored"

    for row in m_rows:
        mamba.set_from_flat_data_page(row, mamba.get_dummy_flat_data_page())
    swa.kv_buffer[:, s_idx] = 0
    assert b.batch_get_v2(transfers) == {PoolName.MAMBA: [True], PoolName.SWA: [True, True]}
    got = [mamba.get_data_page(row, flat=True) for row in m_rows]
    assert all(torch.equal(g.view(torch.uint8), w.view(torch.uint8)) for g, w in zip(got, want_m)), \
        "Mamba state differs after the round trip"
    assert same(swa.kv_buffer[:, s_idx], want_s), "SWA pages differ after the round trip"
    # Indices that do not cover a transfer's pages move nothing (as SGLang's own backends).
    short = PoolTransfer(name=PoolName.SWA, host_indices=s_idx[:3], keys=keys[4:])
    assert b.batch_get_v2([short]) == {PoolName.SWA: [False, False]}
    assert b.side_pools["mamba"].mover.zero_copy is zero_copy
    b.close()


def test_two_side_pools_under_one_key_never_read_each_others_pages(tmp):
    """Side pools are namespaced by pool: a page the Mamba pool stored under a key is no page of
    the draft pool's under it. (Ranks' own Mamba shards under MLA: ``test_ranks.py``, each rank
    a process.)"""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    tiers = tier_configs("nixl-file-path", tmp)
    kv = make_mla_pool(pages=16)
    r0 = backend(tiers, kv, tp_rank=0, tp_size=2, mla=True)
    states = make_mamba_pool()
    r0.register_mem_host_pool_v2(states, PoolName.MAMBA)
    r0.register_mem_host_pool_v2(make_mamba_pool(), PoolName.DRAFT)
    keys = hexkeys("cd", 2)
    idx, _ = fill_mla(kv, 2, 7)
    assert r0.batch_set_v1(keys, idx) == [True] * 2
    rows = torch.tensor([1])
    fill_side(states, [1], 8)
    t = PoolTransfer(name=PoolName.MAMBA, host_indices=rows, keys=keys[1:], hit_policy=PoolHitPolicy.TRAILING_PAGES)
    assert r0.batch_set_v2([t]) == {PoolName.MAMBA: [True]}
    assert r0.batch_exists_v2(keys, [t]).kv_hit_pages == 2
    draft = PoolTransfer(name=PoolName.DRAFT, host_indices=rows, keys=keys[1:], hit_policy=PoolHitPolicy.TRAILING_PAGES)
    assert r0.batch_exists_v2(keys, [draft]).kv_hit_pages == 0, "another pool's page under the key"
    r0.close()


def test_instances_of_different_tp_sizes_share_pages_by_head_group(tmp):
    """SGLang's ``tp_lcm_size`` (MHA, ``page_head`` pools): a TP-1 instance (4 heads per rank)
    and a TP-2 instance (2 heads per rank) with ``tp_lcm_size = 2`` store pages split into the
    two head groups, so each TP-2 rank reads its heads of the pages the TP-1 instance stored,
    byte-exact, and the TP-1 instance reads whole pages the TP-2 ranks stored."""
    def fill(pool, seed):
        """Random bytes in pages 0-3 of a page_head pool (indexed by page); their token indices."""
        g = torch.Generator().manual_seed(seed)
        shape = pool.kv_buffer[:, pages].shape
        pool.kv_buffer[:, pages] = torch.randint(-30000, 30000, shape, generator=g, dtype=torch.int16).view(pool.dtype)
        return torch.arange(0, 4 * pool.page_size, dtype=torch.int64)

    pages = torch.arange(0, 4)
    tiers = tier_configs("nixl-file-path", tmp)
    lcm = {"tp_lcm_size": 2}
    whole = make_pool(pages=16, heads=4, layout="page_head")
    tp1 = backend(tiers, whole, tp_rank=0, tp_size=1, should_split_heads=True, **lcm)
    halves = [make_pool(pages=16, heads=2, layout="page_head") for _ in range(2)]
    tp2 = [backend(tiers, halves[r], tp_rank=r, tp_size=2, **lcm) for r in range(2)]

    keys = hexkeys("a1", 4)
    idx = fill(whole, 51)
    want = whole.kv_buffer[:, pages].clone()  # [K/V, page, head, token, layer, dim]
    assert tp1.batch_set_v1(keys, idx) == [True] * 4
    for r, b in enumerate(tp2):
        assert b.batch_exists(keys) == 4, f"TP-2 rank {r} misses the TP-1 pages"
        assert b.batch_get_v1(keys, idx) == [True] * 4
        assert same(halves[r].kv_buffer[:, pages], want[:, :, 2 * r:2 * r + 2]), f"rank {r}: other heads"

    # The other way: the TP-2 ranks store, the TP-1 instance reads whole pages.
    others = hexkeys("b2", 4)
    for r, b in enumerate(tp2):
        fill(halves[r], 60 + r)
        assert b.batch_set_v1(others, idx) == [True] * 4
    whole.kv_buffer[:, pages] = 0
    assert tp1.batch_exists(others) == 4
    assert tp1.batch_get_v1(others, idx) == [True] * 4
    for r in range(2):
        assert same(whole.kv_buffer[:, pages, 2 * r:2 * r + 2], halves[r].kv_buffer[:, pages]), f"heads of rank {r}"
    # A page one rank has not stored yet is no hit for the TP-1 instance.
    assert tp2[0].batch_set_v1(hexkeys("c3", 1), idx[: whole.page_size]) == [True]
    assert tp1.batch_exists(hexkeys("c3", 1)) == 0, "half a page counted as a hit"
    assert len(tp1.head_groups) == 2 and all(len(b.head_groups) == 1 for b in tp2)
    for b in (tp1, *tp2):
        b.close()


def test_head_groups_gate_batch_exists_v2_as_they_gate_batch_exists(tmp):
    """With ``tp_lcm_size`` a page is stored as head groups: ``batch_exists_v2`` (a hybrid
    model) must ask for them, as ``batch_exists`` does, not for the whole page's name (which
    is never stored: every page a miss)."""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    pool = make_pool(pages=16, heads=4, layout="page_head")
    b = backend(tier_configs("nixl-file-path", tmp), pool, tp_rank=0, tp_size=1,
                should_split_heads=True, tp_lcm_size=2)
    mamba = make_mamba_pool()
    b.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    keys = hexkeys("d4", 3)
    idx = torch.arange(0, 3 * pool.page_size, dtype=torch.int64)
    assert b.batch_set_v1(keys, idx) == [True] * 3
    state = PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([2]), keys=keys[2:],
                         hit_policy=PoolHitPolicy.TRAILING_PAGES)
    assert b.batch_set_v2([state]) == {PoolName.MAMBA: [True]}
    assert len(b.head_groups) == 2 and b.batch_exists(keys) == 3
    hit = b.batch_exists_v2(keys + hexkeys("d5", 1), [state])
    assert hit.kv_hit_pages == 3 and hit.restorable_prefix_pages == [3], hit
    b.close()


def test_a_reader_ranks_shard_store_has_folders_of_its_own_and_no_dram_tier(tmp):
    """An MLA reader rank's Mamba shards (``shard_store``, see test_ranks.py for the ranks in
    processes) go to folders of its own, which it owns, under the configured ones, without the
    config's DRAM tiers: the rank's main store holds its one DRAM budget."""
    tiers = [{"kind": "mem", "capacity": "1MiB"}, {**tier_configs("nixl-file-path", tmp)[0], "access": "owner"}]
    r1 = backend(tiers, make_mla_pool(pages=4), tp_rank=1, tp_size=2, mla=True)
    main, shards = r1._rank_config(r1._config), r1._rank_config(r1._config, shards=True)
    assert [t["kind"] for t in main["tiers"]] == ["mem", "nixl-file"]
    assert main["tiers"][1]["access"] == "reader"
    assert [t["kind"] for t in shards["tiers"]] == ["nixl-file"], "the shard store keeps a DRAM budget of its own"
    assert shards["tiers"][0]["access"] == "owner"
    assert shards["tiers"][0]["dirs"] != main["tiers"][1]["dirs"]
    r1.close()


def test_fp8_formats_never_read_each_others_pages(tmp, monkeypatch):
    """SGLang's host pool holds every fp8 KV format as ``uint8``: the pages are named by the KV
    cache dtype the server runs with (``--kv-cache-dtype``, from SGLang's server args, or
    ``extra_config["kv_cache_dtype"]``), so an e5m2 deployment never takes an e4m3 one's pages
    as hits. (The server args are SGLang's own ``ServerArgs``; publishing them for real would
    load the model's config from the Hub.)"""
    import contextlib

    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    tiers = tier_configs("nixl-file-path", tmp)

    @contextlib.contextmanager
    def serving(kv_cache_dtype):
        args = ServerArgs(model_path="test-model", kv_cache_dtype=kv_cache_dtype)
        with monkeypatch.context() as m:
            m.setattr(runtime_context, "get_server_args", lambda: args)
            yield

    pool = make_pool(pages=16, dtype=torch.uint8)
    idx = torch.arange(0, 4 * pool.page_size, dtype=torch.int64)
    pool.kv_buffer[:, idx] = torch.randint(0, 255, pool.kv_buffer[:, idx].shape, dtype=torch.uint8)
    want = pool.kv_buffer[:, idx].clone()
    keys = hexkeys("f8", 4)
    with serving("fp8_e4m3"):
        first = backend(tiers, pool)
        assert first.batch_set_v1(keys, idx) == [True] * 4
        first.close()
    with serving("fp8_e5m2"):
        other = backend(tiers, make_pool(pages=16, dtype=torch.uint8))
        assert other.batch_exists(keys) == 0, "an e5m2 server sees the e4m3 pages"
        other.close()
    pool.kv_buffer[:, idx] = 0
    again = backend(tiers, pool, {"kv_cache_dtype": "fp8_e4m3"})
    assert again.batch_get_v1(keys, idx) == [True] * 4, "the e4m3 pages are gone: the check proved nothing"
    assert torch.equal(pool.kv_buffer[:, idx], want)
    again.close()


def test_without_the_integrity_secret_no_one_names_probes_or_plants_a_tenants_pages(tmp, monkeypatch):
    """A shared folder with `integrity` on its tier: the namespace is keyed by the secret, so a
    backend holding another secret (or none) neither sees the pages nor can write them under
    the names the fleet reads; the fleet's own backends do see them."""
    monkeypatch.setenv("KVTIER_TEST_TENANT_SECRET", "the fleet's secret, 32 bytes long")
    monkeypatch.setenv("KVTIER_TEST_OTHER_SECRET", "another tenant's secret, long too")
    folder = str(tmp / "shared")
    sealed = [{"kind": "nixl-file", "dirs": [folder], "access": "shared",
               "integrity": {"key_env": "KVTIER_TEST_TENANT_SECRET"}}]
    other = [{**sealed[0], "integrity": {"key_env": "KVTIER_TEST_OTHER_SECRET"}}]
    plain = [{"kind": "nixl-file", "dirs": [folder], "access": "shared"}]
    pool = make_pool(pages=16)
    fleet = backend(sealed, pool)
    keys, _, _ = roundtrip(fleet, pool, n=4)
    idx = torch.arange(0, 4 * pool.page_size, dtype=torch.int64)
    for tiers in (other, plain):
        outsider = backend(tiers, make_pool(pages=16))
        assert outsider.batch_exists(keys) == 0, "an outsider probes the tenant's pages"
        assert outsider.batch_get_v1(keys, idx) == [False] * 4
        # The outsider writes under the keys; the fleet still finds only its own pages.
        fill_pages(outsider.mem_pool_host, 0, 4, seed=99)
        assert outsider.batch_set_v1(keys, idx) == [True] * 4
    second = backend(sealed, make_pool(pages=16))
    assert second.batch_exists(keys) == 4, "the fleet's own backend sees its pages"
    assert second.batch_get_v1(keys, idx) == [True] * 4
    assert same(second.mem_pool_host.kv_buffer[:, idx], pool.kv_buffer[:, idx])


@pytest.mark.parametrize("access", ["owner", "shared"])
def test_mla_only_the_writer_stores_and_a_reader_rank_reads_its_pages(access, tmp):
    """MLA: rank 1's backup is skipped (reported stored, as SGLang's controller expects);
    rank 0 stores; rank 1 (with owned folders, a reader of rank 0's folder) reads every
    byte."""
    pool = make_mla_pool(pages=16)
    tiers = [{**tier_configs("nixl-file-path", tmp)[0], "access": access}]
    r1 = backend(tiers, pool, tp_rank=1, tp_size=2, mla=True)
    r0 = backend(tiers, pool, tp_rank=0, tp_size=2, mla=True)
    assert r0.prefix == r1.prefix, "MLA pages are shared by the attention group's ranks"
    idx, want = fill_mla(pool, 4, 5)
    keys = hexkeys("ml", 4)
    assert r1.batch_set_v1(keys, idx) == [True] * 4
    assert r1.batch_exists(keys) == 0, "the reader rank stored pages"
    assert r0.batch_set_v1(keys, idx) == [True] * 4
    pool.kv_buffer[idx] = 0
    assert r1.batch_exists(keys) == 4
    assert r1.batch_get_v1(keys, idx) == [True] * 4
    assert same(pool.kv_buffer[idx], want), "the reader rank read other bytes than the writer stored"
    r1.clear()  # a reader removes nothing
    assert r0.batch_exists(keys) == 4


@pytest.mark.parametrize("kind", ["mem", "nixl-file-path"])
def test_mla_host_pool_round_trip(kind, tmp):
    """SGLang's MLA host pool (one latent region per page): rank 0 stores, zero copy, and a
    second rank's backend on the same storage reads every byte back into a zeroed pool."""
    pool = make_mla_pool(pages=32)
    tiers = tier_configs(kind, tmp)
    r0 = backend(tiers, pool, tp_rank=0, tp_size=2, mla=True)
    assert r0.zero_copy, "MLA page_first must take the zero-copy path"
    idx, want = fill_mla(pool, 12, 11)
    keys = hexkeys("d1a", 12)
    before = r0.kvtier_stats()
    assert r0.batch_set_v1(keys, idx) == [True] * 12
    if kind != "mem":
        assert r0.kvtier_stats()["process_lent_bytes_copied"] == before["process_lent_bytes_copied"]
    pool.kv_buffer[idx] = 0
    # A second rank reads through its own backend (on the in-process DRAM tier, the same one
    # rank 0 stored into is asked: separate processes share only persistent tiers).
    reader = r0 if kind == "mem" else backend(tiers, pool, tp_rank=1, tp_size=2, mla=True)
    assert reader.batch_exists(keys) == 12
    assert reader.batch_get_v1(keys, idx) == [True] * 12
    assert same(pool.kv_buffer[idx], want), "MLA pages differ after the round trip"


def test_restart_finds_pages(tmp):
    pool = make_pool(pages=16)
    tiers = tier_configs("nixl-file-path", tmp)
    b = backend(tiers, pool)
    keys, idx, want = roundtrip(b, pool, n=8)
    del b
    pool.kv_buffer[:, idx] = 0
    again = backend(tiers, pool)
    assert again.batch_exists(keys) == 8
    assert again.batch_get_v1(keys, idx) == [True] * 8
    assert same(pool.kv_buffer[:, idx], want)


def test_a_detached_backend_lets_the_next_attach_open_its_folder(tmp):
    """SGLang detaches a storage backend at run time by ``close()`` (keeping no reference it
    knows of) and attaches a new one: the new one opens the same folder at once, not after the
    old one's lock times out, and finds its pages."""
    import time

    pool = make_pool(pages=16)
    tiers = tier_configs("nixl-file-path", tmp)
    first = backend(tiers, pool)
    keys, idx, want = roundtrip(b=first, pool=pool, n=8)
    first.close()
    pool.kv_buffer[:, idx] = 0
    started = time.monotonic()
    again = backend(tiers, pool)
    took = time.monotonic() - started
    assert took < 2.0, f"the re-attached backend waited {took:.1f} s for the detached one"
    assert again.batch_get_v1(keys, idx) == [True] * 8
    assert same(pool.kv_buffer[:, idx], want)
    del first


@pytest.mark.parametrize("layout, mla, zero_copy", [
    ("layer_first", False, True), ("page_head", False, True), ("layer_first", True, True),
    ("layer_first", False, False),
])
def test_every_layout_round_trips_zero_copy_where_sglang_describes_its_pages(layout, mla, zero_copy, tmp):
    """SGLang 0.5.23 gives zero-copy metadata (a page's regions, page by page) for layer_first
    and page_head pools too: those move straight between the pool and storage. A pool that
    cannot describe its pages (here one whose ``get_page_buffer_meta`` is taken away, as pool
    classes without it behave) takes the generic flat-page path. Every byte comes back."""
    pool = (make_mla_pool if mla else make_pool)(pages=16, layout=layout)
    if not zero_copy:
        def cannot(indices):
            raise NotImplementedError("no zero-copy metadata")

        pool.get_page_buffer_meta = cannot
    b = backend(tier_configs("nixl-file-path", tmp), pool, mla=mla)
    assert b.zero_copy is zero_copy
    P = pool.page_size
    g = torch.Generator().manual_seed(3)
    want = []
    for page in range(4):
        flat = pool.get_dummy_flat_data_page()
        flat.view(torch.int16).copy_(torch.randint(-30000, 30000, flat.view(torch.int16).shape, generator=g,
                                                   dtype=torch.int16))
        pool.set_from_flat_data_page(page * P, flat)
        want.append(pool.get_data_page(page * P, flat=True).clone())
    idx = torch.arange(0, 4 * P, dtype=torch.int64)
    keys = hexkeys("lf", 4)
    assert b.batch_set_v1(keys, idx) == [True] * 4
    zero = pool.get_dummy_flat_data_page().zero_()
    for page in range(4):
        pool.set_from_flat_data_page(page * P, zero)
    assert b.batch_get_v1(keys, idx) == [True] * 4
    for page in range(4):
        assert same(pool.get_data_page(page * P, flat=True), want[page]), f"{layout}: page {page} differs"
    b.close()


def test_generic_get_set(tmp):
    pool = make_pool(pages=8)
    b = backend(tier_configs("mem", tmp), pool)
    page = pool.get_dummy_flat_data_page().random_()
    assert b.set("a" * 64, page)
    assert b.batch_set(["b" * 64, "c" * 64], [page, page])
    got = b.get("a" * 64)
    assert got is not None and torch.equal(got, page)
    assert b.batch_get(["b" * 64, "d" * 64]) [1] is None
    assert b.exists("c" * 64)
    b.clear()
    assert not b.exists("c" * 64)


def test_data_path_failure_answers_false(tmp):
    """A folder made unusable: every call answers False or 0, none raises."""
    pool = make_pool(pages=16)
    b = backend(tier_configs("nixl-file-fd", tmp), pool)
    keys, idx, _ = roundtrip(b, pool, n=4)
    os.system(f"rm -rf {tmp / 'disk'}")
    (tmp / "disk").write_text("not a folder")
    assert b.batch_set_v1(hexkeys("zz", 4), idx) == [False] * 4
    assert b.batch_get_v1(keys, idx) == [False] * 4
    assert b.batch_exists(keys) == 0


def test_s3_server_stopped_answers_false(tmp, tmp_path_factory):
    from conftest import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3-stop"))
    try:
        pool = make_pool(pages=16)
        for kind in ("object", "nixl-obj"):
            tiers = tier_configs(kind, tmp, server)
            tiers[0]["op_timeout" if kind == "object" else "transfer_timeout"] = "2s"
            b = backend(tiers, pool)
            keys, idx, _ = roundtrip(b, pool, n=4, seed=7)
            server.stop()
            try:
                assert b.batch_set_v1(hexkeys("dd", 4), idx) == [False] * 4
                assert b.batch_get_v1(keys, idx) == [False] * 4
                assert b.batch_exists(keys) == 0
            finally:
                server.start()
    finally:
        server.stop()


def test_bad_config_raises_at_construction(tmp):
    pool = make_pool(pages=8)
    with pytest.raises(kvtier.ConfigError, match="capacity"):
        backend([{"kind": "mem", "capacity": "-5"}], pool)
    with pytest.raises(kvtier.ConfigError, match="kind"):
        backend([{"kind": "no-such-kind"}], pool)
    with pytest.raises(kvtier.ConfigError):
        backend([], pool)


def test_eight_threads(tmp):
    pool = make_pool(pages=64)
    b = backend(tier_configs("nixl-file-path", tmp), pool)
    errors = []

    def worker(t):
        try:
            for r in range(5):
                first = t * 8
                idx = fill_pages(pool, first, 8, 100 * t + r)
                want = pool.kv_buffer[:, idx].clone()
                keys = hexkeys(f"t{t}r{r}", 8)
                assert b.batch_set_v1(keys, idx) == [True] * 8
                pool.kv_buffer[:, idx] = 0
                assert b.batch_get_v1(keys, idx) == [True] * 8
                assert same(pool.kv_buffer[:, idx], want)
        except BaseException as e:  # collected, re-raised in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a thread still runs after 120 s"
    assert not errors, errors


def test_get_stats_reports_storage_metrics(tmp):
    pool = make_pool(pages=16)
    b = backend(tier_configs("mem", tmp), pool, metrics=True)
    roundtrip(b, pool, n=4)
    m = b.get_stats()
    assert m.backup_pgs == [4] and m.prefetch_pgs == [4]
    assert b.get_stats().backup_pgs == []  # drained on read, as SGLang's collector expects


def test_extra_config_keys_nobody_reads_are_named_in_a_warning(tmp, caplog):
    import logging

    pool = make_pool(pages=16)
    with caplog.at_level(logging.WARNING, logger="kvtier.sglang"):
        known = backend(tier_configs("mem", tmp), pool, {"tenant": "t", "prefetch_threshold": 256})
        assert "unknown extra_config" not in caplog.text
        typo = backend(tier_configs("mem", tmp), pool, {"tenantt": "t"})
    assert "unknown extra_config keys ['tenantt']" in caplog.text, caplog.text
    known.close()
    typo.close()


def test_a_clear_that_fails_raises_for_sglang_to_report(silent_endpoint):
    """SGLang's storage attachment catches what ``clear`` raises and reports the clear failed
    (keeping what it believes storage holds); a clear that logged and returned would be
    reported as done."""
    from conftest import silent_object_tier

    b = backend([silent_object_tier(silent_endpoint, timeout="1s")], make_pool(pages=16))
    with pytest.raises(kvtier.KvtierError):
        b.clear()
    b.close()


def test_each_pipeline_stage_serves_metrics_on_a_port_of_its_own(tmp):
    """The metrics port is the one given plus the process's index: TP rank, then attention CP
    rank, PP stage and DP group (two PP stages used to ask for the same port)."""
    import socket

    def free_pair():
        for _ in range(50):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            try:
                with socket.socket() as a, socket.socket() as b:
                    a.bind(("127.0.0.1", port))
                    b.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
        raise AssertionError("no two free ports in a row")

    port = free_pair()
    extra = {"metrics_addr": f"127.0.0.1:{port}"}
    stages = [backend(tier_configs("mem", tmp), make_pool(pages=16), extra, pp_rank=r, pp_size=2)
              for r in (0, 1)]
    assert [s.metrics_addr[1] for s in stages] == [port, port + 1]
    for s in stages:
        s.close()


def test_pages_stored_are_published_as_sglang_kv_events_for_routers(tmp):
    """With ``kv_events``, the KV pages kvtier stored come out on a publisher of its own as
    SGLang's KV events (``BlockStored``, medium ``DISK``, each page by SGLang's event hash of its
    key, the pool's page size as block size), and a clear as ``AllBlocksCleared``: read here
    with a ZMQ subscriber and SGLang's own event classes, as a router reads SGLang's events.
    Only the rank SGLang publishes from publishes (TP rank 0)."""
    import msgspec
    import zmq
    from conftest import free_port
    from sglang.srt.disaggregation.kv_events import AllBlocksCleared, BlockStored, KVEventBatch
    from sglang.srt.mem_cache.utils import hash_str_to_int64

    port = free_port()
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    decode = msgspec.msgpack.Decoder(type=KVEventBatch).decode
    extra = {"kv_events": {"endpoint": f"tcp://*:{port}", "topic": "kvtier"}}
    pool = make_pool()
    b = backend(tier_configs("nixl-file-path", tmp), pool, extra)
    other_rank = backend(tier_configs("mem", tmp), make_pool(), extra, tp_rank=1, tp_size=2)
    assert other_rank.events is None, "TP rank 1 publishes nothing"
    other_rank.close()

    def next_batch(timeout_ms=5000):
        assert sub.poll(timeout_ms), "a KV event batch arrives"
        topic, _seq, payload = sub.recv_multipart()
        assert topic == b"kvtier"
        return decode(payload)

    # A subscriber joins a publisher a moment after it binds: pages are stored until it has.
    deadline = time.monotonic() + 20
    warm = 0
    while True:
        idx = fill_pages(pool, 0, 1, warm)
        assert b.batch_set_v1(hexkeys(f"ee{warm:02x}", 1), idx) == [True]
        warm += 1
        if sub.poll(200):
            sub.recv_multipart()
            break
        assert time.monotonic() < deadline, "the subscriber joined the publisher"
    while sub.poll(300):
        sub.recv_multipart()

    keys = hexkeys("ab01", 8)
    idx = fill_pages(pool, 0, 8, 5)
    assert b.batch_set_v1(keys, idx) == [True] * 8
    batch = next_batch()
    assert len(batch.events) == 1
    event = batch.events[0]
    assert isinstance(event, BlockStored)
    assert event.block_hashes == [hash_str_to_int64(k) for k in keys]
    assert event.parent_block_hash is None
    assert event.medium == "DISK"
    assert event.block_size == pool.page_size

    b.clear()
    assert any(isinstance(e, AllBlocksCleared) for e in next_batch().events)
    b.close()
    sub.close(linger=0)


def test_with_the_integrity_secret_no_file_name_carries_a_pages_chain_hash(tmp, monkeypatch):
    """A co-tenant who lists a shared folder reads its file names: without a secret they carry
    SGLang's chain hashes in clear (whoever knows a document's hashes can tell it was
    prompted); with the tiers' integrity secret every name is a keyed digest, and the fleet
    still reads its pages."""
    monkeypatch.setenv("KVTIER_TEST_TENANT_SECRET", "the fleet's secret, 32 bytes long")

    def names_under(folder):
        return [n for _, _, files in os.walk(folder) for n in files if not n.startswith(".")]

    for sealed in (False, True):
        folder = str(tmp / f"shared-{sealed}")
        tier = {"kind": "nixl-file", "dirs": [folder], "access": "shared"}
        if sealed:
            tier["integrity"] = {"key_env": "KVTIER_TEST_TENANT_SECRET"}
        pool = make_pool(pages=16)
        b = backend([tier], pool)
        keys, idx, want = roundtrip(b, pool, n=4, seed=3)
        names = names_under(folder)
        assert len(names) == 4, names
        in_clear = [k for k in keys if any(k in n for n in names)]
        if sealed:
            assert not in_clear, f"chain hashes in file names: {names}"
            again = backend([tier], make_pool(pages=16))
            assert again.batch_get_v1(keys, idx) == [True] * 4
            assert same(again.mem_pool_host.kv_buffer[:, idx], want)
            again.close()
        else:
            assert in_clear == keys, "without a secret the names carry the keys"
        b.close()
