"""Tests of `loaderx.select` and its views.

A pandas-written Parquet table (ints, floats with NaN, nullable bools and
ints, categoricals, strings with nulls, timestamps with NaT, a tensor and a
ragged column) is converted with two workers (every column a ShardSet), and
every predicate form is checked, on both engines, against a pandas
reference that follows SQL's three-valued logic (pandas' nullable dtypes
do). Then masks and index arrays, the errors, views as streams (reads,
native parts, DataLoader sampling, sharding and resume, Mixture, pickling,
fingerprints, the torch and JAX adapters, TokenWindows over selected
documents) and the CLI.
"""
from __future__ import annotations

import functools
import json
import os
import pickle
import re
import shutil

import numpy as np
import pytest
from _helpers import assert_same, loader_threads

import loaderx
import loaderx.subset as lselect
from loaderx.subset import View

pd = pytest.importorskip("pandas", reason="pandas comes with the test extra (datasets)")
pa = pytest.importorskip("pyarrow", reason="pyarrow is part of the test extra")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is part of the test extra")

try:
    import duckdb  # noqa: F401

    ENGINES = [None, "duckdb"]
except ImportError:  # the DuckDB cases are skipped, naming the package
    ENGINES = [None, pytest.param("duckdb", marks=pytest.mark.skip("needs duckdb: pip install "
                                                                   "duckdb"))]

N = 3000


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(7)
    score = rng.integers(0, 64, N).astype(np.float32) / 64  # exact in binary
    score[rng.random(N) < 0.05] = np.nan
    flag = pd.array(rng.random(N) < 0.5, dtype="boolean")
    flag[rng.random(N) < 0.1] = pd.NA
    qty = pd.array(rng.integers(0, 12, N), dtype="Int64")
    qty[rng.random(N) < 0.1] = pd.NA
    lang = pd.Categorical(rng.choice(["en", "de", "fr"], N), categories=["en", "de", "fr"])
    lang[rng.random(N) < 0.05] = np.nan
    name = pd.array([f"item {i}" for i in range(N)], dtype="string")
    name[rng.random(N) < 0.05] = pd.NA
    ts = pd.Series(pd.to_datetime("2020-01-01") + pd.to_timedelta(rng.integers(0, 900, N), "D"))
    ts[rng.random(N) < 0.05] = pd.NaT
    return pd.DataFrame({
        "id": rng.permutation(N).astype(np.int64),
        "label": rng.integers(0, 10, N).astype(np.int32),
        "score": score,
        "flag": flag,
        "qty": qty,
        "lang": lang,
        "name": name,
        "ts": ts,
    })


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("select")
    df = _frame()
    table = pa.Table.from_pandas(df, preserve_index=False)
    vec = np.arange(N * 4, dtype=np.float32).reshape(N, 4)
    table = table.append_column("vec", pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), 4))
    docs = [np.arange(i % 7, dtype=np.int32) + i for i in range(N)]
    table = table.append_column("tokens", pa.array([d.tolist() for d in docs], pa.list_(pa.int32())))
    pq.write_table(table, tmp / "t.parquet", row_group_size=500)
    loaderx.convert(tmp / "t.parquet", tmp / "ds", workers=2, progress="off")
    ds = loaderx.open_dataset(tmp / "ds")
    yield tmp, df, ds, vec, docs
    for col in ds.values():
        col.close()


def _na(values, *sources) -> pd.Series:
    """`values` as a nullable bool Series, NA where any source is null."""
    out = pd.Series(pd.array(np.asarray(values, dtype=bool), dtype="boolean"))
    for s in sources:
        out[pd.Series(s).isna().to_numpy()] = pd.NA
    return out


def _rows(mask: pd.Series) -> np.ndarray:
    return np.flatnonzero(mask.fillna(False).to_numpy(dtype=bool))


# Each predicate with its pandas reference (SQL's logic: NA is unknown).
CASES = {
    "label = 3": lambda d: _na(d.label == 3),
    "label = 3 AND score > 0.5": lambda d: _na(d.label == 3) & _na(d.score > 0.5, d.score),
    "label IN (1, 2, 9)": lambda d: _na(d.label.isin([1, 2, 9])),
    "label NOT IN (1, 2)": lambda d: ~_na(d.label.isin([1, 2])),
    "score BETWEEN 0.25 AND 0.75": lambda d: _na((d.score >= .25) & (d.score <= .75), d.score),
    "score NOT BETWEEN 0.25 AND 0.75": lambda d: ~_na((d.score >= .25) & (d.score <= .75),
                                                       d.score),
    "NOT score > 0.5": lambda d: ~_na(d.score > .5, d.score),
    "score != 0.5": lambda d: _na(d.score != .5, d.score),
    "score IS NULL": lambda d: _na(d.score.isna()),
    "score IS NOT NULL": lambda d: _na(d.score.notna()),
    "lang = 'en'": lambda d: _na(d.lang == "en", d.lang),
    "lang IN ('en', 'fr')": lambda d: _na(d.lang.isin(["en", "fr"]), d.lang),
    "lang IS NULL": lambda d: _na(d.lang.isna()),
    "NOT lang = 'de'": lambda d: ~_na(d.lang == "de", d.lang),
    "lang LIKE 'e%'": lambda d: _na(d.lang.astype(object).fillna("").str.startswith("e"),
                                    d.lang),
    "lang > 'df'": lambda d: _na(d.lang.astype(object).fillna("") > "df", d.lang),
    "name LIKE 'item 1%'": lambda d: _na(d.name.fillna("").str.startswith("item 1"), d.name),
    "name ILIKE 'ITEM 2_'": lambda d: _na(d.name.fillna("").str.fullmatch(r"item 2."), d.name),
    "name NOT LIKE '%5'": lambda d: ~_na(d.name.fillna("").str.endswith("5"), d.name),
    "name IS NULL": lambda d: _na(d.name.isna()),
    "name = 'item 42' OR name = 'item 7'": lambda d: _na(d.name.isin(["item 42", "item 7"]),
                                                          d.name),
    "flag": lambda d: _na(d.flag.fillna(False), d.flag),
    "NOT flag": lambda d: ~_na(d.flag.fillna(False), d.flag),
    "flag = FALSE OR qty > 5": lambda d: _na(~d.flag.fillna(True), d.flag)
    | _na(d.qty.fillna(0) > 5, d.qty),
    "flag IS NULL AND qty IS NOT NULL": lambda d: _na(d.flag.isna() & d.qty.notna()),
    "ts >= '2021-01-01'": lambda d: _na(d.ts >= "2021-01-01", d.ts),
    "ts < TIMESTAMP '2020-06-01 12:00:00'": lambda d: _na(d.ts < "2020-06-01 12:00:00", d.ts),
    "qty % 3 = 0": lambda d: _na(d.qty.fillna(1) % 3 == 0, d.qty),
    "qty * 2 + 1 > 11": lambda d: _na(d.qty.fillna(0) * 2 + 1 > 11, d.qty),
    "-qty < -5": lambda d: _na(-d.qty.fillna(0) < -5, d.qty),
    "qty / 4 > 1.5": lambda d: _na(d.qty.fillna(0) / 4 > 1.5, d.qty),
    "(label = 1 OR label = 2) AND NOT (score < 0.125)": lambda d: _na(d.label.isin([1, 2]))
    & ~_na(d.score < .125, d.score),
    "label <> 3 AND lang != 'en'": lambda d: _na(d.label != 3) & _na(d.lang != "en", d.lang),
    "id % 10 = 7": lambda d: _na(d.id % 10 == 7),
    '"label" = 4 and "score" >= 0.5': lambda d: _na(d.label == 4) & _na(d.score >= .5, d.score),
    "label = 3 AND NULL": lambda d: _na(d.label != 3) & False,
    "label = 3 OR NULL": lambda d: _na(d.label == 3),
}


@pytest.mark.parametrize("engine", ENGINES)
def test_every_predicate_form_matches_a_pandas_reference(data, engine):
    _, df, ds, _, _ = data
    for where, reference in CASES.items():
        sub = loaderx.select(ds, where, engine=engine)
        want = _rows(reference(df))
        assert_same(sub["label"].rows, want.astype(np.int64)), where
        assert len(sub["label"]) == len(want), where


def test_views_read_the_selected_records_of_every_column(data):
    _, df, ds, vec, docs = data
    sub = loaderx.select(ds, "label = 3 AND score > 0.5")
    rows = sub["label"].rows
    assert list(sub) == list(ds) and all(isinstance(v, View) for v in sub.values())
    assert rows.dtype == np.int64 and not rows.flags.writeable and (np.diff(rows) > 0).all()
    assert_same(sub["id"][:], df.id.to_numpy()[rows])
    assert_same(sub["vec"][:], vec[rows])
    assert_same(sub["vec"][-1], vec[rows[-1]])
    assert_same(sub["vec"][[2, 0]], vec[rows[[2, 0]]])
    mask = np.zeros(len(rows), bool)
    mask[::3] = True
    assert_same(sub["vec"][mask], vec[rows[mask]])
    out = np.zeros((2, 4), np.float32)
    assert sub["vec"].gather([1, 0], out=out) is out and (out == vec[rows[[1, 0]]]).all()
    with pytest.raises(IndexError):
        sub["vec"][len(rows)]
    for got, want in zip(sub["tokens"][:5], [docs[r] for r in rows[:5]]):
        assert_same(got, want)
    values, splits = sub["tokens"].gather([0, 1], packed=True)
    assert_same(values, np.concatenate([docs[rows[0]], docs[rows[1]]]))
    names = df.name.to_numpy(dtype=object)[rows]
    assert sub["name"][:] == [None if pd.isna(n) else n for n in names]  # str, None for a null
    assert sub["lang"].categories == ("en", "de", "fr")
    want_lang = df.lang.astype(object).to_numpy()[rows]
    got = sub["lang"].names_of(sub["lang"][:])
    assert [None if pd.isna(x) else x for x in want_lang] == list(got)
    assert_same(sub["qty.valid"][:], df.qty.notna().to_numpy()[rows])
    assert_same(sub["qty"].valid[:], sub["qty.valid"][:])
    assert "label = 3 AND score > 0.5" in repr(sub["id"]) and sub["id"].where.startswith("label")


def test_a_shardset_of_a_view_is_refused_not_read_as_its_whole_store(data):
    """Before, ShardSet([view]) had the view's length but read the first
    records of the view's store."""
    _, df, ds, _, _ = data
    sub = loaderx.select(ds, "label = 3 AND score > 0.5")
    assert sub["id"].rows[0] != 0  # (else the old mistake read the right first record)
    with pytest.raises(TypeError, match="not a select view .*select over the ShardSet"):
        loaderx.ShardSet([sub["id"]])
    for view in sub.values():
        view.close()


def test_a_view_has_none_of_its_stores_writes(data):
    """Before, ``view.delete(0)`` reached the store through the view's
    attribute passthrough and deleted the store's record 0."""
    _, _, ds, _, _ = data
    sub = loaderx.select(ds, "label = 3")
    before = len(ds["id"])
    for attr in ("append", "append_packed", "delete", "compact", "sync", "read_only"):
        assert not hasattr(sub["id"], attr)
        with pytest.raises(AttributeError, match=f"select view is read-only: it has no {attr}"):
            getattr(sub["id"], attr)
    assert len(ds["id"]) == before and sub["id"].codec == ds["id"].codec


def test_a_list_column_with_nulls_is_asked_whether_each_is_null(tmp_path):
    """Before, a predicate could not find the rows whose list is null: the
    column was refused as "not scalar" and its mask is not a column of the
    predicate. IS [NOT] NULL now asks the mask (the arrow engine), across
    shards and within a prior selection; anything else is still refused."""
    docs = [None if i % 5 == 2 else list(range(i % 4)) for i in range(300)]
    pq.write_table(pa.table({"id": np.arange(300), "tok": pa.array(docs, pa.list_(pa.int32()))}),
                   tmp_path / "t.parquet", row_group_size=64)
    loaderx.convert(tmp_path / "t.parquet", tmp_path / "ds", workers=2, progress="off")
    ds = loaderx.open_dataset(tmp_path / "ds")
    nulls = np.array([i % 5 == 2 for i in range(300)])
    assert_same(loaderx.select(ds, "tok IS NULL")["id"].rows, np.flatnonzero(nulls))
    assert_same(loaderx.select(ds, "NOT tok IS NOT NULL OR id < 2")["id"].rows,
                np.flatnonzero(nulls | (np.arange(300) < 2)))
    prior = loaderx.select(ds, "id >= 100")
    assert_same(loaderx.select(prior, "tok IS NOT NULL")["id"].rows,
                np.flatnonzero(~nulls & (np.arange(300) >= 100)))
    for where in ("tok", "tok = 1", "tok IS TRUE", "tok IN (1)"):
        with pytest.raises(ValueError, match=r"column 'tok' holds ragged int32 records; .*only "
                                             r"whether one is null can be asked \(tok IS NULL\)"):
            loaderx.select(ds, where)
    if "duckdb" in ENGINES:
        with pytest.raises(ValueError, match="DuckDB is given scalar columns only"):
            loaderx.select(ds, "tok IS NULL", engine="duckdb")
    for col in ds.values():
        col.close()


def test_masks_and_index_arrays(data):
    _, df, ds, _, _ = data
    mask = (df.label.to_numpy() % 2 == 0)
    sub = loaderx.select(ds, mask)
    assert_same(sub["label"].rows, np.flatnonzero(mask))
    assert sub["label"].where is None
    sub = loaderx.select(ds, [5, 3, 5, -1])  # any order, repeats once, negatives wrap
    assert_same(sub["id"].rows, np.array([3, 5, N - 1], np.int64))
    assert_same(sub["id"][:], df.id.to_numpy()[[3, 5, N - 1]])
    assert len(loaderx.select(ds, np.zeros(0, np.int64))["id"]) == 0
    with pytest.raises(ValueError, match=r"the mask has shape \(3,\); the dataset has 3000"):
        loaderx.select(ds, np.ones(3, bool))
    with pytest.raises(IndexError, match="out of range"):
        loaderx.select(ds, [N])
    with pytest.raises(TypeError, match="bool mask or a 1-D array of record indices"):
        loaderx.select(ds, np.zeros(3, np.float32))


def test_select_on_a_view_narrows_it(data):
    _, df, ds, _, _ = data
    first = loaderx.select(ds, "label IN (1, 2, 3)")
    second = loaderx.select(first, "score > 0.5")
    want = _rows(_na(df.label.isin([1, 2, 3])) & _na(df.score > .5, df.score))
    assert_same(second["id"].rows, want)
    assert second["id"].where == "(label IN (1, 2, 3)) AND (score > 0.5)"
    assert second["id"].base is ds["id"]  # views of the dataset, not views of views
    third = loaderx.select(second, np.arange(len(want)) < 4)
    assert_same(third["id"].rows, want[:4])
    assert third["id"].where is None
    with pytest.raises(TypeError, match="different selects"):
        loaderx.select({"a": first["id"], "b": second["id"]}, "a > 0")


def test_bad_predicates_name_the_problem(data, monkeypatch):
    _, _, ds, _, _ = data
    cases = {
        "lable = 3": r"unknown column 'lable' in the predicate \(did you mean 'label'\?\)",
        "label = 'x'": r"type mismatch in \"label = 'x'\": column 'label' holds int32, 'x' is a "
                       "string",
        "label = 3 AND": r"syntax error in the predicate at position 13: expected a column",
        "label = = 3": r"syntax error in the predicate at position 8",
        "label = 3 score": r"expected AND, OR or the end of the predicate, found 'score'",
        "name LIKE 3": r"LIKE compares strings, but '3' is int",
        "label AND score > 0": r"AND needs conditions, but 'label' is a int value",
        "vec > 1": r"column 'vec' holds dense float32\[4\] records; predicates apply to scalar",
        "score + 1": r"is a float value, not a condition",
        "ts > 'soon'": r"'soon' is not a timestamp",
        "": r"the predicate is empty",
        "label = 3 #": r"unexpected character '#'",
    }
    for where, message in cases.items():
        with pytest.raises(ValueError, match=message):
            loaderx.select(ds, where)
    with pytest.raises(ValueError, match="engine must be"):
        loaderx.select(ds, "label = 3", engine="sqlite")
    with pytest.raises(TypeError, match="holds splits"):
        loaderx.select({"train": ds, "test": ds}, "label = 3")
    monkeypatch.setattr(lselect, "_have_duckdb", lambda: False)
    with pytest.raises(ValueError, match="SELECT .* needs DuckDB: pip install duckdb"):
        loaderx.select(ds, "id IN (SELECT 1)")
    with pytest.raises(ValueError, match=r"the function call lower\(...\) .* needs DuckDB"):
        loaderx.select(ds, "lower(name) = 'x'")
    with pytest.raises(ValueError, match="the arrow engine does not evaluate"):
        loaderx.select(ds, "id IN (SELECT 1)", engine="arrow")


def test_duckdb_subqueries_and_errors(data):
    pytest.importorskip("duckdb", reason="the DuckDB engine needs duckdb: pip install duckdb")
    tmp, df, ds, _, _ = data
    keep = np.array([17, 3, 2999, 42], np.int64)
    pq.write_table(pa.table({"id": keep}), tmp / "keep.parquet")
    where = f"id IN (SELECT id FROM read_parquet('{tmp / 'keep.parquet'}'))"
    sub = loaderx.select(ds, where)  # DuckDB by default: the arrow engine has no subqueries
    assert_same(sub["id"].rows, np.sort(np.flatnonzero(np.isin(df.id.to_numpy(), keep))))
    assert sub["id"].selection.engine == "duckdb"
    both = loaderx.select(ds, f"label = 3 AND {where}")
    assert_same(both["id"].rows, np.flatnonzero(np.isin(df.id, keep) & (df.label == 3)))
    for where, message in {
        "lable = 3": r"DuckDB could not evaluate the predicate 'lable = 3': .*lable.*; the "
                     r"columns are \['id'",
        "label = 'x'": r"Could not convert string 'x'.* \(a type mismatch",
        "label = = 3": "Parser Error",
        "id IN (SELECT id FROM read_parquet('/nonexistent.parquet'))": "nonexistent",
        # (before: AttributeError "'list' object has no attribute 'flags'")
        "len(tokens) > 3": r"column 'tokens' holds ragged int32 records; predicates apply to "
                           "scalar columns",
        "vec IS NULL": r"column 'vec' holds dense float32\[4\] records; predicates apply",
    }.items():
        with pytest.raises(ValueError, match=message):
            loaderx.select(ds, where, engine="duckdb")


def test_native_parts_map_each_shard_to_its_selected_records(data, monkeypatch):
    monkeypatch.setattr(lselect, "COMPACT_BYTES_MAX", 0)  # the mapped path, not a compact copy
    _, df, ds, _, _ = data
    assert len(ds["id"].shards) == 2  # a ShardSet: two workers
    sub = loaderx.select(ds, "label = 3")
    rows = sub["id"].rows
    parts = sub["id"].native_parts()
    assert len(parts) == 2 and parts[0].first == 0
    offset = ds["id"].lengths[0]
    assert parts[1].first == int(np.searchsorted(rows, offset))
    got = []
    for part, shard in zip(parts, ds["id"].shards):
        assert part.rows.dtype == np.uint64 and part.rows.flags.c_contiguous
        assert part.handle == shard.native_parts()[0].handle
        got.append(shard.gather(part.rows.astype(np.int64)))
    assert_same(np.concatenate(got), df.id.to_numpy()[rows])
    # Text is decoded by Python: no native parts (a native read gives bytes).
    assert not hasattr(sub["name"], "native_parts") and hasattr(sub["lang"], "native_parts")


def test_loader_reads_a_small_subset_of_small_records_from_a_compact_copy(data, monkeypatch):
    _, df, ds, vec, _ = data
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    sub = loaderx.select(ds, "label = 3")
    rows = sub["vec"].rows
    copy = sub["vec"]._compact_copy()
    # One raw store of exactly the selected records, its files already gone.
    assert copy is not None and copy.codec == "raw" and len(copy) == len(rows)
    assert sub["vec"].native_parts() == copy.native_parts()
    assert_same(copy.gather(np.arange(len(rows))), vec[rows])
    if before or os.path.isdir("/dev/shm"):
        assert set(os.listdir("/dev/shm")) == before
    assert sub["vec"]._compact_copy() is copy  # made once per view
    # The loader's batches are the same records with and without the copy.
    with loaderx.DataLoader({"id": sub["id"], "vec": sub["vec"]}, 16, seed=9) as loader:
        compact = [next(loader) for _ in range(6)]
    monkeypatch.setattr(lselect, "COMPACT_BYTES_MAX", 0)
    mapped = loaderx.select(ds, "label = 3")
    assert mapped["vec"]._compact_copy() is None
    with loaderx.DataLoader({"id": mapped["id"], "vec": mapped["vec"]}, 16, seed=9) as loader:
        for want in compact:
            got = next(loader)
            assert_same(got["id"], want["id"])
            assert_same(got["vec"], want["vec"])
    # Closing the view lets go of its copy: a loader reading it keeps
    # reading (as when a view does not own its column); a later loader
    # makes a new one.
    with loaderx.DataLoader({"vec": sub["vec"]}, 16, seed=9) as running:
        first = next(running)
        sub["vec"].close()
        later = [next(running) for _ in range(len(rows) // 16 + 3)]
    assert_same(first["vec"], compact[0]["vec"])
    assert all(len(b["vec"]) == 16 for b in later)
    assert sub["vec"]._compact is None
    with loaderx.DataLoader({"vec": sub["vec"]}, 16, seed=9) as loader:
        assert_same(next(loader)["vec"], compact[0]["vec"])
    assert sub["vec"]._compact_copy() is not copy


def _fails_with(exc, real=None):
    """A gather that raises `exc` (after one call of `real`, if given: the
    first record of a compact copy is read before its files exist)."""
    calls = []

    def gather(*args, **kwargs):
        calls.append(1)
        if real is not None and len(calls) == 1:
            return real(*args, **kwargs)
        raise exc
    return gather


def test_no_compact_copy_where_it_would_not_pay(data, monkeypatch):
    _, _, ds, _, _ = data
    half = loaderx.select(ds, "label < 6")  # 60% of the records: little to gain
    assert half["vec"]._compact_copy() is None
    sub = loaderx.select(ds, "label = 3")
    assert sub["lang"]._compact_copy() is None  # a categorical column: its codes' own reads
    # No room to spare in shared memory or the temporary directory: none.
    real = lselect.shutil.disk_usage
    monkeypatch.setattr(lselect.shutil, "disk_usage",
                        lambda p: real(p)._replace(free=(64 << 20) + 1000))
    assert loaderx.select(ds, "label = 3")["vec"]._compact_copy() is None
    monkeypatch.setattr(lselect.shutil, "disk_usage", real)
    # A copy cut short (no space mid-way, or Ctrl-C) leaves no files behind.
    made = []
    real_mkdtemp = lselect.tempfile.mkdtemp
    monkeypatch.setattr(lselect.tempfile, "mkdtemp",
                        lambda **kw: made.append(real_mkdtemp(**kw)) or made[-1])
    view = loaderx.select(ds, "label = 3")["vec"]
    gather = type(view.base).gather
    monkeypatch.setattr(type(view.base), "gather",
                        _fails_with(OSError(28, "No space left"), gather))
    assert view._compact_copy() is None and made and not os.path.exists(made[-1])
    view = loaderx.select(ds, "label = 3")["vec"]
    monkeypatch.setattr(type(view.base), "gather", _fails_with(KeyboardInterrupt(), gather))
    with pytest.raises(KeyboardInterrupt):
        view._compact_copy()
    assert not os.path.exists(made[-1])
    monkeypatch.undo()
    monkeypatch.setattr(lselect, "COMPACT_RECORD_MAX", 8)  # vec records are 16 B
    assert loaderx.select(ds, "label = 3")["vec"]._compact_copy() is None
    assert loaderx.select(ds, "label = 3")["id"]._compact_copy() is not None  # 8 B


def _drain(loader, steps):
    try:
        return [next(loader) for _ in range(steps)]
    finally:
        loader.close()


def test_loader_samples_only_the_selected_records(data):
    _, df, ds, vec, _ = data
    sub = loaderx.select(ds, "label = 3")
    rows = sub["id"].rows
    streams = {"id": sub["id"], "vec": sub["vec"], "name": sub["name"], "lang": sub["lang"]}
    bs = 16
    per_cycle = len(rows) // bs
    batches = _drain(loaderx.DataLoader(streams, bs, seed=3, workers=2), per_cycle)
    ids = df.id.to_numpy()
    pos = {int(i): k for k, i in enumerate(ids)}
    seen = [pos[int(i)] for b in batches for i in b["id"]]
    assert len(set(seen)) == len(seen) == per_cycle * bs  # a cycle: each record once
    assert set(seen) <= set(rows.tolist())
    for b in batches[:3]:
        at = [pos[int(i)] for i in b["id"]]
        assert_same(b["vec"], vec[at])
        assert b["name"] == [None if pd.isna(x) else x for x in df.name.to_numpy(object)[at]]
        assert b["lang"].dtype == np.int8
    # Sharded: two ranks together see the one-process global batch.
    whole = _drain(loaderx.DataLoader({"id": sub["id"]}, 2 * bs, seed=3), 3)
    ranks = [_drain(loaderx.DataLoader({"id": sub["id"]}, bs, seed=3, shard=(r, 2)), 3)
             for r in range(2)]
    for step in range(3):
        assert sorted(np.concatenate([ranks[0][step]["id"], ranks[1][step]["id"]])) \
            == sorted(whole[step]["id"])
    # Resume: the continuation is the uninterrupted run's.
    loader = loaderx.DataLoader({"id": sub["id"]}, bs, seed=5)
    _drain_some = [next(loader) for _ in range(4)]
    state = loader.state_dict()
    rest = [next(loader)["id"] for _ in range(3)]
    loader.close()
    again = loaderx.DataLoader({"id": sub["id"]}, bs, seed=5)
    again.load_state_dict(state)
    assert all((a == b).all() for a, b in zip(rest, [x["id"] for x in _drain(again, 3)]))
    assert len(_drain_some) == 4


def test_views_are_read_by_the_native_ring(data):
    _, df, ds, vec, _ = data
    sub = loaderx.select(ds, "label = 3")
    rows = sub["id"].rows
    streams = {"id": sub["id"], "vec": sub["vec"], "lang": sub["lang"]}
    assert all(loaderx.streams.native_parts(v) is not None for v in streams.values())
    ids = df.id.to_numpy()
    loader = loaderx.DataLoader(streams, 16, seed=4, workers=2)
    with loader:
        for _ in range(5):
            batch = next(loader)
            # No Python worker thread: the ring gathered every view itself
            # (the prefetch thread only calls the views' prefetch hooks).
            assert [t.name for t in loader_threads() if "worker" in t.name] == []
            at = np.flatnonzero(np.isin(ids, batch["id"]))
            assert set(at.tolist()) <= set(rows.tolist())
            order = np.argsort(ids[at])
            assert_same(np.sort(batch["id"]), ids[at][order])
            assert_same(batch["vec"][np.argsort(batch["id"])], vec[at][order])


def test_a_mixture_of_views_refuses_a_resume_with_another_subset(tmp_path):
    loaderx.convert({"x": np.arange(200, dtype=np.int64)}, tmp_path / "d", progress="off")
    ds = loaderx.open_dataset(tmp_path / "d")
    even, odd, low = (loaderx.select(ds, where)["x"] for where in
                      ("x % 2 = 0", "x % 2 = 1", "x < 100"))

    def mixture(a, b):
        return loaderx.Mixture({"a": {"x": a}, "b": {"x": b}}, weights={"a": 1, "b": 1})

    with loaderx.DataLoader(mixture(even, odd), 8, seed=0) as loader:
        next(loader)
        state = loader.state_dict()
        expected = next(loader)["x"]
    assert state["fingerprints"] == {"a": {"x": even.fingerprint}, "b": {"x": odd.fingerprint}}
    with loaderx.DataLoader(mixture(even, odd), 8, seed=0) as again:
        again.load_state_dict(json.loads(json.dumps(state)))
        assert_same(next(again)["x"], expected)
    with loaderx.DataLoader(mixture(even, low), 8, seed=0) as other:
        with pytest.raises(ValueError, match=r"state fingerprints\['b'\]\['x'\] is 'subset of "
                                             r".*' but this loader has 'subset of .*"):
            other.load_state_dict(state)
    ds["x"].close()


def test_empty_subset_is_refused_when_the_loader_is_built(data):
    _, _, ds, _, _ = data
    sub = loaderx.select(ds, "label = 99")
    assert len(sub["id"]) == 0 and sub["id"][:].shape == (0,)
    with pytest.raises(ValueError, match=r"stream 'id' is empty .*the subset selects 0 of "
                                         r"3,000 records of .* where label = 99"):
        loaderx.DataLoader({"id": sub["id"]}, 4)
    with pytest.raises(ValueError, match=r"source 'none' is empty .*where label = 99"):
        loaderx.Mixture({"none": {"id": sub["id"]}, "all": {"id": ds["id"]}},
                        weights={"none": 1, "all": 1})


def test_mixture_of_subsets(data):
    _, df, ds, _, _ = data
    en = loaderx.select(ds, "lang = 'en'")
    de = loaderx.select(ds, "lang = 'de'")
    mix = loaderx.Mixture({"en": {"id": en["id"], "lang": en["lang"]},
                           "de": {"id": de["id"], "lang": de["lang"]}},
                          weights={"en": 3, "de": 1})
    batches = _drain(loaderx.DataLoader(mix, 64, seed=1), 4)
    lang = {int(i): x for i, x in zip(df.id, df.lang.astype(object))}
    for b in batches:
        for i, code, source in zip(b["id"], b["lang"], b["source"]):
            assert lang[int(i)] == ("en", "de")[source] == ("en", "de", "fr")[code]
    share = np.mean(np.concatenate([b["source"] for b in batches]) == 0)
    assert 0.7 <= share <= 0.8


def test_pickling_keeps_the_subset_and_refuses_a_changed_dataset(data, tmp_path, monkeypatch):
    _, df, _, _, _ = data
    arrays = {"x": np.arange(100, dtype=np.int64) * 3, "y": np.arange(100.0)}
    loaderx.convert(arrays, tmp_path / "d", progress="off")
    sub = loaderx.select(tmp_path / "d", "x % 2 = 0")  # a path: select opens it
    back = pickle.loads(pickle.dumps(sub))
    assert back["y"].fingerprint == sub["y"].fingerprint
    assert_same(back["y"][:], arrays["y"][::2])
    assert sub["y"].selection.source == str(tmp_path / "d")
    # Big selections pickle as the predicate, evaluated again on loading.
    monkeypatch.setattr(lselect, "PICKLE_ROWS_MAX", 10)
    blob = pickle.dumps(sub)
    assert len(blob) < 2000 and b"x % 2 = 0" in blob
    assert_same(pickle.loads(blob)["x"][:], arrays["x"][::2])
    masked = loaderx.select(tmp_path / "d", np.arange(100) < 50)  # no predicate: the rows
    assert_same(pickle.loads(pickle.dumps(masked))["x"].rows, np.arange(50))
    loaderx.convert({"x": np.arange(10, dtype=np.int64), "y": np.zeros(10)}, tmp_path / "d",
                    mode="append", progress="off")
    with pytest.raises(ValueError, match=r"no longer selects the records it did.*it was subset "
                                         r"of .*50 of 100 records.*it is now subset of .*55 of "
                                         r"110"):
        pickle.loads(blob)
    for v in list(sub.values()) + list(masked.values()):
        v.close()


def test_fingerprints_name_the_records_and_the_dataset(data, tmp_path):
    _, _, ds, _, _ = data
    a = loaderx.select(ds, "label = 3")["id"]
    b = loaderx.select(ds, "label = 4")["id"]
    same = loaderx.select(ds, "label + 0 = 3")["id"]
    assert a.fingerprint == same.fingerprint != b.fingerprint
    assert a.fingerprint.startswith("subset of ") and " of 3,000 records (columns id, " \
        in a.fingerprint
    assert re.search(r"\): data blake2b:\w{24}, rows blake2b:\w{24}$", a.fingerprint)
    # The same data, another subset: the data part is the same, the rows part differs.
    assert a.fingerprint.split(", rows")[0].split("):")[1] == \
        b.fingerprint.split(", rows")[0].split("):")[1]
    assert str(tmp_path) not in a.fingerprint and "/" not in a.fingerprint  # no place in it
    loaderx.convert({"x": np.arange(20)}, tmp_path / "d", progress="off")
    before = loaderx.select(tmp_path / "d", "x < 5")["x"].fingerprint
    loaderx.convert({"x": np.arange(20)}, tmp_path / "d", mode="append", progress="off")
    after = loaderx.select(tmp_path / "d", "x < 5")["x"]
    assert len(after) == 10 and after.fingerprint != before  # same predicate, changed dataset


def test_token_windows_over_selected_documents(data):
    _, df, ds, _, docs = data
    sub = loaderx.select(ds, "label < 3")
    chosen = [docs[r] for r in sub["tokens"].rows]
    for sep in (None, -1):
        tw = loaderx.TokenWindows(sub["tokens"], 8, separator=sep)
        pieces = []
        for k, d in enumerate(chosen):
            pieces.append(d)
            if sep is not None and k + 1 < len(chosen):
                pieces.append(np.array([sep], np.int32))
        stream = np.concatenate(pieces)
        assert len(tw) == (len(stream) - 1) // 8 and tw.total_tokens == len(stream)
        idx = np.array([0, len(tw) - 1, 5, 5])
        assert_same(tw[idx], np.stack([stream[i * 8:i * 8 + 9] for i in idx]))
    batch = _drain(loaderx.DataLoader({"t": tw, "seg": tw.segments}, 4, seed=0), 1)[0]
    assert batch["t"].shape == (4, 9) and batch["seg"].shape == (4, 9)
    assert (batch["seg"][:, 0] == 0).all()
    back = pickle.loads(pickle.dumps(tw))
    assert_same(back[3], tw[3])


def test_torch_and_jax_adapters_take_views(data):
    torch = pytest.importorskip("torch", reason="torch is part of the test extra")
    import loaderx.torch as ltorch

    _, df, ds, vec, _ = data
    sub = loaderx.select(ds, "label = 3")
    make = functools.partial(_make_loader, {"vec": sub["vec"], "id": sub["id"]})
    dataset = ltorch.IterableDataset(make)
    batch = next(iter(torch.utils.data.DataLoader(dataset, batch_size=None)))
    pos = {int(i): k for k, i in enumerate(df.id)}
    assert isinstance(batch["vec"], torch.Tensor)
    assert_same(batch["vec"].numpy(), vec[[pos[int(i)] for i in batch["id"]]])
    # A torch worker process gets the views by pickle (spawn), as references.
    workers = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=1,
                                          multiprocessing_context="spawn")
    got = next(iter(workers))
    assert set(got["id"].tolist()) <= set(df.id.to_numpy()[sub["id"].rows].tolist())
    jax = pytest.importorskip("jax", reason="jax is part of the test extra")
    import loaderx.jax as ljax

    loader = make(0, 1)
    arrays = next(ljax.global_batches(loader, jax.sharding.SingleDeviceSharding(jax.devices()[0])))
    loader.close()
    assert arrays["vec"].shape == (8, 4)


def _make_loader(streams, rank, world):
    return loaderx.DataLoader(streams, 8, seed=0, shard=(rank, world), workers=1)


def test_cli_select_and_info(data, tmp_path, cli):
    tmp, df, _, _, _ = data
    want = _rows(_na(df.label == 3) & _na(df.score > .5, df.score))
    out = cli("select", tmp / "ds", "label = 3 AND score > 0.5", "--count")
    assert out.returncode == 0 and out.stdout.strip() == str(len(want)), out.stderr
    out = cli("select", tmp / "ds", "label = 3 AND score > 0.5", "--out", tmp_path / "i.npy")
    assert out.returncode == 0 and f"selected {len(want):,} of 3,000 records" in out.stdout
    assert_same(np.load(tmp_path / "i.npy"), want)
    out = cli("select", tmp / "ds", "lable = 3")
    assert out.returncode == 1 and "unknown column 'lable'" in out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1
    out = cli("info", tmp / "ds", "--json")
    scalars = json.loads(out.stdout)["scalar_columns"]
    assert scalars["label"] == {"type": "int", "dtype": "int32", "nullable": False}
    assert scalars["lang"]["categories"] == ["en", "de", "fr"] and scalars["lang"]["nullable"]
    assert scalars["name"]["type"] == "string" and "vec" not in scalars and "tokens" not in scalars
    out = cli("info", tmp / "ds")
    assert "scalar columns" in out.stdout and "lang categorical string (3: en, de, fr)" in out.stdout


def test_resume_refuses_another_subset_or_a_changed_dataset(tmp_path):
    loaderx.convert({"x": np.arange(100, dtype=np.int64)}, tmp_path / "d", progress="off")
    ds = loaderx.open_dataset(tmp_path / "d")
    even = loaderx.select(ds, "x % 2 = 0")["x"]
    low = loaderx.select(ds, "x < 50")["x"]  # as many records, other ones
    state = _drain_state(even)
    again = loaderx.DataLoader({"x": loaderx.select(ds, "x % 2 = 0")["x"]}, 10, seed=0)
    again.load_state_dict(state)  # the same subset: resumes
    assert (next(again)["x"] % 2 == 0).all()
    again.close()
    with pytest.raises(ValueError, match=r"state fingerprints\['x'\] is 'subset of 50 of 100 "
                                         r"records .*' but this loader has 'subset of 50 of 100 "
                                         r"records .*': they hold other records"):
        _resume(low, state)
    loaderx.convert({"x": np.arange(101, 121, 2, dtype=np.int64)}, tmp_path / "d", mode="append",
                    progress="off")
    grown = loaderx.select(tmp_path / "d", "x % 2 = 0")["x"]  # 50 records still
    assert len(grown) == 50
    with pytest.raises(ValueError, match=r"50 of 100 records.* but this loader has .*50 of 110"):
        _resume(grown, state)


def _legacy_fingerprint(view) -> str:
    """The fingerprint loaderx 3.0.0 gave `view` of a one-store column, as an
    old checkpoint holds it: its store's path (3.0.0 named a version 2
    dataset by its column's part), its path and length, and the rows."""
    import hashlib

    path = os.path.abspath(view.base.path)
    h = hashlib.blake2b(digest_size=12)
    h.update(f"x={[path]}:{[len(view.base)]}".encode())
    h.update(view.rows.astype("<i8").tobytes())
    return f"subset of {path}: {len(view.rows):,} of {view.selection.total:,} records, " \
        f"blake2b:{h.hexdigest()}"


def test_a_subset_checkpoint_names_data_not_places(tmp_path):
    """A subset's state resumes on a copy of the dataset anywhere (its files
    copied, or the directory moved, or converted again from it), because
    its fingerprint names the records; another dataset of the same shape is
    refused, with both fingerprints and what to do. A loaderx 3.0.0 state
    (the dataset's path in its fingerprint) resumes where the dataset still
    is, and is refused, naming both, once it moved."""
    values = np.arange(100, dtype=np.int64)
    loaderx.convert({"x": values}, tmp_path / "d", progress="off")
    even = loaderx.select(tmp_path / "d", "x % 2 = 0")["x"]
    state = _drain_state(even)
    with loaderx.DataLoader({"x": even}, 10, seed=0) as loader:
        loader.load_state_dict(state)
        expected = next(loader)["x"]
    old_state = dict(state, fingerprints={"x": _legacy_fingerprint(even)})
    assert even.fingerprint_aliases == (old_state["fingerprints"]["x"],)
    with loaderx.DataLoader({"x": even}, 10, seed=0) as loader:
        loader.load_state_dict(old_state)  # an old checkpoint, the dataset where it was
        assert_same(next(loader)["x"], expected)
    even.close()
    shutil.copytree(tmp_path / "d", tmp_path / "copy")
    os.rename(tmp_path / "d", tmp_path / "moved")
    loaderx.convert(tmp_path / "moved", tmp_path / "converted", codec="raw", progress="off")
    for where in ("copy", "moved", "converted"):
        view = loaderx.select(tmp_path / where, "x % 2 = 0")["x"]
        assert view.fingerprint == state["fingerprints"]["x"], where
        with loaderx.DataLoader({"x": view}, 10, seed=0) as loader:
            loader.load_state_dict(json.loads(json.dumps(state)))
            assert_same(next(loader)["x"], expected)
        if where == "moved":
            with pytest.raises(ValueError, match=r"is 'subset of /.*' but this loader has "
                                                 r"'subset of 50 of 100 records.*loaderx 3.0.0, "
                                                 r"which named the dataset's path"):
                _resume(view, old_state)  # the old fingerprint named the old place
        view.close()
    loaderx.convert({"x": values[::-1].copy()}, tmp_path / "other", progress="off")
    other = loaderx.select(tmp_path / "other", "x % 2 = 0")["x"]
    assert len(other) == len(even) and other.rows.tolist() != even.rows.tolist()
    with pytest.raises(ValueError) as e:
        _resume(other, state)
    text = str(e.value)
    assert state["fingerprints"]["x"] in text and other.fingerprint in text
    assert "Resume on the data the checkpoint was taken on" in text and "step=" in text
    other.close()


def _drain_state(view):
    loader = loaderx.DataLoader({"x": view}, 10, seed=0)
    next(loader)
    state = loader.state_dict()
    loader.close()
    assert state["fingerprints"] == {"x": view.fingerprint}
    return state


def _resume(view, state):
    loader = loaderx.DataLoader({"x": view}, 10, seed=0)
    try:
        loader.load_state_dict(state)
    finally:
        loader.close()
