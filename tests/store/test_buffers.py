"""Tests of the output-buffer pool (`loaderx._buffers`) and of DenseStore
reads that use it; at the end, the native hand-out buffers of ragged reads.

The safety contract first: a block is handed out again only once every array
that views it (views, memoryviews, cffi buffers, arrays made with
`np.frombuffer` over it) is gone; then reuse once they are, the cap on idle
bytes, size classes, huge-page alignment, thread safety (blocks taken and
dropped on many threads, checked for a second owner writing into them), and
use after `fork`.
"""
from __future__ import annotations

import gc
import os
import queue
import sys
import threading

import numpy as np
import pytest

from _helpers import ROOT
from loaderx import _buffers
from loaderx._buffers import HUGE_PAGE_BYTES, PAGE_BYTES, POOL
from loaderx._lib import ffi
from loaderx.zrecord import DenseStore


def address(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]


class Pool:
    """The library's one pool (`_buffers.POOL`) as a test sees it: emptied of
    idle blocks when the test starts, with counters from that moment on."""

    def __init__(self, max_idle_bytes: int, min_bytes: int):
        gc.collect()  # earlier tests' arrays come back now, not during the test
        POOL.configure(max_idle_bytes=0)  # keeps nothing: no idle block left over
        POOL.configure(max_idle_bytes=max_idle_bytes, min_bytes=min_bytes)
        self._start = POOL.stats()

    def empty(self, shape, dtype):
        return POOL.empty(shape, dtype)

    def configure(self, **bounds):
        POOL.configure(**bounds)

    def stats(self) -> dict:
        st = POOL.stats()
        for name in ("created", "reused", "returned", "unmapped", "outstanding"):
            st[name] -= self._start[name]
        return st


@pytest.fixture
def pool_of():
    """`pool_of(max_idle_bytes=..., min_bytes=1)`: the one pool, taking every
    request by default; its default bounds come back after the test."""
    yield lambda max_idle_bytes=64 << 20, min_bytes=1: Pool(max_idle_bytes, min_bytes)
    POOL.configure(max_idle_bytes=_buffers.MAX_IDLE_BYTES_DEFAULT,
                   min_bytes=_buffers.MIN_BYTES_DEFAULT)


# ----------------------------------------------------------------- the contract


def test_empty_gives_a_writable_array_of_the_asked_shape_and_dtype(pool_of):
    pool = pool_of()
    a = pool.empty((3, 5, 7), np.float32)
    assert a.shape == (3, 5, 7) and a.dtype == np.float32
    assert a.flags.c_contiguous and a.flags.writeable
    a[...] = np.arange(a.size, dtype=np.float32).reshape(a.shape)
    assert a[2, 4, 6] == a.size - 1
    assert address(a) % PAGE_BYTES == 0
    assert pool.stats()["outstanding"] == 1


def test_a_held_array_keeps_its_block(pool_of):
    pool = pool_of()
    a = pool.empty((PAGE_BYTES,), np.uint8)
    a[:] = 7
    b = pool.empty((PAGE_BYTES,), np.uint8)
    b[:] = 9
    assert address(a) != address(b)
    assert pool.stats()["created"] == 2 and pool.stats()["reused"] == 0
    assert (a == 7).all()


@pytest.mark.parametrize("holder", ["slice", "memoryview", "cffi", "frombuffer", "reshape"])
def test_any_view_keeps_the_block_out_of_the_pool(holder, pool_of):
    pool = pool_of()
    a = pool.empty((4, PAGE_BYTES), np.uint8)
    a[:] = 1
    start = address(a)
    held = {
        "slice": lambda x: x[1:3, ::2],
        "memoryview": memoryview,
        "cffi": ffi.from_buffer,
        "frombuffer": lambda x: np.frombuffer(x, np.uint8),
        "reshape": lambda x: x.reshape(-1),
    }[holder](a)
    del a
    gc.collect()
    assert pool.stats()["returned"] == 0
    for _ in range(3):
        c = pool.empty((4, PAGE_BYTES), np.uint8)
        assert address(c) != start
        c[:] = 2
        del c
    # The held view still reads what was written through the first array.
    seen = np.frombuffer(ffi.buffer(held), np.uint8) if holder == "cffi" else np.asarray(held)
    assert (seen == 1).all()
    del held, seen
    gc.collect()
    again = pool.empty((4, PAGE_BYTES), np.uint8)
    assert address(again) == start


def test_dropped_arrays_are_reused_most_recent_first(pool_of):
    pool = pool_of()
    a = pool.empty((2, PAGE_BYTES), np.uint8)
    b = pool.empty((2, PAGE_BYTES), np.uint8)
    first, second = address(a), address(b)
    del a
    del b
    st = pool.stats()
    assert st["returned"] == 2 and st["idle_blocks"] == 2 and st["outstanding"] == 0
    assert st["idle_bytes"] == 4 * PAGE_BYTES
    c = pool.empty((2, PAGE_BYTES), np.uint8)
    assert address(c) == second
    d = pool.empty((PAGE_BYTES * 2,), np.uint8)  # another shape of the same size
    assert address(d) == first
    assert pool.stats()["reused"] == 2 and pool.stats()["created"] == 2


def test_blocks_of_another_size_are_not_used(pool_of):
    pool = pool_of()
    a = pool.empty((PAGE_BYTES,), np.uint8)
    del a
    b = pool.empty((3 * PAGE_BYTES,), np.uint8)
    assert pool.stats()["reused"] == 0 and pool.stats()["idle_blocks"] == 1
    b[:] = 5  # all three pages are ours
    assert int(b.sum()) == 5 * 3 * PAGE_BYTES


def test_sizes_round_up_to_pages_and_share_a_class(pool_of):
    pool = pool_of()
    a = pool.empty((PAGE_BYTES + 1,), np.uint8)
    start = address(a)
    del a
    b = pool.empty((2 * PAGE_BYTES - 8,), np.uint8)
    assert address(b) == start


def test_small_and_object_requests_are_plain_numpy(pool_of):
    pool = pool_of(min_bytes=1 << 20)
    small = pool.empty((1000,), np.float64)
    assert small.flags.owndata
    assert pool.stats()["created"] == 0
    pool.configure(min_bytes=1)
    obj = pool.empty((PAGE_BYTES,), object)
    assert obj.flags.owndata and obj.dtype == object
    zero = pool.empty((0, 5), np.int32)
    assert zero.shape == (0, 5)


def test_cap_on_idle_bytes_is_honoured(pool_of):
    cap = 3 * PAGE_BYTES
    pool = pool_of(max_idle_bytes=cap)
    arrays = [pool.empty((PAGE_BYTES,), np.uint8) for _ in range(5)]
    assert pool.stats()["outstanding"] == 5  # in use: owned by the arrays, not capped
    del arrays
    gc.collect()
    st = pool.stats()
    assert st["idle_bytes"] == cap and st["idle_blocks"] == 3
    assert st["unmapped"] == 2 and st["outstanding"] == 0
    # A block larger than the cap is unmapped as soon as it comes back.
    big = pool.empty((4 * PAGE_BYTES,), np.uint8)
    del big
    assert pool.stats()["idle_bytes"] == cap and pool.stats()["unmapped"] == 3
    # Lowering the cap unmaps idle blocks now; zero keeps nothing.
    pool.configure(max_idle_bytes=PAGE_BYTES)
    assert pool.stats()["idle_bytes"] == PAGE_BYTES
    pool.configure(max_idle_bytes=0)
    assert pool.stats()["idle_bytes"] == 0 and pool.stats()["idle_blocks"] == 0
    again = pool.empty((PAGE_BYTES,), np.uint8)
    del again
    assert pool.stats()["idle_blocks"] == 0


def test_evicts_the_least_recently_returned_first(pool_of):
    pool = pool_of(max_idle_bytes=2 * PAGE_BYTES)
    a = pool.empty((PAGE_BYTES,), np.uint8)
    b = pool.empty((PAGE_BYTES,), np.uint8)
    c = pool.empty((PAGE_BYTES,), np.uint8)
    keep = {address(b), address(c)}
    del a, b, c
    x = pool.empty((PAGE_BYTES,), np.uint8)
    y = pool.empty((PAGE_BYTES,), np.uint8)
    assert {address(x), address(y)} == keep


def test_a_block_left_idle_goes_stale_and_is_unmapped(pool_of):
    pool = pool_of()
    odd = pool.empty((5 * PAGE_BYTES,), np.uint8)  # a one-off shape
    del odd
    for _ in range(_buffers.STALE_CHECKOUTS - 1):
        a = pool.empty((PAGE_BYTES,), np.uint8)
        del a
    assert pool.stats()["idle_blocks"] == 2  # not yet stale
    a = pool.empty((PAGE_BYTES,), np.uint8)
    del a  # the hand-back finds the odd block stale
    st = pool.stats()
    assert st["idle_blocks"] == 1 and st["idle_bytes"] == PAGE_BYTES and st["unmapped"] == 1


def test_a_zero_cap_unmaps_every_idle_block(pool_of):
    pool = pool_of()
    arrays = [pool.empty((PAGE_BYTES,), np.uint8) for _ in range(3)]
    del arrays
    pool.configure(max_idle_bytes=0)
    st = pool.stats()
    assert st["idle_blocks"] == 0 and st["idle_bytes"] == 0 and st["unmapped"] == 3


@pytest.mark.parametrize("value", [-1, 1.5, True, "big"])
def test_configure_refuses_bad_values(value, pool_of):
    with pytest.raises(ValueError, match="must be a non-negative int"):
        POOL.configure(max_idle_bytes=value)
    with pytest.raises(ValueError, match="min_bytes"):
        POOL.configure(min_bytes=value)


def test_large_blocks_start_on_a_huge_page(pool_of):
    pool = pool_of()
    a = pool.empty((3 * HUGE_PAGE_BYTES // 8,), np.int64)
    assert address(a) % HUGE_PAGE_BYTES == 0
    a[:] = 3
    assert int(a[-1]) == 3


# ----------------------------------------------------------------- threads and fork


def _churn(pool: Pool, token: int, rounds: int, handoff: queue.Queue, errors: list) -> None:
    try:
        rng = np.random.default_rng(token)
        kept = []
        for _ in range(rounds):
            rows = int(rng.integers(1, 4))
            a = pool.empty((rows, PAGE_BYTES // 8), np.int64)
            a[:] = token
            kept.append(a)
            if len(kept) > 3:
                b = kept.pop(0)
                # Another owner writing into this block would show up here.
                if not (b == token).all():
                    errors.append(f"thread {token}: a held block was overwritten")
                if rng.integers(2):
                    handoff.put(b)  # dropped by another thread
                del b
        for b in kept:
            if not (b == token).all():
                errors.append(f"thread {token}: a held block was overwritten")
    except Exception as exc:  # reported by the test
        errors.append(repr(exc))


def test_threads_never_share_a_block_and_the_cap_holds(pool_of):
    cap = 8 * PAGE_BYTES
    pool = pool_of(max_idle_bytes=cap)
    handoff: queue.Queue = queue.Queue()
    errors: list = []
    stop = threading.Event()

    def dropper() -> None:
        while not stop.is_set() or not handoff.empty():
            try:
                handoff.get(timeout=0.01)  # the array is dropped here, on this thread
            except queue.Empty:
                continue

    drop = threading.Thread(target=dropper)
    drop.start()
    workers = [
        threading.Thread(target=_churn, args=(pool, t + 1, 300, handoff, errors)) for t in range(4)
    ]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, inside the pool's code too
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(old)
        stop.set()
        drop.join()
    gc.collect()
    assert errors == []
    st = pool.stats()
    assert st["outstanding"] == 0
    assert st["created"] + st["reused"] == 4 * 300
    assert st["returned"] == 4 * 300
    assert st["idle_bytes"] <= cap
    assert st["reused"] > 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_pool_works_in_a_forked_child(pool_of):
    pool = pool_of()
    a = pool.empty((2, PAGE_BYTES), np.uint8)
    a[:] = 4
    del a
    pid = os.fork()
    if pid == 0:  # the child: reuse the inherited block, make a new one, exit
        try:
            b = pool.empty((2, PAGE_BYTES), np.uint8)
            c = pool.empty((2, PAGE_BYTES), np.uint8)
            b[:] = 1
            c[:] = 2
            ok = pool.stats()["reused"] == 1 and (b == 1).all() and (c == 2).all()
            os._exit(0 if ok else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's pool is untouched by the child.
    assert pool.stats()["idle_blocks"] == 1


# ----------------------------------------------------------------- DenseStore reads


@pytest.fixture
def big_records(tmp_path):
    """A raw store whose batches of 64 are 1 MiB: pooled by the default pool."""
    data = np.random.default_rng(5).integers(0, 1 << 30, (256, 4096), dtype=np.int32)
    with DenseStore(tmp_path / "s", np.int32, (4096,), codec="raw") as store:
        store.append(data)
    store = DenseStore(tmp_path / "s")
    yield store, data
    store.close()


def test_dense_reads_come_from_the_pool_and_stay_valid(big_records):
    store, data = big_records
    assert 64 * 4096 * 4 >= _buffers.POOL.min_bytes
    before = _buffers.POOL.stats()
    first = store[np.arange(64)]
    assert not first.flags.owndata and first.flags.writeable
    assert _buffers.POOL.stats()["outstanding"] == before["outstanding"] + 1
    second = store[np.arange(64, 128)]
    # Held: the second batch got other memory and the first is intact.
    assert address(first) != address(second)
    np.testing.assert_array_equal(first, data[:64])
    np.testing.assert_array_equal(second, data[64:128])
    start = address(first)
    del first
    third = store[np.arange(128, 192)]
    assert address(third) == start
    np.testing.assert_array_equal(third, data[128:192])
    np.testing.assert_array_equal(second, data[64:128])


def test_dense_small_batches_stay_plain_numpy(big_records):
    store, data = big_records
    one = store[3]
    few = store[np.array([1, 2])]
    assert few.flags.owndata
    np.testing.assert_array_equal(one, data[3])
    np.testing.assert_array_equal(few, data[1:3])


# ----------------------------------------------------------------- native hand-out buffers


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_large_ragged_batches_reuse_native_buffers_and_survive_fork(tmp_path, pool_of):
    """Ragged batches of >= 1 MiB come in buffers the library keeps for reuse
    when freed (src/outbuf.zig): held batches stay intact, dropped ones are
    reused, and a forked child reads correctly with its parent's idle buffers."""
    from loaderx import RaggedStore

    rng = np.random.default_rng(9)
    records = [rng.integers(0, 1 << 30, n, dtype=np.int32) for n in rng.integers(3000, 5000, 600)]
    with RaggedStore(tmp_path / "r", np.int32, codec="raw") as store:
        store.append(records)
    store = RaggedStore(tmp_path / "r")
    batches = [rng.integers(0, len(records), 256) for _ in range(8)]
    # The library's default bounds, no idle block left over, counters from now.
    pool = pool_of(max_idle_bytes=_buffers.MAX_IDLE_BYTES_DEFAULT,
                   min_bytes=_buffers.MIN_BYTES_DEFAULT)

    def check(batch, idx):
        assert len(batch) == len(idx)
        for got, i in zip(batch, idx):
            np.testing.assert_array_equal(got, records[i])

    held = store[batches[0]]  # ~4 MiB: a reused native buffer
    for idx in batches[1:4]:
        check(store[idx], idx)  # each dropped at once
    check(held, batches[0])
    st = pool.stats()
    # One block for the held batch, one for the first dropped one, which the
    # next two reuse.
    assert st["created"] <= 2 and st["reused"] >= 2, st
    assert st["outstanding"] == 1, st  # the held batch
    pid = os.fork()
    if pid == 0:
        try:
            for idx in batches[4:]:
                check(store[idx], idx)
            child = pool.stats()  # (the parent's counters, copied at the fork)
            if child["created"] != st["created"] or child["reused"] < st["reused"] + 4:
                os._exit(4)  # the child did not reuse its copy of the idle block
            os._exit(0)
        except BaseException:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    for idx in batches[4:]:
        check(store[idx], idx)
    check(held, batches[0])
    after = pool.stats()
    assert after["created"] == st["created"] and after["reused"] >= st["reused"] + 4, after
    store.close()


# ----------------------------------------------------------------- interpreter exit


def test_a_batch_still_held_at_interpreter_exit_is_freed_quietly(big_records):
    """A torch tensor holding a pooled batch at exit: the pool's finalizer ran
    after module teardown and printed "Exception ignored ... TypeError:
    unsupported operand type(s) for -: 'int' and 'NoneType'" (8 of 8 runs)."""
    pytest.importorskip("torch")
    import subprocess
    store, _ = big_records
    script = ("import sys, numpy as np, torch\n"
              "from loaderx import DenseStore\n"
              "s = DenseStore(sys.argv[1])\n"
              "t = torch.from_numpy(s[np.arange(64)])\n"
              "v = s[np.arange(64)][1:]\n")
    out = subprocess.run([sys.executable, "-c", script, store.path], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Exception ignored" not in out.stderr, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
