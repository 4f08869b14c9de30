"""Fixtures of the DataLoader tests: the streams most tests run twice (on
in-memory fake stores and on real store files), and the check that a test
leaves no loader thread running. (The counting dense store, `store`, is the
suite's: tests/conftest.py.)"""
import gc

import numpy as np
import pytest
from _fakes import LENGTH, FakeDenseStore, FakeRaggedStore, dense_rows, import_zrecord, ragged_rows
from _helpers import loader_threads


@pytest.fixture(params=["fake", "real"])
def streams(request, tmp_path):
    """{"x": dense int64 (2,), "r": ragged int32} of LENGTH records."""
    if request.param == "fake":
        yield {"x": FakeDenseStore(dense_rows(LENGTH)), "r": FakeRaggedStore(ragged_rows(LENGTH), np.int32)}
        return
    zrecord = import_zrecord()
    dense = zrecord.DenseStore(str(tmp_path / "x"), np.int64, (2,))
    ragged = zrecord.RaggedStore(str(tmp_path / "r"), np.int32)
    try:
        dense.append(dense_rows(LENGTH))
        ragged.append(ragged_rows(LENGTH))
        yield {"x": dense, "r": ragged}
    finally:
        dense.close()
        ragged.close()


@pytest.fixture
def no_thread_leaks():
    """Fails the test that leaves a loader's threads running (the worker,
    prefetch and ring threads; not the process-wide network threads)."""
    yield
    gc.collect()
    assert loader_threads() == [], "a test left loaderx threads running"
