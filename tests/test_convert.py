"""Tests of `loaderx.convert` and dataset directories (`open_dataset`).

Every source kind is built here from local data (nothing is downloaded) and
converted; the stores are then read back and compared value by value, in
order, with the source. Also: the column-type mapping and its refusals (named
column, named flag), scalar columns, create/append/overwrite, worker
processes giving one ShardSet per column, failures leaving nothing behind,
and bounded memory on a file larger than the memory allowed.

Hostile and careless inputs (damaged .npy/.npz, tar, Parquet and image files,
duplicate column names, split names and manifests that point outside the
destination) give a clear error naming the input: never a raw library
exception, a silently shortened dataset, a write outside the destination or
a broken dataset left behind.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile

import numpy as np
import pytest
from _helpers import assert_same

import loaderx
from loaderx import __main__ as cli
from loaderx import DataLoader, DenseStore, ShardSet, open_dataset
from loaderx.converters import ConvertError
from loaderx.dataset import DestinationExistsError, from_iterator, from_numpy, read_manifest
from loaderx.errors import CorruptStoreError, IdentityError, NotAStoreError

pa = pytest.importorskip("pyarrow", reason="pyarrow is part of the test extra")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is part of the test extra")
Image = pytest.importorskip("PIL.Image", reason="Pillow is part of the test extra")


def _leftovers(parent) -> list:
    return [n for n in os.listdir(parent) if ".loaderx-" in n or n.startswith("loaderx.json.")]


def _convert(src, dest, **kw):
    return loaderx.convert(src, dest, progress="off", **kw)


def _nothing_left(parent, name: str = "out") -> None:
    assert not os.path.exists(os.path.join(parent, name))
    assert [n for n in os.listdir(parent) if "loaderx-partial" in n] == []


def _png(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


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
    assert _leftovers(tmp_path) == []


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


def _npy_bytes(array: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, **kw)
    return buf.getvalue()


def test_damaged_npy_and_npz_files_are_named(tmp_path):
    good = _npy_bytes(np.arange(800.0).reshape(100, 8))
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
            _npy_bytes(np.array([{"a": 1}, None], dtype=object), allow_pickle=True),
            "the array holds Python objects.*never unpickles",
        ),
    }
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ConvertError, match=f"{name}: {message}"):
            _convert(tmp_path / name, tmp_path / "out")
        _nothing_left(tmp_path)
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
            _convert(tmp_path / "short.npz", tmp_path / "out")
    # A damaged compressed member is found while reading, by name.
    np.savez_compressed(tmp_path / "c.npz", a=np.random.default_rng(0).random((500, 8)))
    data = bytearray((tmp_path / "c.npz").read_bytes())
    data[2000:2100] = bytes(b ^ 0x33 for b in data[2000:2100])
    (tmp_path / "c.npz").write_bytes(bytes(data))
    with pytest.raises(ConvertError, match="c.npz: array 'a': not a readable"):
        _convert(tmp_path / "c.npz", tmp_path / "out")
    _nothing_left(tmp_path)


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
    assert not (tmp_path / "o3").exists() and _leftovers(tmp_path) == []


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
    assert _leftovers(tmp_path) == []


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
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []
    loaderx.convert({"a": np.zeros(3), "b": np.zeros((3, 16))}, tmp_path / "ok")["a"].close()
    before = (tmp_path / "ok" / "loaderx.json").read_text()
    with pytest.raises(ConvertError):
        loaderx.convert(tmp_path / "n.parquet", tmp_path / "ok", mode="append", columns=["a", "b"],
                        fill_null=bad)
    assert (tmp_path / "ok" / "loaderx.json").read_text() == before
    assert sorted(os.listdir(tmp_path / "ok" / "gen-000001" / "a")) == ["part-00000"]
    assert _leftovers(tmp_path / "ok") == []


def test_bad_levels_and_batch_sizes_are_clear_errors(tmp_path, capsys):
    x = {"x": np.arange(160.0).reshape(20, 8)}
    with pytest.raises(ValueError, match="level must be a non-zero int zstd level"):
        _convert(x, tmp_path / "out", level=0)
    with pytest.raises(ConvertError, match="^column 'x': zstd level 99 is out of range$"):
        _convert(x, tmp_path / "out", level=99)
    _nothing_left(tmp_path)
    np.save(tmp_path / "x.npy", x["x"])
    for value in ("inf", "nan", "1e-9", "abc"):
        with pytest.raises(SystemExit) as stop:
            cli.main(["convert", str(tmp_path / "x.npy"), str(tmp_path / "out"),
                      "--batch-mib", value])
        assert stop.value.code == 2
        assert "argument --batch-mib" in capsys.readouterr().err
    _nothing_left(tmp_path)


def test_a_failed_conversion_does_not_log_done(tmp_path, capsys):
    """Log-mode progress said "done in X s" after a conversion that failed."""
    arrays = [np.zeros(i + 1, np.float64 if i < 70 else np.float32) for i in range(80)]
    _tar_files(tmp_path / "npy.tar", [(f"k{i:02d}.npy", _npy_bytes(a)) for i, a in enumerate(arrays)])
    with pytest.raises(ConvertError, match="k70.npy"):
        loaderx.convert(tmp_path / "npy.tar", tmp_path / "out", progress="log")
    err = capsys.readouterr().err
    assert "convert: stopped" in err and "done" not in err
    good = [(f"k{i:02d}.npy", _npy_bytes(a)) for i, a in enumerate(arrays[:70])]
    _tar_files(tmp_path / "good.tar", good)
    loaderx.convert(tmp_path / "good.tar", tmp_path / "out", progress="log")
    assert "done in" in capsys.readouterr().err


# ----------------------------------------------------------------- Arrow


def _table(n: int, rng):
    lens = rng.integers(0, 9, n)
    return {
        "fixed": rng.integers(-99, 99, (n, 2, 3)).astype(np.int16),
        "lists": [rng.integers(0, 1000, k).astype(np.int64) for k in lens],
        "pairs": [rng.integers(0, 9, (k, 2)).astype(np.float32) for k in lens],
        "text": ["héllo " * int(k) for k in lens],
        "blob": [bytes(rng.integers(0, 255, k, dtype=np.uint8)) for k in lens],
        "y": rng.random(n),
        "flag": rng.random(n) < 0.5,
    }


def _arrow(d: dict):
    f = d["fixed"]
    fixed = pa.FixedSizeListArray.from_arrays(
        pa.FixedSizeListArray.from_arrays(pa.array(f.ravel()), 3), 2
    )
    pairs = pa.array([p.tolist() for p in d["pairs"]], pa.list_(pa.list_(pa.float32(), 2)))
    return pa.table(
        {
            "fixed": fixed,
            "lists": pa.array([x.tolist() for x in d["lists"]]),
            "pairs": pairs,
            "text": pa.array(d["text"]),
            "blob": pa.array(d["blob"], pa.binary()),
            "y": pa.array(d["y"]),
            "flag": pa.array(d["flag"]),
            "dict": pa.array(["a", "bb"] * (len(d["y"]) // 2)).dictionary_encode(),
        }
    )


def _check_table(ds: dict, d: dict, rows=slice(None)) -> None:
    assert isinstance(ds["fixed"], (DenseStore, ShardSet)) and ds["fixed"].item_shape == (2, 3)
    assert ds["lists"].kind == "ragged" and ds["text"].kind == "bytes" and ds["y"].item_shape == ()
    assert_same(ds["fixed"][:], d["fixed"][rows])
    for got, want in zip(ds["lists"][:], d["lists"][rows]):
        assert_same(got, want)
    values, splits = ds["pairs"].gather(np.arange(len(ds["pairs"])), packed=True)
    assert_same(values, np.concatenate(d["pairs"][rows]).reshape(-1, 2))
    assert ds["text"][:] == list(d["text"][rows])  # strings read back as str
    assert ds["blob"][:] == d["blob"][rows]
    assert_same(ds["y"][:], d["y"][rows])
    assert_same(ds["flag"][:], d["flag"][rows])


def test_parquet_types_workers_and_row_groups(tmp_path):
    d = _table(500, np.random.default_rng(2))
    pq.write_table(_arrow(d), tmp_path / "t.parquet", row_group_size=120)
    ds = loaderx.convert(tmp_path / "t.parquet", tmp_path / "out", workers=2, progress=False)
    assert ds["y"].lengths == (240, 260)  # the cut moved to a row-group boundary
    _check_table(ds, d)
    # An Arrow dictionary is a categorical: codes, and the names they stand for.
    assert ds["dict"].categories == ("a", "bb")
    assert list(ds["dict"].names_of(ds["dict"][:3])) == ["a", "bb", "a"]
    for v in ds.values():
        v.close()
    m = read_manifest(tmp_path / "out")
    assert m["source"]["type"] == "parquet" and m["columns"]["pairs"]["kind"] == "ragged"


def test_arrow_ipc_feather_stream_and_directory(tmp_path):
    import pyarrow.feather as feather

    d = _table(200, np.random.default_rng(3))
    table = _arrow(d)
    feather.write_feather(table, tmp_path / "t.feather", chunksize=64)
    with pa.OSFile(str(tmp_path / "t.arrows"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table, max_chunksize=50)
    for name in ("t.feather", "t.arrows"):
        ds = loaderx.convert(tmp_path / name, tmp_path / f"o-{name}", workers=2)
        _check_table(ds, d)
        for v in ds.values():
            v.close()
    (tmp_path / "dir").mkdir()
    pq.write_table(table.slice(0, 80), tmp_path / "dir" / "part-0.parquet")
    pq.write_table(table.slice(80), tmp_path / "dir" / "part-1.parquet")
    ds = loaderx.convert(tmp_path / "dir", tmp_path / "o-dir")
    _check_table(ds, d)
    for v in ds.values():
        v.close()
    pq.write_table(pa.table({"other": pa.array([1])}), tmp_path / "dir" / "part-2.parquet")
    with pytest.raises(ConvertError, match="share one schema"):
        loaderx.convert(tmp_path / "dir", tmp_path / "o-bad")


def test_unmappable_column_names_the_skip_flag(tmp_path):
    table = pa.table(
        {
            "ok": pa.array(np.zeros((4, 16)).tolist(), pa.list_(pa.float64(), 16)),
            "meta": pa.array([{"k": 1}] * 4),
        }
    )
    pq.write_table(table, tmp_path / "s.parquet")
    with pytest.raises(
        ConvertError,
        match=r"column 'meta' \(Arrow type struct<k: int64>\).*skip_columns=\['meta'\]",
    ):
        loaderx.convert(tmp_path / "s.parquet", tmp_path / "o")
    ds = loaderx.convert(tmp_path / "s.parquet", tmp_path / "o", skip_columns=["meta"])
    assert list(ds) == ["ok"] and ds["ok"].item_shape == (16,)
    ds["ok"].close()


def test_duplicate_column_names_never_give_a_broken_dataset(tmp_path):
    x = {"x": np.arange(160.0).reshape(20, 8)}
    with pytest.raises(ConvertError, match=r"columns names \['x'\] more than once"):
        _convert(x, tmp_path / "out", columns=["x", "x"])
    with pytest.raises(TypeError, match="a list of column names, not the string 'x'"):
        _convert(x, tmp_path / "out", columns="x")
    with pytest.raises(ConvertError, match="two arrays are named '1'"):
        _convert({1: np.zeros((3, 8)), "1": np.ones((3, 8))}, tmp_path / "out")
    table = pa.Table.from_arrays([pa.array(np.zeros(10)), pa.array(np.ones(10))], ["a", "a"])
    pq.write_table(table, tmp_path / "dup.parquet")
    with pytest.raises(ConvertError, match=r"the source has the columns \['a'\] more than once"):
        _convert(tmp_path / "dup.parquet", tmp_path / "out", allow_tiny_records=True)
    _nothing_left(tmp_path)


def test_a_damaged_parquet_page_is_named(tmp_path):
    rows = np.arange(2000 * 16, dtype=np.float64).reshape(2000, 16)
    pq.write_table(pa.table({"a": list(rows)}), tmp_path / "p.parquet", row_group_size=500)
    data = bytearray((tmp_path / "p.parquet").read_bytes())
    mid = len(data) // 4
    data[mid : mid + 2000] = bytes(b ^ 0xA5 for b in data[mid : mid + 2000])
    (tmp_path / "p.parquet").write_bytes(bytes(data))
    with pytest.raises(ConvertError, match=r"p.parquet: cannot read rows from \d+"):
        _convert(tmp_path / "p.parquet", tmp_path / "out")
    _nothing_left(tmp_path)


# ----------------------------------------------------------------- Hugging Face


@pytest.fixture(scope="module")
def hf_dataset():
    datasets = pytest.importorskip("datasets", reason="datasets is part of the test extra")
    images = [np.full((4, 5, 3), i, np.uint8) for i in range(30)]
    feats = datasets.Features(
        {
            "img": datasets.Image(),
            "label": datasets.ClassLabel(names=["cat", "dog", "eel"]),
            "arr": datasets.Array2D((2, 3), "float32"),
            "text": datasets.Value("string"),
            "ids": datasets.List(datasets.Value("int32")),
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "img": [{"bytes": _png(a), "path": None} for a in images],
            "label": [i % 3 for i in range(30)],
            "arr": [np.full((2, 3), i, np.float32) for i in range(30)],
            "text": [f"t{i}" for i in range(30)],
            "ids": [list(range(i % 5)) for i in range(30)],
        },
        features=feats,
    )
    return datasets, ds, images


def _check_hf(ds: dict, order, images) -> None:
    assert ds["img"].item_shape == (4, 5, 3) and ds["img"].dtype == np.uint8
    assert_same(ds["img"][:], np.stack([images[i] for i in order]))
    assert_same(ds["label"][:], np.array([i % 3 for i in order], np.int64))
    assert_same(ds["arr"][:], np.stack([np.full((2, 3), i, np.float32) for i in order]))
    assert ds["text"][:] == [f"t{i}" for i in order]
    assert [r.tolist() for r in ds["ids"][:]] == [list(range(i % 5)) for i in order]


def test_hf_dataset_object_and_shuffled_view(tmp_path, hf_dataset):
    _, hf, images = hf_dataset
    ds = loaderx.convert(hf, tmp_path / "a")
    _check_hf(ds, range(30), images)
    for v in ds.values():
        v.close()
    assert loaderx.labels(tmp_path / "a", "label") == ["cat", "dog", "eel"]
    shuffled = hf.shuffle(seed=4)
    order = [int(t[1:]) for t in shuffled["text"]]
    ds = loaderx.convert(shuffled, tmp_path / "b", workers=2)
    _check_hf(ds, order, images)
    for v in ds.values():
        v.close()
    ds = loaderx.convert(hf, tmp_path / "c", keep_encoded=True, columns=["img"])
    assert ds["img"].kind == "bytes" and ds["img"][3] == _png(images[3])
    ds["img"].close()


def test_hf_save_to_disk_and_dataset_dict(tmp_path, hf_dataset):
    datasets, hf, images = hf_dataset
    hf.save_to_disk(str(tmp_path / "disk"))
    ds = loaderx.convert(tmp_path / "disk", tmp_path / "a", workers=2)
    _check_hf(ds, range(30), images)
    for v in ds.values():
        v.close()
    dd = datasets.DatasetDict({"train": hf, "test": hf.select([5, 1])})
    for name, source in (("obj", dd), ("dir", tmp_path / "dd")):
        if name == "dir":
            dd.save_to_disk(str(tmp_path / "dd"))
        splits = loaderx.convert(source, tmp_path / f"s-{name}")
        assert sorted(splits) == ["test", "train"]
        _check_hf(splits["train"], range(30), images)
        _check_hf(splits["test"], [5, 1], images)
        for split in splits.values():
            for v in split.values():
                v.close()
    assert read_manifest(tmp_path / "s-obj")["splits"] == {
        "train": "gen-000001/train", "test": "gen-000001/test"}
    with pytest.raises(DestinationExistsError):
        loaderx.convert(dd, tmp_path / "s-obj")
    assert _leftovers(tmp_path) == []


def test_split_names_never_write_outside_the_destination(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets is part of the test extra")
    part = datasets.Dataset.from_dict({"x": np.zeros((4, 16), np.float32).tolist()})
    parent = tmp_path / "parent"
    parent.mkdir()
    out = _convert(datasets.DatasetDict({"../evil": part, "train": part}), parent / "d")
    assert sorted(os.listdir(parent)) == ["d"]
    assert sorted(out) == ["../evil", "train"] and len(out["../evil"]["x"]) == 4
    for split in out.values():
        split["x"].close()
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "dataset_dict.json").write_text("{bad")
    with pytest.raises(ConvertError, match="dataset_dict.json: not valid JSON"):
        _convert(tmp_path / "hf", tmp_path / "out")
    (tmp_path / "hf" / "dataset_dict.json").unlink()
    (tmp_path / "hf" / "dataset_info.json").write_text("{}")
    (tmp_path / "hf" / "state.json").write_text('{"_data_files": [{"name": 1}]}')
    with pytest.raises(ConvertError, match="state.json: '_data_files' is not a list"):
        _convert(tmp_path / "hf", tmp_path / "out")


# ----------------------------------------------------------------- image folders


def test_image_folder_dense_ragged_encoded(tmp_path):
    root = tmp_path / "imgs"
    expected = []
    for label, cls in enumerate(("cat", "dog")):
        (root / cls).mkdir(parents=True)
        for i in range(6):
            a = np.random.default_rng(label * 10 + i).integers(0, 255, (5, 7, 3), dtype=np.uint8)
            Image.fromarray(a).save(root / cls / f"{i:02d}.png")
            expected.append((a, label))
    (root / "dog" / "notes.txt").write_text("not an image")
    ds = loaderx.convert(root, tmp_path / "d", workers=2)
    assert isinstance(ds["image"], ShardSet) and ds["image"].item_shape == (5, 7, 3)
    assert_same(ds["image"][:], np.stack([a for a, _ in expected]))
    assert_same(ds["label"][:], np.array([lab for _, lab in expected], np.int64))
    for v in ds.values():
        v.close()
    assert read_manifest(tmp_path / "d")["source"]["classes"] == ["cat", "dog"]
    odd = np.full((3, 2), 9, np.uint8)
    Image.fromarray(odd).save(root / "dog" / "99.png")
    ds = loaderx.convert(root, tmp_path / "r")
    assert ds["image"].kind == "ragged" and len(ds["image"]) == 13
    assert_same(ds["image"][12], odd)  # a ragged column keeps each image's mode
    assert_same(ds["image"][0], expected[0][0])
    for v in ds.values():
        v.close()
    ds = loaderx.convert(root, tmp_path / "e", keep_encoded=True)
    assert ds["image"].kind == "bytes" and ds["image"][12] == (root / "dog" / "99.png").read_bytes()
    for v in ds.values():
        v.close()


def _image(path, mode: str, size=(8, 8), fmt=None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new(mode, size).save(path, format=fmt)


def test_oversized_and_deep_images_are_refused_by_name(tmp_path):
    _image(tmp_path / "bomb" / "a" / "0.png", "1", size=(20000, 20000))
    with pytest.raises(ConvertError, match="0.png: not a readable image.*decompression bomb"):
        _convert(tmp_path / "bomb", tmp_path / "out")
    # Float and 32-bit images mixed: converting to 8-bit RGB would clip them.
    _image(tmp_path / "deep" / "a" / "0.tif", "F", fmt="TIFF")
    _image(tmp_path / "deep" / "a" / "1.tif", "I", fmt="TIFF")
    with pytest.raises(ConvertError, match=r"modes \['F', 'I'\].*would lose values"):
        _convert(tmp_path / "deep", tmp_path / "out")
    _nothing_left(tmp_path)


# ----------------------------------------------------------------- WebDataset


def _tar(path, samples) -> None:
    with tarfile.open(path, "w") as tf:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def _wds_samples(first: int, count: int):
    out = []
    for i in range(first, first + count):
        arr = np.full((3, 4), i, np.float32)
        npy = io.BytesIO()
        np.save(npy, arr)
        out.append(
            (
                f"shard/{i:05d}",
                {
                    "cls": str(i % 4).encode(),
                    "txt": f"caption {i}".encode(),
                    "png": _png(np.full((6, 6), i, np.uint8)),
                    "npy": npy.getvalue(),
                },
            )
        )
    return out


def test_webdataset_columns_by_extension_and_workers(tmp_path):
    (tmp_path / "wds").mkdir()
    _tar(tmp_path / "wds" / "a-000.tar", _wds_samples(0, 7))
    _tar(tmp_path / "wds" / "a-001.tar", _wds_samples(7, 5))
    ds = loaderx.convert(tmp_path / "wds", tmp_path / "o", workers=2)
    assert list(ds) == ["cls", "txt", "image", "npy", "key"]
    assert ds["cls"].lengths == (7, 5)
    assert_same(ds["cls"][:], np.arange(12, dtype=np.int64) % 4)
    assert ds["txt"][:] == [f"caption {i}".encode() for i in range(12)]
    assert_same(ds["image"][:], np.stack([np.full((6, 6), i, np.uint8) for i in range(12)]))
    assert_same(ds["npy"][:], np.stack([np.full((3, 4), i, np.float32) for i in range(12)]))
    for v in ds.values():
        v.close()
    broken = _wds_samples(0, 3)
    del broken[2][1]["txt"]
    _tar(tmp_path / "bad.tar", broken)
    with pytest.raises(
        ConvertError, match=r"sample 'shard/00002' has no 'txt' member.*skip_columns=\['txt'\]"
    ):
        loaderx.convert(tmp_path / "bad.tar", tmp_path / "b")
    ds = loaderx.convert(
        tmp_path / "bad.tar", tmp_path / "b", skip_columns=["txt"], keep_encoded=True
    )
    assert ds["image"][0] == broken[0][1]["png"] and len(ds["cls"]) == 3
    for v in ds.values():
        v.close()


def _tar_files(path, members, mode="w") -> None:
    with tarfile.open(path, mode) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_a_truncated_or_damaged_tar_is_refused_not_shortened(tmp_path):
    samples = [(f"k{i:03d}.txt", b"text %d " % i * 20) for i in range(100)]
    _tar_files(tmp_path / "good.tar", samples)
    assert len(_convert(tmp_path / "good.tar", tmp_path / "ok")["txt"]) == 100
    data = (tmp_path / "good.tar").read_bytes()
    with tarfile.open(tmp_path / "good.tar") as tf:
        boundary = tf.getmembers()[40].offset
    damaged = bytearray(data)
    damaged[boundary : boundary + 512] = b"\x07" * 512
    for name, content, why in (
        ("half.tar", data[: len(data) // 2 + 100], "truncated header"),
        ("boundary.tar", data[:boundary], "empty header"),
        ("garbled.tar", bytes(damaged), "invalid header"),
    ):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ConvertError, match=f"{name}: the archive ends after .*{why}"):
            _convert(tmp_path / name, tmp_path / "out")
        _nothing_left(tmp_path)
    _tar_files(tmp_path / "good.tar.gz", samples, "w:gz")
    gz = (tmp_path / "good.tar.gz").read_bytes()
    (tmp_path / "half.tar.gz").write_bytes(gz[: len(gz) // 2])
    with pytest.raises(ConvertError, match="half.tar.gz: .*truncated"):
        _convert(tmp_path / "half.tar.gz", tmp_path / "out")
    _nothing_left(tmp_path)


def test_webdataset_members_that_do_not_fit_are_named(tmp_path):
    _tar_files(tmp_path / "cls.tar", [("k0.cls", b"1"), ("k1.cls", b"2"), ("k2.cls", b"9" * 30)])
    with pytest.raises(ConvertError, match=r"cls.tar:k2.cls: holds b'9+', not an integer"):
        _convert(tmp_path / "cls.tar", tmp_path / "out", allow_tiny_records=True)
    arrays = [np.zeros(i + 1, np.float64 if i < 70 else np.float32) for i in range(80)]
    _tar_files(tmp_path / "npy.tar", [(f"k{i:02d}.npy", _npy_bytes(a)) for i, a in enumerate(arrays)])
    with pytest.raises(ConvertError, match="npy.tar:k70.npy: array has dtype float32 but the"):
        _convert(tmp_path / "npy.tar", tmp_path / "out")
    _nothing_left(tmp_path)


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
    _convert({"x": np.zeros((4, 8))}, tmp_path / "inner")["x"].close()
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


# ----------------------------------------------------------------- shapes as users wrote them


def _pixels(rows: int, first: int = 0, length: int = 64) -> list:
    return [np.arange(length, dtype=np.float64) + 1000 * i for i in range(first, first + rows)]


def _pandas_parquet(path, pixels: list, **kw) -> None:
    pd = pytest.importorskip("pandas", reason="pandas comes with datasets in the test extra")
    pd.DataFrame({"pixels": pixels, "target": np.arange(len(pixels)) % 10}).to_parquet(
        path, **kw
    )


def test_equal_length_list_columns_become_dense(tmp_path):
    pixels = _pixels(300)
    _pandas_parquet(tmp_path / "digits.parquet", pixels)
    assert str(pq.read_schema(tmp_path / "digits.parquet").field("pixels").type).startswith("list")
    ds = loaderx.convert(tmp_path / "digits.parquet", tmp_path / "d", progress=False)
    assert ds["pixels"].kind == "dense" and ds["pixels"].item_shape == (64,)
    assert_same(ds["pixels"][:], np.stack(pixels))
    with DataLoader(ds, batch_size=32, seed=0) as loader:
        batch = next(loader)
        assert batch["pixels"].shape == (32, 64) and batch["pixels"].dtype == np.float64
        assert_same(batch["pixels"], np.stack(pixels)[batch["target"] * 0 + _order(ds, batch)])
    col = read_manifest(tmp_path / "d")["columns"]["pixels"]
    assert (col["kind"], col["item_shape"]) == ("dense", [64])
    for v in ds.values():
        v.close()


def _order(ds: dict, batch: dict) -> np.ndarray:
    """The rows of a batch, found by their first pixel (row i starts at 1000 i)."""
    return (batch["pixels"][:, 0] // 1000).astype(np.int64)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_later_row_of_another_length_makes_the_column_ragged(tmp_path, workers):
    """Dense is decided from the first rows; a row of another length in a
    later batch (here in the second file, past several written batches)
    turns the whole column ragged, every row intact and in order."""
    (tmp_path / "src").mkdir()
    first, second = _pixels(400), _pixels(200, first=400)
    second[150] = second[150][:63]
    _pandas_parquet(tmp_path / "src" / "part-0.parquet", first, row_group_size=100)
    _pandas_parquet(tmp_path / "src" / "part-1.parquet", second, row_group_size=100)
    ds = loaderx.convert(
        tmp_path / "src", tmp_path / "d", workers=workers, batch_bytes=32 << 10, progress=False
    )
    assert ds["pixels"].kind == "ragged" and ds["target"].kind == "dense"
    got = ds["pixels"][:]
    assert len(got) == 600
    for a, b in zip(got, first + second):
        assert_same(a, b)
    assert read_manifest(tmp_path / "d")["columns"]["pixels"]["item_shape"] is None
    for v in ds.values():
        v.close()
    # Lengths that differ within the first rows: ragged from the start.
    _pandas_parquet(tmp_path / "mixed.parquet", [np.arange(n, dtype=np.int32) for n in (3, 4, 3)])
    ds = loaderx.convert(tmp_path / "mixed.parquet", tmp_path / "m", progress=False)
    assert ds["pixels"].kind == "ragged" and ds["pixels"][1].tolist() == [0, 1, 2, 3]
    for v in ds.values():
        v.close()


def test_appending_lists_keeps_the_dataset_s_layout(tmp_path):
    _pandas_parquet(tmp_path / "a.parquet", _pixels(50))
    loaderx.convert(tmp_path / "a.parquet", tmp_path / "d", progress=False)["pixels"].close()
    before = (tmp_path / "d" / "loaderx.json").read_text()
    for name, row in (("b", 40), ("c", 1500)):  # within the first rows looked at, and past them
        uneven = _pixels(1600)
        uneven[row] = uneven[row][:10]
        _pandas_parquet(tmp_path / f"{name}.parquet", uneven)
        with pytest.raises(IdentityError, match="column 'pixels' holds kind=dense"):
            loaderx.convert(tmp_path / f"{name}.parquet", tmp_path / "d", mode="append",
                            batch_bytes=64 << 10, progress=False)
        assert (tmp_path / "d" / "loaderx.json").read_text() == before
        assert sorted(os.listdir(tmp_path / "d" / "gen-000001" / "pixels")) == ["part-00000"]
    # Equal-length rows appended to a column of lists stay lists.
    loaderx.convert(tmp_path / "b.parquet", tmp_path / "r", progress=False)["pixels"].close()
    ds = loaderx.convert(tmp_path / "a.parquet", tmp_path / "r", mode="append", progress=False)
    assert ds["pixels"].kind == "ragged" and len(ds["pixels"]) == 1650
    assert_same(ds["pixels"][1649], _pixels(50)[49])
    for v in ds.values():
        v.close()


# ----------------------------------------------------------------- real WebDataset tars


def _member_image(data: bytes, mode: str) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert(mode))


def _tar_members(paths) -> dict:
    out = {}
    for p in paths:
        with tarfile.open(p) as tf:
            for m in tf.getmembers():
                out[m.name] = tf.extractfile(m).read()
    return out


def test_webdataset_shards_mixing_jpg_and_png_convert(tmp_path):
    wds = pytest.importorskip("webdataset", reason="webdataset is part of the test extra")
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 255, (12, 10, 3), dtype=np.uint8) for _ in range(23)]
    (tmp_path / "shards").mkdir()
    with wds.ShardWriter(str(tmp_path / "shards" / "train-%03d.tar"), maxcount=8, verbose=0) as w:
        for i, a in enumerate(images):
            w.write({"__key__": f"sample{i:04d}", "jpg" if i % 3 else "png": a, "cls": i % 5})
    shards = sorted((tmp_path / "shards").iterdir())
    assert len(shards) == 3
    ds = loaderx.convert(tmp_path / "shards", tmp_path / "d", workers=2, progress=False)
    assert list(ds) == ["cls", "image", "key"]
    assert ds["image"].kind == "dense" and ds["image"].item_shape == (12, 10, 3)
    members = _tar_members(shards)
    for i in range(23):
        ext = "jpg" if i % 3 else "png"
        want = _member_image(members[f"sample{i:04d}.{ext}"], "RGB")
        assert_same(ds["image"][i], want)
        if ext == "png":
            assert_same(ds["image"][i], images[i])
    assert_same(ds["cls"][:], np.arange(23, dtype=np.int64) % 5)
    assert _text(ds["key"][:]) == [f"sample{i:04d}" for i in range(23)]
    m = read_manifest(tmp_path / "d")
    assert [f["path"] for f in m["source"]["files"]] == [p.name for p in shards]
    assert [f["rows"] for f in m["source"]["files"]] == [[0, 8], [8, 16], [16, 23]]
    for v in ds.values():
        v.close()
    # One column per extension on request; no key column on request.
    with wds.ShardWriter(str(tmp_path / "one-%03d.tar"), maxcount=100, verbose=0) as w:
        for i in range(3):
            w.write({"__key__": f"k{i}", "png": images[i], "jpg": images[i]})
    with pytest.raises(ConvertError, match=r"sample 'k0' has 2 images .*image_column=None"):
        loaderx.convert(tmp_path / "one-000.tar", tmp_path / "e", progress=False)
    ds = loaderx.convert(
        tmp_path / "one-000.tar", tmp_path / "e", image_column=None, keys=False, progress=False
    )
    assert sorted(ds) == ["jpg", "png"] and ds["png"].item_shape == (12, 10, 3)
    for v in ds.values():
        v.close()


def test_tar_images_past_the_probe_that_do_not_fit_make_the_column_ragged(tmp_path):
    """The first 64 samples decide a dense column; a later image of another
    size or a wider mode makes it ragged instead of failing (or dropping
    its alpha channel)."""
    grey = [np.full((8, 8), i, np.uint8) for i in range(70)]
    wide = np.full((9, 8, 4), 200, np.uint8)
    samples = [(f"k{i:03d}", {"png": _png(a)}) for i, a in enumerate(grey)]
    _tar(tmp_path / "w.tar", samples + [("k999", {"png": _png(wide)})])
    ds = loaderx.convert(tmp_path / "w.tar", tmp_path / "d", batch_bytes=1 << 10, progress=False)
    assert ds["image"].kind == "ragged" and len(ds["image"]) == 71
    assert_same(ds["image"][3], grey[3])
    assert_same(ds["image"][70], wide)
    assert read_manifest(tmp_path / "d")["columns"]["image"]["image_mode"] == "per-image"
    for v in ds.values():
        v.close()


def test_deep_images_after_the_probe_are_not_clipped(tmp_path):
    gray = [(f"k{i:03d}.png", _encoded("L")) for i in range(70)]
    _tar_files(tmp_path / "w.tar", gray + [("k999.png", _encoded("I;16"))])
    with pytest.raises(ConvertError, match="k999.png: the image has the Pillow mode 'I;16'"):
        _convert(tmp_path / "w.tar", tmp_path / "out")
    _nothing_left(tmp_path)


def _encoded(mode: str) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (8, 8)).save(buf, format="PNG")
    return buf.getvalue()


# ----------------------------------------------------------------- image modes


def _save(path, mode: str, size, fill) -> np.ndarray:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    im = Image.new(mode, size, fill)
    im.save(path)
    return np.asarray(im)


def test_mixed_mode_image_folders_keep_small_modes(tmp_path, capsys):
    root = tmp_path / "imgs"
    grey = [_save(root / "a" / f"{i}.png", "L", (20 + i, 16), i) for i in range(6)]
    rgb = _save(root / "b" / "0.png", "RGB", (16, 16), (1, 2, 3))
    rgba = _save(root / "b" / "1.png", "RGBA", (16, 17), (1, 2, 3, 4))
    with pytest.warns(UserWarning, match=r"decoded, the images .*keep_encoded=True") as caught:
        ds = loaderx.convert(root, tmp_path / "d", progress="log")
    assert [w.filename for w in caught] == [__file__]  # the caller's line, not loaderx's
    assert ds["image"].kind == "ragged"
    for i in range(6):
        assert_same(ds["image"][i], grey[i])  # one byte per pixel, as in the file
    assert_same(ds["image"][6], rgb)
    assert_same(ds["image"][7], rgba)
    col = read_manifest(tmp_path / "d")["columns"]["image"]
    assert col["image_mode"] == "per-image"
    assert col["image_modes"] == {"L": 6, "RGB": 1, "RGBA": 1}
    assert "each in its own mode" in capsys.readouterr().err
    for v in ds.values():
        v.close()
    # One size: a dense column in the smallest mode that holds every image.
    for name, modes, want in (
        ("grey-rgb", [("L", 7), ("RGB", (7, 8, 9))], "RGB"),
        ("grey-alpha", [("L", 7), ("LA", (7, 100))], "LA"),
        ("palette", [("P", 3), ("1", 1)], "RGB"),
    ):
        for k, (mode, fill) in enumerate(modes):
            _save(tmp_path / name / "x" / f"{k}.png", mode, (5, 4), fill)
        ds = loaderx.convert(tmp_path / name, tmp_path / f"o-{name}", progress=False)
        assert read_manifest(tmp_path / f"o-{name}")["columns"]["image"]["image_mode"] == want
        for k, (mode, fill) in enumerate(modes):
            with Image.open(tmp_path / name / "x" / f"{k}.png") as im:
                assert_same(ds["image"][k], np.asarray(im.convert(want)))
        for v in ds.values():
            v.close()


# ----------------------------------------------------------------- provenance


def _text(values) -> list:
    """Key records as str, whether the store gives UTF-8 columns back as
    bytes or as str."""
    return [v.decode() if isinstance(v, bytes) else v for v in values]


def test_keys_labels_and_source_rows_of_an_image_folder(tmp_path):
    root = tmp_path / "imgs"
    for cls, n in (("cat", 3), ("dog", 2)):
        for i in range(n):
            _save(root / cls / f"img{i}.png", "RGB", (4, 4), (i, 0, 0))
    _save(root / "dog" / "deep" / "x.png", "RGB", (4, 4), (9, 9, 9))
    ds = loaderx.convert(root, tmp_path / "d", progress=False)
    assert list(ds) == ["image", "label", "key"]
    assert _text(ds["key"][:]) == [
        "cat/img0.png", "cat/img1.png", "cat/img2.png",
        "dog/img0.png", "dog/img1.png", "dog/deep/x.png",
    ]
    names = loaderx.labels(ds, "label")
    assert names == ["cat", "dog"] and loaderx.labels(tmp_path / "d", "label") == names
    assert [names[k] for k in ds["label"][:]] == ["cat"] * 3 + ["dog"] * 3
    assert loaderx.labels(ds, "image") is None
    col = read_manifest(tmp_path / "d")["columns"]["key"]
    assert (col["kind"], col["codec"], col["role"]) == ("bytes", "raw", "key")
    with pytest.raises(KeyError, match="no column 'nope'"):
        loaderx.labels(tmp_path / "d", "nope")
    with DenseStore(tmp_path / "alone", np.int64, ()) as alone:
        with pytest.raises(ValueError, match="not opened from a dataset directory"):
            loaderx.labels({"label": alone}, "label")
    for v in ds.values():
        v.close()
    ds = loaderx.convert(root, tmp_path / "n", keys=False, progress=False)
    assert list(ds) == ["image", "label"]
    for v in ds.values():
        v.close()
    # Appending images of other classes would give code 0 another name.
    _save(tmp_path / "more" / "bird" / "0.png", "RGB", (4, 4), (1, 1, 1))
    with pytest.raises(ConvertError, match=r"labels are \['cat', 'dog'\], the new data's \['bird'\]"):
        loaderx.convert(tmp_path / "more", tmp_path / "d", mode="append", progress=False)


def test_manifest_gives_each_source_file_its_rows(tmp_path, hf_dataset):
    (tmp_path / "src").mkdir()
    for k, n in enumerate((70, 0, 130)):
        x = np.arange(n * 16, dtype=np.float64).reshape(n, 16)
        pq.write_table(pa.table({"x": pa.FixedSizeListArray.from_arrays(x.ravel(), 16)}),
                       tmp_path / "src" / f"part-{k}.parquet", row_group_size=40)
    loaderx.convert(tmp_path / "src", tmp_path / "d", workers=3, progress=False)["x"].close()
    files = read_manifest(tmp_path / "d")["source"]["files"]
    assert files == [
        {"path": "part-0.parquet", "rows": [0, 70]},
        {"path": "part-1.parquet", "rows": [70, 70]},
        {"path": "part-2.parquet", "rows": [70, 200]},
    ]
    loaderx.convert(tmp_path / "src" / "part-2.parquet", tmp_path / "d", mode="append",
                    progress=False)["x"].close()
    m = read_manifest(tmp_path / "d")
    assert m["rows"] == 330
    assert m["appended"][0]["files"] == [{"path": "part-2.parquet", "rows": [200, 330]}]
    # Hugging Face ClassLabel names through the same call.
    _, hf, _ = hf_dataset
    ds = loaderx.convert(hf, tmp_path / "hf", progress=False)
    assert loaderx.labels(ds, "label") == ["cat", "dog", "eel"]
    for v in ds.values():
        v.close()


def _typed_dataset(tmp_path) -> str:
    """A converted Parquet file: text with nulls, an int column with nulls,
    a categorical, a ragged list column and an image-free dense column."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    n = 60
    table = pa.table({
        "t": [None if i % 7 == 0 else f"s{i}" for i in range(n)],
        "x": pa.array([None if i % 5 == 0 else i for i in range(n)], pa.int64()),
        "c": pa.array([["a", "b", "c"][i % 3] for i in range(n)]).dictionary_encode(),
        "v": [[float(j) for j in range(i % 4)] for i in range(n)],
        "d": [[i, -i] for i in range(n)],
    })
    pq.write_table(table, tmp_path / "a.parquet")
    loaderx.convert(str(tmp_path / "a.parquet"), str(tmp_path / "src"), progress="off")
    return str(tmp_path / "src")


def _same_records(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        n = len(a[name])
        assert len(b[name]) == n
        for got, want in zip(b[name][np.arange(n)], a[name][np.arange(n)]):
            if want is None or isinstance(want, str):
                assert got == want, name
            else:
                assert_same(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_loaderx_dataset_converts_to_a_copy_with_its_columns_as_they_are(tmp_path, workers):
    """Converting a loaderx dataset (local here; a URL in test_remote.py)
    copies every record exactly, keeps what its manifest says of each
    column (text, categories, nulls and their masks) and records each
    column's content, so a subset's fingerprint is the same on the copy."""
    src = _typed_dataset(tmp_path)
    copy = loaderx.convert(src, str(tmp_path / "copy"), codec="raw", workers=workers,
                           progress="off")
    ds = open_dataset(src)
    _same_records(ds, copy)
    have, made = read_manifest(src)["columns"], read_manifest(str(tmp_path / "copy"))["columns"]
    assert list(made) == list(have)
    for name, entry in have.items():
        mine = made[name]
        assert {k: v for k, v in mine.items() if k not in ("shards", "codec", "content")} == \
            {k: v for k, v in entry.items() if k not in ("shards", "codec")}, name
        assert mine["content"]["rows"] == 60 and mine["codec"] == "raw"
    assert read_manifest(str(tmp_path / "copy"))["source"]["type"] == "loaderx"
    where = "x > 10 AND t IS NOT NULL"
    assert loaderx.select(ds, where)["x"].fingerprint == \
        loaderx.select(copy, where)["x"].fingerprint
    for col in list(ds.values()) + list(copy.values()):
        col.close()


def test_a_loaderx_store_and_a_dataset_of_splits_convert_too(tmp_path):
    ragged = [np.arange(i, dtype=np.int32) for i in range(9)]
    from_iterator(str(tmp_path / "tokens"), ragged).close()
    copy = loaderx.convert(str(tmp_path / "tokens"), str(tmp_path / "one"), progress="off")
    assert list(copy) == ["tokens"] and len(copy["tokens"]) == 9
    for got, want in zip(copy["tokens"][np.arange(9)], ragged):
        assert_same(got, want)
    copy["tokens"].close()
    with pytest.raises(ConvertError, match="columns names \\['nope'\\], which the source"):
        loaderx.convert(str(tmp_path / "tokens"), str(tmp_path / "bad"), columns=["nope"],
                        progress="off")
    splits = {"train": {"x": np.arange(10)}, "test": {"x": np.arange(3)}}
    for name, arrays in splits.items():
        loaderx.convert(arrays, str(tmp_path / "parts" / name), progress="off")
    root = tmp_path / "split-ds"
    os.makedirs(root / "gen-000001")
    for name in splits:
        os.rename(tmp_path / "parts" / name, root / "gen-000001" / name)
    (root / "loaderx.json").write_text(json.dumps({
        "format": "loaderx-dataset", "version": 2, "generation": "gen-000001",
        "splits": {name: f"gen-000001/{name}" for name in splits}}))
    out = loaderx.convert(str(root), str(tmp_path / "split-copy"), progress="off")
    assert sorted(out) == ["test", "train"] and len(out["train"]["x"]) == 10
    assert out["test"]["x"][:].tolist() == [0, 1, 2]
    for split in out.values():
        for col in split.values():
            col.close()


def test_appending_to_a_categorical_keeps_the_column_s_fill_and_provisional_flag():
    from loaderx.converters import _merge_categories
    from loaderx.converters._columns import ColumnSpec

    spec = ColumnSpec("c", "dense", np.dtype(np.int8), (), extra={"categories": ["a", "b"]},
                      fill="a")
    merged = _merge_categories([spec], {"columns": {"c": {"categories": ["b"]}}}, "dst")[0]
    assert merged.fill == "a" and merged.provisional is False
    assert merged.extra["categories"] == ["b", "a"] and merged.dtype == np.int8
