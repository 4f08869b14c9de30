"""The one vocabulary of loaderx's writers, shared by every way of writing
data: a store's ``create`` (`DenseStore.create`, `RaggedStore.create`,
`Zrecord.create`), `loaderx.from_numpy` / `loaderx.from_iterator` (one
store) and `loaderx.convert` (a dataset directory).

* ``mode``: ``"create"`` refuses a destination that holds anything (an
  empty directory is fine); ``"append"`` adds to what is there, or creates
  it when nothing is; ``"overwrite"`` replaces a loaderx store or dataset
  (never a directory that holds anything else).
* ``codec``: ``"raw"``, ``"zstd"`` or ``"zstd_dict"``; a writer given
  ``"zstd_dict"`` without ``dict_bytes=`` trains the dictionary itself, at
  most ``dict_size`` bytes (`train_dict`'s "balanced" tier).
* ``progress``: None (a bar when stderr is a terminal, else nothing), True
  (a bar, or log lines when not on a terminal), False, ``"bar"``,
  ``"log"``, ``"off"``, or a callable ``progress(done, total)`` called as
  work completes (in the writer's unit: rows, records or source bytes).

Old spellings keep working with a DeprecationWarning naming the new one
(`convert(dict=True)` → ``codec="zstd_dict"``).
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Callable

from . import _abi, _locks
from ._checks import check_mode, path_arg
from ._store import deprecated
from .errors import DestinationExistsError, LockedError

__all__ = ["CODECS", "check_destination", "check_store", "prepare_store", "codec_of",
           "is_store_dir", "is_store_file", "refuse_foreign", "refuse_written", "replacement_dir",
           "swap_in"]

#: The codecs every writer names (``mode`` words: `loaderx._checks.WRITE_MODES`).
CODECS = ("raw", "zstd", "zstd_dict")


def is_store_dir(path: str) -> bool:
    """Whether `path` is a directory holding a loaderx store."""
    return os.path.isfile(os.path.join(path, _abi.STORE_META_FILE))


def is_store_file(name: str) -> bool:
    """Whether `name` is one of a store directory's own files (`_abi`'s,
    generated from src/format.zig; the token windows' index and its older
    `windows-*.idx` names as src/store_maintain.zig's isWindowsIndexName)."""
    return name in _abi.STORE_FILES or name.startswith(_abi.WINDOWS_INDEX_FILE) \
        or (name.startswith("windows-") and name.endswith(".idx"))


def refuse_foreign(path: str, foreign: list, what: str) -> None:
    """An overwrite never removes what loaderx did not write: refuses `path`
    when it holds such entries (`foreign`), naming a few."""
    if foreign:
        shown = ", ".join(repr(n) for n in foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise DestinationExistsError(
            f"{path} holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} that "
            f"{'is' if len(foreign) == 1 else 'are'} not the {what}'s ({shown}); refusing to "
            f"overwrite it: move {'it' if len(foreign) == 1 else 'them'} out, or remove "
            f"{'it' if len(foreign) == 1 else 'them'} yourself", path=path)


def refuse_written(path: str) -> None:
    """An overwrite never replaces a store a live writer has open."""
    if _locks.writer_busy(path):
        raise LockedError(f"{path}: another handle holds this store's writer lock (a writer "
                          "has it open); close it before overwriting the store", path=path)


def check_destination(path, mode: str, *, ours: Callable[[str], bool], what: str,
                      cli: bool = False) -> bool:
    """The mode rule, applied before a writer touches `path`. Returns True
    when `path` holds data that the writer appends to or overwrites; raises
    `DestinationExistsError` where the mode forbids writing."""
    check_mode(mode)
    p = os.fspath(path)
    if not os.path.lexists(p) or (os.path.isdir(p) and not os.listdir(p)):
        return False
    if mode == "create":
        hint = ("--append or --overwrite" if cli
                else 'mode="append" or mode="overwrite" (to add to it or to replace it)')
        raise DestinationExistsError(f"{p} already exists; pass {hint}", path=p)
    if mode == "overwrite" and not (os.path.isdir(p) and ours(p)):
        raise DestinationExistsError(f"{p} exists and is not a {what}; refusing to overwrite it "
                                     "(remove it yourself)", path=p)
    return True


def check_store(path, mode: str) -> bool:
    """`check_destination` for a single store, with what an overwrite also
    needs (only the store's own files there, no live writer). Returns True
    when a store is there (to append to or to replace). A replacement a
    crash cut short (`swap_in`) is finished first."""
    _finish_swap(path)
    if not check_destination(path, mode, ours=is_store_dir, what="loaderx store"):
        return False
    if mode == "overwrite":
        p = os.fspath(path)
        refuse_foreign(p, sorted(n for n in os.listdir(p) if not is_store_file(n)),
                       "loaderx store")
        refuse_written(p)
    return True


def prepare_store(path, mode: str) -> bool:
    """`check_store`, then ``overwrite`` removes the existing store (a store
    created empty replaces it). Returns True when the writer appends to an
    existing one."""
    if not check_store(path, mode):
        return False
    if mode == "overwrite":
        shutil.rmtree(os.fspath(path))
        return False
    return True


def _siblings(path) -> tuple[str, str, str]:
    """(`path` made absolute, where its replacement is built, where the
    store it replaces goes during the swap)."""
    p = os.path.abspath(path_arg(path, "store path"))
    stem = os.path.join(os.path.dirname(p), f".{os.path.basename(p)}.loaderx-")
    return p, stem + "replacing", stem + "replaced"


def _finish_swap(path) -> None:
    """A crash between `swap_in`'s renames left the old store aside: with
    the new one in place, the old one goes; with `path` empty, the new one
    (complete: it was closed before the swap) moves in, or else the old one
    moves back."""
    p, where, aside = _siblings(path)
    if not os.path.isdir(aside) or os.path.islink(aside):
        return
    if os.path.lexists(p):
        shutil.rmtree(aside)
    elif is_store_dir(where) and not _locks.writer_busy(where):
        os.rename(where, p)
        shutil.rmtree(aside)
    elif is_store_dir(aside):
        os.rename(aside, p)


def replacement_dir(path) -> str:
    """Where a writer that replaces the store at `path` builds the new one:
    a hidden sibling (same file system, so `swap_in` is a rename). One left by
    a killed writer is removed; one a live writer holds is refused."""
    p, where, _ = _siblings(path)
    if os.path.lexists(where):
        if _locks.writer_busy(where):
            raise LockedError(f"{p}: another writer is replacing this store now (it builds "
                              f"{where}); wait for it to finish", path=p)
        shutil.rmtree(where)
    return where


def swap_in(where: str, path) -> None:
    """Puts the store built in `where` at `path`, in place of the store
    there: two renames, then the old store's files go (a reader that has it
    open keeps reading them). A crash between the renames leaves the old
    store whole beside `path`, as ``.<name>.loaderx-replaced``, and the next
    write to `path` finishes the swap (`check_store`)."""
    p, _, aside = _siblings(path)
    if os.path.lexists(aside):
        shutil.rmtree(aside)
    os.rename(p, aside)
    os.rename(where, p)
    shutil.rmtree(aside, ignore_errors=True)


def codec_of(codec: Any, dict: Any = None, *, cli: bool = False) -> str:
    """The codec a writer uses, from the one vocabulary (`CODECS`) and the
    deprecated ``dict=True`` of `convert` (``codec="zstd_dict"``)."""
    if dict is not None:
        if not cli:
            deprecated("convert(dict=True)", 'convert(codec="zstd_dict")', stacklevel=5)
        if dict and codec == "zstd":  # (with codec="raw" it never did anything)
            codec = "zstd_dict"
    if codec not in CODECS:
        raise ValueError(f"codec must be one of {CODECS}, got {codec!r}")
    return codec
