"""Tests of loaderx.dataset: `from_numpy` (bounded-memory streaming of a large
memory-mapped array), `from_iterator`, `open_store` and `pad`."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _helpers import ROOT as REPO, assert_same

from loaderx.dataset import from_iterator, from_numpy, open_store, pad
from loaderx.errors import IdentityError, NotAStoreError, ZrecordError
from loaderx.zrecord import DenseStore, RaggedStore, Zrecord, train_dict

ROOT = Path(REPO)
STRUCT = np.dtype([("a", "<i4"), ("b", "<f8", (2,))])



# ----------------------------------------------------------------- from_numpy: 1 GiB in bounded memory

BIG_ROWS = 1 << 18          # x 1024 float32 = 1 GiB
BIG_WIDTH = 1024
MIB = 1 << 20
RSS_LIMIT_MIB = 400

_CONVERT = textwrap.dedent("""
    import json, sys, threading, time
    import numpy as np
    from loaderx.dataset import from_numpy

    def status():
        out = {}
        with open("/proc/self/status") as f:
            for line in f:
                key, value = line.split(":", 1)
                if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0]) * 1024
        return out

    src, dst = sys.argv[1], sys.argv[2]
    array = np.load(src, mmap_mode="r")
    peak_anon = [0]
    done = threading.Event()

    def poll():
        while not done.is_set():
            peak_anon[0] = max(peak_anon[0], status()["RssAnon"])
            time.sleep(0.002)

    before = status()
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    t0 = time.perf_counter()
    store = from_numpy(dst, array, codec="raw", chunk_bytes=64 << 20)
    seconds = time.perf_counter() - t0
    done.set()
    poller.join()
    after = status()
    result = {"before": before, "after": after, "peak_anon": peak_anon[0], "seconds": seconds,
              "type": type(store).__name__, "len": len(store), "codec": store.codec,
              "closed": store.closed}
    store.close()
    print(json.dumps(result))
""")


@pytest.fixture(scope="module")
def converted_gib(tmp_path_factory):
    """A ~1 GiB compressible .npy (open_memmap) converted by `from_numpy` in a
    fresh subprocess, so its peak RSS (VmHWM) measures the conversion alone."""
    work = tmp_path_factory.mktemp("gib")
    src = work / "src.npy"
    mm = np.lib.format.open_memmap(src, mode="w+", dtype=np.float32, shape=(BIG_ROWS, BIG_WIDTH))
    pattern = (np.arange(BIG_WIDTH, dtype=np.float32) % 17) / 4
    step = 16384
    for start in range(0, BIG_ROWS, step):
        block = mm[start:start + step]
        block[:] = pattern
        block[:, 0] = np.arange(start, start + len(block))
    mm.flush()
    del mm, block
    dst = work / "store"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _CONVERT, str(src), str(dst)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    yield src, dst, report
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.slow
def test_from_numpy_gib_returns_open_dense_store(converted_gib):
    _, _, report = converted_gib
    assert report["type"] == "DenseStore"
    assert report["len"] == BIG_ROWS
    assert report["codec"] == "raw"
    assert report["closed"] is False


def test_from_numpy_gib_values_equal(converted_gib):
    src, dst, _ = converted_gib
    source = np.load(src, mmap_mode="r")
    with DenseStore(dst) as ds:
        assert (ds.dtype, ds.item_shape, len(ds)) == (np.dtype(np.float32), (BIG_WIDTH,), BIG_ROWS)
        step = 16384
        out = np.empty((step, BIG_WIDTH), np.float32)
        for start in range(0, BIG_ROWS, step):
            ds.gather(slice(start, start + step), out=out)
            assert np.array_equal(out, source[start:start + step]), start
        ds.verify()


def test_from_numpy_gib_anonymous_memory_bounded(converted_gib):
    """The process's own (anonymous) memory stays far below the array's size."""
    _, _, report = converted_gib
    growth = report["peak_anon"] - report["before"]["RssAnon"]
    assert growth < RSS_LIMIT_MIB * MIB, report


def test_from_numpy_gib_peak_rss_bounded(converted_gib):
    """Peak resident set (VmHWM, which counts the mapped source pages too) grows
    well below the 1 GiB array while converting."""
    _, _, report = converted_gib
    growth = report["after"]["VmHWM"] - report["before"]["VmHWM"]
    assert growth < RSS_LIMIT_MIB * MIB, (
        f"peak RSS grew by {growth / MIB:.0f} MiB converting a {BIG_ROWS * BIG_WIDTH * 4 / MIB:.0f} MiB array; "
        f"report: {report}")


# ----------------------------------------------------------------- from_numpy: small cases

@pytest.mark.parametrize("codec", ["raw", "zstd", "zstd_dict"])
@pytest.mark.parametrize("dtype,item_shape", [(np.float32, ()), (np.int16, (7,)), (np.uint8, (3, 4, 5)),
                                              (np.bool_, (6,)), (STRUCT, (2,))])
def test_from_numpy_small(tmp_path, codec, dtype, item_shape):
    rng = np.random.default_rng(1)
    dtype = np.dtype(dtype)
    shape = (37,) + item_shape
    if dtype.names:
        array = np.zeros(shape, dtype)
        array["a"] = rng.integers(-9, 9, shape)
        array["b"] = rng.integers(-9, 9, shape + (2,)) / 2
    else:
        array = rng.integers(0, 2 if dtype == np.bool_ else 9, shape).astype(dtype)
    kwargs = {"dict_bytes": train_dict(array, tier="fast")} if codec == "zstd_dict" else {}
    # A tiny chunk_bytes forces many chunks (and one record per chunk where records are big).
    store = from_numpy(tmp_path / "s", array, codec=codec, chunk_bytes=100, **kwargs)
    assert isinstance(store, DenseStore)
    assert not store.closed
    assert (store.dtype, store.item_shape, store.codec, len(store)) == (dtype, item_shape, codec, 37)
    assert_same(store[:], array)
    store.close()
    with DenseStore(tmp_path / "s") as again:
        assert_same(again[:], array)


def test_from_numpy_memmap_non_contiguous_and_level(tmp_path):
    base = np.arange(6 * 8 * 5, dtype=np.int32).reshape(6, 8, 5)
    view = base.transpose(0, 2, 1)[::2]
    with from_numpy(tmp_path / "v", view, level=19) as store:
        assert store.level == 19
        assert store.item_shape == (5, 8)
        assert_same(store[:], view)
    np.save(tmp_path / "a.npy", base)
    mm = np.load(tmp_path / "a.npy", mmap_mode="r")
    with from_numpy(tmp_path / "m", mm, chunk_bytes=8 * 5 * 4 * 2) as store:
        assert_same(store[:], base)


def test_from_numpy_empty_and_bad_arguments(tmp_path):
    with from_numpy(tmp_path / "e", np.zeros((0, 3), np.float64)) as store:
        assert len(store) == 0
        assert store.item_shape == (3,)
    with pytest.raises(ValueError):
        from_numpy(tmp_path / "z", np.array(5.0))
    with pytest.raises(ValueError):
        from_numpy(tmp_path / "c", np.zeros((2, 3)), chunk_bytes=0)
    with pytest.raises(TypeError):
        from_numpy(tmp_path / "o", np.array([None, 1], dtype=object))
    with pytest.raises(TypeError):
        from_numpy(tmp_path / "l", [[1, 2], [3, 4]])
    for name in ("z", "c", "o", "l"):
        assert not (tmp_path / name).exists(), name


def test_from_numpy_onto_existing_store_of_another_type(tmp_path):
    DenseStore(tmp_path / "s", np.float32, (3,)).close()
    with pytest.raises(FileExistsError, match='mode="append".*mode="overwrite"'):
        from_numpy(tmp_path / "s", np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError):
        from_numpy(tmp_path / "s", np.zeros((2, 4), np.int16), mode="append")
    with DenseStore(tmp_path / "s") as ds:
        assert len(ds) == 0


# ----------------------------------------------------------------- from_iterator

def _records():
    return [np.arange(5, dtype=np.int16), np.array(3, dtype=np.int16), np.zeros((2, 3), np.int16),
            np.zeros(0, np.int16), np.arange(24, dtype=np.int16).reshape(2, 3, 4)]


@pytest.mark.parametrize("codec", ["raw", "zstd", "zstd_dict"])
def test_from_iterator_infers_dtype(tmp_path, codec):
    records = _records()
    kwargs = {"dict_bytes": train_dict([r.tobytes() for r in records] * 4, tier="fast")} if codec == "zstd_dict" else {}
    store = from_iterator(tmp_path / "r", iter(records), codec=codec, **kwargs)
    assert isinstance(store, RaggedStore)
    assert not store.closed
    assert (store.dtype, store.codec, len(store)) == (np.dtype(np.int16), codec, len(records))
    got = store[:]
    assert len(got) == len(records)
    for g, r in zip(got, records):
        assert_same(g, r)
    store.close()


def test_from_iterator_explicit_dtype_and_generator(tmp_path):
    seen = []

    def gen():
        for k in range(100):
            seen.append(k)
            yield list(range(k % 7))
    with from_iterator(tmp_path / "g", gen(), dtype=np.int64, level=3) as store:
        assert seen == list(range(100))
        assert store.dtype == np.int64
        assert len(store) == 100
        for k in (0, 6, 50, 99):
            assert_same(store[k], np.arange(k % 7, dtype=np.int64))


def test_from_iterator_bytes_and_structured(tmp_path):
    with from_iterator(tmp_path / "b", [b"abc", b"", b"\x00\x01"]) as store:
        assert store.dtype == np.uint8
        assert [r.tobytes() for r in store[:]] == [b"abc", b"", b"\x00\x01"]
    recs = [np.zeros(3, STRUCT), np.ones(1, STRUCT)]
    with from_iterator(tmp_path / "s", recs) as store:
        assert store.dtype == STRUCT
        assert_same(store[1], recs[1])


def test_from_iterator_empty_and_mixed(tmp_path):
    with from_iterator(tmp_path / "e", [], dtype=np.float32) as store:
        assert len(store) == 0
        assert store.dtype == np.float32
    with pytest.raises(ValueError, match="from_iterator needs a dtype when the iterable is empty"):
        from_iterator(tmp_path / "n", [])
    with pytest.raises(IdentityError, match="record 1 has dtype float64, store holds int32"):
        from_iterator(tmp_path / "m", [np.zeros(2, np.int32), np.zeros(2, np.float64)])


# ----------------------------------------------------------------- open_store

def test_open_store_by_identity(tmp_path):
    DenseStore(tmp_path / "d", np.float32, (3, 2), codec="raw").close()
    with RaggedStore(tmp_path / "r", STRUCT, codec="zstd") as rs:
        rs.append([np.zeros(2, STRUCT)])
    with Zrecord(tmp_path / "z", create=True) as z:
        z.append([b"payload"])
    with open_store(tmp_path / "d") as s:
        assert type(s) is DenseStore
        assert (s.dtype, s.item_shape, s.codec) == (np.dtype(np.float32), (3, 2), "raw")
    with open_store(tmp_path / "r") as s:
        assert type(s) is RaggedStore
        assert (s.dtype, s.codec, len(s)) == (STRUCT, "zstd", 1)
    with open_store(str(tmp_path / "z")) as s:
        assert type(s) is Zrecord
        assert s[0] == b"payload"


def test_open_store_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        open_store(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotAStoreError):
        open_store(tmp_path / "empty")
    (tmp_path / "file").write_bytes(b"not a store")
    with pytest.raises(ZrecordError):
        open_store(tmp_path / "file")


def test_open_store_round_trip_with_from_numpy(tmp_path):
    array = np.arange(60, dtype=np.uint16).reshape(10, 6)
    from_numpy(tmp_path / "s", array).close()
    with open_store(tmp_path / "s") as s:
        assert isinstance(s, DenseStore)
        assert_same(s[[9, 0, -2]], array[[9, 0, -2]])


# ----------------------------------------------------------------- pad

def test_pad_basic():
    recs = [np.array([1, 2, 3], np.int16), np.array([4], np.int16), np.zeros(0, np.int16)]
    padded, lengths = pad(recs)
    assert padded.dtype == np.int16
    assert lengths.dtype == np.int64
    assert_same(padded, np.array([[1, 2, 3], [4, 0, 0], [0, 0, 0]], np.int16))
    assert lengths.tolist() == [3, 1, 0]


def test_pad_max_len_and_value():
    recs = [np.array([1.5, 2.5], np.float32), np.array([3.5], np.float32)]
    padded, lengths = pad(recs, max_len=4, value=-1)
    assert_same(padded, np.array([[1.5, 2.5, -1, -1], [3.5, -1, -1, -1]], np.float32))
    assert lengths.tolist() == [2, 1]
    exact, _ = pad(recs, max_len=2)
    assert exact.shape == (2, 2)


def test_pad_refuses_a_value_its_records_cannot_hold_exactly():
    """Before, 1.5 padded ints as 1, 2 padded bools as True, 'xyz' padded
    'U2' text as 'xy', and 'x' gave numpy's "invalid literal for int()"."""
    ints, flags = [np.array([1, 2]), np.array([3])], [np.array([True]), np.array([], bool)]
    text = [np.array(["ab"]), np.array([], "U2")]
    for recs, value, said in ((ints, 1.5, "int64: it would be stored as 1"),
                              (flags, 2, "bool: it would be stored as True"),
                              (text, "xyz", "<U2: it would be stored as 'xy'"),
                              (ints, "x", r"int64 \(invalid literal"),
                              (ints, 2**70, r"int64 \(Python int too large"),
                              ([np.array([1], np.uint8)], -1, r"uint8 \(Python integer -1 out"),
                              (ints, [1, 2], "not one element of the records' dtype int64")):
        with pytest.raises(ValueError, match=f"value={value!r} .*{said}".replace("[", "\\[")):
            pad(recs, value=value)
    assert pad(ints, value=2.0)[0].tolist() == [[1, 2], [3, 2]]
    assert pad(flags, value=1)[0].tolist() == [[True], [True]]
    assert pad(text, value="x")[0].tolist() == [["ab"], ["x"]]
    f32 = pad([np.array([1], np.float32), np.array([], np.float32)], value=0.1)[0]
    assert f32[1, 0] == np.float32(0.1)  # a float dtype rounds


def test_pad_too_small_max_len_is_an_error():
    recs = [np.arange(5, dtype=np.int32), np.arange(2, dtype=np.int32)]
    with pytest.raises(ValueError, match="max_len"):
        pad(recs, max_len=4)


def test_pad_trailing_dims_and_dtypes():
    recs = [np.ones((2, 3), np.bool_), np.ones((1, 3), np.bool_)]
    padded, lengths = pad(recs)
    assert padded.shape == (2, 2, 3)
    assert padded.dtype == np.bool_
    assert padded[1, 1].tolist() == [False] * 3
    assert lengths.tolist() == [2, 1]
    s = [np.ones(2, STRUCT), np.ones(1, STRUCT)]
    sp, _ = pad(s, max_len=3)
    assert sp.dtype == STRUCT
    assert sp.shape == (2, 3)
    with pytest.raises(ValueError):
        pad([np.ones((2, 3)), np.ones((2, 4))])
    with pytest.raises(ValueError):
        pad([np.ones(2, np.int32), np.ones(2, np.int64)])


def test_pad_empty():
    padded, lengths = pad([])
    assert padded.shape[0] == 0
    assert lengths.shape == (0,)
    assert lengths.dtype == np.int64
    padded, lengths = pad([], max_len=5)
    assert padded.shape == (0, 5)


def test_pad_a_ragged_batch(tmp_path):
    rng = np.random.default_rng(7)
    recs = [rng.integers(0, 100, int(k), dtype=np.int32) for k in rng.integers(0, 20, 50)]
    with from_iterator(tmp_path / "r", recs) as rs:
        idx = rng.integers(0, 50, 16)
        padded, lengths = pad(rs[idx], max_len=24)
        assert padded.shape == (16, 24)
        assert padded.dtype == np.int32
        values, splits = rs.gather(idx, packed=True)
        assert lengths.tolist() == np.diff(splits).tolist()
        for row, n, i in zip(padded, lengths, idx):
            assert_same(row[:n], recs[i])
            assert (row[n:] == 0).all()


# ----------------------------------------------------------------- open_dataset


def _dataset_manifest(path) -> dict:
    with open(os.path.join(path, "loaderx.json")) as f:
        return json.load(f)


def _part(path, column: str, k: int = 0) -> str:
    return os.path.join(path, _dataset_manifest(path)["columns"][column]["shards"][k]["path"])


def test_open_dataset_checks_each_part_against_the_manifest(tmp_path):
    """Before the fix a column whose parts were int64 stores opened without
    a word although the manifest said float64 (8,)."""
    import loaderx
    from loaderx.errors import CorruptStoreError

    dest = tmp_path / "ds"
    x = np.arange(24, dtype=np.float64).reshape(3, 8)
    for c in loaderx.convert({"x": x, "y": np.arange(3)}, dest, progress=False).values():
        c.close()
    part = _part(dest, "x")
    shutil.rmtree(part)
    with DenseStore(part, np.int64, (8,)) as s:  # same rows, another type
        s.append(np.arange(24, dtype=np.int64).reshape(3, 8))
    with pytest.raises(CorruptStoreError, match=r"'x'.*dtype int64.*manifest says float64"):
        loaderx.open_dataset(dest)
    shutil.rmtree(part)
    with RaggedStore(part, np.float64) as s:
        s.append(list(x))
    with pytest.raises(CorruptStoreError, match=r"'x'.*kind ragged.*manifest says dense"):
        loaderx.open_dataset(dest)
    shutil.rmtree(part)
    with DenseStore(part, np.float64, (2, 4)) as s:
        s.append(x.reshape(3, 2, 4))
    with pytest.raises(CorruptStoreError, match=r"'x'.*item_shape \[2, 4\].*manifest says \[8\]"):
        loaderx.open_dataset(dest)
    shutil.rmtree(part)
    with DenseStore(part, np.float64, (8,), codec="raw") as s:
        s.append(x)
    with pytest.raises(CorruptStoreError, match=r"'x'.*codec raw.*manifest says zstd"):
        loaderx.open_dataset(dest)
    assert loaderx.open_dataset(dest, columns=["y"])["y"][[2]].tolist() == [2]


def test_open_dataset_never_follows_a_symlink_out_of_the_dataset(tmp_path):
    """Before the fix a part that was a symlink to a store outside the
    directory was opened: the string check on the manifest's paths did not
    look at the file system."""
    import loaderx
    from loaderx.errors import CorruptStoreError

    dest = tmp_path / "ds"
    loaderx.convert({"x": np.arange(6).reshape(3, 2)}, dest, progress=False)["x"].close()
    with DenseStore(tmp_path / "outside", np.int64, (2,)) as s:
        s.append(np.full((3, 2), 7))
    part = _part(dest, "x")
    shutil.rmtree(part)
    os.symlink(tmp_path / "outside", part)
    with pytest.raises(CorruptStoreError, match="symlink"):
        loaderx.open_dataset(dest)
    os.unlink(part)
    column = os.path.dirname(part)
    os.rename(column, tmp_path / "column")
    os.symlink(tmp_path / "column", column)  # a symlinked directory on the way
    with pytest.raises(CorruptStoreError, match="symlink"):
        loaderx.open_dataset(dest)


def test_a_dataset_column_refuses_appends_and_deletes_and_stays_openable(tmp_path):
    """Before the fix ``open_dataset(p)['lang'].delete([0])`` (or an append)
    changed one column's record count and the dataset no longer opened."""
    import loaderx
    from loaderx.errors import ReadOnlyError

    dest = tmp_path / "ds"
    docs = [np.arange(i + 1, dtype=np.int32) for i in range(6)]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": np.arange(6), "tok": [d.tolist() for d in docs],
                             "b": [b"ab"] * 6}), tmp_path / "t.parquet")
    opened = loaderx.convert(tmp_path / "t.parquet", dest, progress=False)
    writes = {"x": lambda s: s.append(np.arange(2)),
              "tok": lambda s: s.append([np.arange(2)]),
              "b": lambda s: s.append_packed(b"ab", [0, 2])}
    for name, store in opened.items():
        for write in (writes[name], lambda s: s.delete([0])):
            with pytest.raises(ReadOnlyError, match=rf"column '{name}' of the dataset .*"
                               r"misalign.*write the dataset anew"):
                write(store)
        store.compact()  # keeps the count: allowed
        store.close()
    again = loaderx.open_dataset(dest)
    assert {k: len(v) for k, v in again.items()} == {"x": 6, "tok": 6, "b": 6}
    assert_same(again["x"][:], np.arange(6))
    for store in again.values():
        store.close()
    with DenseStore(_part(dest, "x")) as alone:  # by path: the store's own owner writes it
        alone.delete([5])
        assert len(alone) == 5


def test_open_dataset_and_labels_name_a_bad_argument(tmp_path):
    """Before, ``open_dataset(p, columns='lang')`` asked for the columns 'l',
    'a', 'n', 'g', and ``labels({'a': array}, 'a')`` raised AttributeError
    'numpy.ndarray' object has no attribute 'path'."""
    import loaderx

    dest = tmp_path / "ds"
    loaderx.convert({"lang": np.arange(3)}, dest, progress=False)["lang"].close()
    with pytest.raises(TypeError, match="columns must be a list of column names, not the "
                                        "string 'lang'"):
        loaderx.open_dataset(dest, columns="lang")
    with pytest.raises(TypeError, match="column 'a' is a ndarray, not a column open_dataset "
                                        "opened; labels reads a dataset's manifest"):
        loaderx.labels({"a": np.arange(3)}, "a")
    assert loaderx.labels(dest, "lang") is None
