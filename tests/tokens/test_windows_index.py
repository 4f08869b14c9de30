"""The token window index on disk (windows.idx, src/format.zig): a crafted,
foreign, truncated or stale index file never makes TokenWindows return wrong
tokens or crash. It is checksummed and bound to its store, checked with
overflow-safe arithmetic, copied into memory (never mapped), written durably
(temporary file, fsync, rename, directory fsync), and covers only records a
power loss cannot take back. Each attack is also aimed at the index file that
loaderx releases before this one wrote (``windows-<itemsize>.idx``: a header
and the token prefix sums, memory-mapped), which must now be ignored.
"""
from __future__ import annotations

import glob
import os
import shutil
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from _lxformat import WINDOWS_INDEX_NAME, pack_windows_index, unpack_windows_index

from loaderx import RaggedStore, TokenWindows
from loaderx import _abi
from loaderx._lib import ffi, lib
from loaderx.errors import CorruptStoreError

SEQ = 8
LEGACY = struct.Struct("<8sQQQI4x")  # the earlier format: magic, generation, docs, separator, itemsize


def docs_of(seed: int, count: int, lo: int = 1, hi: int = 60):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 30000, n).astype(np.int32) for n in rng.integers(lo, hi, count)]


def windows_of(docs, seq_len=SEQ):
    flat = np.concatenate(docs)
    n = (len(flat) - 1) // seq_len
    return np.array([flat[i * seq_len:i * seq_len + seq_len + 1] for i in range(n)])


def build(path, docs):
    """A closed (synced) store of `docs` whose index files have been written."""
    with RaggedStore(path, np.int32) as rs:
        rs.append(docs)
    with RaggedStore(path) as rs:
        TokenWindows(rs, SEQ)  # writes the index
        TokenWindows(rs, SEQ)  # the earlier release maps it here


def index_files(path) -> list[str]:
    return sorted(glob.glob(os.path.join(path, "windows*.idx")))


def rewrite_ends(path, change, seal: bool = True) -> int:
    """Applies `change(list of u64) -> list` to every index file's offsets
    (windows.idx: byte ends, its checksums re-sealed unless `seal` is false;
    an earlier release's file: token prefix sums, no checksum) and returns
    how many files it changed."""
    changed = 0
    for f in index_files(path):
        raw = open(f, "rb").read()
        if os.path.basename(f) == WINDOWS_INDEX_NAME:
            h, ends = unpack_windows_index(raw)
            new = [v % 2**64 for v in change(ends)]
            out = pack_windows_index(h, new) if seal else raw[:88] + struct.pack(f"<{len(new)}Q", *new)
        else:
            head, body = raw[:LEGACY.size], raw[LEGACY.size:]
            values = list(struct.unpack(f"<{len(body) // 8}Q", body))
            new = [v % 2**64 for v in change(values)]
            out = head + struct.pack(f"<{len(new)}Q", *new)
        open(f, "wb").write(out)
        changed += 1
    return changed


def check_in_child(path, want: np.ndarray) -> None:
    """Reads every window of the store at `path` in a fresh process (a crash
    there is a failure here, not the end of the test run) and compares."""
    np.save(os.path.join(os.path.dirname(path), "want.npy"), want)
    code = textwrap.dedent(f"""
        import numpy as np
        from loaderx import RaggedStore, TokenWindows
        want = np.load({os.path.join(os.path.dirname(path), "want.npy")!r})
        with RaggedStore({str(path)!r}) as rs:
            tw = TokenWindows(rs, {SEQ})
            got = tw[np.arange(len(tw))] if len(tw) == len(want) else None
        assert got is not None, f"{{len(tw)}} windows, expected {{len(want)}}"
        np.testing.assert_array_equal(got, want)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"


def test_an_index_whose_first_gap_wraps_around_is_not_trusted(tmp_path):
    """2^63 plus the true length: `tokens * itemsize` wraps to the true size."""
    docs = docs_of(1, 150)
    build(tmp_path / "s", docs)

    def wrap(values):
        return [values[0]] + [v + 2**63 for v in values[1:]] if values[0] == 0 \
            else [v + 2**63 for v in values]
    assert rewrite_ends(tmp_path / "s", wrap)
    check_in_child(tmp_path / "s", windows_of(docs))


def test_offsets_shifted_under_a_valid_header_are_not_trusted(tmp_path):
    docs = docs_of(2, 150)
    build(tmp_path / "s", docs)
    # Every offset from document 5 on moved by one token, the header untouched.
    assert rewrite_ends(tmp_path / "s", lambda v: v[:5] + [x + (4 if x > 1000 else 1) for x in v[5:]],
                        seal=False)
    check_in_child(tmp_path / "s", windows_of(docs))


def test_the_index_of_a_similar_store_is_not_trusted(tmp_path):
    """Same document count, same generation, other lengths."""
    docs_a, docs_b = docs_of(3, 150), docs_of(4, 150)
    build(tmp_path / "a", docs_a)
    build(tmp_path / "b", docs_b)
    for f in index_files(tmp_path / "b"):
        shutil.copy(f, tmp_path / "a" / os.path.basename(f))
    check_in_child(tmp_path / "a", windows_of(docs_a))


def test_truncating_the_index_under_a_reader_does_not_crash_it(tmp_path):
    docs = docs_of(5, 3000)  # an index of several pages
    build(tmp_path / "s", docs)
    code = textwrap.dedent(f"""
        import glob, os
        import numpy as np
        from loaderx import RaggedStore, TokenWindows
        with RaggedStore({str(tmp_path / "s")!r}) as rs:
            tw = TokenWindows(rs, {SEQ})
            for f in glob.glob(os.path.join(rs.path, "windows*.idx")):
                os.truncate(f, 40)
            got = tw[np.arange(len(tw))]
        np.save({str(tmp_path / "got.npy")!r}, got)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    np.testing.assert_array_equal(np.load(tmp_path / "got.npy"), windows_of(docs))


def test_an_index_from_before_a_power_loss_is_not_trusted_after_it(tmp_path):
    """Appends that a power loss takes back, then other appends that bring the
    store to the same record count and generation: the index of the lost
    records must not describe the new ones."""
    path = tmp_path / "s"
    first, lost, later = docs_of(6, 30), docs_of(7, 20, 40, 90), docs_of(8, 20, 1, 30)
    with RaggedStore(path, np.int32) as rs:
        rs.append(first)
    synced = {n: (path / n).read_bytes() for n in ("meta", "index", "data")}
    with RaggedStore(path) as rs:
        rs.append(lost)
        TokenWindows(rs, SEQ)
    for name, data in synced.items():  # the power loss: the store as last synced
        (path / name).write_bytes(data)
    with RaggedStore(path) as rs:
        rs.append(later)
        tw = TokenWindows(rs, SEQ)
        np.testing.assert_array_equal(tw[np.arange(len(tw))], windows_of(first + later))


def test_a_damaged_or_foreign_index_file_is_rebuilt(tmp_path):
    """Every single-byte change of windows.idx (header or offsets, checksums
    left stale) and every truncation is ignored: the windows stay right and
    the file is rewritten whole."""
    docs = docs_of(9, 40)
    build(tmp_path / "s", docs)
    good = (tmp_path / "s" / WINDOWS_INDEX_NAME).read_bytes()
    want = windows_of(docs)
    for at in list(range(0, 88)) + list(range(88, len(good), 37)):
        bad = bytearray(good)
        bad[at] ^= 0x10
        (tmp_path / "s" / WINDOWS_INDEX_NAME).write_bytes(bytes(bad))
        with RaggedStore(tmp_path / "s") as rs:
            tw = TokenWindows(rs, SEQ)
            np.testing.assert_array_equal(tw[np.arange(len(tw))], want)
        assert (tmp_path / "s" / WINDOWS_INDEX_NAME).read_bytes() == good, f"byte {at}"
    for size in (0, 7, 87, 88, 96, len(good) - 1, len(good) + 8):
        (tmp_path / "s" / WINDOWS_INDEX_NAME).write_bytes((good + bytes(8))[:size])
        with RaggedStore(tmp_path / "s") as rs:
            tw = TokenWindows(rs, SEQ)
            np.testing.assert_array_equal(tw[np.arange(len(tw))], want)
        assert (tmp_path / "s" / WINDOWS_INDEX_NAME).read_bytes() == good, f"size {size}"


def test_a_resealed_index_that_lies_is_refused(tmp_path):
    """Forged with valid checksums: a future generation, more documents than
    are durable, another store's id, a decreasing offset, a size that is not
    the record's: each is rebuilt from the record table."""
    docs = docs_of(10, 60)
    build(tmp_path / "s", docs)
    f = tmp_path / "s" / WINDOWS_INDEX_NAME
    h, ends = unpack_windows_index(f.read_bytes())
    want = windows_of(docs)
    forgeries = {
        "future generation": (dict(h, generation=h["generation"] + 1), ends),
        "more durable": (dict(h, durable_count=h["durable_count"] + 1), ends),
        "other store": (dict(h, store_uid=h["store_uid"] ^ 1), ends),
        "other header": (dict(h, store_header_checksum=h["store_header_checksum"] ^ 1), ends),
        "other version": (dict(h, version=2), ends),
        "decreasing": (h, ends[:10] + [ends[9] - 4] + ends[11:]),
        "one size wrong": (h, ends[:30] + [e + 4 for e in ends[30:]]),
        "too many": (h, ends + [ends[-1] + 4]),
        "2^63 gap": (h, [e + 2**63 for e in ends]),
    }
    for name, (header, values) in forgeries.items():
        f.write_bytes(pack_windows_index(header, values))
        with RaggedStore(tmp_path / "s") as rs:
            tw = TokenWindows(rs, SEQ)
            np.testing.assert_array_equal(tw[np.arange(len(tw))], want, err_msg=name)
            rs.verify()  # the rebuilt file is right


def test_verify_checks_every_entry_of_the_index(tmp_path):
    """A forgery the construction's spot checks can miss (two odd documents
    swapped in size: 3000 documents are checked every second one, each by
    its own size; checksums re-sealed) is caught by verify(), which names
    the file; deleting it is the repair."""
    docs = docs_of(16, 3000)
    build(tmp_path / "s", docs)
    f = tmp_path / "s" / WINDOWS_INDEX_NAME
    h, ends = unpack_windows_index(f.read_bytes())
    sizes = np.diff([0] + ends)
    i = next(i for i in range(1, len(sizes) - 3, 2) if sizes[i] != sizes[i + 2])
    sizes[i], sizes[i + 2] = sizes[i + 2], sizes[i]
    f.write_bytes(pack_windows_index(h, np.cumsum(sizes).tolist()))
    with RaggedStore(tmp_path / "s") as rs:
        with pytest.raises(CorruptStoreError, match="windows.idx does not match record"):
            rs.verify()
    f.unlink()
    with RaggedStore(tmp_path / "s") as rs:
        tw = TokenWindows(rs, SEQ)
        np.testing.assert_array_equal(tw[np.arange(len(tw))], windows_of(docs))
        rs.verify()


def test_the_index_is_written_durably(tmp_path):
    """A temporary file, written and fsynced, renamed over windows.idx, then
    the directory fsynced; only records a sync() covered."""
    path = tmp_path / "s"
    with RaggedStore(path, np.int32) as rs:
        rs.append(docs_of(11, 30))
        rs.sync()
        rs.append(docs_of(12, 5))  # not durable: not in the file
        lib.lx_debug_record(1)
        try:
            TokenWindows(rs, SEQ)
            n = ffi.new("uint64_t *")
            assert lib.lx_debug_recording(ffi.NULL, 0, n) == 0
            buf = bytearray(n[0])
            assert lib.lx_debug_recording(ffi.from_buffer(buf), len(buf), n) == 0
        finally:
            lib.lx_debug_record(0)
    ops = {v: k for k, v in _abi.FAULT_OPS.items()}
    calls, at = [], 0
    while at < len(buf):
        name_len = struct.unpack_from("<H", buf, at + 1)[0]
        name = buf[at + 3:at + 3 + name_len].decode()
        length = struct.unpack_from("<Q", buf, at + 3 + name_len + 8)[0]
        calls.append((ops[buf[at]], name))
        at += 3 + name_len + 16 + length
    tmp = calls[0][1]
    assert tmp.startswith(WINDOWS_INDEX_NAME + ".") and tmp.endswith(".tmp")
    assert calls == [("create", tmp), ("write", tmp), ("write", tmp), ("sync", tmp),
                     ("rename", tmp), ("sync_dir", ".")]
    assert unpack_windows_index((path / WINDOWS_INDEX_NAME).read_bytes())[0]["docs"] == 30


def test_a_failing_index_write_leaves_windows_right_and_no_file_behind(tmp_path):
    """Every file-system call of the index write fails in turn (once, then for
    good): TokenWindows still reads the right windows, from memory; no
    temporary file is left (a dead disk may keep one, which the next write
    removes)."""
    docs = docs_of(13, 50)
    path = tmp_path / "s"
    with RaggedStore(path, np.int32) as rs:
        rs.append(docs)
    all_ops = sum(1 << v for v in _abi.FAULT_OPS.values())
    want = windows_of(docs)
    for sticky in (0, 1):
        for nth in range(1, 7):
            for f in index_files(path):
                os.unlink(f)
            with RaggedStore(path) as rs:
                lib.lx_debug_fault(all_ops, nth, sticky)
                try:
                    tw = TokenWindows(rs, SEQ)
                finally:
                    lib.lx_debug_fault(0, 0, 0)
                np.testing.assert_array_equal(tw[np.arange(len(tw))], want)
            left = [n for n in os.listdir(path) if n.endswith(".tmp")]
            assert sticky or not left, (nth, left)
            for f in index_files(path):
                os.unlink(f)
            with RaggedStore(path) as rs:  # and a later construction writes it
                TokenWindows(rs, SEQ)
            assert unpack_windows_index((path / WINDOWS_INDEX_NAME).read_bytes())[0]["docs"] == 50
            assert not [n for n in os.listdir(path) if n.endswith(".tmp")]


def test_a_delete_removes_the_index_first_and_a_read_only_store_keeps_it_in_memory(tmp_path):
    docs = docs_of(14, 40)
    path = tmp_path / "s"
    build(path, docs)
    (path / "windows-4.idx").write_bytes(b"left by an earlier release")
    (path / "windows.idx.0123456789abcdef.tmp").write_bytes(b"left by a killed writer")
    with RaggedStore(path) as rs:
        rs.delete([3])
    assert index_files(path) == [] and not glob.glob(str(path / "*.tmp"))
    os.chmod(path, 0o555)
    try:
        with RaggedStore(path) as rs:
            tw = TokenWindows(rs, SEQ)
            want = windows_of([rs[i] for i in range(len(rs))])
            np.testing.assert_array_equal(tw[np.arange(len(tw))], want)
    finally:
        os.chmod(path, 0o755)
    if os.geteuid() != 0:  # root writes anyway
        assert index_files(path) == []


@pytest.mark.parametrize("separator", [None, 5])
def test_a_store_copied_elsewhere_keeps_using_its_index(tmp_path, separator):
    """The index binds to the store's id, not to its path: a copied dataset
    ships its index."""
    docs = docs_of(15, 80)
    build(tmp_path / "a", docs)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    before = (tmp_path / "b" / WINDOWS_INDEX_NAME).stat().st_mtime_ns
    with RaggedStore(tmp_path / "b") as rs:
        tw = TokenWindows(rs, SEQ, separator=separator)
        flat = np.concatenate([np.append(d, separator) if separator is not None and i < 79 else d
                               for i, d in enumerate(docs)])
        n = (len(flat) - 1) // SEQ
        want = np.array([flat[i * SEQ:i * SEQ + SEQ + 1] for i in range(n)])
        np.testing.assert_array_equal(tw[np.arange(len(tw))], want)
    assert (tmp_path / "b" / WINDOWS_INDEX_NAME).stat().st_mtime_ns == before
