"""The native prefetch ring (DenseStore streams, no transform): its batches
follow the sampler, it resumes exactly with batches in flight, fills caller
buffers, surfaces a gather's error at its step, lives from the first batch
to close and works beside Python streams; and the memory it writes is never
freed under it (close racing a blocked next(), interrupts storming next())."""
from __future__ import annotations

import gc
import os
import sys
import time

import numpy as np
import pytest

from loaderx import DenseStore, RaggedStore, Zrecord
from loaderx.dataloader import DataLoader
from loaderx.zsampler import Sampler
from _fakes import (
    FakeRaggedStore,
    LENGTH,
    consume_in_thread,
    dense_rows,
    expected_indices,
    import_zrecord,
    indices_of,
    jitter,
    ragged_rows,
    run_script,
    take,
    worker_threads,
)

pytestmark = pytest.mark.usefixtures("no_thread_leaks")


# -- the native prefetch ring (DenseStore streams, no transform) ----------------------


def native_thread_count():
    """Threads of this process as the kernel sees them (native ones included)."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("needs /proc/self/task (Linux)")
    return len(os.listdir("/proc/self/task"))


@pytest.fixture
def dense_pair(tmp_path):
    """Two real DenseStores of LENGTH records: x int64 (2,) rows, y = 7 i + 3."""
    zrecord = import_zrecord()
    x = zrecord.DenseStore(str(tmp_path / "x"), np.int64, (2,), codec="zstd")
    y = zrecord.DenseStore(str(tmp_path / "y"), np.int64, (), codec="raw")
    try:
        x.append(dense_rows(LENGTH))
        y.append(np.arange(LENGTH, dtype=np.int64) * 7 + 3)
        yield {"x": x, "y": y}
    finally:
        x.close()
        y.close()


@pytest.mark.parametrize("workers, prefetch", [(1, 1), (2, 4), (3, 2)])
@pytest.mark.parametrize("mode", ["SEQUENTIAL", "IID", "CYCLIC"])
def test_ring_batches_follow_the_sampler(dense_pair, workers, prefetch, mode):
    with DataLoader(dense_pair, 24, mode=mode, seed=9, workers=workers, prefetch=prefetch) as loader:
        for step in range(40):
            batch = next(loader)
            expected = expected_indices(step, 24, mode=getattr(Sampler.Mode, mode), seed=9)
            assert list(batch) == ["x", "y"]
            assert batch["x"].dtype == np.int64 and batch["x"].shape == (24, 2)
            assert batch["y"].dtype == np.int64 and batch["y"].shape == (24,)
            np.testing.assert_array_equal(batch["x"], dense_rows(LENGTH)[expected])
            np.testing.assert_array_equal(batch["y"], expected * 7 + 3)


def test_ring_resumes_exactly_with_batches_in_flight(dense_pair):
    with DataLoader(dense_pair, 16, seed=2, workers=2, prefetch=3) as reference:
        expected = [indices_of(next(reference)) for _ in range(30)]
    with DataLoader(dense_pair, 16, seed=2, workers=2, prefetch=3) as loader:
        take(loader, 9)
        time.sleep(0.02)  # let the ring fill its window
        state = loader.state_dict()
        assert state["step"] == 9
        take(loader, 5)
        loader.load_state_dict(state)
        for step in range(9, 30):
            np.testing.assert_array_equal(indices_of(next(loader)), expected[step])
    with DataLoader(dense_pair, 16, seed=2, workers=1, step=20) as resumed:
        np.testing.assert_array_equal(indices_of(next(resumed)), expected[20])


def test_ring_fills_caller_buffers(dense_pair):
    count = 2 + 2 + 1
    buffers = {
        "x": [np.empty((8, 2), dtype=np.int64) for _ in range(count)],
        "y": [np.empty((8,), dtype=np.int64) for _ in range(count)],
    }
    with DataLoader(dense_pair, 8, seed=4, workers=2, prefetch=2, out=buffers) as loader:
        for step in range(25):
            batch = next(loader)
            assert batch["x"] is buffers["x"][step % count]
            assert batch["y"] is buffers["y"][step % count]
            np.testing.assert_array_equal(batch["y"], expected_indices(step, 8, seed=4) * 7 + 3)


def test_ring_gather_error_surfaces_at_its_step(tmp_path):
    """A damaged record fails exactly the step that reads it; earlier steps arrive."""
    zrecord = import_zrecord()
    from _lxformat import LOC, flip

    rows = np.repeat(np.arange(100, dtype=np.int64)[:, None], 64, axis=1)  # compressible
    path = tmp_path / "z"
    with zrecord.DenseStore(str(path), np.int64, (64,), codec="zstd") as store:
        store.append(rows)
    victim = 57
    with open(path / "index", "rb") as f:
        f.seek(victim * LOC.size)
        offset, stored, *_ = LOC.unpack(f.read(LOC.size))
    flip(path / "data", offset + stored // 2, 0x20)
    with zrecord.DenseStore(str(path)) as store:
        loader = DataLoader({"x": store}, 10, mode="SEQUENTIAL", workers=2, prefetch=3)
        for step in range(5):
            np.testing.assert_array_equal(next(loader)["x"], rows[step * 10:(step + 1) * 10])
        with pytest.raises(zrecord.CorruptStoreError, match=f"record {victim}") as excinfo:
            next(loader)
        assert str(path) in str(excinfo.value)
        if sys.version_info >= (3, 11):  # (exception notes are new in 3.11)
            notes = getattr(excinfo.value, "__notes__", [])
            assert any("step 5" in note for note in notes), notes
        with pytest.raises(RuntimeError, match="stopped after an error at step 5"):
            next(loader)
        loader.close()


def test_ring_store_closed_under_a_running_loader(dense_pair):
    """Closing a store the ring reads never unmaps it under the threads: the
    first step built afterwards fails with ClosedError naming the store."""
    zrecord = import_zrecord()
    loader = DataLoader(dense_pair, 8, workers=2, prefetch=2)
    take(loader, 3)
    dense_pair["y"].close()
    with pytest.raises(zrecord.ClosedError, match="closed") as excinfo:
        for _ in range(10):
            next(loader)
    assert dense_pair["y"].path in str(excinfo.value)
    loader.close()
    # The ring let go of the store: its path opens again, writable.
    with zrecord.DenseStore(dense_pair["y"].path) as again:
        again.append(np.array([1], dtype=np.int64))


def test_ring_threads_live_from_first_batch_to_close(dense_pair):
    # Batches of 8 small records run inline in each gather (below the pool's
    # threshold), so the only native threads that come and go are the ring's.
    before = native_thread_count()
    loader = DataLoader(dense_pair, 8, workers=3)
    assert native_thread_count() == before  # nothing starts before the first next()
    next(loader)
    assert native_thread_count() >= before + 3
    assert worker_threads() == []  # no Python worker threads: nothing for Python to do
    loader.close()
    assert native_thread_count() == before
    loader = DataLoader(dense_pair, 8, workers=2)
    next(loader)
    del loader
    gc.collect()
    assert native_thread_count() == before


def test_ring_close_from_another_thread_stops_the_consumer(tmp_path):
    zrecord = import_zrecord()
    with zrecord.DenseStore(str(tmp_path / "big"), np.uint8, (64 << 10,), codec="raw") as store:
        store.append(np.zeros((64, 64 << 10), dtype=np.uint8))
        loader = DataLoader({"x": store}, 64, workers=1, prefetch=1)
        consumer, outcome = consume_in_thread(loader)
        time.sleep(0.2)
        loader.close()
        consumer.join(5.0)
        assert not consumer.is_alive()
        assert "closed" in str(outcome["error"])


def test_ring_and_python_streams_together(dense_pair):
    """DenseStores go through the ring, other streams and the transform through
    Python workers; the batch keeps the streams' order."""
    streams = {"r": FakeRaggedStore(ragged_rows(LENGTH), np.int32), **dense_pair}
    with DataLoader(streams, 12, seed=1, workers=2, transform=jitter) as loader:
        for step in range(20):
            batch = next(loader)
            expected = expected_indices(step, 12, seed=1)
            assert list(batch) == ["r", "x", "y"]
            np.testing.assert_array_equal(batch["y"], expected * 7 + 3)
            np.testing.assert_array_equal(batch["x"][:, 0], expected)
            assert [list(r) for r in batch["r"]] == [list(ragged_rows(LENGTH)[i]) for i in expected]


# Ragged and byte stores are built by the native ring: no Python thread.
def test_ragged_and_bytes_stores_are_built_without_python_threads(tmp_path):
    rs = RaggedStore(tmp_path / "r", np.int32)
    rs.append([np.arange(i % 7, dtype=np.int32) + i for i in range(300)])
    z = Zrecord(tmp_path / "z", create=True)
    z.append([bytes([i % 256]) * (i % 9) for i in range(300)])
    ids = DenseStore(tmp_path / "i", np.int64, ())
    ids.append(np.arange(300, dtype=np.int64))
    with DataLoader({"tok": rs, "raw": z, "id": ids}, 16, seed=4, workers=2) as loader:
        for _ in range(20):
            b = next(loader)
            assert worker_threads() == []
            for t, r, i in zip(b["tok"], b["raw"], b["id"].tolist()):
                np.testing.assert_array_equal(t, rs[i])
                assert r == z[i]
    with DataLoader({"tok": rs, "id": ids}, 16, seed=4, workers=1, packed=True) as loader:
        b = next(loader)
        values, splits = b["tok"]
        assert splits[0] == 0 and len(splits) == 17
        for k, i in enumerate(b["id"].tolist()):
            np.testing.assert_array_equal(values[splits[k]:splits[k + 1]], rs[i])
    for s in (rs, z, ids):
        s.close()


# -- ownership of the memory the ring writes --------------------------------------------

# A child process, so that a crash is a test failure and not a dead pytest. It
# builds loaders over a store of 256 KiB records (batches of 2 MiB, in pooled
# memory), closes each from the main thread while another thread is blocked in
# next(), and meanwhile keeps allocating arrays of the batch's shape from the
# pool, filled with a pattern: none may change afterwards.
CLOSE_RACE = r"""
import random, sys, threading, time
import numpy as np
from loaderx import DataLoader, DenseStore, _buffers

path, setting, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
if setting == "unmap":
    _buffers.POOL.configure(max_idle_bytes=0)
store = DenseStore(path)
shape = (8,) + tuple(store.item_shape)
PATTERN = 0xA5  # the store holds bytes below 100
overwritten = allocated = 0
for r in range(rounds):
    loader = DataLoader({"x": store}, 8, seed=r, workers=2, prefetch=2)
    started = threading.Event()

    def consume():
        try:
            while True:
                next(loader)
                started.set()
        except RuntimeError:  # LoaderClosedError
            started.set()

    consumer = threading.Thread(target=consume)
    consumer.start()
    started.wait()
    time.sleep(random.random() * 0.003)
    held, stop = [], threading.Event()

    def allocate():
        while not stop.is_set() or len(held) < 8:
            a = _buffers.empty(shape, np.uint8)
            a.fill(PATTERN)
            held.append(a)

    allocator = threading.Thread(target=allocate)
    allocator.start()
    loader.close()
    consumer.join()
    stop.set()
    allocator.join()
    time.sleep(0.002)
    allocated += len(held)
    overwritten += sum(1 for a in held if not (a == PATTERN).all())
    del held
print(f"ok overwritten={overwritten} of {allocated}")
"""


def big_record_store(path, count=64):
    """A zstd store of `count` records of 256 KiB (bytes < 100): slow enough
    gathers that a close lands while the ring writes a batch."""
    zrecord = import_zrecord()
    rng = np.random.default_rng(0)
    with zrecord.DenseStore(str(path), np.uint8, (256 << 10,), codec="zstd") as store:
        for _ in range(count // 16):
            store.append(rng.integers(0, 100, (16, 256 << 10), dtype=np.uint8))
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["default", "unmap"])
def test_close_racing_a_blocked_next_never_frees_a_batch_the_ring_writes(tmp_path, setting):
    """close() woke the consumer blocked in next(), which dropped its step's
    pooled array before the ring's threads were joined: they went on writing
    into it (SIGSEGV when the pool unmaps returned blocks; with the defaults,
    arrays handed out meanwhile were overwritten)."""
    out = run_script(CLOSE_RACE, big_record_store(tmp_path / "s"), setting, 300)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stderr[-3000:]}"
    assert out.stdout.startswith("ok overwritten=0 "), out.stdout


INTERRUPT_STORM = r"""
import sys
from _storm import storm_next
from loaderx import DataLoader, DenseStore, _buffers

path, count = sys.argv[1], int(sys.argv[2])
_buffers.POOL.configure(max_idle_bytes=0)
store = DenseStore(path)
with DataLoader({"x": store}, 4, seed=9, workers=1) as reference:
    want = [next(reference)["x"][:, ::4096].copy() for _ in range(count)]
with DataLoader({"x": store}, 4, seed=9, workers=2) as loader:
    got, after_return, interrupts = storm_next(
        loader, count, lambda batch: batch["x"][:, ::4096].copy(), period_s=0.0002,
        deadline_s=120, unarm_after_interrupt=True)
steps = [step for step, _ in got]
assert sorted(steps + after_return) == list(range(count)), (steps, after_return)
for step, g in got:
    assert (g == want[step]).all(), f"step {step}"
print(f"ok interrupts={interrupts} lost_by_the_caller={len(after_return)}")
"""


@pytest.mark.slow
def test_interrupts_storming_next_never_free_a_batch_the_ring_writes(tmp_path):
    """An exception from a signal handler between taking a step's buffers and
    the native wait dropped them while the ring built that step: SIGSEGV with
    the pool set to unmap returned blocks. Now: no crash, the exact batches,
    and no interrupt lands inside the pool's bookkeeping either."""
    out = run_script(INTERRUPT_STORM, big_record_store(tmp_path / "s"), 300)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stderr[-3000:]}"
    assert out.stdout.startswith("ok"), out.stdout
    assert int(out.stdout.split("interrupts=")[1].split()[0]) >= 10, out.stdout
    assert "Exception ignored" not in out.stderr, out.stderr[-3000:]
