"""Tests of the stream protocol (loaderx.streams): what the DataLoader reads
and how — numpy arrays, native parts with rows (a subset of a store's
records), and the prefetch hook (called for each step before the native ring
builds it, in step order; its error fails that step at its step)."""
from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

from loaderx import (ArrayStream, DataLoader, DenseStore, Mixture, NativePart, RaggedStore,
                     ShardSet, Stream, TokenWindows)
from loaderx.zsampler import Sampler
from _helpers import loader_threads


pytestmark = pytest.mark.usefixtures("no_thread_leaks")


@pytest.fixture
def store(tmp_path):
    """A raw dense store whose record i is (i, 10 i), 300 records."""
    index = np.arange(300, dtype=np.int64)
    with DenseStore(tmp_path / "x", np.int64, (2,), codec="raw") as ds:
        ds.append(np.stack([index, 10 * index], axis=1))
        yield ds


# ----------------------------------------------------------------- the protocol


def test_every_loaderx_stream_is_a_stream(store, tmp_path):
    with RaggedStore(tmp_path / "r", np.int32) as docs:
        docs.append([np.arange(9, dtype=np.int32)] * 3)
        windows = TokenWindows(docs, seq_len=4)
        for stream in (store, docs, ShardSet([store]), windows, windows.segments,
                       ArrayStream(np.zeros((3, 2)))):
            assert isinstance(stream, Stream), stream
        assert store.native_parts() == [NativePart(store.native_parts()[0].handle, 0, None)]
        assert windows.native_windows()[2] is False and windows.segments.native_windows()[2]
    assert not isinstance(object(), Stream)


# ----------------------------------------------------------------- numpy arrays


def test_numpy_arrays_are_read_only_streams():
    x = np.arange(400, dtype=np.float32).reshape(200, 2)
    y = np.arange(200, dtype=np.int16)
    before = (x.copy(), y.copy(), x.flags.writeable)
    with DataLoader({"x": x, "y": y}, 16, seed=3, workers=2) as loader:
        for step in range(20):
            batch = next(loader)
            want = Sampler(200, 16, Sampler.Mode.CYCLIC, 3).at(step)
            np.testing.assert_array_equal(batch["x"], x[want])
            np.testing.assert_array_equal(batch["y"], y[want])
            batch["x"][:] = -1  # the batch is the caller's; the array is untouched
    np.testing.assert_array_equal(x, before[0])
    np.testing.assert_array_equal(y, before[1])
    assert x.flags.writeable == before[2]


def test_numpy_arrays_next_to_stores_and_in_a_mixture(store):
    labels = np.arange(300, dtype=np.int64) * 7
    with DataLoader({"x": store, "label": labels}, 12, seed=1, workers=1) as loader:
        for _ in range(10):
            batch = next(loader)
            np.testing.assert_array_equal(batch["label"], batch["x"][:, 0] * 7)
    mix = Mixture({"a": {"v": np.zeros(50, np.int64)}, "b": {"v": np.ones(30, np.int64)}},
                  {"a": 1, "b": 1})
    with DataLoader(mix, 10, workers=1) as loader:
        batch = next(loader)
        np.testing.assert_array_equal(batch["v"], batch["source"])
    with pytest.raises(TypeError, match="Python objects"):
        DataLoader({"x": np.array([object()] * 3)})


# ----------------------------------------------------------------- native parts with rows


class Subset:
    """A stream of some of a store's records, read natively through rows."""

    def __init__(self, store, rows):
        self.store, self.rows = store, np.asarray(rows, dtype=np.uint64)
        self.kind, self.dtype, self.item_shape = "dense", store.dtype, store.item_shape

    def __len__(self):
        return len(self.rows)

    def gather(self, indices, out=None):
        return self.store.gather(self.rows[np.asarray(indices, dtype=np.int64)], out=out)

    def native_parts(self):
        return [NativePart(self.store.native_parts()[0].handle, 0, self.rows)]


def test_native_parts_with_rows_read_the_records_they_name(store):
    rows = np.arange(3, 300, 7, dtype=np.uint64)  # 43 records
    subset = Subset(store, rows)
    with DataLoader({"x": subset}, 8, mode="sequential", workers=2) as loader:
        seen = []
        for _ in range(11):
            batch = next(loader)
            assert loader_threads() == []
            seen.extend(batch["x"][:, 0].tolist())
    want = [int(rows[i % 43]) for i in range(88)]
    assert seen == want


def test_rows_past_the_store_fail_their_step(store):
    subset = Subset(store, [0, 1, 2, 299, 300])
    with DataLoader({"x": subset}, 5, mode="sequential", workers=1) as loader:
        with pytest.raises(Exception, match="out of range"):
            next(loader)


class PythonRagged:
    """A ragged stream that is a plain Python object (no native parts)."""

    kind = "ragged"
    dtype = np.dtype(np.int32)
    item_shape = None

    def __len__(self):
        return 50

    def gather(self, indices, out=None):
        return [np.full(i % 3, i, np.int32) for i in np.asarray(indices)]


def test_packed_ragged_output_for_python_streams_too(tmp_path):
    """packed=True (then spelled ragged="packed") gave (values, row_splits)
    for stores but still a list for a ragged stream that is a Python object."""
    with RaggedStore(tmp_path / "r", np.int32) as rs:
        rs.append([np.full(i % 3, i, np.int32) for i in range(50)])
        with DataLoader({"r": rs, "p": PythonRagged()}, 6, workers=1,
                        packed=True) as loader:
            for _ in range(3):
                batch = next(loader)
                values, splits = batch["p"]
                assert values.dtype == np.int32 and splits.dtype == np.int64
                np.testing.assert_array_equal(values, batch["r"][0])
                np.testing.assert_array_equal(splits, batch["r"][1])


# ----------------------------------------------------------------- prefetch


class Prefetched:
    """A stream over a store that only holds the records its prefetch asked
    for: prefetch(indices) appends every record up to max(indices), so a ring
    that built a step before its prefetch returned would read past the store."""

    def __init__(self, store, length, delay=0.0, fail_at=None):
        self.store, self.length, self.delay, self.fail_at = store, length, delay, fail_at
        self.kind, self.dtype, self.item_shape = "dense", store.dtype, store.item_shape
        self.calls = []
        self.lock = threading.Lock()

    def __len__(self):
        return self.length

    def gather(self, indices, out=None):
        return self.store.gather(indices, out=out)

    def native_parts(self):
        return self.store.native_parts()

    def prefetch(self, indices):
        assert indices.dtype == np.uint64
        with self.lock:
            self.calls.append((threading.current_thread().name, indices.copy()))
            if self.fail_at is not None and len(self.calls) > self.fail_at:
                raise KeyError(f"prefetch call {len(self.calls)}")
        time.sleep(self.delay)
        with self.lock:
            need = int(indices.max()) + 1
            have = len(self.store)
            if need > have:
                start = np.arange(have, need, dtype=np.int64)
                self.store.append(np.stack([start, 10 * start], axis=1))


@pytest.fixture
def growing(tmp_path):
    with DenseStore(tmp_path / "g", np.int64, (2,), codec="raw") as ds:
        ds.append(np.zeros((0, 2), np.int64))
        yield ds


@pytest.mark.parametrize("transform", [None, lambda b: b])
@pytest.mark.parametrize("delay", [0.0, 0.003])
def test_a_step_is_built_only_after_its_prefetch_returned(growing, transform, delay):
    stream = Prefetched(growing, 400, delay=delay)
    with DataLoader({"x": stream}, 10, mode="sequential", workers=2, prefetch=3,
                    transform=transform) as loader:
        for step in range(30):
            np.testing.assert_array_equal(next(loader)["x"][:, 0], np.arange(10) + 10 * step)
    # In step order, on the loader's prefetch thread, with the step's indices,
    # and never more than the window ahead of the consumer.
    steps = [int(indices[0]) // 10 for _, indices in stream.calls]
    assert steps == list(range(len(steps)))
    assert 30 <= len(steps) <= 30 + 3 + 2
    assert {name for name, _ in stream.calls} == {"loaderx-prefetch"}
    for step, (_, indices) in enumerate(stream.calls):
        np.testing.assert_array_equal(indices, np.arange(10) + 10 * step)


def _raises_at_step(loader, step, error, match):
    """The next next() raises a prefetch hook's `error`, noted with `step`."""
    with pytest.raises(error, match=match) as info:
        next(loader)
    if sys.version_info >= (3, 11):  # (exception notes are new in 3.11)
        notes = getattr(info.value, "__notes__", [])
        assert any(f"prefetch hook for step {step}" in note for note in notes), notes


@pytest.mark.parametrize("transform", [None, lambda b: b])
def test_a_failed_prefetch_fails_its_step_at_its_step(growing, transform):
    stream = Prefetched(growing, 400, fail_at=4)
    loader = DataLoader({"x": stream}, 10, mode="sequential", workers=2, transform=transform)
    for step in range(4):
        np.testing.assert_array_equal(next(loader)["x"][:, 0], np.arange(10) + 10 * step)
    _raises_at_step(loader, 4, KeyError, "prefetch call 5")
    with pytest.raises(RuntimeError, match="stopped after an error at step 4"):
        next(loader)
    loader.close()


class Warm(Prefetched):
    """A stream whose prefetch_warm says whether the records are in the store
    already (it fetches nothing: prefetch appends them)."""

    def __init__(self, store, length, warm_error=None):
        super().__init__(store, length)
        self.warm_calls = []
        self.warm_error = warm_error

    def prefetch_warm(self, indices):
        with self.lock:
            self.warm_calls.append(indices.copy())
            if self.warm_error is not None:
                raise self.warm_error
            return int(indices.max()) < len(self.store)


def test_a_run_of_cached_steps_costs_one_prefetch_warm_call(growing):
    stream = Warm(growing, 4000)
    stream.prefetch(np.arange(4000, dtype=np.uint64))  # everything present
    stream.calls.clear()
    with DataLoader({"x": stream}, 10, mode="sequential", workers=2, prefetch=4) as loader:
        for step in range(60):
            np.testing.assert_array_equal(next(loader)["x"][:, 0], np.arange(10) + 10 * step)
    # Each call holds whole steps, laid end to end in step order; the calls
    # follow each other and stay within the window (6 steps); prefetch is
    # called only for runs of one step (never asked: a lone step is
    # prefetched as it is).
    got = np.concatenate([indices for indices in stream.warm_calls])
    np.testing.assert_array_equal(got[:len(got) // 10 * 10], np.arange(len(got) // 10 * 10))
    lengths = [len(indices) for indices in stream.warm_calls]
    assert all(n % 10 == 0 and 20 <= n <= 60 for n in lengths)
    assert max(lengths) >= 30 and len(stream.warm_calls) <= 60 // 2
    assert all(len(indices) == 10 for _, indices in stream.calls)
    assert len(stream.calls) + len(stream.warm_calls) < 60 // 2


def test_a_run_that_is_not_cached_is_prefetched_step_by_step(growing):
    # Nothing is present: every run is asked once, then prefetched per step,
    # each step released once its own prefetch returned.
    stream = Warm(growing, 4000)
    with DataLoader({"x": stream}, 10, mode="sequential", workers=2, prefetch=4) as loader:
        for step in range(40):
            np.testing.assert_array_equal(next(loader)["x"][:, 0], np.arange(10) + 10 * step)
    steps = [int(indices[0]) // 10 for _, indices in stream.calls]
    assert steps == list(range(len(steps))) and len(steps) >= 40
    assert all(len(indices) == 10 for _, indices in stream.calls)
    assert stream.warm_calls


def test_a_failing_prefetch_warm_falls_back_to_prefetch_and_its_failures(growing):
    stream = Warm(growing, 400, warm_error=OSError("cannot tell"))
    original = stream.prefetch

    def prefetch(indices):  # fails for step 7's records
        if np.isin(np.arange(70, 80), indices).any():
            raise KeyError("no step 7")
        original(indices)
    stream.prefetch = prefetch
    loader = DataLoader({"x": stream}, 10, mode="sequential", workers=2, prefetch=4)
    for step in range(7):
        np.testing.assert_array_equal(next(loader)["x"][:, 0], np.arange(10) + 10 * step)
    _raises_at_step(loader, 7, KeyError, "no step 7")
    loader.close()
    assert stream.warm_calls


def test_with_prefetch_bytes_prefetch_warm_is_not_asked(growing):
    stream = Warm(growing, 1000)
    with DataLoader({"x": stream}, 10, mode="sequential", workers=2, prefetch=4,
                    prefetch_bytes=10**6) as loader:
        for step in range(20):
            np.testing.assert_array_equal(next(loader)["x"][:, 0], np.arange(10) + 10 * step)
    assert {len(indices) for _, indices in stream.calls} == {10}
    assert stream.warm_calls == []


def test_prefetch_continues_from_a_restored_state(growing):
    stream = Prefetched(growing, 1000, delay=0.001)
    with DataLoader({"x": stream}, 10, mode="sequential", workers=2, prefetch=2) as loader:
        for _ in range(5):
            next(loader)
        state = loader.state_dict()
        for _ in range(3):
            next(loader)
        loader.load_state_dict(dict(state, step=40, position=400))
        np.testing.assert_array_equal(next(loader)["x"][:, 0], np.arange(400, 410))
        loader.load_state_dict(state)
        for step in range(5, 9):
            np.testing.assert_array_equal(next(loader)["x"][:, 0], np.arange(10) + 10 * step)


def test_a_mixture_prefetches_each_source_its_own_records(tmp_path):
    sources, streams = {}, {}
    for k, n in enumerate((60, 40)):
        ds = DenseStore(tmp_path / f"s{k}", np.int64, (2,), codec="raw")
        ds.append(np.zeros((0, 2), np.int64))
        streams[k] = Prefetched(ds, n)
        sources[f"s{k}"] = {"x": streams[k]}
    with DataLoader(Mixture(sources, {"s0": 3, "s1": 1}), 8, seed=2, workers=1) as loader:
        batches = [next(loader) for _ in range(6)]
    for k in (0, 1):
        calls = streams[k].calls[:6]
        for batch, (_, indices) in zip(batches, calls):
            np.testing.assert_array_equal(indices, batch["x"][batch["source"] == k][:, 0])
        streams[k].store.close()


def test_close_waits_for_a_prefetch_in_progress(growing):
    stream = Prefetched(growing, 400, delay=0.2)
    loader = DataLoader({"x": stream}, 10, mode="sequential", workers=1, prefetch=1)
    next(loader)
    loader.close()
    assert loader_threads() == []


# ----------------------------------------------------------------- prefetch_bytes


class Watched(Prefetched):
    """Records, at each prefetch, how many steps (this one included) are
    prefetched and not yet delivered; `size`: its prefetch_size per call."""

    def __init__(self, store, length, size=None):
        super().__init__(store, length)
        self.loader = None
        self.ahead = []
        self.far = threading.Event()
        if size is not None:
            self.prefetch_size = lambda indices: size

    def prefetch(self, indices):
        super().prefetch(indices)
        ahead = int(indices[0]) // 10 - self.loader.step + 1  # steps of 10 records
        self.ahead.append(ahead)
        if ahead > 3:
            self.far.set()


def _watched_run(stream, steps, **options):
    with DataLoader({"x": stream}, 10, mode="sequential", workers=2, prefetch=8,
                    **options) as loader:
        stream.loader = loader
        for step in range(steps):
            np.testing.assert_array_equal(next(loader)["x"][:, 0], np.arange(10) + 10 * step)
            if step == 0 and "prefetch_bytes" not in options:
                # Unbounded, the hooks run up to the window (10 steps) ahead.
                assert stream.far.wait(30)
    return stream.ahead


def test_prefetch_bytes_bounds_the_steps_prefetched_ahead(growing):
    assert max(_watched_run(Watched(growing, 1000), 20)) > 3  # the window alone
    # A dense stream's step is record size x records: 10 x 16 bytes.
    assert _most_ahead(_watched_run(Watched(growing, 1000), 40, prefetch_bytes=3 * 160)) <= 3
    # prefetch_size says what a prefetch fetches: 1000 bytes a step, 2 fit.
    assert _most_ahead(_watched_run(Watched(growing, 1000, size=1000), 40,
                                    prefetch_bytes=2500)) <= 2
    # A step larger than the budget is prefetched alone, and the loader goes on.
    assert set(_watched_run(Watched(growing, 1000, size=10**9), 15, prefetch_bytes=1)) == {1}


def _most_ahead(aheads):
    assert aheads, "no prefetch ran"
    return max(aheads)


def test_prefetch_bytes_is_checked(growing):
    for bad, error in ((0, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="prefetch_bytes"):
            DataLoader({"x": Prefetched(growing, 100)}, 10, prefetch_bytes=bad)

    class RaggedPrefetched(Prefetched):
        def __init__(self, store, length):
            super().__init__(store, length)
            self.kind = "ragged"

    with pytest.raises(ValueError, match="stream 'docs' has a prefetch hook but no size: give "
                                         "it prefetch_size"):
        DataLoader({"docs": RaggedPrefetched(growing, 100)}, 10, prefetch_bytes=1000)
    # Without a budget it needs no size; a bad size fails its step.
    DataLoader({"docs": RaggedPrefetched(growing, 100)}, 10).close()
    stream = Prefetched(growing, 100)
    stream.prefetch_size = lambda indices: -1
    with DataLoader({"x": stream}, 10, prefetch_bytes=1000, workers=1) as loader:
        with pytest.raises(ValueError, match="prefetch_size\\(\\) must return a byte count"):
            next(loader)


def test_the_loader_prefetches_only_streams_that_say_they_are_remote(tmp_path):
    """A local store is read by the native ring alone; its `prefetch` is
    never called per step (a Python hook per step cut warm 200 B batches
    2.6-9x: CHANGELOG.md, 2026-12-03). A store that says it is remote gets
    one call per step, with that step's indices."""
    calls = []

    class Remote(DenseStore):
        is_remote = True  # type: ignore[assignment]

        def prefetch(self, indices, *, wait=True):
            calls.append(len(indices))
            super().prefetch(indices, wait=wait)

    class Local(DenseStore):
        def prefetch(self, indices, *, wait=True):
            calls.append(-1)

    with DenseStore(tmp_path / "x", np.float32, (50,), codec="raw") as ds:
        ds.append(np.zeros((2000, 50), np.float32))
    for cls in (Remote, Local):
        with cls(tmp_path / "x") as store, DataLoader({"x": store}, 16, workers=1) as loader:
            for _ in range(5):
                next(loader)
    assert calls and set(calls) == {16}
