"""Audit of stores across processes: what a forked child inherits, and what a
killed conversion leaves behind.

1. A forked child's inherited handle is another open handle: the parent's
   delete and compact are refused (`BusyError`) while the child has it open,
   instead of moving records under the child's reads (wrong bytes).
2. A forked child that never writes does not keep the parent's writer lock
   once the parent closes the store.
3. The worker processes of a conversion stop when the converting process is
   killed, instead of converting on for nobody.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from loaderx import DenseStore
from loaderx.errors import BusyError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")


def _rows(ids) -> np.ndarray:
    return np.asarray(ids, np.int64)[:, None] * 1000 + np.arange(8, dtype=np.int64)


def _fork(child) -> tuple[int, int, int]:
    """Forks; the child runs child(read_fd, write_fd) and exits with its
    result. Returns (pid, parent's read end, parent's write end)."""
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(from_parent)
            os.close(to_parent)
            code = child(to_child, from_child)
        finally:
            os._exit(code)
    os.close(to_child)
    os.close(from_child)
    return pid, to_parent, from_parent


def _wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_forked_childs_handle_blocks_the_parents_delete_and_compact(tmp_path):
    """Before the fix the child shared the parent's lock on meta, so the
    parent's delete saw no other handle and moved records while the child
    read: a raw store returned torn rows to the child."""
    store = DenseStore(tmp_path / "s", np.int64, (8,), codec="raw")
    store.append(_rows(range(100)))

    def child(rfd, wfd):
        ok = (store[np.arange(100)] == _rows(range(100))).all()
        os.write(wfd, b"r")
        os.read(rfd, 1)  # the parent tried to delete
        ok = ok and (store[np.arange(100)] == _rows(range(100))).all()
        store.close()  # gives the store back to the parent
        os.write(wfd, b"c")
        os.read(rfd, 1)
        return 0 if ok else 3

    pid, rfd, wfd = _fork(child)
    try:
        assert os.read(rfd, 1) == b"r"
        for mutate in (lambda: store.delete([0, 5]), store.compact):
            with pytest.raises(BusyError, match="another handle has this store open"):
                mutate()
        assert (store[np.arange(100)] == _rows(range(100))).all()
        os.write(wfd, b"d")
        assert os.read(rfd, 1) == b"c"
        store.delete([0])  # the child closed its copy: exclusive again
        assert store[[0]].tolist() == _rows([99]).tolist()
    finally:
        os.write(wfd, b"x")
        assert _wait(pid) == 0
    store.close()


def test_a_forked_child_does_not_keep_the_parents_writer_lock(tmp_path):
    """Before the fix the child's copy of the lock file kept the writer lock
    after the parent closed the store: reopening it to append raised
    LockedError until the child (a torch worker, a pool) exited."""
    path = tmp_path / "s"
    store = DenseStore(path, np.int64, (8,))
    store.append(_rows(range(10)))  # takes the writer lock

    def child(rfd, wfd):
        os.write(wfd, b"r")  # past the fork handler
        return 0 if os.read(rfd, 1) == b"x" else 3

    pid, rfd, wfd = _fork(child)
    try:
        assert os.read(rfd, 1) == b"r"
        store.close()
        with DenseStore(path) as again:
            assert again.append(_rows([10])) == 10
        with DenseStore(path) as again:
            assert (again[:] == _rows(range(11))).all()
    finally:
        os.write(wfd, b"x")
        assert _wait(pid) == 0


# ----------------------------------------------------------------- 3. convert workers

_SLOW_SOURCE = '''
import time
import numpy as np
from loaderx.converters._source import Batch, Source

class SlowSource(Source):
    """One batch, then a wait far longer than the test: a long conversion."""
    def __init__(self):
        pass
    def read(self, task, specs, batch_bytes):
        yield Batch(rows=4, columns={"x": np.zeros((4, 2), np.int32)}, progress=4)
        time.sleep(120)
'''

_PARENT = '''
import os, sys
import numpy as np
from loaderx.converters._columns import ColumnSpec
from loaderx.converters._run import StoreOptions, run_tasks
from slow_source import SlowSource

class Progress:
    def update(self, n, records=0, nbytes=0):
        pass

root = sys.argv[1]
specs = [ColumnSpec("x", "dense", np.dtype(np.int32), (2,))]
paths = [{"x": os.path.join(root, f"part-{k}")} for k in range(2)]
opts = StoreOptions(codecs={"x": "raw"}, level=None, dicts={}, batch_bytes=1 << 20)
run_tasks(SlowSource(), [0, 1], specs, paths, opts, Progress())
'''


def _children(pid: int) -> list[int]:
    found = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_convert_workers_stop_when_the_converting_process_is_killed(tmp_path):
    """Before the fix the workers of a SIGKILLed `convert(workers=N)` went on
    converting (for hours on a large source) into a staging directory that
    nobody would ever commit."""
    (tmp_path / "slow_source.py").write_text(_SLOW_SOURCE)
    (tmp_path / "parent.py").write_text(_PARENT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py"), str(tmp_path)],
                              env=env, stdout=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline:
            workers = _children(parent.pid)
            time.sleep(0.02)
        assert len(workers) == 2, "the conversion never started its two workers"
        while not all((tmp_path / f"part-{k}" / "meta").exists() for k in range(2)):
            assert time.monotonic() < deadline, "the workers never opened their stores"
            time.sleep(0.02)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(_alive, workers)), "workers outlived the killed conversion"
    finally:
        for pid in [parent.pid] + workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        parent.wait()
