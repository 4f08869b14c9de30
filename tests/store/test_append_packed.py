"""`RaggedStore.append_packed` and `Zrecord.append_packed`: records given as
one flat buffer plus offsets (the form `gather(idx, packed=True)` returns and Arrow uses) store
exactly what the per-record `append` stores, in as many chunks as it takes,
as one atomic append; bad offsets or dtypes raise and store nothing."""
from __future__ import annotations

import numpy as np
import pytest

import loaderx._store
from _helpers import assert_same
from loaderx import RaggedStore, Zrecord
from loaderx.errors import IdentityError

CODECS = ["raw", "zstd"]


def _packed(rng, count: int, trailing: tuple = (), dtype=np.int32):
    lengths = rng.integers(0, 40, count)
    lengths[::7] = 0  # empty records among them
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.integers(-1000, 1000, (int(splits[-1]),) + trailing).astype(dtype)
    return values, splits


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("trailing", [(), (3,), (2, 2)])
def test_ragged_packed_equals_per_record_append(tmp_path, codec, trailing):
    rng = np.random.default_rng(1)
    values, splits = _packed(rng, 300, trailing)
    records = [values[splits[i]:splits[i + 1]] for i in range(300)]
    with RaggedStore(tmp_path / "a", np.int32, codec=codec) as a, \
            RaggedStore(tmp_path / "b", np.int32, codec=codec) as b:
        a.append([np.arange(5, dtype=np.int32).reshape((5,) + (1,) * len(trailing))
                  if trailing else np.arange(5, dtype=np.int32)])
        assert a.append_packed(values, splits) == 1
        b.append(records)
        assert len(a) == 301 and len(b) == 300
        got = a[1:]
        for i, record in enumerate(records):
            assert_same(got[i], record)
        assert_same(a.gather(np.arange(1, 301), packed=True)[0], b.gather(np.arange(300), packed=True)[0])
        a.verify()
        b.verify()


@pytest.mark.parametrize("codec", CODECS)
def test_zrecord_packed_equals_per_record_append(tmp_path, codec):
    texts = [f"record {i} " * (i % 9) for i in range(500)]
    encoded = [t.encode() for t in texts]
    offsets = np.concatenate([[0], np.cumsum([len(e) for e in encoded])])
    data = b"".join(encoded)
    with Zrecord(tmp_path / "z", create=True, codec=codec) as z:
        assert z.append_packed(data, offsets) == 0
        assert z.append_packed(np.frombuffer(data, np.uint8), offsets.astype(np.uint32)) == 500
        assert z[:] == encoded + encoded
        z.verify()


def test_many_chunks_are_one_atomic_append(tmp_path, monkeypatch):
    """Cut into chunks of 7 records (and of a few hundred bytes): every record
    lands in order, and a failure in a later chunk publishes none of them."""
    monkeypatch.setattr(loaderx._store, "APPEND_CHUNK_RECORDS", 7)
    monkeypatch.setattr(loaderx._store, "APPEND_CHUNK_BYTES", 300)
    rng = np.random.default_rng(2)
    values, splits = _packed(rng, 200)
    with RaggedStore(tmp_path / "r", np.int32) as store:
        store.append_packed(values, splits)
        for i in range(200):
            assert_same(store[i], values[splits[i]:splits[i + 1]])
        calls = []
        real = store._append_raw

        def failing(*args, stage=False):
            calls.append(stage)
            if len(calls) == 3:
                raise OSError("injected: the third chunk fails")
            return real(*args, stage=stage)

        monkeypatch.setattr(store, "_append_raw", failing)
        with pytest.raises(OSError, match="third chunk"):
            store.append_packed(values, splits)
        assert calls[:2] == [True, True]
        monkeypatch.undo()
        assert len(store) == 200
        store.verify()


def test_no_records_is_a_no_op(tmp_path):
    with RaggedStore(tmp_path / "r", np.float32) as r, Zrecord(tmp_path / "z", create=True) as z:
        r.append([np.ones(2, np.float32)])
        assert r.append_packed(np.zeros(0, np.float32), [0]) == 1
        assert z.append_packed(b"", np.array([0])) == 0
        assert len(r) == 1 and len(z) == 0


@pytest.mark.parametrize("splits, error, message", [
    ([1, 4], ValueError, "must start at 0, not 1"),
    ([0, 3], ValueError, "must end at the 4 rows of the values, not at 3"),
    ([0, 3, 2, 4], ValueError, "decreases at record 1: 3 -> 2"),
    ([0.0, 4.0], TypeError, "must be integers, not float64"),
    ([], ValueError, "at least one entry"),
    ([[0, 4]], ValueError, "one-dimensional"),
    (np.array([0, 2**64 - 1], np.uint64), ValueError, "past the 4 rows"),
])
def test_bad_offsets_raise_and_store_nothing(tmp_path, splits, error, message):
    with RaggedStore(tmp_path / "r", np.int32) as r, Zrecord(tmp_path / "z", create=True) as z:
        with pytest.raises(error, match=message.replace("(", r"\(")):
            r.append_packed(np.arange(4, dtype=np.int32), splits)
        with pytest.raises(error, match=message.replace("rows", "bytes").split(" bytes")[0]):
            z.append_packed(b"abcd", splits)
        assert len(r) == 0 and len(z) == 0


def test_bad_values_raise(tmp_path):
    with RaggedStore(tmp_path / "r", np.int32) as r, Zrecord(tmp_path / "z", create=True) as z:
        with pytest.raises(IdentityError, match="values have dtype int64, store holds int32"):
            r.append_packed(np.arange(4), [0, 4])
        with pytest.raises(ValueError, match=r"1 to \d+ dimensions, got shape \(\)"):
            r.append_packed(np.int32(3), [0, 1])
        with pytest.raises(TypeError, match="data is a list, not a bytes-like object"):
            z.append_packed([1, 2], [0, 2])
        assert len(r) == 0 and len(z) == 0
