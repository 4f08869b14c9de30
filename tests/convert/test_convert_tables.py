"""`loaderx.convert` of tables: Parquet, Arrow IPC and Feather (types, workers,
row groups, the column-type mapping and its refusals, naming the column and
the flag), Hugging Face datasets (objects, save_to_disk directories, dataset
dicts), list columns as users wrote them (equal lengths become dense, a
later row of another length makes the column ragged), and provenance (each
source file's rows, keys and labels; a loaderx dataset or store converted
to a copy).

A damaged Parquet page, duplicate column names and hostile split names give a
clear error naming the input, and leave nothing behind."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from _convert_checks import as_text, leftovers, nothing_left, png_bytes, save_image
from _helpers import assert_same, convert_quiet

import loaderx
from loaderx import DataLoader, DenseStore, ShardSet, open_dataset
from loaderx.converters import ConvertError
from loaderx.dataset import DestinationExistsError, from_iterator, read_manifest
from loaderx.errors import IdentityError

pa = pytest.importorskip("pyarrow", reason="pyarrow is part of the test extra")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is part of the test extra")
Image = pytest.importorskip("PIL.Image", reason="Pillow is part of the test extra")


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
        convert_quiet(x, tmp_path / "out", columns=["x", "x"])
    with pytest.raises(TypeError, match="a list of column names, not the string 'x'"):
        convert_quiet(x, tmp_path / "out", columns="x")
    with pytest.raises(ConvertError, match="two arrays are named '1'"):
        convert_quiet({1: np.zeros((3, 8)), "1": np.ones((3, 8))}, tmp_path / "out")
    table = pa.Table.from_arrays([pa.array(np.zeros(10)), pa.array(np.ones(10))], ["a", "a"])
    pq.write_table(table, tmp_path / "dup.parquet")
    with pytest.raises(ConvertError, match=r"the source has the columns \['a'\] more than once"):
        convert_quiet(tmp_path / "dup.parquet", tmp_path / "out", allow_tiny_records=True)
    nothing_left(tmp_path)


def test_a_damaged_parquet_page_is_named(tmp_path):
    rows = np.arange(2000 * 16, dtype=np.float64).reshape(2000, 16)
    pq.write_table(pa.table({"a": list(rows)}), tmp_path / "p.parquet", row_group_size=500)
    data = bytearray((tmp_path / "p.parquet").read_bytes())
    mid = len(data) // 4
    data[mid : mid + 2000] = bytes(b ^ 0xA5 for b in data[mid : mid + 2000])
    (tmp_path / "p.parquet").write_bytes(bytes(data))
    with pytest.raises(ConvertError, match=r"p.parquet: cannot read rows from \d+"):
        convert_quiet(tmp_path / "p.parquet", tmp_path / "out")
    nothing_left(tmp_path)


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
            "img": [{"bytes": png_bytes(a), "path": None} for a in images],
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


@pytest.mark.slow
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
    assert ds["img"].kind == "bytes" and ds["img"][3] == png_bytes(images[3])
    ds["img"].close()


@pytest.mark.slow
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
    assert leftovers(tmp_path) == []


def test_split_names_never_write_outside_the_destination(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets is part of the test extra")
    part = datasets.Dataset.from_dict({"x": np.zeros((4, 16), np.float32).tolist()})
    parent = tmp_path / "parent"
    parent.mkdir()
    out = convert_quiet(datasets.DatasetDict({"../evil": part, "train": part}), parent / "d")
    assert sorted(os.listdir(parent)) == ["d"]
    assert sorted(out) == ["../evil", "train"] and len(out["../evil"]["x"]) == 4
    for split in out.values():
        split["x"].close()
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "dataset_dict.json").write_text("{bad")
    with pytest.raises(ConvertError, match="dataset_dict.json: not valid JSON"):
        convert_quiet(tmp_path / "hf", tmp_path / "out")
    (tmp_path / "hf" / "dataset_dict.json").unlink()
    (tmp_path / "hf" / "dataset_info.json").write_text("{}")
    (tmp_path / "hf" / "state.json").write_text('{"_data_files": [{"name": 1}]}')
    with pytest.raises(ConvertError, match="state.json: '_data_files' is not a list"):
        convert_quiet(tmp_path / "hf", tmp_path / "out")


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


# ----------------------------------------------------------------- provenance


def test_keys_labels_and_source_rows_of_an_image_folder(tmp_path):
    root = tmp_path / "imgs"
    for cls, n in (("cat", 3), ("dog", 2)):
        for i in range(n):
            save_image(root / cls / f"img{i}.png", "RGB", (4, 4), (i, 0, 0))
    save_image(root / "dog" / "deep" / "x.png", "RGB", (4, 4), (9, 9, 9))
    ds = loaderx.convert(root, tmp_path / "d", progress=False)
    assert list(ds) == ["image", "label", "key"]
    assert as_text(ds["key"][:]) == [
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
    save_image(tmp_path / "more" / "bird" / "0.png", "RGB", (4, 4), (1, 1, 1))
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
    """Converting a loaderx dataset (local here; a URL in test_remote_datasets.py)
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
