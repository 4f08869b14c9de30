"""The typed NumPy stores, `DenseStore` and `RaggedStore`, read through a
store's whole life.

Every read form is checked byte for byte against numpy's own indexing of the
source data (values, dtype, shape and order), for every codec, a range of
dtypes and item shapes, after reopen, append, delete (against a model of
swap-last) and compact. Then the `out=` contract of `gather`."""
from __future__ import annotations


import numpy as np
import pytest
from _helpers import assert_same, expected_moves

from loaderx.errors import IdentityError, ZrecordError
from loaderx.zrecord import DenseStore, RaggedStore
from _typed import (
    CODECS,
    DTYPES,
    ITEM_SHAPES,
    STRUCT,
    check_dense_reads,
    check_ragged_reads,
    codec_kwargs,
    make_dense,
    make_ragged,
    swap_last,
)


# ----------------------------------------------------------------- 1. reads through a dense store's life

@pytest.mark.parametrize("item_shape", ITEM_SHAPES, ids=lambda s: "x".join(map(str, s)) or "scalar")
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("codec", CODECS)
def test_dense_reads_through_lifecycle(tmp_path, codec, dtype_name, item_shape):
    dtype = DTYPES[dtype_name]
    ref = make_dense(dtype, item_shape, 40, seed=1)
    path = tmp_path / "dense"
    ds = DenseStore(path, dtype, item_shape, **codec_kwargs(codec, ref))
    assert ds.codec == codec
    assert ds.append(ref[:25]) == 0
    assert ds.append(ref[25:]) == 25
    check_dense_reads(ds, ref, seed=1)
    ds.close()

    ds = DenseStore(path)
    assert (ds.dtype, ds.item_shape, ds.codec) == (dtype, item_shape, codec)
    check_dense_reads(ds, ref, seed=2)
    more = make_dense(dtype, item_shape, 30, seed=3, first=40)
    assert ds.append(more) == 40
    ref = np.concatenate([ref, more])
    check_dense_reads(ds, ref, seed=3)

    before = ds.stats()
    for key in ([3, -1, 3, 10, 0, 65, 20], slice(5, 30, 4), 7, -2):
        order = swap_last(len(ref), key)
        moves = ds.delete(key)
        assert moves.tolist() == expected_moves(order)
        ref = ref[order]
        check_dense_reads(ds, ref, seed=4)
    mask = np.zeros(len(ref), dtype=bool)
    mask[[1, 4, len(ref) - 3]] = True
    order = swap_last(len(ref), mask)
    ds.delete(mask)
    ref = ref[order]
    check_dense_reads(ds, ref, seed=5)
    after = ds.stats()
    assert after["records"] == len(ref)
    assert after["live_bytes"] < before["live_bytes"]
    if ds.codec == "raw":
        # The fixed-width layout moves survivors' bytes at delete time.
        assert after["reclaimable"] == 0 and after["chunk_bytes"] == after["live_bytes"]
    else:
        assert after["reclaimable"] > 0

    ds.compact()
    assert ds.stats()["reclaimable"] == 0
    check_dense_reads(ds, ref, seed=6)
    ds.verify()
    ds.close()

    ds = DenseStore(path)
    check_dense_reads(ds, ref, seed=7)
    tail = make_dense(dtype, item_shape, 5, seed=8, first=200)
    assert ds.append(tail) == len(ref)
    ref = np.concatenate([ref, tail])
    check_dense_reads(ds, ref, seed=8)
    ds.verify()
    ds.close()


def test_dense_delete_everything_and_refill(tmp_path):
    ref = make_dense(DTYPES["int16"], (7,), 12, seed=9)
    with DenseStore(tmp_path / "d", np.int16, (7,)) as ds:
        ds.append(ref)
        ds.delete(slice(None))
        assert len(ds) == 0
        assert ds[[]].shape == (0, 7)
        with pytest.raises(IndexError):
            ds[0]
        ds.compact()
        assert ds.stats() == {"records": 0, "live_bytes": 0, "chunk_bytes": 0, "reclaimable": 0}
        assert ds.append(ref[:4]) == 0
        check_dense_reads(ds, ref[:4])


# ----------------------------------------------------------------- 1. reads through a ragged store's life

RAGGED_DTYPES = ("int32", "float32", "bool", "struct")


def _ragged_dtype(name: str) -> np.dtype:
    return STRUCT if name == "struct" else np.dtype(name)


@pytest.mark.parametrize("dtype_name", RAGGED_DTYPES)
@pytest.mark.parametrize("codec", CODECS)
def test_ragged_reads_through_lifecycle(tmp_path, codec, dtype_name):
    dtype = _ragged_dtype(dtype_name)
    model = make_ragged(dtype, 42, seed=11)
    ranks = {r.ndim for r in model}
    assert ranks == {0, 1, 2, 3}
    assert any(r.size == 0 for r in model)
    path = tmp_path / "ragged"
    rs = RaggedStore(path, dtype, **codec_kwargs(codec, model))
    assert rs.codec == codec
    assert rs.dtype == dtype
    assert rs.item_shape is None
    assert rs.append(model[:20]) == 0
    assert rs.append(iter(model[20:])) == 20
    check_ragged_reads(rs, model, seed=11)
    rs.close()

    rs = RaggedStore(path)
    assert (rs.dtype, rs.codec) == (dtype, codec)
    check_ragged_reads(rs, model, seed=12)
    more = make_ragged(dtype, 30, seed=13, first=42)
    assert rs.append(more) == 42
    model = model + more
    check_ragged_reads(rs, model, seed=13)

    for key in ([3, -1, 3, 10, 0, 65, 20], slice(5, 30, 4), 7, np.array([-2, -2, 1])):
        order = swap_last(len(model), key)
        rs.delete(key)
        model = [model[i] for i in order]
        check_ragged_reads(rs, model, seed=14)
    mask = np.zeros(len(model), dtype=bool)
    mask[[0, 5, len(model) - 1]] = True
    order = swap_last(len(model), mask)
    rs.delete(mask)
    model = [model[i] for i in order]
    check_ragged_reads(rs, model, seed=15)
    assert rs.stats()["records"] == len(model)

    rs.compact()
    assert rs.stats()["reclaimable"] == 0
    check_ragged_reads(rs, model, seed=16)
    rs.verify()
    rs.close()

    rs = RaggedStore(path)
    check_ragged_reads(rs, model, seed=17)
    tail = make_ragged(dtype, 8, seed=18, first=300)
    assert rs.append(tail) == len(model)
    model = model + tail
    check_ragged_reads(rs, model, seed=18)
    rs.verify()
    rs.close()


# ----------------------------------------------------------------- 2. gather(out=...)

SENTINEL = 77


def _out_store(tmp_path, dtype=np.float32, item_shape=(3, 4)):
    ds = DenseStore(tmp_path / "out", dtype, item_shape)
    ds.append(make_dense(np.dtype(dtype), item_shape, 10, seed=21))
    return ds


def test_gather_out_fills_the_callers_buffer(tmp_path):
    ref = make_dense(DTYPES["float32"], (3, 4), 10, seed=21)
    with _out_store(tmp_path) as ds:
        buf = np.full((4, 3, 4), SENTINEL, np.float32)
        address = buf.__array_interface__["data"][0]
        result = ds.gather([9, 0, -1, 2], out=buf)
        assert result is buf
        assert buf.__array_interface__["data"][0] == address
        assert_same(buf, ref[[9, 0, -1, 2]])
        # A reused buffer is overwritten completely the second time.
        assert ds.gather([1, 1, 1, 1], out=buf) is buf
        assert_same(buf, ref[[1, 1, 1, 1]])
        empty = np.empty((0, 3, 4), np.float32)
        assert ds.gather([], out=empty) is empty


def test_gather_out_wrong_dtype(tmp_path):
    with _out_store(tmp_path) as ds:
        buf = np.full((2, 3, 4), SENTINEL, np.float64)
        with pytest.raises(TypeError, match="float64") as e:
            ds.gather([0, 1], out=buf)
        assert isinstance(e.value, IdentityError)
        assert "float32" in str(e.value)
        assert (buf == SENTINEL).all()


@pytest.mark.parametrize("shape", [(3, 3, 4), (2, 4, 3), (2, 12), (6, 4)])
def test_gather_out_wrong_shape(tmp_path, shape):
    with _out_store(tmp_path) as ds:
        buf = np.full(shape, SENTINEL, np.float32)
        with pytest.raises(ValueError, match="shape") as e:
            ds.gather([0, 1], out=buf)
        assert isinstance(e.value, ZrecordError)
        assert str(shape) in str(e.value)
        assert (buf == SENTINEL).all()


def _non_contiguous_views():
    transposed = np.full((4, 3, 2), SENTINEL, np.float32).T     # shape (2, 3, 4), strided
    strided_base = np.full((4, 3, 4), SENTINEL, np.float32)
    strided = strided_base[::2]                                  # shape (2, 3, 4), every other record
    fortran = np.asfortranarray(np.full((2, 3, 4), SENTINEL, np.float32))
    inner_base = np.full((2, 3, 8), SENTINEL, np.float32)
    inner = inner_base[:, :, ::2]                                 # shape (2, 3, 4), gaps inside records
    return [("transposed", transposed, transposed), ("strided", strided, strided_base),
            ("fortran", fortran, fortran), ("inner-gaps", inner, inner_base)]


@pytest.mark.parametrize("name", ["transposed", "strided", "fortran", "inner-gaps"])
def test_gather_out_not_contiguous(tmp_path, name):
    view, base = {n: (v, b) for n, v, b in _non_contiguous_views()}[name]
    assert view.shape == (2, 3, 4)
    assert not view.flags.c_contiguous
    with _out_store(tmp_path) as ds:
        with pytest.raises(ValueError, match="contiguous"):
            ds.gather([0, 1], out=view)
    assert (base == SENTINEL).all()


def test_gather_out_read_only(tmp_path):
    with _out_store(tmp_path) as ds:
        buf = np.full((2, 3, 4), SENTINEL, np.float32)
        buf.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            ds.gather([0, 1], out=buf)
        assert (buf == SENTINEL).all()


def test_gather_out_not_an_array_and_bad_index(tmp_path):
    with _out_store(tmp_path) as ds:
        with pytest.raises(TypeError):
            ds.gather([0, 1], out=bytearray(96))
        buf = np.full((2, 3, 4), SENTINEL, np.float32)
        with pytest.raises(IndexError):
            ds.gather([0, 10], out=buf)
        assert (buf == SENTINEL).all()


def test_gather_out_scalar_records_strided(tmp_path):
    with DenseStore(tmp_path / "s", np.int16, ()) as ds:
        ds.append(np.arange(10, dtype=np.int16))
        base = np.full(8, SENTINEL, np.int16)
        with pytest.raises(ValueError, match="contiguous"):
            ds.gather([0, 1, 2, 3], out=base[::2])
        assert (base == SENTINEL).all()
        out = np.empty(4, np.int16)
        assert ds.gather([3, -1, 0, 3], out=out) is out
        assert out.tolist() == [3, 9, 0, 3]
