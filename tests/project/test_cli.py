"""Tests of the command line (``python -m loaderx``): every command's output
and exit code (0 ok, 1 a loaderx error on one line, 2 usage), ``--version``,
``info --json`` figures, the tiny-record warning, progress as log lines when
stderr is not a terminal, and ``--quiet``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import loaderx
from _helpers import ROOT
from loaderx import DenseStore, RaggedStore
from loaderx import __main__ as cli
from loaderx.__main__ import main


@pytest.fixture
def run(cli):
    """The conftest's CLI runner with progress logged at every step
    (``LOADERX_LOG_INTERVAL=0``); ``env_extra`` adds to the environment."""
    def run(*args, env_extra=None):
        return cli(*args, env={"LOADERX_LOG_INTERVAL": "0", **(env_extra or {})})

    return run


@pytest.fixture
def npz(tmp_path):
    rng = np.random.default_rng(0)
    x = np.cumsum(rng.integers(-2, 3, (400, 64)), axis=1).astype(np.int16)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(400, dtype=np.int64))
    return tmp_path / "d.npz", x


def test_version_and_usage(capsys, run):
    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"loaderx {loaderx.__version__}"
    out = run("convert")
    assert out.returncode == 2 and "required: src, dst" in out.stderr
    out = run("nonsense")
    assert out.returncode == 2
    assert main(["info", "/definitely/not/here"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("loaderx info: ") and err.count("\n") == 1 and "Traceback" not in err


def test_convert_info_verify_compact(tmp_path, npz, run):
    src, x = npz
    out = run("convert", src, tmp_path / "ds", "--workers", "2")
    assert out.returncode == 0, out.stderr
    assert (
        "converted 400 rows" in out.stdout and "x (dense int16[64], zstd, 2 shards)" in out.stdout
    )
    # Not a terminal: plain log lines with rate and a final summary.
    assert "convert: 400/400 rows (100.0%)" in out.stderr and "rows/s" in out.stderr
    out = run("info", tmp_path / "ds", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["rows"] == 400 and report["source"]["type"] == "numpy"
    col = report["columns"]["x"]
    assert col["shards"] == 2 and col["records"] == 400 and col["payload_bytes"] == 400 * 128
    assert col["index_bytes"] == 400 * 32 and col["codec"] == "zstd" and col["ratio"] > 1.2
    assert col["stored_bytes"] == col["data_bytes"] + col["index_bytes"] + col["meta_bytes"]
    assert col["warnings"] == []
    y = report["columns"]["y"]
    assert y["codec"] == "raw" and y["index_bytes"] == 400 * 4 and y["overhead_pct"] > 50
    assert y["warnings"] == []  # a scalar column: one value per record is its form
    out = run("info", tmp_path / "ds")
    assert (
        "column 'x': 2 shards" in out.stdout
        and "overhead:" in out.stdout
        and "scalar columns" in out.stdout
        and "  y int64\n" in out.stdout
    )
    out = run("verify", tmp_path / "ds")
    assert out.returncode == 0 and "ok: 800 records in 4 stores verified" in out.stdout
    assert "verify:" in out.stderr
    out = run("compact", tmp_path / "ds", "--quiet")
    assert out.returncode == 0 and out.stdout == "" and out.stderr == ""
    out = run("convert", src, tmp_path / "ds")
    assert out.returncode == 1 and "--append or --overwrite" in out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr


def test_info_of_a_single_store_and_tiny_records(tmp_path, run):
    with RaggedStore(tmp_path / "r", np.int32) as r:
        r.append([np.arange(n, dtype=np.int32) for n in (1, 2, 3)] * 100)
    out = run("info", tmp_path / "r", "--json")
    report = json.loads(out.stdout)
    assert report["kind"] == "ragged" and report["records"] == 300
    assert report["payload_bytes"] == 100 * (4 + 8 + 12) and report["payload_estimated"]
    assert "tiny (8.0 B on average" in report["warnings"][0]
    out = run("info", tmp_path / "r")
    assert out.returncode == 0 and "warning:" in out.stdout and "ragged (int32)" in out.stdout
    with DenseStore(tmp_path / "d", np.float32, (32,), codec="raw") as d:
        d.append(np.ones((10, 32), np.float32))
    report = json.loads(run("info", tmp_path / "d", "--json").stdout)
    assert report["payload_bytes"] == 1280 and report["warnings"] == []
    assert report["index_bytes"] == 40 and report["ratio"] == 1.0


def test_convert_refuses_flags_that_contradict_each_other(tmp_path, run):
    """Before, ``--dict --codec raw`` wrote zstd_dict stores and a second
    ``--fill-null`` of a column silently replaced the first."""
    np.save(tmp_path / "x.npy", np.arange(12))
    for flags, said in ((["--dict", "--codec", "raw"], "--dict is --codec zstd_dict; it "
                                                        "contradicts --codec raw"),
                        (["--fill-null", "x=1", "--fill-null", "x=2"],
                         "--fill-null names x more than once")):
        out = run("convert", tmp_path / "x.npy", tmp_path / "o", "-q", *flags)
        assert out.returncode == 1 and said in out.stderr, out.stderr
        assert not (tmp_path / "o").exists()
    out = run("convert", tmp_path / "x.npy", tmp_path / "o", "-q", "--dict", "--codec", "zstd")
    assert out.returncode == 0, out.stderr


def test_convert_flags_reach_the_converter(tmp_path, run):
    np.save(tmp_path / "tok.npy", np.arange(5000, dtype=np.int32))
    out = run("convert", tmp_path / "tok.npy", tmp_path / "t0", "-q")  # a scalar column
    assert out.returncode == 0, out.stderr
    m = json.loads((tmp_path / "t0" / "loaderx.json").read_text())
    assert m["columns"]["tok"]["item_shape"] == [] and m["columns"]["tok"]["codec"] == "raw"
    out = run(
        "convert",
        tmp_path / "tok.npy",
        tmp_path / "t",
        "--row-length",
        "500",
        "--codec",
        "raw",
        "-q",
    )
    assert out.returncode == 0 and out.stdout == "" and out.stderr == ""
    m = json.loads((tmp_path / "t" / "loaderx.json").read_text())
    assert m["columns"]["tok"]["item_shape"] == [500] and m["columns"]["tok"]["codec"] == "raw"
    out = run(
        "convert", tmp_path / "tok.npy", tmp_path / "t", "--row-length", "1000", "--overwrite"
    )
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "t" / "loaderx.json").read_text())["rows"] == 5
    out = run("convert", tmp_path / "tok.npy", tmp_path / "t", "--row-length", "1000", "--append")
    assert (
        out.returncode == 0
        and json.loads((tmp_path / "t" / "loaderx.json").read_text())["rows"] == 10
    )
    out = run("convert", tmp_path / "tok.npy", tmp_path / "u", "--append", "--overwrite")
    assert out.returncode == 2


def test_train_dict_and_dict_conversion(tmp_path, run):
    rng = np.random.default_rng(5)
    words = [b"alpha ", b"beta ", b"gamma ", b"delta "]
    rows = np.array(
        [list(b"".join(words[i] for i in rng.integers(0, 4, 30))[:120]) for _ in range(2000)],
        dtype=np.uint8,
    )
    np.save(tmp_path / "t.npy", rows)
    out = run("train-dict", tmp_path / "t.npy", "-o", tmp_path / "t.dict", "--tier", "fast")
    assert out.returncode == 0, out.stderr
    data = (tmp_path / "t.dict").read_bytes()
    assert data[:4] == bytes.fromhex("37a430ec") and "train-dict (fast): done in" in out.stderr
    out = run("convert", tmp_path / "t.npy", tmp_path / "ds", "--dict")
    assert out.returncode == 0, out.stderr
    assert "zstd_dict" in out.stdout
    report = json.loads(run("info", tmp_path / "ds", "--json").stdout)
    assert report["columns"]["t"]["dictionary_bytes"] > 0
    out = run("train-dict", tmp_path / "ds", "--column", "nope", "-o", tmp_path / "x.dict")
    assert out.returncode == 1 and "no column 'nope'" in out.stderr
    # (before: "train-dict (balanced): stopped after 0.0 s" first, as if it had begun)
    out = run("train-dict", tmp_path / "ds", "--size", "5", "-o", tmp_path / "x.dict")
    assert out.returncode == 1 and out.stderr.splitlines() == [
        "loaderx train-dict: size must be an int from 256 to 2147483648, got 5"]
    assert not (tmp_path / "x.dict").exists()


def test_cli_train_dict_refuses_a_damaged_npy(tmp_path, capsys):
    (tmp_path / "bad.npy").write_bytes(b"garbage" * 20)
    assert cli.main(["train-dict", str(tmp_path / "bad.npy"), "-o", str(tmp_path / "d")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.npy: not a readable .npy array" in err[0]


def test_demo_runs_and_checks_its_options(run):
    out = run("demo", "--records", "500", "--steps", "5")
    assert out.returncode == 0, out.stderr
    out = run("demo", "--records", "0")
    assert out.returncode == 2


# ``loaderx demo``: ``--seed -1`` stopped with numpy's bare "expected non-negative
# integer", ``--workers 0`` only after building the stores.
@pytest.mark.parametrize("args, words", [
    (["--seed", "-1"], "--seed must be >= 0, got -1"),
    (["--workers", "0"], "--workers must be >= 1, got 0"),
])
def test_demo_refuses_bad_seed_and_workers_before_building(args, words, capsys):
    from loaderx import _demo

    with pytest.raises(SystemExit) as exit_info:
        _demo.run(["--records", "50", "--steps", "1", *args])
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and words in captured.err
    assert "built" not in captured.out  # refused before writing any store


def test_info_into_a_closed_pipe_exits_quietly(tmp_path, npz, run):
    src, _ = npz
    assert run("convert", src, tmp_path / "ds", "-q").returncode == 0
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen(
        [sys.executable, "-m", "loaderx", "info", "--json", str(tmp_path / "ds")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    proc.stdout.close()  # the reader is gone before a byte is written: `| head -c0`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == ""


def test_warnings_name_the_input_not_loaderx_source_lines(tmp_path, run):
    np.save(tmp_path / "tok.npy", np.arange(5000, dtype=np.int32))
    out = run("convert", tmp_path / "tok.npy", tmp_path / "t", "--row-length", "3000", "-q")
    assert out.returncode == 0, out.stderr
    assert out.stderr == (
        f"loaderx convert: warning: {tmp_path / 'tok.npy'}: column 'tok': 2000 trailing "
        "values do not fill a row of 3000 and are left out\n"
    )


def test_progress_shows_records_and_bytes_from_the_first_batch(tmp_path, run):
    members = [(f"s{i:05d}.txt", bytes(200) + b"%d" % i) for i in range(3000)]
    _tar_file(tmp_path / "t.tar", members)
    out = run("convert", tmp_path / "t.tar", tmp_path / "o")
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if " of " in ln]
    total = os.path.getsize(tmp_path / "t.tar")
    first = lines[0]
    assert "records" in first and not first.startswith("convert: 0 B of")
    # The first report comes after a small first batch, not after 1024 samples.
    assert int(first.split(" records")[0].rsplit(" ", 1)[1].replace(",", "")) < 1024
    assert f"of {total / 2**20:.1f} MiB (100.0%), 3,000 records" in lines[-1]
    np.save(tmp_path / "x.npy", np.zeros((4096, 256), np.float32))
    out = run("convert", tmp_path / "x.npy", tmp_path / "x", "--batch-mib", "1")
    first = [ln for ln in out.stderr.splitlines() if "rows (" in ln][0]
    assert first.startswith("convert: 64/4,096 rows") and "64.0 KiB read" in first


def test_info_shows_labels_files_and_keys(tmp_path, run):
    Image = pytest.importorskip("PIL.Image", reason="Pillow is part of the test extra")
    for cls in ("ant", "bee"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(2):
            Image.new("L", (4, 4), i).save(tmp_path / "imgs" / cls / f"{i}.png")
    out = run("convert", tmp_path / "imgs", tmp_path / "d")
    assert out.returncode == 0, out.stderr
    assert "images L" in out.stdout and "key (bytes uint8" in out.stdout
    text = run("info", tmp_path / "d").stdout
    assert "labels:    ant, bee (2 names; loaderx.labels(ds, name))" in text
    assert "role:      key" in text and "images:    L (seen: L 4)" in text
    report = json.loads(run("info", tmp_path / "d", "--json").stdout)
    assert report["columns"]["label"]["labels"] == ["ant", "bee"]
    out = run("convert", tmp_path / "imgs", tmp_path / "n", "--no-keys", "-q")
    assert out.returncode == 0 and sorted(os.listdir(tmp_path / "n" / "gen-000001")) == [
        "image", "label"]
    (tmp_path / "pq").mkdir()
    pa = pytest.importorskip("pyarrow", reason="pyarrow is part of the test extra")
    import pyarrow.parquet as pq

    for k in range(25):
        pq.write_table(pa.table({"x": pa.FixedSizeListArray.from_arrays(
            np.zeros(16 * 4), 16)}), tmp_path / "pq" / f"p{k:02d}.parquet")
    assert run("convert", tmp_path / "pq", tmp_path / "p", "-q").returncode == 0
    text = run("info", tmp_path / "p").stdout
    assert "  p00.parquet  rows 0:4" in text and "  p19.parquet  rows 76:80" in text
    assert "p20.parquet" not in text and "... 5 more files (--json lists them all)" in text


def _tar_file(path, members) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def test_convert_image_column_flags(tmp_path, run):
    Image = pytest.importorskip("PIL.Image", reason="Pillow is part of the test extra")
    import io

    def png(value: int) -> bytes:
        buf = io.BytesIO()
        Image.new("L", (4, 4), value).save(buf, format="PNG")
        return buf.getvalue()

    _tar_file(tmp_path / "t.tar", [(f"k{i}.png", png(i)) for i in range(3)])
    out = run("convert", tmp_path / "t.tar", tmp_path / "a", "--image-column", "pixels", "-q")
    assert out.returncode == 0, out.stderr
    assert list(json.loads((tmp_path / "a" / "loaderx.json").read_text())["columns"]) == [
        "pixels", "key"]
    out = run("convert", tmp_path / "t.tar", tmp_path / "b", "--image-per-extension", "--no-keys")
    assert out.returncode == 0, out.stderr
    assert list(json.loads((tmp_path / "b" / "loaderx.json").read_text())["columns"]) == ["png"]
    assert "DenseStore uint8[4, 4], stored as L (the first 3 images: L 3)" in out.stderr


def test_output_files_go_exactly_where_named_and_never_into_a_dataset(tmp_path, capsys):
    """Before: `select --out /dev/full` wrote /dev/full.npy, `--out ds/x`
    wrote ds/x.npy inside the dataset, `--out ""` was ignored, and
    `train-dict -o` replaced a store's meta, a manifest, or its own source."""
    ds = tmp_path / "ds"
    loaderx.convert({"label": np.arange(100)}, ds, progress=False)
    store = tmp_path / "s"
    loaderx.from_numpy(store, np.arange(1000)).close()
    npy = tmp_path / "src.npy"
    np.save(npy, np.arange(1000))
    before = {p: p.read_bytes() for p in (ds / "loaderx.json", store / "meta", npy)}
    bad = [
        (["select", str(ds), "label < 5", "--out", ""], "needs a file name"),
        (["select", str(ds), "label < 5", "--out", str(ds / "rows")], "inside the loaderx dataset"),
        (["select", str(ds), "label < 5", "--out", "/dev/null"], "not a regular file"),
        (["train-dict", str(ds), "-o", str(ds / "loaderx.json")], "inside the loaderx dataset"),
        (["train-dict", str(store), "-o", str(store / "meta")], "inside the loaderx store"),
        (["train-dict", str(npy), "-o", str(npy)], "is the source it trains on"),
    ]
    for argv, why in bad:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert why in err and err.count("\n") == 1, (argv, err)
    assert {p: p.read_bytes() for p in before} == before
    assert not (ds / "rows.npy").exists()
    out = tmp_path / "rows"  # no .npy added
    assert main(["select", str(ds), "label < 5", "--out", str(out)]) == 0
    assert np.load(out).tolist() == [0, 1, 2, 3, 4] and not (tmp_path / "rows.npy").exists()


def test_options_before_demo_and_out_of_range_numbers_are_refused_clearly(run, tmp_path):
    out = run("-q", "demo")
    assert out.returncode == 2 and "unrecognized arguments: -q" in out.stderr
    assert "Traceback" not in out.stderr
    np.save(tmp_path / "a.npy", np.arange(100))
    for length in ("99999999999999999999", "0", "ten"):
        out = run("convert", str(tmp_path / "a.npy"), str(tmp_path / "o"), "--row-length", length)
        assert out.returncode == 2 and "argument --row-length" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and not (tmp_path / "o").exists()
