"""A DataLoader over remote stores: its ring stages the steps itself
(src/loader/Stage.zig, the loaderx-stage thread fetching only the plans'
byte ranges), within ``prefetch_bytes``, failing a step whose fetch fails
with the server's error, and resuming exactly after a reset."""
from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")

import loaderx  # noqa: E402
from loaderx import remote  # noqa: E402
from loaderx.errors import RemotePermissionError  # noqa: E402

from _helpers import assert_same  # noqa: E402
from _remote_helpers import REC, opened  # noqa: E402

pytestmark = pytest.mark.slow


def _fetch_counter(monkeypatch) -> list:
    """Each fetch of a step's records (Binding._fetch), by thread name."""
    fetches: list = []
    fetch = remote.Binding._fetch

    def counted(self, f):
        fetches.append(threading.current_thread().name)
        return fetch(self, f)
    monkeypatch.setattr(remote.Binding, "_fetch", counted)
    return fetches


def test_a_remote_loader_stays_within_prefetch_bytes_and_reads_the_local_batches(
        tmp_path, s3, url, local_ds, monkeypatch):
    ds = opened(url, tmp_path / "cache", s3, columns=["raw"])
    local = loaderx.open_dataset(local_ds, columns=["raw"])
    fetches = _fetch_counter(monkeypatch)
    step_bytes = 16 * REC
    try:
        for budget, lead in ((2 * step_bytes, 2), (None, 6)):
            fetches.clear()
            a = loaderx.DataLoader(ds, 16, seed=3, workers=2, prefetch=4, prefetch_bytes=budget)
            b = loaderx.DataLoader(local, 16, seed=3, workers=2, prefetch=4)
            leads = []
            with a, b:
                for step in range(20):
                    assert_same(next(a)["raw"], next(b)["raw"])
                    # A slow consumer: the fetches run ahead. Without a
                    # budget, wait (on a loaded machine, as long as it takes)
                    # for them to fill the window; with one, give them the
                    # time to overrun it if they could.
                    deadline = time.monotonic() + (10.0 if budget is None else 0.15)
                    while time.monotonic() < deadline:
                        if budget is None and len(fetches) - (step + 1) >= 4:
                            break
                        time.sleep(0.01)
                    # Steps fetched ahead of the consumer: within the budget
                    # (the steps before one, not handed over, and its own),
                    # else within the window (prefetch + workers).
                    leads.append(len(fetches) - (step + 1))
                assert "loaderx-stage" in {t.name for t in threading.enumerate()}
            assert max(leads) <= lead
            if budget is None:
                assert max(leads) >= 4  # the window is used without a budget
            assert set(fetches) == {"loaderx-stage"} and len(fetches) >= 20
            ds["raw"]._remote.replica()  # (still open)
            # A fresh cache for the run without a budget.
            ds["raw"].close()
            ds = opened(url, tmp_path / "cache-2", s3, columns=["raw"])
    finally:
        for s in list(ds.values()) + list(local.values()):
            s.close()


def test_a_failed_fetch_fails_its_step_with_the_servers_error(tmp_path, s3, url, proxy):
    base, faults = proxy
    ds = opened(url, tmp_path / "cache", s3, base, columns=["raw"])
    try:
        faults.add("403", 10_000, lambda m, p: m == "GET" and p.endswith("/data"))
        loader = loaderx.DataLoader(ds, 16, seed=3, workers=2)
        with pytest.raises(RemotePermissionError) as e:
            next(loader)
        assert isinstance(e.value, PermissionError)
        if sys.version_info >= (3, 11):  # (exception notes are new in 3.11)
            assert any("fetching step 0 into the node-local cache" in note
                       for note in getattr(e.value, "__notes__", []))
        with pytest.raises(RuntimeError, match="stopped after an error at step 0"):
            next(loader)
        loader.close()
    finally:
        faults.plan.clear()
        ds["raw"].close()


def test_a_remote_loader_resets_and_resumes_on_the_local_copy_exactly(
        tmp_path, s3, url, local_ds):
    ds = opened(url, tmp_path / "cache", s3, columns=["raw"])
    local = loaderx.open_dataset(local_ds, columns=["raw"])
    try:
        with loaderx.DataLoader(local, 16, seed=9, workers=2) as reference:
            want = [next(reference)["raw"].copy() for _ in range(14)]
        with loaderx.DataLoader(ds, 16, seed=9, workers=2) as loader:
            for step in range(4):
                assert_same(next(loader)["raw"], want[step])
            state = loader.state_dict()
            for step in range(4, 9):  # steps fetched and built ahead, then dropped
                assert_same(next(loader)["raw"], want[step])
            loader.load_state_dict(state)
            for step in range(4, 10):
                assert_same(next(loader)["raw"], want[step])
            later = loader.state_dict()
        with loaderx.DataLoader(local, 16, seed=9, workers=2) as resumed:
            resumed.load_state_dict(later)
            for step in range(10, 14):
                assert_same(next(resumed)["raw"], want[step])
    finally:
        for s in list(ds.values()) + list(local.values()):
            s.close()
