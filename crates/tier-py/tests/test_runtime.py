"""Where the NIXL runtime comes from: never loaded for a config without a NIXL tier, and one
copy shared with SGLang's own NIXL backend in the same process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=HERE, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


MAPS = """
def nixl_libs():
    libs = set()
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if "libnixl" in path and path.endswith(".so"):
            libs.add(path)
    return sorted(libs)
"""


def test_no_nixl_without_a_nixl_tier():
    out = run(MAPS + """
import kvtier
with kvtier.Store({"tiers": [{"kind": "mem", "capacity": "1MiB"}]}) as s:
    assert s.put(["k"], [b"x"]) == [None]
print(nixl_libs())
""")
    assert out.strip() == "[]", f"NIXL loaded for a DRAM-only store: {out}"


@pytest.mark.parametrize("first", ["kvtier", "sglang"])
def test_one_runtime_beside_sglangs_nixl_backend(tmp_path, first):
    out = run(MAPS + f"""
import os
if "{first}" == "kvtier":
    import kvtier
from conftest import backend, make_pool, storage_config, tier_configs
from pathlib import Path
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
pool = make_pool(pages=4)
os.environ["SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR"] = "{tmp_path / 'sglang'}"
theirs = StorageBackendFactory.create_backend(
    "nixl", storage_config({{"plugin": {{"posix": {{"active": True}}}}}}), pool)
ours = backend(tier_configs("nixl-file-path", Path("{tmp_path}")), pool)
import torch
idx = torch.arange(0, pool.page_size, dtype=torch.int64)
assert ours.batch_set_v1(["a" * 64], idx) == [True]
print(nixl_libs())
""")
    libs = eval(out.strip().splitlines()[-1])
    names = [Path(p).name for p in libs]
    assert "libnixl.so" in names and "libnixl_capi.so" in names, libs
    assert len(names) == len(set(names)), f"two copies of the NIXL runtime: {libs}"
    # kvtier's C API library comes from the same installed package as SGLang's runtime.
    assert len({Path(p).parent for p in libs}) == 1, f"NIXL libraries from two places: {libs}"
