"""The ragged fast paths of the typed stores at scale: one flat buffer
(`gather(packed=True)`), a bounded number of native calls per batch (dense
and ragged), and what a ragged append takes and refuses."""
from __future__ import annotations


import numpy as np
import pytest
from _helpers import assert_same

import loaderx._lib
import loaderx._records
import loaderx._store
import loaderx.bytestore
import loaderx.dense
import loaderx.ragged
from loaderx.errors import CorruptStoreError, IdentityError
from loaderx.zrecord import DenseStore, RaggedStore
from _typed import DTYPES, assert_same_list, make_dense, make_ragged


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


@pytest.mark.parametrize("dtype", [np.uint8, np.int32])
def test_a_step_of_ragged_records_decodes_to_offsets_and_refuses_a_torn_size(dtype):
    """The decode every ragged read ends in (`_records.variable_batch`): the
    records' element offsets and values, and a size that is not a multiple
    of the item refused naming the record's index."""
    records = [np.arange(n, dtype=dtype) + n for n in (3, 0, 5)]
    buf = np.concatenate([r.view(np.uint8) for r in records])
    raw = np.array([r.nbytes for r in records], np.uint64)
    aux = np.zeros(3, np.uint64)
    idx = np.array([7, 8, 9], np.uint64)
    values, splits = loaderx._records.variable_batch("ragged", np.dtype(dtype), buf, raw, aux,
                                                     idx, "s", None, True)
    assert splits.tolist() == [0, 3, 3, 8]
    assert values.dtype == dtype and values.tolist() == np.concatenate(records).tolist()
    if np.dtype(dtype).itemsize > 1:
        torn = raw.copy()
        torn[2] -= 1  # record 9's size loses a byte
        with pytest.raises(CorruptStoreError, match="record 9 has a damaged size"):
            loaderx._records.variable_batch("ragged", np.dtype(dtype), buf, torn, aux, idx,
                                            "s", None, True)


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
