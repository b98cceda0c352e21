"""The memory a call touches stays the caller's object's for the whole call: tensors held (or
staged in kvtier's own bytes when torch may move them), zero-length and oversized regions
refused or handled, read-only tensor memory never written."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import weakref

import kvtier
import numpy as np
import pytest
import torch
from test_completions import drain_until


def dram_store():
    return kvtier.Store({"tiers": [{"kind": "mem", "capacity": "16MiB"}]})


def page(i, n=4096):
    return bytes((i * 7 + j) % 251 for j in range(n))


def test_a_queued_read_holds_its_tensor_until_drained():
    with dram_store() as store:
        store.put(["t"], [page(1)])
        q = store.completion_queue()
        target = torch.empty(4096, dtype=torch.uint8)
        alive = weakref.ref(target)
        qid = q.submit_get_into(["t"], [target])
        del target
        gc.collect()
        assert alive() is not None, "the tensor was released while kvtier may still write it"
        assert drain_until(q, [qid])[qid] == [True]
        gc.collect()
        assert alive() is None, "the drain releases it"
        q.close()


def test_a_queued_put_holds_or_copies_its_tensor():
    with dram_store() as store:
        q = store.completion_queue()
        src = torch.frombuffer(bytearray(page(2)), dtype=torch.uint8)
        qid = q.submit_put(["p"], [src])
        src.zero_()
        assert drain_until(q, [qid])[qid] == [None]
        out = bytearray(4096)
        assert store.get_into(["p"], [out]) == [True]
        # A fixed storage is lent in place, so the zeroing may or may not be seen; the page is
        # whole either way: every byte the original or every byte zero.
        assert bytes(out) in (page(2), bytes(4096))


def test_a_tensor_resized_during_a_queued_read_gets_an_error_not_a_write_into_freed_memory():
    with dram_store() as store:
        store.put(["r"], [page(3)])
        q = store.completion_queue()
        target = torch.empty(4096, dtype=torch.uint8)
        qid = q.submit_get_into(["r"], [target])
        target.resize_(1 << 20)  # torch reallocates: the old memory is freed
        (result,) = drain_until(q, [qid])[qid]
        assert isinstance(result, kvtier.InvalidBuffer), result
        assert "resized" in str(result) and result.key == "r"
        q.close()


def test_a_resizable_tensor_read_with_the_blocking_call_lands():
    with dram_store() as store:
        store.put(["b"], [page(4)])
        target = torch.zeros(2048, dtype=torch.float16)
        assert store.get_into(["b"], [target]) == [True]
        assert bytes(target.view(torch.uint8).numpy()) == page(4)


def test_a_fixed_tensor_is_lent_in_place_and_its_storage_cannot_be_resized_while_held():
    with dram_store() as store:
        store.put(["f"], [page(5)])
        q = store.completion_queue()
        arr = np.zeros(4096, dtype=np.uint8)
        target = torch.from_numpy(arr)
        qid = q.submit_get_into(["f"], [target])
        with pytest.raises(RuntimeError):
            target.resize_(1 << 20)
        assert drain_until(q, [qid])[qid] == [True]
        assert bytes(arr) == page(5)
        q.close()


def test_a_queued_read_keeps_its_numpy_array_and_bytearray_from_being_resized():
    """What holding a buffer export promises: a bytearray cannot be resized while kvtier may
    write it (BufferError), nor a numpy array by ``resize`` with its default reference check
    (kvtier's reference fails it). ``resize(refcheck=False)`` skips that check, and numpy
    frees the memory whatever views of it exist: the caller's promise, as for any view."""
    with dram_store() as store:
        store.put(["n", "b"], [page(6), page(7)])
        q = store.completion_queue()
        arr = np.zeros(4096, dtype=np.uint8)
        buf = bytearray(4096)
        qid = q.submit_get_into(["n", "b"], [arr, buf])
        with pytest.raises(ValueError, match="resize"):
            arr.resize(1 << 20)
        with pytest.raises(BufferError):
            buf.extend(bytes(1 << 20))
        assert drain_until(q, [qid])[qid] == [True, True]
        assert bytes(arr) == page(6) and bytes(buf) == page(7)
        arr.resize(1 << 20)  # drained: kvtier holds it no more
        buf.extend(b"x")
        q.close()


class HugeTensor:
    """Claims more bytes than an address space holds."""

    device = None

    def data_ptr(self):
        return 4096

    def is_contiguous(self):
        return True

    def numel(self):
        return 1 << 62

    def element_size(self):
        return 8


def test_a_tensor_whose_byte_length_overflows_is_refused():
    with dram_store() as store:
        with pytest.raises(kvtier.InvalidBuffer, match="larger than memory"):
            store.put(["h"], [HugeTensor()])


def test_a_zero_length_region_at_address_zero_is_refused_as_an_empty_page():
    with dram_store() as store:
        (result,) = store.put_regions(["z"], [0], [0])
        assert isinstance(result, kvtier.InvalidPage), result
        (result,) = store.put(["z"], [[(0, 0), page(6)]])
        assert result is None
        out = bytearray(4096)
        assert store.get_into(["z"], [[(0, 0), out]]) == [True]
        assert bytes(out) == page(6)


def test_a_tensor_over_read_only_memory_is_refused_for_reads(tmp_path):
    # In a child: were kvtier to write into the read-only mapping, the process would die of
    # SIGSEGV, which the test reports rather than suffers.
    path = tmp_path / "ro.bin"
    path.write_bytes(bytes(4096))
    code = textwrap.dedent(
        f"""
        import warnings
        import numpy as np, torch, kvtier
        warnings.simplefilter("ignore")
        arr = np.memmap({str(path)!r}, dtype=np.uint8, mode="r")
        target = torch.from_numpy(arr)
        with kvtier.Store({{"tiers": [{{"kind": "mem", "capacity": "1MiB"}}]}}) as store:
            store.put(["ro"], [bytes(range(256)) * 16])
            try:
                store.get_into(["ro"], [target])
            except kvtier.InvalidBuffer as e:
                print("refused:", e)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert "refused:" in done.stdout and "read-only" in done.stdout, done.stdout
