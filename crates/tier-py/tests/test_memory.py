"""What a folder's pages cost the process that stores them, held to the per-page bound a
1,000,000-page fill is documented to keep (`docs/benchmarks.md`), at a size CI affords."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

# Fills one folder through the Store in batches of 1,024 pages of 4 KiB under 64-hex keys, in
# two parts, and prints the RSS grown per page over the second (the open's fixed costs and the
# allocator's working set of each thread are paid in the first, so only what grows with the
# pages is left), and what the allocator then kept of memory freed (what `malloc_trim` hands
# back to the system).
FILL = r"""
import ctypes, json, os, sys
import kvtier
root, first, total, ordered = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
payload = bytes(range(256)) * 16
def fill(store, start, end):
    for at in range(start, end, 1024):
        keys = [f"{i:064x}" for i in range(at, min(end, at + 1024))]
        assert store.put(keys, [payload] * len(keys)) == [None] * len(keys)
tier = {"kind": "nixl-file", "dirs": [root], "engine": "syscalls", "ordered_pages": ordered}
with kvtier.Store({"tiers": [tier]}) as store:
    fill(store, 0, first)
    filled = rss()
    fill(store, first, total)
    grown = rss() - filled
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    kept = filled + grown - rss()
print(json.dumps({"per_page": grown / (total - first), "kept": kept}))
"""


def test_a_fill_grows_rss_by_at_most_71_bytes_a_page_and_keeps_nothing_it_freed(tmp_path):
    # The index turns sampled at 50,000 pages, in the first part; the second holds what every
    # page past it costs: its slot and its share of the table. Memory the index freed as it
    # grew (its array and table outgrown) is handed back, not kept resident: at 1,000,000
    # pages, kept, it was about 20 MiB.
    first, total = 100_000, 300_000
    # A memory filesystem where there is one: the pages' files are not what is measured.
    shm = "/dev/shm"
    parent = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else str(tmp_path)
    with tempfile.TemporaryDirectory(dir=parent) as root:
        out = subprocess.run(
            [sys.executable, "-c", FILL, root, str(first), str(total), "50000"],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert out.returncode == 0, out.stderr[-2000:]
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    # 96 bytes a page at 1,000,000 pages, everything included, leaves about 71 for what grows
    # with the pages once NIXL's fixed cost (about 24 MiB) is paid.
    assert measured["per_page"] <= 71, f"RSS grew by {measured['per_page']:.1f} bytes a page"
    kept = measured["kept"] / 2**20
    assert kept <= 4, f"{kept:.1f} MiB freed during the fill was still resident"
