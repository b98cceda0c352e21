#!/usr/bin/env bash
# Installs what kvtier's build and tests need on a fresh Debian machine, idempotently.
#   scripts/setup.sh build   apt packages for the build (libclang for nixl-sys's bindgen)
#   scripts/setup.sh nixl    the NIXL runtime (libnixl_capi.so + plugins) from the nixl-cu12 wheel
#   scripts/setup.sh s3      s3s-fs, a real S3 server the object-storage tests start on loopback
#   scripts/setup.sh pylint  ruff and mypy in that venv, for make lint
#   scripts/setup.sh py310   a Python 3.10 venv for the plain-interpreter tests
#   scripts/setup.sh py      the Python venv the kvtier wheel is tested in (torch, SGLang's classes,
#                            nixl, maturin, pytest), at $KVTIER_VENV (default /opt/kvtier/venv)
#   scripts/setup.sh lmcache LMCache's venv at $KVTIER_LMCACHE_VENV (default /opt/kvtier/venv-lmcache),
#                            sharing torch with the venv above (its packages come after its own)
#   scripts/setup.sh vllm    vLLM's venv at $KVTIER_VLLM_VENV (default /opt/kvtier/venv-vllm), a venv
#                            of its own: vLLM pins torch 2.14.0, the base venv has a newer one
#   scripts/setup.sh all     all of them
set -euo pipefail

NIXL_VERSION=1.5.1
NIXL_DIR=${KVTIER_NIXL_DIR:-/opt/kvtier/nixl}
S3S_VERSION=0.14.1
S3S_ROOT=${KVTIER_S3S_ROOT:-/opt/kvtier/s3s}
RUFF_VERSION=0.17.6
MYPY_VERSION=2.4.1
HYPOTHESIS_VERSION=6.170.17
VENV=${KVTIER_VENV:-/opt/kvtier/venv}
PY310_VENV=${KVTIER_PY310_VENV:-/opt/kvtier/venv-py310}
SGLANG_VERSION=0.5.23
LMCACHE_VENV=${KVTIER_LMCACHE_VENV:-/opt/kvtier/venv-lmcache}
LMCACHE_VERSION=0.5.6
VLLM_VENV=${KVTIER_VLLM_VENV:-/opt/kvtier/venv-vllm}
VLLM_VERSION=0.33.0

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

setup_build() {
  local missing=()
  # glusterfs-*: the distributed filesystem the sharing tests run on (two FUSE mounts of one
  # volume; tier_tests::gluster starts it).
  for pkg in libclang-dev pkg-config glusterfs-server glusterfs-client; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    sudo_if_needed apt-get update -qq
    DEBIAN_FRONTEND=noninteractive sudo_if_needed apt-get install -y -qq "${missing[@]}"
  fi
  command -v cargo-nextest >/dev/null 2>&1 || cargo install cargo-nextest --locked
}

setup_nixl() {
  local marker="$NIXL_DIR/.installed-$NIXL_VERSION"
  if [ -f "$marker" ] && [ -f "$NIXL_DIR/lib/libnixl_capi.so" ]; then
    return
  fi
  echo "setup: installing the NIXL $NIXL_VERSION runtime into $NIXL_DIR"
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  python3 -m pip download --quiet --no-deps "nixl-cu12==$NIXL_VERSION" -d "$tmp"
  python3 -m zipfile -e "$tmp"/nixl_cu12-*.whl "$tmp/wheel"
  sudo_if_needed rm -rf "$NIXL_DIR"
  sudo_if_needed mkdir -p "$NIXL_DIR"
  # The libraries carry RPATH $ORIGIN/.:$ORIGIN/../nixl_cu12.libs: keep the two folders siblings.
  sudo_if_needed cp -a "$tmp/wheel/.nixl_cu12.mesonpy.libs" "$NIXL_DIR/lib"
  sudo_if_needed cp -a "$tmp/wheel/nixl_cu12.libs" "$NIXL_DIR/nixl_cu12.libs"
  sudo_if_needed touch "$marker"
  echo "setup: NIXL runtime ready: $NIXL_DIR/lib/libnixl_capi.so"
}

setup_s3() {
  if [ -x "$S3S_ROOT/bin/s3s-fs" ]; then
    return
  fi
  echo "setup: building s3s-fs $S3S_VERSION into $S3S_ROOT (about 2 minutes)"
  # The pin matters: newer s3s-fs needs a newer rustc.
  cargo install "s3s-fs@$S3S_VERSION" --locked --features binary --root "$S3S_ROOT"
}

setup_py() {
  setup_py_base
  # The property tests of the Python API.
  if ! "$VENV/bin/python" -c "import hypothesis, sys; sys.exit(hypothesis.__version__ != '$HYPOTHESIS_VERSION')" 2>/dev/null; then
    "$VENV/bin/pip" install --quiet "hypothesis==$HYPOTHESIS_VERSION"
  fi
}

setup_py_base() {
  local marker="$VENV/.installed-sglang-$SGLANG_VERSION-nixl-$NIXL_VERSION"
  if [ -f "$marker" ]; then
    return
  fi
  echo "setup: creating the Python venv $VENV (torch, sglang $SGLANG_VERSION, nixl $NIXL_VERSION)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  "$VENV/bin/pip" install --quiet torch
  # SGLang's classes import on CPU without its pinned dependency set (its GPU stack).
  "$VENV/bin/pip" install --quiet --no-deps "sglang==$SGLANG_VERSION"
  "$VENV/bin/pip" install --quiet numpy orjson psutil pybase64 requests packaging pillow \
    starlette msgspec pydantic pyzmq tqdm ipython aiohttp transformers torchvision dill \
    apache-tvm-ffi sentencepiece compressed-tensors gguf "nixl==$NIXL_VERSION" \
    "maturin>=1.5,<2" pytest
  "$VENV/bin/python" -c "import sglang.srt.mem_cache.hicache_storage, nixl._api, torch"
  touch "$marker"
}

# The Python checks of `make lint` (ruff, mypy and its stubtest), pinned, in the base venv.
setup_pylint() {
  setup_py
  if "$VENV/bin/ruff" --version 2>/dev/null | grep -qx "ruff $RUFF_VERSION" &&
    "$VENV/bin/mypy" --version 2>/dev/null | grep -q "^mypy $MYPY_VERSION "; then
    return
  fi
  echo "setup: installing ruff $RUFF_VERSION and mypy $MYPY_VERSION into $VENV"
  "$VENV/bin/pip" install --quiet "ruff==$RUFF_VERSION" "mypy==$MYPY_VERSION" "typing_extensions>=4.15"
}

# A Python 3.10 venv (pytest, numpy) for the package's plain-interpreter tests on the oldest
# Python it supports, from the machine's pyenv 3.10 (or $KVTIER_PYTHON310).
setup_py310() {
  if [ -x "$PY310_VENV/bin/pytest" ]; then
    return
  fi
  local python=${KVTIER_PYTHON310:-$(ls -d /root/.pyenv/versions/3.10.*/bin/python 2>/dev/null | tail -n 1)}
  if [ -z "$python" ] || ! "$python" -c 'import sys; assert sys.version_info[:2] == (3, 10)'; then
    echo "setup: no Python 3.10 interpreter (set KVTIER_PYTHON310 to one)" >&2
    exit 1
  fi
  echo "setup: creating the Python 3.10 venv $PY310_VENV from $python"
  "$python" -m venv "$PY310_VENV"
  "$PY310_VENV/bin/pip" install --quiet pytest numpy
}

# An engine's venv on top of the base venv: its own packages first (the engine's pins), then
# the base venv's through a .pth file, so torch is installed once and pip sees it installed.
chain_venv() {
  local venv=$1 site base
  python3 -m venv "$venv"
  site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  base=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$base" > "$site/zz-kvtier-base-venv.pth"
}

setup_lmcache() {
  local marker="$LMCACHE_VENV/.installed-lmcache-$LMCACHE_VERSION"
  if [ -f "$marker" ]; then
    return
  fi
  setup_py
  echo "setup: creating LMCache's venv $LMCACHE_VENV (lmcache $LMCACHE_VERSION over $VENV)"
  chain_venv "$LMCACHE_VENV"
  "$LMCACHE_VENV/bin/pip" install --quiet --upgrade pip
  "$LMCACHE_VENV/bin/pip" install --quiet "lmcache==$LMCACHE_VERSION" pytest
  "$LMCACHE_VENV/bin/python" -c "import lmcache.v1.distributed.storage_manager, torch"
  touch "$marker"
}

setup_vllm() {
  local marker="$VLLM_VENV/.installed-vllm-$VLLM_VERSION"
  if [ -f "$marker" ]; then
    return
  fi
  echo "setup: creating vLLM's venv $VLLM_VENV (vllm $VLLM_VERSION and its torch; about 6 minutes)"
  python3 -m venv "$VLLM_VENV"
  "$VLLM_VENV/bin/pip" install --quiet --upgrade pip
  "$VLLM_VENV/bin/pip" install --quiet "vllm==$VLLM_VERSION" pytest
  "$VLLM_VENV/bin/python" -c "import vllm.v1.kv_offload.tiering.manager, torch"
  touch "$marker"
}

case "${1:-all}" in
  build) setup_build ;;
  nixl) setup_nixl ;;
  s3) setup_s3 ;;
  py) setup_py ;;
  pylint) setup_pylint ;;
  py310) setup_py310 ;;
  lmcache) setup_lmcache ;;
  vllm) setup_vllm ;;
  all) setup_build; setup_nixl; setup_s3; setup_py; setup_pylint; setup_py310; setup_lmcache; setup_vllm ;;
  *) echo "usage: $0 [build|nixl|s3|py|pylint|py310|lmcache|vllm|all]" >&2; exit 2 ;;
esac
