"""kvtier: tiered KV-cache storage for LLM inference.

A :class:`Store` is a hierarchy of tiers (DRAM, NIXL FILE, NIXL OBJ, object storage) opened
from the same TOML/JSON schema as the ``kvtier`` command. Batch calls answer per key and move
page bytes between the caller's memory and storage without passing them through Python; the
GIL is released while they wait. The classes are the native ones (``kvtier._kvtier``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _nixl_packages() -> list[str]:
    """The nixl wheels to look in: the one already imported (a process has one NIXL runtime),
    else cu12 first. cu13's OBJ plugin needs CUDA's object client library and cannot load
    without it; cu12's loads anywhere. A NIXL imported later in the process (SGLang's own
    backend) then shares the runtime loaded first: the libraries have the same sonames."""
    loaded: list[str] = [n for n in ("nixl_cu13", "nixl_cu12") if n in sys.modules]
    return loaded or ["nixl_cu12", "nixl_cu13"]


# Where kvtier records the NIXL_LIB_DIR value it chose itself (inherited by child processes
# with it), to tell it from one the user set.
_AUTO = "KVTIER_NIXL_LIB_DIR_AUTO"


def _site_dirs() -> list[Path]:
    """The interpreter's installation folders and the site-packages folders on ``sys.path``
    (a ``.pth`` may add another venv's), never the working directory or other entries: a
    ``nixl_cu12/`` planted where Python runs must not get its library loaded."""
    import site
    import sysconfig

    found: list[str] = [sysconfig.get_paths().get(k, "") for k in ("platlib", "purelib")]
    found += site.getsitepackages()
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    found += [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    dirs: list[Path] = []
    for d in found:
        if d and Path(d).is_absolute() and Path(d) not in dirs:
            dirs.append(Path(d))
    return dirs


def _nixl_from_pip() -> None:
    """Points kvtier at the NIXL runtime of an installed ``nixl`` package (its ``nixl-cu12``
    or ``nixl-cu13`` wheel ships ``libnixl_capi.so``), unless the user set ``NIXL_LIB_DIR``.
    Only the interpreter's site-packages are searched. Called again as each store opens (the
    runtime loads with the first NIXL tier), so a NIXL that SGLang imported meanwhile is the
    one kvtier uses: one runtime per process."""
    current = os.environ.get("NIXL_LIB_DIR")
    if current and current != os.environ.get(_AUTO):
        return
    for name in _nixl_packages():
        for site_dir in _site_dirs():
            libs = site_dir / f".{name}.mesonpy.libs"
            if (site_dir / name).is_dir() and (libs / "libnixl_capi.so").is_file():
                os.environ["NIXL_LIB_DIR"] = os.environ[_AUTO] = str(libs)
                return


_nixl_from_pip()

from ._kvtier import (  # noqa: E402
    CompletionQueue,
    ConfigError,
    InvalidBuffer,
    InvalidKey,
    InvalidPage,
    KvtierError,
    Store,
    Timeout,
    Unavailable,
    __version__,
)

__all__ = [
    "Store",
    "CompletionQueue",
    "KvtierError",
    "ConfigError",
    "InvalidKey",
    "InvalidPage",
    "InvalidBuffer",
    "Unavailable",
    "Timeout",
    "__version__",
]
