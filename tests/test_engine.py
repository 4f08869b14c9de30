"""Acceptance tests of the native record engine (SPEC §2-§3) through the public
Python API (``loaderx.zrecord.Zrecord`` and ``loaderx.errors``).

1. Round trip per codec (raw, zstd, zstd_dict) for records of 0 B .. 1 MiB,
   plus one 64 MiB record in each compressing codec (two in the suite):
   ``z[i]``, ``z[list]``, slices, masks, ``gather_into``, close, reopen,
   ``verify``.
2. Compression never costs space; zstd shrinks compressible data; a trained
   dictionary beats plain zstd on many small similar records.
3. ``delete`` (duplicates, unsorted, negative indices, slices, masks) against a
   Python model of swap-last deletion; ``compact`` reclaims everything.
4. A ``compact`` SIGKILLed mid-way leaves a consistent store; re-running ends it.
5. ``kill -9`` at 60 random instants of an appending process always leaves an
   openable store holding an exact prefix of what was appended, ending on an
   append-call boundary (calls larger than one native append included).
6. Readers on two handles never see a torn or foreign record while one thread
   appends; a multi-chunk append call becomes visible all at once; close()
   racing calls on other threads never crashes; ragged reads never stitch
   records across a concurrent delete.
7. Writer lock (LockedError) and exclusive delete/compact (BusyError), in one
   process and across processes.
8. Bad input and damaged stores (meta, commit, data, index, single records,
   forged table entries) raise clear loaderx errors; nothing is lost.
9. The ABI reports at least one lane.

Crash victims are forked from a zygote (``tests/_crash_writer.py``) that has
imported loaderx once, so dozens of kills cost milliseconds each.
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import select
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from loaderx import TokenWindows, errors
from loaderx._lib import lib
from loaderx.errors import (
    BusyError,
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
from _helpers import expected_moves, swap_last_order

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WRITER = os.path.join(HERE, "_crash_writer.py")

_spec = importlib.util.spec_from_file_location("_crash_writer", WRITER)
_cw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cw)
payload = _cw.payload
batch_sizes = _cw.batch_sizes

CODECS = ("raw", "zstd", "zstd_dict")
MIB = 1 << 20

def resolve(key, n: int) -> list[int]:
    """The record positions a delete key names (the test's own reading of it)."""
    if isinstance(key, (int, np.integer)):
        return [int(key) + n if key < 0 else int(key)]
    if isinstance(key, slice):
        return list(range(*key.indices(n)))
    arr = np.asarray(key)
    if arr.dtype == np.bool_:
        return [int(i) for i in np.flatnonzero(arr)]
    return [int(i) + n if i < 0 else int(i) for i in arr.tolist()]


def model_delete(model: list, positions) -> list:
    """The original swap-last rule (see _helpers.swap_last_order)."""
    return [model[p] for p in swap_last_order(len(model), positions)]


def mixed_blob(n: int, seed: int) -> bytes:
    """n bytes: the first half noise, the second half a repeating pattern."""
    rng = np.random.default_rng(seed)
    half = n // 2
    pattern = (seed.to_bytes(4, "little") + bytes(range(256))) * ((n - half) // 260 + 1)
    return rng.bytes(half) + pattern[: n - half]


def json_records(n: int, seed: int = 0, width: int = 200) -> list[bytes]:
    """n JSON-like event records of exactly `width` bytes, similar but distinct."""
    rng = random.Random(seed)
    events = ["click", "view", "purchase", "add_to_cart", "search", "logout"]
    countries = ["DE", "FR", "US", "JP", "BR", "IN", "NG", "CA"]
    tags = ["new", "returning", "mobile", "desktop", "promo", "beta", "vip"]
    out = []
    for i in range(n):
        d = {"id": i, "user": f"user_{rng.randrange(100000):05d}", "event": rng.choice(events),
             "ts": 1700000000 + rng.randrange(10 ** 7), "country": rng.choice(countries),
             "tags": rng.sample(tags, 2), "score": round(rng.random(), 4)}
        s = json.dumps(d, separators=(",", ":")).encode()
        out.append((s + b" " * width)[:width])
    return out


_DICT_CACHE: dict = {}


def json_dict() -> bytes:
    if "d" not in _DICT_CACHE:
        _DICT_CACHE["d"] = train_dict(json_records(3000, seed=99), tier="fast")
    return _DICT_CACHE["d"]


def open_store(path, codec: str, **kw) -> Zrecord:
    if codec == "zstd_dict":
        kw.setdefault("dict_bytes", json_dict())
    return Zrecord(path, create=True, codec=codec, **kw)


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class LineReader:
    """Reads newline-terminated lines from a child's stdout with a deadline."""

    def __init__(self, proc: subprocess.Popen, stderr_path: str):
        self.proc = proc
        self.stderr_path = stderr_path
        self.buf = b""

    def _stderr(self) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                return f.read().decode(errors="replace")[-3000:]
        except OSError:
            return ""

    def line(self, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"child said nothing within {timeout}s; stderr:\n{self._stderr()}")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise AssertionError(f"child exited (rc={self.proc.poll()}); stderr:\n{self._stderr()}")
                self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def expect(self, word: str, pid: int | None = None, timeout: float = 60.0) -> list[str]:
        """The next line starting with `word` (and naming `pid`); other
        lines are dropped, an ``error`` line fails the test."""
        while True:
            words = self.line(timeout).split()
            if not words:
                continue
            if words[0] == "error":
                raise AssertionError(f"child reported: {' '.join(words)}")
            if words[0] == word and (pid is None or int(words[1]) == pid):
                return words


class Zygote:
    """The forking server of tests/_crash_writer.py."""

    def __init__(self, tmp_path):
        self.err_path = str(tmp_path / "zygote.stderr")
        self.err = open(self.err_path, "wb")
        self.proc = subprocess.Popen([sys.executable, WRITER, "zygote"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, env=child_env(), cwd=ROOT)
        self.out = LineReader(self.proc, self.err_path)
        self.out.expect("ready")
        self.children: set[int] = set()

    def send(self, line: str) -> None:
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def fork(self, command: str) -> int:
        self.send(command)
        pid = int(self.out.expect("forked")[1])
        self.children.add(pid)
        return pid

    def kill(self, pid: int) -> int:
        """SIGKILL the child and wait until it is gone; returns its wait status."""
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.send(f"reap {pid}")
        status = int(self.out.expect("reaped", pid)[2])
        self.children.discard(pid)
        return status

    def close(self) -> None:
        for pid in list(self.children):
            try:
                self.kill(pid)
            except Exception:
                pass
        try:
            self.send("quit")
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


@pytest.fixture
def zygote(tmp_path):
    z = Zygote(tmp_path)
    try:
        yield z
    finally:
        z.close()


def run_isolated(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for checks that could crash it)."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=child_env(), cwd=ROOT, timeout=timeout)


# ----------------------------------------------------------------- 1. round trip

def _round_trip_records(codec: str) -> list:
    recs = [
        b"",
        b"\x01",
        mixed_blob(200, 1),
        json_records(1, seed=5)[0],
        mixed_blob(64 << 10, 2),
        os.urandom(64 << 10),
        bytes(64 << 10),
        bytearray(mixed_blob(1000, 3)),  # any bytes-like goes in
        memoryview(mixed_blob(777, 4)),
        np.frombuffer(mixed_blob(4096, 5), dtype=np.uint32),
        b"",
        mixed_blob(1 * MIB + 13, 6),
    ]
    if codec != "raw":
        # The 64 MiB records of the suite (one per compressing codec).
        recs.append(mixed_blob(64 * MIB, 7))
    recs.append(b"\x02")
    return recs


def _as_bytes(r) -> bytes:
    return r.tobytes() if isinstance(r, np.ndarray) else bytes(r)


def _check_reads(z: Zrecord, expect: list[bytes]) -> None:
    n = len(expect)
    assert len(z) == n
    for i in range(n):
        got = z[i]
        assert isinstance(got, bytes)
        assert got == expect[i], f"record {i}: {len(got)} bytes, expected {len(expect[i])}"
    assert z[-1] == expect[-1] and z[-n] == expect[0]
    small = [i for i in range(n) if len(expect[i]) < MIB]
    idx = [small[3], small[0], small[3], -1, small[1], small[-1], small[0]]
    assert z[idx] == [expect[i] for i in idx]
    assert z[np.array(idx, dtype=np.int64)] == [expect[i] for i in idx]
    assert z.gather(idx) == [expect[i] for i in idx]
    assert z[small[1]:small[5]] == expect[small[1]:small[5]]
    assert z[::-3] == expect[::-3]
    assert z[5:2] == [] and z[[]] == []
    mask = np.zeros(n, dtype=bool)
    mask[small[::2]] = True
    assert z[mask] == [expect[i] for i in small[::2]]

    # gather_into, back to back
    every = list(range(n))[::-1]
    total = sum(len(expect[i]) for i in every)
    buf = bytearray(total)
    sizes = z.gather_into(every, buf)
    assert sizes.tolist() == [len(expect[i]) for i in every]
    assert bytes(buf) == b"".join(expect[i] for i in every)

    # gather_into at caller offsets, with guard bytes between records that must stay untouched
    gap = 5
    offs, at = [], 3
    for i in idx:
        offs.append(at)
        at += len(expect[i]) + gap
    out = np.full(at, 0xAB, dtype=np.uint8)
    sizes = z.gather_into(idx, out, offsets=offs)
    assert sizes.tolist() == [len(expect[i]) for i in idx]
    guard = np.ones(at, dtype=bool)
    for o, i in zip(offs, idx):
        assert out[o:o + len(expect[i])].tobytes() == expect[i]
        guard[o:o + len(expect[i])] = False
    assert (out[guard] == 0xAB).all(), "gather_into wrote outside the records' ranges"

    # A destination one byte short is refused before anything is written.
    short = bytearray(b"\xCD" * (total - 1))
    with pytest.raises(SizeMismatchError):
        z.gather_into(every, short)
    assert short == bytearray(b"\xCD" * (total - 1))


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_per_codec(tmp_path, codec):
    path = tmp_path / f"rt_{codec}"
    recs = _round_trip_records(codec)
    expect = [_as_bytes(r) for r in recs]
    # zstd_dict's default level is 19 (about 5 MB/s: 12 s for the 64 MiB
    # record); the round trip is the same at level 3 (defaults: test_codecs).
    kw = {"level": 3} if codec == "zstd_dict" else {}
    with open_store(path, codec, **kw) as z:
        assert z.codec == codec and len(z) == 0
        assert z.append(recs[:4]) == 0
        assert z.append(recs[4:]) == 4
        assert z.append([]) == len(recs)
        _check_reads(z, expect)
        st = z.stats()
        assert st["records"] == len(recs)
        assert st["reclaimable"] == 0 and st["chunk_bytes"] == st["live_bytes"]
        if codec == "raw":
            assert st["chunk_bytes"] == sum(map(len, expect))
        else:
            assert st["chunk_bytes"] < sum(map(len, expect))
        if codec == "zstd_dict":
            assert z.dictionary() == json_dict()
        else:
            assert z.dictionary() is None
        z.verify()
    assert z.closed

    with Zrecord(path) as z:  # reopen without create
        assert z.codec == codec
        _check_reads(z, expect)
        z.verify()
        extra = [b"after reopen", b"", mixed_blob(3000, 8)]
        assert z.append(extra) == len(expect)
        expect += extra
    # create=True on an existing store opens it and changes nothing.
    with open_store(path, codec) as z:
        assert z.codec == codec
        assert z[:] == expect
        z.verify()


# ----------------------------------------------------------------- 2. compression never costs space

@pytest.mark.parametrize("codec", ["zstd", "zstd_dict"])
def test_incompressible_records_are_stored_raw(tmp_path, codec):
    sizes = [1, 2, 7, 31, 100, 200, 999, 4096, 65536, 300_000, 2 * MIB] + [200] * 300
    recs = [os.urandom(n) for n in sizes]
    with open_store(tmp_path / "noise", codec) as z:
        z.append(recs)
        st = z.stats()
        # Exactly the payload: the record table lives in its own file.
        assert st["chunk_bytes"] == sum(sizes) == st["live_bytes"]
        assert os.path.getsize(tmp_path / "noise" / "data") >= st["chunk_bytes"]
        assert z[:] == recs
        z.verify()
    with Zrecord(tmp_path / "noise") as z:
        assert z[:] == recs and z.stats()["chunk_bytes"] == sum(sizes)


def test_compression_shrinks_and_never_grows(tmp_path):
    compressible = [mixed_blob(0, 0)] + [bytes([i % 7]) * (1000 + i) for i in range(500)]
    total = sum(map(len, compressible))
    with Zrecord(tmp_path / "c", create=True, codec="zstd") as z:
        z.append(compressible)
        assert z.stats()["chunk_bytes"] * 20 < total
        assert z[:] == compressible

    rng = random.Random(4)
    mixed = []
    for i in range(2000):
        n = rng.choice([0, 1, 5, 12, 40, 200, 3000])
        mixed.append(rng.randbytes(n) if i % 2 else json_records(1, seed=i, width=max(n, 1))[0][:n])
    with Zrecord(tmp_path / "m", create=True, codec="zstd") as z:
        z.append(mixed)
        st = z.stats()
        assert st["chunk_bytes"] <= sum(map(len, mixed))  # ratio >= 1.0
        assert z[:] == mixed
        z.verify()


def test_dictionary_beats_plain_zstd_on_small_similar_records(tmp_path):
    recs = json_records(5000, seed=1)
    raw_total = sum(map(len, recs))
    assert raw_total == 5000 * 200
    d = train_dict(recs, tier="fast")
    assert 0 < len(d) <= 32 << 10
    with Zrecord(tmp_path / "plain", create=True, codec="zstd") as a:
        a.append(recs)
        plain = a.stats()["chunk_bytes"]
    with Zrecord(tmp_path / "dict", create=True, codec="zstd_dict", dict_bytes=d) as b:
        b.append(recs)
        with_dict = b.stats()["chunk_bytes"]
        assert b[:] == recs
        b.verify()
    assert plain <= raw_total
    assert with_dict * 4 < plain * 3, f"zstd_dict {with_dict} B vs zstd {plain} B (raw {raw_total} B)"
    with Zrecord(tmp_path / "dict") as b:
        assert b.dictionary() == d and b[:] == recs


# ----------------------------------------------------------------- 3. delete and compact

def test_compact_refuses_records_that_overlap(tmp_path):
    """A table whose entries share bytes (a forged or damaged store: each
    entry in bounds, its checksum sealed) is refused by compact before
    anything moves. Before the check, compact's rounds computed a negative
    gap and moved bytes over live records."""
    from _lxformat import StoreImage

    path = tmp_path / "s"
    with Zrecord(path, create=True, codec="raw") as z:
        z.append([bytes([i]) * 100 for i in range(6)])
        z.delete([1])  # a hole, so compact has work to do
    img = StoreImage.load(path)
    img.put_loc(3, offset=img.loc(2)["offset"] + 50)  # half of record 2, half of the next
    img.write(path)
    before = snapshot(path)
    with Zrecord(path) as z:
        with pytest.raises(CorruptStoreError, match="overlaps"):
            z.compact()
    after = snapshot(path)
    assert after["data"] == before["data"] and after["index"] == before["index"]


def test_delete_model_sanity():
    assert model_delete(list(range(10)), [2, 8]) == [0, 1, 9, 3, 4, 5, 6, 7]
    assert model_delete(list(range(6)), [5, 0, 0, 4]) == [3, 1, 2]
    assert model_delete(list(range(5)), [3, 4]) == [0, 1, 2]
    assert model_delete(list(range(5)), range(5)) == []


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_delete_swap_last_and_compact(tmp_path, codec):
    path = tmp_path / "del"
    model = [payload(i, 3) for i in range(400)]
    z = Zrecord(path, create=True, codec=codec)
    z.append(model)

    def check(step):
        nonlocal z
        assert len(z) == len(model), step
        assert z[:] == model, step
        st = z.stats()
        assert st["records"] == len(model)
        assert st["chunk_bytes"] == st["live_bytes"] + st["reclaimable"]
        if codec == "raw":
            assert st["live_bytes"] == sum(map(len, model)), step
        z.close()
        z = Zrecord(path)
        assert z[:] == model, f"{step}: after reopen"

    keys = [  # each a function of the current length
        lambda n: 5,
        lambda n: -1,
        lambda n: -n + 2,
        lambda n: [10, 3, 10, -2, 0, 3, 10],                          # duplicates, unsorted, negative
        lambda n: np.array([n - 1, n - 3, n - 1], dtype=np.int32),     # only top positions: nothing moves
        lambda n: np.array([n - 2, 4, -n], dtype=np.int64),
        lambda n: slice(2, 60, 7),
        lambda n: slice(None, None, -25),
        lambda n: (1, 2, 4),
        lambda n: np.array([7, 7, 7], dtype=np.uint64),
        lambda n: [],
    ]
    for step, make in enumerate(keys):
        key = make(len(model))
        positions = resolve(key, len(model))
        z.delete(key)
        model = model_delete(model, positions)
        check(f"delete #{step} {key!r}")
    mask = np.zeros(len(model), dtype=bool)
    mask[np.random.default_rng(0).choice(len(model), 40, replace=False)] = True
    positions = resolve(mask, len(model))
    z.delete(mask)
    model = model_delete(model, positions)
    check("mask")

    # Out of range: refused whole, nothing deleted.
    before = z.stats()
    for bad in ([0, len(model)], len(model), -len(model) - 1, [1, -len(model) - 5]):
        with pytest.raises(RecordIndexError):
            z.delete(bad)
    with pytest.raises(RecordIndexError):
        z.delete(np.ones(len(model) + 1, dtype=bool))
    assert z.stats() == before
    check("refused deletes")

    # Random rounds of deletes, appends and compacts.
    rng = random.Random(11)
    next_id = 10_000
    for rnd in range(25):
        op = rng.random()
        if op < 0.5 and model:
            key = [rng.randrange(-len(model), len(model)) for _ in range(rng.randrange(1, 12))]
            positions = resolve(key, len(model))
            z.delete(key)
            model = model_delete(model, positions)
        elif op < 0.8:
            new = [payload(next_id + k, 3) for k in range(rng.randrange(1, 30))]
            next_id += len(new)
            assert z.append(new) == len(model)
            model += new
        else:
            z.compact()
            st = z.stats()
            assert st["reclaimable"] == 0 and st["chunk_bytes"] == st["live_bytes"]
        assert z[:] == model, f"round {rnd}"
    check("random rounds")

    # compact: chunk_bytes shrinks to live_bytes, the data file to match.
    st = z.stats()
    z.delete(list(range(0, len(model), 3)))
    model = model_delete(model, range(0, len(model), 3))
    st = z.stats()
    assert st["reclaimable"] > 0
    live = st["live_bytes"]
    z.compact()
    st = z.stats()
    assert st == {"records": len(model), "live_bytes": live, "chunk_bytes": live, "reclaimable": 0}
    assert os.path.getsize(path / "data") == live
    assert z[:] == model
    z.verify()
    check("compact")
    z.compact()  # nothing to do
    assert z.stats()["reclaimable"] == 0 and z[:] == model

    # Delete everything, compact to nothing, then reuse.
    z.delete(slice(None))
    model = []
    check("delete all")
    z.compact()
    assert z.stats() == {"records": 0, "live_bytes": 0, "chunk_bytes": 0, "reclaimable": 0}
    assert z.append([b"again", b""]) == 0
    model = [b"again", b""]
    check("reuse")
    z.verify()
    z.close()


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


# ----------------------------------------------------------------- 4. interrupted compact

def _compact_records(n: int, seed: int) -> list[bytes]:
    """Mostly small records plus a few large ones (whose moves overlap their old place)."""
    rng = np.random.default_rng(seed)
    pool = rng.bytes(4 * MIB)
    big = rng.random(n) < 0.0015
    sizes = np.where(big, rng.integers(64 << 10, 256 << 10, n), rng.integers(60, 1500, n))
    starts = rng.integers(0, len(pool) - (256 << 10), n)
    out = []
    for i in range(n):
        s, a = int(sizes[i]), int(starts[i])
        half = s // 2
        out.append((i.to_bytes(8, "little") + pool[a:a + half] + bytes([i % 251]) * s)[:s])
    return out


def test_interrupted_compact_is_consistent_and_rerunnable(tmp_path, zygote):
    template = tmp_path / "template"
    recs = _compact_records(70_000, seed=21)
    rng = np.random.default_rng(22)
    with Zrecord(template, create=True, codec="zstd", level=1) as z:
        z.append(recs)
        dead = rng.choice(len(recs), size=len(recs) // 2, replace=False)
        z.delete(dead)
        z.delete([3, 3, -1])  # and a second delete on top
        st0 = z.stats()
    model = model_delete(model_delete(recs, dead.tolist()), resolve([3, 3, -1], len(recs) - len(dead)))
    del recs
    assert st0["reclaimable"] > 10 * MIB
    index0 = (template / "index").read_bytes()
    # The expected content as one buffer: a whole-store comparison is one gather and one memcmp.
    want_sizes = np.array([len(r) for r in model], dtype=np.uint64)
    want = b"".join(model)
    del model
    everything = np.arange(len(want_sizes), dtype=np.int64)

    def fresh(name: str):
        p = tmp_path / name
        shutil.rmtree(p, ignore_errors=True)
        shutil.copytree(template, p)
        return p

    def same_records(z, what: str) -> None:
        assert len(z) == len(want_sizes), what
        buf = bytearray(len(want))
        sizes = z.gather_into(everything, buf)
        assert np.array_equal(sizes, want_sizes), f"{what}: record sizes differ"
        assert buf == want, f"{what}: record bytes differ"

    def check(p, what: str) -> dict:
        with Zrecord(p) as z:
            same_records(z, what)
            z.verify()
            st = z.stats()
        assert st["records"] == len(want_sizes) and st["live_bytes"] == st0["live_bytes"], what
        return st

    def compact_in_child(p, delay: float | None) -> float | None:
        pid = zygote.fork(f"compact {p}")
        zygote.out.expect("start", pid)
        if delay is None:
            return float(zygote.out.expect("done", pid)[2])
        time.sleep(delay)
        zygote.kill(pid)
        return None

    def finish(p, what: str) -> None:
        with Zrecord(p) as z:
            z.compact()
            st = z.stats()
            assert st == {"records": len(want_sizes), "live_bytes": st0["live_bytes"],
                          "chunk_bytes": st0["live_bytes"], "reclaimable": 0}, what
            same_records(z, what)
            z.verify()
        assert os.path.getsize(p / "data") == st0["live_bytes"], what

    # A compact that runs to the end in a child, to time it.
    p = fresh("calibrate")
    took = compact_in_child(p, None)
    assert check(p, "uninterrupted")["reclaimable"] == 0

    # Killed at random points of the run; the window adapts when a kill comes too late or too early.
    timer = random.Random(23)
    window = took
    outcomes = []
    for attempt in range(14):
        p = fresh("attempt")
        delay = timer.uniform(0.1, 0.9) * window
        compact_in_child(p, delay)
        st = check(p, f"attempt {attempt} after the kill")
        moved = (p / "index").read_bytes()[:len(index0)] != index0
        outcome = "not started" if not moved else "finished" if st["reclaimable"] == 0 else "mid-way"
        outcomes.append(f"{outcome}@{delay * 1000:.0f}ms")
        if outcome == "finished":
            window = delay
        elif outcome == "not started":
            window = min(2 * window, 4 * took)
        finish(p, f"attempt {attempt}: compact re-run")
        if sum(o.startswith("mid-way") for o in outcomes) >= 3:
            break
    assert any(o.startswith("mid-way") for o in outcomes), \
        f"no kill landed mid-way (an uninterrupted compact took {took * 1000:.0f}ms): {outcomes}"

    # Several interrupts in a row on one store, then a finishing run.
    p = fresh("chain")
    for k in range(4):
        compact_in_child(p, timer.uniform(0.05, 0.4) * window)
        check(p, f"chained kill {k}")
    finish(p, "chain")
    check(p, "chain, reopened")


# ----------------------------------------------------------------- 5. kill -9 while appending

def test_kill9_during_appends_leaves_an_exact_prefix(tmp_path, zygote):
    """Each victim appends calls of batch_sizes(seed, start, big=True) records
    (some larger than one native append); after every kill the store must
    open, hold exactly the records appended before, and end on a call
    boundary (append is atomic per call)."""
    path = tmp_path / "crash"
    seed = 77
    kills = 60
    timer = random.Random(2024)
    checker = random.Random(7)
    expected: list[bytes] = []

    def exp(i: int) -> bytes:
        while len(expected) <= i:
            expected.append(payload(len(expected), seed))
        return expected[i]

    def check_records(z, lo: int, hi: int, what: str) -> None:
        if hi > lo:
            got = z[lo:hi]
            for i, r in zip(range(lo, hi), got):
                assert r == exp(i), f"{what}: record {i} is not what was appended ({len(r)} vs {len(exp(i))} bytes)"

    def calls(start: int, n: int, salt: int) -> tuple[bool, list[int], int]:
        """Whether n is a call boundary from `start`, the calls completed, the next call's size."""
        at, done = start, []
        for b in batch_sizes(seed, start, salt, big=True):
            if at >= n:
                return at == n, done, b
            at += b
            done.append(b)

    prev = 0
    exists = False
    grew = 0
    big_done = big_cut = 0
    for k in range(kills):
        pid = zygote.fork(f"append {path} {seed} {prev} {k}")
        if k % 6 == 0:
            # Anywhere from fork on: creating or opening the store, the first batch.
            time.sleep(timer.uniform(0, 0.006))
        else:
            zygote.out.expect("open", pid)
            if k % 18 == 9:
                time.sleep(timer.uniform(0.9, 1.4))  # long enough for a multi-chunk call to finish
            elif k % 6 == 3:
                time.sleep(timer.uniform(0.05, 0.4))
            else:
                time.sleep(timer.uniform(0, 0.05))
        zygote.kill(pid)

        try:
            z = Zrecord(path)
        except (StoreNotFoundError, NotAStoreError):
            # Killed while creating the store: acceptable only before it ever existed.
            assert not exists, f"kill {k}: a store that existed no longer opens"
            continue
        exists = True
        with z:
            n = len(z)
            assert n >= prev, f"kill {k}: store shrank from {prev} to {n} records"
            check_records(z, max(0, prev - 16), n, f"kill {k}")
            for i in (checker.randrange(n) for _ in range(64 if n else 0)):
                assert z[i] == exp(i), f"kill {k}: old record {i} changed"
            on_boundary, done, following = calls(prev, n, k)
            assert on_boundary, f"kill {k}: {n} records is not on an append-call boundary (from {prev})"
            if k % 10 == 9:
                check_records(z, 0, n, f"kill {k} (full check)")
                z.verify()
            st = z.stats()
            assert st["records"] == n and st["reclaimable"] == 0
        grew += n > prev
        big_done += sum(b > 16384 for b in done)
        big_cut += following > 16384  # the victim was in (or about to start) a multi-chunk call
        prev = n

    assert exists and grew >= kills // 3, f"only {grew} of {kills} kills came after new appends"
    assert big_cut >= 3, f"only {big_cut} kills came during a multi-chunk append call ({big_done} such calls finished)"
    with Zrecord(path) as z:
        assert len(z) == prev
        check_records(z, 0, prev, "final")
        z.verify()
        # The store is still writable by a new writer after all that.
        assert z.append([b"the end"]) == prev
    assert Zrecord(path)[prev] == b"the end"


# ----------------------------------------------------------------- 6. concurrency

def test_concurrent_gathers_see_only_whole_committed_records(tmp_path):
    seed, total = 9, 24_000
    exp = [payload(i, seed) for i in range(total)]
    path = tmp_path / "conc"
    w = Zrecord(path, create=True, codec="zstd")
    other = Zrecord(path)  # a second handle, opened separately, only reads
    failures: list[str] = []
    writing = threading.Event()
    done = threading.Event()
    reads_during_writes = [0]

    def writer():
        try:
            writing.set()
            i = 0
            for b in batch_sizes(seed, 0):
                b = min(b, total - i)
                first = w.append(exp[i:i + b])
                if first != i:
                    failures.append(f"append returned {first}, expected {i}")
                    return
                i += b
                if i == total:
                    return
        except Exception as e:
            failures.append(f"writer: {type(e).__name__}: {e}")
        finally:
            done.set()

    def reader(h: Zrecord, rs: int, into: bool):
        rng = np.random.default_rng(rs)
        last = 0
        try:
            writing.wait()
            while not failures:
                finished = done.is_set()
                n = len(h)
                if n < last:
                    failures.append(f"len went back from {last} to {n}")
                    return
                last = n
                if n:
                    idx = rng.integers(0, n, int(rng.integers(1, 65)))
                    idx[0] = n - 1  # always the newest committed record
                    if into:
                        buf = bytearray(sum(len(exp[i]) for i in idx))
                        sizes = h.gather_into(idx, buf)
                        recs, at = [], 0
                        for s in sizes.tolist():
                            recs.append(bytes(buf[at:at + s]))
                            at += s
                    else:
                        recs = h[idx]
                    for i, r in zip(idx.tolist(), recs):
                        if r != exp[i]:
                            failures.append(f"record {i}: got {len(r)} bytes {r[:16]!r}, expected {len(exp[i])} bytes")
                            return
                    if not finished:
                        reads_during_writes[0] += 1
                if finished:
                    return
        except Exception as e:
            failures.append(f"reader: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=writer)]
    threads += [threading.Thread(target=reader, args=(h, 100 + k, k % 2 == 1))
                for k, h in enumerate([w, w, other, other])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not failures, failures[:5]
    assert reads_during_writes[0] > 20, "readers barely overlapped the appends"
    assert len(w) == len(other) == total
    assert w[:] == exp and other[:] == exp
    other.verify()
    other.close()
    w.close()


def test_a_multi_chunk_append_becomes_visible_at_once(tmp_path):
    """One append call larger than a native append is published as a whole:
    another handle sees the length jump from before to after, nothing between."""
    path = tmp_path / "big"
    seed, count = 13, 20_000
    w = Zrecord(path, create=True, codec="zstd")
    w.append([payload(i, seed) for i in range(10)])
    other = Zrecord(path)
    seen = set()
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.add(len(other))
            time.sleep(0.0002)

    t = threading.Thread(target=watch)
    t.start()
    try:
        first = w.append(payload(i, seed) for i in range(10, 10 + count))  # a one-pass iterator
    finally:
        stop.set()
        t.join()
    seen.add(len(other))
    assert first == 10
    assert seen <= {10, 10 + count}, f"partial appends were visible: {sorted(seen)[:10]}"
    assert other[:] == [payload(i, seed) for i in range(10 + count)]
    st = w.stats()
    assert st["records"] == 10 + count and st["reclaimable"] == 0
    other.verify()
    other.close()
    w.close()


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


# ----------------------------------------------------------------- 7. locking

def test_writer_lock_and_exclusive_delete_compact_in_one_process(tmp_path):
    path = tmp_path / "lock"
    a = Zrecord(path, create=True, codec="zstd")
    assert a.append([b"a0", b"a1", b"a2"]) == 0
    b = Zrecord(path)
    with pytest.raises(LockedError, match="lock") as ei:
        b.append([b"from b"])
    assert str(path) in str(ei.value)
    for mutate in (lambda: b.delete([0]), b.compact):
        with pytest.raises(LockedError):
            mutate()
    assert len(b) == 3 and b[:] == [b"a0", b"a1", b"a2"]
    assert a.append([b"a3"]) == 3
    assert len(b) == 4 and b[3] == b"a3"  # the other handle sees new commits

    # delete/compact through the writer while another handle is open: refused, nothing changes.
    snap, st = a[:], a.stats()
    files = snapshot(path)
    for key in ([0], slice(None), -1):
        with pytest.raises(BusyError) as ei:
            a.delete(key)
        assert str(path) in str(ei.value)
    with pytest.raises(BusyError):
        a.compact()
    assert a[:] == snap == b[:] and a.stats() == st
    assert snapshot(path) == files
    # Both handles still work, and a third one can still open.
    assert a.append([b"a4"]) == 4
    snap.append(b"a4")
    assert b[4] == b"a4"
    with Zrecord(path) as c:
        assert c[:] == snap
    b.close()

    a.delete([0])
    snap = model_delete(snap, [0])
    assert a[:] == snap
    a.append([b"x"] * 20)
    a.delete(slice(0, 20))
    d = Zrecord(path)
    with pytest.raises(BusyError):
        a.compact()  # d is open
    d.close()
    snap = model_delete(snap + [b"x"] * 20, range(20))
    a.compact()
    assert a[:] == snap and a.stats()["reclaimable"] == 0
    a.close()

    # close() released the writer lock.
    with Zrecord(path) as e:
        assert e.append([b"e"]) == len(snap)
        snap.append(b"e")
    with Zrecord(path) as f:
        assert f[:] == snap
        f.verify()


def _spawn_holder(tmp_path, path, name: str):
    err = str(tmp_path / f"{name}.stderr")
    with open(err, "wb") as ef:
        proc = subprocess.Popen([sys.executable, WRITER, "hold", str(path)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=ef, env=child_env(), cwd=ROOT)
    return proc, LineReader(proc, err)


def test_writer_lock_across_processes(tmp_path):
    path = tmp_path / "xlock"
    with Zrecord(path, create=True, codec="raw") as z:
        z.append([b"parent 0"])
    parent = Zrecord(path)  # opened before the child writes
    child, out = _spawn_holder(tmp_path, path, "holder1")
    try:
        out.expect("locked")
        assert len(parent) == 2 and parent[1] == b"held by the child"
        with pytest.raises(LockedError, match="lock"):
            parent.append([b"parent 1"])
        with pytest.raises(LockedError):
            parent.delete([0])
        with pytest.raises(LockedError):
            Zrecord(path).append([b"a fresh handle"])
        assert parent[:] == [b"parent 0", b"held by the child"]
        child.stdin.write(b"\n")
        child.stdin.flush()
        out.expect("closed")
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert parent.append([b"parent 1"]) == 2  # the lock is free again
    parent.close()

    # A writer killed with -9 frees the lock too.
    child, out = _spawn_holder(tmp_path, path, "holder2")
    try:
        out.expect("locked")
        q = Zrecord(path)
        with pytest.raises(LockedError):
            q.append([b"q"])
    finally:
        child.kill()
        child.wait()
    assert q.append([b"q"]) == 4
    assert q[:] == [b"parent 0", b"held by the child", b"parent 1", b"held by the child", b"q"]
    q.verify()
    q.close()


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
            z.gather_into([n], bytearray(10))
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
           lambda s: s.gather_into([0], bytearray(1)), lambda s: s.dictionary(), lambda s: s.__enter__()]
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
            for read in (lambda: z[victim], lambda: z[:], lambda: z.gather_into([victim], bytearray(1 << 16))):
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
                 lambda: rs.gather_packed([0], threads=bad), lambda: z.gather([0], threads=bad),
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
def test_gather_into_refuses_a_buffer_it_cannot_fill_in_place(tmp_path, make):
    """Before the fix, a Fortran-order or sliced 2-D `out` was filled through a
    temporary copy: gather_into returned the sizes but the caller's buffer
    stayed zero. Strided int32 arrays and memoryviews raised raw numpy errors."""
    with Zrecord(tmp_path / "z", create=True) as z:
        z.append([b"abcdef"])
        out = make()
        with pytest.raises(SizeMismatchError, match="out must be C-contiguous"):
            z.gather_into([0], out)
        assert not bytes(np.asarray(out).tobytes()).strip(b"\0")
        with pytest.raises(TypeError, match="out .*list"):
            z.gather_into([0], [0] * 8)


def test_gather_into_offsets_past_the_buffer_do_not_wrap(tmp_path):
    """Before the fix, an offset near 2**64 wrapped the end past zero, passed
    the fit check, and numpy raised "could not broadcast ... into shape (0,)"."""
    with Zrecord(tmp_path / "z", create=True) as z:
        z.append([b"abcdef", b"x"])
        for offset in (2**64 - 2, 2**64 - 1, 11):
            with pytest.raises(SizeMismatchError, match="does not fit the 10-byte buffer"):
                z.gather_into([1, 0], bytearray(10), np.array([0, offset], np.uint64))
        with pytest.raises(SizeMismatchError, match="does not fit"):
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
    """Before the fix, gather_into(offsets=[0.5]) silently truncated to 0."""
    with Zrecord(tmp_path / "z", create=True) as z:
        z.append([b"abc"])
        with pytest.raises(TypeError, match="integers"):
            z.gather_into([0], bytearray(8), offsets=[0.5])
        with pytest.raises(ValueError, match="non-negative"):
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
