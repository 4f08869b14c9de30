"""What the tests of the byte store (``loaderx.zrecord.Zrecord``, the native
record engine of SPEC §2-§3, through the public Python API) share: record
makers, the Python model of swap-last deletion, stores per codec, and the
child processes of the crash and locking tests (a line reader with a
deadline, and the forking zygote of tests/_crash_writer.py, which imports
loaderx once so that dozens of kills cost milliseconds each)."""
from __future__ import annotations

import importlib.util
import json
import os
import random
import select
import signal
import subprocess
import sys
import time

import numpy as np

from loaderx.zrecord import Zrecord, train_dict  # noqa: F401

from _helpers import ROOT, TESTS, swap_last_order

WRITER = os.path.join(TESTS, "_crash_writer.py")

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


def run_isolated(code: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for checks that could crash it)."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=child_env(), cwd=ROOT, timeout=timeout)
