"""Tests for loaderx.zsampler.Sampler: the meaning of each mode, purity in
(seed, step), sharding, and argument validation. Deterministic and fast."""
from __future__ import annotations

import copy
import math
import pickle
import re
import time

import numpy as np
import pytest

from loaderx.zsampler import Sampler

MODES = [Sampler.Mode.SEQUENTIAL, Sampler.Mode.IID, Sampler.Mode.CYCLIC]


def positions(sampler: Sampler, steps: int) -> np.ndarray:
    """The concatenated batches of steps [0, steps), read with at()."""
    return np.concatenate([sampler.at(s) for s in range(steps)])


def chi_square_limit(dof: int, sigmas: float = 8.0) -> float:
    """A generous upper bound for a chi-square statistic with `dof` degrees of
    freedom: mean + `sigmas` standard deviations (mean dof, variance 2 dof).
    Far in the tail for every dof used here, yet a biased sampler lands far
    beyond it."""
    return dof + sigmas * math.sqrt(2 * dof) + 10


def chi_square(counts: np.ndarray, expected: np.ndarray) -> float:
    return float((((counts - expected) ** 2) / expected).sum())


# --------------------------------------------------------------------- CYCLIC


def permutation(length: int, seed: int, cycle: int) -> np.ndarray:
    """Cycle `cycle`'s whole permutation: with batch_size == length a cycle
    is one step."""
    return Sampler(length, length, "cyclic", seed).at(cycle)


def global_batches(length, batch_size, world, seed, steps):
    """Steps [0, steps) of `world` ranks, each step's shards joined in rank order."""
    ranks = [Sampler(length, batch_size, "cyclic", seed, shard=(r, world)) for r in range(world)]
    return [np.concatenate([r.at(step) for r in ranks]) for step in range(steps)]


# (length, batch_size, world): divisible and not, one rank and several, small
# lengths (exact shuffles) and large ones (the Feistel network).
CYCLIC_CASES = [
    (length, batch_size, world)
    for length in (1, 2, 3, 7, 10, 64, 100, 128, 129, 255, 1000, 1023, 1025, 4096)
    for batch_size in (1, 3, 4, 7, 64)
    for world in (1, 2, 3)
    if batch_size * world <= length
]


@pytest.mark.parametrize("length, batch_size, world", CYCLIC_CASES)
def test_cyclic_never_repeats_an_index_in_a_global_batch(length, batch_size, world):
    g = batch_size * world
    per_cycle = length // g
    for batch in global_batches(length, batch_size, world, 11, min(3 * per_cycle + 2, 200)):
        assert len(np.unique(batch)) == g


@pytest.mark.parametrize("length, batch_size, world", CYCLIC_CASES)
def test_cyclic_cycle_is_a_permutation_prefix(length, batch_size, world):
    """Cycle c serves length // G whole global batches: the first
    (length // G) * G entries of its permutation, in order; the rest is dropped."""
    g = batch_size * world
    per_cycle = length // g
    cycles = max(1, min(3, 300 // per_cycle))
    batches = global_batches(length, batch_size, world, 11, cycles * per_cycle)
    for c in range(cycles):
        served = np.concatenate(batches[c * per_cycle:(c + 1) * per_cycle])
        np.testing.assert_array_equal(served, permutation(length, 11, c)[:per_cycle * g])


def test_cyclic_drops_a_different_rest_each_cycle():
    # 1000 = 3 * 256 + 232: each cycle serves 3 batches and drops 232 records.
    length, batch_size = 1000, 256
    sampler = Sampler(length, batch_size, "cyclic", seed=5)
    rests = []
    for c in range(4):
        served = np.concatenate([sampler.at(3 * c + i) for i in range(3)])
        assert len(np.unique(served)) == 768
        rest = frozenset(range(length)) - frozenset(served.tolist())
        assert len(rest) == 232
        assert rest == frozenset(permutation(length, 5, c)[768:].tolist())
        rests.append(rest)
    assert len(set(rests)) == 4


def test_cyclic_batches_of_the_issue_have_no_repeats():
    # Cycles that ran back to back gave [1, 7, 5, 1] at step 12, and 385
    # repeats in 100 steps of Sampler(1000, 300).
    assert len(set(Sampler(10, 4, seed=0).at(12).tolist())) == 4
    sampler = Sampler(1000, 300)
    assert sum(300 - len(np.unique(sampler.next())) for _ in range(100)) == 0


def test_cyclic_covers_ten_million():
    length = 10_000_000
    batch_size = 1 << 20
    sampler = Sampler(length, batch_size, "cyclic", seed=3)
    flat = positions(sampler, 10)  # 9 whole batches per cycle, then the next cycle
    assert flat.dtype == np.int64
    assert flat.min() >= 0 and flat.max() < length
    served = np.bincount(flat[:9 * batch_size], minlength=length)
    assert served.max() == 1  # no record twice within cycle 0
    head = flat[9 * batch_size:]
    assert len(np.unique(head)) == len(head)
    assert served[head].any()  # a new permutation, not the rest of cycle 0


@pytest.mark.parametrize("batch_size, shard", [(11, None), (4, (0, 3)), (6, (1, 2))])
def test_cyclic_refuses_a_global_batch_larger_than_length(batch_size, shard):
    with pytest.raises(ValueError, match=r"CYCLIC.* > length 10.*IID.*SEQUENTIAL"):
        Sampler(10, batch_size, "cyclic", shard=shard)
    # The other modes take any batch.
    Sampler(10, batch_size, "iid", shard=shard)
    Sampler(10, batch_size, "sequential", shard=shard)


def test_cyclic_permutations_differ_by_seed_and_cycle():
    length = 1000
    first = Sampler(length, length, "cyclic", seed=1)
    other_seed = Sampler(length, length, "cyclic", seed=2)
    assert not np.array_equal(first.at(0), other_seed.at(0))
    assert not np.array_equal(first.at(0), first.at(1))
    assert not np.array_equal(first.at(0), np.arange(length))
    # Large seeds too (they must use all 64 bits).
    high = Sampler(length, length, "cyclic", seed=2**64 - 1)
    high_neighbour = Sampler(length, length, "cyclic", seed=2**64 - 1 - 2**63)
    assert not np.array_equal(high.at(0), high_neighbour.at(0))


def test_cyclic_small_lengths_reach_every_permutation():
    # 5 values have 120 orders; 3000 cycles of a fair shuffle miss one with
    # probability about 120 * exp(-25) ~ 1e-9.
    sampler = Sampler(5, 5, "cyclic", seed=0)
    orders = {tuple(sampler.at(c)) for c in range(3000)}
    assert len(orders) == 120
    counts = np.array(list(_count_orders(sampler, 3000).values()), dtype=float)
    expected = np.full(120, 3000 / 120)
    assert chi_square(counts, expected) < chi_square_limit(119)


def _count_orders(sampler: Sampler, cycles: int) -> dict:
    counts: dict = {}
    for c in range(cycles):
        key = tuple(sampler.at(c))
        counts[key] = counts.get(key, 0) + 1
    return counts


# --------------------------------------------------------------------- IID


def test_iid_is_uniform_small_length():
    length = 10
    sampler = Sampler(length, 1000, "iid", seed=123)
    counts = np.bincount(positions(sampler, 100), minlength=length)  # 100k draws
    expected = np.full(length, counts.sum() / length)
    assert chi_square(counts, expected) < chi_square_limit(length - 1)


def test_iid_is_uniform_medium_length():
    length = 1000
    sampler = Sampler(length, 1 << 16, "iid", seed=9)
    counts = np.bincount(positions(sampler, 16), minlength=length)  # ~10^6 draws
    expected = np.full(length, counts.sum() / length)
    assert chi_square(counts, expected) < chi_square_limit(length - 1)


def test_iid_is_unbiased_for_huge_lengths():
    # n = 3 * 2^61: reducing a 64-bit word modulo n would put 3/8 of the draws
    # in the first third instead of 1/3. Lemire with rejection is exact.
    length = 3 << 61
    sampler = Sampler(length, 1 << 16, "iid", seed=4)
    draws = positions(sampler, 4)
    assert draws.min() >= 0 and draws.max() < length
    counts = np.bincount(draws >> 61, minlength=3)
    expected = np.full(3, len(draws) / 3)
    assert chi_square(counts, expected) < chi_square_limit(2)


def test_iid_repeats_and_depends_on_seed():
    a = Sampler(100, 4096, "iid", seed=1).at(0)
    assert len(np.unique(a)) < len(a)  # with replacement
    np.testing.assert_array_equal(a, Sampler(100, 4096, "iid", seed=1).at(0))
    assert not np.array_equal(a, Sampler(100, 4096, "iid", seed=2).at(0))


# --------------------------------------------------------------------- SEQUENTIAL


def test_sequential_wraps_circularly():
    sampler = Sampler(10, 4, "sequential")
    np.testing.assert_array_equal(positions(sampler, 5), np.arange(20) % 10)
    np.testing.assert_array_equal(sampler.at(2), [8, 9, 0, 1])
    wide = Sampler(10, 25, "sequential")
    np.testing.assert_array_equal(wide.at(1), np.arange(25, 50) % 10)


# --------------------------------------------------------------------- stepping


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch_size", [3, 256, 5000])
def test_at_seek_and_next_agree(mode, batch_size):
    if mode == Sampler.Mode.CYCLIC and batch_size > 1000:
        with pytest.raises(ValueError, match="CYCLIC"):
            Sampler(1000, batch_size, mode)
        return
    sampler = Sampler(1000, batch_size, mode, seed=77)
    first = [sampler.next() for _ in range(40)]
    assert sampler.step == 40
    for step, batch in enumerate(first):
        assert batch.dtype == np.int64 and batch.shape == (batch_size,)
        assert batch.flags.c_contiguous and batch.flags.writeable
        np.testing.assert_array_equal(batch, sampler.at(step))
    sampler.seek(17)
    assert sampler.step == 17
    np.testing.assert_array_equal(sampler.next(), first[17])
    assert sampler.step == 18
    resumed = Sampler(1000, batch_size, mode, seed=77, step=23)
    np.testing.assert_array_equal(resumed.next(), first[23])
    iterator = iter(Sampler(1000, batch_size, mode, seed=77))
    np.testing.assert_array_equal(next(iterator), first[0])
    np.testing.assert_array_equal(next(iterator), first[1])


@pytest.mark.parametrize("mode", MODES)
def test_returned_batches_are_fresh(mode):
    sampler = Sampler(1000, 16, mode, seed=1)
    batches = [sampler.next() for _ in range(10)]
    expected = [b.copy() for b in batches]
    for b in batches:
        b[:] = -1  # the caller owns what it got
    for a in batches:
        for b in batches:
            assert a is b or not np.shares_memory(a, b)
    sampler.seek(0)
    again = [sampler.next() for _ in range(10)]
    for batch, want, old in zip(again, expected, batches):
        np.testing.assert_array_equal(batch, want)
        assert not np.shares_memory(batch, old)


def test_seek_is_constant_time():
    for mode in MODES:
        sampler = Sampler(10**9 + 7, 256, mode, seed=5)
        start = time.perf_counter()
        sampler.seek(10**15)
        batch = sampler.next()
        elapsed = time.perf_counter() - start
        assert elapsed < 0.05, f"seek + next took {elapsed:.3f}s"
        assert batch.shape == (256,) and batch.min() >= 0 and batch.max() < 10**9 + 7
        np.testing.assert_array_equal(batch, sampler.at(10**15))
        assert sampler.step == 10**15 + 1


def test_last_step():
    last = 2**64 - 1
    for mode in MODES:
        sampler = Sampler(1000, 8, mode, step=last)
        np.testing.assert_array_equal(sampler.next(), sampler.at(last))
        with pytest.raises(OverflowError, match=re.escape(str(last + 1))):
            sampler.next()


def test_huge_length():
    length = 2**63
    for mode in MODES:
        sampler = Sampler(length, 300, mode, seed=2**64 - 1, step=2**63)
        batch = sampler.next()
        assert batch.dtype == np.int64 and batch.min() >= 0
    cyclic = Sampler(length, 4096, "cyclic", seed=8, step=12345)
    assert len(np.unique(cyclic.next())) == 4096


def test_copy_and_pickle_resume_at_the_same_step():
    sampler = Sampler(1000, 32, "cyclic", seed=3)
    sampler.next()
    for clone in (copy.copy(sampler), copy.deepcopy(sampler), pickle.loads(pickle.dumps(sampler))):
        assert clone.step == 1 and repr(clone) == repr(sampler)
        np.testing.assert_array_equal(clone.next(), sampler.at(1))


# --------------------------------------------------------------------- sharding


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_shards_partition_the_global_batch(mode, world):
    length, batch_size, seed = 10_007, 64, 21
    whole = Sampler(length, batch_size * world, mode, seed)
    ranks = [Sampler(length, batch_size, mode, seed, shard=(rank, world)) for rank in range(world)]
    for r in ranks:
        assert r.global_batch_size == batch_size * world
    for step in (0, 1, 2, 155, 156, 10**12):
        parts = [r.at(step) for r in ranks]
        assert all(p.shape == (batch_size,) for p in parts)
        np.testing.assert_array_equal(np.concatenate(parts), whole.at(step))
        first, last = step * whole.batch_size, (step + 1) * whole.batch_size - 1
        if mode == Sampler.Mode.CYCLIC or (
                mode == Sampler.Mode.SEQUENTIAL and first // length == last // length):
            # Disjoint: no two ranks share an index (CYCLIC: at any step).
            union = np.concatenate(parts)
            assert len(np.unique(union)) == len(union)
    # next() walks the same sequence as at(), also across a CYCLIC cycle's end
    # (10007 // (64 * world) steps per cycle).
    for r in ranks:
        for step in range(3):
            np.testing.assert_array_equal(r.next(), r.at(step))
        boundary = length // whole.batch_size
        r.seek(boundary - 2)
        for step in range(boundary - 2, boundary + 2):
            np.testing.assert_array_equal(r.next(), r.at(step))


def test_shard_attributes():
    sampler = Sampler(100, 8, shard=(1, 4))
    assert sampler.shard == (1, 4)
    assert sampler.global_batch_size == 32
    assert Sampler(100, 8).shard == (0, 1)
    assert Sampler(100, 8, shard=[2, 3]).shard == (2, 3)


# --------------------------------------------------------------------- the object


def test_attributes_and_repr():
    sampler = Sampler(1000, 64, Sampler.Mode.IID, 42, step=7, shard=(1, 2))
    assert (sampler.length, sampler.batch_size, sampler.mode, sampler.seed, sampler.step) == (1000, 64, Sampler.Mode.IID, 42, 7)
    assert Sampler(10, 1).mode is Sampler.Mode.CYCLIC
    for name in ("length", "batch_size", "mode", "seed", "shard", "step", "global_batch_size"):
        with pytest.raises(AttributeError):
            setattr(sampler, name, 1)
    text = repr(sampler)
    for part in ("length=1000", "batch_size=64", "Sampler.Mode.IID", "seed=42", "step=7", "shard=(1, 2)"):
        assert part in text


def test_mode_spellings():
    assert [int(m) for m in MODES] == [0, 1, 2]
    assert Sampler.Mode("CyClIc") is Sampler.Mode.CYCLIC
    for spelling, mode in (("sequential", "SEQUENTIAL"), ("IID", "IID"), ("Cyclic", "CYCLIC"), (0, "SEQUENTIAL"), (2, "CYCLIC"), (np.int64(1), "IID")):
        assert Sampler(10, 2, spelling).mode is Sampler.Mode[mode]


@pytest.mark.parametrize(
    "kwargs, error, shown",
    [
        (dict(length=0), ValueError, "0"),
        (dict(length=-5), ValueError, "-5"),
        (dict(length=2**63 + 1), ValueError, str(2**63 + 1)),
        (dict(batch_size=0), ValueError, "0"),
        (dict(batch_size=-3), ValueError, "-3"),
        (dict(step=-1), ValueError, "-1"),
        (dict(step=2**64), ValueError, str(2**64)),
        (dict(seed=-1), ValueError, "-1"),
        (dict(seed=2**64), ValueError, str(2**64)),
        (dict(shard=(2, 2)), ValueError, "(2, 2)"),
        (dict(shard=(0, 0)), ValueError, "(0, 0)"),
        (dict(shard=(-1, 2)), ValueError, "(-1, 2)"),
        (dict(shard=3), ValueError, "3"),
        (dict(shard=(1, 2, 3)), ValueError, "(1, 2, 3)"),
        (dict(shard="01"), ValueError, "'01'"),
        (dict(mode="random"), ValueError, "'random'"),
        (dict(mode=3), ValueError, "3"),
        (dict(length=10.0), TypeError, "10.0"),
        (dict(length="10"), TypeError, "'10'"),
        (dict(batch_size=None), TypeError, "None"),
        (dict(batch_size=True), TypeError, "True"),
        (dict(seed=1.5), TypeError, "1.5"),
        (dict(step=2.0), TypeError, "2.0"),
        (dict(mode=2.0), TypeError, "2.0"),
        (dict(shard=(0.0, 2)), TypeError, "0.0"),
    ],
)
def test_validation(kwargs, error, shown):
    args = dict(length=100, batch_size=8)
    args.update(kwargs)
    length = args.pop("length")
    batch_size = args.pop("batch_size")
    with pytest.raises(error, match=re.escape(shown)):
        Sampler(length, batch_size, **args)


def test_validation_of_steps_after_construction():
    sampler = Sampler(100, 8)
    with pytest.raises(ValueError, match="-2"):
        sampler.seek(-2)
    with pytest.raises(ValueError, match=re.escape(str(2**64))):
        sampler.at(2**64)
    with pytest.raises(TypeError, match="'3'"):
        sampler.at("3")
    assert sampler.step == 0
