"""TokenWindows: windows equal slices of the concatenated token stream (raw
and zstd documents, with and without a separator, one store and a ShardSet),
segments restart per document, the index file grows with the durable
documents, a delete refuses every window built before it, windows are a
native DataLoader stream (no Python thread), in a Mixture, sharded; long
documents are stored in zstd frames and a window decodes only its own; a
store of token ids and a flat array read as one document. (windows.idx
against hostile files: test_windows_index.py.)"""
from __future__ import annotations

import pickle
import struct
import threading

import numpy as np
import pytest
from _lxformat import WINDOWS_INDEX_NAME, StoreImage, unpack_windows_index

from loaderx import (
    DataLoader,
    DenseStore,
    Mixture,
    RaggedStore,
    ShardSet,
    TokenWindows,
    convert,
    from_iterator,
    open_dataset,
)
from loaderx.errors import (
    CorruptStoreError,
    IdentityError,
    RecordIndexError,
    SizeMismatchError,
)


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


def index_file(path):
    """(header, ends) of the store's windows.idx."""
    return unpack_windows_index((path / WINDOWS_INDEX_NAME).read_bytes())


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


def test_the_index_file_covers_durable_documents_and_grows_with_them(tmp_path):
    docs = make_docs(4, 50)
    with RaggedStore(tmp_path / "t", np.int32) as rs:
        rs.append(docs)
        TokenWindows(rs, seq_len=8)
        assert not (tmp_path / "t" / "windows.idx").exists()  # nothing durable yet
        rs.sync()
        TokenWindows(rs, seq_len=8)
        assert index_file(tmp_path / "t")[0]["docs"] == 50
        more = make_docs(5, 20)
        rs.append(more)
        grown = TokenWindows(rs, seq_len=8)
        want, _ = expected(docs + more, 8)
        np.testing.assert_array_equal(grown[np.arange(len(grown))], want)
    # close() synced: the next construction extends the file to every document.
    with RaggedStore(tmp_path / "t") as rs:
        again = TokenWindows(rs, seq_len=8, separator=3)
        want, _ = expected(docs + more, 8, 3)
        np.testing.assert_array_equal(again[np.arange(len(again))], want)
    header, ends = index_file(tmp_path / "t")
    assert header["docs"] == 70 and ends[-1] == 4 * sum(len(d) for d in docs + more)


def test_windows_built_before_a_delete_are_refused(tmp_path):
    """A delete moves the last documents into the holes; with documents of one
    length the moved ones would read as the deleted ones. Every read of the old
    index (the untouched first window too, in a DataLoader too) is refused, also
    after appends bring the store back to its old length; windows built before
    an append keep reading, and a new index reads the documents as they are now."""
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
        with pytest.raises(SizeMismatchError, match="deleted since the window index was built"):
            tw[[0]]
        with pytest.raises(SizeMismatchError, match="deleted since"):
            next(iter(DataLoader({"t": tw}, batch_size=2)))
        shards[1].append([docs[3]])  # back to its old length, in another order
        with pytest.raises(SizeMismatchError, match="deleted since"):
            tw[np.arange(len(tw))]
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


def test_token_windows_seq_len_past_uint64(tmp_path):
    """Before the fix, ``seq_len=2**70`` raised cffi's "int too big to convert"."""
    with RaggedStore(tmp_path / "r", np.int32) as rs:
        rs.append([np.arange(9, dtype=np.int32)])
        with pytest.raises(ValueError, match="seq_len"):
            TokenWindows(rs, 2**70)


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
# ----------------------------------------------------------------- bounded decode

def test_long_documents_are_stored_in_frames_and_read_whole(tmp_path):
    """Integer ragged stores write records longer than frame_size as zstd
    frames plus a seek table (the default for token documents); rs[i],
    gather_packed and verify() see whole documents as before."""
    rng = np.random.default_rng(20)
    docs = [rng.integers(0, 50, n).astype(np.uint16) for n in (0, 5, 2048, 2049, 20000, 70000)]
    with RaggedStore(tmp_path / "t", np.uint16) as rs:
        assert rs.frame_size == 4096
        rs.append(docs)
        for i, d in enumerate(docs):
            np.testing.assert_array_equal(rs[i], d)
        values, splits = rs.gather([5, 2, 4], packed=True)
        np.testing.assert_array_equal(values, np.concatenate([docs[5], docs[2], docs[4]]))
        rs.verify()
    with RaggedStore(tmp_path / "t") as rs:
        assert rs.frame_size == 4096
        tw = TokenWindows(rs, seq_len=100, separator=1)
        want, want_seg = expected(docs, 100, 1)
        np.testing.assert_array_equal(tw[np.arange(len(tw))], want)
        np.testing.assert_array_equal(tw.segments[np.arange(len(tw))], want_seg)
    data = (tmp_path / "t" / "data").read_bytes()
    assert data.count(struct.pack("<I", 0x8F92EAB1)) >= 3  # seekable magic: 3 framed records


def test_a_window_decodes_only_the_frames_it_reads(tmp_path):
    """A damaged frame in the middle of a long document fails the windows
    that read it, and only those: the others never decode it."""
    doc = (np.arange(100000) % 251).astype(np.uint16)  # 49 frames of 2048 tokens
    with RaggedStore(tmp_path / "t", np.uint16) as rs:
        rs.append([doc])
    img = StoreImage.load(tmp_path / "t")
    loc = img.loc(0)
    _, stored = img.record_parts(loc)
    table = stored[-(9 + 8 * 49) - 8:]
    sizes = struct.unpack_from("<98I", table, 8)
    start = loc["offset"] + sum(sizes[0:2 * 20:2])  # frame 20: tokens 40960..43007
    data = bytearray((tmp_path / "t" / "data").read_bytes())
    data[start + sizes[40] // 2] ^= 0xFF
    (tmp_path / "t" / "data").write_bytes(bytes(data))
    with RaggedStore(tmp_path / "t") as rs:
        tw = TokenWindows(rs, seq_len=512)
        for w in range(len(tw)):
            if w * 512 + 512 < 40960 or w * 512 >= 43008:
                np.testing.assert_array_equal(tw[w], doc[w * 512:w * 512 + 513])
            else:
                with pytest.raises(CorruptStoreError, match="document 0 is damaged"):
                    tw[w]
        with pytest.raises(CorruptStoreError):
            rs[0]


def test_frame_size_is_chosen_at_create(tmp_path):
    with RaggedStore(tmp_path / "f", np.float32) as rs:
        assert rs.frame_size == 0  # not tokens
    with RaggedStore(tmp_path / "r", np.int32, codec="raw") as rs:
        assert rs.frame_size == 0
    with RaggedStore(tmp_path / "w", np.int64, frame_size=65536) as rs:
        assert rs.frame_size == 65536
    with pytest.raises(IdentityError, match="frame_size=65536"):
        RaggedStore(tmp_path / "w", frame_size=4096)
    for bad in (1, 63, 2**30 + 1, -1, 1.5, True):
        with pytest.raises(ValueError, match="frame_size"):
            RaggedStore(tmp_path / f"bad{bad}", np.int32, frame_size=bad)
    with pytest.raises(ValueError, match="zstd codecs"):
        RaggedStore(tmp_path / "rawf", np.int32, codec="raw", frame_size=4096)
    with from_iterator(tmp_path / "it", (np.arange(n, dtype=np.int32) for n in (3, 4))) as rs:
        assert rs.frame_size == 4096


def test_converted_token_columns_are_framed(tmp_path):
    """The HF/Parquet `input_ids` path gets the token layout by default."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(21)
    ids = [rng.integers(0, 500, n).tolist() for n in (3000, 10, 9000)]
    pq.write_table(pa.table({"input_ids": pa.array(ids, pa.list_(pa.int32()))}),
                   tmp_path / "t.parquet")
    convert(str(tmp_path / "t.parquet"), str(tmp_path / "ds"))
    col = open_dataset(str(tmp_path / "ds"))["input_ids"]
    try:
        stores = getattr(col, "shards", [col])
        assert all(s.frame_size == 4096 for s in stores)
        tw = TokenWindows(col, seq_len=64)
        want, _ = expected([np.array(x, np.int32) for x in ids], 64)
        np.testing.assert_array_equal(tw[np.arange(len(tw))], want)
    finally:
        col.close()


# ----------------------------------------------------------------- one token stream

def test_a_store_of_token_ids_is_one_document(tmp_path):
    """A raw DenseStore of scalar token ids (how a 1-D array converts) is one
    document, read natively; a ShardSet of them is one document per shard."""
    tokens = (np.arange(5000) % 977).astype(np.uint16)
    with DenseStore(tmp_path / "d", np.uint16, codec="raw") as ds:
        ds.append(tokens)
        tw = TokenWindows(ds, seq_len=64)
        want = TokenWindows.from_array(tokens, 64)[np.arange(len(tw))]
        assert len(tw) == (5000 - 1) // 64
        np.testing.assert_array_equal(tw[np.arange(len(tw))], want)
        assert not tw.segments[np.arange(len(tw))].any()
        with DataLoader({"t": tw}, batch_size=8, seed=1) as loader:
            for row in next(loader)["t"]:
                assert (want == row).all(axis=1).any()
        ds.append(tokens[:10])  # appended tokens are not in the windows built before
        np.testing.assert_array_equal(tw[len(tw) - 1], want[-1])
    shards = [DenseStore(tmp_path / f"s{k}", np.uint16, codec="raw") for k in range(3)]
    shards[0].append(tokens[:700])
    shards[2].append(tokens[700:])
    tw = TokenWindows(ShardSet(shards), seq_len=50, separator=9)
    want, want_seg = expected([tokens[:700], tokens[700:]], 50, 9)
    np.testing.assert_array_equal(tw[np.arange(len(tw))], want)
    np.testing.assert_array_equal(tw.segments[np.arange(len(tw))], want_seg)
    for s in shards:
        s.close()
    with DenseStore(tmp_path / "z", np.uint16, codec="zstd") as z:
        z.append(tokens)
        with pytest.raises(ValueError, match="raw"):
            TokenWindows(z, 8)
    with DenseStore(tmp_path / "v", np.uint16, (4,), codec="raw") as v:
        v.append(tokens.reshape(-1, 4))
        with pytest.raises(TypeError, match="from_array"):
            TokenWindows(v, 8)


def test_a_flat_token_array_reads_as_windows(tmp_path):
    """TokenWindows.from_array: nanoGPT's token file as it is (a memmap), or
    any 1-D integer array; a DataLoader stream; pickles (a memmap by file)."""
    tokens = (np.arange(3001) * 7 % 50000).astype(np.uint16)
    tokens.tofile(tmp_path / "train.bin")
    mm = np.memmap(tmp_path / "train.bin", dtype=np.uint16, mode="r")
    tw = TokenWindows.from_array(mm[1:], 100)
    assert len(tw) == (3000 - 1) // 100 and tw.item_shape == (101,)
    np.testing.assert_array_equal(tw[3], tokens[301:402])
    out = np.empty((2, 101), np.uint16)
    assert tw.gather([0, 28], out=out) is out
    np.testing.assert_array_equal(out[1], tokens[2801:2902])
    again = pickle.loads(pickle.dumps(tw))
    np.testing.assert_array_equal(again[np.arange(len(again))], tw[np.arange(len(tw))])
    with DataLoader({"tokens": tw, "segments": tw.segments}, batch_size=4, seed=0) as loader:
        batch = next(loader)
        assert batch["tokens"].shape == (4, 101) and not batch["segments"].any()
    with pytest.raises(RecordIndexError):
        tw[len(tw)]
    with pytest.raises(TypeError, match="1-D"):
        TokenWindows.from_array(tokens.reshape(-1, 1), 8)
    with pytest.raises(IdentityError, match="integers"):
        TokenWindows.from_array(tokens.astype(np.float32), 8)
    with pytest.raises(TypeError, match="from_array"):
        TokenWindows(tokens, 8)
    with pytest.raises(ValueError, match="seq_len"):
        TokenWindows.from_array(tokens, 0)


def test_a_flat_array_is_refused_by_a_ragged_store_and_converts_to_one_document(tmp_path):
    with RaggedStore(tmp_path / "r", np.int32) as rs:
        with pytest.raises(TypeError, match="TokenWindows.from_array"):
            rs.append(np.arange(10, dtype=np.int32))
    # convert: a raw scalar column (select's form), which TokenWindows reads as one document.
    np.save(tmp_path / "tokens.npy", np.arange(1000, dtype=np.uint16))
    ds = convert(str(tmp_path / "tokens.npy"), str(tmp_path / "out"))
    tw = TokenWindows(ds["tokens"], 100)
    assert len(tw) == 9
    np.testing.assert_array_equal(tw[1], np.arange(100, 201, dtype=np.uint16))
    ds["tokens"].close()


def test_a_shard_emptied_by_a_delete_does_not_refuse_new_windows(tmp_path):
    """Every part of a ShardSet counts in the delete check, empty ones too."""
    docs = make_docs(22, 40)
    shards = [RaggedStore(tmp_path / f"s{k}", np.int32) for k in range(3)]
    shards[0].append(docs[:20])
    shards[1].append([docs[20]])
    shards[2].append(docs[21:])
    shards[1].delete([0])
    tw = TokenWindows(ShardSet(shards), seq_len=8, separator=2)
    want, want_seg = expected(docs[:20] + docs[21:], 8, 2)
    np.testing.assert_array_equal(tw[np.arange(len(tw))], want)
    np.testing.assert_array_equal(tw.segments[np.arange(len(tw))], want_seg)
    for s in shards:
        s.close()


def test_a_column_with_nulls_is_refused_naming_the_fill_that_makes_it_a_corpus(tmp_path):
    """Before, a nullable token column was refused as "not Column", which
    said neither why nor what to do."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import loaderx

    docs = [[1, 2, 3], None, [4, 5], [6, 7, 8, 9]]
    pq.write_table(pa.table({"tok": pa.array(docs, pa.list_(pa.int32()))}), tmp_path / "t.pq")
    ds = loaderx.convert(tmp_path / "t.pq", tmp_path / "nulls", progress=False)
    with pytest.raises(TypeError, match=r"column 'tok' has nulls .*convert it with "
                                        r"fill_null=\{'tok': \[\]\}"):
        TokenWindows(ds["tok"], 2)
    filled = loaderx.convert(tmp_path / "t.pq", tmp_path / "filled", progress=False,
                             fill_null={"tok": []})
    windows = TokenWindows(filled["tok"], 2)
    assert [w.tolist() for w in windows[:]] == [[1, 2, 3], [3, 4, 5], [5, 6, 7], [7, 8, 9]]
