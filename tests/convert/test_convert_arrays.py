"""`loaderx.convert` of NumPy sources (.npy, .npz, dicts of arrays), its modes
(create, append, overwrite) and its failures, dataset directories
(`open_dataset`) and their checks, and bounded memory on a file larger than
the memory allowed.

Every source is built here from local data (nothing is downloaded) and
converted; the stores are read back and compared value by value, in order,
with the source. Hostile and careless inputs (damaged .npy/.npz files, split
names and manifests that point outside the destination) give a clear error
naming the input: never a raw library exception, a silently shortened
dataset, a write outside the destination or a broken dataset left behind."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
from _convert_checks import leftovers, nothing_left, npy_bytes, tar_files
from _helpers import assert_same, convert_quiet

import loaderx
from loaderx import __main__ as cli
from loaderx import DataLoader, DenseStore, ShardSet, open_dataset
from loaderx.converters import ConvertError
from loaderx.dataset import DestinationExistsError, from_iterator, from_numpy, read_manifest
from loaderx.errors import CorruptStoreError, IdentityError, NotAStoreError

pa = pytest.importorskip("pyarrow", reason="pyarrow is part of the test extra")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is part of the test extra")
Image = pytest.importorskip("PIL.Image", reason="Pillow is part of the test extra")


# ----------------------------------------------------------------- NumPy


def test_npy_round_trip_and_manifest(tmp_path):
    x = np.arange(1000, dtype=np.float32).reshape(50, 4, 5) / 7
    np.save(tmp_path / "feat.npy", x)
    ds = loaderx.convert(tmp_path / "feat.npy", tmp_path / "out", progress=False)
    assert list(ds) == ["feat"]
    assert isinstance(ds["feat"], DenseStore)
    assert_same(ds["feat"][:], x)
    ds["feat"].close()
    m = json.loads((tmp_path / "out" / "loaderx.json").read_text())
    assert m["format"] == "loaderx-dataset" and m["version"] == 2 and m["rows"] == 50
    assert m["generation"] == "gen-000001"
    col = m["columns"]["feat"]
    assert (col["kind"], col["dtype"], col["item_shape"], col["codec"]) == (
        "dense",
        "float32",
        [4, 5],
        "zstd",
    )
    assert col["shards"] == [{"path": "gen-000001/feat/part-00000", "rows": 50}]
    assert sorted(os.listdir(tmp_path / "out")) == ["gen-000001", "loaderx.json"]
    assert m["source"] == {"type": "numpy", "path": str(tmp_path / "feat.npy")}
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("shape", [(-1,), (-1, 3), (2, -3)])
def test_negative_dimensions_in_npy_and_npz_headers_are_refused(tmp_path, shape):
    """Before the fix an .npz member whose header said ``shape: (-1,)``
    became an empty column without a word; the same .npy was refused."""
    import zipfile

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": "<i8", "fortran_order": False, "shape": shape}
    )
    buf.write(np.arange(12, dtype="<i8").tobytes())
    (tmp_path / "neg.npy").write_bytes(buf.getvalue())
    with zipfile.ZipFile(tmp_path / "neg.npz", "w") as z:
        z.writestr("a.npy", buf.getvalue())
    for src in ("neg.npy", "neg.npz"):
        with pytest.raises(ConvertError, match=f"{src}.*negative dimensions"):
            loaderx.convert(tmp_path / src, tmp_path / "out", allow_tiny_records=True)
        assert not (tmp_path / "out").exists()


def test_damaged_npy_and_npz_files_are_named(tmp_path):
    good = npy_bytes(np.arange(800.0).reshape(100, 8))
    header = np.lib.format.MAGIC_LEN + 2 + 118  # magic, length, padded header
    cases = {
        "empty.npy": (b"", "not a readable .npy array"),
        "garbage.npy": (b"hello world" * 20, "not a readable .npy array.*magic"),
        "short-header.npy": (good[:40], "not a readable .npy array"),
        "truncated.npy": (
            good[: header + 100],
            r"the header says float64\[100, 8\] \(6,400 bytes\) but only 100 bytes",
        ),
        "garbage.npz": (b"hello world" * 20, "not a readable .npz archive"),
        "objects.npy": (
            npy_bytes(np.array([{"a": 1}, None], dtype=object), allow_pickle=True),
            "the array holds Python objects.*never unpickles",
        ),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ConvertError, match=f"{name}: {message}"):
            convert_quiet(tmp_path / name, tmp_path / "out")
        nothing_left(tmp_path)
    # An .npz member whose header promises more rows than it holds.
    short = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        short, {"descr": "<f8", "fortran_order": False, "shape": (100, 8)}
    )
    short.write(np.zeros((50, 8)).tobytes())
    for method in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        with zipfile.ZipFile(tmp_path / "short.npz", "w", method) as z:
            z.writestr("a.npy", short.getvalue())
        with pytest.raises(ConvertError, match="short.npz: array 'a': .*truncated"):
            convert_quiet(tmp_path / "short.npz", tmp_path / "out")
    # A damaged compressed member is found while reading, by name.
    np.savez_compressed(tmp_path / "c.npz", a=np.random.default_rng(0).random((500, 8)))
    data = bytearray((tmp_path / "c.npz").read_bytes())
    data[2000:2100] = bytes(b ^ 0x33 for b in data[2000:2100])
    (tmp_path / "c.npz").write_bytes(bytes(data))
    with pytest.raises(ConvertError, match="c.npz: array 'a': not a readable"):
        convert_quiet(tmp_path / "c.npz", tmp_path / "out")
    nothing_left(tmp_path)


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_with_workers_gives_shard_sets(tmp_path, save):
    rng = np.random.default_rng(1)
    img = rng.integers(0, 255, (301, 8, 8), dtype=np.uint8)
    lab = np.arange(301, dtype=np.int64)
    save(tmp_path / "d.npz", img=img, lab=lab)
    ds = loaderx.convert(tmp_path / "d.npz", tmp_path / "out", workers=3, progress=False)
    assert isinstance(ds["img"], ShardSet) and len(ds["img"].shards) == 3
    assert sum(ds["lab"].lengths) == 301 and ds["lab"].lengths == ds["img"].lengths
    assert ds["lab"].codec == "raw"  # 8-byte records are never compressed
    assert_same(ds["img"][:], img)
    assert_same(ds["lab"][::-1], lab[::-1])
    with DataLoader(ds, batch_size=16, seed=3, workers=1) as loader:
        for _ in range(5):
            batch = next(loader)
            assert_same(batch["img"], img[batch["lab"]])
    for v in ds.values():
        v.close()


def test_dict_of_arrays_columns_and_skip(tmp_path):
    arrays = {
        "a": np.ones((10, 16), np.int16),
        "b": np.arange(10 * 9).reshape(10, 9),
        "c": np.zeros((10, 20)),
    }
    ds = loaderx.convert(arrays, tmp_path / "o1", columns=["c", "a"])
    assert list(ds) == ["c", "a"]
    ds2 = loaderx.convert(arrays, tmp_path / "o2", skip_columns=["b"])
    assert list(ds2) == ["a", "c"]
    with pytest.raises(ConvertError, match=r"columns names \['zz'\]"):
        loaderx.convert(arrays, tmp_path / "o3", columns=["zz"])
    with pytest.raises(ConvertError, match="different lengths"):
        loaderx.convert({"a": np.zeros((3, 9)), "b": np.zeros((4, 9))}, tmp_path / "o4")
    with pytest.raises(ConvertError, match="Python objects.*skip_columns=\\['o'\\]"):
        loaderx.convert({"o": np.array([None] * 3, dtype=object)}, tmp_path / "o5")
    for v in list(ds.values()) + list(ds2.values()):
        v.close()
    assert not (tmp_path / "o3").exists() and leftovers(tmp_path) == []


def test_a_1d_array_is_a_scalar_column_or_rows_of_tokens(tmp_path):
    tokens = np.arange(10_050, dtype=np.int32)
    np.save(tmp_path / "tokens.npy", tokens)
    # No flag: one value per record, a raw column that maps to a numpy array.
    ds = loaderx.convert(tmp_path / "tokens.npy", tmp_path / "t")
    col = ds["tokens"]
    assert len(col) == 10_050 and col.codec == "raw" and col.item_shape == ()
    assert_same(col.as_array(), tokens)
    assert_same(col[[3, 10_049]], tokens[[3, 10_049]])
    col.close()
    with pytest.warns(UserWarning, match="50 trailing values"):
        ds = loaderx.convert(tmp_path / "tokens.npy", tmp_path / "t1", row_length=100)
    assert ds["tokens"].item_shape == (100,) and len(ds["tokens"]) == 100
    assert_same(ds["tokens"][7], tokens[700:800])
    ds["tokens"].close()
    # The old flag is still accepted.
    ds = loaderx.convert(tmp_path / "tokens.npy", tmp_path / "t2", allow_tiny_records=True)
    assert len(ds["tokens"]) == 10_050 and ds["tokens"].codec == "raw"
    ds["tokens"].close()


# ----------------------------------------------------------------- modes


def test_create_append_overwrite(tmp_path):
    a = {
        "x": np.arange(40, dtype=np.float64).reshape(10, 4),
        "y": np.arange(10, 20).reshape(10, 1) * np.ones((1, 8)),
    }
    b = {"x": -np.arange(24, dtype=np.float64).reshape(6, 4), "y": np.zeros((6, 8))}
    dest = tmp_path / "ds"
    loaderx.convert(a, dest)["x"].close()
    with pytest.raises(DestinationExistsError, match='mode="append" or mode="overwrite"'):
        loaderx.convert(b, dest)
    ds = loaderx.convert(b, dest, mode="append", workers=2)
    assert isinstance(ds["x"], ShardSet) and ds["x"].lengths == (10, 3, 3)
    assert_same(ds["x"][:], np.concatenate([a["x"], b["x"]]))
    assert_same(ds["y"][:], np.concatenate([a["y"], b["y"]]))
    for v in ds.values():
        v.close()
    m = read_manifest(dest)
    assert m["rows"] == 16 and len(m["appended"]) == 1
    with pytest.raises(IdentityError, match="item_shape=\\[4\\].*item_shape=\\[5\\]"):
        loaderx.convert({"x": np.zeros((2, 5)), "y": np.zeros((2, 8))}, dest, mode="append")
    with pytest.raises(ConvertError, match="must be the same"):
        loaderx.convert({"x": np.zeros((2, 4))}, dest, mode="append")
    assert read_manifest(dest)["rows"] == 16  # refused appends change nothing
    ds = loaderx.convert(b, dest, mode="overwrite")
    assert len(ds["x"]) == 6 and isinstance(ds["x"], DenseStore)
    for v in ds.values():
        v.close()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(DestinationExistsError, match="not a loaderx dataset"):
        loaderx.convert(b, tmp_path / "mine", mode="overwrite")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    (tmp_path / "empty").mkdir()
    loaderx.convert(b, tmp_path / "empty")["x"].close()  # an empty directory is not data
    assert leftovers(tmp_path) == []


def test_from_numpy_and_from_iterator_modes(tmp_path):
    x = np.arange(12, dtype=np.int32).reshape(4, 3)
    from_numpy(tmp_path / "s", x).close()
    with pytest.raises(FileExistsError, match="already exists"):
        from_numpy(tmp_path / "s", x)
    with from_numpy(tmp_path / "s", x, mode="append") as s:
        assert len(s) == 8
    with from_numpy(tmp_path / "s", x[:1], mode="overwrite") as s:
        assert len(s) == 1
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError, match="not a loaderx store"):
        from_numpy(tmp_path / "f", x, mode="overwrite")
    with pytest.raises(ValueError, match="mode must be"):
        from_numpy(tmp_path / "g", x, mode="replace")
    from_iterator(tmp_path / "r", [np.arange(3)]).close()
    with pytest.raises(FileExistsError):
        from_iterator(tmp_path / "r", [np.arange(3)])


def test_failed_conversion_leaves_nothing(tmp_path):
    table = pa.table(
        {
            "a": pa.array([1.0] * 50 + [None] + [2.0] * 49),
            "b": pa.array(np.ones((100, 16)).tolist(), pa.list_(pa.float64(), 16)),
        }
    )
    pq.write_table(table, tmp_path / "n.parquet", row_group_size=25)
    # The null at row 50 cannot take the fill value: the second worker fails.
    bad = {"a": "not a number"}
    with pytest.raises(ConvertError, match=r"column 'a' \(double\): cannot replace its nulls"):
        loaderx.convert(tmp_path / "n.parquet", tmp_path / "out", workers=2, fill_null=bad)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []
    loaderx.convert({"a": np.zeros(3), "b": np.zeros((3, 16))}, tmp_path / "ok")["a"].close()
    before = (tmp_path / "ok" / "loaderx.json").read_text()
    with pytest.raises(ConvertError):
        loaderx.convert(tmp_path / "n.parquet", tmp_path / "ok", mode="append", columns=["a", "b"],
                        fill_null=bad)
    assert (tmp_path / "ok" / "loaderx.json").read_text() == before
    assert sorted(os.listdir(tmp_path / "ok" / "gen-000001" / "a")) == ["part-00000"]
    assert leftovers(tmp_path / "ok") == []


def test_bad_levels_and_batch_sizes_are_clear_errors(tmp_path, capsys):
    x = {"x": np.arange(160.0).reshape(20, 8)}
    with pytest.raises(ValueError, match="level must be a non-zero int zstd level"):
        convert_quiet(x, tmp_path / "out", level=0)
    # (refused before anything is written, with zstd's range)
    with pytest.raises(ValueError, match=r"^zstd level 99 is out of range \(-131072 to 22, not 0\)$"):
        convert_quiet(x, tmp_path / "out", level=99)
    nothing_left(tmp_path)
    np.save(tmp_path / "x.npy", x["x"])
    for value in ("inf", "nan", "1e-9", "abc"):
        with pytest.raises(SystemExit) as stop:
            cli.main(["convert", str(tmp_path / "x.npy"), str(tmp_path / "out"),
                      "--batch-mib", value])
        assert stop.value.code == 2
        assert "argument --batch-mib" in capsys.readouterr().err
    nothing_left(tmp_path)


def test_a_failed_conversion_does_not_log_done(tmp_path, capsys):
    """Log-mode progress said "done in X s" after a conversion that failed."""
    arrays = [np.zeros(i + 1, np.float64 if i < 70 else np.float32) for i in range(80)]
    tar_files(tmp_path / "npy.tar", [(f"k{i:02d}.npy", npy_bytes(a)) for i, a in enumerate(arrays)])
    with pytest.raises(ConvertError, match="k70.npy"):
        loaderx.convert(tmp_path / "npy.tar", tmp_path / "out", progress="log")
    err = capsys.readouterr().err
    assert "convert: stopped" in err and "done" not in err
    good = [(f"k{i:02d}.npy", npy_bytes(a)) for i, a in enumerate(arrays[:70])]
    tar_files(tmp_path / "good.tar", good)
    loaderx.convert(tmp_path / "good.tar", tmp_path / "out", progress="log")
    assert "done in" in capsys.readouterr().err


# ----------------------------------------------------------------- dataset directories


def test_open_dataset_checks(tmp_path):
    loaderx.convert({"x": np.zeros((5, 9))}, tmp_path / "d")["x"].close()
    with pytest.raises(KeyError, match="no column 'y'"):
        open_dataset(tmp_path / "d", columns=["y"])
    part = tmp_path / "d" / "gen-000001" / "x" / "part-00000"
    with DenseStore(part) as s:
        s.append(np.ones((1, 9)))
    with pytest.raises(CorruptStoreError, match="holds 6 records, the manifest says 5"):
        open_dataset(tmp_path / "d")
    with pytest.raises(NotAStoreError, match="single store"):
        open_dataset(part)
    with pytest.raises(FileNotFoundError):
        open_dataset(tmp_path / "missing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "loaderx.json").write_text('{"format": "loaderx-dataset", "version": 99}')
    with pytest.raises(CorruptStoreError, match="version 99"):
        open_dataset(tmp_path / "bad")
    (tmp_path / "bad" / "loaderx.json").write_text("{not json")
    with pytest.raises(CorruptStoreError, match="not valid JSON"):
        open_dataset(tmp_path / "bad")
    m = {
        "format": "loaderx-dataset",
        "version": 1,
        "rows": 1,
        "columns": {"x": {"kind": "dense", "shards": [{"path": "../../etc", "rows": 1}]}},
    }
    (tmp_path / "bad" / "loaderx.json").write_text(json.dumps(m))
    with pytest.raises(CorruptStoreError, match="outside the directory"):
        open_dataset(tmp_path / "bad")


def test_manifests_naming_splits_outside_or_nesting_deep_are_refused(tmp_path):
    convert_quiet({"x": np.zeros((4, 8))}, tmp_path / "inner")["x"].close()
    (tmp_path / "d").mkdir()
    base = {"format": "loaderx-dataset", "version": 1}
    for sub in ("../inner", str(tmp_path / "inner"), ".", 5):
        (tmp_path / "d" / "loaderx.json").write_text(json.dumps({**base, "splits": {"t": sub}}))
        with pytest.raises(CorruptStoreError, match="split 't' names .*not a directory inside"):
            loaderx.open_dataset(tmp_path / "d")
    for version in (0, -3):
        manifest = {**base, "version": version, "splits": {"t": "t"}}
        (tmp_path / "d" / "loaderx.json").write_text(json.dumps(manifest))
        with pytest.raises(CorruptStoreError, match=f"version {version}"):
            loaderx.open_dataset(tmp_path / "d")
    (tmp_path / "d" / "loaderx.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(CorruptStoreError, match="not valid JSON"):
        loaderx.open_dataset(tmp_path / "d")


def test_missing_optional_dependency_names_the_extra(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["pyarrow"] = None
        import loaderx
        try:
            loaderx.convert({str(tmp_path / 'x.parquet')!r}, {str(tmp_path / 'o')!r})
        except ImportError as e:
            print(type(e).__name__, e)
        """)
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(loaderx.__file__))},
    )
    assert "MissingDependencyError" in out.stdout and "pip install 'loaderx[convert]'" in out.stdout


# ----------------------------------------------------------------- bounded memory

_RSS_SCRIPT = """
import sys
import numpy as np, pyarrow, pyarrow.parquet, PIL.Image, loaderx

def peak():  # this process's peak RSS (ru_maxrss would include the parent's at fork)
    with open("/proc/self/status") as f:
        return int(f.read().split("VmHWM:")[1].split()[0]) * 1024

base = peak()
loaderx.convert(sys.argv[1], sys.argv[2], codec="raw", batch_bytes=2 << 20, progress=False)
print(base, peak() - base)
"""


@pytest.mark.slow
def test_memory_stays_bounded_on_a_large_input(tmp_path):
    """A 256 MiB input converted with 2 MiB batches: the converting process's
    own peak RSS (VmHWM) grows by well under half the input (the full-size
    bound is 512 MiB for 4 GB)."""
    rows, width = 64 * 1024, 1024
    mm = np.lib.format.open_memmap(
        tmp_path / "big.npy", mode="w+", dtype=np.int32, shape=(rows, width)
    )
    writer = pq.ParquetWriter(
        tmp_path / "big.parquet",
        pa.schema([("x", pa.list_(pa.int32(), width))]),
        compression="none",
    )
    for a in range(0, rows, 16 * 1024):
        chunk = np.arange(a * width, (a + 16 * 1024) * width, dtype=np.int32).reshape(-1, width)
        mm[a : a + len(chunk)] = chunk
        writer.write_table(
            pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(chunk.ravel()), width)})
        )
    writer.close()
    mm.flush()
    del mm
    input_bytes = rows * width * 4
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(loaderx.__file__))}
    for name in ("big.npy", "big.parquet"):
        out = subprocess.run(
            [sys.executable, "-c", _RSS_SCRIPT, str(tmp_path / name), str(tmp_path / f"o-{name}")],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        base, growth = map(int, out.stdout.split()[-2:])
        assert 20 << 20 < base < 400 << 20, f"implausible baseline RSS {base >> 20} MiB"
        assert (
            growth < input_bytes // 2
        ), f"{name}: peak RSS grew by {growth >> 20} MiB for {input_bytes >> 20} MiB"
        with next(iter(open_dataset(tmp_path / f"o-{name}").values())) as store:
            assert len(store) == rows
            assert_same(store[rows - 1], np.arange(width, dtype=np.int32) + (rows - 1) * width)
