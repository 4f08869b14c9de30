"""DenseStore's read path (`ds[idx]`, `gather`): every index form gives
numpy's answer, whichever path serves it (the native fixed-width copy for raw
stores, the general one for compressed stores), and what the lean Python side
no longer checks itself is still refused, by the native call or by cffi."""
from __future__ import annotations

import numpy as np
import pytest

from loaderx import DenseStore
from loaderx.errors import ClosedError, RecordIndexError, SizeMismatchError

N = 300


@pytest.fixture(params=["raw", "zstd"])
def store(request, tmp_path):
    ref = np.random.default_rng(3).integers(-500, 500, (N, 100), dtype=np.int16)
    ds = DenseStore(tmp_path / request.param, np.int16, (100,), codec=request.param)
    ds.append(ref)
    yield ds, ref
    ds.close()


def _index_forms(rng):
    base = rng.integers(0, N, 64)
    return {
        "int64": base.astype(np.int64),
        "uint64": base.astype(np.uint64),
        "int32": base.astype(np.int32),
        "big-endian int64": base.astype(">i8"),
        "strided int64": np.repeat(base, 2)[::2],
        "negative int64": base - N,
        "list": base.tolist(),
        "empty float": np.array([]),
    }


@pytest.mark.parametrize("form", list(_index_forms(np.random.default_rng(0))))
def test_every_index_form_reads_what_numpy_reads(store, form):
    ds, ref = store
    idx = _index_forms(np.random.default_rng(5))[form]
    want = ref[np.asarray(idx, dtype=np.int64)]
    got = ds[idx]
    assert got.dtype == ref.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    out = np.full(want.shape, 7, np.int16)
    assert ds.gather(idx, out=out) is out
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("bad", [np.array([0, N, 1]), np.array([3, -N - 1]),
                                 np.array([2**63 + 5], dtype=np.uint64)])
def test_out_of_range_names_the_index_and_writes_nothing(store, bad):
    ds, _ = store
    with pytest.raises(RecordIndexError, match="out of range"):
        ds[bad]
    out = np.full((len(bad), 100), 7, np.int16)
    with pytest.raises(RecordIndexError):
        ds.gather(bad, out=out)
    assert (out == 7).all()


def test_a_two_dimensional_index_is_refused(store):
    ds, _ = store
    with pytest.raises(TypeError, match="one-dimensional"):
        ds[np.zeros((2, 2), dtype=np.int64)]


def test_out_checks_still_name_the_problem(store):
    ds, _ = store
    idx = np.arange(4, dtype=np.int64)
    read_only = np.zeros((4, 100), np.int16)
    read_only.flags.writeable = False
    with pytest.raises(SizeMismatchError, match="read-only"):
        ds.gather(idx, out=read_only)
    with pytest.raises(SizeMismatchError, match="contiguous"):
        ds.gather(idx, out=np.zeros((4, 200), np.int16)[:, ::2])
    swapped = np.zeros((4, 100), ">i2")  # equal dtype, other byte order: refused by name
    with pytest.raises(TypeError, match="dtype"):
        ds.gather(idx, out=swapped)


def test_a_closed_store_raises_on_the_fast_path(store):
    ds, _ = store
    ds.close()
    with pytest.raises(ClosedError):
        ds[np.arange(3, dtype=np.int64)]
    with pytest.raises(ClosedError):
        ds.gather(np.arange(3, dtype=np.int64), out=np.zeros((3, 100), np.int16))


def test_zero_size_records_still_check_their_indices(tmp_path):
    with DenseStore(tmp_path / "empty-records", np.float32, (0,), codec="raw") as ds:
        ds.append(np.zeros((5, 0), np.float32))
        assert ds[np.array([4, 0])].shape == (2, 0)
        with pytest.raises(RecordIndexError, match="index 7"):
            ds[np.array([1, 7])]


def test_lanes_and_inline_batches_agree(tmp_path):
    """A batch past the inline threshold runs on every lane; it reads the same."""
    ref = np.random.default_rng(4).integers(0, 255, (4000, 200), dtype=np.uint8)
    with DenseStore(tmp_path / "wide", np.uint8, (200,), codec="raw") as ds:
        ds.append(ref)
        idx = np.random.default_rng(9).integers(0, 4000, 3000)  # 600 KB: several lanes
        np.testing.assert_array_equal(ds[idx], ref[idx])
        np.testing.assert_array_equal(ds.gather(idx, threads=1), ref[idx])


@pytest.mark.parametrize("dtype", [">i8", ">u8"])
def test_byte_swapped_index_arrays_read_the_records_they_name(tmp_path, dtype):
    """Before the fix, a big-endian int64/uint64 index array took the unchecked
    fast path with its bytes read as native: index 2**56 (out of range)
    silently returned record 1, and in-range indices only worked by a detour."""
    with DenseStore(tmp_path / "d", np.int64, ()) as ds:
        ds.append(np.arange(10, dtype=np.int64))
        assert ds[np.array([3, 9], dtype)].tolist() == [3, 9]
        assert ds.gather(np.array([2], dtype)).tolist() == [2]
        with pytest.raises(RecordIndexError, match=str(2**56)):
            ds[np.array([2**56], dtype)]
        with pytest.raises(RecordIndexError, match=str(2**56)):
            ds.gather(np.array([2**56], dtype), out=np.empty(1, np.int64))


def test_malformed_index_keys_name_the_indices(tmp_path):
    """Before the fix, ``ds[1, [2]]`` raised numpy's "inhomogeneous shape"
    ValueError and ``ds[[2**64]]`` said the indices were "not object"."""
    with DenseStore(tmp_path / "d", np.int64, ()) as ds:
        ds.append(np.arange(10, dtype=np.int64))
        with pytest.raises(TypeError, match="record indices"):
            ds[1, [2]]
        with pytest.raises(RecordIndexError, match=str(2**64)):
            ds[[2**64]]
        with pytest.raises(RecordIndexError, match=str(-2**63 - 1)):
            ds[[5, -2**63 - 1]]


def test_negative_indices_of_narrow_integer_types_wrap(tmp_path):
    """Before the fix, a negative index in an int8 array raised OverflowError."""
    with DenseStore(tmp_path / "d", np.int64, ()) as ds:
        ds.append(np.arange(200))
        assert ds[np.array([-1, -128, 5], np.int8)].tolist() == [199, 72, 5]
        assert ds[np.array([-1], np.int16)].tolist() == [199]
