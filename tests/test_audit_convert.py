"""Hostile and careless inputs to `loaderx.convert`, dataset directories and
the CLI: each must give a clear error naming the input (or a correct
result), never a raw library exception, a silently shortened dataset, a
write outside the destination or a broken dataset left behind.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import zipfile

import numpy as np
import pytest

import loaderx
from loaderx import __main__ as cli
from loaderx.converters import ConvertError
from loaderx.errors import CorruptStoreError
from _helpers import assert_same

pa = pytest.importorskip("pyarrow", reason="pyarrow is part of the test extra")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is part of the test extra")
Image = pytest.importorskip("PIL.Image", reason="Pillow is part of the test extra")


def _convert(src, dest, **kw):
    return loaderx.convert(src, dest, progress="off", **kw)


def _nothing_left(parent, name: str = "out") -> None:
    assert not os.path.exists(os.path.join(parent, name))
    assert [n for n in os.listdir(parent) if "loaderx-partial" in n] == []


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


def test_cli_train_dict_refuses_a_damaged_npy(tmp_path, capsys):
    (tmp_path / "bad.npy").write_bytes(b"garbage" * 20)
    assert cli.main(["train-dict", str(tmp_path / "bad.npy"), "-o", str(tmp_path / "d")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.npy: not a readable .npy array" in err[0]


def _tar(path, members, mode="w") -> None:
    with tarfile.open(path, mode) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_a_truncated_or_damaged_tar_is_refused_not_shortened(tmp_path):
    samples = [(f"k{i:03d}.txt", b"text %d " % i * 20) for i in range(100)]
    _tar(tmp_path / "good.tar", samples)
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
    _tar(tmp_path / "good.tar.gz", samples, "w:gz")
    gz = (tmp_path / "good.tar.gz").read_bytes()
    (tmp_path / "half.tar.gz").write_bytes(gz[: len(gz) // 2])
    with pytest.raises(ConvertError, match="half.tar.gz: .*truncated"):
        _convert(tmp_path / "half.tar.gz", tmp_path / "out")
    _nothing_left(tmp_path)


def test_webdataset_members_that_do_not_fit_are_named(tmp_path):
    _tar(tmp_path / "cls.tar", [("k0.cls", b"1"), ("k1.cls", b"2"), ("k2.cls", b"9" * 30)])
    with pytest.raises(ConvertError, match=r"cls.tar:k2.cls: holds b'9+', not an integer"):
        _convert(tmp_path / "cls.tar", tmp_path / "out", allow_tiny_records=True)
    arrays = [np.zeros(i + 1, np.float64 if i < 70 else np.float32) for i in range(80)]
    _tar(tmp_path / "npy.tar", [(f"k{i:02d}.npy", _npy_bytes(a)) for i, a in enumerate(arrays)])
    with pytest.raises(ConvertError, match="npy.tar:k70.npy: array has dtype float32 but the"):
        _convert(tmp_path / "npy.tar", tmp_path / "out")
    _nothing_left(tmp_path)


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


def test_deep_images_after_the_probe_are_not_clipped(tmp_path):
    gray = [(f"k{i:03d}.png", _encoded("L")) for i in range(70)]
    _tar(tmp_path / "w.tar", gray + [("k999.png", _encoded("I;16"))])
    with pytest.raises(ConvertError, match="k999.png: the image has the Pillow mode 'I;16'"):
        _convert(tmp_path / "w.tar", tmp_path / "out")
    _nothing_left(tmp_path)


def _encoded(mode: str) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, (8, 8)).save(buf, format="PNG")
    return buf.getvalue()


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


def test_a_null_deep_in_a_nested_column_is_filled_and_named(tmp_path):
    rows = [[[1.0, 2.0]] * 3 for _ in range(10)]
    rows[7] = [[1.0, 2.0], [3.0, None]]
    table = pa.table({"a": pa.array(rows, pa.list_(pa.list_(pa.float64(), 2)))})
    pq.write_table(table, tmp_path / "n.parquet", row_group_size=4)
    out = _convert(tmp_path / "n.parquet", tmp_path / "out")
    got = out["a"][7]
    assert got.shape == (2, 2) and got[1, 0] == 3.0 and np.isnan(got[1, 1])  # a float: NaN
    ints = pa.table({"a": pa.array([[1, 2]] * 7 + [[3, None]] + [[4]] * 2, pa.list_(pa.int32()))})
    pq.write_table(ints, tmp_path / "i.parquet", row_group_size=4)
    with pytest.warns(UserWarning, match=r"1 null values inside lists \(the first in row 7\) are stored as 0"):
        out = _convert(tmp_path / "i.parquet", tmp_path / "iout")
    assert_same(out["a"][7], np.array([3, 0], np.int32))
    out = _convert(tmp_path / "i.parquet", tmp_path / "f", fill_null={"a": -1})
    assert_same(out["a"][7], np.array([3, -1], np.int32))


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


def test_more_workers_than_cores_run_a_core_s_worth_at_a_time(tmp_path, monkeypatch):
    """workers=N started N interpreters at once whatever the cores (20 for
    workers=10**6 on 20 rows). They now run one per usable core at a time,
    and every task still becomes its shard."""
    from loaderx.converters import _run

    monkeypatch.setattr(_run, "_cores", lambda: 1)
    real = _run.subprocess.Popen
    started: list = []

    def popen(*args, **kw):
        assert all(p.poll() is not None for p in started), "two workers ran at once"
        started.append(real(*args, **kw))
        return started[-1]

    monkeypatch.setattr(_run.subprocess, "Popen", popen)
    x = np.arange(30, dtype=np.int64).reshape(10, 3)
    np.save(tmp_path / "x.npy", x)
    _convert(tmp_path / "x.npy", tmp_path / "out", workers=3)
    assert len(started) == 3
    col = loaderx.open_dataset(tmp_path / "out")["x"]
    assert col[np.arange(10)].tolist() == x.tolist()


def test_a_failed_conversion_does_not_log_done(tmp_path, capsys):
    """Log-mode progress said "done in X s" after a conversion that failed."""
    arrays = [np.zeros(i + 1, np.float64 if i < 70 else np.float32) for i in range(80)]
    _tar(tmp_path / "npy.tar", [(f"k{i:02d}.npy", _npy_bytes(a)) for i, a in enumerate(arrays)])
    with pytest.raises(ConvertError, match="k70.npy"):
        loaderx.convert(tmp_path / "npy.tar", tmp_path / "out", progress="log")
    err = capsys.readouterr().err
    assert "convert: stopped" in err and "done" not in err
    good = [(f"k{i:02d}.npy", _npy_bytes(a)) for i, a in enumerate(arrays[:70])]
    _tar(tmp_path / "good.tar", good)
    loaderx.convert(tmp_path / "good.tar", tmp_path / "out", progress="log")
    assert "done in" in capsys.readouterr().err


def test_a_killed_conversion_s_leftovers_are_swept_by_the_next_one(tmp_path):
    """A convert killed outright left its staging directory (a full copy of
    the data) behind, and each retry left another. The next conversion to the
    same destination removes staging directories no live process owns, keeps
    those a live one does, and removes an interrupted overwrite's old copy
    only once the destination is back."""
    import subprocess
    import sys
    import time

    from loaderx.converters._dest import Destination

    np.save(tmp_path / "x.npy", np.arange(12).reshape(4, 3))
    child = (
        "import os, sys\n"
        "from loaderx.converters import _dest, _columns\n"
        "d = _dest.Destination(sys.argv[1], 'create', _columns.Flags())\n"
        "d.begin([])\n"
        "open(os.path.join(d.staging, 'data'), 'w').write('x' * 1000)\n"
        "os._exit(9)  # killed: no abort, no cleanup\n"
    )
    for _ in range(2):  # the second run already sweeps the first one's
        subprocess.run([sys.executable, "-c", child, str(tmp_path / "out")], check=False)
    killed = [n for n in os.listdir(tmp_path) if "loaderx-partial" in n]
    assert len(killed) == 1
    _convert(tmp_path / "x.npy", tmp_path / "other")  # another destination: touches nothing
    assert (tmp_path / killed[0]).is_dir()
    fresh = tmp_path / ".out.loaderx-partial-fresh"  # unowned, just made: kept
    stale = tmp_path / ".out.loaderx-partial-stale"  # unowned, old: removed
    fresh.mkdir()
    stale.mkdir()
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    old = tmp_path / ".out.loaderx-old-abc"  # an overwrite's old copy
    old.mkdir()
    live = Destination(tmp_path / "out", "create", loaderx.converters._columns.Flags())
    live.begin([])  # a conversion still running in this process; it swept already
    assert not (tmp_path / killed[0]).exists() and not stale.exists()
    _convert(tmp_path / "x.npy", tmp_path / "out")
    left = sorted(n for n in os.listdir(tmp_path) if n.startswith(".out."))
    assert left == sorted([os.path.basename(live.staging), fresh.name, old.name])
    # (out was missing: the old copy may be all there is of it, so it stayed)
    _convert(tmp_path / "x.npy", tmp_path / "out", mode="overwrite")
    assert not old.exists()
    live.abort()
    assert loaderx.open_dataset(tmp_path / "out")["x"][[3]].tolist() == [[9, 10, 11]]


def test_conversions_into_one_dataset_never_lose_each_other_s_rows(tmp_path):
    """Two appends at once each wrote a manifest without the other's parts
    (the later one silently dropped the earlier one's rows), and a create
    finishing after another create of the same path replaced it. An append or
    overwrite now holds the dataset's lock (a second one gets LockedError), a
    create never replaces what appeared meanwhile, and parts a killed append
    moved in without a manifest entry are removed by the next append."""
    from loaderx.converters._columns import Flags
    from loaderx._locks import lock_dataset
    from loaderx.converters._dest import Destination
    from loaderx.dataset import DestinationExistsError
    from loaderx.errors import LockedError

    x = np.arange(12).reshape(4, 3)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    _convert(tmp_path / "x.npy", out)
    held = lock_dataset(str(out))  # an append or overwrite still running
    for mode in ("append", "overwrite"):
        with pytest.raises(LockedError, match="another conversion is writing to this dataset"):
            _convert(tmp_path / "x.npy", out, mode=mode)
    os.close(held)
    orphan = out / "gen-000001" / "x" / "part-00007"  # an append killed before its manifest
    orphan.mkdir()
    (orphan / "data").write_bytes(b"x" * 100)
    _convert(tmp_path / "x.npy", out, mode="append")
    assert not orphan.exists()
    assert sorted(os.listdir(out / "gen-000001" / "x")) == ["part-00000", "part-00001"]
    assert loaderx.open_dataset(out)["x"][np.arange(8)].tolist() == x.tolist() * 2
    late = Destination(tmp_path / "new", "create", Flags())
    late.begin([])  # a create that started before the one below finished
    _convert(tmp_path / "x.npy", tmp_path / "new")
    with pytest.raises(DestinationExistsError, match="appeared while this conversion ran"):
        late.commit([], {}, [], {})
    late.abort()
    assert loaderx.open_dataset(tmp_path / "new")["x"][np.arange(4)].tolist() == x.tolist()
