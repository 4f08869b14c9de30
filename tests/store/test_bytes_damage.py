"""The byte store refusing bad input and damaged stores.

8. Bad input and damaged stores (meta, commit, data, index, single records,
   forged table entries) raise clear loaderx errors; nothing is lost.
9. The ABI reports at least one lane."""
from __future__ import annotations

import os
import random
import struct
import sys
import time

import numpy as np
import pytest

from loaderx import TokenWindows, errors
from loaderx._lib import lib
from loaderx.errors import (
    ClosedError,
    CorruptStoreError,
    DictionaryError,
    InvalidArgumentError,
    LockedError,
    NewerFormatError,
    NotAStoreError,
    RecordIndexError,
    SizeMismatchError,
    StoreNotFoundError,
)
from loaderx.zrecord import DenseStore, RaggedStore, Zrecord, ZrecordError, train_dict  # noqa: F401
from _lxformat import COMMIT_OFFSET, LOC, flip, patch, record_loc, restore, snapshot
from _lxlayout import SEED_COMMIT as COMMIT_CHECKSUM_SEED
from _lxlayout import SEED_HEADER as HEADER_CHECKSUM_SEED
from _xxhash import xxh64
from _bytestore import CODECS, json_dict, json_records, open_store, payload, run_isolated


# ----------------------------------------------------------------- 8. bad input, damaged stores

def _small_store(path, codec: str = "zstd") -> list[bytes]:
    recs = [payload(i, 5) for i in range(60)] + [json_records(1, 3)[0] * 3, b"tail" * 50]
    with open_store(path, codec) as z:
        z.append(recs)
    return recs


def _assert_refused(path, exc_type, *words: str) -> ZrecordError:
    """Opening (with and without create) fails with `exc_type`, a message that
    names the path and `words`, and changes no byte of the store."""
    before = snapshot(path)
    for create in (False, True):
        with pytest.raises(exc_type) as ei:
            Zrecord(path, create=create)
        err = ei.value
        assert isinstance(err, ZrecordError)
        msg = str(err)
        assert str(path) in msg, msg
        for w in words:
            assert w in msg, f"{w!r} not in {msg!r}"
        assert snapshot(path) == before, "a refused open changed the store's files"
    return err


def test_missing_path_without_create(tmp_path):
    for p in (tmp_path / "nothing", tmp_path / "a" / "b" / "c"):
        with pytest.raises(FileNotFoundError) as ei:
            Zrecord(p)
        assert isinstance(ei.value, StoreNotFoundError) and isinstance(ei.value, ZrecordError)
        assert str(p) in str(ei.value) and "no store" in str(ei.value)
    assert os.listdir(tmp_path) == [], "opening a missing store created something"


def test_directory_or_file_that_is_not_a_store(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NotAStoreError) as ei:
        Zrecord(empty)
    assert str(empty) in str(ei.value) and "no loaderx store" in str(ei.value)
    assert os.listdir(empty) == []

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_bytes(b"precious")
    for create in (False, True):
        with pytest.raises(NotAStoreError) as ei:
            Zrecord(foreign, create=create)
        assert str(foreign) in str(ei.value)
    assert (foreign / "notes.txt").read_bytes() == b"precious"
    assert not (foreign / "meta").exists() and not (foreign / "data").exists()

    plain = tmp_path / "plain.bin"
    plain.write_bytes(b"just a file")
    for create in (False, True):
        with pytest.raises(NotAStoreError) as ei:
            Zrecord(plain, create=create)
        assert str(plain) in str(ei.value) and "file" in str(ei.value)
    assert plain.read_bytes() == b"just a file"


def test_refused_create_in_a_foreign_directory_leaves_nothing_behind(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_bytes(b"precious")
    with pytest.raises(NotAStoreError):
        Zrecord(foreign, create=True)
    assert sorted(os.listdir(foreign)) == ["notes.txt"], "a refused create left files in the user's directory"


def test_truncated_meta(tmp_path):
    path = tmp_path / "s"
    recs = _small_store(path)
    good = snapshot(path)
    for size in (0, 50, 104, COMMIT_OFFSET, COMMIT_OFFSET + 40, 8192, len(good["meta"]) - 1):
        restore(path, good)
        os.truncate(path / "meta", size)
        _assert_refused(path, CorruptStoreError, "meta", "truncated")
    restore(path, good)
    with Zrecord(path) as z:
        assert z[:] == recs


def test_garbled_meta_header_and_commit(tmp_path):
    path = tmp_path / "s"
    recs = _small_store(path)
    good = snapshot(path)
    meta = path / "meta"
    cases = [
        (24, CorruptStoreError, "checksum"),      # flags
        (33, CorruptStoreError, "checksum"),      # dict_size
        (60, CorruptStoreError, "checksum"),      # reserved
        (104, CorruptStoreError, "checksum"),     # the checksum itself
        (12, CorruptStoreError, "header"),        # header_size
        (0, NotAStoreError, "magic"),             # magic
        (COMMIT_OFFSET + 0, CorruptStoreError, "commit"),   # record_count
        (COMMIT_OFFSET + 9, CorruptStoreError, "commit"),   # data_size
        (COMMIT_OFFSET + 56, CorruptStoreError, "commit"),  # commit checksum
        (8192, CorruptStoreError, "checksum"),    # the identity blob
    ]
    for offset, exc, word in cases:
        restore(path, good)
        flip(meta, offset)
        _assert_refused(path, exc, word)
    # A store written with the other byte order is named as such.
    restore(path, good)
    patch(meta, 0, good["meta"][0:8][::-1])
    _assert_refused(path, NotAStoreError, "byte order")
    restore(path, good)
    with Zrecord(path) as z:
        assert z[:] == recs
        z.verify()


def test_forged_commit_is_checked_against_the_files(tmp_path):
    path = tmp_path / "s"
    _small_store(path)
    good = snapshot(path)
    commit = bytearray(good["meta"][COMMIT_OFFSET:COMMIT_OFFSET + 64])
    # A commit with a valid checksum that claims more synced records than the index holds.
    commit[0:8] = (10 ** 6).to_bytes(8, "little")
    commit[24:32] = (10 ** 6).to_bytes(8, "little")
    commit[56:64] = xxh64(bytes(commit[:56]), COMMIT_CHECKSUM_SEED).to_bytes(8, "little")
    patch(path / "meta", COMMIT_OFFSET, bytes(commit))
    _assert_refused(path, CorruptStoreError, "truncated")


def test_unsynced_records_missing_from_the_files_are_dropped_at_open(tmp_path):
    """A commit counting records appended after the last sync whose bytes never
    reached the files (what a power loss leaves) opens with the synced prefix:
    the durability contract, not a damaged store."""
    path = tmp_path / "s"
    recs = _small_store(path)
    good = snapshot(path)
    commit = bytearray(good["meta"][COMMIT_OFFSET:COMMIT_OFFSET + 64])
    commit[0:8] = (10 ** 6).to_bytes(8, "little")
    commit[56:64] = xxh64(bytes(commit[:56]), COMMIT_CHECKSUM_SEED).to_bytes(8, "little")
    patch(path / "meta", COMMIT_OFFSET, bytes(commit))
    with Zrecord(path) as z:
        assert z[:] == recs
        z.verify()


def test_truncated_data_and_index_files(tmp_path):
    path = tmp_path / "s"
    recs = _small_store(path)
    good = snapshot(path)
    for name, cut in (("data", 1), ("data", len(good["data"])), ("index", 1), ("index", 32), ("index", len(good["index"]))):
        restore(path, good)
        os.truncate(path / name, len(good[name]) - cut)
        _assert_refused(path, CorruptStoreError, name, "truncated")
    for name in ("data", "index"):
        restore(path, good)
        os.remove(path / name)
        _assert_refused(path, CorruptStoreError, name)
    restore(path, good)
    with Zrecord(path) as z:
        assert z[:] == recs


def test_newer_format_version(tmp_path):
    path = tmp_path / "s"
    recs = _small_store(path)
    good = snapshot(path)
    header = bytearray(good["meta"][:112])
    assert xxh64(b"") == 0xEF46DB3751D8E999
    stored = int.from_bytes(header[104:112], "little")
    assert xxh64(bytes(header[:104]), HEADER_CHECKSUM_SEED) == stored, "the checksum recipe does not match"
    assert int.from_bytes(header[8:12], "little") == lib.lx_format_version()

    # A newer version with a valid checksum: a store this loaderx cannot read.
    newer = lib.lx_format_version() + 1
    header[8:12] = newer.to_bytes(4, "little")
    header[104:112] = xxh64(bytes(header[:104]), HEADER_CHECKSUM_SEED).to_bytes(8, "little")
    patch(path / "meta", 0, bytes(header))
    err = _assert_refused(path, NewerFormatError, "newer", str(newer))
    assert err.code == -6

    # A changed version without a valid checksum is still a clear loaderx error.
    restore(path, good)
    patch(path / "meta", 8, (7).to_bytes(4, "little"))
    _assert_refused(path, ZrecordError)

    # A header with a valid checksum but an unknown codec.
    restore(path, good)
    header = bytearray(good["meta"][:112])
    header[16] = 9
    header[104:112] = xxh64(bytes(header[:104]), HEADER_CHECKSUM_SEED).to_bytes(8, "little")
    patch(path / "meta", 0, bytes(header))
    _assert_refused(path, CorruptStoreError, "codec")

    restore(path, good)
    with Zrecord(path) as z:
        assert z[:] == recs


def test_index_out_of_range(tmp_path):
    path = tmp_path / "s"
    recs = _small_store(path)
    n = len(recs)
    with Zrecord(path) as z:
        for key in (n, -n - 1, [0, n], [n + 5], np.array([1, n], dtype=np.uint64), [-n - 1], 2 ** 63):
            with pytest.raises(IndexError) as ei:
                z[key]
            assert isinstance(ei.value, RecordIndexError)
            assert "out of range" in str(ei.value) and str(n) in str(ei.value)
        with pytest.raises(IndexError):
            z.gather([n], out=bytearray(10), packed=True)
        with pytest.raises(IndexError):
            z.delete([0, n])
        with pytest.raises(TypeError):
            z[1.5]
        assert z[:] == recs
    empty = tmp_path / "empty"
    with Zrecord(empty, create=True) as e:
        with pytest.raises(IndexError):
            e[0]
        assert e[:] == [] and e[[]] == []


def test_non_bytes_record_is_refused(tmp_path):
    with Zrecord(tmp_path / "s", create=True) as z:
        z.append([b"keep"])
        for bad in ([b"ok", 5], [None], ["text"], [b"ok", object()], [1.5]):
            with pytest.raises(TypeError) as ei:
                z.append(bad)
            assert "bytes" in str(ei.value)
            assert len(z) == 1
        assert z[:] == [b"keep"]
        z.verify()


def test_append_with_a_bad_record_late_in_a_large_call_commits_nothing(tmp_path):
    """`append` is documented as atomic per call (zrecord.py): a call that raises
    must not leave part of its records behind."""
    with Zrecord(tmp_path / "s", create=True, codec="raw") as z:
        with pytest.raises(TypeError):
            z.append([b"r"] * 20_000 + [5])
        assert len(z) == 0, f"a failed append left {len(z)} of its records in the store"


def test_use_after_close(tmp_path):
    path = tmp_path / "s"
    z = Zrecord(path, create=True)
    z.append([b"x"])
    z.close()
    z.close()  # idempotent
    assert z.closed and "closed" in repr(z)
    ops = [len, lambda s: s[0], lambda s: s.append([b"y"]), lambda s: s.delete([0]), lambda s: s.compact(),
           lambda s: s.stats(), lambda s: s.verify(), lambda s: s.sync(), lambda s: s.gather([0]),
           lambda s: s.gather([0], out=bytearray(1), packed=True), lambda s: s.dictionary(),
           lambda s: s.__enter__()]
    for op in ops:
        with pytest.raises(ClosedError) as ei:
            op(z)
        assert str(path) in str(ei.value) and "closed" in str(ei.value)
    with Zrecord(path) as w:
        assert w[:] == [b"x"]
    with pytest.raises(ClosedError):
        w[0]
    w.close()


@pytest.mark.parametrize("codec", CODECS)
def test_flipped_byte_in_a_record(tmp_path, codec):
    path = tmp_path / "s"
    recs = _small_store(path, codec)
    victim = len(recs) - 2  # a ~600-byte JSON record
    offset, stored, raw, _, rec_codec, _, aux = record_loc(path, victim)
    assert raw == len(recs[victim]) and aux == 0
    if codec != "raw":
        assert rec_codec != 0 and stored < raw, "the victim should be compressed"
    good = (path / "data").read_bytes()
    positions = range(offset, offset + stored) if codec != "raw" else [offset, offset + stored // 2, offset + stored - 1]
    silent = []
    for pos in positions:
        (path / "data").write_bytes(good)
        flip(path / "data", pos, 0x20)
        with Zrecord(path) as z:
            with pytest.raises(CorruptStoreError) as ei:
                z.verify()
            assert f"record {victim}" in str(ei.value)
            try:
                got = z[victim]
            except ZrecordError:
                pass
            else:
                assert len(got) == len(recs[victim])
                if codec != "raw" and got != recs[victim]:
                    silent.append(pos - offset)
            # Every other record is still intact.
            others = [i for i in range(len(recs)) if i != victim]
            assert z[others] == [recs[i] for i in others]
    (path / "data").write_bytes(good)
    with Zrecord(path) as z:
        z.verify()
        assert z[:] == recs
    assert not silent, (f"{codec}: gathering record {victim} with one flipped byte returned wrong bytes "
                        f"without an error for {len(silent)} of {stored} byte positions, e.g. {silent[:8]}")


def test_damaged_index_entries_are_reported(tmp_path):
    path = tmp_path / "s"
    recs = _small_store(path, "zstd")
    good = snapshot(path)
    victim = 1
    base = victim * LOC.size
    cases = [
        (0, struct.pack("<Q", 1 << 60), "data"),          # offset far outside the data file
        (8, struct.pack("<Q", 1 << 62), "data"),          # stored size far too large
        (16, struct.pack("<Q", len(recs[victim]) + 1), "record 1"),  # wrong decoded size
        (28, bytes([9]), "codec"),                        # unknown codec
    ]
    for field, value, word in cases:
        restore(path, good)
        patch(path / "index", base + field, value)
        with Zrecord(path) as z:
            assert z[0] == recs[0]
            for read in (lambda: z[victim], lambda: z[:], lambda: z.gather([victim], out=bytearray(1 << 16), packed=True)):
                with pytest.raises(CorruptStoreError) as ei:
                    read()
                assert word in str(ei.value)
            with pytest.raises(CorruptStoreError):
                z.verify()
            assert z[2:] == recs[2:]
    restore(path, good)
    with Zrecord(path) as z:
        assert z[:] == recs


def test_damaged_index_entry_with_a_huge_size_is_a_loaderx_error(tmp_path):
    path = tmp_path / "s"
    recs = _small_store(path, "zstd")
    patch(path / "index", 1 * LOC.size + 16, struct.pack("<Q", 1 << 40))  # raw_size: 1 TiB
    problems = []
    with Zrecord(path) as z:
        assert z[0] == recs[0]
        for what, call, want in (("verify()", z.verify, CorruptStoreError), ("z[1]", lambda: z[1], ZrecordError)):
            try:
                call()
            except want:
                pass
            except Exception as e:
                problems.append(f"{what} raised {type(e).__name__}: {e}")
            else:
                problems.append(f"{what} raised nothing")
        assert z[2:] == recs[2:]
    assert not problems, problems


_SIGBUS_PROBE = r"""
import struct, sys
from loaderx.zrecord import Zrecord, CorruptStoreError
p = sys.argv[1]
with Zrecord(p, create=True, codec="raw") as z:
    z.append([b"a" * 100, b"b" * 100, b"c" * 100])
# Record 0 now claims to start 64 KiB into a 300-byte data file.
with open(p + "/index", "r+b") as f:
    f.write(struct.pack("<Q", 64 << 10))
z = Zrecord(p)
assert z[1] == b"b" * 100  # maps the data file
try:
    z[0]
except CorruptStoreError as e:
    print("CORRUPT", e)
else:
    print("NO ERROR")
"""


def test_damaged_index_entry_inside_the_mapping_does_not_crash(tmp_path):
    res = run_isolated(_SIGBUS_PROBE, str(tmp_path / "s"))
    assert res.returncode == 0, (f"the reader process died (rc={res.returncode}, "
                                 f"signal {-res.returncode if res.returncode < 0 else None}); stderr: {res.stderr[-2000:]}")
    assert "CORRUPT" in res.stdout, res.stdout + res.stderr


def test_unknown_codec_is_a_loaderx_error(tmp_path):
    p = tmp_path / "s"
    with pytest.raises(ValueError) as ei:
        Zrecord(p, create=True, codec="lz4")
    assert "lz4" in str(ei.value) and "zstd" in str(ei.value)
    assert not p.exists()
    # SPEC §3: errors share one base, ZrecordError, whose message names the path.
    assert isinstance(ei.value, ZrecordError), f"unknown codec raised a plain {type(ei.value).__name__}, not a loaderx error"
    assert str(p) in str(ei.value)


def test_bad_dictionary_arguments(tmp_path):
    p = tmp_path / "s"
    d = json_dict()
    cases = [
        ({"codec": "zstd", "dict_bytes": d}, "dict_bytes"),
        ({"codec": "raw", "dict_bytes": d}, "dict_bytes"),
        ({"codec": "zstd_dict"}, "dict_bytes"),
        ({"codec": "zstd_dict", "dict_bytes": b""}, "dict_bytes"),
        ({"codec": "zstd_dict", "dict_bytes": b"garbage!" * 100}, "not a zstd dictionary"),
        ({"codec": "zstd_dict", "dict_bytes": b"\x37\xa4\x30\xec" + random.Random(1).randbytes(2000)}, "dictionary"),
        ({"codec": "zstd_dict", "dict_bytes": d[:8]}, "dictionary"),
    ]
    for kw, word in cases:
        with pytest.raises(DictionaryError) as ei:
            Zrecord(p, create=True, **kw)
        assert isinstance(ei.value, ZrecordError) and isinstance(ei.value, ValueError)
        assert word in str(ei.value) and str(p) in str(ei.value), str(ei.value)
        assert not p.exists(), f"{kw['codec']}: a refused create left {p} behind"

    with pytest.raises(errors.InvalidArgumentError) as ei:
        Zrecord(p, create=True, codec="zstd", level=100)
    assert "level" in str(ei.value)
    assert not p.exists()

    with pytest.raises(DictionaryError):
        train_dict([b"x"] * 3, tier="fast")
    with pytest.raises(ValueError):
        train_dict(json_records(100), tier="nope")


@pytest.mark.parametrize("bad", [-1, 1.5, None, True, 2**40])
def test_threads_argument_is_checked_by_every_gather(tmp_path, bad):
    """Before the fix, ``threads=-1`` raised cffi's "can't convert negative
    number to unsigned", ``threads=1.5`` "an integer is required" (neither
    naming `threads`), and ``threads=True`` ran with one thread."""
    with RaggedStore(tmp_path / "r", np.int32) as rs, \
            DenseStore(tmp_path / "d", np.int32, ()) as ds, \
            Zrecord(tmp_path / "z", create=True) as z:
        rs.append([np.arange(9, dtype=np.int32)])
        ds.append(np.arange(3, dtype=np.int32))
        z.append([b"x"])
        tw = TokenWindows(rs, 4)
        calls = [lambda: ds.gather([0], threads=bad), lambda: rs.gather([0], threads=bad),
                 lambda: rs.gather([0], packed=True, threads=bad), lambda: z.gather([0], threads=bad),
                 lambda: tw.gather([0], threads=bad), lambda: tw.segments.gather([0], threads=bad)]
        for call in calls:
            with pytest.raises((TypeError, ValueError), match="threads"):
                call()
        assert ds.gather([2], threads=np.int64(1)).tolist() == [2]


def test_zrecord_append_takes_any_bytes_like_record(tmp_path):
    """Before the fix, a non-contiguous memoryview record raised "memoryview:
    casts are restricted to C-contiguous views", an object array "Cannot change
    data-type for array of references", and ``z.append(b"abc")`` said
    "record 0 is a int"; none named the record or the mistake."""
    with Zrecord(tmp_path / "z", create=True) as z:
        strided = memoryview(np.arange(16, dtype=np.int16).reshape(4, 4))[::2]
        z.append([strided])
        assert z[0] == np.arange(16, dtype=np.int16).reshape(4, 4)[::2].tobytes()
        z.append_packed(memoryview(b"abcdef")[::2], [0, 1, 3])
        assert z[1:] == [b"a", b"ce"]
        with pytest.raises(TypeError, match="record 1 .*object"):
            z.append([b"ok", np.array([b"a", None], dtype=object)])
        with pytest.raises(TypeError, match="data .*object"):
            z.append_packed(np.array([b"a"], dtype=object), [0, 1])
        with pytest.raises(TypeError, match="iterable of records"):
            z.append(b"abc")
        assert len(z) == 3


@pytest.mark.parametrize("make", [
    lambda: np.zeros((3, 2), np.uint8, order="F"),
    lambda: np.zeros((3, 4), np.uint8)[:, :2],
    lambda: np.zeros(8, np.int32)[::2],
    lambda: memoryview(bytearray(12))[::2],
])
def test_gather_out_refuses_a_buffer_it_cannot_fill_in_place(tmp_path, make):
    """Before the fix, a Fortran-order or sliced 2-D `out` was filled through a
    temporary copy: gather_into (now ``gather(out=, packed=True)``) returned the
    sizes but the caller's buffer stayed zero. Strided int32 arrays and
    memoryviews raised raw numpy errors."""
    with Zrecord(tmp_path / "z", create=True) as z:
        z.append([b"abcdef"])
        out = make()
        with pytest.raises(SizeMismatchError, match="out must be C-contiguous"):
            z.gather([0], out=out, packed=True)
        assert not bytes(np.asarray(out).tobytes()).strip(b"\0")
        with pytest.raises(TypeError, match="out .*list"):
            z.gather([0], out=[0] * 8, packed=True)


def test_gather_into_offsets_past_the_buffer_do_not_wrap(tmp_path):
    """Before the fix, an offset near 2**64 wrapped the end past zero, passed
    the fit check, and numpy raised "could not broadcast ... into shape (0,)".
    (Offsets exist only in the deprecated alias.)"""
    with Zrecord(tmp_path / "z", create=True) as z:
        z.append([b"abcdef", b"x"])
        for offset in (2**64 - 2, 2**64 - 1, 11):
            with pytest.raises(SizeMismatchError, match="does not fit the 10-byte buffer"), \
                    pytest.deprecated_call():
                z.gather_into([1, 0], bytearray(10), np.array([0, offset], np.uint64))
        with pytest.raises(SizeMismatchError, match="does not fit"), pytest.deprecated_call():
            z.gather_into([0], bytearray(10), [2**63])


def test_append_from_inside_the_records_of_an_append_raises(tmp_path):
    """Before the fix, a records iterator that appended to the same store
    (a callback writing a side record, say) hung forever on the append lock
    its own caller held."""
    with Zrecord(tmp_path / "z", create=True) as z:
        def records():
            yield b"a"
            z.append([b"inner"])
            yield b"b"
        with pytest.raises(LockedError, match="append called while producing the records"):
            z.append(records())
        assert z.append([b"c"]) == 0  # the store is usable afterwards, nothing half-written
        assert z[:] == [b"c"]


def test_gather_into_refuses_fractional_offsets(tmp_path):
    """Before the fix, gather_into(offsets=[0.5]) silently truncated to 0.
    (Offsets exist only in the deprecated alias.)"""
    with Zrecord(tmp_path / "z", create=True) as z:
        z.append([b"abc"])
        with pytest.raises(TypeError, match="integers"), pytest.deprecated_call():
            z.gather_into([0], bytearray(8), offsets=[0.5])
        with pytest.raises(ValueError, match="non-negative"), pytest.deprecated_call():
            z.gather_into([0], bytearray(8), offsets=[-1])


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_a_planted_journal_symlink_is_never_followed(tmp_path):
    """Before the fix, a symlink named `journal` was followed and its target
    overwritten by the next delete."""
    path = tmp_path / "s"
    victim = tmp_path / "precious.txt"
    victim.write_bytes(b"do not touch")
    z = Zrecord(path, create=True)
    z.append([b"a", b"b"])
    os.symlink(victim, path / "journal")
    with pytest.raises(ZrecordError, match="symlink"):
        z.delete([0])
    assert victim.read_bytes() == b"do not touch"
    assert z[:] == [b"a", b"b"]
    z.close()


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_store_files_that_are_symlinks_are_refused(tmp_path):
    path = tmp_path / "s"
    with Zrecord(path, create=True) as z:
        z.append([b"a"])
    os.rename(path / "data", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", path / "data")
    with pytest.raises(ZrecordError, match="symlink"):
        Zrecord(path)


def test_a_path_with_a_nul_byte_is_refused(tmp_path):
    """Before the fix, a path containing NUL was silently cut at the NUL."""
    with pytest.raises(InvalidArgumentError, match="NUL"):
        Zrecord(str(tmp_path / "a\0b"), create=True)
    assert not (tmp_path / "a").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_creating_a_store_where_no_directory_can_be_made_fails_fast(tmp_path):
    """Before the fix, creating a store under /proc spun at 100% CPU forever
    (mkdirat looped between ENOENT and EEXIST)."""
    t0 = time.monotonic()
    with pytest.raises(ZrecordError):
        DenseStore("/proc/loaderx-no-such/store", np.float32, ())
    assert time.monotonic() - t0 < 10


# ----------------------------------------------------------------- 9. ABI

def test_abi_lanes_and_versions():
    assert lib.lx_lanes() >= 1
    assert lib.lx_format_version() >= 1
    assert lib.lx_zstd_version() >= 10500
