"""The NIXL runtime is found in the interpreter's site-packages only: a ``nixl_cu12/`` planted
in the working directory (first on ``sys.path`` for ``python -c``) never gets its library
loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_a_nixl_package_in_the_working_directory_is_not_used(tmp_path: Path) -> None:
    planted = tmp_path / "nixl_cu12"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    libs = tmp_path / ".nixl_cu12.mesonpy.libs"
    libs.mkdir()
    (libs / "libnixl_capi.so").write_bytes(b"not a library")
    env = {k: v for k, v in os.environ.items() if k not in ("NIXL_LIB_DIR", "KVTIER_NIXL_LIB_DIR_AUTO")}
    out = subprocess.run(
        [sys.executable, "-c", "import os, kvtier; print(os.environ.get('NIXL_LIB_DIR', ''))"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=True,
    ).stdout.strip()
    assert not out.startswith(str(tmp_path)), f"the planted package's library was chosen: {out}"
