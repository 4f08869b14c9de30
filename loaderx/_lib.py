"""The cffi (ABI mode) binding of libloaderx: the one place that declares the C ABI.

`CDEF` must match the exports of ``src/capi.zig`` exactly; ``tests/test_abi.py``
parses the Zig file and fails if the two drift. Only the library bundled in
``loaderx/lib/`` is ever loaded (no search of system paths).
"""
from __future__ import annotations

import os
import sys

from cffi import FFI

from . import errors

CDEF = """
typedef struct lx_store lx_store;
typedef struct lx_loader lx_loader;

typedef struct {
    uint32_t codec;
    int32_t level;
    uint32_t format_version;
    uint32_t writable;
    uint64_t dict_size;
    uint64_t user_size;
} lx_info_t;

typedef struct {
    uint64_t records;
    uint64_t live_bytes;
    uint64_t chunk_bytes;
    uint64_t reclaimable;
} lx_stats_t;

uint32_t lx_version(void);
uint32_t lx_format_version(void);
uint32_t lx_zstd_version(void);
const char *lx_strerror(int result);
const char *lx_last_error(void);
int lx_open(const char *path, int create, int codec_id, int level, const uint8_t *dict, uint64_t dict_len, const uint8_t *user, uint64_t user_len, uint64_t fixed_size, lx_store **out);
void lx_close(lx_store *h);
uint64_t lx_len(lx_store *h);
int lx_info(lx_store *h, lx_info_t *out);
int lx_blob(lx_store *h, int which, const uint8_t **ptr, uint64_t *len);
int lx_append(lx_store *h, uint64_t count, const uint8_t *const *ptrs, const uint64_t *sizes, const uint8_t *const *aux_ptrs, const uint64_t *aux_sizes, int stage, uint64_t *first);
int lx_publish(lx_store *h, int keep);
int lx_gather(lx_store *h, const uint64_t *indices, uint64_t count, uint8_t *dest, uint64_t dest_len, uint64_t stride, const uint64_t *offsets, int part, uint32_t lanes);
int lx_sizes(lx_store *h, const uint64_t *indices, uint64_t count, uint64_t *raw_sizes, uint64_t *aux_sizes);
int lx_delete(lx_store *h, const uint64_t *indices, uint64_t count);
int lx_compact(lx_store *h);
int lx_stats(lx_store *h, lx_stats_t *out);
int lx_sync(lx_store *h);
int lx_verify(lx_store *h, uint64_t *bad_index);
int lx_train_dict(const uint8_t *samples, const uint64_t *sizes, uint64_t count, uint8_t *out, uint64_t cap, uint64_t *out_len);
int lx_sampler_fill(uint64_t length, uint64_t batch_size, int mode, uint64_t seed, uint64_t step, uint64_t rank, uint64_t world, uint64_t *out);
uint32_t lx_lanes(void);
void lx_set_lanes(uint32_t n);
int lx_loader_open(lx_store *const *stores, const uint64_t *record_sizes, uint32_t count, uint64_t length, uint64_t batch_size, int mode, uint64_t seed, uint64_t rank, uint64_t world, uint64_t step, uint32_t window, uint32_t threads, uint32_t lanes, lx_loader **out);
int lx_loader_submit(lx_loader *l, uint64_t step, uint8_t *const *dests);
int lx_loader_wait(lx_loader *l, uint64_t step, uint32_t *failed_stream);
void lx_loader_reset(lx_loader *l, uint64_t step);
void lx_loader_stop(lx_loader *l);
void lx_loader_free(lx_loader *l);
"""

# Result codes (src/capi.zig `Result`) -> exception class.
LX_OK = 0
_ERRORS = {
    -1: errors.ZrecordIOError,
    -2: errors.InvalidArgumentError,
    -3: errors.StoreNotFoundError,
    -4: errors.NotAStoreError,
    -5: errors.CorruptStoreError,
    -6: errors.NewerFormatError,
    -7: errors.LockedError,
    -8: errors.BusyError,
    -9: errors.RecordIndexError,
    -10: errors.ZrecordMemoryError,
    -11: errors.SizeMismatchError,
    -12: errors.DictionaryError,
    -13: errors.ReadOnlyError,
    -14: errors.NoSpaceError,
    -15: errors.ClosedError,
}

CODECS = {"raw": 0, "zstd": 1, "zstd_dict": 2}
CODEC_NAMES = {v: k for k, v in CODECS.items()}


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
ffi.cdef(CDEF)
LIBRARY_PATH = _library_path()
if not os.path.isfile(LIBRARY_PATH):
    raise ImportError(
        f"loaderx's native library is missing: {LIBRARY_PATH} does not exist. "
        "Reinstall the package (pip install loaderx) or, from a source checkout, "
        "run `pip install -e .` (or `python -m ziglang build`) to build it.")
lib = ffi.dlopen(LIBRARY_PATH)


def error_for(rc: int, path: str | None = None, what: str | None = None) -> errors.ZrecordError:
    """The exception for native result `rc`, with the thread's detail message."""
    detail = ffi.string(lib.lx_last_error()).decode("utf-8", "replace")
    if not detail:
        detail = ffi.string(lib.lx_strerror(rc)).decode()
    cls = _ERRORS.get(rc, errors.ZrecordError)
    parts = [p for p in (what, detail) if p]
    message = ": ".join(parts)
    if path is not None:
        message = f"{path}: {message}"
    return cls(message, code=rc, path=path)


def check(rc: int, path: str | None = None, what: str | None = None) -> None:
    """Raise the exception mapped to a failing native result code."""
    if rc != LX_OK:
        raise error_for(rc, path, what)


def version() -> str:
    v = lib.lx_version()
    return f"{v >> 16}.{(v >> 8) & 0xFF}.{v & 0xFF}"
