"""Tests for loaderx.dataloader.DataLoader: order, determinism, checkpoints,
errors, shutdown, validation, recycled buffers and framework hand-off.

Most tests run twice: on small in-memory fake stores with the store interface
(always), and on real DenseStore/RaggedStore files (skipped, with the reason,
only while ``loaderx.zrecord`` cannot be imported).
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import random
import threading
import time
import traceback
import weakref

import numpy as np
import pytest
from _helpers import counting_store, within

from loaderx import DenseStore, RaggedStore, Zrecord
from loaderx.dataloader import DataLoader
from loaderx.errors import ClosedError, LoaderClosedError
from loaderx.zsampler import Sampler

LENGTH = 1000


# -- stores ---------------------------------------------------------------------------


class FakeDenseStore:
    """An in-memory dense store with the loaderx store interface."""

    kind = "dense"

    def __init__(self, data, fail_on=None):
        self._data = np.ascontiguousarray(data)
        self.dtype = self._data.dtype
        self.item_shape = self._data.shape[1:]
        self.path = "<memory>"
        # A gather whose first index is fail_on raises, to inject errors.
        self.fail_on = fail_on

    def __len__(self):
        return len(self._data)

    def gather(self, indices, out=None):
        indices = np.asarray(indices, dtype=np.int64)
        if self.fail_on is not None and len(indices) and indices[0] == self.fail_on:
            raise OSError(f"injected read error at index {self.fail_on}")
        if out is None:
            return self._data[indices]
        np.take(self._data, indices, axis=0, out=out)
        return out


class FakeRaggedStore:
    kind = "ragged"

    def __init__(self, records, dtype):
        self._records = [np.asarray(record, dtype=dtype) for record in records]
        self.dtype = np.dtype(dtype)
        self.item_shape = None
        self.path = "<memory>"

    def __len__(self):
        return len(self._records)

    def gather(self, indices, out=None):
        return [self._records[i].copy() for i in np.asarray(indices, dtype=np.int64)]


class FakeBytesStore:
    kind = "bytes"
    dtype = None
    item_shape = None
    path = "<memory>"

    def __init__(self, records):
        self._records = list(records)

    def __len__(self):
        return len(self._records)

    def gather(self, indices, out=None):
        return [self._records[i] for i in np.asarray(indices, dtype=np.int64)]


def dense_rows(length):
    """Record i is [i, 3i + 1]: the content reveals the index."""
    index = np.arange(length, dtype=np.int64)
    return np.stack([index, 3 * index + 1], axis=1)


def ragged_rows(length):
    """Record i is i repeated i % 5 times (so zero-length records occur)."""
    return [np.full(i % 5, i, dtype=np.int32) for i in range(length)]


def import_zrecord():
    try:
        import loaderx.zrecord as zrecord
    except ImportError as exc:  # The native store engine is built separately.
        pytest.skip(f"real-store variant: loaderx.zrecord is not importable yet ({exc})")
    return zrecord


@pytest.fixture(params=["fake", "real"])
def streams(request, tmp_path):
    """{"x": dense int64 (2,), "r": ragged int32} of LENGTH records."""
    if request.param == "fake":
        yield {"x": FakeDenseStore(dense_rows(LENGTH)), "r": FakeRaggedStore(ragged_rows(LENGTH), np.int32)}
        return
    zrecord = import_zrecord()
    dense = zrecord.DenseStore(str(tmp_path / "x"), np.int64, (2,))
    ragged = zrecord.RaggedStore(str(tmp_path / "r"), np.int32)
    try:
        dense.append(dense_rows(LENGTH))
        ragged.append(ragged_rows(LENGTH))
        yield {"x": dense, "r": ragged}
    finally:
        dense.close()
        ragged.close()


def fake_streams(length=LENGTH, fail_on=None):
    return {"x": FakeDenseStore(dense_rows(length), fail_on=fail_on)}


def indices_of(batch):
    return batch["x"][:, 0].copy()


def expected_indices(step, batch_size, mode=Sampler.Mode.CYCLIC, seed=0, shard=None, length=LENGTH):
    return Sampler(length, batch_size, mode, seed, shard=shard).at(step)


def take(loader, count):
    return [next(loader) for _ in range(count)]


def worker_threads():
    return [thread for thread in threading.enumerate() if thread.name.startswith("loaderx-worker")]


@pytest.fixture(autouse=True)
def no_thread_leaks():
    yield
    gc.collect()
    assert worker_threads() == [], "a test left loaderx worker threads running"


def consume_in_thread(loader):
    """Starts a thread that takes batches until next() raises RuntimeError
    (kept in outcome["error"])."""
    outcome = {}

    def consume():
        try:
            while True:
                next(loader)
        except RuntimeError as exc:
            outcome["error"] = exc

    consumer = threading.Thread(target=consume)
    consumer.start()
    return consumer, outcome


@pytest.fixture
def store(tmp_path):
    """A dense store whose record i is i (int64), 200 records."""
    yield from counting_store(tmp_path)


def identity(batch):
    return batch


def jitter(batch):
    """A transform that finishes batches out of order."""
    time.sleep(random.random() * 0.002)
    return batch


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


# -- checkpoints ----------------------------------------------------------------------


def test_checkpoint_at_every_step_continues_exactly():
    """Grain's generic test: restore at every step of a run, compare the continuation."""
    steps, follow = 200, 5
    transform = jitter
    run = DataLoader(fake_streams(), 16, seed=7, workers=3, prefetch=4, transform=transform)
    states, reference, ahead = [], [], 0
    with run:
        for step in range(steps + follow):
            if step % 10 == 0:
                time.sleep(0.01)  # Let the workers fill the prefetch window.
            workers = run._ring.stage
            with workers.lock:
                ahead += workers.claim > run._ring.deliver
            states.append(run.state_dict())
            reference.append(indices_of(next(run)))
    assert ahead > 0, "no checkpoint was taken with batches in flight"

    # One long-lived loader restored again and again: every restore discards
    # whatever it had prefetched for the previous continuation.
    with DataLoader(fake_streams(), 16, seed=7, workers=3, prefetch=4, transform=transform) as resumed:
        for step in range(steps):
            state = json.loads(json.dumps(states[step]))
            assert state["step"] == step
            resumed.load_state_dict(state)
            assert resumed.step == step
            for offset in range(follow):
                np.testing.assert_array_equal(indices_of(next(resumed)), reference[step + offset])

    # Fresh loaders restored before their first batch.
    for step in range(0, steps, 25):
        state = pickle.loads(pickle.dumps(states[step]))
        with DataLoader(fake_streams(), 16, seed=7, workers=2, prefetch=1) as fresh:
            fresh.load_state_dict(state)
            for offset in range(follow):
                np.testing.assert_array_equal(indices_of(next(fresh)), reference[step + offset])


def test_checkpoint_on_real_stores_resumes(streams):
    with DataLoader(streams, 8, seed=1, workers=2, prefetch=3) as run:
        take(run, 7)
        state = run.state_dict()
        after = [indices_of(batch) for batch in take(run, 6)]
    with DataLoader(streams, 8, seed=1, workers=1) as resumed:
        resumed.load_state_dict(state)
        for want in after:
            np.testing.assert_array_equal(indices_of(next(resumed)), want)


def test_state_dict_contents():
    with DataLoader(fake_streams(), 8, seed=9, mode="iid", shard=(1, 4), workers=2) as loader:
        take(loader, 3)
        state = loader.state_dict()
    assert state == {
        "version": 3,
        "seed": 9,
        "mode": "IID",
        "step": 3,
        "position": 3 * 8 * 4,
        "batch_size": 8,
        "shard": [1, 4],
        "lengths": {"x": LENGTH},
        "sources": None,
        "cursors": None,
        "fingerprints": {"x": None},
    }


def test_cyclic_state_position_names_the_cycle_and_offset():
    """1000 records, global batch 96: 10 whole batches per cycle (960
    records), 40 dropped. Step 23 is batch 3 of cycle 2: cycle * length + offset."""
    with DataLoader(fake_streams(), 24, seed=9, shard=(1, 4), workers=1, step=23) as loader:
        state = loader.state_dict()
        assert (state["step"], state["position"]) == (23, 2 * LENGTH + 3 * 96)
        assert loader.position == 2 * LENGTH + 3 * 96
        next(loader)
        assert loader.state_dict()["position"] == 2 * LENGTH + 4 * 96


class FingerprintedStore(FakeDenseStore):
    def __init__(self, data, fingerprint):
        super().__init__(data)
        self.fingerprint = fingerprint


def test_fingerprints_are_saved_and_a_different_record_set_is_refused():
    a = FingerprintedStore(dense_rows(LENGTH), "rows where label == 1 of dataset A")
    b = FingerprintedStore(dense_rows(LENGTH), "rows where label == 2 of dataset A")
    with DataLoader({"x": a}, 8, workers=1) as loader:
        take(loader, 2)
        state = loader.state_dict()
    assert state["fingerprints"] == {"x": "rows where label == 1 of dataset A"}
    with DataLoader({"x": a}, 8, workers=1) as same:
        same.load_state_dict(json.loads(json.dumps(state)))
        assert same.step == 2
    with DataLoader({"x": b}, 8, workers=1) as other:
        message = ("fingerprints\\['x'\\] is 'rows where label == 1 of dataset A' but this "
                   "loader has 'rows where label == 2 of dataset A'")
        with pytest.raises(ValueError, match=message):
            other.load_state_dict(state)
    with DataLoader({"x": FakeDenseStore(dense_rows(LENGTH))}, 8, workers=1) as plain:
        with pytest.raises(ValueError, match="fingerprints.*but this loader has None"):
            plain.load_state_dict(state)


@pytest.mark.parametrize("version", [1, 2])
def test_old_states_are_refused_with_the_reason(version):
    """States of loaderx versions whose CYCLIC cycles ran back to back."""
    with DataLoader(fake_streams(), 8, seed=9, shard=(1, 4), workers=2) as loader:
        take(loader, 3)
        state = loader.state_dict()
        old = {"version": version, "seed": 9, "mode": "CYCLIC", "step": 3, "batch_size": 8,
               "shard": [1, 4], "lengths": {"x": LENGTH}}
        if version == 2:
            old.update(position=96, sources=None)
        with pytest.raises(ValueError, match=f"version {version} .*CYCLIC .*cannot be resumed"):
            loader.load_state_dict(old)
        assert loader.step == 3
        loader.load_state_dict(state)


def test_step_constructor_argument_resumes():
    with DataLoader(fake_streams(), 16, seed=4, workers=2) as run:
        reference = [indices_of(batch) for batch in take(run, 30)]
    with DataLoader(fake_streams(), 16, seed=4, workers=3, step=17) as resumed:
        assert resumed.step == 17
        assert resumed.state_dict()["step"] == 17
        for want in reference[17:]:
            np.testing.assert_array_equal(indices_of(next(resumed)), want)


def test_resume_beyond_many_epochs_is_immediate():
    step = 10**9
    with DataLoader(fake_streams(), 16, seed=4, workers=1, step=step) as loader:
        start = time.perf_counter()
        np.testing.assert_array_equal(indices_of(next(loader)), expected_indices(step, 16, seed=4))
        assert time.perf_counter() - start < 1.0


def test_epochs_and_stop_after(tmp_path):
    with DenseStore(tmp_path / "x", np.int64, ()) as x:
        x.append(np.arange(100, dtype=np.int64))
        with DataLoader({"x": x}, 8, seed=0, workers=1, shard=(1, 2), stop_after=30) as loader:
            # 100 // 16: each cycle serves 6 whole batches and drops 4 records.
            assert loader.steps_per_epoch == 6
            assert [loader.epoch_of(s) for s in (0, 5, 6, 11, 12, 13)] == [0, 0, 1, 1, 2, 2]
            taken = list(loader)
            assert len(taken) == 30 and loader.step == 30
        with DataLoader({"x": x}, 8, step=25, stop_after=30, workers=1) as loader:
            assert len(list(loader)) == 5


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s.update(version=4), "version 4"),
        (lambda s: s.pop("version"), "version None"),
        (lambda s: s.pop("seed"), "missing \\['seed'\\]"),
        (lambda s: s.update(extra=1), "unknown keys \\['extra'\\]"),
        (lambda s: s.update(seed=8), "seed is 8 but this loader has 7"),
        (lambda s: s.update(mode="SEQUENTIAL"), "mode is 'SEQUENTIAL' but this loader has 'CYCLIC'"),
        (lambda s: s.update(lengths={"x": 999}), "lengths\\['x'\\] is 999 but this loader has 1000"),
        (lambda s: s.update(lengths={"y": 1000}), "streams \\['y'\\] differ"),
        (lambda s: s.update(sources={"names": ["a"], "weights": [1]}), "sources"),
        (lambda s: s.update(fingerprints={"x": "another record set"}),
         "fingerprints\\['x'\\] is 'another record set' but this loader has None"),
        (lambda s: s.update(cursors={"": [0, 0, 1]}), "cursors must be None"),
    ],
)
def test_state_from_another_configuration_is_refused(change, message):
    with DataLoader(fake_streams(), 16, seed=7, workers=1) as loader:
        state = loader.state_dict()
        change(state)
        with pytest.raises(ValueError, match=message):
            loader.load_state_dict(state)
        assert loader.step == 0


def test_any_rank_resumes_from_any_ranks_state():
    """Every rank's state holds the same global position, so rank 1 resumes
    its own slice from rank 0's state (this was refused in state version 1)."""
    with DataLoader(fake_streams(), 16, shard=(0, 2), workers=1) as rank0:
        take(rank0, 5)
        state = rank0.state_dict()
    with DataLoader(fake_streams(), 16, shard=(1, 2), workers=1) as rank1:
        want = [indices_of(b) for b in take(rank1, 8)][5:]
        rank1.load_state_dict(state)
        for w in want:
            np.testing.assert_array_equal(indices_of(next(rank1)), w)


@pytest.mark.parametrize(
    "field, value",
    [("step", -1), ("step", "3"), ("step", 2.0), ("seed", "7"), ("mode", 2), ("shard", "0,1"), ("lengths", [1000])],
)
def test_state_with_wrong_types_is_refused(field, value):
    with DataLoader(fake_streams(), 16, seed=7, workers=1) as loader:
        state = loader.state_dict()
        state[field] = value
        with pytest.raises(TypeError, match=field):
            loader.load_state_dict(state)
        with pytest.raises(TypeError, match="state must be a dict"):
            loader.load_state_dict([("version", 1)])


def test_positions_past_the_record_range_are_refused(store):
    """step * global batch past 2**64 raised cffi's "int too big to convert"
    at the first next(); a state with batch_size <= 0 or a position near
    2**64 was accepted (and then failed, or made a state_dict() that
    load_state_dict() refused)."""
    with pytest.raises(ValueError, match="step .* batch_size .* world"):
        DataLoader({"x": store}, 16, step=2**62)
    with DataLoader({"x": store}, 10, seed=2, workers=1) as loader:
        first = next(loader)["x"].copy()
        state = loader.state_dict()
        for bad in (0, -5):
            with pytest.raises(ValueError, match="batch_size"):
                loader.load_state_dict(dict(state, batch_size=bad))
        with pytest.raises(ValueError, match="position"):
            loader.load_state_dict(dict(state, position=2**64 - 5))
        loader.load_state_dict(json.loads(json.dumps(dict(state, step=0, position=0))))
        np.testing.assert_array_equal(next(loader)["x"], first)


def test_tampered_loader_states_are_refused_and_change_nothing(tmp_path):
    """Before the fix, step=2**64+5 left a loader with a transform blocked
    forever, and without one it silently went on from its old step;
    DataLoader(step=2**64-1) was accepted and the first next() failed."""
    with DenseStore(tmp_path / "x", np.int64, ()) as ds:
        ds.append(np.arange(100))
        for transform in (None, lambda b: b):
            loader = DataLoader({"x": ds}, batch_size=10, seed=1, transform=transform)
            first = next(loader)["x"]
            good = loader.state_dict()
            for step in (2**64 + 5, 2**64 - 1):
                with pytest.raises(ValueError, match="step"):
                    loader.load_state_dict(dict(good, step=step))
            for step in ("3", -1):
                with pytest.raises(TypeError, match="step"):
                    loader.load_state_dict(dict(good, step=step))
            assert loader.step == 1
            second = next(loader)["x"]
            loader.load_state_dict(dict(good, step=0, position=0))
            assert np.array_equal(next(loader)["x"], first)
            assert np.array_equal(next(loader)["x"], second)
            loader.close()
        with pytest.raises(ValueError, match="step"):
            DataLoader({"x": ds}, batch_size=10, step=2**64 - 1)


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
    """Records without common trailing dimensions under ragged="packed": with
    no transform, the failing step raised ValueError and the next next()
    silently went on with the step after it."""
    with RaggedStore(tmp_path / "r", np.int32) as rs:
        rs.append([np.zeros((2, 3), np.int32), np.zeros((1, 4), np.int32)])
        with DataLoader({"r": rs}, 2, mode="sequential", workers=1, ragged="packed",
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
    from test_engine import LOC, flip

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
        if hasattr(excinfo.value, "__notes__"):
            assert any("step 5" in note for note in excinfo.value.__notes__)
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
    with DataLoader({"tok": rs, "id": ids}, 16, seed=4, workers=1, ragged="packed") as loader:
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


def run_script(script, *args, timeout=300):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # The repository (loaderx) and tests/ (the scripts' shared helpers).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.path.join(root, "tests")]))
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)


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
