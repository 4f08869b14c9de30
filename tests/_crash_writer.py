"""Child processes for the crash and locking tests of the byte store
(``tests/store/test_bytes_crash.py``, ``tests/store/test_bytes_concurrency.py``).

``python _crash_writer.py zygote``
    Imports loaderx once, prints ``ready``, then serves commands read from
    stdin, one a line, so that each crash victim costs a fork instead of a
    Python start-up (the tests kill dozens of them). The zygote itself never
    touches a store. Commands and what is printed (one line each):

    ``append PATH SEED EXPECTED SALT``
        forks a child that opens (creating, codec zstd) the store, checks it
        holds exactly EXPECTED records (else prints ``error PID ...``), prints
        ``open PID LEN``, then appends ``payload(i, SEED)`` for i = LEN, LEN+1,
        ... in calls of ``batch_sizes(SEED, LEN, SALT, big=True)`` records,
        forever (until killed).
    ``compact PATH``
        forks a child that opens the store, prints ``start PID``, runs
        ``compact()``, prints ``done PID SECONDS`` and exits.
    ``reap PID``
        waits for that child to end; prints ``reaped PID STATUS``.
    ``quit``
        exits.

    After every fork the zygote prints ``forked PID``.

``python _crash_writer.py hold PATH``
    Opens the store, appends one record (taking the writer lock), prints
    ``locked``, waits for one line on stdin, closes, prints ``closed``.

`payload` is imported by the tests, so parent and children agree on what
record i must hold.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time

_SIZES = (0, 1, 8, 17, 64, 100, 200, 333, 700, 1024, 1500, 2900)


def payload(i: int, seed: int = 0) -> bytes:
    """Record `i`'s exact content: deterministic, distinct for every index when
    at least 8 bytes long (it starts with the index), about a third noise."""
    key = seed.to_bytes(8, "little") + i.to_bytes(8, "little")
    h = hashlib.blake2b(key, digest_size=16).digest()
    n = _SIZES[h[0] % len(_SIZES)] + (h[1] if h[0] & 0x80 else 0)
    if n == 0:
        return b""
    head = i.to_bytes(8, "little")
    if h[2] % 3 == 0:
        body = hashlib.shake_128(key).digest(n)  # noise: a zstd store keeps it raw
    else:
        unit = head + h
        body = unit * (n // len(unit) + 1)
    return (head + body)[:n]


def batch_sizes(seed: int, start: int, salt: int = 0, big: bool = False):
    """An endless, deterministic stream of batch sizes: 1..48 records, and with
    `big` about one batch in 40 of 16385..18425 records (more than one chunk of
    ``Zrecord.append``, so one call spans several native appends)."""
    k = 0
    while True:
        h = hashlib.blake2b(f"{seed}:{start}:{salt}:{k}".encode(), digest_size=3).digest()
        yield 16385 + 8 * h[1] if big and h[0] * 256 + h[2] < 65536 // 40 else 1 + h[1] % 48
        k += 1


def _say(line: str) -> None:
    # One short write per line: lines of the zygote and its children never mix.
    os.write(1, (line + "\n").encode())


def _append_forever(path: str, seed: int, expected: int, salt: int) -> None:
    from loaderx.zrecord import Zrecord

    pid = os.getpid()
    z = Zrecord(path, create=True, codec="zstd")
    n = len(z)
    if n != expected:
        _say(f"error {pid} store holds {n} records, expected {expected}")
        os._exit(3)
    _say(f"open {pid} {n}")
    i = n
    for b in batch_sizes(seed, n, salt, big=True):
        # A generator: a big call is still being produced while its first chunk is written.
        first = z.append(payload(j, seed) for j in range(i, i + b))
        if first != i:
            _say(f"error {pid} append returned {first}, expected {i}")
            os._exit(4)
        i += b


def _compact(path: str) -> None:
    from loaderx.zrecord import Zrecord

    pid = os.getpid()
    z = Zrecord(path)
    _say(f"start {pid}")
    t = time.perf_counter()
    z.compact()
    elapsed = time.perf_counter() - t
    z.close()
    _say(f"done {pid} {elapsed:.6f}")


def _fork(target, *args) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            target(*args)
        except BaseException as e:  # report, never fall back into the zygote loop
            _say(f"error {os.getpid()} {type(e).__name__}: {e}")
            code = 5
        finally:
            os._exit(code)
    _say(f"forked {pid}")


def zygote() -> int:
    import loaderx.zrecord  # noqa: F401  (the slow part of start-up, done once)

    _say("ready")
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cmd = words[0]
        if cmd == "append":
            _fork(_append_forever, words[1], int(words[2]), int(words[3]), int(words[4]))
        elif cmd == "compact":
            _fork(_compact, words[1])
        elif cmd == "reap":
            pid = int(words[1])
            _, status = os.waitpid(pid, 0)
            _say(f"reaped {pid} {status}")
        elif cmd == "quit":
            return 0
        else:
            _say(f"error 0 unknown command {cmd!r}")
    return 0


def hold(path: str) -> int:
    from loaderx.zrecord import Zrecord

    z = Zrecord(path)
    z.append([b"held by the child"])
    _say("locked")
    sys.stdin.readline()
    z.close()
    _say("closed")
    return 0


if __name__ == "__main__":
    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if _root not in sys.path:
        sys.path.insert(0, _root)
    if sys.argv[1] == "zygote":
        sys.exit(zygote())
    if sys.argv[1] == "hold":
        sys.exit(hold(sys.argv[2]))
    sys.exit(f"unknown mode {sys.argv[1]!r}")
