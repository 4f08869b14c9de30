"""I/O fault injection and power-loss simulation, through the engine's own
file layer (src/fsio.zig; test hooks lx_debug_fault / lx_debug_record).

The sweep makes every file-system call of an operation (create, write, fsync,
truncate, rename, unlink, mkdir, directory fsync) fail in turn, once and then
for good (a dead disk), for: create, append, a multi-chunk append, sync,
delete in both layouts, and compact. After each injected failure: the error
is a clean loaderx exception; the same handle either raises or still reads a
correct state; after reopening, the store opens, passes verify(), and holds
the state before or after the operation, with every record a completed
sync() covered.

The power-loss simulation records every call of a scenario (appends, syncs,
deletes, compacts) and rebuilds the store as a power loss at each recorded
instant would leave it: what was fsynced survives, each file's later writes
are all dropped, or a random subset of them is kept, torn at 4 KiB; names
(created, renamed, removed files) survive only up to a directory fsync, and
a random prefix of later name changes. Each rebuilt store must open, pass
verify(), keep every record a completed sync/delete/compact covered, and hold
one of the states the operations could leave (a prefix of the unsynced
appends, or an interrupted delete/compact either done or not).

Single faults, one test each: a failed delete never rolls back later synced
appends, a failed fsync fails the handle for good, and the journal a failed
delete leaves blocks no reader, is replayed without keeping the writer lock,
is refused when its entries point outside the data, and lets a read-only
user read the store.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest
from _helpers import swap_last_order

from loaderx import _abi
from loaderx._lib import ffi, lib
from loaderx.errors import (
    CorruptStoreError,
    HandleFailedError,
    NotAStoreError,
    StoreNotFoundError,
    ZrecordError,
    ZrecordIOError,
)
from loaderx.zrecord import DenseStore, Zrecord

ALL_OPS = sum(1 << v for v in _abi.FAULT_OPS.values())
PAGE = 4096


@pytest.fixture(autouse=True)
def disarm():
    yield
    lib.lx_debug_fault(0, 0, 0)
    lib.lx_debug_record(0)


def counts() -> tuple[int, int]:
    calls, faults = ffi.new("uint64_t *"), ffi.new("uint64_t *")
    lib.lx_debug_fault_counts(calls, faults)
    return calls[0], faults[0]


# ----------------------------------------------------------------- scenarios

def rec(i: int, size: int = 300) -> bytes:
    return (f"record {i} " * size).encode()[:size]


class Scenario:
    """One operation on a prepared store: `before` and `after` are the record
    lists it goes between; `run(store)` performs it."""

    fixed = False

    def prepare(self, path) -> None:
        with self.open(path, create=True) as s:
            self.append(s, [rec(i) for i in range(40)])
        self.base = [rec(i) for i in range(40)]

    def open(self, path, create=False):
        if self.fixed:
            return DenseStore(path, np.uint8, (300,), codec="raw") if create else DenseStore(path)
        return Zrecord(path, create=create, codec="zstd")

    def append(self, s, records) -> None:
        if self.fixed:
            s.append(np.frombuffer(b"".join(records), np.uint8).reshape(len(records), 300))
        else:
            s.append(records)

    def read(self, s) -> list[bytes]:
        got = s[:]
        return [bytes(r) for r in got] if not self.fixed else [r.tobytes() for r in got]


class Append(Scenario):
    name = "append"

    def run(self, s):
        self.append(s, [rec(100 + i) for i in range(5)])

    def states(self):
        return self.base, self.base + [rec(100 + i) for i in range(5)]


class ChunkedAppend(Scenario):
    """An append larger than one native call (staged chunks, one publish)."""
    name = "chunked append"

    def run(self, s):
        import loaderx._store as store_module
        saved = store_module.APPEND_CHUNK_RECORDS
        store_module.APPEND_CHUNK_RECORDS = 3
        try:
            self.append(s, [rec(200 + i) for i in range(8)])
        finally:
            store_module.APPEND_CHUNK_RECORDS = saved

    def states(self):
        return self.base, self.base + [rec(200 + i) for i in range(8)]


class Sync(Scenario):
    name = "sync"

    def prepare(self, path):
        super().prepare(path)
        self.extra = [rec(300 + i) for i in range(6)]

    def opened(self, s):
        self.append(s, self.extra)  # unsynced, then the operation syncs

    def run(self, s):
        s.sync()

    def states(self):
        return self.base + self.extra, self.base + self.extra


class Delete(Scenario):
    name = "delete"
    keys = [3, 39, 0, 17, 18]

    def run(self, s):
        s.delete(self.keys)

    def states(self):
        order = swap_last_order(len(self.base), self.keys)
        return self.base, [self.base[p] for p in order]


class DeleteFixed(Delete):
    name = "delete (fixed width)"
    fixed = True


class Compact(Scenario):
    name = "compact"

    def prepare(self, path):
        super().prepare(path)
        with self.open(path) as s:
            s.delete([1, 2, 5, 30])
            self.base = self.read(s)

    def run(self, s):
        s.compact()

    def states(self):
        return self.base, self.base


SCENARIOS = [Append(), ChunkedAppend(), Sync(), Delete(), DeleteFixed(), Compact()]


# ----------------------------------------------------------------- the sweep

def copy_store(src, dst) -> None:
    if os.path.exists(dst):
        shutil.rmtree(dst)
    shutil.copytree(src, dst)


def run_with_fault(sc: Scenario, path, nth: int, sticky: bool) -> int:
    """One injected fault: the invariants of the module docstring. Returns
    the number of faults injected."""
    before, after = sc.states()
    s = sc.open(path)
    if hasattr(sc, "opened"):
        sc.opened(s)
    lib.lx_debug_fault(ALL_OPS, nth, 1 if sticky else 0)
    failed = False
    try:
        sc.run(s)
    except ZrecordError:
        failed = True
    injected = counts()[1]
    lib.lx_debug_fault(0, 0, 0)
    extra = check_same_handle(sc, s, before, after, failed)
    s.close()
    with sc.open(path) as reopened:
        reopened.verify()
        got = sc.read(reopened)
    assert got in (before + extra, after + extra), f"{sc.name} fault {nth}: {len(got)} records"
    return injected


def check_same_handle(sc: Scenario, s, before, after, failed) -> list[bytes]:
    """The handle raises HandleFailedError or reads a correct state; a synced
    append through it then survives. Returns what it appended."""
    try:
        got = sc.read(s)
    except HandleFailedError:
        return []
    assert got in ((before, after) if failed else (after,)), sc.name
    new = [rec(900)]
    try:
        sc.append(s, new)
        s.sync()
    except ZrecordError:
        return []
    return new


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda sc: sc.name)
def test_every_io_call_of_an_operation_fails_cleanly(tmp_path, sc):
    base = tmp_path / "base"
    sc.prepare(base)
    work = tmp_path / "work"
    copy_store(base, work)
    s = sc.open(work)
    if hasattr(sc, "opened"):
        sc.opened(s)
    lib.lx_debug_fault(ALL_OPS, 0, 0)  # count only
    sc.run(s)
    total, _ = counts()
    s.close()
    assert total > 0
    injected = 0
    for sticky in (False, True):
        for nth in range(1, total + 1):
            copy_store(base, work)
            injected += run_with_fault(sc, work, nth, sticky)
    assert injected >= total


def test_every_io_call_of_a_create_fails_cleanly(tmp_path):
    lib.lx_debug_fault(ALL_OPS, 0, 0)
    with Zrecord(tmp_path / "probe" / "s", create=True) as z:
        z.append([b"a"])
    total, _ = counts()
    lib.lx_debug_fault(0, 0, 0)
    injected = 0
    for sticky in (False, True):
        for nth in range(1, total + 1):
            path = tmp_path / f"c{nth}{'s' if sticky else ''}" / "s"
            lib.lx_debug_fault(ALL_OPS, nth, 1 if sticky else 0)
            try:
                with Zrecord(path, create=True) as z:
                    z.append([b"a"])
            except ZrecordError:
                pass
            finally:
                injected += counts()[1]
                lib.lx_debug_fault(0, 0, 0)
            try:
                with Zrecord(path) as z:
                    z.verify()
                    assert z[:] in ([], [b"a"])
            except (StoreNotFoundError, NotAStoreError):
                pass  # the store was never published
            with Zrecord(path, create=True) as z:  # creating again works
                z.verify()
    assert injected >= total


# ----------------------------------------------------------------- the recording

OPS = {v: k for k, v in _abi.FAULT_OPS.items()}


def parse_recording() -> list[tuple]:
    n = ffi.new("uint64_t *")
    assert lib.lx_debug_recording(ffi.NULL, 0, n) == 0
    buf = bytearray(n[0])
    assert lib.lx_debug_recording(ffi.from_buffer(buf), len(buf), n) == 0
    out, at = [], 0
    while at < len(buf):
        op = OPS[buf[at]]
        name_len = struct.unpack_from("<H", buf, at + 1)[0]
        name = buf[at + 3:at + 3 + name_len].decode()
        offset, length = struct.unpack_from("<QQ", buf, at + 3 + name_len)
        at += 3 + name_len + 16
        data = bytes(buf[at:at + length])
        at += length
        out.append((op, name, offset, data))
    return out


class Disk:
    """A store directory as a power loss leaves it: durable file images and
    names, plus the changes made since the last fsync of each."""

    def __init__(self, files: dict[str, bytes]):
        self.inodes = {i: bytearray(data) for i, data in enumerate(files.values())}
        self.names = dict(zip(files, range(len(files))))  # the live namespace
        self.durable_names = dict(self.names)
        self.pending_names: list[dict] = []
        self.pending: dict[int, list] = {}
        self.next_inode = len(files)

    def apply(self, op, name, offset, data) -> None:
        if op == "create":
            if name not in self.names:
                self.names[name] = self.next_inode
                self.inodes[self.next_inode] = bytearray()
                self.next_inode += 1
                self.pending_names.append(dict(self.names))
            if offset:  # truncate
                self.pending.setdefault(self.names[name], []).append(("truncate", 0, b""))
        elif op == "write":
            self.pending.setdefault(self.names[name], []).append(("write", offset, data))
        elif op == "truncate":
            self.pending.setdefault(self.names[name], []).append(("truncate", offset, b""))
        elif op == "sync":
            inode = self.names[name]
            for change in self.pending.pop(inode, []):
                apply_change(self.inodes[inode], change)
        elif op in ("rename", "unlink"):
            inode = self.names.pop(name)
            if op == "rename":
                self.names[data.decode()] = inode
            self.pending_names.append(dict(self.names))
        elif op == "sync_dir":
            self.durable_names = dict(self.names)
            self.pending_names.clear()

    def lose_power(self, rng: random.Random, keep: bool) -> dict[str, bytes]:
        names = self.durable_names
        if keep and self.pending_names:
            k = rng.randrange(len(self.pending_names) + 1)
            names = self.pending_names[k - 1] if k else names
        out = {}
        for name, inode in names.items():
            image = bytearray(self.inodes[inode])
            for change in self.pending.get(inode, []):
                if keep and rng.random() < 0.5:
                    apply_change(image, change, rng)
            out[name] = bytes(image)
        return out


def apply_change(image: bytearray, change, rng: random.Random | None = None) -> None:
    kind, offset, data = change
    if kind == "truncate":
        del image[offset:]
        image.extend(bytes(max(0, offset - len(image))))
        return
    if len(image) < offset + len(data):
        image.extend(bytes(offset + len(data) - len(image)))
    if rng is None or len(data) <= PAGE:
        image[offset:offset + len(data)] = data
        return
    # Torn: only some of the write's 4 KiB pages reached the disk.
    for start in range(0, len(data), PAGE):
        if rng.random() < 0.5:
            image[offset + start:offset + start + PAGE] = data[start:start + PAGE]


def read_files(path) -> dict[str, bytes]:
    return {name: open(os.path.join(path, name), "rb").read() for name in sorted(os.listdir(path))}


# ----------------------------------------------------------------- the power-loss runs

def power_loss_scenario(path) -> tuple[dict, list, list]:
    """Runs the scenario recorded; returns the store's files when recording
    began (all durable), the recording, and the model: per operation (kind,
    first log entry, end log entry, state after)."""
    z = Zrecord(path, create=True, codec="zstd")
    z.append([rec(i, 5000) for i in range(6)])
    z.sync()
    start_files = read_files(path)
    state = [rec(i, 5000) for i in range(6)]
    model = []
    lib.lx_debug_record(1)
    marks = [0]

    def step(kind, fn, new_state):
        nonlocal state
        fn()
        state = new_state
        marks.append(len(parse_recording()))
        model.append((kind, marks[-2], marks[-1], list(state)))

    step("append", lambda: z.append([rec(10 + i, 3000) for i in range(4)]), state + [rec(10 + i, 3000) for i in range(4)])
    step("append", lambda: z.append([rec(20, 9000)]), state + [rec(20, 9000)])
    step("sync", z.sync, state)
    step("append", lambda: z.append([rec(30 + i, 700) for i in range(3)]), state + [rec(30 + i, 700) for i in range(3)])
    order = swap_last_order(len(state), [2, 4, 11])
    step("delete", lambda: z.delete([2, 4, 11]), [state[p] for p in order])
    step("append", lambda: z.append([rec(40 + i, 6000) for i in range(2)]), state + [rec(40 + i, 6000) for i in range(2)])
    step("compact", z.compact, state)
    step("append", lambda: z.append([rec(50, 100)]), state + [rec(50, 100)])
    step("close", z.close, state)
    log = parse_recording()
    lib.lx_debug_record(0)
    return start_files, log, model


def allowed_states(model, cut: int, base: list) -> list[list]:
    """What a store may hold after a power loss at log position `cut`."""
    durable, appended, extra = base, [], []
    for kind, start, end, after in model:
        if end <= cut:
            if kind in ("sync", "delete", "compact", "close"):
                durable, appended = after, []
            else:
                appended = after[len(durable):]
        elif start < cut:  # in progress
            if kind == "append":
                appended = after[len(durable):]
            elif kind in ("delete", "compact"):
                extra.append(after)
    full = durable + appended
    return [full[:n] for n in range(len(durable), len(full) + 1)] + extra


def test_power_loss_at_every_instant_keeps_what_was_made_durable(tmp_path):
    start_files, log, model = power_loss_scenario(tmp_path / "s")
    base = [rec(i, 5000) for i in range(6)]
    rng = random.Random(2024)
    cuts = sorted(set(range(0, len(log) + 1)))
    losses = 0
    for cut in cuts:
        for variant in range(3):  # nothing unsynced kept, then two random keeps
            keep = variant > 0
            disk = Disk(start_files)
            for entry in log[:cut]:
                disk.apply(*entry)
            files = disk.lose_power(rng, keep)
            target = tmp_path / f"loss{cut}-{variant}"
            os.makedirs(target)
            for name, data in files.items():
                with open(target / name, "wb") as f:
                    f.write(data)
            with Zrecord(target) as z:
                z.verify()
                got = z[:]
            assert got in allowed_states(model, cut, base), f"cut {cut}/{len(log)} keep={keep}: {len(got)} records"
            shutil.rmtree(target)
            losses += 1
    assert losses >= 200


_TRUNCATE = """
import os, sys
import numpy as np
from loaderx import DenseStore
path, mapped = sys.argv[1], sys.argv[2] == "mapped"
s = DenseStore(path, np.uint8, (4096,), codec="raw")
s.append(np.ones((64, 4096), np.uint8))
s.sync()
if mapped:
    assert int(s[np.arange(64)].sum()) == 64 * 4096
os.truncate(os.path.join(path, "data"), 4096)  # another program cuts the file
try:
    s[np.arange(64)]
except Exception as e:
    print(type(e).__name__, e)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGBUS semantics are POSIX's")
def test_a_data_file_truncated_from_outside(tmp_path):
    """The README's caveat, pinned: a handle that has not mapped the lost
    bytes yet checks the file's size before mapping and raises
    CorruptStoreError; one whose mapping already covers them dies of SIGBUS
    on the read (as with LMDB: mmap gives no other signal). A fresh open
    reports the damage cleanly either way."""
    import subprocess

    from loaderx.errors import CorruptStoreError

    fresh = subprocess.run([sys.executable, "-c", _TRUNCATE, str(tmp_path / "a"), "fresh"],
                           capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0, fresh.stderr
    assert "CorruptStoreError" in fresh.stdout and "data file is truncated" in fresh.stdout
    mapped = subprocess.run([sys.executable, "-c", _TRUNCATE, str(tmp_path / "b"), "mapped"],
                            capture_output=True, text=True, timeout=120)
    assert mapped.returncode == -signal.SIGBUS, (mapped.returncode, mapped.stdout, mapped.stderr)
    with pytest.raises(CorruptStoreError, match="truncated"):
        DenseStore(tmp_path / "b")


# ----------------------------------------------------------------- the token window index

def _token_docs(seed: int, count: int) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 300, n).astype(np.uint16) for n in rng.integers(0, 200, count)]


def _windows(docs, seq_len: int) -> np.ndarray:
    flat = np.concatenate(docs) if docs else np.zeros(0, np.uint16)
    n = max(0, (len(flat) - 1) // seq_len)
    return np.array([flat[i * seq_len:i * seq_len + seq_len + 1] for i in range(n)])


def test_power_loss_never_leaves_a_stale_window_index(tmp_path):
    """The power-loss simulation over token-window index writes (temporary
    file, fsync, rename, directory fsync), appends, syncs and a delete (which
    removes windows.idx before its journal): at every instant, the store the
    loss leaves opens, passes verify() (which checks every windows.idx
    entry), and its TokenWindows are slices of the documents it holds."""
    from loaderx import RaggedStore, TokenWindows

    path = tmp_path / "s"
    rs = RaggedStore(path, np.uint16, codec="zstd", frame_size=64)
    rs.append(_token_docs(1, 6))
    rs.sync()
    start_files = read_files(path)
    lib.lx_debug_record(1)
    TokenWindows(rs, 7)                 # writes windows.idx (6 durable documents)
    rs.append(_token_docs(2, 4))        # not durable
    TokenWindows(rs, 7)                 # covers only what is durable: no write
    rs.sync()
    TokenWindows(rs, 7)                 # rewrites it for 10
    rs.append(_token_docs(3, 2))
    rs.delete([1, 3])                   # removes it first
    TokenWindows(rs, 7)
    rs.append(_token_docs(4, 1))
    rs.close()
    log = parse_recording()
    lib.lx_debug_record(0)
    assert any(op == "rename" and name.startswith("windows.idx.") for op, name, _, _ in log)
    rng = random.Random(7)
    losses = 0
    for cut in range(len(log) + 1):
        for keep in (False, True, True):
            disk = Disk(start_files)
            for entry in log[:cut]:
                disk.apply(*entry)
            target = tmp_path / f"loss{cut}-{losses}"
            os.makedirs(target)
            for name, data in disk.lose_power(rng, keep).items():
                (target / name).write_bytes(data)
            with RaggedStore(target) as s:
                s.verify()
                docs = s[:]
                for seq_len in (7, 3):
                    tw = TokenWindows(s, seq_len)
                    got = tw[np.arange(len(tw))]
                    want = _windows(docs, seq_len)
                    assert np.array_equal(got.reshape(len(want), -1), want.reshape(len(want), -1)), \
                        f"cut {cut}/{len(log)} keep={keep}"
                s.verify()
            shutil.rmtree(target)
            losses += 1


# ----------------------------------------------------------------- single faults, journals

def fault_bit(*ops: str) -> int:
    return sum(1 << _abi.FAULT_OPS[op] for op in ops)


@pytest.fixture
def no_faults():
    yield
    lib.lx_debug_fault(0, 0, 0)


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
