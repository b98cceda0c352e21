"""Fixtures: SGLang's real host pool on CPU, its storage config, and tier configs for every
backend kvtier has (DRAM, NIXL FILE in path and fd mode, NIXL OBJ and object_store on a real
S3 server, s3s-fs, started here on loopback)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

S3S_BIN = os.environ.get("KVTIER_S3S_BIN", "/opt/kvtier/s3s/bin/s3s-fs")
ACCESS, SECRET = "kvtier-py-key", "kvtier-py-secret"


def make_pool(layers=2, heads=2, head_dim=64, page=16, pages=64, layout="page_first", dtype=torch.float16):
    """SGLang's MHATokenToKVPoolHost on CPU (the recipe of SGLang's own CPU tests)."""
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    dev_tokens = page * pages
    k = [torch.zeros(dev_tokens, heads, head_dim, dtype=dtype) for _ in range(layers)]
    v = [torch.zeros(dev_tokens, heads, head_dim, dtype=dtype) for _ in range(layers)]
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)  # noqa: E731
    info = MHABufferInfo(
        buffers=KVBuffers(k=tuple(k), v=tuple(v), k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v), layout=KVBufferLayout.NHD),
        page_size=page, head_num=heads, head_dim=head_dim, v_head_dim=head_dim, dtype=dtype,
        device=torch.device("cpu"),
    )
    pool = MHATokenToKVPoolHost(
        info, 1.0, 0, page, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=dev_tokens, start_layer=0, end_layer=layers - 1,
    )
    pool._keep = (k, v)
    return pool


def make_mla_pool(layers=2, kv_lora_rank=64, rope_dim=16, page=16, pages=64, layout="page_first", dtype=torch.float16):
    """SGLang's MLATokenToKVPoolHost on CPU: one latent region per page, shared by every rank."""
    from sglang.srt.mem_cache.device_pool_info import MLABufferInfo
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    dev_tokens = page * pages
    bufs = tuple(torch.zeros(dev_tokens, 1, kv_lora_rank + rope_dim, dtype=dtype) for _ in range(layers))
    info = MLABufferInfo(
        buffers=bufs, data_ptrs=torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64),
        layer_indices=tuple(range(layers)), device_layer_num=layers, page_size=page,
        kv_lora_rank=kv_lora_rank, qk_rope_head_dim=rope_dim, kv_cache_dim=kv_lora_rank + rope_dim,
        dtype=dtype, device=torch.device("cpu"),
    )
    pool = MLATokenToKVPoolHost(
        info, 1.0, 0, page, layout, pin_memory=False, device="cpu",
        device_capacity_tokens=dev_tokens, start_layer=0, end_layer=layers - 1, target_layer_num=layers,
    )
    pool._keep = bufs
    return pool


def make_mamba_pool(layers=2, slots=16, layout="page_first"):
    """SGLang's MambaPoolHost on CPU: a hybrid model's state pool (one slot per page: a
    temporal state and a conv state per layer, of two dtypes)."""
    from sglang.srt.mem_cache.device_pool_info import MambaStateBufferInfo
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost

    temporal = torch.zeros(layers, slots, 4, 8, dtype=torch.float32)
    conv = (torch.zeros(layers, slots, 3, 16, dtype=torch.float16),)
    info = MambaStateBufferInfo(temporal=temporal, conv=conv)
    pool = MambaPoolHost(info, 2.0, 0, device_capacity=slots, pin_memory=False, device="cpu", layout=layout)
    pool._keep = (temporal, conv)
    return pool


def storage_config(extra, tp_rank=0, tp_size=1, mla=False, model="test-model", page_first=True, metrics=False,
                   dp_rank=0, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, tp_lcm_size=None,
                   should_split_heads=False):
    """SGLang's storage config of one rank (with DP attention, `tp_rank` is the rank in its DP
    group, as SGLang's cache controller gives it)."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size, attn_cp_rank=attn_cp_rank,
        attn_cp_size=attn_cp_size, is_mla_model=mla, enable_storage_metrics=metrics,
        is_page_first_layout=page_first, model_name=model, dp_rank=dp_rank, extra_config=extra,
        tp_lcm_size=tp_lcm_size, should_split_heads=should_split_heads,
    )


def backend(tiers, pool=None, extra=None, **cfg):
    """kvtier's backend created by SGLang's own factory, as `--hicache-storage-backend dynamic`
    (`extra`: more of its extra config)."""
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    extra = {"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierStorage",
             "interface_v1": 1, "tiers": tiers, **(extra or {})}
    b = StorageBackendFactory.create_backend("dynamic", storage_config(extra, **cfg), pool)
    if pool is not None:
        b.register_mem_pool_host(pool)
    return b


def fill_pages(pool, first_page, n, seed):
    """Distinct content in pages [first_page, first_page + n) of the pool's K and V."""
    P = pool.page_size
    idx = torch.arange(first_page * P, (first_page + n) * P, dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(-30000, 30000, pool.kv_buffer[:, idx].shape, generator=g, dtype=torch.int16)
    pool.kv_buffer[:, idx] = data.view(pool.dtype)
    return idx


def run_instances(code, sync, n=2, open_within=10.0):
    """Runs `code` in `n` processes at once (``ME`` in it replaced by 1..n), each an engine
    instance that records how long it took to open in ``sync/opened.ME``; asserts every one
    exited 0 and opened within `open_within` seconds, and returns those times."""
    here = Path(__file__).resolve().parent
    procs = [subprocess.Popen([sys.executable, "-c", code.replace("ME", str(me))], cwd=here,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for me in range(1, n + 1)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    opened = [float((sync / f"opened.{me}").read_text()) for me in range(1, n + 1)]
    assert max(opened) < open_within, f"an instance took {max(opened):.1f} s to open"
    return opened


class Gluster:
    """The test GlusterFS volume through its two FUSE mounts: two clients with caches of their
    own, as two nodes see one shared filesystem (the Rust tests' volume, started by
    ``tier_tests::gluster`` if it is not up)."""

    def __init__(self):
        root = Path(__file__).resolve().parents[3]
        cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
        out = subprocess.run([cargo, "run", "--quiet", "-p", "tier-tests", "--bin", "gluster-mounts"],
                             cwd=root, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(f"the GlusterFS test volume did not start: {out.stderr[-2000:]}")
        self.a, self.b = (Path(line) for line in out.stdout.split())

    def folder(self, name):
        """A fresh folder of the volume: its path through each mount."""
        unique = f"{name}-{os.getpid()}-{time.time_ns()}"
        (self.a / unique).mkdir()
        deadline = time.monotonic() + 30
        while not (self.b / unique).is_dir():
            assert time.monotonic() < deadline, f"{unique} never showed through the second mount"
            time.sleep(0.05)
        return self.a / unique, self.b / unique


def two_instances(kind, tmp, gluster, access=None):
    """The tiers of two engine instances on one config: `kind`'s, or (``gluster``) a NIXL FILE
    folder of the GlusterFS volume, each instance through a mount of its own (two nodes);
    with `access`, its NIXL FILE tiers name it."""
    if kind == "gluster":
        tiers_by = [[{"kind": "nixl-file", "dirs": [str(f)], "path_mode": "on"}] for f in gluster.folder(kind)]
    else:
        tiers_by = [tier_configs(kind, tmp)] * 2
    if access:
        tiers_by = [[{**t, "access": access} if t["kind"] == "nixl-file" else t for t in tiers] for tiers in tiers_by]
    return tiers_by


@pytest.fixture(scope="session")
def gluster():
    return Gluster()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """A real S3 server (s3s-fs) on loopback, stopped by PID."""

    def __init__(self, root: Path):
        if not os.access(S3S_BIN, os.X_OK):
            raise RuntimeError(f"s3s-fs not found at {S3S_BIN}: run scripts/setup.sh s3")
        self.data = root / "s3data"
        self.data.mkdir()
        self.proc = None
        self.port = free_port()
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            [S3S_BIN, "--host", "127.0.0.1", "--port", str(self.port), "--access-key", ACCESS,
             "--secret-key", SECRET, str(self.data)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("s3s-fs did not start")

    def stop(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def bucket(self):
        name = f"b{uuid.uuid4().hex[:12]}"
        (self.data / name).mkdir()
        return name


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    server = S3Server(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


@pytest.fixture
def silent_endpoint():
    """An HTTP endpoint that accepts connections and never answers (storage that hangs)."""
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held, stop = [], threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    t.join(timeout=5)
    for conn in held:
        conn.close()
    listener.close()


def silent_object_tier(endpoint, timeout="3s"):
    """An object tier on a server that never answers: every call fails after `timeout`."""
    return {"kind": "object", "store": "s3", "prefix": "p", "bucket": "b", "endpoint": endpoint,
            "access_key": "k", "secret_key": "s", "op_timeout": timeout}


def s3_params(server, bucket):
    return {"endpoint": server.endpoint, "bucket": bucket, "access_key": ACCESS,
            "secret_key": SECRET, "region": "us-east-1"}


def tier_configs(kind, tmp: Path, server=None):
    """The tiers list for one backend kind."""
    if kind == "mem":
        return [{"kind": "mem", "capacity": "256MiB", "policy": "lru"}]
    if kind == "nixl-file-path":
        return [{"kind": "nixl-file", "dirs": [str(tmp / "disk")], "path_mode": "on"}]
    if kind == "nixl-file-fd":
        return [{"kind": "nixl-file", "dirs": [str(tmp / "disk")], "path_mode": "off"}]
    if kind == "nixl-obj":
        return [{"kind": "nixl-obj", "prefix": "kv", "checksum": "required", "transfer_timeout": "10s",
                 **s3_params(server, server.bucket())}]
    if kind == "object":
        return [{"kind": "object", "store": "s3", "prefix": "kv", "op_timeout": "10s",
                 **s3_params(server, server.bucket())}]
    if kind == "mem-over-nixl-file":
        return [{"kind": "mem", "capacity": "256KiB", "policy": "lru"},
                {"kind": "nixl-file", "dirs": [str(tmp / "disk")]}]
    raise ValueError(kind)


KINDS = ["mem", "nixl-file-path", "nixl-file-fd", "nixl-obj", "object", "mem-over-nixl-file"]


@pytest.fixture
def tmp(tmp_path):
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)
