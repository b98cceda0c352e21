"""The package on a plain interpreter (no torch, no engine): the Python 3.10 run uses these."""

import json
import select
import sys
from pathlib import Path

import numpy as np
import pytest

import kvtier
from kvtier import _engine

MEM = {"tiers": [{"kind": "mem", "capacity": "16MiB"}]}


def keys(n: int, tag: str = "a") -> list[str]:
    return [f"{tag}{i:063x}" for i in range(n)]


def test_pages_of_every_buffer_kind_round_trip() -> None:
    wide = np.arange(2048, dtype=np.float16)  # items of 2 bytes: viewed as its bytes
    pages = [b"x" * 4096, bytearray(b"y" * 4096), memoryview(b"z" * 4096), wide, [b"h" * 8, b"t" * 8]]
    with kvtier.Store(MEM) as store:
        ks = keys(len(pages))
        assert store.put(ks, pages) == [None] * len(pages)
        assert store.exists(k for k in ks) == len(pages)  # any iterable of keys
        out = [bytearray(4096), bytearray(4096), bytearray(4096), np.zeros(2048, np.float16), [bytearray(8), bytearray(8)]]
        assert store.get_into(ks, out) == [True] * len(pages)
        assert bytes(out[0]) == b"x" * 4096 and bytes(out[2]) == b"z" * 4096
        assert (out[3] == wide).all()
        assert bytes(out[4][0]) + bytes(out[4][1]) == b"h" * 8 + b"t" * 8
        assert store.remove(iter(ks[:1])) == [True]
        assert store.exists(ks) == 0


def test_configs_from_paths_of_both_formats(tmp_path: Path) -> None:
    toml = tmp_path / "h.toml"
    toml.write_text('[[tiers]]\nkind = "mem"\ncapacity = "1MiB"\n')
    js = tmp_path / "h.json"
    js.write_text(json.dumps(MEM))
    for config in (toml, str(toml), js):
        with kvtier.Store(config) as store:
            assert store.kinds == ["mem"]
    with pytest.raises(kvtier.ConfigError, match="cannot read config"):
        kvtier.Store(tmp_path / "missing.toml")
    with pytest.raises(kvtier.ConfigError, match="tiers"):
        kvtier.Store({"tiers": []})


def test_errors_are_the_builtins_they_match() -> None:
    assert issubclass(kvtier.ConfigError, ValueError)
    assert issubclass(kvtier.InvalidKey, ValueError)
    assert issubclass(kvtier.InvalidBuffer, BufferError)
    assert issubclass(kvtier.Timeout, TimeoutError) and issubclass(kvtier.Timeout, OSError)
    with kvtier.Store(MEM) as store:
        with pytest.raises(TypeError):
            store.exists("a" * 64)  # one string is not a list of keys
        with pytest.raises(kvtier.InvalidBuffer):
            store.get_into(keys(1), [b"read-only"])


def test_a_completion_queue_answers_on_its_eventfd() -> None:
    with kvtier.Store(MEM) as store:
        queue = store.completion_queue()
        ks = keys(2, "q")
        put = queue.submit_put(ks, [b"1" * 64, b"2" * 64])
        ready, _, _ = select.select([queue.event_fd()], [], [], 5.0)
        assert ready, "no completion within 5 s"
        done = dict(queue.drain())
        assert done[put] == [None, None]
        queue.close()


def test_engine_configs_are_read_without_a_toml_module(tmp_path: Path) -> None:
    path = tmp_path / "engine.toml"
    path.write_text('[[tiers]]\nkind = "mem"\ncapacity = "1MiB"\n')
    config = _engine.load_config({"config": str(path)})
    assert config["tiers"][0]["kind"] == "mem"
    assert sys.version_info >= (3, 10)


def test_the_engines_read_a_key_file_only_as_the_store_does(tmp_path: Path) -> None:
    """The adapters' namespace secret comes from a regular file of this user, mode 600, read
    from the descriptor checked; a link (to a file that passes), a FIFO, a loose mode or a huge
    file gives none, and nothing waits. (It was read by path, through links and FIFOs.)"""
    import os

    secret = tmp_path / "secret"
    secret.write_bytes(b"a secret of enough bytes\n")
    secret.chmod(0o600)
    link = tmp_path / "link"
    link.symlink_to(secret)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    loose = tmp_path / "loose"
    loose.write_bytes(b"a secret of enough bytes\n")
    loose.chmod(0o644)
    huge = tmp_path / "huge"
    huge.write_bytes(b"k" * (1 << 20))
    huge.chmod(0o600)

    def read(path: Path) -> bytes | None:
        return _engine.integrity_secret({"tiers": [{"kind": "mem", "integrity": {"key_file": str(path)}}]})

    assert read(secret) == b"a secret of enough bytes"
    for planted in (link, fifo, loose, huge):
        assert read(planted) is None, planted.name


def test_engine_instance_locks_are_made_as_the_store_makes_its_files(tmp_path: Path) -> None:
    """An engine instance's folder is made 0700 and its lock file 0600 whatever the umask, and a
    lock file planted as a link is never opened through it. (It was made under the umask, the
    file 0644, through any link.)"""
    import os
    import stat

    old = os.umask(0o022)
    try:
        folder = tmp_path / "kv"
        fd = _engine._claim(str(folder), 0)
        assert fd is not None
        os.close(fd)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE((folder / ".instance-0.lock").stat().st_mode) == 0o600
        victim = tmp_path / "victim"
        victim.write_bytes(b"precious")
        (folder / ".instance-1.lock").symlink_to(victim)
        with pytest.raises(kvtier.ConfigError, match="instance lock"):
            _engine._claim(str(folder), 1)
        assert victim.read_bytes() == b"precious"
    finally:
        os.umask(old)
