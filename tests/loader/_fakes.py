"""What the DataLoader tests share: in-memory fake stores with the store
interface (dense, ragged, bytes) whose records reveal their index, the
sampler's expected indices, and small helpers (take steps, consume on a
thread, the loader's worker threads, transforms)."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from _helpers import ROOT, TESTS

from loaderx.zsampler import Sampler

LENGTH = 1000


class FakeDenseStore:
    """An in-memory dense store with the loaderx store interface."""

    kind = "dense"

    def __init__(self, data, fail_on=None):
        self._data = np.ascontiguousarray(data)
        self.dtype = self._data.dtype
        self.item_shape = self._data.shape[1:]
        self.path = "<memory>"
        # A gather whose first index is fail_on raises, to inject errors.
        self.fail_on = fail_on

    def __len__(self):
        return len(self._data)

    def gather(self, indices, out=None):
        indices = np.asarray(indices, dtype=np.int64)
        if self.fail_on is not None and len(indices) and indices[0] == self.fail_on:
            raise OSError(f"injected read error at index {self.fail_on}")
        if out is None:
            return self._data[indices]
        np.take(self._data, indices, axis=0, out=out)
        return out


class FakeRaggedStore:
    kind = "ragged"

    def __init__(self, records, dtype):
        self._records = [np.asarray(record, dtype=dtype) for record in records]
        self.dtype = np.dtype(dtype)
        self.item_shape = None
        self.path = "<memory>"

    def __len__(self):
        return len(self._records)

    def gather(self, indices, out=None):
        return [self._records[i].copy() for i in np.asarray(indices, dtype=np.int64)]


class FakeBytesStore:
    kind = "bytes"
    dtype = None
    item_shape = None
    path = "<memory>"

    def __init__(self, records):
        self._records = list(records)

    def __len__(self):
        return len(self._records)

    def gather(self, indices, out=None):
        return [self._records[i] for i in np.asarray(indices, dtype=np.int64)]


def dense_rows(length):
    """Record i is [i, 3i + 1]: the content reveals the index."""
    index = np.arange(length, dtype=np.int64)
    return np.stack([index, 3 * index + 1], axis=1)


def ragged_rows(length):
    """Record i is i repeated i % 5 times (so zero-length records occur)."""
    return [np.full(i % 5, i, dtype=np.int32) for i in range(length)]


def import_zrecord():
    try:
        import loaderx.zrecord as zrecord
    except ImportError as exc:  # The native store engine is built separately.
        pytest.skip(f"real-store variant: loaderx.zrecord is not importable yet ({exc})")
    return zrecord


def fake_streams(length=LENGTH, fail_on=None):
    return {"x": FakeDenseStore(dense_rows(length), fail_on=fail_on)}


def indices_of(batch):
    return batch["x"][:, 0].copy()


def expected_indices(step, batch_size, mode=Sampler.Mode.CYCLIC, seed=0, shard=None, length=LENGTH):
    return Sampler(length, batch_size, mode, seed, shard=shard).at(step)


def take(loader, count):
    return [next(loader) for _ in range(count)]


def worker_threads():
    return [thread for thread in threading.enumerate() if thread.name.startswith("loaderx-worker")]


def consume_in_thread(loader):
    """Starts a thread that takes batches until next() raises RuntimeError
    (kept in outcome["error"])."""
    outcome = {}

    def consume():
        try:
            while True:
                next(loader)
        except RuntimeError as exc:
            outcome["error"] = exc

    consumer = threading.Thread(target=consume)
    consumer.start()
    return consumer, outcome


def identity(batch):
    return batch


def jitter(batch):
    """A transform that finishes batches out of order."""
    time.sleep(random.random() * 0.002)
    return batch


def run_script(script, *args, timeout=300):
    """`script` in a fresh interpreter; the repository (loaderx) and tests/
    (the scripts' shared helpers) on its PYTHONPATH."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS]))
    return subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)
