"""The DataLoader's batches: content and order (every mode follows the
sampler, whatever the workers and prefetch), bounded memory, recycled output
buffers, and the hand-off to frameworks (torch.from_numpy, DLPack).

Most tests run twice: on small in-memory fake stores with the store
interface (always), and on real DenseStore/RaggedStore files."""
from __future__ import annotations

import os
import threading
import time
import weakref

import numpy as np
import pytest

from loaderx.dataloader import DataLoader
from loaderx.zsampler import Sampler
from _fakes import (
    FakeBytesStore,
    FakeDenseStore,
    FakeRaggedStore,
    LENGTH,
    dense_rows,
    expected_indices,
    fake_streams,
    indices_of,
    jitter,
    ragged_rows,
    run_script,
    take,
)

pytestmark = pytest.mark.usefixtures("no_thread_leaks")


# -- content and order ----------------------------------------------------------------


def test_dense_streams_stack_and_ragged_streams_list(streams):
    with DataLoader(streams, batch_size=16, seed=3, workers=2) as loader:
        for step in range(5):
            batch = next(loader)
            want = expected_indices(step, 16, seed=3)
            assert set(batch) == {"x", "r"}
            assert isinstance(batch["x"], np.ndarray)
            assert batch["x"].shape == (16, 2)
            assert batch["x"].dtype == np.int64
            assert batch["x"].flags.c_contiguous
            np.testing.assert_array_equal(batch["x"][:, 0], want)
            np.testing.assert_array_equal(batch["x"][:, 1], 3 * want + 1)
            assert isinstance(batch["r"], list)
            assert len(batch["r"]) == 16
            for record, index in zip(batch["r"], want):
                assert record.dtype == np.int32
                np.testing.assert_array_equal(record, np.full(index % 5, index, dtype=np.int32))


def test_bytes_stream_gives_list_of_bytes():
    records = [f"record-{i}".encode() for i in range(50)]
    with DataLoader({"b": FakeBytesStore(records)}, batch_size=4, workers=1) as loader:
        batch = next(loader)
    want = expected_indices(0, 4, length=50)
    assert batch["b"] == [records[i] for i in want]


@pytest.mark.parametrize("workers", [1, 2, 4])
@pytest.mark.parametrize("prefetch", [1, 2, 3, 4])
def test_same_batches_whatever_workers_and_prefetch(workers, prefetch):
    reference = [expected_indices(step, 32, seed=11) for step in range(40)]
    with DataLoader(fake_streams(), 32, seed=11, workers=workers, prefetch=prefetch, transform=jitter) as loader:
        for step, want in enumerate(reference):
            assert loader.step == step
            np.testing.assert_array_equal(indices_of(next(loader)), want)


@pytest.mark.parametrize("mode", list(Sampler.Mode))
def test_every_mode_follows_the_sampler(mode, streams):
    with DataLoader(streams, 24, mode=mode, seed=5, workers=3, prefetch=2) as loader:
        for step in range(12):
            want = expected_indices(step, 24, mode=mode, seed=5)
            np.testing.assert_array_equal(indices_of(next(loader)), want)


@pytest.mark.parametrize("length, batch_size, shard", [(10, 4, None), (1000, 300, None),
                                                        (97, 8, (1, 3)), (250, 16, (0, 4))])
def test_cyclic_batches_never_repeat_a_record(length, batch_size, shard):
    """Each cycle serves length // global batch whole batches and drops the
    rest: no batch repeats a record, not even across a cycle's end."""
    g = batch_size * (shard[1] if shard else 1)
    per_cycle = length // g
    with DataLoader(fake_streams(length), batch_size, seed=3, shard=shard, workers=2) as loader:
        assert loader.steps_per_epoch == per_cycle
        for step in range(3 * per_cycle + 1):
            got = indices_of(next(loader))
            assert len(set(got.tolist())) == batch_size, f"step {step} repeats a record"
            np.testing.assert_array_equal(
                got, expected_indices(step, batch_size, seed=3, shard=shard, length=length))
            assert loader.epoch_of(step) == step // per_cycle


def test_cyclic_global_batch_larger_than_the_records_is_refused():
    with pytest.raises(ValueError, match="CYCLIC.*12.*> length 10.*IID"):
        DataLoader(fake_streams(10), 4, shard=(0, 3))
    with DataLoader(fake_streams(10), 4, shard=(0, 3), mode="iid", workers=1) as loader:
        assert indices_of(next(loader)).shape == (4,)


def test_mode_accepts_names():
    with DataLoader(fake_streams(), 8, mode="sequential", workers=1) as loader:
        assert loader.state_dict()["mode"] == "SEQUENTIAL"
        np.testing.assert_array_equal(indices_of(next(loader)), np.arange(8))


def test_iteration_is_endless_and_has_no_len():
    with DataLoader(fake_streams(length=10), 4, workers=2) as loader:
        assert iter(loader) is loader
        assert bool(loader)
        with pytest.raises(TypeError, match="endless"):
            len(loader)
        for count, _ in enumerate(loader):
            if count == 30:  # 12 epochs of 10 records: iteration never stops.
                break
        assert loader.step == 31


def test_default_workers_follow_affinity():
    import os

    with DataLoader(fake_streams(), 8) as loader:
        want = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        assert loader.workers == want


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs sched_setaffinity and two usable cores")
def test_the_library_counts_the_cores_this_process_may_use():
    """One source of the core count: the library's (lx_lanes), which honours
    the affinity mask a process starts with (Python re-derived it before)."""
    script = ("import os\n"
              "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
              "import numpy as np\n"
              "from loaderx import DataLoader, _lib\n"
              "loader = DataLoader({'x': np.zeros((10, 2))}, 2)\n"
              "print(_lib.usable_cores(), loader.workers)\n")
    out = run_script(script)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "1"]


def test_repr_describes_the_loader():
    loader = DataLoader(fake_streams(), 8, seed=2, workers=1, prefetch=3)
    next(loader)
    text = repr(loader)
    for part in ("x: dense", "batch_size=8", "CYCLIC", "seed=2", "workers=1", "prefetch=3", "step=1", "open"):
        assert part in text
    loader.close()
    assert "closed" in repr(loader)


# -- bounded memory -------------------------------------------------------------------


def test_batches_alive_stay_bounded():
    workers, prefetch = 3, 2
    lock = threading.Lock()
    count = {"alive": 0, "peak": 0}

    class Tracked:
        def __init__(self):
            with lock:
                count["alive"] += 1
                count["peak"] = max(count["peak"], count["alive"])
            weakref.finalize(self, self.release)

        @staticmethod
        def release():
            with lock:
                count["alive"] -= 1

    loader = DataLoader(fake_streams(), 8, workers=workers, prefetch=prefetch, transform=lambda batch: Tracked())
    with loader:
        for step in range(40):
            batch = next(loader)
            if step % 10 == 0:
                time.sleep(0.05)  # A slow consumer: the workers fill the window.
            del batch
    # The window holds prefetch + workers batches; the consumer holds one more.
    assert count["peak"] <= prefetch + workers + 1
    assert count["peak"] >= prefetch + 1


# -- recycled output buffers ----------------------------------------------------------


def test_recycled_output_buffers(streams):
    workers, prefetch, spare = 2, 2, 3
    count = workers + prefetch + spare
    buffers = [np.empty((8, 2), dtype=np.int64) for _ in range(count)]
    with DataLoader(streams, 8, seed=6, workers=workers, prefetch=prefetch, out={"x": buffers}) as loader:
        held = []
        for step in range(30):
            batch = next(loader)
            assert batch["x"] is buffers[step % count] or np.shares_memory(batch["x"], buffers[step % count])
            held.append((step, batch["x"]))
            # The contract: a batch stays valid for `spare` more batches.
            held = held[-spare:]
            for held_step, array in held:
                np.testing.assert_array_equal(array[:, 0], expected_indices(held_step, 8, seed=6))
            if step % 4 == 0:
                time.sleep(0.01)


def test_recycled_buffers_after_restore():
    buffers = [np.empty((8, 2), dtype=np.int64) for _ in range(4)]
    with DataLoader(fake_streams(), 8, workers=1, prefetch=2, out={"x": buffers}) as loader:
        take(loader, 5)
        loader.load_state_dict(dict(loader.state_dict(), step=2, position=2 * 8))
        for step in range(2, 12):
            np.testing.assert_array_equal(indices_of(next(loader)), expected_indices(step, 8))


@pytest.mark.parametrize(
    "out, error, message",
    [
        ({"x": [np.empty((8, 2), np.int64)] * 2}, ValueError, "needs at least prefetch \\+ workers \\+ 1 = 4"),
        ({"y": []}, ValueError, "stream 'y'"),
        ({"r": []}, ValueError, "only for dense streams"),
        ({"x": np.empty((4, 8, 2), np.int64)}, TypeError, "must be a list"),
        ({"x": [np.empty((8, 2), np.int32) for _ in range(4)]}, ValueError, "int32\\[8, 2\\], the stream needs int64\\[8, 2\\]"),
        ({"x": [np.empty((7, 2), np.int64) for _ in range(4)]}, ValueError, "the stream needs int64\\[8, 2\\]"),
        ({"x": [np.empty((8, 4), np.int64)[:, :2] for _ in range(4)]}, ValueError, "C-contiguous"),
        ({"x": [np.empty((8, 2), np.int64)] * 4}, ValueError, "must not share memory"),
    ],
)
def test_bad_output_buffers_are_refused(out, error, message):
    streams = {"x": FakeDenseStore(dense_rows(LENGTH)), "r": FakeRaggedStore(ragged_rows(LENGTH), np.int32)}
    with pytest.raises(error, match=message):
        DataLoader(streams, 8, workers=1, prefetch=2, out=out)


# -- framework hand-off ---------------------------------------------------------------


def test_torch_from_numpy_shares_memory(streams):
    torch = pytest.importorskip("torch")
    with DataLoader(streams, 8, workers=1) as loader:
        array = next(loader)["x"]
    tensor = torch.from_numpy(array)
    assert tensor.data_ptr() == array.ctypes.data
    array[0, 0] = -5
    assert int(tensor[0, 0]) == -5


def test_dlpack_round_trip_is_zero_copy(streams):
    if not hasattr(np, "from_dlpack"):
        pytest.skip(f"numpy {np.__version__} has no from_dlpack (added in 1.22)")
    with DataLoader(streams, 8, workers=1) as loader:
        array = next(loader)["x"]
    view = np.from_dlpack(array)
    assert view.ctypes.data == array.ctypes.data
    np.testing.assert_array_equal(view, array)
    assert view.dtype == np.int64
    assert view.shape == (8, 2)


def test_pooled_outputs_never_overwrite_a_batch_still_held(tmp_path):
    """Dense outputs of 1 MiB and more come from the buffer pool: batches (and
    views of them) that the consumer keeps stay intact; dropped ones go back
    to the pool and are reused, so steady state maps no new memory."""
    from loaderx import _buffers
    from loaderx.zrecord import DenseStore
    width = 8192  # 32 records x 32 KiB = 1 MiB per batch: pooled
    assert 32 * width * 4 >= _buffers.POOL.min_bytes
    data = np.arange(600 * width, dtype=np.int32).reshape(600, width)
    with DenseStore(tmp_path / "d", np.int32, (width,), codec="raw") as ds:
        ds.append(data)
        created = _buffers.POOL.stats()["created"]
        with DataLoader({"x": ds}, batch_size=32, seed=3, workers=2, prefetch=2) as loader:
            kept, views, pointers = [], [], set()
            for step in range(40):
                batch = next(loader)
                x = batch["x"]
                assert not x.flags.owndata
                pointers.add(x.ctypes.data)
                if step % 3 == 0:
                    kept.append((step, x))
                elif step % 3 == 1:
                    views.append((step, x[1:5]))
                del batch, x
            reference = DataLoader({"x": ds}, batch_size=32, seed=3, workers=1, prefetch=1)
            expected = [next(reference)["x"].copy() for _ in range(40)]
            reference.close()
            for step, x in kept:
                np.testing.assert_array_equal(x, expected[step])
            for step, v in views:
                np.testing.assert_array_equal(v, expected[step][1:5])
            # Every third batch was dropped at once: their blocks were reused.
            assert len(pointers) < 40
            new_blocks = _buffers.POOL.stats()["created"] - created
            held = len(kept) + len(views)
            assert new_blocks <= held + 2 * (2 + 2 + 1) + 1, (new_blocks, held)
