"""The DataLoader's checkpoints: a state saved at any step continues
exactly, on fake and real stores; what a state holds; fingerprints of the
record set; old, foreign, mistyped or tampered states are refused with the
reason and change nothing; any rank resumes from any rank's state."""
from __future__ import annotations

import json
import pickle
import time

import numpy as np
import pytest

from loaderx import DenseStore
from loaderx.dataloader import DataLoader
from loaderx.zsampler import Sampler
from _fakes import (
    FakeDenseStore,
    LENGTH,
    dense_rows,
    expected_indices,
    fake_streams,
    indices_of,
    jitter,
    take,
)

pytestmark = pytest.mark.usefixtures("no_thread_leaks")


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


def test_every_state_a_loader_records_loads_again_even_at_the_last_step():
    """Before, a loader resumed at the largest step it accepts took that
    step, and its state_dict then held a step (or a global position past
    2**63) that load_state_dict refused."""
    from loaderx._state import POSITION_MAX, STEP_MAX

    # CYCLIC serves 1000 // 16 = 62 whole batches of each cycle of LENGTH = 1000
    # records: step s starts at (s // 62) * 1000 + (s % 62) * 16.
    per = LENGTH // 16
    cyclic = max(s for s in (POSITION_MAX // LENGTH * per + d for d in range(-2, per + 2))
                 if (s // per) * LENGTH + (s % per) * 16 <= POSITION_MAX)
    for batch, mode, last in ((1, "cyclic", STEP_MAX), (16, "iid", POSITION_MAX // 16),
                              (16, "cyclic", cyclic)):
        with DataLoader(fake_streams(), batch, seed=4, mode=mode, workers=1,
                        step=last - 1) as loader:
            np.testing.assert_array_equal(
                indices_of(next(loader)),
                expected_indices(last - 1, batch, mode=Sampler.Mode[mode.upper()], seed=4))
            state = loader.state_dict()
            assert state["step"] == last
            with pytest.raises(OverflowError, match=f"at step {last}: the state after it would "
                                                    "be past what a state_dict records"):
                next(loader)
            assert loader.state_dict() == state  # (nothing was taken)
        with DataLoader(fake_streams(), batch, seed=4, mode=mode, workers=1) as again:
            again.load_state_dict(state)
            assert again.step == last
            with pytest.raises(OverflowError, match="takes no more steps"):
                next(again)
    with pytest.raises(ValueError, match=f"must be in \\[0, {STEP_MAX}\\]"):
        DataLoader(fake_streams(), 1, step=STEP_MAX + 1)


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
