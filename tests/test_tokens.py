"""TokenWindows: windows equal slices of the concatenated token stream (raw
and zstd documents, with and without a separator, one store and a ShardSet),
segments restart per document, the cached index is rebuilt when the store
changes, and windows are a native DataLoader stream (no Python thread), in a
Mixture, sharded."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from loaderx import DataLoader, Mixture, RaggedStore, ShardSet, TokenWindows
from loaderx.errors import IdentityError, RecordIndexError, SizeMismatchError


def make_docs(seed: int, count: int, dtype=np.int32):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 60, count)
    return [rng.integers(0, 30000, n).astype(dtype) for n in lengths]


def stream_of(docs, separator=None):
    flat, seg_flat = [], []
    for i, doc in enumerate(docs):
        flat += doc.tolist()
        seg_flat += [i] * len(doc)
        if separator is not None and i + 1 < len(docs):
            flat.append(separator)
            seg_flat.append(i)
    return np.array(flat), np.array(seg_flat)


def expected(docs, seq_len, separator=None):
    flat, seg = stream_of(docs, separator)
    n = (len(flat) - 1) // seq_len
    windows = np.array([flat[i * seq_len:i * seq_len + seq_len + 1] for i in range(n)])
    segments = np.array([seg[i * seq_len:i * seq_len + seq_len + 1] - seg[i * seq_len] for i in range(n)])
    return windows, segments


@pytest.mark.parametrize("codec", ["raw", "zstd"])
@pytest.mark.parametrize("separator", [None, 7])
def test_windows_are_slices_of_the_token_stream(tmp_path, codec, separator):
    docs = make_docs(1, 300)
    with RaggedStore(tmp_path / "t", np.int32, codec=codec) as rs:
        rs.append(docs)
        tw = TokenWindows(rs, seq_len=16, separator=separator)
        want, want_seg = expected(docs, 16, separator)
        assert len(tw) == len(want)
        idx = np.random.default_rng(2).integers(0, len(tw), 200)
        np.testing.assert_array_equal(tw[idx], want[idx])
        np.testing.assert_array_equal(tw.segments[idx], want_seg[idx])
        out = np.empty((len(idx), 17), np.int32)
        assert tw.gather(idx, out=out) is out
        np.testing.assert_array_equal(out, want[idx])
        np.testing.assert_array_equal(tw[-1], want[-1])
        with pytest.raises(RecordIndexError):
            tw[len(tw)]


def test_a_shard_set_reads_as_one_corpus(tmp_path):
    docs = make_docs(3, 240, np.uint16)
    shards = []
    for k, (a, b) in enumerate([(0, 100), (100, 100), (100, 190), (190, 240)]):  # one empty shard
        rs = RaggedStore(tmp_path / f"s{k}", np.uint16)
        rs.append(docs[a:b])
        shards.append(rs)
    tw = TokenWindows(ShardSet(shards), seq_len=32, separator=0)
    want, want_seg = expected(docs, 32, 0)
    np.testing.assert_array_equal(tw[np.arange(len(tw))], want)
    np.testing.assert_array_equal(tw.segments[np.arange(len(tw))], want_seg)
    for s in shards:
        s.close()


def test_the_cached_index_is_rebuilt_when_the_store_changes(tmp_path):
    docs = make_docs(4, 50)
    with RaggedStore(tmp_path / "t", np.int32) as rs:
        rs.append(docs)
        first = TokenWindows(rs, seq_len=8)
        again = TokenWindows(rs, seq_len=8)
        assert isinstance(again._prefix, np.memmap)  # read from the cache
        more = make_docs(5, 20)
        rs.append(more)
        grown = TokenWindows(rs, seq_len=8)
        want, _ = expected(docs + more, 8)
        assert len(grown) == len(want) > len(first)
        np.testing.assert_array_equal(grown[np.arange(len(grown))], want)


def test_windows_built_before_a_delete_are_refused(tmp_path):
    """A delete moves the last documents into the holes; with documents of one
    length the moved ones would read as the deleted ones. Every read of the old
    index (the untouched first window too, in a DataLoader too) is refused,
    windows built before an append keep reading, and a new index reads the
    documents as they are now."""
    docs = [np.arange(8, dtype=np.int32) + 100 * k for k in range(6)]
    shards = [RaggedStore(tmp_path / f"s{k}", np.int32) for k in range(2)]
    shards[0].append(docs[:3])
    shards[1].append(docs[3:])
    appended = TokenWindows(shards[0], seq_len=4)
    shards[0].append([np.arange(3, dtype=np.int32)])
    np.testing.assert_array_equal(appended[[0, 4]], expected(docs[:3], 4)[0][[0, 4]])
    for store in (shards[1], ShardSet(shards)):
        tw = TokenWindows(store, seq_len=4)
        shards[1].delete([0])
        with pytest.raises(SizeMismatchError, match="deleted since the index was built"):
            tw[[0]]
        with pytest.raises(SizeMismatchError, match="deleted since"):
            next(iter(DataLoader({"t": tw}, batch_size=2)))
        shards[1].append([docs[3]])  # back to its old length, in another order
    fresh = TokenWindows(shards[1], seq_len=4)
    np.testing.assert_array_equal(fresh[np.arange(len(fresh))],
                                  expected([docs[3], docs[4], docs[3]], 4)[0])
    for s in shards:
        s.close()


def test_bad_corpora_are_refused(tmp_path):
    with RaggedStore(tmp_path / "f", np.float32) as rs:
        rs.append([np.zeros(3, np.float32)])
        with pytest.raises(IdentityError, match="integers"):
            TokenWindows(rs, 4)
    with RaggedStore(tmp_path / "m", np.int32) as rs:
        rs.append([np.zeros((2, 3), np.int32)])
        with pytest.raises(ValueError, match="1-D"):
            TokenWindows(rs, 4)
    with RaggedStore(tmp_path / "i", np.int16) as rs:
        rs.append([np.zeros(30, np.int16)])
        with pytest.raises(ValueError, match="seq_len"):
            TokenWindows(rs, 0)
        with pytest.raises(ValueError, match="separator"):
            TokenWindows(rs, 4, separator=1 << 20)


def test_windows_in_the_loader_mixture_and_shards(tmp_path):
    docs_a, docs_b = make_docs(6, 200), make_docs(7, 150)
    a = RaggedStore(tmp_path / "a", np.int32)
    a.append(docs_a)
    b = RaggedStore(tmp_path / "b", np.int32, codec="raw")
    b.append(docs_b)
    twa, twb = TokenWindows(a, 24, separator=1), TokenWindows(b, 24, separator=1)
    want_a, seg_a = expected(docs_a, 24, 1)
    want_b, _ = expected(docs_b, 24, 1)
    with DataLoader({"tokens": twa, "segments": twa.segments}, batch_size=8, seed=3, workers=2) as loader:
        for _ in range(20):
            batch = next(loader)
            assert not [t for t in threading.enumerate() if t.name.startswith("loaderx-worker")]
            # Each row is some window; its segments are that window's.
            for row, seg in zip(batch["tokens"], batch["segments"]):
                i = int(np.flatnonzero((want_a == row).all(axis=1))[0])
                np.testing.assert_array_equal(seg, seg_a[i])
    mix = Mixture({"a": {"tokens": twa}, "b": {"tokens": twb}}, {"a": 0.75, "b": 0.25})
    ranks = []
    for rank in range(2):
        with DataLoader(mix, batch_size=4, seed=9, shard=(rank, 2), workers=1) as loader:
            ranks.append([next(loader) for _ in range(10)])
    with DataLoader(mix, batch_size=8, seed=9, workers=1) as whole:
        for step in range(10):
            batch = next(whole)
            joined = np.concatenate([ranks[0][step]["tokens"], ranks[1][step]["tokens"]])
            np.testing.assert_array_equal(joined, batch["tokens"])
            for row, src in zip(batch["tokens"], batch["source"]):
                table = want_a if src == 0 else want_b
                assert (table == row).all(axis=1).any()
    a.close()
    b.close()


def test_loader_windows_never_repeat_within_a_cycle(tmp_path):
    """CYCLIC over token windows (the records of a TokenWindows stream): each
    cycle serves len(windows) // global batch whole batches, so no global
    batch repeats a window, nor does a cycle."""
    lengths = np.random.default_rng(3).integers(1, 40, 120)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    # Token t of the stream is t: a window's first token names it.
    docs = [np.arange(bounds[i], bounds[i + 1], dtype=np.int32) for i in range(len(lengths))]
    with RaggedStore(tmp_path / "w", np.int32) as rs:
        rs.append(docs)
        tw = TokenWindows(rs, seq_len=8)
        batch_size, world = 7, 3
        g = batch_size * world
        per_cycle = len(tw) // g
        assert len(tw) % g  # the dropped rest is not empty
        ranks = [DataLoader({"t": tw}, batch_size, seed=5, shard=(r, world), workers=1)
                 for r in range(world)]
        try:
            assert ranks[0].steps_per_epoch == per_cycle
            for cycle in range(3):
                seen = set()
                for _ in range(per_cycle):
                    batch = np.concatenate([next(loader)["t"] for loader in ranks])
                    first = batch[:, 0]
                    np.testing.assert_array_equal(batch, first[:, None] + np.arange(9))
                    windows = set((first // 8).tolist())
                    assert len(windows) == g, "a batch repeats a window"
                    assert not seen & windows, f"cycle {cycle} repeats a window"
                    seen |= windows
                assert len(seen) == per_cycle * g
        finally:
            for loader in ranks:
                loader.close()
