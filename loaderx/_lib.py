"""The cffi (ABI mode) binding of libloaderx: the one module that loads the
library and turns its result codes into exceptions.

The declarations and every shared constant come from ``loaderx/_abi.py``,
which ``zig build bindings`` generates from ``src/capi.zig`` (nothing here is
kept by hand twice). Only the library bundled in ``loaderx/lib/`` is ever
loaded (no search of system paths).
"""
from __future__ import annotations

import os
import sys

from cffi import FFI

from . import _abi, errors

RESULTS = _abi.RESULTS
LX_OK = RESULTS["ok"]
CODECS = _abi.CODECS
CODEC_NAMES = {v: k for k, v in CODECS.items()}

# Result code name -> exception class: every native code maps to exactly one
# class (tests/project/test_abi.py checks the two lists agree).
ERROR_CLASSES = {
    "io": errors.ZrecordIOError,
    "invalid": errors.InvalidArgumentError,
    "not_found": errors.StoreNotFoundError,
    "not_a_store": errors.NotAStoreError,
    "corrupt": errors.CorruptStoreError,
    "newer_format": errors.NewerFormatError,
    "locked": errors.LockedError,
    "busy": errors.BusyError,
    "out_of_range": errors.RecordIndexError,
    "out_of_memory": errors.ZrecordMemoryError,
    "size_mismatch": errors.SizeMismatchError,
    "bad_dictionary": errors.DictionaryError,
    "read_only": errors.ReadOnlyError,
    "no_space": errors.NoSpaceError,
    "closed": errors.ClosedError,
    "failed": errors.HandleFailedError,
    "bad_image": errors.ImageError,
}
_CLASS_BY_CODE = {RESULTS[name]: cls for name, cls in ERROR_CLASSES.items()}


def _library_path() -> str:
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")
    if sys.platform == "win32":
        name = "loaderx.dll"
    elif sys.platform == "darwin":
        name = "libloaderx.dylib"
    else:
        name = "libloaderx.so"
    return os.path.join(here, name)


ffi = FFI()
ffi.cdef(_abi.CDEF)
LIBRARY_PATH = _library_path()
if not os.path.isfile(LIBRARY_PATH):
    raise ImportError(
        f"loaderx's native library is missing: {LIBRARY_PATH} does not exist. "
        "Reinstall the package (pip install loaderx) or, from a source checkout, "
        "run `pip install -e .` (or `python -m ziglang build`) to build it.")
lib = ffi.dlopen(LIBRARY_PATH)


def error_for(rc: int, path: str | None = None, what: str | None = None) -> errors.LoaderxError:
    """The exception for native result `rc`, with the thread's detail message."""
    detail = ffi.string(lib.lx_last_error()).decode("utf-8", "replace")
    if not detail:
        detail = ffi.string(lib.lx_strerror(rc)).decode()
    cls = _CLASS_BY_CODE.get(rc, errors.LoaderxError)
    message = ": ".join(p for p in (what, detail) if p)
    if path is not None:
        message = f"{path}: {message}"
    return cls(message, code=rc, path=path)


def check(rc: int, path: str | None = None, what: str | None = None) -> None:
    """Raise the exception mapped to a failing native result code."""
    if rc != LX_OK:
        raise error_for(rc, path, what)


def usable_cores() -> int:
    """The cores this process may run on (``sched_getaffinity`` where the
    platform has it), as the library counts them for its own threads: the
    one source of the core count (``lx_lanes``, src/pool.zig; at most 64,
    and at most an ``lx_set_lanes`` cap)."""
    return int(lib.lx_lanes())


def version() -> str:
    v = lib.lx_version()
    return f"{v >> 16}.{(v >> 8) & 0xFF}.{v & 0xFF}"
