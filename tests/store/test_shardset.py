"""Tests of `loaderx.ShardSet`: one store split into 1, 2 and 7 shards reads
exactly like the store (every read form, every kind, values and order), works
as a DataLoader stream with identical batches, refuses mismatched shards by
naming both, and keeps the store contracts (IndexError, out=, close)."""

from __future__ import annotations

import numpy as np
import pytest
from _helpers import assert_same

from loaderx import DataLoader, DenseStore, RaggedStore, ShardSet, Zrecord
from loaderx.errors import ClosedError, IdentityError, ReadOnlyError, RecordIndexError, SizeMismatchError

ROWS = 300
SPLITS = {1: [ROWS], 2: [120, 180], 7: [40, 1, 0, 99, 60, 50, 50]}


def _data(rng):
    dense = rng.integers(-1000, 1000, size=(ROWS, 3, 4)).astype(np.int32)
    lengths = rng.integers(0, 20, size=ROWS)
    ragged = [rng.integers(0, 50_000, size=(n, 2)).astype(np.int32) for n in lengths]
    blobs = [bytes(rng.integers(0, 256, size=int(n) * 3, dtype=np.uint8)) for n in lengths]
    return dense, ragged, blobs


def _write(root, name, dense, ragged, blobs, sizes, codec):
    """Three columns split at `sizes`; returns (dense, ragged, bytes) store lists."""
    cuts = np.concatenate([[0], np.cumsum(sizes)])
    out = ([], [], [])
    for k in range(len(sizes)):
        lo, hi = int(cuts[k]), int(cuts[k + 1])
        d = DenseStore(root / f"{name}-d{k}", np.int32, (3, 4), codec=codec)
        d.append(dense[lo:hi])
        r = RaggedStore(root / f"{name}-r{k}", np.int32, codec=codec)
        r.append(ragged[lo:hi])
        z = Zrecord(root / f"{name}-z{k}", create=True, codec=codec)
        z.append(blobs[lo:hi])
        for lst, s in zip(out, (d, r, z)):
            lst.append(s)
    return out


@pytest.fixture(scope="module")
def split_sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(7)
    dense, ragged, blobs = _data(rng)
    whole = _write(root, "whole", dense, ragged, blobs, [ROWS], "zstd")
    sets = {}
    for count, sizes in SPLITS.items():
        stores = _write(
            root, f"s{count}", dense, ragged, blobs, sizes, "raw" if count == 2 else "zstd"
        )
        sets[count] = tuple(ShardSet(lst) for lst in stores)
    yield (dense, ragged, blobs), tuple(s[0] for s in whole), sets
    for trio in sets.values():
        for parts in trio:
            for store in parts.shards:
                store.close()
    for s in whole:
        s[0].close()


def _requests(rng):
    return [
        rng.integers(0, ROWS, size=64),
        rng.integers(-ROWS, ROWS, size=33),
        np.arange(ROWS),
        np.arange(ROWS)[::-1].copy(),
        np.array([5, 5, 5, 299, 0, 120, 119]),
        np.zeros(0, dtype=np.int64),
        np.array([40, 41, 42], dtype=np.uint64),
    ]


@pytest.mark.parametrize("count", sorted(SPLITS))
def test_gathers_equal_the_single_store(split_sets, count):
    (dense, ragged, blobs), (wd, wr, wz), sets = split_sets
    sd, sr, sz = sets[count]
    assert len(sd) == len(sr) == len(sz) == ROWS
    assert len(sd) == sum(len(p) for p in sd.shards)
    assert sd.lengths == tuple(SPLITS[count])
    for idx in _requests(np.random.default_rng(count)):
        expected_rows = np.asarray(idx, dtype=np.int64) % ROWS
        assert_same(sd.gather(idx), dense[expected_rows])
        assert_same(sd[idx], wd[idx])
        out = np.full((len(idx), 3, 4), -1, np.int32)
        assert sd.gather(idx, out=out) is out
        assert_same(out, dense[expected_rows])
        got = sr.gather(idx)
        assert isinstance(got, list) and len(got) == len(idx)
        for g, i in zip(got, expected_rows):
            assert_same(g, ragged[i])
        values, splits = sr.gather(idx, packed=True)
        wvalues, wsplits = wr.gather(idx, packed=True)
        assert_same(values, wvalues)
        assert_same(splits, wsplits)
        assert sz.gather(idx) == [blobs[i] for i in expected_rows]
        assert sz[idx] == wz[idx]


@pytest.mark.parametrize("count", sorted(SPLITS))
def test_scalar_slice_and_mask_reads(split_sets, count):
    (dense, ragged, blobs), _, sets = split_sets
    sd, sr, sz = sets[count]
    for i in (0, 39, 40, 41, 119, 120, ROWS - 1, -1, -ROWS):
        assert_same(sd[i], dense[i])
        assert_same(sr[i], ragged[i])
        assert sz[i] == blobs[i]
    assert_same(sd[10:200:7], dense[10:200:7])
    mask = np.random.default_rng(3).random(ROWS) < 0.3
    assert_same(sd[mask], dense[mask])
    assert [r.tobytes() for r in sr[-5:]] == [r.tobytes() for r in ragged[-5:]]
    assert sz[[2, -2]] == [blobs[2], blobs[-2]]


@pytest.mark.parametrize("count", sorted(SPLITS))
def test_errors_like_a_store(split_sets, count):
    _, _, sets = split_sets
    sd, sr, sz = sets[count]
    for parts in (sd, sr, sz):
        for bad in (ROWS, -ROWS - 1):
            with pytest.raises(IndexError):
                parts[bad]
            with pytest.raises(RecordIndexError):
                parts.gather(np.array([0, bad]))
        with pytest.raises(IndexError):
            parts[np.ones(ROWS + 1, bool)]
        with pytest.raises(TypeError):
            parts.gather(np.array([0.5]))
    with pytest.raises(IdentityError):
        sd.gather([1, 2], out=np.zeros((2, 3, 4), np.int64))
    with pytest.raises(SizeMismatchError):
        sd.gather([1, 2], out=np.zeros((3, 3, 4), np.int32))
    with pytest.raises(SizeMismatchError):
        sd.gather([1, 2], out=np.zeros((2, 4, 3), np.int32).transpose(0, 2, 1))
    values, splits = sd.gather([1, 0], packed=True)  # a dense batch, packed
    assert values.shape == (6, 4) and splits.tolist() == [0, 3, 6]
    with pytest.raises(TypeError):
        sr.gather([1], out=np.zeros(1))


@pytest.mark.parametrize("count", sorted(SPLITS))
def test_loader_batches_equal_the_single_store(split_sets, count):
    _, whole, sets = split_sets
    names = ("x", "tokens", "blob")
    expected = DataLoader(dict(zip(names, whole)), batch_size=32, seed=5, workers=2, prefetch=2)
    got = DataLoader(dict(zip(names, sets[count])), batch_size=32, seed=5, workers=2, prefetch=2)
    with expected, got:
        for _ in range(25):  # 800 records: more than two passes over the 300
            a, b = next(expected), next(got)
            assert_same(b["x"], a["x"])
            assert [t.tobytes() for t in b["tokens"]] == [t.tobytes() for t in a["tokens"]]
            assert b["blob"] == a["blob"]


def test_loader_out_buffers_and_shard(split_sets):
    _, whole, sets = split_sets
    bufs = [np.empty((16, 3, 4), np.int32) for _ in range(5)]
    a = DataLoader({"x": whole[0]}, batch_size=16, seed=1, workers=1, prefetch=2, shard=(1, 2))
    b = DataLoader(
        {"x": sets[7][0]},
        batch_size=16,
        seed=1,
        workers=1,
        prefetch=2,
        shard=(1, 2),
        out={"x": bufs},
    )
    with a, b:
        for _ in range(10):
            want = next(a)["x"]
            got = next(b)["x"]
            assert any(got is buf for buf in bufs)
            assert_same(got, want)


def test_mismatched_shards_are_refused_naming_both(tmp_path):
    a = DenseStore(tmp_path / "a", np.float32, (4,))
    b = DenseStore(tmp_path / "b", np.float32, (5,))
    c = DenseStore(tmp_path / "c", np.float64, (4,))
    r = RaggedStore(tmp_path / "r", np.float32)
    with pytest.raises(IdentityError) as e:
        ShardSet([a, b])
    msg = str(e.value)
    assert "item_shape=(4,)" in msg and "item_shape=(5,)" in msg
    assert str(tmp_path / "a") in msg and str(tmp_path / "b") in msg
    with pytest.raises(IdentityError, match="dtype=float32.*dtype=float64"):
        ShardSet([a, c])
    with pytest.raises(IdentityError, match="kind=dense.*kind=ragged"):
        ShardSet([a, r])
    with pytest.raises(ValueError):
        ShardSet([])
    with pytest.raises(TypeError):
        ShardSet(str(tmp_path / "a"))
    with pytest.raises(TypeError):
        ShardSet([np.zeros(3)])
    for s in (a, b, c, r):
        assert not s.closed  # a refused set leaves the caller's stores alone
        s.close()


def test_paths_are_opened_and_closed_by_the_set(tmp_path):
    for k in range(3):
        with DenseStore(tmp_path / f"p{k}", np.uint8, (2,), codec="raw") as s:
            s.append(np.full((k + 1, 2), k, np.uint8))
    parts = ShardSet([tmp_path / f"p{k}" for k in range(3)])
    assert repr(parts) == (
        "ShardSet(3 shards, len=6, kind='dense', dtype=uint8, item_shape=(2,), " "codec='raw')"
    )
    assert parts.codec == "raw" and parts.record_bytes == 2
    assert parts.stats()["records"] == 6
    parts.verify()
    assert_same(parts[:], np.array([[0, 0], [1, 1], [1, 1], [2, 2], [2, 2], [2, 2]], np.uint8))
    shards = parts.shards
    with parts:
        pass
    assert parts.closed and all(s.closed for s in shards)
    assert repr(parts) == "ShardSet(closed)"
    with pytest.raises(ClosedError):
        parts[0]
    with pytest.raises(ClosedError):
        len(parts)
    parts.close()  # idempotent


def test_mixed_codecs_and_pickling_as_a_reference(tmp_path):
    """A ShardSet pickles as a reference to its shards' paths (torch workers,
    multiprocessing spawn), reopened read-only."""
    import pickle

    a = DenseStore(tmp_path / "a", np.int16, (), codec="raw")
    b = DenseStore(tmp_path / "b", np.int16, (), codec="zstd")
    a.append(np.arange(3, dtype=np.int16))
    b.append(np.arange(3, 6, dtype=np.int16))
    with a, b:
        parts = ShardSet([a, b])
        assert parts.codec == "mixed"
        assert parts.item_shape == ()
        assert_same(parts[[5, 0, 3]], np.array([5, 0, 3], np.int16))
        again = pickle.loads(pickle.dumps(parts))
        assert_same(again[[5, 0, 3]], np.array([5, 0, 3], np.int16))
        assert [s.path for s in again.shards] == [a.path, b.path]
        with pytest.raises(ReadOnlyError):
            again.shards[0].append(np.zeros(1, np.int16))
        again.close()
        parts.close()
        assert not a.closed and not b.closed
