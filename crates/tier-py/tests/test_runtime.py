"""Where the NIXL runtime comes from: never loaded for a config without a NIXL tier, and one
copy shared with SGLang's own NIXL backend in the same process."""

from __future__ import annotations

import os
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


def test_missing_runtime_is_an_exception_naming_the_places_tried(tmp_path):
    """No NIXL anywhere (the default folder hidden in a private mount namespace, the pip
    package's folder overridden): a NIXL tier raises kvtier.Unavailable listing every place
    tried, the interpreter lives on, and a DRAM store still opens."""
    empty = tmp_path / "no-nixl-here"
    empty.mkdir()
    code = textwrap.dedent(f"""
        import kvtier
        try:
            kvtier.Store({{"tiers": [{{"kind": "nixl-file", "dirs": ["{tmp_path / 'disk'}"]}}]}})
        except kvtier.Unavailable as e:
            print("RAISED", e)
        with kvtier.Store({{"tiers": [{{"kind": "mem", "capacity": "1MiB"}}]}}) as s:
            assert s.put(["k"], [b"x"]) == [None]
        print("ALIVE")
    """)
    script = tmp_path / "probe.py"
    script.write_text(code)
    hide = "mount -t tmpfs none /opt/kvtier/nixl && exec \"$0\" \"$1\""
    out = subprocess.run(["unshare", "-rm", "sh", "-c", hide, sys.executable, str(script)], cwd=HERE,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NIXL_LIB_DIR": str(empty)})
    assert out.returncode == 0, out.stdout + out.stderr
    raised = [line for line in out.stdout.splitlines() if line.startswith("RAISED")]
    assert raised, f"no exception for a missing NIXL runtime: {out.stdout}{out.stderr}"
    for place in (str(empty), "/opt/kvtier/nixl/lib", "system loader path"):
        assert place in raised[0], f"{place} not named in: {raised[0]}"
    assert "ALIVE" in out.stdout
