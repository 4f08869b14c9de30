"""The DataLoader's errors, shutdown and validation: a transform's or a
gather's error surfaces at its step (and keeps being raised), StopIteration
from user code is an error and not the end; close() is prompt, idempotent
and final, also from another thread, a context manager and garbage
collection stop the threads, which start lazily; bad arguments and output
buffers are refused by name."""
from __future__ import annotations

import gc
import time
import traceback
import weakref

import numpy as np
import pytest
from _helpers import within

from loaderx import DenseStore, RaggedStore
from loaderx.dataloader import DataLoader
from loaderx.errors import ClosedError, LoaderClosedError
from _fakes import (
    FakeDenseStore,
    consume_in_thread,
    dense_rows,
    expected_indices,
    fake_streams,
    identity,
    import_zrecord,
    indices_of,
    take,
    worker_threads,
)

pytestmark = pytest.mark.usefixtures("no_thread_leaks")


# -- errors ---------------------------------------------------------------------------


class Boom(Exception):
    pass


@pytest.mark.parametrize("workers", [1, 3])
def test_transform_error_surfaces_at_its_step(workers):
    fail_step = 7
    fail_index = expected_indices(fail_step, 10, mode="sequential")[0]
    raised = []

    def failing_transform(batch):
        if batch["x"][0, 0] == fail_index:
            error = Boom(f"bad batch at step {fail_step}")
            raised.append(error)
            raise error
        return batch

    loader = DataLoader(fake_streams(), 10, mode="sequential", workers=workers, prefetch=4, transform=failing_transform)
    for step in range(fail_step):
        np.testing.assert_array_equal(indices_of(next(loader)), np.arange(10) + 10 * step)
    with pytest.raises(Boom, match="bad batch at step 7") as excinfo:
        next(loader)
    assert excinfo.value is raised[0]
    frames = [frame.name for frame in traceback.extract_tb(excinfo.value.__traceback__)]
    assert "failing_transform" in frames
    assert loader.state_dict()["step"] == fail_step
    assert worker_threads() == []

    with pytest.raises(RuntimeError, match="stopped after an error at step 7") as later:
        next(loader)
    assert later.value.__cause__ is raised[0]
    with pytest.raises(RuntimeError, match="stopped after an error"):
        loader.load_state_dict(loader.state_dict())
    loader.close()


def test_gather_error_surfaces_at_its_step():
    fail_step = 3
    fail_index = int(expected_indices(fail_step, 10)[0])
    loader = DataLoader(fake_streams(fail_on=fail_index), 10, workers=2)
    take(loader, fail_step)
    with pytest.raises(OSError, match=f"injected read error at index {fail_index}") as excinfo:
        next(loader)
    frames = [frame.name for frame in traceback.extract_tb(excinfo.value.__traceback__)]
    assert "gather" in frames
    loader.close()


@pytest.mark.parametrize("transform", [None, identity])
def test_a_ring_that_cannot_start_keeps_raising_its_error(tmp_path, transform):
    """A store closed before the first batch: the first next() raised
    ClosedError, the second an empty AssertionError (no transform) or blocked
    forever (with one)."""
    ds = DenseStore(tmp_path / "x", np.int64, ())
    ds.append(np.arange(10, dtype=np.int64))
    loader = DataLoader({"x": ds}, 4, workers=1, transform=transform)
    ds.close()
    try:
        for _ in range(2):
            with pytest.raises(ClosedError, match="closed"):
                within(lambda: next(loader))
    finally:
        loader.close()


def raise_stop_iteration(batch):
    raise StopIteration


class ExhaustedStream:
    """A Python stream whose gather leaks a StopIteration."""

    kind = "dense"
    dtype = np.dtype(np.int64)
    item_shape = ()

    def __len__(self):
        return 10

    def gather(self, indices, out=None):
        return next(iter(()))


@pytest.mark.parametrize("where", ["transform", "stream"])
def test_stop_iteration_from_user_code_is_an_error_not_the_end(store, where):
    """A StopIteration escaping a transform or a stream's gather ended a
    ``for batch in loader`` loop silently, as if the data had run out."""
    if where == "transform":
        loader = DataLoader({"x": store}, 4, workers=1, transform=raise_stop_iteration)
    else:
        loader = DataLoader({"x": ExhaustedStream()}, 4, workers=1)
    with loader, pytest.raises(RuntimeError, match="StopIteration.*step 0") as info:
        for _ in loader:
            pass
    assert isinstance(info.value.__cause__, StopIteration)


@pytest.mark.parametrize("transform", [None, identity])
def test_a_batch_that_cannot_be_packed_stops_the_loader_at_its_step(tmp_path, transform):
    """Records without common trailing dimensions under packed=True: with
    no transform, the failing step raised ValueError and the next next()
    silently went on with the step after it."""
    with RaggedStore(tmp_path / "r", np.int32) as rs:
        rs.append([np.zeros((2, 3), np.int32), np.zeros((1, 4), np.int32)])
        with DataLoader({"r": rs}, 2, mode="sequential", workers=1, packed=True,
                        transform=transform) as loader:
            with pytest.raises(ValueError, match="trailing dimensions"):
                next(loader)
            with pytest.raises(RuntimeError, match="stopped after an error at step 0"):
                next(loader)


# -- shutdown -------------------------------------------------------------------------


def test_close_is_prompt_while_another_thread_is_blocked():
    def slow(batch):
        time.sleep(0.3)
        return batch

    loader = DataLoader(fake_streams(), 8, workers=2, prefetch=1, transform=slow)
    consumer, outcome = consume_in_thread(loader)
    time.sleep(0.45)  # The consumer is now waiting inside next().
    start = time.perf_counter()
    loader.close()
    elapsed = time.perf_counter() - start
    consumer.join(1.0)
    assert elapsed < 1.0
    assert not consumer.is_alive()
    assert isinstance(outcome["error"], LoaderClosedError)
    assert isinstance(outcome["error"], RuntimeError)
    assert "closed" in str(outcome["error"])
    assert worker_threads() == []


def test_close_is_idempotent_and_final():
    loader = DataLoader(fake_streams(), 8, workers=3)
    next(loader)
    assert len(worker_threads()) == 3
    assert {thread.name for thread in worker_threads()} == {f"loaderx-worker-{i}" for i in range(3)}
    loader.close()
    loader.close()
    assert loader.closed
    assert worker_threads() == []
    with pytest.raises(LoaderClosedError, match="closed"):
        next(loader)
    with pytest.raises(ClosedError, match="closed"):
        loader.load_state_dict(loader.state_dict())


def test_context_manager_closes():
    with DataLoader(fake_streams(), 8, workers=2) as loader:
        next(loader)
    assert loader.closed
    assert worker_threads() == []


def test_garbage_collection_stops_threads():
    loader = DataLoader(fake_streams(), 8, workers=2)
    next(loader)
    reference = weakref.ref(loader)
    del loader
    gc.collect()
    assert reference() is None
    assert worker_threads() == []


def test_threads_start_lazily():
    loader = DataLoader(fake_streams(), 8, workers=2)
    assert worker_threads() == []
    loader.load_state_dict(dict(loader.state_dict(), step=5, position=5 * 8))
    assert worker_threads() == []
    np.testing.assert_array_equal(indices_of(next(loader)), expected_indices(5, 8))
    loader.close()


# -- validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(streams={}), ValueError, "streams is empty"),
        (dict(streams=[FakeDenseStore(dense_rows(4))]), TypeError, "must be a dict"),
        (dict(streams={"x": [np.zeros(2)] * 4}), TypeError, "stream 'x' is not a loaderx store.*list"),
        (
            dict(streams={"x": FakeDenseStore(dense_rows(10)), "y": FakeDenseStore(dense_rows(9))}),
            ValueError,
            "same length, got \\{'x': 10, 'y': 9\\}",
        ),
        (dict(streams={"x": FakeDenseStore(dense_rows(0))}), ValueError, "stream 'x' is empty \\(len 0\\)"),
        (dict(batch_size=0), ValueError, "batch_size must be in \\[1, .*got 0"),
        (dict(batch_size=-3), ValueError, "batch_size must be in \\[1, .*got -3"),
        (dict(batch_size=2.5), TypeError, "batch_size must be an integer, got float 2.5"),
        (dict(prefetch=0), ValueError, "prefetch must be >= 1, got 0"),
        (dict(workers=0), ValueError, "workers must be >= 1, got 0"),
        (dict(workers=True), TypeError, "workers must be an int, got True"),
        (dict(workers=257), ValueError, "workers must be <= 256, got 257"),
        (dict(prefetch=1 << 16, workers=1), ValueError, "prefetch \\+ workers must be <= 65536, got 65536 \\+ 1"),
        (dict(step=-1), ValueError, "step must be in \\[0, .*got -1"),
        (dict(shard=(2, 2)), ValueError, "shard rank must be in \\[0, world\\), got shard=\\(2, 2\\)"),
        (dict(shard=(-1, 2)), ValueError, "shard rank must be in \\[0, world\\), got shard=\\(-1, 2\\)"),
        (dict(shard=(0, 0)), ValueError, "shard world must be in \\[1, .*got shard=\\(0, 0\\)"),
        (dict(shard=(0,)), ValueError, "shard must be a \\(rank, world\\) pair, got \\(0,\\)"),
        (dict(shard=(0.0, 2)), TypeError, "shard rank must be an integer, got float 0.0"),
        (dict(mode="shuffled"), ValueError, "mode must be one of .*got 'shuffled'"),
        (dict(transform=3), TypeError, "transform must be callable"),
        (dict(seed="a"), TypeError, "seed must be an integer, got str 'a'"),
        (dict(seed=-1), ValueError, "seed must be in \\[0, .*got -1"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, message):
    kwargs = dict(kwargs)
    streams = kwargs.pop("streams", fake_streams())
    with pytest.raises(error, match=message):
        DataLoader(streams, **kwargs)


def test_real_stores_of_unequal_length_are_refused(tmp_path):
    zrecord = import_zrecord()
    with zrecord.DenseStore(str(tmp_path / "a"), np.int64, (2,)) as a, zrecord.DenseStore(
        str(tmp_path / "b"), np.float32, ()
    ) as b, zrecord.DenseStore(str(tmp_path / "c"), np.float32, ()) as c:
        a.append(dense_rows(10))
        b.append(np.zeros(9, np.float32))
        with pytest.raises(ValueError, match="same length, got \\{'a': 10, 'b': 9\\}"):
            DataLoader({"a": a, "b": b})
        with pytest.raises(ValueError, match="stream 'c' is empty"):
            DataLoader({"c": c})


def test_epoch_of_checks_its_step(store):
    """epoch_of("x") raised int()'s "invalid literal", epoch_of(2.7) and
    epoch_of(-5) answered."""
    with DataLoader({"x": store}, 10, workers=1) as loader:
        assert loader.epoch_of(20) == 1
        with pytest.raises(TypeError, match="step must be an int"):
            loader.epoch_of(2.7)
        with pytest.raises(TypeError, match="step must be an int"):
            loader.epoch_of("x")
        with pytest.raises(ValueError, match="step must be >= 0, got -5"):
            loader.epoch_of(-5)
