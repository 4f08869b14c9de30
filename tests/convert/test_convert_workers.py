"""The worker processes of a conversion (`convert(workers=N)`,
loaderx/converters/_run.py): they run one per usable core at a time, and they
stop when the converting process is killed instead of converting on for
nobody."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from _helpers import ROOT, convert_quiet

import loaderx



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
    scratch = tmp_path / "tmp"  # where the conversion keeps its workers' jobs
    scratch.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]),
               TMPDIR=str(scratch))
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
        # The killed parent removed nothing; its workers removed their jobs
        # and the work directory.
        assert [p.name for p in scratch.iterdir()] == []
    finally:
        for pid in [parent.pid] + workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        parent.wait()


@pytest.mark.slow
def test_more_workers_than_cores_run_a_core_s_worth_at_a_time(tmp_path, monkeypatch):
    """workers=N started N interpreters at once whatever the cores (20 for
    workers=10**6 on 20 rows). They now run one per usable core at a time,
    and every task still becomes its shard."""
    from loaderx.converters import _run

    monkeypatch.setattr(_run, "_cores", lambda: 1)
    real = _run.subprocess.Popen
    started: list = []

    def popen(*args, **kw):
        assert all(p.poll() is not None for p in started), "two workers ran at once"
        started.append(real(*args, **kw))
        return started[-1]

    monkeypatch.setattr(_run.subprocess, "Popen", popen)
    x = np.arange(30, dtype=np.int64).reshape(10, 3)
    np.save(tmp_path / "x.npy", x)
    convert_quiet(tmp_path / "x.npy", tmp_path / "out", workers=3)
    assert len(started) == 3
    col = loaderx.open_dataset(tmp_path / "out")["x"]
    assert col[np.arange(10)].tolist() == x.tolist()


_GATED_SOURCE = '''
import os, time
import numpy as np
from loaderx.converters._source import Batch, Source

class GatedSource(Source):
    """A batch, then another once the file `gate` exists: its progress
    report is written to a stdout whose reader is gone."""
    def __init__(self, gate):
        self.gate = gate
    def read(self, task, specs, batch_bytes):
        yield Batch(rows=4, columns={"x": np.zeros((4, 2), np.int32)}, progress=4)
        while not os.path.exists(self.gate):
            time.sleep(0.01)
        yield Batch(rows=4, columns={"x": np.zeros((4, 2), np.int32)}, progress=4)
        time.sleep(120)
'''


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_a_worker_whose_stdout_breaks_first_leaves_the_ending_to_its_parent_watch(tmp_path):
    """A killed parent closes the worker's stdout and stdin together, and the
    task may fail on its broken stdout before the watch sees stdin end. The
    failing task wrote an error file into the directory being removed and
    exited with the job file left (the kill test failed on it about once in
    a few hundred runs). Now the task leaves the ending to the watch, which
    removes the job and the directory."""
    import pickle

    from loaderx.converters._columns import ColumnSpec
    from loaderx.converters._run import StoreOptions

    (tmp_path / "gated_source.py").write_text(_GATED_SOURCE)
    work = tmp_path / "work"
    work.mkdir()
    job = work / "task-0.pickle"
    sys.path.insert(0, str(tmp_path))
    try:
        from gated_source import GatedSource  # type: ignore[import-not-found]

        specs = [ColumnSpec("x", "dense", np.dtype(np.int32), (2,))]
        opts = StoreOptions(codecs={"x": "raw"}, level=None, dicts={}, batch_bytes=1 << 20)
        gate = tmp_path / "gate"
        with open(job, "wb") as f:
            pickle.dump((GatedSource(str(gate)), 0, specs, {"x": str(tmp_path / "part")}, opts), f)
    finally:
        sys.path.remove(str(tmp_path))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]),
               LOADERX_CONVERT_PARENT_PIPE="1")
    worker = subprocess.Popen([sys.executable, "-m", "loaderx.converters._worker", str(job)],
                              env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
    try:
        assert worker.stdout.readline().startswith("P ".encode())
        worker.stdout.close()  # the parent's reading end gone, its writing end not yet
        gate.touch()
        time.sleep(1.0)  # the second report fails on the broken stdout
        assert worker.poll() is None, "the worker ended before its parent's pipe did"
        assert sorted(p.name for p in work.iterdir()) == ["task-0.pickle"]
        worker.stdin.close()
        assert worker.wait(timeout=20) == 3
        assert not work.exists()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
