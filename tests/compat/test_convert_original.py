"""Stores written by the original loaderx in its 0.9 layout (meta.zr, chunk
files, dict.zr, schema.msgpack) convert into a dataset, through
`loaderx.convert` and the CLI, with every record's bytes identical; a damaged
store raises CorruptStoreError naming the file and the entry and leaves
nothing at the destination; `info` and `verify` say what such a directory is
and how to convert it. The stores are written by tests/_original_store.py,
from the layout the original documents."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from _original_store import dense_records, patch_entry, write_store, zstd
from _helpers import ROOT

import loaderx
from loaderx import DenseStore, RaggedStore, Zrecord, _abi
from loaderx.converters import ConvertError
from loaderx.dataset import read_manifest
from loaderx.errors import CorruptStoreError, NotAStoreError

Z = zstd()
needs_zstd = pytest.mark.skipif(
    Z is None, reason="zstd frames need compression.zstd (Python 3.14) or the zstandard package")


def _only(dataset: dict):
    (column,) = dataset.values()
    return column


def _nothing_left(tmp_path, dest) -> None:
    assert not os.path.exists(dest)
    assert [n for n in os.listdir(tmp_path) if "loaderx" in n] == []


def _mixed_codecs(n: int) -> list[int]:
    return [i % 2 for i in range(n)] if Z is not None else [0] * n


def test_dense_store_converts_with_every_record_identical(tmp_path):
    x = np.random.default_rng(0).normal(size=(300, 4, 5)).astype(np.float32)
    write_store(tmp_path / "old", dense_records(x), codecs=_mixed_codecs(300),
                schema={"kind": "dense", "dtype": "float32", "shape": [4, 5]}, chunk_bytes=4000)
    assert len([n for n in os.listdir(tmp_path / "old") if n[0].isdigit()]) > 5
    col = _only(loaderx.convert(tmp_path / "old", tmp_path / "new", progress=False))
    assert isinstance(col, DenseStore)
    assert (col.dtype, col.item_shape, len(col)) == (np.float32, (4, 5), 300)
    got = col[np.arange(300)]
    assert got.tobytes() == x.tobytes()
    manifest = read_manifest(tmp_path / "new")
    assert manifest["source"]["type"] == "loaderx-original"
    assert manifest["source"]["format_version"] == 1


def test_ragged_rows_keep_their_shape_from_row_shape_and_logic_length(tmp_path):
    rng = np.random.default_rng(1)
    docs = [rng.normal(size=(int(n), 3)).astype(np.float64) for n in rng.integers(0, 9, 120)]
    docs[5] = np.zeros((0, 3))  # an empty record
    write_store(tmp_path / "old", [d.tobytes() for d in docs], codecs=_mixed_codecs(120),
                schema={"kind": "ragged", "dtype": "float64", "shape": [3]}, chunk_bytes=2000)
    col = _only(loaderx.convert(tmp_path / "old", tmp_path / "new", progress=False))
    assert isinstance(col, RaggedStore)
    got = col[np.arange(120)]
    assert [g.shape for g in got] == [d.shape for d in docs]
    assert all(g.tobytes() == d.tobytes() for g, d in zip(got, docs))


def test_ragged_without_row_shape_gives_one_dimensional_records(tmp_path):
    docs = [np.arange(n, dtype=np.int32) for n in (3, 0, 7, 1)]
    write_store(tmp_path / "old", [d.tobytes() for d in docs],
                schema={"kind": "ragged", "dtype": "int32", "shape": []})
    got = _only(loaderx.convert(tmp_path / "old", tmp_path / "new", progress=False))[[0, 1, 2, 3]]
    assert [g.tolist() for g in got] == [d.tolist() for d in docs]


def test_schema_strings_written_as_msgpack_bin_are_read(tmp_path):
    import msgpack

    write_store(tmp_path / "old", [np.full(20, i, np.int32).tobytes() for i in range(3)])
    (tmp_path / "old" / "schema.msgpack").write_bytes(msgpack.packb(
        {b"kind": b"dense", b"dtype": b"int32", b"shape": [4, 5]}, use_bin_type=True))
    col = _only(loaderx.convert(tmp_path / "old", tmp_path / "new", progress=False))
    assert col.item_shape == (4, 5) and col[2].tolist() == [[2] * 5] * 4


@needs_zstd
def test_bytes_store_keeps_its_trained_dictionary_at_level_19(tmp_path):
    records = [json.dumps({"id": i, "user": f"name{i % 50}", "tags": ["a", "b"][: i % 3]}).encode()
               for i in range(3000)]
    dictionary = Z.train(records, 4096)
    codecs = [2 if i % 5 else 0 for i in range(3000)]
    write_store(tmp_path / "old", records, codecs=codecs, dictionary=dictionary)
    col = _only(loaderx.convert(tmp_path / "old", tmp_path / "new", progress=False))
    assert isinstance(col, Zrecord)
    assert (col.codec, col.level) == ("zstd_dict", 19)
    assert col.dictionary() == dictionary
    assert col[np.arange(3000)] == records
    # codec="raw" is still honoured; so is an explicit level.
    raw = _only(loaderx.convert(tmp_path / "old", tmp_path / "raw", codec="raw", progress=False))
    assert raw.codec == "raw" and raw[np.arange(3000)] == records
    lvl = _only(loaderx.convert(tmp_path / "old", tmp_path / "l5", level=5, progress=False))
    assert (lvl.codec, lvl.level) == ("zstd_dict", 5)


def test_workers_convert_disjoint_ranges_in_order(tmp_path):
    records = [bytes([i % 251]) * (i % 97) for i in range(2000)]
    write_store(tmp_path / "old", records, codecs=_mixed_codecs(2000), chunk_bytes=10_000)
    col = _only(loaderx.convert(tmp_path / "old", tmp_path / "new", workers=2, progress=False))
    assert len(col.shards) == 2
    assert col[np.arange(2000)] == records


def test_entries_after_the_header_length_are_not_records(tmp_path):
    write_store(tmp_path / "old", [b"abc", b"defg", b"hi"])
    with open(tmp_path / "old" / "meta.zr", "r+b") as f:
        f.seek(12)
        f.write((2).to_bytes(4, "little"))  # the header counts two: the third was never committed
    col = _only(loaderx.convert(tmp_path / "old", tmp_path / "new", progress=False))
    assert col[[0, 1]] == [b"abc", b"defg"] and len(col) == 2


# ----------------------------------------------------------------- schema and options


def test_unreadable_schema_names_the_options_and_they_apply(tmp_path):
    x = np.arange(60, dtype=np.int64).reshape(10, 6)
    write_store(tmp_path / "old", dense_records(x))
    (tmp_path / "old" / "schema.msgpack").write_bytes(b"\xc1 not msgpack")
    with pytest.raises(CorruptStoreError, match=r"schema\.msgpack.*dtype=DTYPE and item_shape="):
        loaderx.convert(tmp_path / "old", tmp_path / "new", progress=False)
    _nothing_left(tmp_path, tmp_path / "new")
    dense = _only(loaderx.convert(tmp_path / "old", tmp_path / "new", dtype="int64",
                                  item_shape=(6,), progress=False))
    assert isinstance(dense, DenseStore) and dense[np.arange(10)].tobytes() == x.tobytes()
    ragged = _only(loaderx.convert(tmp_path / "old", tmp_path / "rag", dtype="int64",
                                   progress=False))
    assert isinstance(ragged, RaggedStore) and ragged[3].tolist() == x[3].tolist()


def test_a_schema_without_a_known_kind_is_unreadable(tmp_path):
    write_store(tmp_path / "old", [b"\0" * 8], schema={"kind": "tensor", "dtype": "int8"})
    with pytest.raises(CorruptStoreError, match=r"kind is 'tensor'.*dtype=DTYPE"):
        loaderx.convert(tmp_path / "old", tmp_path / "new", progress=False)


def test_options_that_do_not_fit_the_records_are_refused_by_entry(tmp_path):
    write_store(tmp_path / "old", [b"\0" * 24, b"\0" * 20])
    with pytest.raises(CorruptStoreError, match=r"meta\.zr: entry 1 holds 20 bytes, not the 24"):
        loaderx.convert(tmp_path / "old", tmp_path / "new", dtype="float64", item_shape=(3,),
                        progress=False)
    with pytest.raises(CorruptStoreError, match=r"entry 1 holds 20 bytes, not a whole number"):
        loaderx.convert(tmp_path / "old", tmp_path / "new", dtype="float64", progress=False)
    _nothing_left(tmp_path, tmp_path / "new")


def test_dtype_and_item_shape_apply_only_to_original_stores(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((4, 32), np.float32))
    with pytest.raises(ConvertError, match="stores written by the original loaderx"):
        loaderx.convert(tmp_path / "a.npy", tmp_path / "new", dtype="float32", progress=False)


# ----------------------------------------------------------------- damage


def _damage_cases():
    def bad_magic(p):
        with open(p / "meta.zr", "r+b") as f:
            f.write(b"ZREX")

    def truncated_meta(p):
        os.truncate(p / "meta.zr", 16 + 16 * 7 + 5)

    def short_header(p):
        os.truncate(p / "meta.zr", 10)

    def past_chunk(p):
        patch_entry(p, 4, phys_length=10_000, logic_length=10_000)

    def missing_chunk(p):
        os.remove(p / "1.zr")

    def unknown_codec(p):
        patch_entry(p, 6, codec=7)

    def raw_sizes(p):
        patch_entry(p, 2, logic_length=3)

    return [
        (bad_magic, r"meta\.zr: bad magic b'ZREX'"),
        (truncated_meta, r"meta\.zr: the header counts 20 records .* truncated at entry 7"),
        (short_header, r"meta\.zr: 10 bytes, shorter than its 16-byte header"),
        (past_chunk, r"0\.zr: entry 4 \(offset 400, phys_length 10,000\) ends past the end"),
        (missing_chunk, r"1\.zr: missing, but entry 10 is stored in it"),
        (unknown_codec, r"meta\.zr: entry 6 has codec 7"),
        (raw_sizes, r"meta\.zr: entry 2 is stored raw but its phys_length 100 differs"),
    ]


@pytest.mark.parametrize("damage, message", _damage_cases(), ids=lambda v: getattr(v, "__name__", ""))
def test_damaged_store_names_file_and_entry_and_leaves_nothing(tmp_path, damage, message, cli):
    old = tmp_path / "old"
    write_store(old, [bytes([i]) * 100 for i in range(20)], chunk_bytes=1000)
    damage(old)
    with pytest.raises(CorruptStoreError, match=message) as info:
        loaderx.convert(old, tmp_path / "new", progress=False)
    assert str(old) in str(info.value)
    _nothing_left(tmp_path, tmp_path / "new")
    out = cli("info", str(old))
    assert out.returncode == 1 and "CorruptStore" not in out.stderr
    assert "a damaged store written by the original loaderx" in out.stderr


@needs_zstd
def test_a_bad_frame_found_mid_conversion_leaves_nothing(tmp_path, cli):
    old = tmp_path / "old"
    records = [bytes(range(256)) * 4 for _ in range(400)]
    entries = write_store(old, records, codecs=[1] * 400, chunk_bytes=1 << 30)
    e = entries[350]
    with open(old / "0.zr", "r+b") as f:  # record 350's frame header
        f.seek(e["offset"])
        f.write(b"\0\0\0\0")
    # Small batches: records 0..349 are written before the damage is met.
    with pytest.raises(CorruptStoreError, match=r"0\.zr: entry 350 \(zstd, offset [\d,]+, "
                       r"phys_length \d+\) does not decode to its 1,024 bytes"):
        loaderx.convert(old, tmp_path / "new", batch_bytes=4096, progress=False)
    _nothing_left(tmp_path, tmp_path / "new")
    assert cli("verify", str(old)).returncode == 1


@needs_zstd
def test_dictionary_records_without_dict_zr_are_damage(tmp_path):
    records = [b"hello world %d" % i for i in range(50)]
    write_store(tmp_path / "old", records, codecs=[2] * 50, dictionary=Z.train(records * 20, 1024))
    os.remove(tmp_path / "old" / "dict.zr")
    with pytest.raises(CorruptStoreError, match=r"dict\.zr: missing, but entry 0 is compressed"):
        loaderx.convert(tmp_path / "old", tmp_path / "new", progress=False)


# ----------------------------------------------------------------- the CLI


@needs_zstd
def test_cli_info_verify_and_convert(tmp_path, cli):
    x = np.arange(200 * 8, dtype=np.uint16).reshape(200, 8)
    write_store(tmp_path / "old", dense_records(x), codecs=[1] * 200,
                schema={"kind": "dense", "dtype": "uint16", "shape": [8]}, version=3)
    info = cli("info", str(tmp_path / "old"))
    assert info.returncode == 0, info.stderr
    assert "a store of the original loaderx 0.9, format version 3" in info.stdout
    assert "converts to a DenseStore uint16[8]" in info.stdout
    assert f"loaderx convert {tmp_path / 'old'} DEST" in info.stdout
    report = json.loads(cli("info", "--json", str(tmp_path / "old")).stdout)
    assert (report["records"], report["codecs"], report["format_version"]) == (200, {"zstd": 200}, 3)
    verify = cli("verify", str(tmp_path / "old"))
    assert verify.returncode == 0 and "ok: 200 records of a store written by the original" in \
        verify.stdout and "loaderx convert" in verify.stdout
    compact = cli("compact", str(tmp_path / "old"))
    assert compact.returncode == 1 and "does not change: loaderx convert" in compact.stderr
    conv = cli("convert", str(tmp_path / "old"), str(tmp_path / "new"), "-q")
    assert conv.returncode == 0, conv.stderr
    assert _only(loaderx.open_dataset(tmp_path / "new"))[np.arange(200)].tobytes() == x.tobytes()
    new_info = cli("info", str(tmp_path / "new"))
    assert "loaderx dataset manifest version 2" in new_info.stdout
    assert f"loaderx store format {_abi.FORMAT_VERSION}" in new_info.stdout


def test_cli_convert_takes_dtype_and_item_shape(tmp_path, cli):
    write_store(tmp_path / "old", [np.full(6, i, np.int16).tobytes() for i in range(5)])
    (tmp_path / "old" / "schema.msgpack").write_bytes(b"\x93")  # an array cut short
    bad = cli("convert", str(tmp_path / "old"), str(tmp_path / "new"), "-q")
    assert bad.returncode == 1 and "--dtype DTYPE and --item-shape SHAPE" in bad.stderr
    ok = cli("convert", str(tmp_path / "old"), str(tmp_path / "new"), "-q", "--dtype", "int16",
             "--item-shape", "2,3", "--allow-tiny-records")
    assert ok.returncode == 0, ok.stderr
    col = _only(loaderx.open_dataset(tmp_path / "new"))
    assert col.item_shape == (2, 3) and col[4].tolist() == [[4] * 3] * 2


def test_a_loaderx_store_is_not_taken_for_an_original_one(tmp_path, cli):
    with DenseStore(tmp_path / "s", np.int32, (2,)) as s:
        s.append(np.zeros((3, 2), np.int32))
    out = cli("info", str(tmp_path / "s"))
    assert out.returncode == 0 and f"loaderx store format {_abi.FORMAT_VERSION}" in out.stdout


def test_opening_an_original_store_says_to_convert_it(tmp_path):
    write_store(tmp_path / "old", [b"abcd"] * 3)
    for opener in (loaderx.open_store, Zrecord, DenseStore):
        with pytest.raises(NotAStoreError, match=r"written by the original loaderx .*convert"):
            opener(tmp_path / "old")


# ----------------------------------------------------------------- files that are not files


def _within(seconds, *args):
    """The CLI on `args`, which must end (not block) within `seconds`."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    try:
        return subprocess.run([sys.executable, "-m", "loaderx", *args], capture_output=True,
                              text=True, env=env, timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"loaderx {' '.join(args)} blocked for {seconds} s")


@pytest.mark.parametrize("name", ["0.zr", "schema.msgpack", "meta.zr"])
def test_a_fifo_in_an_original_store_is_refused_by_name_not_waited_on(tmp_path, name):
    # Before: open() of a FIFO waits for a writer that never comes.
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    write_store(tmp_path / "old", dense_records(x),
                schema={"kind": "dense", "dtype": "float32", "shape": [4]})
    os.remove(tmp_path / "old" / name)
    os.mkfifo(tmp_path / "old" / name)
    for args in (("convert", str(tmp_path / "old"), str(tmp_path / "new"), "-q"),
                 ("info", str(tmp_path / "old")), ("verify", str(tmp_path / "old"))):
        out = _within(30, *args)
        assert out.returncode == 1, out.stdout
        assert f"{tmp_path / 'old' / name}: is a FIFO (named pipe), not a regular file" \
            in out.stderr, out.stderr
    _nothing_left(tmp_path, tmp_path / "new")


def test_a_symbolic_link_in_an_original_store_is_not_followed(tmp_path):
    write_store(tmp_path / "old", [b"abcd"] * 3)
    os.rename(tmp_path / "old" / "0.zr", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", tmp_path / "old" / "0.zr")
    with pytest.raises(CorruptStoreError, match=r"0\.zr: is a symbolic link, not a regular file"):
        loaderx.convert(tmp_path / "old", tmp_path / "new", progress=False)
    _nothing_left(tmp_path, tmp_path / "new")
