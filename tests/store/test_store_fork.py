"""A store handle across fork(): the library's own after-fork hook (src/Store.zig,
run by `pthread_atfork` in every child) gives the child its own shared lock
on each inherited store's `meta` and drops its copies of the writer lock.

The hole this closes: a child forked while the parent's delete (or compact)
held `meta` exclusively got no lock at all (the old Python fork handler's
non-blocking lock attempt failed), so the parent's next delete saw no other
handle and moved records under the child's reads.

Also: a forked child's inherited handle is another open handle (the parent's
delete and compact are refused with `BusyError` while the child has it open),
a child that never writes does not keep the parent's writer lock once the
parent closes the store, and a child cannot write through the parent's handle.
"""
from __future__ import annotations

import multiprocessing
import os
import threading

import numpy as np
import pytest

from loaderx import DenseStore, Zrecord
from loaderx.errors import BusyError, LockedError

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


def _fork_reader(store) -> tuple[int, int, int]:
    """Forks a child that reads `store` once, reports, waits for a byte and
    exits 0 if every read was consistent."""
    def child(rfd, wfd):
        try:
            n = len(store)
            got = store[np.arange(n)]
            ok = bool((got[:, 1:] - got[:, :1] == np.arange(1, 8)).all())
            os.write(wfd, b"r")
            os.read(rfd, 1)
            return 0 if ok else 3
        except BaseException:  # noqa: BLE001 - shown, and reported by the exit code
            import traceback

            traceback.print_exc()
            return 1

    return _fork(child)


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


def _child_append(path, queue):
    try:
        _child_append.store.append([b"from the child"])
        _child_append.store.sync()
        queue.put("appended")
    except LockedError as e:
        queue.put(f"locked: {e}")
    queue.put(_child_append.store[0])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_child_cannot_write_through_the_parents_handle(tmp_path):
    """Before the fix, fork() handed the writer lock to the child: its append
    and sync succeeded, then the parent overwrote them and they vanished."""
    path = tmp_path / "s"
    z = Zrecord(path, create=True)
    z.append([b"parent 0"])
    _child_append.store = z
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_child_append, args=(str(path), queue))
    p.start()
    first = queue.get(timeout=60)
    read = queue.get(timeout=60)
    p.join(60)
    assert first.startswith("locked") and "forked child" in first, first
    assert read == b"parent 0"  # reads work in the child
    z.append([b"parent 1"])
    z.close()
    with Zrecord(path) as z:
        assert z[:] == [b"parent 0", b"parent 1"]
