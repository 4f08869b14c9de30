"""Tests of `loaderx.ray` on a local Ray instance (``ray.init(num_cpus=2)``):
write_dataset writes one shard per write task and one manifest, with values
and order checked against the source; a task that fails mid-way leaves no
shard and no manifest behind (and a failed append leaves the old manifest);
read_dataset gives every row back as a ray.data.Dataset."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from _helpers import ROOT, TESTS, assert_same

import loaderx
from loaderx.dataset import read_manifest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'loaderx[ray]')")
pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'ray[data]')")
pa = pytest.importorskip("pyarrow", reason="Ray Data needs pyarrow")
import loaderx.ray as lray  # noqa: E402

ROWS = 600
# One worker runs the module (`--dist loadgroup`, pyproject.toml): its tests share
# one local Ray instance, started once instead of once per xdist worker.
pytestmark = pytest.mark.xdist_group("ray")


def _has(module):
    return importlib.util.find_spec(module) is not None


@pytest.fixture(scope="module")
def local_ray():
    # Ray's workers import loaderx, this module's map functions by name and the
    # shared test modules it imports.
    # The local instance's workers inherit this process's environment; a
    # runtime_env would set it too, but starts them through Ray's runtime-env
    # agent, which costs 30-40 s on a loaded 2-core machine.
    paths = [ROOT, os.path.dirname(os.path.abspath(__file__)), TESTS]
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([saved] if saved else []))
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    yield
    ray.shutdown()


def _rows(batch):
    ids = batch["id"].astype(np.int64)
    ragged = np.empty(len(ids), dtype=object)
    for i, v in enumerate(ids):
        ragged[i] = (np.arange(v % 5) + v).astype(np.int32)
    return {
        "x": np.stack([np.full((2, 3), v, np.float32) for v in ids]),
        "y": ids * 3,
        "text": np.array([f"row {v}" for v in ids]),
        "tokens": ragged,
    }


def _source(blocks: int = 4):
    return ray.data.range(ROWS, override_num_blocks=blocks).map_batches(_rows, batch_format="numpy")


def _leftovers(parent) -> list:
    return [n for n in os.listdir(parent) if n.startswith(".")]


def test_write_then_open_and_read_back(tmp_path, local_ray):
    manifest = lray.write_dataset(_source(), tmp_path / "ds")
    assert manifest["rows"] == ROWS and manifest["source"]["type"] == "ray"
    cols = manifest["columns"]
    assert [(c["kind"], c["item_shape"]) for c in cols.values()] == [
        ("dense", [2, 3]),
        ("dense", []),
        ("bytes", None),
        ("ragged", None),
    ]
    assert len(cols["x"]["shards"]) == 4 and sum(s["rows"] for s in cols["x"]["shards"]) == ROWS
    ds = loaderx.open_dataset(tmp_path / "ds")
    ids = np.arange(ROWS)
    assert_same(ds["x"][:], np.repeat(ids.astype(np.float32), 6).reshape(ROWS, 2, 3))
    assert_same(ds["y"][:], ids * 3)
    assert ds["text"][[0, 599]] == ["row 0", "row 599"]
    assert_same(ds["tokens"][7], np.arange(2, dtype=np.int32) + 7)
    for v in ds.values():
        v.close()
    back = lray.read_dataset(tmp_path / "ds", batch_rows=128).take_all()
    assert len(back) == ROWS
    back.sort(key=lambda r: int(r["y"]))
    for i in (0, 1, 298, 599):
        assert_same(np.asarray(back[i]["x"]), np.full((2, 3), i, np.float32))
        assert int(back[i]["y"]) == 3 * i and back[i]["text"] == f"row {i}"  # strings as str
        assert_same(np.asarray(back[i]["tokens"]), np.arange(i % 5, dtype=np.int32) + i)
    assert _leftovers(tmp_path) == []


def _failing(batch):
    out = _rows(batch)
    if batch["id"][0] >= ROWS // 2:
        # A column of structs, which no store holds: the write task fails.
        y = pa.array([{"v": v} for v in out["y"].tolist()])
        return pa.table(
            {
                "x": pa.FixedSizeListArray.from_arrays(
                    pa.FixedSizeListArray.from_arrays(pa.array(out["x"].ravel()), 3), 2
                ),
                "y": y,
                "text": pa.array(out["text"].tolist()),
                "tokens": pa.array([t.tolist() for t in out["tokens"]], pa.list_(pa.int32())),
            }
        )
    return pa.table(
        {
            "x": pa.FixedSizeListArray.from_arrays(
                pa.FixedSizeListArray.from_arrays(pa.array(out["x"].ravel()), 3), 2
            ),
            "y": pa.array(out["y"]),
            "text": pa.array(out["text"].tolist()),
            "tokens": pa.array([t.tolist() for t in out["tokens"]], pa.list_(pa.int32())),
        }
    )


def test_a_failed_task_leaves_no_half_shard(tmp_path, local_ray):
    source = ray.data.range(ROWS, override_num_blocks=4).map_batches(_failing, batch_format="numpy")
    with pytest.raises(Exception, match="has no loaderx store type"):
        lray.write_dataset(source, tmp_path / "ds")
    assert not (tmp_path / "ds").exists() and _leftovers(tmp_path) == []
    good = ray.data.range(ROWS // 2, override_num_blocks=2).map_batches(
        _failing, batch_format="numpy"
    )
    lray.write_dataset(good, tmp_path / "ok")
    before = (tmp_path / "ok" / "loaderx.json").read_text()
    with pytest.raises(Exception, match="has no loaderx store type"):
        lray.write_dataset(source, tmp_path / "ok", mode="append")
    assert (tmp_path / "ok" / "loaderx.json").read_text() == before
    assert sorted(os.listdir(tmp_path / "ok" / "gen-000001" / "y")) == ["part-00000", "part-00001"]
    assert _leftovers(tmp_path) == [] and _leftovers(tmp_path / "ok") == []
    manifest = lray.write_dataset(good, tmp_path / "ok", mode="append")
    assert (
        manifest["rows"] == ROWS
        and len(read_manifest(tmp_path / "ok")["columns"]["y"]["shards"]) == 4
    )


def _with_nulls(batch):
    out = _rows(batch)
    ids = out["y"] // 3
    y = pa.array([None if v % 7 == 0 else int(v) for v in ids], pa.int64())
    text = pa.array([None if v % 5 == 0 else f"row {v}" for v in ids])
    return pa.table({"y": y, "text": text})


def test_nulls_get_a_validity_mask_in_every_task(tmp_path, local_ray):
    source = ray.data.range(ROWS, override_num_blocks=4).map_batches(
        _with_nulls, batch_format="numpy"
    )
    manifest = lray.write_dataset(source, tmp_path / "ds")
    cols = manifest["columns"]
    assert list(cols) == ["y", "y.valid", "text", "text.valid"]
    assert cols["y"]["valid"] == "y.valid" and cols["y.valid"]["valid_of"] == "y"
    ds = loaderx.open_dataset(tmp_path / "ds")
    ids = np.arange(ROWS)
    assert_same(ds["y.valid"][:], ids % 7 != 0)
    assert_same(ds["y"][:], np.where(ids % 7 == 0, 0, ids))
    assert ds["text"][[0, 1, 5]] == [None, "row 1", None]
    back = lray.read_dataset(tmp_path / "ds").take_all()
    back.sort(key=lambda r: int(r["y"]) if r["y.valid"] else -int(r["text"] is None))
    rows = {int(r["y"]): r for r in back if r["y.valid"]}
    assert rows[1]["text"] == "row 1" and rows[5]["text"] is None


def test_modes_and_column_selection(tmp_path, local_ray):
    lray.write_dataset(_source(2), tmp_path / "ds", columns=["y", "x"])
    assert list(read_manifest(tmp_path / "ds")["columns"]) == ["y", "x"]
    with pytest.raises(FileExistsError, match='mode="append" or mode="overwrite"'):
        lray.write_dataset(_source(2), tmp_path / "ds")
    m = lray.write_dataset(_source(3), tmp_path / "ds", mode="overwrite", skip_columns=["tokens"])
    assert list(m["columns"]) == ["x", "y", "text"] and len(m["columns"]["x"]["shards"]) == 3
    with pytest.raises(loaderx.converters.ConvertError, match="codec"):
        lray.write_dataset(_source(2), tmp_path / "z", codec="lz4")


def test_read_dataset_gives_equal_length_lists_as_fixed_tensors(tmp_path, local_ray):
    pd = pytest.importorskip("pandas", reason="pandas comes with datasets in the test extra")
    pixels = [np.arange(64, dtype=np.float64) + i for i in range(40)]
    pd.DataFrame({"pixels": pixels, "target": np.arange(40)}).to_parquet(tmp_path / "d.parquet")
    loaderx.convert(tmp_path / "d.parquet", tmp_path / "ds", progress=False)["pixels"].close()
    back = lray.read_dataset(tmp_path / "ds")
    assert back.schema().types[0].shape == (64,)
    batch = back.take_batch(40, batch_format="numpy")
    order = np.argsort(batch["target"])
    assert_same(batch["pixels"][order], np.stack(pixels))


def test_write_dataset_to_a_url_uploads_from_the_tasks_and_reads_back(local_ray, tmp_path, s3):
    url = f"s3://{s3.bucket}/ray/ds"
    manifest = lray.write_dataset(_source(), url, columns=["x", "y"],
                                  storage_options=s3.options())
    assert manifest["rows"] == ROWS
    ds = loaderx.open_dataset(url, cache_dir=str(tmp_path), storage_options=s3.options())
    ids = np.arange(ROWS)
    assert_same(ds["y"][:], ids * 3)
    assert_same(ds["x"][[0, ROWS - 1]],
                np.stack([np.full((2, 3), v, np.float32) for v in (0, ROWS - 1)]))
    for col in ds.values():
        col.close()


# read_dataset with an unknown column or batch_rows=0 gave a Dataset that failed
# only when it ran, inside a Ray task (no Ray is started here: the checks run in
# the driver first); write_dataset of something that is not a Ray dataset raised a
# bare AttributeError.
@pytest.mark.skipif(not (_has("ray") and _has("pyarrow")),
                    reason="Ray is not installed (pip install 'loaderx[ray]')")
def test_ray_arguments_are_checked_in_the_driver(tmp_path):
    import loaderx.ray as lxray

    loaderx.convert({"x": np.zeros((10, 4), np.float32), "y": np.zeros((10, 4), np.int32)},
                    str(tmp_path / "ds"))
    with pytest.raises(KeyError, match=r"no column 'z'; the dataset has \['x', 'y'\]"):
        lxray.read_dataset(tmp_path / "ds", columns=["x", "z"])
    with pytest.raises(TypeError, match="columns must be a list"):
        lxray.read_dataset(tmp_path / "ds", columns="x")
    with pytest.raises(ValueError, match="batch_rows must be a positive int, got 0"):
        lxray.read_dataset(tmp_path / "ds", batch_rows=0)
    with pytest.raises(TypeError, match="takes a ray.data.Dataset, got ndarray"):
        lxray.write_dataset(np.arange(3), tmp_path / "out")
    assert not (tmp_path / "out").exists()


# A write task whose later blocks had another Arrow type than its first block cast
# them silently (2**40 became 0 in an int32 column, 0.5 became 0) and dropped a
# column only later blocks had.
@pytest.mark.skipif(not (_has("ray") and _has("pyarrow")),
                    reason="Ray is not installed (pip install 'loaderx[ray]')")
def test_ray_write_task_refuses_blocks_unlike_its_first():
    import pyarrow as pa

    from loaderx.converters import ConvertError
    from loaderx.converters._columns import Flags, arrow_spec
    from loaderx.converters._source import Options
    from loaderx.ray import _BlocksSource

    options = Options(columns=None, skip_columns=[], flags=Flags())
    first = pa.table({"v": pa.array(np.arange(3, dtype=np.int32))})
    specs = [arrow_spec(pa, "v", first.schema.field("v").type, options.flags)]
    later = {
        "int64": (pa.table({"v": pa.array([2**40, 1, 2], pa.int64())}), "Arrow type int64"),
        "double": (pa.table({"v": pa.array([0.5, 1.5, 2.5])}), "Arrow type double"),
        "extra": (pa.table({"v": first["v"], "w": pa.array([1, 2, 3])}), "['v', 'w']"),
    }
    for name, (table, words) in later.items():
        source = _BlocksSource(iter([first, table]), options, 5)
        with pytest.raises(ConvertError, match="Ray write task 5") as info:
            list(source.read(None, specs, 1 << 20))
        assert words in str(info.value), name
    same = _BlocksSource(iter([first, first]), options, 5).read(None, specs, 1 << 20)
    assert [b.columns["v"].tolist() for b in same] == [[0, 1, 2], [0, 1, 2]]


def test_read_dataset_gives_zone_aware_timestamps_in_their_zone(tmp_path, local_ray):
    pd = pytest.importorskip("pandas", reason="pandas comes with datasets in the test extra")
    import pyarrow as pa

    times = pd.Series(pd.date_range("2024-03-31 00:30", periods=5, freq="h", tz="Europe/Paris"))
    pd.DataFrame({"at": times, "n": np.arange(5)}).to_parquet(tmp_path / "t.parquet")
    loaderx.convert(tmp_path / "t.parquet", tmp_path / "ds", progress=False)["at"].close()
    table = lray.read_dataset(tmp_path / "ds").to_arrow_refs()
    table = pa.concat_tables(ray.get(table))
    assert table.schema.field("at").type == pa.timestamp("us", tz="Europe/Paris")
    assert list(table.column("at").to_pandas()) == list(times)
