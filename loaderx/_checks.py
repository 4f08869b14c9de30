"""The argument checks several modules share, in one place so that every entry
point refuses the same input with the same words.

- `KINDS`, `is_stream`: what a store or stream kind is, and what the loader,
  a `ShardSet` and a `Mixture` accept as a stream (``gather()`` and a kind);
- `WRITE_MODES`, `check_mode`: what a write does to its destination;
- `is_int`: Python and numpy integers, never ``bool``;
- `check_out`: a caller's ``out=`` array for a dense batch (the stores, a
  `ShardSet`, `TokenWindows` and its subset windows);
- `check_level`: a zstd level (the stores and `convert`), 0 refused;
- `drop_source_rows`: dropping the pages of rows already copied from a
  memory-mapped source (`from_numpy`, the numpy converter);
- `path_arg`: a path a user passed (str, bytes or os.PathLike), as a str
  with no NUL byte.

It imports nothing of loaderx but `errors`, so any module may use it.
"""
from __future__ import annotations

import mmap
import numbers
import os
from typing import Any

import numpy as np

from .errors import ArgumentTypeError, IdentityError, InvalidArgumentError, SizeMismatchError

__all__ = ["KINDS", "WRITE_MODES", "check_mode", "is_int", "is_stream", "check_out", "check_level",
           "drop_source_rows", "path_arg"]

#: The kinds of store and stream (fixed-shape records, records of their own
#: shapes, raw bytes), in the order messages list them.
KINDS = ("dense", "ragged", "bytes")
#: What a write does when its destination holds data already.
WRITE_MODES = ("create", "append", "overwrite")
#: zstd's levels (ZSTD_minCLevel(), ZSTD_maxCLevel() of the pinned zstd, which
#: src/codec.zig checks again): known here so that a writer's overwrite
#: refuses a bad level before it removes anything.
ZSTD_LEVEL_MIN, ZSTD_LEVEL_MAX = -(1 << 17), 22


def check_mode(mode: Any) -> None:
    """A write's `mode`, one of `WRITE_MODES`."""
    if mode not in WRITE_MODES:
        raise ValueError(f"mode must be one of {WRITE_MODES}, got {mode!r}")


def is_int(value: Any) -> bool:
    """True for Python and numpy integers, but not for ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_stream(value: Any) -> bool:
    """Has the members the loader needs (``gather()`` and a kind in `KINDS`)."""
    return getattr(value, "kind", None) in KINDS and callable(getattr(value, "gather", None))


def check_out(out: Any, shape: tuple, dtype: np.dtype, *, holds: str = "store holds",
              path: str | None = None) -> np.ndarray:
    """`out` if it can take a dense batch of `shape` and `dtype` in place:
    TypeError if it is not an array, IdentityError for another dtype,
    SizeMismatchError for another shape, a non C-contiguous or a read-only
    array. `holds` names what has `dtype` in the message."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, not {type(out).__name__}")
    if out.dtype != dtype:
        raise IdentityError(f"out has dtype {out.dtype}, {holds} {dtype}", path=path)
    if out.shape != shape:
        raise SizeMismatchError(f"out has shape {out.shape}, the batch needs {shape}", path=path)
    if not out.flags.c_contiguous:
        raise SizeMismatchError("out must be C-contiguous", path=path)
    if not out.flags.writeable:
        raise SizeMismatchError("out is read-only", path=path)
    return out


def check_level(level: Any, path: str | None = None) -> None:
    """A zstd level or None (the codec's default). 0 is refused: zstd reads it
    as "the default", and a store records the level it used, so 0 would be
    stored as 3 behind the caller's back."""
    if level is None:
        return
    where = f"{path}: " if path else ""
    if not is_int(level):
        raise ArgumentTypeError(f"{where}level must be an int, not {type(level).__name__}",
                                path=path)
    if not ZSTD_LEVEL_MIN <= level <= ZSTD_LEVEL_MAX:
        raise InvalidArgumentError(f"{where}zstd level {level} is out of range "
                                   f"({ZSTD_LEVEL_MIN} to {ZSTD_LEVEL_MAX}, not 0)", path=path)
    if level == 0:
        raise InvalidArgumentError(f"{where}level 0 is not a zstd level: level must be a "
                                   "non-zero int zstd level or None (the default, 3)", path=path)


def drop_source_rows(array: Any, start: int, stop: int) -> None:
    """Drops the pages of rows start..stop of a C-contiguous np.memmap once
    they are copied, so a big file read once does not stay resident (nor
    counted in RSS); they are simply re-read if touched again (MADV_DONTNEED
    on file-backed pages). A no-op for anything else."""
    mm = getattr(array, "_mmap", None)
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED") \
            or not array.flags.c_contiguous or stop <= start:
        return
    base = np.frombuffer(mm, dtype=np.uint8).ctypes.data
    row = array.strides[0] if array.ndim and array.shape[0] > 1 else array.nbytes
    lo = (array.ctypes.data - base + start * row) // mmap.PAGESIZE * mmap.PAGESIZE
    hi = (array.ctypes.data - base + stop * row) // mmap.PAGESIZE * mmap.PAGESIZE
    if hi > lo:
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def path_arg(value: Any, what: str = "path") -> str:
    """`value` (str, bytes or os.PathLike) as a str path: bytes are decoded as
    the file system's (os.fsdecode); a NUL byte or an empty path is refused
    (`InvalidArgumentError` naming `what`), never passed on to the OS."""
    try:
        p = os.fspath(value)
    except TypeError:
        raise TypeError(f"{what} must be a path (str, bytes or os.PathLike), not "
                        f"{type(value).__name__}") from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if "\0" in p:
        raise InvalidArgumentError(f"{what} {p!r} contains a NUL byte", path=p)
    if not p:
        raise InvalidArgumentError(f"{what} is empty")
    return p

