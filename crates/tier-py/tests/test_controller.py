"""SGLang's own HiCacheController drives kvtier's backend: its backup loop and prefetch page
functions call the backend in the order and shapes SGLang really uses (built with __new__, as
SGLang's CPU unit tests build it)."""

from __future__ import annotations

import os

import torch

from conftest import backend, fill_pages, make_pool, tier_configs

from sglang.srt.managers.cache_controller import HiCacheController, PrefetchOperation, StorageOperation


def controller(b, pool, zero_copy):
    ctl = HiCacheController.__new__(HiCacheController)
    ctl.storage_backend = b
    ctl.storage_host_pool = pool
    ctl.mem_pool_host = pool
    ctl.page_size = pool.page_size
    if zero_copy:
        ctl.page_set_func, ctl.page_get_func = ctl._page_set_zero_copy, ctl._page_get_zero_copy
    else:
        ctl.page_set_func, ctl.page_get_func = ctl._generic_page_set, ctl._generic_page_get
    return ctl


def drive(ctl, pool, n, seed, kv_slice):
    """Backs up `n` pages through the controller's batch loop, clears them, prefetches them."""
    P = pool.page_size
    idx = torch.arange(0, n * P, dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    view = kv_slice(idx)
    bits = torch.randint(-30000, 30000, view.shape, generator=g, dtype=torch.int16)
    view.copy_(bits.view(pool.dtype))
    want = kv_slice(idx).clone()
    keys = [f"{seed:08x}{i:056x}" for i in range(n)]
    op = StorageOperation(host_indices=idx, token_ids=list(range(n * P)), hash_value=keys)
    ctl._page_backup(op)
    assert op.completed_tokens == n * P, "the backup loop stopped early"
    kv_slice(idx).zero_()
    assert ctl.storage_backend.batch_exists(keys) == n
    pre = PrefetchOperation("req-1", token_ids=list(range(n * P)))
    hits = 0
    for i in range(0, n, 128):  # the controller's STORAGE_BATCH_SIZE
        batch = keys[i : i + 128]
        hits += ctl.page_get_func(pre, batch, idx[i * P : (i + len(batch)) * P])
    assert hits == n
    assert torch.equal(kv_slice(idx).view(torch.int16), want.view(torch.int16))


def test_controller_zero_copy_backup_and_prefetch(tmp):
    pool = make_pool(pages=300)
    b = backend(tier_configs("nixl-file-path", tmp), pool)
    ctl = controller(b, pool, zero_copy=True)
    drive(ctl, pool, 300, 11, lambda idx: pool.kv_buffer[:, idx])  # batches of 128, 128, 44


def test_controller_generic_pages(tmp):
    pool = make_pool(pages=40, layout="layer_first")
    b = backend(tier_configs("mem-over-nixl-file", tmp), pool)
    ctl = controller(b, pool, zero_copy=False)
    drive(ctl, pool, 40, 12, lambda idx: pool.kv_buffer[:, :, idx])


def test_fds_and_rss_flat_over_10000_batches(tmp):
    """10,000 v1 batches (set, exists, get) on NIXL FILE: open fds and RSS do not grow."""
    pool = make_pool(layers=1, heads=1, head_dim=64, page=8, pages=4)
    b = backend(tier_configs("nixl-file-path", tmp), pool)
    idx = fill_pages(pool, 0, 2, 1)

    def fds():
        return len(os.listdir("/proc/self/fd"))

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def batches(start, count):
        for n in range(start, start + count):
            keys = [f"{n:060x}a{j}x" for j in range(2)]
            assert b.batch_set_v1(keys, idx) == [True, True]
            assert b.batch_exists(keys) == 2
            assert b.batch_get_v1(keys, idx) == [True, True]
            assert b.store.remove(b._keys(keys)) == [True, True]  # so what is stored does not grow

    batches(0, 1000)  # warm-up: caches, runtime threads, allocator pools
    fd0, rss0 = fds(), rss()
    batches(1000, 9000)
    fd1, rss1 = fds(), rss()
    assert fd1 <= fd0, f"open fds grew from {fd0} to {fd1}"
    # 9,000 batches of two pages each: a per-page leak of even 1 KiB would add 18 MiB.
    assert rss1 - rss0 < 8 << 20, f"RSS grew by {(rss1 - rss0) >> 10} KiB"
