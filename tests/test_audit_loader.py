"""Hostile and careless uses of the loader API (an audit): each test pins an
input or usage that used to end in a hang, a raw internal exception or a
silently wrong batch, and now gives a clear error or the right result."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import numpy as np
import pytest

from loaderx import DataLoader, DenseStore, Mixture, RaggedStore
from loaderx.errors import ClosedError

WAIT_S = 10.0


@pytest.fixture
def store(tmp_path):
    """A dense store whose record i is i (int64), 200 records."""
    with DenseStore(tmp_path / "x", np.int64, ()) as ds:
        ds.append(np.arange(200, dtype=np.int64))
        yield ds


def identity(batch):
    return batch


def within(fn, seconds=WAIT_S):
    """fn() on a daemon thread: its result, or its exception re-raised; fails
    (instead of hanging the suite) when it does not return in time."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: B036 - re-raised on the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} did not return within {seconds} s (a hang)"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def reference(ds, count, **kwargs):
    with DataLoader({"x": ds}, workers=1, **kwargs) as loader:
        return [next(loader)["x"].copy() for _ in range(count)]


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


class Interrupt:
    """Raises KeyboardInterrupt once, right after `call` returned: a Ctrl-C
    that lands between the native wait and the batch reaching the caller."""

    def __init__(self, call):
        self.call = call
        self.armed = True

    def __call__(self, *args, **kwargs):
        result = self.call(*args, **kwargs)
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        return result


class InterruptingDict(dict):
    def pop(self, *args):
        result = dict.pop(self, *args)
        if getattr(self, "armed", True):
            self.armed = False
            raise KeyboardInterrupt
        return result


@pytest.mark.parametrize("transform", [None, identity])
def test_an_interrupted_next_loses_no_batch(store, transform):
    """Ctrl-C inside next(), then iterating on (a notebook cell run again):
    every later next() raised KeyError (no transform) or blocked forever."""
    want = reference(store, 8, batch_size=10, seed=3)
    loader = DataLoader({"x": store}, 10, seed=3, workers=2, transform=transform)
    with loader:
        got = [next(loader)["x"].copy() for _ in range(3)]
        ring = loader._ring
        if transform is None:
            ring.wait = Interrupt(ring.wait)
        else:
            with ring.stage.lock:
                ring.stage.ready = InterruptingDict(ring.stage.ready)
        with pytest.raises(KeyboardInterrupt):
            next(loader)
        assert loader.step == 3
        got += [within(lambda: next(loader))["x"].copy() for _ in range(5)]
        assert loader.state_dict()["step"] == 8
    for step, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"step {step}")


@pytest.mark.parametrize("transform", [None, identity])
def test_two_consumer_threads_share_the_batches(store, transform):
    """next() from two threads: one got KeyError (no transform), or one
    blocked forever (with a transform). Now every step goes to exactly one."""
    want = {tuple(b.tolist()) for b in reference(store, 120, batch_size=5, seed=1)}
    got, errors = [], []
    with DataLoader({"x": store}, 5, seed=1, workers=2, transform=transform) as loader:
        def consume():
            try:
                for _ in range(60):
                    got.append(tuple(next(loader)["x"].tolist()))
            except Exception as exc:
                errors.append(exc)

        threads = [threading.Thread(target=consume) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
        alive = [thread.is_alive() for thread in threads]
    assert alive == [False, False] and errors == []
    assert len(got) == 120 and set(got) == want


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


def test_a_mixture_refuses_a_stream_named_source(tmp_path, store):
    """The loader adds batch["source"]: a stream of that name was silently
    replaced by the source ids."""
    with pytest.raises(ValueError, match="'source' is reserved"):
        Mixture({"a": {"source": store}, "b": {"source": store}}, {"a": 1, "b": 1})


def test_mixture_weights_of_any_real_type(store):
    """A numpy float32 weight raised Fraction's "argument should be a string
    or a Rational instance"; an int too large for a float raised OverflowError."""
    sources = {"a": {"x": store}, "b": {"x": store}}
    assert Mixture(sources, {"a": np.float32(0.7), "b": np.float32(0.3)}).integer_weights == [7, 3]
    assert Mixture(sources, {"a": 10**400, "b": 10**400}).integer_weights == [1, 1]
    with pytest.raises(ValueError, match="too uneven"):
        Mixture(sources, {"a": 10**400, "b": 1})


@pytest.mark.parametrize("call", ["next", "load_state_dict"])
def test_the_loader_called_from_its_own_transform_is_refused(store, call):
    """next() or load_state_dict() from inside the transform waited for the
    transform itself: a deadlock."""
    holder = {}

    def transform(batch):
        loader = holder["loader"]
        if call == "next":
            next(loader)
        else:
            loader.load_state_dict(loader.state_dict())
        return batch

    with DataLoader({"x": store}, 4, workers=1, transform=transform) as loader:
        holder["loader"] = loader
        with pytest.raises(RuntimeError, match=f"{call}\\(\\) .* own transform"):
            within(lambda: next(loader))


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
    """ragged="packed" gave (values, row_splits) for stores but still a list
    for a ragged stream that is a Python object."""
    with RaggedStore(tmp_path / "r", np.int32) as rs:
        rs.append([np.full(i % 3, i, np.int32) for i in range(50)])
        with DataLoader({"r": rs, "p": PythonRagged()}, 6, workers=1,
                        ragged="packed") as loader:
            for _ in range(3):
                batch = next(loader)
                values, splits = batch["p"]
                assert values.dtype == np.int32 and splits.dtype == np.int64
                np.testing.assert_array_equal(values, batch["r"][0])
                np.testing.assert_array_equal(splits, batch["r"][1])


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


def test_close_during_load_state_dict_raises_closed(store):
    """close() from another thread while load_state_dict() waited for the
    batches being built: load_state_dict() went on to reset the ring close()
    was freeing, and returned as if it had worked."""
    def slow(batch):
        time.sleep(0.2)
        return batch

    loader = DataLoader({"x": store}, 4, workers=2, transform=slow)
    next(loader)
    state = loader.state_dict()
    outcome = {}

    def load():
        try:
            loader.load_state_dict(state)
            outcome["result"] = "loaded"
        except ClosedError as exc:
            outcome["result"] = str(exc)

    thread = threading.Thread(target=load)
    thread.start()
    time.sleep(0.05)
    loader.close()
    thread.join(WAIT_S)
    assert outcome == {"result": "DataLoader was closed during load_state_dict()"}


class Interrupted(BaseException):
    pass


@pytest.mark.parametrize("transform", [None, identity])
def test_interrupts_storming_next_lose_no_batch(store, transform):
    """Signals whose handler raises inside next(), hundreds a second: with a
    transform, one landing while Condition.wait took the lock back left the
    lock released from under a worker ("release unlocked lock" in a worker,
    then a hang); without one, the first gave KeyError for good."""
    count = 300
    want = reference(store, count, batch_size=4, seed=9)
    inside = [False]

    def handler(signum, frame):
        if inside[0]:
            inside[0] = False
            raise Interrupted

    previous = signal.signal(signal.SIGUSR1, handler)
    done = threading.Event()

    def storm():
        while not done.wait(0.0003):
            os.kill(os.getpid(), signal.SIGUSR1)

    kicker = threading.Thread(target=storm, daemon=True)
    got = []
    try:
        with DataLoader({"x": store}, 4, seed=9, workers=2, transform=transform) as loader:
            kicker.start()
            deadline = time.monotonic() + 4 * WAIT_S
            while len(got) < count and time.monotonic() < deadline:
                try:
                    inside[0] = True
                    batch = next(loader)
                    inside[0] = False
                    got.append(batch["x"].copy())
                except Interrupted:
                    pass
    finally:
        inside[0] = False
        done.set()
        kicker.join()
        signal.signal(signal.SIGUSR1, previous)
    assert len(got) == count
    for step, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"step {step}")
