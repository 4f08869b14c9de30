"""Run by the original loaderx 1.7.7's interpreter (tests/_lx177.py's
virtualenv, never imported by the suite): writes every kind of store 1.7.7
writes into the directory given as argv[1], with 1.7.7's own API, and dumps
what each holds to ``expected.npz`` beside them, as 1.7.7 reads it back
(after checking, in this process, that 1.7.7 reads back what was written).

Expected values, per store NAME: a dense store's records as one array
``NAME``; a ragged store's as ``NAME.values`` (every record's bytes end to
end, uint8), ``NAME.ndim`` and ``NAME.dims`` (each record's rank, and its
dimensions end to end) and ``NAME.dtype`` (the dtype's ``str``). ``stores``
lists the names; ``codec.NAME`` and ``has_dict.NAME`` what 1.7.7 says.

Multi-chunk stores: 1.7.7 starts a new chunk file when a record would reach
its chunk's 4 GiB capacity. Rather than writing 4 GiB per chunk, this script
moves a closed store's write frontier (``meta.zr``'s tail_offset, and the
chunk file's length, sparse) to just below the capacity, then lets 1.7.7
append again: its own rollover writes the next records into the next chunk,
which 1.7.7 then reads back.
"""
import os
import struct
import sys

import numpy as np
from loaderx.utils import train_dict
from loaderx.zrecord import DICT_TIERS, DenseStore, RaggedStore

OUT = sys.argv[1]
CAPACITY = 1 << 32
RNG = np.random.default_rng(177)
WORDS = [w.encode() for w in (
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
    "sigma tau upsilon phi chi psi omega user id tag value time score label text").split()]
EXPECTED = {}


def lines(n):
    """`n` JSON-like byte records of varied length (compressible, dictionary-friendly)."""
    out = []
    for _ in range(n):
        k = int(RNG.integers(4, 24))
        words = b" ".join(WORDS[int(i)] for i in RNG.integers(0, len(WORDS), k))
        out.append(b'{"id": %d, "text": "%s"}' % (int(RNG.integers(0, 1 << 30)), words))
    return out


def dump_dense(name):
    with DenseStore(os.path.join(OUT, name)) as ds:
        EXPECTED[name] = ds[np.arange(len(ds))]
        EXPECTED["codec." + name] = np.array(ds.codec)
        EXPECTED["has_dict." + name] = np.array(ds.has_dict())


def dump_ragged(name):
    with RaggedStore(os.path.join(OUT, name)) as rs:
        recs = rs[np.arange(len(rs))] if len(rs) else []
        EXPECTED[name + ".values"] = np.frombuffer(
            b"".join(np.ascontiguousarray(r).tobytes() for r in recs), np.uint8)
        EXPECTED[name + ".ndim"] = np.array([r.ndim for r in recs], np.int64)
        EXPECTED[name + ".dims"] = np.array([d for r in recs for d in r.shape], np.int64)
        EXPECTED[name + ".dtype"] = np.array(rs.dtype.str)
        EXPECTED["codec." + name] = np.array(rs.codec)
        EXPECTED["has_dict." + name] = np.array(rs.has_dict())


def dense(name, array, **kw):
    with DenseStore(os.path.join(OUT, name), array.dtype, array.shape[1:], **kw) as ds:
        ds.append(array)
    with DenseStore(os.path.join(OUT, name)) as ds:
        assert ds[np.arange(len(ds))].tobytes() == array.tobytes(), name
    dump_dense(name)


def ragged(name, records, dtype, **kw):
    with RaggedStore(os.path.join(OUT, name), dtype, **kw) as rs:
        rs.append(records)
    with RaggedStore(os.path.join(OUT, name)) as rs:
        got = rs[np.arange(len(rs))]
        for want, have in zip(records, got):
            want = np.frombuffer(want, np.uint8) if isinstance(want, bytes) else want
            assert want.shape == have.shape and want.tobytes() == have.tobytes(), name
    dump_ragged(name)


def frontier_near_capacity(path, room):
    """Moves a closed store's write frontier to `room` bytes below its chunk's
    capacity (the chunk file extended sparsely to it)."""
    meta = os.path.join(path, "meta.zr")
    head = bytearray(open(meta, "rb").read())
    tail_chunk = struct.unpack_from("<I", head, 6)[0]
    struct.pack_into("<I", head, 10, CAPACITY - room)
    with open(os.path.join(path, f"{tail_chunk}.chunk"), "r+b") as f:
        f.truncate(CAPACITY - room)
    with open(meta, "r+b") as f:
        f.write(head)


def dense_stores():
    dense("dense_zstd", RNG.normal(size=(300, 4, 5)).astype(np.float32))
    dense("dense_raw", RNG.integers(-999, 999, size=(257, 7)).astype(np.int16), codec="raw")
    dense("dense_scalar", RNG.integers(0, 10, size=500).astype(np.int64))
    dense("dense_scalar_raw", RNG.random(123).astype(np.float64), codec="raw")
    dense("dense_bool", RNG.random((50, 3)) > 0.5, codec="raw")
    dense("dense_structured", np.array([(i, (i * 0.5, -i), b"ab%d" % i) for i in range(40)],
                                       dtype=[("a", "<i4"), ("b", "<f8", (2,)), ("c", "S4")]))
    text = np.stack([np.frombuffer(r.ljust(192)[:192], np.uint8) for r in lines(1500)])
    for tier in DICT_TIERS:
        d = train_dict(text, tier=tier)
        dense(f"dense_dict_{tier}", text, codec="zstd_dict", dict_bytes=d)
    with DenseStore(os.path.join(OUT, "dense_empty"), np.float32, (3,)):
        pass
    dump_dense("dense_empty")


def deleted_stores():
    for name, codec, compact in (("dense_deleted", "zstd", False),
                                 ("dense_deleted_compacted", "zstd", True),
                                 ("dense_raw_compacted", "raw", True)):
        x = RNG.integers(0, 1 << 20, size=(200, 6)).astype(np.int32)
        with DenseStore(os.path.join(OUT, name), x.dtype, x.shape[1:], codec=codec) as ds:
            ds.append(x)
            ds.delete(np.array([0, 5, 6, 100, 199, 150]))
            ds.delete(np.arange(0, len(ds), 7))
            if compact:
                ds.compact()
        dump_dense(name)
    recs = [RNG.integers(0, 100, size=int(n)).astype(np.int32) for n in RNG.integers(1, 40, 90)]
    with RaggedStore(os.path.join(OUT, "ragged_deleted_compacted"), np.int32) as rs:
        rs.append(recs)
        rs.delete(np.array([3, 4, 50, 89]))
        rs.compact()
    dump_ragged("ragged_deleted_compacted")


def ragged_stores():
    seqs = [RNG.integers(0, 50000, size=int(n)).astype(np.int32) for n in RNG.integers(1, 300, 200)]
    ragged("ragged_1d", seqs, np.int32)
    ragged("ragged_1d_raw", seqs, np.int32, codec="raw")
    points = [RNG.normal(size=(int(n), 3)) for n in RNG.integers(1, 60, 150)]
    ragged("ragged_nd", points, np.float64)
    mixed = [np.float32(3.5), np.arange(6, dtype=np.float32).reshape(2, 3),
             np.arange(24, dtype=np.float32).reshape(2, 3, 4), np.ones(5, np.float32)]
    ragged("ragged_mixed_ranks", mixed * 5, np.float32, codec="raw")
    blobs = lines(400)
    ragged("bytes_zstd", blobs, np.uint8)
    d = train_dict(blobs, tier="fast")
    ragged("bytes_dict", blobs, np.uint8, codec="zstd_dict", dict_bytes=d)
    d = train_dict(seqs, tier="balanced")
    ragged("ragged_dict", seqs, np.int32, codec="zstd_dict", dict_bytes=d)


def multi_chunk_stores():
    # Dense raw: 3 chunks (0.chunk, 1.chunk, 2.chunk).
    path = os.path.join(OUT, "dense_multichunk")
    first = RNG.integers(0, 255, size=(10, 3000)).astype(np.uint8)
    more = RNG.integers(0, 255, size=(10, 3000)).astype(np.uint8)
    last = RNG.integers(0, 255, size=(5, 3000)).astype(np.uint8)
    with DenseStore(path, np.uint8, (3000,), codec="raw") as ds:
        ds.append(first)
    frontier_near_capacity(path, 8000)
    with DenseStore(path) as ds:
        ds.append(more)
    frontier_near_capacity(path, 5000)
    with DenseStore(path) as ds:
        ds.append(last)
    assert sorted(n for n in os.listdir(path) if n.endswith(".chunk")) == \
        ["0.chunk", "1.chunk", "2.chunk"]
    with DenseStore(path) as ds:
        assert ds[np.arange(25)].tobytes() == np.concatenate([first, more, last]).tobytes()
    dump_dense("dense_multichunk")
    # Ragged zstd of incompressible bytes: 2 chunks.
    path = os.path.join(OUT, "ragged_multichunk")
    blobs = [RNG.bytes(int(n)) for n in RNG.integers(500, 4000, 12)]
    with RaggedStore(path, np.uint8) as rs:
        rs.append(blobs[:6])
    frontier_near_capacity(path, 6000)
    with RaggedStore(path) as rs:
        rs.append(blobs[6:])
    assert os.path.exists(os.path.join(path, "1.chunk"))
    dump_ragged("ragged_multichunk")


def sampler_runs():
    """1.7.7's sampler for some (length, batch, mode, seed), and a
    DataLoader's batches (one transform thread: batches in sampler order)."""
    from loaderx.dataloader import DataLoader
    from loaderx.zsampler import Sampler

    for mode in (0, 1, 2):
        for length, batch, seed in ((10, 4, 1), (1000, 32, 42), (1000003, 256, 7),
                                    (2**63 + 1, 8, 3), (97, 97, 0)):
            s = Sampler(length, batch, mode, seed)
            EXPECTED[f"sampler.{mode}.{length}.{batch}.{seed}"] = np.stack(
                [s.next() for _ in range(30)])
    labels = os.path.join(OUT, "dense_scalar")
    for mode, seed in ((1, 1), (2, 42), (0, 5)):
        store = DenseStore(labels)
        loader = DataLoader({"y": store}, num_workers=1, batch_size=4, mode=mode, seed=seed)
        EXPECTED[f"loader.{mode}.{seed}"] = np.stack([next(loader)["y"] for _ in range(20)])
        loader.close()
        store.close()


def main():
    os.makedirs(OUT, exist_ok=True)
    dense_stores()
    deleted_stores()
    ragged_stores()
    multi_chunk_stores()
    sampler_runs()
    names = sorted({k.split(".")[0] for k in EXPECTED
                    if not k.startswith(("codec.", "has_dict.", "sampler.", "loader."))})
    np.savez(os.path.join(OUT, "expected.npz"), stores=np.array(names), **EXPECTED)


main()
