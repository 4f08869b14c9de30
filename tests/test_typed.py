"""Tests of the typed NumPy stores, `DenseStore` and `RaggedStore`.

Every read form is checked byte for byte against numpy's own indexing of the
source data (values, dtype, shape and order), for every codec, a range of
dtypes and item shapes, and through the whole life of a store: after reopen,
append, delete (against a model of swap-last) and compact. Then the `out=`
contract of `gather`, the ragged fast paths (one flat buffer, a bounded number
of native calls per batch), type identity, the API common to both stores, and
dictionary training.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from _helpers import assert_same, expected_moves, swap_last_order

import loaderx._lib
import loaderx._records
import loaderx._store
import loaderx.bytestore
import loaderx.dense
import loaderx.ragged
import loaderx.zrecord as zrecord
from loaderx.errors import (
    ArgumentTypeError,
    ClosedError,
    CorruptStoreError,
    DictionaryError,
    IdentityError,
    InvalidArgumentError,
    RecordIndexError,
    ZrecordError,
)
from loaderx.zrecord import DenseStore, RaggedStore, Zrecord, train_dict

CODECS = ("raw", "zstd", "zstd_dict")
STRUCT = np.dtype([("a", "<i4"), ("b", "<f8", (2,))])
DTYPES = {
    "float32": np.dtype(np.float32),
    "int16": np.dtype(np.int16),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
    "struct": STRUCT,
}
ITEM_SHAPES = ((), (7,), (3, 4, 5))
ZSTD_DICT_MAGIC = bytes.fromhex("37a430ec")


_TEXTS = [f'{{"id": {i}, "text": "record number {i}"}}'.encode() for i in range(400)]


# ----------------------------------------------------------------- helpers


def assert_same_list(got, expected) -> None:
    assert isinstance(got, list), type(got)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert_same(g, e)


def _values(dtype: np.dtype, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    """Compressible values of `dtype` (including the extremes of integer types)."""
    if dtype.names:
        a = np.zeros(shape, dtype)
        a["a"] = rng.integers(-1000, 1000, shape)
        a["b"] = rng.integers(-50, 50, shape + (2,)) / 4
        return a
    if dtype == np.bool_:
        return rng.random(shape) < 0.3
    if dtype.kind == "f":
        return (rng.integers(-40, 40, shape) / 8).astype(dtype)
    info = np.iinfo(dtype)
    return rng.choice(np.array([info.min, 0, 1, 2, 3, 7, info.max], dtype=dtype), size=shape)


def _stamp(record: np.ndarray, ident: int) -> None:
    """Write `ident` into the record's first element where the dtype can hold it,
    so any mix-up of records shows."""
    if record.size == 0 or record.dtype == np.bool_:
        return
    flat = record.reshape(-1)
    if record.dtype.names:
        flat["a"][0] = ident
    else:
        flat[0] = np.array(ident).astype(record.dtype)


def make_dense(dtype: np.dtype, item_shape: tuple, count: int, seed: int, first: int = 0) -> np.ndarray:
    """`count` compressible records, each stamped with its index."""
    a = _values(dtype, (count,) + item_shape, np.random.default_rng(seed))
    for i in range(count):
        _stamp(a[i:i + 1], first + i)
    return a


def make_ragged(dtype: np.dtype, count: int, seed: int, first: int = 0) -> list[np.ndarray]:
    """Records of rank 0, 1, 2 and 3 and zero-length ones, in a fixed rotation,
    each stamped with its index."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        kind = i % 7
        if kind == 0:
            shape = ()
        elif kind in (1, 2):
            shape = (int(rng.integers(1, 30)),)
        elif kind == 3:
            shape = (int(rng.integers(1, 6)), int(rng.integers(1, 6)))
        elif kind == 4:
            shape = tuple(int(d) for d in rng.integers(1, 4, 3))
        elif kind == 5:
            shape = (0,)
        else:
            shape = ((0, 3), (2, 0, 4))[i % 2]
        r = np.array(_values(dtype, shape, rng), dtype=dtype, order="C").reshape(shape)
        _stamp(r, first + i)
        out.append(r)
    return out


def swap_last(n: int, key) -> list[int]:
    """The model of `delete` (see _helpers.swap_last_order) for any key."""
    return swap_last_order(n, np.atleast_1d(np.arange(n)[key]).tolist())


def codec_kwargs(codec: str, sample) -> dict:
    if codec == "zstd_dict":
        return {"codec": codec, "dict_bytes": train_dict(sample, tier="fast")}
    return {"codec": codec}


def index_cases(n: int, seed: int) -> list[np.ndarray]:
    """Integer index arrays with repeats and negatives, and a bool mask."""
    rng = np.random.default_rng(seed)
    cases = [
        rng.integers(-n, n, size=3 * n),                 # repeats and negatives
        np.array([n - 1, 0, -1, -n, 0, n // 2, n // 2]),  # explicit edges, repeated
        rng.permutation(n),                              # everything, shuffled
    ]
    return cases


def check_dense_reads(ds: DenseStore, ref: np.ndarray, seed: int = 0) -> None:
    n = len(ref)
    item_shape = ref.shape[1:]
    assert len(ds) == n
    assert ds.dtype == ref.dtype
    assert ds.item_shape == item_shape
    for i in range(n):
        got = ds[i]
        assert np.shape(got) == item_shape
        assert_same(got, ref[i])
    assert_same(ds[np.int64(n - 1)], ref[n - 1])
    assert_same(ds[-1], ref[-1])
    assert_same(ds[-n], ref[-n])
    if n >= 3:
        assert_same(ds[0, n - 1, 1], ref[[0, n - 1, 1]])
        assert_same(ds[2, 2, -1], ref[[2, 2, -1]])
    for s in (slice(None), slice(1, n - 1), slice(2, n, 3), slice(None, None, -1),
              slice(n - 2, 1, -2), slice(n, n + 5), slice(0, 0), slice(-5, None)):
        assert_same(ds[s], ref[s])
    for idx in index_cases(n, seed):
        assert_same(ds[idx], ref[idx])
        assert_same(ds[idx.tolist()], ref[idx])
        assert_same(ds.gather(idx), ref[idx])
        buf = np.empty((len(idx),) + item_shape, ds.dtype)
        result = ds.gather(idx, out=buf)
        assert result is buf
        assert_same(buf, ref[idx])
    assert_same(ds[np.arange(n, dtype=np.uint64)[::-1]], ref[::-1])
    mask = np.random.default_rng(seed).random(n) < 0.4
    assert_same(ds[mask], ref[mask])
    assert_same(ds[mask.tolist()], ref[mask])
    for empty in ([], np.array([], dtype=np.int64), np.zeros(n, dtype=bool)):
        got = ds[empty]
        assert got.shape == (0,) + item_shape
        assert got.dtype == ref.dtype
    for bad in (n, -n - 1, [0, n], np.array([-n - 1, 0]), (0, n)):
        with pytest.raises(IndexError):
            ds[bad]
    with pytest.raises(IndexError):
        ds[np.ones(n + 1, dtype=bool)]


def check_ragged_reads(rs: RaggedStore, model: list, seed: int = 0) -> None:
    n = len(model)
    assert len(rs) == n
    for i in range(n):
        got = rs[i]
        assert isinstance(got, np.ndarray)
        assert_same(got, model[i])
    assert_same(rs[-1], model[-1])
    assert_same(rs[-n], model[-n])
    assert_same_list(rs[0, n - 1, 1], [model[0], model[n - 1], model[1]])
    for s in (slice(None), slice(1, n - 1), slice(2, n, 3), slice(None, None, -1),
              slice(n - 2, 1, -2), slice(n, n + 5), slice(-5, None)):
        assert_same_list(rs[s], model[s])
    for idx in index_cases(n, seed):
        expected = [model[i] for i in idx]
        assert_same_list(rs[idx], expected)
        assert_same_list(rs[idx.tolist()], expected)
        assert_same_list(rs.gather(idx), expected)
    mask = np.random.default_rng(seed).random(n) < 0.4
    assert_same_list(rs[mask], [m for m, keep in zip(model, mask) if keep])
    assert rs[[]] == []
    assert rs[np.array([], dtype=np.int64)] == []
    for bad in (n, -n - 1, [0, n], np.array([-n - 1])):
        with pytest.raises(IndexError):
            rs[bad]


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


# ----------------------------------------------------------------- 3. ragged fast paths at scale

BIG_COUNT = 100_000


@pytest.fixture(scope="module")
def big_ragged(tmp_path_factory):
    """100k int32 token sequences, lognormal lengths clipped to 16..2048 (~42 MB)."""
    rng = np.random.default_rng(31)
    lengths = np.clip(rng.lognormal(np.log(64), 1.0, BIG_COUNT).astype(np.int64), 16, 2048)
    tokens = rng.integers(0, 32000, int(lengths.sum()), dtype=np.int32)
    records = np.split(tokens, np.cumsum(lengths)[:-1])
    path = tmp_path_factory.mktemp("big") / "tokens"
    rs = RaggedStore(path, np.int32, codec="zstd")
    assert rs.append(iter(records)) == 0
    yield rs, records, lengths
    rs.close()


def test_big_ragged_store_shape(big_ragged):
    rs, records, lengths = big_ragged
    assert len(rs) == BIG_COUNT
    assert lengths.min() == 16
    assert lengths.max() == 2048
    st = rs.stats()
    assert st["records"] == BIG_COUNT
    assert st["chunk_bytes"] == st["live_bytes"] + st["reclaimable"]


def test_gather_packed_equals_concatenated_list(big_ragged):
    rs, records, lengths = big_ragged
    rng = np.random.default_rng(32)
    for idx in (rng.integers(-BIG_COUNT, BIG_COUNT, 256), rng.integers(0, BIG_COUNT, 4096),
                np.array([5]), np.array([], dtype=np.int64)):
        listed = rs[idx]
        assert len(listed) == len(idx)
        for got, i in zip(listed, idx):
            assert_same(got, records[i])
        values, row_splits = rs.gather(idx, packed=True)
        assert values.dtype == np.int32
        assert row_splits.dtype == np.int64
        expected = np.concatenate(listed) if listed else np.zeros(0, np.int32)
        assert_same(values, expected)
        assert_same(row_splits, np.concatenate([[0], np.cumsum(lengths[idx])]).astype(np.int64))
    values, row_splits = rs.gather(slice(1000, 1010), packed=True)
    assert_same(values, np.concatenate(records[1000:1010]))
    assert row_splits[-1] == lengths[1000:1010].sum()


class CountingLib:
    """Stands in for the cffi library object and counts native calls by name."""

    def __init__(self, real):
        self._real = real
        self.calls: list[str] = []

    def __getattr__(self, name):
        target = getattr(self._real, name)
        if not callable(target):
            return target

        def call(*args, **kwargs):
            self.calls.append(name)
            return target(*args, **kwargs)
        return call


@pytest.fixture
def count_native(monkeypatch):
    counter = CountingLib(loaderx._lib.lib)
    for module in (loaderx._store, loaderx._records, loaderx.dense, loaderx.ragged, loaderx.bytestore,
                   loaderx._lib):
        if hasattr(module, "lib"):
            monkeypatch.setattr(module, "lib", counter)
    return counter


def test_ragged_batch_read_makes_few_native_calls(big_ragged, count_native):
    rs, records, _ = big_ragged
    idx = np.random.default_rng(33).integers(0, BIG_COUNT, 256)
    count_native.calls.clear()
    batch = rs[idx]
    assert len(batch) == 256
    # One native call reads sizes, shapes and bytes from one snapshot.
    assert count_native.calls.count("lx_gather_alloc") == 1, count_native.calls
    assert len(count_native.calls) <= 3, count_native.calls
    count_native.calls.clear()
    rs.gather(idx, packed=True)
    assert len(count_native.calls) <= 4, count_native.calls
    for got, i in zip(batch, idx):
        assert_same(got, records[i])


def test_ragged_mixed_rank_batch_read_makes_few_native_calls(tmp_path, count_native):
    model = make_ragged(np.dtype(np.int32), 300, seed=34)
    with RaggedStore(tmp_path / "mixed", np.int32) as rs:
        rs.append(model)
        idx = np.random.default_rng(34).integers(0, 300, 256)
        count_native.calls.clear()
        got = rs[idx]
        assert len(count_native.calls) <= 4, count_native.calls
        assert_same_list(got, [model[i] for i in idx])


def test_dense_batch_read_makes_few_native_calls(tmp_path, count_native):
    ref = make_dense(DTYPES["float32"], (7,), 500, seed=35)
    with DenseStore(tmp_path / "d", np.float32, (7,)) as ds:
        ds.append(ref)
        idx = np.random.default_rng(35).integers(0, 500, 256)
        count_native.calls.clear()
        got = ds[idx]
        assert len(count_native.calls) <= 4, count_native.calls
        assert_same(got, ref[idx])


def test_gather_packed_shared_trailing_dims(tmp_path):
    recs = [np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((0, 3), np.float32),
            np.ones((4, 3), np.float32)]
    with RaggedStore(tmp_path / "r", np.float32) as rs:
        rs.append(recs)
        values, row_splits = rs.gather([2, 0, 1, 0], packed=True)
        assert_same(values, np.concatenate([recs[2], recs[0], recs[1], recs[0]]))
        assert row_splits.tolist() == [0, 4, 6, 6, 8]


def test_gather_packed_rejects_mismatched_trailing_dims(tmp_path):
    recs = [np.zeros((2, 3), np.int32), np.zeros((4, 5), np.int32), np.zeros(7, np.int32),
            np.array(5, dtype=np.int32)]
    with RaggedStore(tmp_path / "r", np.int32) as rs:
        rs.append(recs)
        with pytest.raises(ValueError, match=r"\(4, 5\)") as e:
            rs.gather([0, 1], packed=True)
        assert "3" in str(e.value)
        with pytest.raises(ValueError, match=r"\(7,\)|\(2, 3\)"):
            rs.gather([0, 2], packed=True)
        with pytest.raises(ValueError, match="scalar"):
            rs.gather([2, 3], packed=True)
        # Each alone is fine.
        values, row_splits = rs.gather([1], packed=True)
        assert values.shape == (4, 5)
        assert row_splits.tolist() == [0, 4]


def test_hostile_ragged_shape_is_refused_at_read(tmp_path):
    """A ragged record whose stored shape is (0, 2**64 - 1): before the fix,
    numpy's ValueError escaped the read."""
    path = tmp_path / "r"
    with RaggedStore(path, np.int32) as rs:
        rs.append([np.zeros((0, 3), np.int32)])
    # Patch the aux shape words in place: [ndim=2, 0, 3] -> [2, 0, 2**64-1].
    data = bytearray((path / "data").read_bytes())
    words = np.array([2, 0, 3], "<u8").tobytes()
    at = data.index(words)
    data[at + 16:at + 24] = (2**64 - 1).to_bytes(8, "little")
    (path / "data").write_bytes(data)
    with RaggedStore(path) as rs:
        with pytest.raises(CorruptStoreError, match="record 0"):
            rs[0]


def test_ragged_append_one_pass_generator(tmp_path):
    with RaggedStore(tmp_path / "g", np.int64) as rs:
        consumed = []

        def gen():
            for k in range(50):
                consumed.append(k)
                yield np.full(k % 5, k, dtype=np.int64)
        assert rs.append(gen()) == 0
        assert consumed == list(range(50))
        assert len(rs) == 50
        for k in range(50):
            assert_same(rs[k], np.full(k % 5, k, dtype=np.int64))


def test_ragged_append_python_lists(tmp_path):
    with RaggedStore(tmp_path / "l", np.int16) as rs:
        assert rs.append([[1, 2, 3], [4], [], [[1, 2], [3, 4]], 7]) == 0
        got = rs[:]
        assert_same(got[0], np.array([1, 2, 3], np.int16))
        assert_same(got[1], np.array([4], np.int16))
        assert_same(got[2], np.zeros(0, np.int16))
        assert_same(got[3], np.array([[1, 2], [3, 4]], np.int16))
        assert_same(got[4], np.array(7, np.int16))


def test_ragged_append_bytes_for_uint8(tmp_path):
    with RaggedStore(tmp_path / "b", np.uint8) as rs:
        assert rs.append([b"hello", bytearray(b"\x00\xff"), b"", memoryview(b"xyz")]) == 0
        got = rs[:]
        assert [g.tobytes() for g in got] == [b"hello", b"\x00\xff", b"", b"xyz"]
        assert all(g.dtype == np.uint8 for g in got)


def test_ragged_append_wrong_dtype(tmp_path):
    with RaggedStore(tmp_path / "w", np.int32) as rs:
        rs.append([np.arange(3, dtype=np.int32)])
        with pytest.raises(IdentityError, match="int64"):
            rs.append([np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int64)])
        assert len(rs) == 1
        with pytest.raises(TypeError):
            rs.append([np.arange(3, dtype=np.float32)])
        with pytest.raises(IdentityError):
            rs.append([b"bytes into an int32 store"])
        assert len(rs) == 1
        assert_same(rs[0], np.arange(3, dtype=np.int32))


def test_ragged_append_is_atomic_per_call(tmp_path):
    """zrecord's contract: "``append`` is atomic per call". A bad record after
    more good ones than one internal chunk (16384 records) must not leave the
    earlier records committed."""
    good = [np.full(1, k, np.int32) for k in range(20_000)]
    with RaggedStore(tmp_path / "a", np.int32, codec="raw") as rs:
        rs.append(good[:3])
        with pytest.raises(IdentityError):
            rs.append(good + [np.zeros(1, np.int64)])
        assert len(rs) == 3


def test_ragged_append_refuses_floats_for_an_integer_store(tmp_path):
    """Before the fix, ``rs.append([[1.5, 2.7]])`` on an int32 store stored
    ``[1, 2]``: the fractions were truncated silently."""
    with RaggedStore(tmp_path / "r", np.int32) as rs:
        for record in ([1.5, 2.7], np.float64(3.9), [np.float32(1.0)], [1 + 2j]):
            with pytest.raises(TypeError, match="record 0 .*float|record 0 .*complex"):
                rs.append([record])
        assert len(rs) == 0
        rs.append([[1, 2], 3, [True]])  # Python ints and bools still convert
        assert [r.tolist() for r in rs[:]] == [[1, 2], 3, [1]]
        with pytest.raises(OverflowError, match="record 1"):
            rs.append([[1], [2**40]])
        assert len(rs) == 3
    with RaggedStore(tmp_path / "c", np.float32) as rf:
        with pytest.raises(TypeError, match="record 0 .*complex"):
            rf.append([[1 + 2j]])


def test_ragged_append_refuses_one_flat_array(tmp_path):
    """``rs.append(tokens)`` with one 1-D array stored one 0-d record per token,
    silently: a document appended without its brackets. It is refused, naming
    the fix; nothing is stored. (0-d records in a list stay allowed.)"""
    with RaggedStore(tmp_path / "r", np.int32) as rs:
        for records in (np.arange(5, dtype=np.int32), np.arange(5.0)):
            with pytest.raises(TypeError, match=r"5 scalar records; pass \[array\]"):
                rs.append(records)
        assert len(rs) == 0
        rs.append([np.arange(5, dtype=np.int32), np.int32(7)])
        assert rs[0].tolist() == [0, 1, 2, 3, 4] and rs[1].shape == ()


# ----------------------------------------------------------------- 4. identity

def test_reopen_keeps_identity(tmp_path):
    for codec in CODECS:
        data = make_dense(DTYPES["int16"], (3, 4, 5), 20, seed=41)
        path = tmp_path / codec
        with DenseStore(path, np.int16, (3, 4, 5), **codec_kwargs(codec, data)) as ds:
            ds.append(data)
            dictionary = ds.dictionary()
        with DenseStore(path) as ds:
            assert (ds.dtype, ds.item_shape, ds.codec) == (np.dtype(np.int16), (3, 4, 5), codec)
            assert ds.dictionary() == dictionary
            assert_same(ds[:], data)
        # Passing the same identity again opens and checks it.
        with DenseStore(path, np.int16, (3, 4, 5)) as ds:
            assert len(ds) == 20


def test_dense_identity_mismatch_names_both(tmp_path):
    path = tmp_path / "d"
    with DenseStore(path, np.float32, (3,)) as ds:
        ds.append(np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError) as e:
        DenseStore(path, np.int16, (3,))
    assert "float32" in str(e.value) and "int16" in str(e.value)
    with pytest.raises(TypeError) as e:
        DenseStore(path, np.float32, (4,))
    assert "(3,)" in str(e.value) and "(4,)" in str(e.value)
    with DenseStore(path) as ds:  # untouched
        assert (ds.dtype, ds.item_shape, len(ds)) == (np.dtype(np.float32), (3,), 2)


def test_ragged_identity_mismatch_names_both(tmp_path):
    path = tmp_path / "r"
    RaggedStore(path, np.int32).close()
    with pytest.raises(TypeError) as e:
        RaggedStore(path, np.float64)
    assert "int32" in str(e.value) and "float64" in str(e.value)


def test_kind_mismatch(tmp_path):
    dense, ragged, raw = tmp_path / "dense", tmp_path / "ragged", tmp_path / "raw"
    DenseStore(dense, np.float32, (2,)).close()
    RaggedStore(ragged, np.float32).close()
    Zrecord(raw, create=True).close()
    for cls, path in ((DenseStore, ragged), (RaggedStore, dense), (DenseStore, raw), (RaggedStore, raw)):
        with pytest.raises(TypeError):
            cls(path)
    with pytest.raises(TypeError):
        DenseStore(ragged, np.float32, (2,))
    with pytest.raises(TypeError):
        RaggedStore(dense, np.float32)
    with pytest.raises(TypeError):
        Zrecord(dense)


def test_missing_store_is_not_created(tmp_path):
    for cls in (DenseStore, RaggedStore):
        with pytest.raises(FileNotFoundError):
            cls(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()


def test_object_dtype_refused(tmp_path):
    with pytest.raises(TypeError):
        DenseStore(tmp_path / "d", object, (2,))
    with pytest.raises(TypeError):
        RaggedStore(tmp_path / "r", object)
    with pytest.raises(TypeError):
        DenseStore(tmp_path / "s", np.dtype([("a", "<i4"), ("o", "O")]), ())
    assert not (tmp_path / "d").exists()
    assert not (tmp_path / "r").exists()
    assert not (tmp_path / "s").exists()


def test_structured_dtype_round_trips(tmp_path):
    nested = np.dtype([("id", "<u8"), ("pos", "<f4", (3,)), ("tag", "S4"),
                       ("inner", [("x", "<i2"), ("y", "u1")])])
    data = np.zeros(6, nested)
    data["id"] = np.arange(6)
    data["pos"] = np.arange(18, dtype=np.float32).reshape(6, 3)
    data["tag"] = [b"ab", b"cd", b"", b"abcd", b"x", b"yz"]
    data["inner"]["x"] = -np.arange(6)
    data["inner"]["y"] = 200
    with DenseStore(tmp_path / "d", nested, ()) as ds:
        ds.append(data)
    with DenseStore(tmp_path / "d") as ds:
        assert ds.dtype == nested
        assert ds.dtype.names == nested.names
        assert_same(ds[:], data)
        assert_same(ds[3], data[3])
    with RaggedStore(tmp_path / "r", nested) as rs:
        rs.append([data[:2], data[2:]])
    with RaggedStore(tmp_path / "r") as rs:
        assert rs.dtype == nested
        assert_same_list(rs[:], [data[:2], data[2:]])


def test_dense_append_wrong_dtype_or_shape(tmp_path):
    with DenseStore(tmp_path / "d", np.float32, (3, 4)) as ds:
        ds.append(np.zeros((2, 3, 4), np.float32))
        with pytest.raises(IdentityError, match="float64"):
            ds.append(np.zeros((2, 3, 4), np.float64))
        with pytest.raises(ValueError, match=r"\(2, 4, 3\)"):
            ds.append(np.zeros((2, 4, 3), np.float32))
        with pytest.raises(ValueError):
            ds.append(np.zeros((3, 4), np.float32))  # one record without the batch axis
        with pytest.raises(TypeError):
            ds.append([[[0.0] * 4] * 3])
        assert len(ds) == 2
        # A non-contiguous batch of the right type is fine.
        src = np.arange(48, dtype=np.float32).reshape(4, 4, 3).transpose(0, 2, 1)
        assert ds.append(src) == 2
        assert_same(ds[2:], src)


@pytest.mark.parametrize("cls", ["dense", "ragged"])
@pytest.mark.parametrize("case", ["dict-codec-without-dict", "dict-with-zstd", "dict-with-raw", "garbage-dict"])
def test_dictionary_errors_leave_nothing(tmp_path, cls, case):
    path = tmp_path / "store"
    kwargs = {
        "dict-codec-without-dict": {"codec": "zstd_dict"},
        "dict-with-zstd": {"codec": "zstd", "dict_bytes": train_dict(make_dense(DTYPES["uint8"], (64,), 50, 42), "fast")},
        "dict-with-raw": {"codec": "raw", "dict_bytes": b"\x37\xa4\x30\xec" + bytes(200)},
        "garbage-dict": {"codec": "zstd_dict", "dict_bytes": b"this is not a zstd dictionary" * 10},
    }[case]
    with pytest.raises(DictionaryError) as e:
        if cls == "dense":
            DenseStore(path, np.uint8, (64,), **kwargs)
        else:
            RaggedStore(path, np.uint8, **kwargs)
    assert isinstance(e.value, ValueError)
    assert not path.exists(), os.listdir(path)


def test_compression_level_is_selectable(tmp_path):
    rng = np.random.default_rng(43)
    words = [w.encode() for w in ("alpha", "beta", "gamma", "delta", "records", "loader", "zstd",
                                  "compression", "dictionary", "store", "the", "of", "and")]
    text = b" ".join(words[i] for i in rng.integers(0, len(words), 200_000))
    data = np.frombuffer(text[:16 * 65536], np.uint8).reshape(16, 65536)
    sizes = {}
    for level in (1, 19):
        with DenseStore(tmp_path / f"l{level}", np.uint8, (65536,), codec="zstd", level=level) as ds:
            assert ds.level == level
            ds.append(data)
            sizes[level] = ds.stats()["live_bytes"]
            assert_same(ds[:], data)
    assert sizes[19] < sizes[1] < data.nbytes
    with pytest.raises(TypeError):
        DenseStore(tmp_path / "bad", np.uint8, (4,), level="high")


def test_unknown_codec(tmp_path):
    with pytest.raises(ValueError, match="lz4"):
        DenseStore(tmp_path / "d", np.uint8, (4,), codec="lz4")
    assert not (tmp_path / "d").exists()


def test_codec_and_level_of_the_wrong_kind_are_named(tmp_path):
    """Before the fix, ``codec=["zstd"]`` raised "unhashable type: 'list'" and
    ``level=2**40`` cffi's "integer 1099511627776 does not fit 'int'"."""
    with pytest.raises(InvalidArgumentError, match="codec"):
        DenseStore(tmp_path / "a", np.int8, (), codec=["zstd"])
    with pytest.raises(InvalidArgumentError, match="level 1099511627776"):
        DenseStore(tmp_path / "b", np.int8, (), level=2**40)
    with pytest.raises(ValueError, match="tier"):
        train_dict(_TEXTS, [])


def test_level_zero_is_refused_before_anything_is_created(tmp_path):
    """level=0 passed the argument check, the store was created at zstd's
    default (3), then the reopen check refused 0 != 3 and left the new store
    behind."""
    with pytest.raises(InvalidArgumentError, match="level 0 is not a zstd level"):
        DenseStore(tmp_path / "d", np.uint8, (4,), level=0)
    assert not (tmp_path / "d").exists()


# ----------------------------------------------------------------- 5. the common API

def _dense(path):
    ds = DenseStore(path, np.int32, (5,), codec="zstd")
    ds.append(np.arange(100, dtype=np.int32).reshape(20, 5))
    return ds


def _ragged(path):
    rs = RaggedStore(path, np.int32, codec="zstd")
    rs.append([np.arange(i, dtype=np.int32) for i in range(1, 21)])
    return rs


MAKERS = {"dense": _dense, "ragged": _ragged}


@pytest.mark.parametrize("kind", list(MAKERS))
def test_common_api(tmp_path, kind):
    path = tmp_path / kind
    s = MAKERS[kind](path)
    assert len(s) == 20
    assert s.dtype == np.int32
    assert s.item_shape == ((5,) if kind == "dense" else None)
    assert s.codec == "zstd"
    assert s.path == os.fspath(path)
    text = repr(s)
    assert type(s).__name__ in text and os.fspath(path) in text and "20" in text

    st = s.stats()
    assert st["records"] == 20
    assert st["reclaimable"] == 0
    assert st["chunk_bytes"] == st["live_bytes"] + st["reclaimable"]
    assert st["live_bytes"] > 0
    s.sync()
    s.verify()

    s.delete([0, 1, 2])
    st2 = s.stats()
    assert st2["records"] == len(s) == 17
    assert st2["live_bytes"] < st["live_bytes"]
    assert st2["reclaimable"] > 0
    assert st2["chunk_bytes"] == st2["live_bytes"] + st2["reclaimable"]
    s.compact()
    st3 = s.stats()
    assert st3["records"] == 17
    assert st3["reclaimable"] == 0
    assert st3["live_bytes"] == st3["chunk_bytes"] == st2["live_bytes"]
    s.verify()
    s.close()
    s.close()  # idempotent
    assert "closed" in repr(s)


@pytest.mark.parametrize("kind", list(MAKERS))
def test_context_manager_and_closed_use(tmp_path, kind):
    path = tmp_path / kind
    with MAKERS[kind](path) as s:
        assert len(s) == 20
    assert s.closed
    calls = {
        "len": lambda: len(s),
        "getitem": lambda: s[0],
        "gather": lambda: s.gather([0]),
        "append": lambda: s.append(np.zeros((1, 5), np.int32) if kind == "dense" else [np.zeros(2, np.int32)]),
        "delete": lambda: s.delete(0),
        "compact": lambda: s.compact(),
        "stats": lambda: s.stats(),
        "sync": lambda: s.sync(),
        "verify": lambda: s.verify(),
        "enter": lambda: s.__enter__(),
    }
    if kind == "ragged":
        calls["gather_packed"] = lambda: s.gather([0], packed=True)
    for name, call in calls.items():
        with pytest.raises(ClosedError) as e:
            call()
        assert isinstance(e.value, ValueError), name
    s.close()
    # The data survived the context manager's close.
    with type(s)(path) as again:
        assert len(again) == 20


def test_sync_makes_data_visible_to_a_new_handle(tmp_path):
    with _dense(tmp_path / "d") as ds:
        ds.sync()
        with DenseStore(tmp_path / "d") as other:
            assert_same(other[:], np.arange(100, dtype=np.int32).reshape(20, 5))


# ----------------------------------------------------------------- 6. train_dict

def _dict_source(count=200, width=256, seed=51):
    rng = np.random.default_rng(seed)
    vocab = np.frombuffer(b"loaderx records stores zstd dictionary training samples ", np.uint8)
    return vocab[rng.integers(0, len(vocab), (count, width))] ^ (rng.random((count, width)) < 0.02).astype(np.uint8)


def _usable(dictionary: bytes, tmp_path, data, name) -> None:
    assert dictionary.startswith(ZSTD_DICT_MAGIC)
    with DenseStore(tmp_path / name, data.dtype, data.shape[1:], codec="zstd_dict", dict_bytes=dictionary) as ds:
        ds.append(data)
        assert ds.dictionary() == dictionary
        assert_same(ds[:], data)
        ds.verify()


def test_train_dict_from_array_iterable_and_store(tmp_path):
    data = _dict_source()
    from_array = train_dict(data, tier="fast")
    _usable(from_array, tmp_path, data, "a")
    from_bytes = train_dict((row.tobytes() for row in data), tier="fast")
    _usable(from_bytes, tmp_path, data, "b")
    with DenseStore(tmp_path / "src-dense", np.uint8, (256,)) as ds:
        ds.append(data)
        from_dense = train_dict(ds, tier="fast")
    _usable(from_dense, tmp_path, data, "c")
    with RaggedStore(tmp_path / "src-ragged", np.uint8) as rs:
        rs.append(row[: 100 + i % 100] for i, row in enumerate(data))
        from_ragged = train_dict(rs, tier="fast")
    _usable(from_ragged, tmp_path, data, "d")


def test_train_dict_tiers_and_size(tmp_path):
    data = _dict_source(count=400, width=512)
    caps = {"fast": 32 << 10, "balanced": 128 << 10, "max": 1 << 20}
    for tier, cap in caps.items():
        d = train_dict(data, tier=tier)
        assert 0 < len(d) <= cap
        assert d.startswith(ZSTD_DICT_MAGIC)
    assert train_dict(data) == train_dict(data, tier="balanced")  # the default tier, deterministic
    small = train_dict(data, tier="max", size=2048)
    assert 0 < len(small) <= 2048
    _usable(small, tmp_path, data, "small")
    with pytest.raises(ValueError):
        train_dict(data, size=100)


def test_train_dict_bad_tier_and_too_few_samples(tmp_path):
    data = _dict_source()
    with pytest.raises(ValueError, match="huge"):
        train_dict(data, tier="huge")
    with pytest.raises(DictionaryError):
        train_dict([b"abc", b"def", b"ghi"], tier="fast")
    with pytest.raises(DictionaryError):
        train_dict(data[:3], tier="fast")
    with pytest.raises(DictionaryError):
        train_dict(np.zeros((0, 16), np.uint8))
    with pytest.raises(DictionaryError):
        train_dict([b""] * 50)
    with RaggedStore(tmp_path / "empty", np.uint8) as rs:
        with pytest.raises(DictionaryError):
            train_dict(rs)
    with pytest.raises(TypeError):
        train_dict([object()] * 20)


def test_train_dict_on_a_few_bytes_is_a_clear_error_not_a_crash():
    # Eight one-byte samples once crashed zstd's trainer inside the library.
    with pytest.raises(DictionaryError, match="too small"):
        train_dict([bytes([i]) for i in range(8)], tier="fast")


@pytest.fixture(scope="module")
def dictionary():
    return train_dict(_TEXTS, "fast")


@pytest.mark.parametrize("bad, kind", [
    ("abc", ArgumentTypeError), (5, ArgumentTypeError), ([1, 2], ArgumentTypeError),
])
def test_dict_bytes_must_be_bytes_like(tmp_path, bad, kind):
    """Before the fix, ``dict_bytes="abc"`` raised "string argument without an
    encoding" and ``dict_bytes=5`` was read as five zero bytes ("not a zstd
    dictionary")."""
    with pytest.raises(kind, match="dict_bytes"):
        Zrecord(tmp_path / "z", create=True, codec="zstd_dict", dict_bytes=bad)


def test_dict_bytes_as_a_numpy_array(tmp_path, dictionary):
    """Before the fix, a numpy array of the dictionary's bytes raised numpy's
    "truth value of an array ... is ambiguous"."""
    arr = np.frombuffer(dictionary, np.uint8)
    with Zrecord(tmp_path / "z", create=True, codec="zstd_dict", dict_bytes=arr) as z:
        z.append(_TEXTS[:5])
        assert z.dictionary() == dictionary
    with Zrecord(tmp_path / "z", dict_bytes=arr) as z:  # reopen: the same dictionary
        assert z[4] == _TEXTS[4]


def test_train_dict_refuses_an_absurd_size():
    """Before the fix, ``size=2**40`` raised a bare MemoryError with no
    message (and a size just under physical memory was zero-filled first)."""
    with pytest.raises(ValueError, match="size"):
        train_dict(_TEXTS, size=2**40)


def test_numpy_ints_are_ints_for_level_and_dictionary_size(tmp_path):
    """level= and train_dict(size=) take numpy integers, as threads= and seq_len do."""
    rng = np.random.default_rng(0)
    with DenseStore(tmp_path / "d", np.uint8, (64,), level=np.int64(5)) as ds:
        assert ds.level == 5 and type(ds.level) is int
        ds.append(rng.integers(0, 4, (300, 64), dtype=np.uint8))
        d = train_dict(ds, size=np.int32(1024))
        assert 0 < len(d) <= 1024
