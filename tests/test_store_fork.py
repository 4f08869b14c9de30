"""A store handle across fork(): the library's own after-fork hook (src/Store.zig,
run by `pthread_atfork` in every child) gives the child its own shared lock
on each inherited store's `meta` and drops its copies of the writer lock.

The hole this closes: a child forked while the parent's delete (or compact)
held `meta` exclusively got no lock at all (the old Python fork handler's
non-blocking lock attempt failed), so the parent's next delete saw no other
handle and moved records under the child's reads.
"""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from loaderx import DenseStore
from loaderx.errors import BusyError

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")


def _rows(ids) -> np.ndarray:
    return np.asarray(ids, np.int64)[:, None] * 1000 + np.arange(8, dtype=np.int64)


def _fork_reader(store) -> tuple[int, int, int]:
    """Forks a child that reads `store` once, reports, waits for a byte and
    exits 0 if every read was consistent."""
    to_child, from_parent = os.pipe()
    to_parent, from_child = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(from_parent)
            os.close(to_parent)
            n = len(store)
            got = store[np.arange(n)]
            ok = bool((got[:, 1:] - got[:, :1] == np.arange(1, 8)).all())
            os.write(from_child, b"r")
            os.read(to_child, 1)
            code = 0 if ok else 3
        except BaseException:  # noqa: BLE001 - shown, and reported by the exit code
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(to_child)
    os.close(from_child)
    return pid, to_parent, from_parent


def test_a_child_forked_during_the_parents_delete_holds_its_own_lock(tmp_path):
    store = DenseStore(tmp_path / "s", np.int64, (8,), codec="raw")
    store.append(_rows(range(60_000)))
    rng = np.random.default_rng(0)
    try:
        for _ in range(12):
            stop = threading.Event()
            running = threading.Event()

            def deleter():
                while not stop.is_set():
                    try:
                        n = len(store)
                        store.delete(rng.choice(n, 300, replace=False))
                    except BusyError:
                        pass  # a child holds the store open: expected
                    running.set()

            t = threading.Thread(target=deleter)
            t.start()
            running.wait()
            pid, rfd, wfd = _fork_reader(store)
            try:
                assert os.read(rfd, 1) == b"r"
                stop.set()
                t.join()
                with pytest.raises(BusyError, match="another handle has this store open"):
                    store.delete([0])
            finally:
                os.write(wfd, b"x")
                os.close(wfd)
                os.close(rfd)
                _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
            store.delete([0])  # the child is gone: exclusive again
    finally:
        store.close()
