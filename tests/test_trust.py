"""Regression tests for the defects of the Trust issue: each would fail on the
main branch before the fix (8b02bbd); the docstrings say how.

1. close() racing calls on other threads (every store kind, every operation,
   and under a DataLoader);
2. hostile identities in crafted stores;
3. a failed delete must not roll back later synced appends;
4. ragged reads never stitch records across a concurrent delete;
5. fork() does not hand the writer lock to the child;
7. tampered loader states;
8. leftover journals do not block readers;
9. symlinks and NUL paths;
10. small input bugs; and the original delete order (with its moves).
(6, power-loss ordering, is test_faults.py's power-loss simulation.)
"""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time

import msgpack
import numpy as np
import pytest
from _lxformat import pack_identity, rewrite_identity
from _helpers import expected_moves, swap_last_order

from loaderx import _abi
from loaderx._lib import lib
from loaderx.dataloader import DataLoader
from loaderx.dataset import open_store
from loaderx.errors import (
    ClosedError,
    CorruptStoreError,
    HandleFailedError,
    InvalidArgumentError,
    LockedError,
    NewerFormatError,
    ZrecordError,
    ZrecordIOError,
)
from loaderx.zrecord import DenseStore, RaggedStore, Zrecord

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def fault_bit(*ops: str) -> int:
    return sum(1 << _abi.FAULT_OPS[op] for op in ops)


@pytest.fixture
def no_faults():
    yield
    lib.lx_debug_fault(0, 0, 0)


# ----------------------------------------------------------------- 1. close vs calls

RACE = """
import random, sys, threading, numpy as np
from loaderx.zrecord import DenseStore, RaggedStore, Zrecord
from loaderx.errors import ClosedError, BusyError
kind, op, path, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rng = random.Random(1)

def make(i):
    p = f"{path}/{i}"
    if kind == "dense":
        s = DenseStore(p, np.float32, (64,)); s.append(np.ones((200, 64), np.float32))
    elif kind == "ragged":
        s = RaggedStore(p, np.int32); s.append([np.arange(k % 50, dtype=np.int32) for k in range(200)])
    else:
        s = Zrecord(p, create=True); s.append([bytes(k % 50) for k in range(200)])
    return s

def call(s):
    if op == "gather":
        s[np.arange(100)]
    elif op == "append":
        s.append(np.ones((4, 64), np.float32) if kind == "dense" else [np.arange(3, dtype=np.int32)] * 4
                 if kind == "ragged" else [b"abc"] * 4)
    else:
        s.delete([len(s) - 1])

outcomes = {"ok": 0, "closed": 0}
for i in range(rounds):
    s = make(i)
    stop = threading.Event()
    def worker():
        while not stop.is_set():
            try:
                call(s); outcomes["ok"] += 1
            except ClosedError:
                outcomes["closed"] += 1
                return
            except BusyError:
                pass
    t = threading.Thread(target=worker); t.start()
    threading.Event().wait(rng.random() * 0.002)
    s.close(); stop.set(); t.join()
print("ok", outcomes)
"""


@pytest.mark.parametrize("kind", ["dense", "ragged", "bytes"])
def test_close_races_every_call_without_a_crash(tmp_path, kind):
    """200 close-vs-call races per store kind and operation. Before the fix,
    close() freed the native handle at once and the call in flight on the
    other thread died with SIGSEGV."""
    for op in ("gather", "append", "delete"):
        env = dict(os.environ, PYTHONPATH=ROOT)
        out = subprocess.run([sys.executable, "-c", RACE, kind, op, str(tmp_path / op), "200"],
                             capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, f"{kind}/{op}: exit {out.returncode}\n{out.stderr[-3000:]}"
        assert out.stdout.startswith("ok"), out.stdout


@pytest.mark.parametrize("kind", ["dense", "ragged", "bytes"])
def test_closing_a_store_under_a_running_loader_raises_closed(tmp_path, kind):
    """Before the fix, closing a Zrecord or RaggedStore stream of a running
    DataLoader segfaulted the process (only DenseStore streams were retained)."""
    code = f"""
    import numpy as np
    from loaderx.zrecord import DenseStore, RaggedStore, Zrecord
    from loaderx.dataloader import DataLoader
    from loaderx.errors import ClosedError
    p = {str(tmp_path / "s")!r}
    if {kind!r} == "dense":
        s = DenseStore(p, np.int64, ()); s.append(np.arange(5000))
    elif {kind!r} == "ragged":
        s = RaggedStore(p, np.int64); s.append([np.arange(k % 9) for k in range(5000)])
    else:
        s = Zrecord(p, create=True); s.append([bytes(k % 9) for k in range(5000)])
    for attempt in range(20):
        loader = DataLoader({{"x": s}}, batch_size=64, workers=2, prefetch=4)
        next(loader)
        s.close()
        try:
            for _ in range(200):
                next(loader)
            raise SystemExit("no error after close")
        except ClosedError:
            pass
        except RuntimeError as e:
            assert isinstance(e.__cause__, ClosedError), e
        loader.close()
        s = type(s)(p) if {kind!r} != "bytes" else Zrecord(p)
    print("ok")
    """
    out = run_child(code)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


# ----------------------------------------------------------------- 2. hostile identities

HOSTILE = {
    "object dtype": {"kind": "dense", "v": 1, "dtype": {"descr": "|O", "name": "object"}, "item_shape": []},
    "object field": {"kind": "dense", "v": 1, "dtype": {"descr": [["a", "<i4"], ["b", "|O"]], "name": "x"},
                     "item_shape": []},
    "negative shape": {"kind": "dense", "v": 1, "dtype": {"descr": "<f4", "name": "float32"},
                       "item_shape": [-3]},
    "huge shape": {"kind": "dense", "v": 1, "dtype": {"descr": "<f4", "name": "float32"},
                   "item_shape": [2**62, 2**62]},
    "overflowing shape": {"kind": "dense", "v": 1, "dtype": {"descr": "<f8", "name": "float64"},
                          "item_shape": [2**40, 2**30]},
    "unknown kind": {"kind": "tensorstore", "v": 1},
    "not a map": [1, 2, 3],
    "newer identity": {"kind": "dense", "v": 99},
    "string shape": {"kind": "dense", "v": 1, "dtype": {"descr": "<f4", "name": "float32"},
                     "item_shape": ["3"]},
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_format2_identities_are_refused_at_open(tmp_path, name):
    """Before the fix, an object dtype passed the open (the check ran only at
    create) and a gather then wrote file bytes into an object array: a
    segfault; bad shapes raised plain ValueError from numpy. (Format-2
    stores keep their identity as msgpack, which Python checks.)"""
    path = tmp_path / "s"
    with DenseStore(path, np.float32, ()) as ds:
        ds.append(np.arange(4, dtype=np.float32))
    rewrite_identity(path, msgpack.packb(HOSTILE[name]), format_version=2)
    for opener in (DenseStore, open_store):
        with pytest.raises(CorruptStoreError, match="identity"):
            opener(path)


HOSTILE_NATIVE = {
    "object dtype": dict(descr=b"'|O'", name=b"object", itemsize=8),
    "object field": dict(descr=b"[('a', '<i4'), ('b', '|O')]", itemsize=12),
    "huge shape": dict(item_shape=(2**62, 2**62)),
    "overflowing shape": dict(item_shape=(2**40, 2**30), itemsize=8),
    "unknown kind": dict(kind=7),
    "unknown flag": dict(flags=4),
    "descr not a literal": dict(descr=b"[[[("),
    "descr a call": dict(descr=b"__import__('os').getcwd()"),
    "descr a dict": dict(descr=b"{'a': 1}"),
    "descr not ASCII": dict(descr="'\u00e9'".encode()),
    "itemsize disagrees with the descr": dict(descr=b"'<f4'", itemsize=8),
    "named 'object' by flag": dict(descr=b"'|V8'", name=b"object", itemsize=8, flags=1),
    "size disagrees with its texts": dict(descr_size=2),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_NATIVE))
def test_hostile_native_identities_are_refused_at_open(tmp_path, name):
    """The native identity (format.zig) is checked by the library at open
    (its fields) and by identity.py (the dtype its text names): a forged one
    with valid checksums is refused with a message naming the identity."""
    path = tmp_path / "s"
    with DenseStore(path, np.float32, (), codec="zstd") as ds:
        ds.append(np.arange(4, dtype=np.float32))
    fields = dict(HOSTILE_NATIVE[name])
    rewrite_identity(path, pack_identity(fields.pop("kind", "dense"), fields.pop("descr", b"'<f4'"),
                                         fields.pop("name", b"float32"), **fields))
    for opener in (DenseStore, open_store):
        with pytest.raises(CorruptStoreError, match="identity"):
            opener(path)


def test_a_newer_native_identity_is_refused_as_newer(tmp_path):
    path = tmp_path / "s"
    with DenseStore(path, np.float32, (3,)) as ds:
        ds.append(np.zeros((2, 3), np.float32))
    rewrite_identity(path, pack_identity("dense", item_shape=(3,), version=2))
    with pytest.raises(NewerFormatError, match="identity has version 2"):
        open_store(path)


def test_a_fixed_width_store_must_agree_with_its_identity(tmp_path):
    """A raw dense store's records are found by arithmetic on the width the
    header names: an identity of another record size is refused at open."""
    path = tmp_path / "s"
    with DenseStore(path, np.float32, (3,), codec="raw") as ds:
        ds.append(np.zeros((2, 3), np.float32))
    rewrite_identity(path, pack_identity("dense", item_shape=(4,)))
    with pytest.raises(CorruptStoreError, match="differs from the store's fixed width"):
        open_store(path)
    rewrite_identity(path, pack_identity("ragged"))
    with pytest.raises(CorruptStoreError, match="not a dense one"):
        open_store(path)


def test_hostile_ragged_shape_is_refused_at_read(tmp_path):
    """A ragged record whose stored shape is (0, 2**64 - 1): before the fix,
    numpy's ValueError escaped the read."""
    path = tmp_path / "r"
    with RaggedStore(path, np.int32) as rs:
        rs.append([np.zeros((0, 3), np.int32)])
    # Patch the aux shape words in place: [ndim=2, 0, 3] -> [2, 0, 2**64-1].
    data = bytearray((path / "data").read_bytes())
    words = np.array([2, 0, 3], "<u8").tobytes()
    at = data.index(words)
    data[at + 16:at + 24] = (2**64 - 1).to_bytes(8, "little")
    (path / "data").write_bytes(data)
    with RaggedStore(path) as rs:
        with pytest.raises(CorruptStoreError, match="record 0"):
            rs[0]


# ----------------------------------------------------------------- 3. failed delete

def test_a_failed_delete_never_rolls_back_later_synced_appends(tmp_path, no_faults):
    """Before the fix, a delete failing after its journal was complete left
    the journal behind while the handle kept working: the next append + sync
    succeeded and the next open replayed the stale journal, so the synced
    records were gone (and the same handle already showed duplicates)."""
    path = tmp_path / "s"
    z = Zrecord(path, create=True, codec="raw")
    z.append([bytes([i]) * 3 for i in range(10)])
    z.sync()
    # The first table write after the journal is complete fails.
    lib.lx_debug_fault(fault_bit("write"), 3, 0)
    with pytest.raises(ZrecordIOError):
        z.delete([2])
    lib.lx_debug_fault(0, 0, 0)
    with pytest.raises(HandleFailedError, match="reopen"):
        z.append([b"new"])
    with pytest.raises(HandleFailedError):
        z[0]
    z.close()
    with Zrecord(path) as z:  # the reopen finishes the delete from its journal
        order = swap_last_order(10, [2])
        assert z[:] == [bytes([i]) * 3 for i in order]
        z.append([b"new"])
        z.sync()
        z.verify()
    with Zrecord(path) as z:
        assert z[-1] == b"new" and len(z) == 10


# ----------------------------------------------------------------- 4. torn ragged reads

def test_ragged_reads_never_stitch_records_across_a_delete(tmp_path):
    """Before the fix a ragged read made three native calls (sizes, shapes,
    payload) and a delete from another thread between them returned records
    stitched from two; now one call reads from one snapshot."""
    path = tmp_path / "r"
    rs = RaggedStore(path, np.int64)
    # Record value v is v repeated (v % 13) + 1 times, shaped (k,) or (1, k).
    recs = [np.full((1, (v % 13) + 1) if v % 2 else (v % 13) + 1, v, np.int64) for v in range(3000)]
    rs.append(recs)
    stop = threading.Event()
    bad: list = []

    def reader():
        rng = np.random.default_rng(0)
        while not stop.is_set():
            try:
                got = rs[rng.integers(0, 2000, 64)]
            except ZrecordError:
                continue  # a delete ran (BusyError) or the index went out of range
            for r in got:
                v = int(r.reshape(-1)[0])
                want = (1, (v % 13) + 1) if v % 2 else ((v % 13) + 1,)
                if r.shape != want or not (r == v).all():
                    bad.append((v, r.shape))
    t = threading.Thread(target=reader)
    t.start()
    deadline = time.monotonic() + 2.0
    deleted = 0
    while time.monotonic() < deadline and len(rs) > 2100:
        try:
            rs.delete([deleted % 1000])
            deleted += 1
        except ZrecordError:
            pass
    stop.set()
    t.join()
    rs.close()
    assert deleted > 10
    assert not bad, bad[:5]


# ----------------------------------------------------------------- 5. fork

def _child_append(path, queue):
    try:
        _child_append.store.append([b"from the child"])
        _child_append.store.sync()
        queue.put("appended")
    except LockedError as e:
        queue.put(f"locked: {e}")
    queue.put(_child_append.store[0])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_child_cannot_write_through_the_parents_handle(tmp_path):
    """Before the fix, fork() handed the writer lock to the child: its append
    and sync succeeded, then the parent overwrote them and they vanished."""
    path = tmp_path / "s"
    z = Zrecord(path, create=True)
    z.append([b"parent 0"])
    _child_append.store = z
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_child_append, args=(str(path), queue))
    p.start()
    first = queue.get(timeout=60)
    read = queue.get(timeout=60)
    p.join(60)
    assert first.startswith("locked") and "forked child" in first, first
    assert read == b"parent 0"  # reads work in the child
    z.append([b"parent 1"])
    z.close()
    with Zrecord(path) as z:
        assert z[:] == [b"parent 0", b"parent 1"]


# ----------------------------------------------------------------- 6 (part). failed fsync

def test_a_failed_fsync_fails_the_handle_for_good(tmp_path, no_faults):
    """Before the fix, a failed fsync was forgotten: the next sync() reported
    success although the kernel may have dropped the pages."""
    z = Zrecord(tmp_path / "s", create=True)
    z.append([b"x"])
    lib.lx_debug_fault(fault_bit("sync"), 1, 0)
    with pytest.raises(ZrecordIOError, match="can no longer be used") as first:
        z.sync()
    assert not isinstance(first.value, HandleFailedError)
    lib.lx_debug_fault(0, 0, 0)
    with pytest.raises(HandleFailedError, match="syncing data"):
        z.sync()
    with pytest.raises(HandleFailedError):
        z.append([b"y"])
    z.close()  # the failure was reported; close releases the handle


# ----------------------------------------------------------------- 7. tampered states

def test_tampered_loader_states_are_refused_and_change_nothing(tmp_path):
    """Before the fix, step=2**64+5 left a loader with a transform blocked
    forever, and without one it silently went on from its old step;
    DataLoader(step=2**64-1) was accepted and the first next() failed."""
    with DenseStore(tmp_path / "x", np.int64, ()) as ds:
        ds.append(np.arange(100))
        for transform in (None, lambda b: b):
            loader = DataLoader({"x": ds}, batch_size=10, seed=1, transform=transform)
            first = next(loader)["x"]
            good = loader.state_dict()
            for step in (2**64 + 5, 2**64 - 1):
                with pytest.raises(ValueError, match="step"):
                    loader.load_state_dict(dict(good, step=step))
            for step in ("3", -1):
                with pytest.raises(TypeError, match="step"):
                    loader.load_state_dict(dict(good, step=step))
            assert loader.step == 1
            second = next(loader)["x"]
            loader.load_state_dict(dict(good, step=0, position=0))
            assert np.array_equal(next(loader)["x"], first)
            assert np.array_equal(next(loader)["x"], second)
            loader.close()
        with pytest.raises(ValueError, match="step"):
            DataLoader({"x": ds}, batch_size=10, step=2**64 - 1)


# ----------------------------------------------------------------- 8. leftover journals

def test_a_partial_journal_blocks_nobody(tmp_path, no_faults):
    """Before the fix, a delete that failed while writing its journal left a
    partial journal, and every other open, even a reader's, got LockedError
    until the writer closed."""
    path = tmp_path / "s"
    z = Zrecord(path, create=True, codec="raw")
    z.append([b"a", b"b", b"c"])
    lib.lx_debug_fault(fault_bit("write"), 2, 0)  # the journal's header
    with pytest.raises(ZrecordIOError):
        z.delete([0])
    lib.lx_debug_fault(0, 0, 0)
    assert z[:] == [b"a", b"b", b"c"]  # nothing was deleted; the handle still works
    with Zrecord(path) as reader:
        assert reader[:] == [b"a", b"b", b"c"]
    z.delete([0])
    assert z[:] == [b"c", b"b"]
    z.close()


def test_a_reader_replays_a_journal_without_keeping_the_writer_lock(tmp_path, no_faults):
    """Before the fix, the first reader to open a store with a leftover journal
    replayed it and then kept the writer lock until it closed."""
    path = tmp_path / "s"
    z = Zrecord(path, create=True, codec="raw")
    z.append([b"a", b"b", b"c", b"d"])
    z.sync()
    lib.lx_debug_fault(fault_bit("write"), 3, 0)  # the first table write of the delete
    with pytest.raises(ZrecordIOError):
        z.delete([1])
    lib.lx_debug_fault(0, 0, 0)
    z._handle = None  # drop the failed handle without its close() sync
    import gc
    gc.collect()
    reader = Zrecord(path)
    assert reader[:] == [b"a", b"d", b"c"]
    with Zrecord(path) as writer:  # the lock is free while the reader is open
        writer.append([b"e"])
    assert reader[:] == [b"a", b"d", b"c", b"e"]
    reader.close()


# ----------------------------------------------------------------- 9. symlinks and paths

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


def test_journal_entries_out_of_bounds_are_refused(tmp_path, no_faults):
    """Before the fix, journal replay trusted the offsets inside the journal."""
    path = tmp_path / "s"
    z = Zrecord(path, create=True, codec="raw")
    z.append([b"a" * 10, b"b" * 10, b"c" * 10])
    z.sync()
    lib.lx_debug_fault(fault_bit("write"), 3, 0)
    with pytest.raises(ZrecordIOError):
        z.delete([0])
    lib.lx_debug_fault(0, 0, 0)
    z._handle = None
    import gc
    gc.collect()
    journal = bytearray((path / "journal").read_bytes())
    # Entry 0's loc.offset (header 96 B, then index u64, then offset u64) -> far past the data,
    # with both checksums recomputed so only the bounds check can catch it.
    from _xxhash import xxh64
    journal[104:112] = (10**9).to_bytes(8, "little")
    entries = bytes(journal[96:])
    journal[80:88] = xxh64(entries, 0).to_bytes(8, "little")
    journal[88:96] = xxh64(bytes(journal[:88]), 0x4C5B).to_bytes(8, "little")
    (path / "journal").write_bytes(journal)
    with pytest.raises(CorruptStoreError, match="journal"):
        Zrecord(path)


# ----------------------------------------------------------------- 10. small inputs

def test_negative_indices_of_narrow_integer_types_wrap(tmp_path):
    """Before the fix, a negative index in an int8 array raised OverflowError."""
    with DenseStore(tmp_path / "d", np.int64, ()) as ds:
        ds.append(np.arange(200))
        assert ds[np.array([-1, -128, 5], np.int8)].tolist() == [199, 72, 5]
        assert ds[np.array([-1], np.int16)].tolist() == [199]


def test_gather_into_refuses_fractional_offsets(tmp_path):
    """Before the fix, gather_into(offsets=[0.5]) silently truncated to 0."""
    with Zrecord(tmp_path / "z", create=True) as z:
        z.append([b"abc"])
        with pytest.raises(TypeError, match="integers"):
            z.gather_into([0], bytearray(8), offsets=[0.5])
        with pytest.raises(ValueError, match="non-negative"):
            z.gather_into([0], bytearray(8), offsets=[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_creating_a_store_where_no_directory_can_be_made_fails_fast(tmp_path):
    """Before the fix, creating a store under /proc spun at 100% CPU forever
    (mkdirat looped between ENOENT and EEXIST)."""
    t0 = time.monotonic()
    with pytest.raises(ZrecordError):
        DenseStore("/proc/loaderx-no-such/store", np.float32, ())
    assert time.monotonic() - t0 < 10


def test_delete_follows_the_original_order_and_returns_its_moves(tmp_path):
    """Before the fix the store filled each hole with the highest survivor:
    deleting {2, 3} from ten records gave [0,1,9,8,...] where the original
    loaderx gives [0,1,8,9,4,5,6,7]; delete returned nothing."""
    for codec, path in (("raw", tmp_path / "dense_raw"), ("zstd", tmp_path / "dense_zstd")):
        with DenseStore(path, np.int64, (), codec=codec) as ds:
            ds.append(np.arange(10))
            moves = ds.delete([3, 2])
            assert ds[:].tolist() == [0, 1, 8, 9, 4, 5, 6, 7]
            assert moves.tolist() == [[8, 2], [9, 3]]
    rng = np.random.default_rng(5)
    with Zrecord(tmp_path / "z", create=True) as z:
        model = [bytes([i % 256, i // 256]) for i in range(500)]
        z.append(model)
        for _ in range(30):
            key = rng.integers(0, len(model), rng.integers(1, 20)).tolist()
            order = swap_last_order(len(model), key)
            moves = z.delete(key)
            assert moves.tolist() == expected_moves(order)
            model = [model[p] for p in order]
            assert z[:] == model


@pytest.fixture
def read_only_view(tmp_path):
    """A read-only bind mount of a directory (skipped where mounting is not
    permitted): what a user without write permission sees."""
    mounts = []

    def view(src):
        dst = tmp_path / f"ro{len(mounts)}"
        dst.mkdir()
        for cmd in (["mount", "--bind", str(src), str(dst)], ["mount", "-o", "remount,bind,ro", str(dst)]):
            try:
                done = subprocess.run(cmd, capture_output=True, text=True)
            except FileNotFoundError:
                pytest.skip("no mount command")
            if done.returncode != 0:
                pytest.skip(f"cannot make a read-only bind mount here: {done.stderr.strip()}")
            mounts.append(dst) if cmd[1] == "--bind" else None
        return dst
    yield view
    for dst in mounts:
        subprocess.run(["umount", str(dst)], capture_output=True)


def test_a_read_only_user_reads_a_store_with_a_leftover_journal(tmp_path, read_only_view, no_faults):
    """Before the fix a read-only user got ReadOnlyError even for an empty
    journal; a partial journal (the delete never began) is now ignored, and a
    live one asks for one writable open."""
    path = tmp_path / "s"
    z = Zrecord(path, create=True, codec="raw")
    z.append([b"a", b"b", b"c"])
    lib.lx_debug_fault(fault_bit("write"), 2, 0)  # the journal's header: a partial journal
    with pytest.raises(ZrecordIOError):
        z.delete([0])
    lib.lx_debug_fault(0, 0, 0)
    z.close()
    (path / "journal").write_bytes(b"")  # an empty one, too
    ro = read_only_view(path)
    with Zrecord(ro) as reader:
        assert reader[:] == [b"a", b"b", b"c"]
        with pytest.raises(ZrecordError):
            reader.append([b"d"])
    # A live journal (a delete failed after it was complete).
    z = Zrecord(path)
    lib.lx_debug_fault(fault_bit("write"), 3, 0)
    with pytest.raises(ZrecordIOError):
        z.delete([0])
    lib.lx_debug_fault(0, 0, 0)
    z.close()
    with pytest.raises(ZrecordError, match="write permission"):
        Zrecord(read_only_view(path))
    with Zrecord(path) as writer:
        assert writer[:] == [b"c", b"b"]
