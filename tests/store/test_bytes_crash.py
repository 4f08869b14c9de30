"""The byte store under kill -9 (SIGKILL), from a zygote that has imported
loaderx once (tests/_crash_writer.py), so dozens of kills cost milliseconds:

4. A ``compact`` SIGKILLed mid-way leaves a consistent store; re-running ends it.
5. ``kill -9`` at 60 random instants of an appending process always leaves an
   openable store holding an exact prefix of what was appended, ending on an
   append-call boundary (calls larger than one native append included)."""
from __future__ import annotations

import os
import random
import shutil
import time

import numpy as np
import pytest

from loaderx.errors import NotAStoreError, StoreNotFoundError
from loaderx.zrecord import Zrecord  # noqa: F401
from _bytestore import MIB, Zygote, batch_sizes, model_delete, payload, resolve


@pytest.fixture
def zygote(tmp_path):
    z = Zygote(tmp_path)
    try:
        yield z
    finally:
        z.close()


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
        _, splits = z.gather(everything, out=buf, packed=True)
        assert np.array_equal(np.diff(splits).astype(np.uint64), want_sizes), f"{what}: record sizes differ"
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

@pytest.mark.slow
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
