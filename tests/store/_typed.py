"""What the tests of the typed NumPy stores (`DenseStore`, `RaggedStore`)
share: the codecs, dtypes and item shapes they sweep, record makers that
stamp each record with its number, the swap-last model of delete, index
forms, and the checks of every read form against numpy's own indexing
(values, dtype, shape and order)."""
from __future__ import annotations

import numpy as np
import pytest
from _helpers import assert_same, swap_last_order

from loaderx.zrecord import DenseStore, RaggedStore, train_dict


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
