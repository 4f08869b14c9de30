"""Tests of typed columns (`loaderx.columns`): what a conversion makes of
nulls, strings and categoricals, and how a dataset reads them back.

Data is shaped like real tables: pandas writes NaN and None as Parquet
nulls, nullable ``Int64``/``boolean`` columns, ``string`` and ``category``
dtypes, NaT timestamps. Checked: values, validity masks (through the API,
the DataLoader and every conversion worker), ``fill_null`` (API and CLI),
shell-quoted flags in messages, appends that add categories or the first
nulls, Hugging Face ClassLabel names, and the zero-copy array of a raw
scalar column.
"""
from __future__ import annotations

import json
import re
import pickle

import numpy as np
import pytest
from _helpers import assert_same, convert_quiet

import loaderx
from loaderx.converters import ConvertError

pd = pytest.importorskip("pandas", reason="pandas comes with the test extra (datasets)")
pa = pytest.importorskip("pyarrow", reason="pyarrow is part of the test extra")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is part of the test extra")


def _iris_like() -> pd.DataFrame:
    n = 40
    df = pd.DataFrame({
        "sepal length (cm)": np.linspace(4.0, 8.0, n),
        "count": pd.array(np.arange(n), dtype="Int64"),
        "ok": pd.array(np.arange(n) % 2 == 0, dtype="boolean"),
        "name": pd.array([f"n{i}" for i in range(n)], dtype="string"),
        "species": pd.Categorical(np.array(["setosa", "versicolor", "virginica"])[np.arange(n) % 3]),
        "seen": pd.Series(pd.date_range("2024-01-01", periods=n, freq="h")),
        "plain": np.arange(n, dtype=np.int16),
    })
    df.loc[0, "sepal length (cm)"] = np.nan
    df.loc[[3, 30], "count"] = pd.NA
    df.loc[5, "ok"] = pd.NA
    df.loc[[7, 35], "name"] = pd.NA
    df.loc[9, "species"] = np.nan
    df.loc[11, "seen"] = pd.NaT
    return df


def test_a_pandas_table_with_nulls_converts_without_flags(tmp_path, cli):
    df = _iris_like()
    df.to_parquet(tmp_path / "iris.parquet", row_group_size=16)
    ds = loaderx.convert(tmp_path / "iris.parquet", tmp_path / "ds", workers=2, progress="off")
    manifest = json.loads((tmp_path / "ds" / "loaderx.json").read_text())["columns"]
    assert list(manifest) == ["sepal length (cm)", "count", "count.valid", "ok", "ok.valid",
                              "name", "name.valid", "species", "species.valid", "seen",
                              "seen.valid", "plain"]
    assert manifest["count"]["valid"] == "count.valid"
    assert manifest["count.valid"]["valid_of"] == "count"
    assert manifest["name"]["text"] is True
    assert manifest["species"]["categories"] == ["setosa", "versicolor", "virginica"]
    # A float null is NaN (no mask); a column without nulls has no mask.
    sepal = ds["sepal length (cm)"][:]
    assert np.isnan(sepal[0])
    assert_same(sepal[1:], df["sepal length (cm)"].to_numpy()[1:])
    assert "plain.valid" not in ds and ds["plain"].item_shape == ()
    count_valid = np.ones(40, bool)
    count_valid[[3, 30]] = False
    assert_same(ds["count.valid"][:], count_valid)  # row 30: the second worker's part
    assert_same(ds["count"][:], np.where(count_valid, np.arange(40), 0))
    assert ds["count"].valid is ds["count.valid"]
    assert ds["ok"][5] == np.False_ and not ds["ok.valid"][5]
    names = ds["name"][:]
    assert names[7] is None and names[35] is None and names[8] == "n8"  # str, None for a null
    assert "name.valid" not in ds  # a list column's nulls read as None
    species = ds["species"]
    assert species.categories == ("setosa", "versicolor", "virginica") and species.categorical
    assert species[9] == -1 and species[10] == 1 and species.dtype == np.int8
    assert list(species.names_of(species[[9, 10]])) == [None, "versicolor"]
    seen = ds["seen"][:]
    assert np.isnat(seen[11]) and not ds["seen.valid"][11] and seen[12] == np.datetime64(
        "2024-01-01T12:00")
    # The loader yields the masks alongside, and None in list outputs.
    with loaderx.DataLoader(ds, 40, mode="SEQUENTIAL", workers=1) as loader:
        batch = next(loader)
    assert_same(batch["count.valid"], count_valid)
    assert batch["name"][7] is None and batch["name"][0] == "n0"
    for col in ds.values():
        col.close()
    out = cli("verify", tmp_path / "ds")  # every store, the folded name.valid too
    assert out.returncode == 0 and "in 24 stores verified" in out.stdout, out.stderr


def test_fill_null_instead_of_a_mask(tmp_path, cli):
    df = _iris_like()
    df.to_parquet(tmp_path / "iris.parquet")
    ds = loaderx.convert(tmp_path / "iris.parquet", tmp_path / "ds", progress="off",
                         fill_null={"count": -1, "name": "?", "species": "setosa",
                                    "sepal length (cm)": 0.0})
    assert "count.valid" not in ds and "ok.valid" in ds
    assert ds["count"][3] == -1 and ds["name"][7] == "?" and ds["species"][9] == 0
    assert ds["sepal length (cm)"][0] == 0.0
    with pytest.raises(ConvertError, match=r"fill_null names \['nope'\]"):
        loaderx.convert(tmp_path / "iris.parquet", tmp_path / "x", fill_null={"nope": 1})
    with pytest.raises(ConvertError, match=r"column 'count' \(int64\): cannot replace its nulls"
                                           r" with fill_null value 'abc'"):
        loaderx.convert(tmp_path / "iris.parquet", tmp_path / "y", fill_null={"count": "abc"})
    # (before, Arrow truncated it into the int column without a word)
    with pytest.raises(ConvertError, match=r"column 'count' \(int64\): cannot replace its nulls"
                                           r" with fill_null value 1.5 \(it would be stored as 1\)"):
        loaderx.convert(tmp_path / "iris.parquet", tmp_path / "y", fill_null={"count": 1.5})
    assert not (tmp_path / "y").exists()
    with pytest.raises(ConvertError, match="fill_null value 'oak' is not one of its categories"):
        loaderx.convert(tmp_path / "iris.parquet", tmp_path / "z", fill_null={"species": "oak"})
    out = cli("convert", tmp_path / "iris.parquet", tmp_path / "cli", "--fill-null", "count=7",
              "--fill-null", "ok=true", "-q")
    assert out.returncode == 0, out.stderr
    from_cli = loaderx.open_dataset(tmp_path / "cli")
    assert from_cli["count"][3] == 7 and from_cli["ok"][5] and "ok.valid" not in from_cli
    out = cli("convert", tmp_path / "iris.parquet", tmp_path / "bad", "--fill-null", "count")
    assert out.returncode == 2 and "expected COL=VALUE" in out.stderr


def test_a_null_deep_in_a_nested_column_is_filled_and_named(tmp_path):
    rows = [[[1.0, 2.0]] * 3 for _ in range(10)]
    rows[7] = [[1.0, 2.0], [3.0, None]]
    table = pa.table({"a": pa.array(rows, pa.list_(pa.list_(pa.float64(), 2)))})
    pq.write_table(table, tmp_path / "n.parquet", row_group_size=4)
    out = convert_quiet(tmp_path / "n.parquet", tmp_path / "out")
    got = out["a"][7]
    assert got.shape == (2, 2) and got[1, 0] == 3.0 and np.isnan(got[1, 1])  # a float: NaN
    ints = pa.table({"a": pa.array([[1, 2]] * 7 + [[3, None]] + [[4]] * 2, pa.list_(pa.int32()))})
    pq.write_table(ints, tmp_path / "i.parquet", row_group_size=4)
    with pytest.warns(UserWarning, match=r"1 null values inside lists \(the first in row 7\) are stored as 0"):
        out = convert_quiet(tmp_path / "i.parquet", tmp_path / "iout")
    assert_same(out["a"][7], np.array([3, 0], np.int32))
    out = convert_quiet(tmp_path / "i.parquet", tmp_path / "f", fill_null={"a": -1})
    assert_same(out["a"][7], np.array([3, -1], np.int32))


def test_flags_in_messages_are_shell_quoted(tmp_path, cli):
    table = pa.table({"a b": pa.array([{"x": 1}] * 3), "c": pa.array([1, 2, 3])})
    pq.write_table(table, tmp_path / "s.parquet")
    out = cli("convert", tmp_path / "s.parquet", tmp_path / "o")
    assert out.returncode == 1 and "--skip-columns 'a b'" in out.stderr
    with pytest.raises(ConvertError, match=r"skip_columns=\['a b'\]"):
        loaderx.convert(tmp_path / "s.parquet", tmp_path / "o")
    from loaderx.converters._columns import Flags

    assert Flags(cli=True).fill("it's") == "--fill-null 'it'\"'\"'s=VALUE'"
    assert Flags(cli=True).opt("row_length", "L") == "--row-length L"


def test_appends_merge_categories_and_bring_masks(tmp_path):
    first = pd.DataFrame({"c": pd.Categorical(["a", "b", "a"]), "n": [1, 2, 3]})
    first.to_parquet(tmp_path / "1.parquet")
    loaderx.convert(tmp_path / "1.parquet", tmp_path / "ds", progress="off")
    second = pd.DataFrame({"c": pd.Categorical(["z", "b", None]),
                           "n": pd.array([4, None, 6], dtype="Int64")})
    second.to_parquet(tmp_path / "2.parquet")
    ds = loaderx.convert(tmp_path / "2.parquet", tmp_path / "ds", mode="append", progress="off")
    assert ds["c"].categories == ("a", "b", "z")  # old codes keep their meaning
    assert list(ds["c"].names_of(ds["c"][:])) == ["a", "b", "a", "z", "b", None]
    # The first nulls arrive with the append: the old rows are all valid.
    assert_same(ds["n.valid"][:], np.array([1, 1, 1, 1, 0, 1], bool))
    assert_same(ds["c.valid"][:], np.array([1, 1, 1, 1, 1, 0], bool))
    # Appending rows without nulls to a column that has a mask extends it.
    third = pd.DataFrame({"c": pd.Categorical(["b"]), "n": pd.array([9], dtype="Int64")})
    third.to_parquet(tmp_path / "3.parquet")
    ds = loaderx.convert(tmp_path / "3.parquet", tmp_path / "ds", mode="append", progress="off")
    assert_same(ds["n.valid"][:], np.array([1, 1, 1, 1, 0, 1, 1], bool))
    assert loaderx.select(ds, "n IS NULL OR c = 'z'")["n"].rows.tolist() == [3, 4]
    many = pd.DataFrame({"c": pd.Categorical([f"k{i}" for i in range(200)]), "n": range(200)})
    many.to_parquet(tmp_path / "4.parquet")
    with pytest.raises(ConvertError, match="would grow to 203 categories, more than its int8"):
        loaderx.convert(tmp_path / "4.parquet", tmp_path / "ds", mode="append", progress="off")


def test_hugging_face_strings_and_class_labels(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets is part of the test extra")
    features = datasets.Features({
        "text": datasets.Value("string"),
        "label": datasets.ClassLabel(names=["cat", "dog", "bird"]),
    })
    hf = datasets.Dataset.from_dict({"text": [f"t{i}" for i in range(12)],
                                     "label": [i % 3 for i in range(12)]}, features=features)
    ds = loaderx.convert(hf, tmp_path / "ds", progress="off")
    assert ds["text"][:3] == ["t0", "t1", "t2"] and ds["text"].text
    assert ds["label"].categories == ("cat", "dog", "bird") and not ds["label"].categorical
    assert_same(ds["label"][:3], np.array([0, 1, 2]))
    assert loaderx.select(ds, "label = 'dog'")["text"][:] == ["t1", "t4", "t7", "t10"]
    assert loaderx.select(ds, "label IN ('cat', 2) AND text LIKE 't1%'")["text"][:] == \
        ["t11"]
    with pytest.raises(ValueError, match=r"'cow' is not one of the label names of column "
                                         r"'label': \['cat', 'dog', 'bird'\]"):
        loaderx.select(ds, "label = 'cow'")
    back = pickle.loads(pickle.dumps(ds["label"]))
    assert back.categories == ("cat", "dog", "bird") and back[4] == 1


def test_a_raw_scalar_column_is_a_memory_mapped_array(tmp_path):
    labels = np.arange(1000, dtype=np.int32) % 7
    np.save(tmp_path / "label.npy", labels)
    ds = loaderx.convert(tmp_path / "label.npy", tmp_path / "ds", progress="off")
    store = ds["label"]
    arr = store.as_array()
    assert_same(arr, labels)
    assert not arr.flags.writeable and type(arr) is np.ndarray
    with pytest.raises(ValueError):
        arr[0] = 1
    store.close()
    store = loaderx.DenseStore(tmp_path / "ds" / "gen-000001" / "label" / "part-00000")
    store.read_only()
    assert_same(store.as_array()[[5, 999]], labels[[5, 999]])
    with loaderx.DenseStore(tmp_path / "z", np.int32, (), codec="zstd") as z:
        z.append(labels)
        assert z.as_array() is None  # compressed: gather it
    with loaderx.DenseStore(tmp_path / "e", np.float32, (3,), codec="raw") as e:
        assert e.as_array().shape == (0, 3)
        e.append(np.ones((2, 3), np.float32))
        assert e.as_array().shape == (2, 3)


def test_a_null_image_is_a_masked_row(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets is part of the test extra")
    Image = pytest.importorskip("PIL.Image", reason="Pillow is part of the test extra")
    import io

    def png(value):
        buf = io.BytesIO()
        Image.fromarray(np.full((4, 5, 3), value, np.uint8)).save(buf, "PNG")
        return {"bytes": buf.getvalue(), "path": None}

    rows = [png(10), None, png(30)]
    hf = datasets.Dataset.from_dict({"img": rows},
                                    features=datasets.Features({"img": datasets.Image()}))
    ds = loaderx.convert(hf, tmp_path / "d", progress="off")
    assert ds["img"].item_shape == (4, 5, 3)
    assert_same(ds["img.valid"][:], np.array([True, False, True]))
    assert (ds["img"][1] == 0).all() and (ds["img"][2] == 30).all()
    enc = loaderx.convert(hf, tmp_path / "e", keep_encoded=True, progress="off")
    got = enc["img"][:]
    assert got[1] is None and got[0] == rows[0]["bytes"]


@pytest.fixture(scope="module")
def shop(tmp_path_factory):
    """A dataset with a nullable categorical, a nullable int and nullable strings."""
    tmp = tmp_path_factory.mktemp("shop")
    pd.DataFrame({
        "color": pd.Categorical(["red", "green", None, "red"] * 5),
        "count": pd.array([1, None, 3, 4] * 5, dtype="Int64"),
        "name": pd.array(["a", None, "c", "d"] * 5, dtype="string"),
    }).to_parquet(tmp / "shop.parquet")
    convert_quiet(tmp / "shop.parquet", tmp / "shop")
    return tmp / "shop"


def _edited(shop, tmp_path, column, field, value):
    import shutil

    ds = tmp_path / "edited"
    shutil.copytree(shop, ds)
    manifest = json.loads((ds / "loaderx.json").read_text())
    manifest["columns"][column][field] = value
    (ds / "loaderx.json").write_text(json.dumps(manifest))
    return ds


@pytest.mark.parametrize("column, field, value, why", [
    ("count", "valid", "nope", "its mask column 'nope' is not in the dataset"),
    ("count", "valid", 3, "3 does not name another column"),
    ("count", "valid", ["count.valid"], r"\['count.valid'\] does not name another column"),
    ("count", "valid", "count", "'count' does not name another column"),
    ("count", "valid", "color", r"its mask column 'color' holds dense int8 \[\] records, not "
                                "one bool per record"),
    ("name", "valid", "count.valid", "its mask column 'count.valid' says it is the mask of "
                                     "'count'"),
    ("count.valid", "valid_of", "name", None),
    ("color", "categories", 5, "5 is not a list of strings or of integers"),
    ("color", "categories", "red", "red is not a list"),
    ("color", "categories", {"red": 1}, "is not a list"),
    ("color", "categories", [["red"]], "is not a list"),
    ("color", "categories", ["red", 1], "is not a list"),
    ("color", "categories", [True, False], "is not a list"),
    ("color", "categories", [None, "red"], "is not a list"),
    ("name", "categories", ["a"], "a categorical holds integer codes, one per record; this "
                                  "column holds bytes"),
    ("name", "text", "yes", "'yes' is neither true nor false"),
    ("count", "text", True, "a string column holds bytes records, this one dense"),
    ("color", "labels", 7, "7 is not a list of strings"),
    ("count", "class_names", [1, 2], r"\[1, 2\] is not a list of strings"),
])
def test_typed_manifest_fields_are_checked_at_open(shop, tmp_path, column, field, value, why):
    """A typed field that names nothing, or of the wrong type, is refused at
    open, naming the dataset, the column and the field; it never reaches a
    predicate (a "valid" naming a missing column once made ``IS NULL`` find
    no null) or a raw TypeError/IndexError."""
    ds = _edited(shop, tmp_path, column, field, value)
    named = column if why is not None else "count"
    what = field if why is not None else "valid"
    pattern = rf"{re.escape(str(ds))}: loaderx.json column '{named}' has a malformed '{what}': "
    pattern += f".*{why}" if why else ""
    with pytest.raises(loaderx.CorruptStoreError, match=pattern):
        loaderx.open_dataset(ds)


def test_codes_beyond_the_categories_are_an_error_not_a_wrong_answer(shop, tmp_path):
    ds = loaderx.open_dataset(_edited(shop, tmp_path, "color", "categories", ["red"]))
    for engine in (None, "duckdb"):
        with pytest.raises(ValueError, match="column 'color' holds the code 1, but its manifest "
                                             "names 1 categories"):
            loaderx.select(ds, "color = 'red'", engine=engine)
    with pytest.raises(ValueError, match="the code 1 names none of its 1 categories"):
        ds["color"].names_of(ds["color"][:])
    assert loaderx.open_dataset(shop)["color"].names_of(np.array([1, -1])).tolist() == ["red",
                                                                                       None]


def test_a_mask_split_otherwise_than_its_column_reads_right(tmp_path):
    """An append that brings a two-part column's first nulls masks the old
    rows in one part: the mask's parts split the records otherwise than the
    values' (this used to raise a raw IndexError in a predicate)."""
    pd.DataFrame({"x": pd.array(range(1000), dtype="Int64")}).to_parquet(
        tmp_path / "a.parquet", row_group_size=100)
    convert_quiet(tmp_path / "a.parquet", tmp_path / "ds", workers=2)
    pd.DataFrame({"x": pd.array([None if v % 10 == 0 else v for v in range(1000, 1100)],
                                dtype="Int64")}).to_parquet(tmp_path / "b.parquet")
    ds = convert_quiet(tmp_path / "b.parquet", tmp_path / "ds", mode="append")
    columns = json.loads((tmp_path / "ds" / "loaderx.json").read_text())["columns"]
    assert [s["rows"] for s in columns["x"]["shards"]] == [500, 500, 100]
    assert [s["rows"] for s in columns["x.valid"]["shards"]] == [1000, 100]
    for engine in (None, "duckdb"):
        assert loaderx.select(ds, "x IS NULL", engine=engine)["x"].rows.tolist() == list(
            range(1000, 1100, 10))
        late = loaderx.select(ds, "x >= 990 OR x IS NULL")
        assert loaderx.select(late, "x IS NOT NULL AND x < 1010", engine=engine)[
            "x"][:].tolist() == list(range(990, 1000)) + list(range(1001, 1010))


# ----------------------------------------------------------------- time zones

def _paris(n=6) -> "pd.Series":
    # Across the spring change of clocks: the offset moves from +01:00 to +02:00.
    return pd.Series(pd.date_range("2024-03-31 00:30", periods=n, freq="h", tz="Europe/Paris"))


def test_a_zone_aware_timestamp_column_keeps_its_zone(tmp_path):
    """Stored as the UTC instants Arrow holds, the zone in the manifest, the
    column saying it; read back into the zone, the source's times exactly."""
    times = _paris()
    pd.DataFrame({"at": times, "naive": times.dt.tz_localize(None)}).to_parquet(
        tmp_path / "t.parquet")
    ds = convert_quiet(tmp_path / "t.parquet", tmp_path / "ds")
    entry = json.loads((tmp_path / "ds" / "loaderx.json").read_text())["columns"]["at"]
    assert entry["timezone"] == "Europe/Paris" and entry["dtype"] == "datetime64[us]"
    col = ds["at"]
    assert col.timezone == "Europe/Paris" and "timezone='Europe/Paris'" in repr(col)
    want_utc = times.dt.tz_convert("UTC").dt.tz_localize(None).to_numpy()
    assert_same(col[:], want_utc.astype("datetime64[us]"))
    back = pd.to_datetime(col[:], utc=True).tz_convert(col.timezone)
    assert list(back) == list(times)
    # A naive column has no zone: a plain store, as before.
    assert getattr(ds["naive"], "timezone", None) is None
    assert_same(ds["naive"][:], times.dt.tz_localize(None).to_numpy().astype("datetime64[us]"))
    # Through the loader and a pickle (a torch worker) the column is the same.
    with loaderx.DataLoader({"at": col}, batch_size=3, mode="sequential") as loader:
        assert_same(next(loader)["at"], want_utc[:3].astype("datetime64[us]"))
    assert pickle.loads(pickle.dumps(col)).timezone == "Europe/Paris"
    # A predicate compares the instants: a literal without an offset is UTC.
    assert len(loaderx.select(ds, "at >= '2024-03-31 01:00'")["at"]) == 4  # 01:30Z on
    for c in ds.values():
        c.close()


def test_info_shows_a_timestamp_column_with_its_zone(tmp_path, cli):
    pd.DataFrame({"at": _paris()}).to_parquet(tmp_path / "t.parquet")
    convert_quiet(tmp_path / "t.parquet", tmp_path / "ds")
    text = cli("info", tmp_path / "ds")
    assert text.returncode == 0, text.stderr
    assert "  at datetime64[us, Europe/Paris]\n" in text.stdout
    assert "timezone:  Europe/Paris" in text.stdout
    report = json.loads(cli("info", tmp_path / "ds", "--json").stdout)
    scalar = report["scalar_columns"]["at"]
    assert scalar["dtype"] == "datetime64[us, Europe/Paris]" and scalar["timezone"] == "Europe/Paris"
    assert report["columns"]["at"]["timezone"] == "Europe/Paris"


def test_lists_of_zone_aware_timestamps_keep_the_zone(tmp_path):
    stamps = pa.array([[0, 3_600_000_000], [7_200_000_000]], pa.list_(pa.timestamp("us", tz="UTC")))
    pq.write_table(pa.table({"visits": stamps}), tmp_path / "t.parquet")
    ds = convert_quiet(tmp_path / "t.parquet", tmp_path / "ds")
    assert ds["visits"].timezone == "UTC"
    assert_same(ds["visits"][1], np.array(["1970-01-01T02:00"], "datetime64[us]"))
    ds["visits"].close()


def test_an_append_in_another_zone_is_refused_and_the_same_zone_appends(tmp_path):
    pd.DataFrame({"at": _paris(2)}).to_parquet(tmp_path / "a.parquet")
    convert_quiet(tmp_path / "a.parquet", tmp_path / "ds")
    pd.DataFrame({"at": _paris(2).dt.tz_convert("UTC")}).to_parquet(tmp_path / "utc.parquet")
    with pytest.raises(ConvertError, match=r"'at': the dataset's timestamps are in "
                                           r"Europe/Paris, the new data's in UTC"):
        convert_quiet(tmp_path / "utc.parquet", tmp_path / "ds", mode="append")
    pd.DataFrame({"at": _paris(2).dt.tz_localize(None)}).to_parquet(tmp_path / "naive.parquet")
    with pytest.raises(ConvertError, match="the new data's without a zone"):
        convert_quiet(tmp_path / "naive.parquet", tmp_path / "ds", mode="append")
    ds = convert_quiet(tmp_path / "a.parquet", tmp_path / "ds", mode="append")
    assert len(ds["at"]) == 4 and ds["at"].timezone == "Europe/Paris"
    ds["at"].close()


def test_a_malformed_timezone_in_a_manifest_is_refused(tmp_path):
    pd.DataFrame({"at": _paris(2), "n": [1, 2]}).to_parquet(tmp_path / "t.parquet")
    convert_quiet(tmp_path / "t.parquet", tmp_path / "ds")
    path = tmp_path / "ds" / "loaderx.json"
    for column, zone in (("at", 7), ("at", ""), ("n", "UTC")):
        manifest = json.loads(path.read_text())
        good = json.loads(path.read_text())
        manifest["columns"][column]["timezone"] = zone
        path.write_text(json.dumps(manifest))
        with pytest.raises(loaderx.CorruptStoreError, match=f"column '{column}' has a "
                                                            "malformed 'timezone'"):
            loaderx.open_dataset(tmp_path / "ds")
        path.write_text(json.dumps(good))
