"""Every lock loaderx takes from Python, and the one contract they share.

Stores lock themselves in native code (src/Store.zig: the writer lock on
`lock`, a shared lock on `meta` per handle, and the after-fork hook that
gives a forked child its own). This module owns the rest: the locks on
dataset directories and on the directories conversions write.

All of them are ``flock`` locks, which belong to an open file description:
held from the call until the descriptor is closed, by whoever holds a copy of
it, and released by the kernel when the process dies, even by SIGKILL. That
last property is what makes them safe to sweep by: a directory whose lock is
free belongs to nobody alive. Every descriptor is opened close-on-exec, so a
program the process runs never inherits one.

The locks:

* **Writer of a dataset** (`lock_dataset`): exclusive, on the dataset
  directory itself, from the start of an append or overwrite to its end.
  Never waited for: a second writer gets `LockedError`. Under it, and only
  under it, a writer sweeps the dataset's inside.
* **Owner of a staging directory** (`own`, `abandoned`): exclusive, on the
  ``.loaderx-owner`` file inside a directory a conversion (or a Ray write)
  is filling, for as long as it fills it. A sweep removes such a directory
  once its lock is free, or, with no owner file, once it is over a minute old
  (its maker may be between making it and locking it).
* **Readers of a generation** (`reading`) and its **retirement**
  (`retire`): a reader opening a dataset holds a shared lock on the
  generation directory its manifest names until every part is open (then
  the open stores need no lock: their files stay readable after a removal).
  A writer removing a generation nobody names any more takes the exclusive
  lock without waiting (a few short retries) and renames the generation
  away while it holds it; when readers hold it, the generation is left for a
  later sweep. A reader that locks a generation checks that its name still
  points at it, so it never opens one that was just retired.
* **Is a store being written?** (`writer_busy`): the writer lock of a store
  (``lock`` in its directory, which src/Store.zig's writers hold
  exclusively) tried for a moment: an overwrite never replaces a store a
  live writer has open.
* **Reader of an original (1.7) store** (`share_original`): shared, on the
  store's ``meta.zr``, for as long as loaderx reads the store in place
  (loaderx/_original.py). loaderx 1.7 holds that file's lock exclusively
  while it has the store open, so neither reads a store the other is using.
  Never waited for: the open fails with `BusyError`.

Where ``flock`` does not exist (Windows) every lock here is a no-op: staging
directories are never swept, and readers rely on `open_dataset`'s retry.
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator

try:
    import fcntl
except ImportError:  # no flock (Windows)
    fcntl = None  # type: ignore[assignment]

from . import _abi
from .errors import LockedError

__all__ = ["OWNER", "abandoned", "lock_dataset", "own", "reading", "retire", "share_original",
           "writer_busy"]

#: The owner file of a staging directory.
OWNER = ".loaderx-owner"
#: A staging directory with no owner file is left alone for this long: its
#: maker may be between making it and locking its owner file.
UNOWNED_STALE_S = 60.0
#: How long a writer tries to retire a generation that readers are opening.
_RETIRE_TRIES, _RETIRE_WAIT_S = 20, 0.005
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _try_lock(path: str, flags: int, how: int, mode: int = 0o600) -> int | None:
    """`path` opened with `flags` and ``flock``ed (`how`) without waiting:
    the descriptor, which holds the lock until closed; None when another
    open file holds it."""
    assert fcntl is not None
    fd = os.open(path, flags | _CLOEXEC, mode)
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def lock_dataset(path: str) -> int | None:
    """The writer lock of the dataset directory `path`: a descriptor to
    close when the write ends (None where flock does not exist).
    `LockedError` when another conversion holds it."""
    if fcntl is None:
        return None
    fd = _try_lock(path, os.O_RDONLY | _DIRECTORY, fcntl.LOCK_EX)
    if fd is None:
        raise LockedError(
            f"{path}: another conversion is writing to this dataset; run it after that one",
            path=path,
        )
    return fd


def own(staging: str) -> int | None:
    """Creates and locks the owner file of the staging directory `staging`:
    a descriptor to close when done (None where flock does not exist)."""
    if fcntl is None:
        return None
    fd = _try_lock(os.path.join(staging, OWNER), os.O_RDWR | os.O_CREAT | _NOFOLLOW,
                   fcntl.LOCK_EX)
    assert fd is not None, f"{staging}: a fresh owner file is locked by someone else"
    return fd


def writer_busy(store: str) -> bool:
    """Whether a live writer holds the writer lock of the store directory
    `store` (False where flock does not exist, or the store has no lock file)."""
    if fcntl is None:
        return False
    try:
        fd = _try_lock(os.path.join(store, _abi.STORE_LOCK_FILE), os.O_RDONLY | _NOFOLLOW,
                       fcntl.LOCK_EX)
    except FileNotFoundError:
        return False
    if fd is None:
        return True
    os.close(fd)
    return False


def share_original(fd: int) -> bool:
    """The shared lock on an original store's open ``meta.zr`` (`fd`, held
    until it is closed); False when loaderx 1.7 holds the file's lock. True
    where flock does not exist."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def abandoned(path: str) -> bool:
    """No live process owns the staging directory `path` (always False where
    flock does not exist: nothing can tell)."""
    if fcntl is None:
        return False
    try:
        fd = _try_lock(os.path.join(path, OWNER), os.O_RDWR | _NOFOLLOW, fcntl.LOCK_EX)
    except FileNotFoundError:
        try:
            return time.time() - os.lstat(path).st_mtime > UNOWNED_STALE_S
        except OSError:
            return False
    except OSError:
        return False
    if fd is None:
        return False
    os.close(fd)
    return True


@contextlib.contextmanager
def reading(generation: str) -> Iterator[bool]:
    """Holds a shared lock on the generation directory `generation` while
    the body opens its parts. Yields False when that directory is gone or
    was just retired (the caller reads the manifest again). A symlink
    there raises OSError (ELOOP or ENOTDIR)."""
    if fcntl is None:
        yield os.path.isdir(generation)
        return
    try:
        fd = os.open(generation, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
    except FileNotFoundError:
        held = None
    else:
        held = fd
    try:
        in_place = False
        if held is not None:
            # Blocking: a retirement holds the exclusive lock for one rename.
            fcntl.flock(held, fcntl.LOCK_SH)
            st = os.fstat(held)
            try:
                now = os.lstat(generation)
                in_place = (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)
            except FileNotFoundError:
                pass
        yield in_place
    finally:
        if held is not None:
            os.close(held)


def retire(generation: str, trash: str) -> bool:
    """Renames the generation directory `generation` to `trash` once no
    reader is opening it (the exclusive lock, taken without waiting, a few
    short retries). False when readers hold it: it stays for a later sweep.
    The caller removes `trash`."""
    if fcntl is None:
        os.rename(generation, trash)
        return True
    fd = os.open(generation, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
    try:
        for _ in range(_RETIRE_TRIES):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(_RETIRE_WAIT_S)
        else:
            return False
        os.rename(generation, trash)
        return True
    finally:
        os.close(fd)
