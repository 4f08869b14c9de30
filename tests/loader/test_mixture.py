"""Tests of `loaderx.Mixture` (weighted mixtures of sources) through the
DataLoader:

- proportions: cumulative per-source counts stay within ceil(log2 K)
  records of weight x records at every step (10,000 steps);
- determinism: batches are a pure function of (seed, step) whatever the
  threads and prefetch; restoring at each of 200 steps continues exactly;
- CYCLIC mixtures: no step repeats a record of a source, and no source
  repeats one within its cycle, also across an elastic resume;
- refusals: mismatched sources and streams, named; a stream named
  ``source``; weights of any real type.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from loaderx import DataLoader, DenseStore, Mixture, RaggedStore, ShardSet


def make_sources(tmp_path, sizes=(500, 300, 200)):
    """Source k: x holds 1000 * k + i at record i; tok holds ragged records."""
    sources = {}
    for k, n in enumerate(sizes):
        x = DenseStore(tmp_path / f"x{k}", np.int64, ())
        x.append(1000 * k + np.arange(n, dtype=np.int64))
        tok = RaggedStore(tmp_path / f"t{k}", np.int32)
        tok.append([np.full(i % 5, 1000 * k + i, np.int32) for i in range(n)])
        sources[f"s{k}"] = {"x": x, "tok": tok}
    return sources


def close_all(sources):
    for streams in sources.values():
        for s in streams.values():
            s.close()


def test_mixture_proportions_stay_within_the_bound(tmp_path):
    sources = make_sources(tmp_path)
    weights = {"s0": 0.5, "s1": 0.3, "s2": 0.2}
    mix = Mixture({k: {"x": v["x"]} for k, v in sources.items()}, weights)
    bound = math.ceil(math.log2(3))
    with DataLoader(mix, 16, seed=3, workers=2) as loader:
        counts = np.zeros(3, np.int64)
        for step in range(10_000):
            batch = next(loader)
            counts += np.bincount(batch["source"], minlength=3)
            total = 16 * (step + 1)
            for k, w in enumerate((0.5, 0.3, 0.2)):
                assert abs(counts[k] - w * total) <= bound, (step, counts)
            # Each record comes from its source's own store.
            assert ((batch["x"] // 1000) == batch["source"]).all()
    assert loader.sources == {0: "s0", 1: "s1", 2: "s2"}
    close_all(sources)


def test_each_source_cycles_through_its_own_records(tmp_path):
    """CYCLIC per source: every record of a small source appears once per
    cycle, independently of the other sources."""
    sources = make_sources(tmp_path, sizes=(400, 40))
    mix = Mixture({k: {"x": v["x"]} for k, v in sources.items()}, {"s0": 3, "s1": 1})
    with DataLoader(mix, 20, seed=1, workers=1) as loader:
        small = []
        while len(small) < 120:
            b = next(loader)
            small += b["x"][b["source"] == 1].tolist()
    for cycle in range(3):
        assert sorted(small[40 * cycle:40 * (cycle + 1)]) == list(range(1000, 1040))
    close_all(sources)


def batches(loader, n, key="x"):
    return [next(loader)[key].copy() for _ in range(n)]


def test_mixture_batches_are_a_pure_function_of_seed_and_step(tmp_path):
    sources = make_sources(tmp_path)
    mix = Mixture(sources, {"s0": 2, "s1": 1, "s2": 1})
    with DataLoader(mix, 12, seed=5, workers=1, prefetch=1) as a:
        ref = [(b["x"].copy(), b["source"].copy(), [t.tolist() for t in b["tok"]]) for b in
               (next(a) for _ in range(200))]
    with DataLoader(mix, 12, seed=5, workers=3, prefetch=6, transform=lambda b: b) as b:
        for want in ref:
            got = next(b)
            np.testing.assert_array_equal(got["x"], want[0])
            np.testing.assert_array_equal(got["source"], want[1])
            assert [t.tolist() for t in got["tok"]] == want[2]
    with DataLoader(mix, 12, seed=5, workers=2, prefetch=3) as loader:
        states = []
        for _ in range(200):
            states.append(loader.state_dict())
            next(loader)
        for step in range(0, 200, 1):
            loader.load_state_dict(states[step])
            for offset in range(min(3, 200 - step)):
                np.testing.assert_array_equal(next(loader)["x"], ref[step + offset][0])
    close_all(sources)


def test_mixtures_refuse_mismatches_naming_source_and_stream(tmp_path):
    sources = make_sources(tmp_path, sizes=(50, 50))
    with pytest.raises(ValueError, match="'s1'.*same stream names"):
        Mixture({"s0": sources["s0"], "s1": {"x": sources["s1"]["x"]}}, {"s0": 1, "s1": 1})
    with pytest.raises(TypeError, match="stream 'x': source 's1' holds ragged"):
        Mixture({"s0": {"x": sources["s0"]["x"]}, "s1": {"x": sources["s1"]["tok"]}}, {"s0": 1, "s1": 1})
    with pytest.raises(ValueError, match="positive"):
        Mixture(sources, {"s0": 1, "s1": 0})
    with pytest.raises(ValueError, match="weights name"):
        Mixture(sources, {"s0": 1})
    mix = Mixture(sources, {"s0": 0.7, "s1": 0.3})
    other = Mixture(sources, {"s0": 0.6, "s1": 0.4})
    with DataLoader(mix, 8, seed=1, workers=1) as a, DataLoader(other, 8, seed=1, workers=1) as b:
        with pytest.raises(ValueError, match="sources"):
            b.load_state_dict(a.state_dict())
    assert mix.weights == {"s0": 0.7, "s1": 0.3}
    close_all(sources)


def _mixture_sources(tmp_path, sizes):
    """Source k holds 1000 * k + i at record i."""
    sources = {}
    for k, n in enumerate(sizes):
        x = DenseStore(tmp_path / f"m{k}", np.int64, ())
        x.append(1000 * k + np.arange(n, dtype=np.int64))
        sources[f"s{k}"] = {"x": x}
    return sources


def _check_cycles(seen, steps_records, cursors_before):
    """Adds each step's records to `seen[(source, cycle)]`, refusing a repeat
    within a step or within one cycle of a source."""
    for records, cursors in zip(steps_records, cursors_before):
        for k, name in enumerate(sorted(cursors)):
            mine = [r - 1000 * k for r in records if r // 1000 == k]
            assert len(set(mine)) == len(mine), f"a step repeats a record of {name}"
            cycle = cursors[name][0]
            bucket = seen.setdefault((name, cycle), set())
            assert not bucket & set(mine), f"{name} repeats a record within cycle {cycle}"
            bucket |= set(mine)


def test_cyclic_mixture_sources_never_repeat_a_record_within_a_step_or_cycle(tmp_path):
    """Small sources whose per-step counts vary (weights 5:3:2 of 16 records
    a step): each step's records of a source come from one cycle of it."""
    sizes = (53, 37, 23)
    sources = _mixture_sources(tmp_path, sizes)
    mix = Mixture(sources, {"s0": 0.5, "s1": 0.3, "s2": 0.2})
    seen = {}
    with DataLoader(mix, 8, seed=4, shard=(0, 2), workers=1) as r0, \
            DataLoader(mix, 8, seed=4, shard=(1, 2), workers=1) as r1:
        records, cursors = [], []
        for _ in range(400):
            state = r0.state_dict()
            assert state["cursors"] == r1.state_dict()["cursors"]
            cursors.append(state["cursors"])
            records.append(np.concatenate([next(r0)["x"], next(r1)["x"]]).tolist())
    _check_cycles(seen, records, cursors)
    # Each cycle serves nearly all of its source (the rest dropped is at most
    # about one step's count plus a record or two).
    for (name, cycle), served in seen.items():
        size = sizes[int(name[1])]
        if cycle not in (0, max(c for n, c in seen if n == name)):
            assert size - len(served) <= 16 * {"s0": 0.5, "s1": 0.3, "s2": 0.2}[name] + 3
    close_all(sources)


def test_cyclic_mixture_elastic_resume_stays_in_each_sources_cycle(tmp_path):
    sizes = (61, 41)
    sources = _mixture_sources(tmp_path, sizes)
    mix = Mixture(sources, {"s0": 2, "s1": 1})
    seen = {}
    records, cursors = [], []
    with DataLoader(mix, 12, seed=8, workers=1) as a:
        for _ in range(7):
            cursors.append(a.state_dict()["cursors"])
            records.append(next(a)["x"].tolist())
        state = a.state_dict()
    for batch_size in (5, 30):
        with DataLoader(mix, batch_size, seed=8, workers=1) as b:
            b.load_state_dict(state)
            resumed_cursors = b.state_dict()["cursors"]
            # The same cycles, from the same offsets.
            for name in state["cursors"]:
                assert resumed_cursors[name][:2] == state["cursors"][name][:2] or (
                    resumed_cursors[name][0] == state["cursors"][name][0] + 1
                    and resumed_cursors[name][1] == 0)
            steps_records, steps_cursors = list(records), list(cursors)
            for _ in range(40):
                steps_cursors.append(b.state_dict()["cursors"])
                steps_records.append(next(b)["x"].tolist())
        _check_cycles({}, steps_records, steps_cursors)
    close_all(sources)


def test_cyclic_mixture_refuses_a_source_one_step_can_exhaust(tmp_path):
    sources = _mixture_sources(tmp_path, (500, 5))
    mix = Mixture(sources, {"s0": 1, "s1": 1})
    with pytest.raises(ValueError, match="source 's1' has 5 records, but one step of 16 "
                                         "records can take up to 8 of them.*IID"):
        DataLoader(mix, 16)
    with DataLoader(mix, 16, mode="iid", workers=1) as loader:
        assert len(next(loader)["x"]) == 16
    with DataLoader(mix, 8, workers=1) as loader:  # 4 a step fit in 5
        for _ in range(10):
            small = [r for r in next(loader)["x"].tolist() if r >= 1000]
            assert len(set(small)) == len(small)
    close_all(sources)


def test_cyclic_mixture_seeks_far_at_once(tmp_path):
    sources = _mixture_sources(tmp_path, (500, 300, 200))
    mix = Mixture(sources, {"s0": 5, "s1": 3, "s2": 2})
    step = 10**12
    with DataLoader(mix, 16, seed=1, workers=1) as a:
        far = a.state_dict()
    # Each source's cursor at step 10**12 is computed, not replayed (a replay
    # would not finish).
    with DataLoader(mix, 16, seed=1, workers=1, step=step) as b:
        got = next(b)["x"]
        state = b.state_dict()
    assert state["step"] == step + 1 and len(got) == 16
    with DataLoader(mix, 16, seed=1, workers=1) as c:
        c.load_state_dict(far)
        c.load_state_dict(state)
        assert c.step == step + 1
    close_all(sources)


def test_shard_sets_of_ragged_records_in_a_mixture(tmp_path):
    parts = []
    for k in range(3):
        rs = RaggedStore(tmp_path / f"p{k}", np.int32)
        rs.append([np.full(i % 4 + 1, 100 * k + i, np.int32) for i in range(100)])
        parts.append(rs)
    other = RaggedStore(tmp_path / "o", np.int32)
    other.append([np.full(2, -(i + 1), np.int32) for i in range(50)])
    mix = Mixture({"a": {"t": ShardSet(parts)}, "b": {"t": other}}, {"a": 1, "b": 1})
    with DataLoader(mix, 10, seed=0, workers=2) as loader:
        for _ in range(30):
            b = next(loader)
            for rec, src in zip(b["t"], b["source"].tolist()):
                assert (rec < 0 if src == 1 else rec >= 0).all()
                assert len(set(rec.tolist())) == 1
    for s in parts + [other]:
        s.close()


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
