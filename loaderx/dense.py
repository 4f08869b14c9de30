"""`DenseStore`: records of one fixed ``(dtype, item_shape)``; and
`OriginalDenseStore`, what ``DenseStore(path)`` opens (read-only) for a dense
store written by the original loaderx 1.7 (loaderx._readonly177)."""
from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from . import _buffers, _original, _records, identity
from ._checks import check_out, is_int
from ._lib import check, ffi, lib
from ._readonly177 import ReadOnly177
from ._writer import prepare_store
from ._store import (APPEND_CHUNK_BYTES, RC_OUT_OF_RANGE, THREADS_MAX, U64, Store, byte_ptr,
                     check_new_store, check_threads)
from .errors import CorruptStoreError, IdentityError, SizeMismatchError, ZrecordMemoryError


# The read path's names, bound once (each global saves an attribute lookup per call).
_I64 = np.dtype(np.int64)
_U64 = np.dtype(np.uint64)
_T_U64 = ffi.typeof("uint64_t[]")
_T_U8 = ffi.typeof("uint8_t[]")
_NULL = ffi.NULL
_DUMMY = np.zeros(1, dtype=np.uint8)
_empty = np.empty
_from_buffer = ffi.from_buffer
#: A remote store's `as_array` reads its records through the cache in
#: gathers of at most this many bytes (what the cache must hold at once).
AS_ARRAY_CHUNK_BYTES = 64 << 20


def _item_shape(item_shape) -> tuple:
    if item_shape is None:
        return ()
    dims = item_shape if isinstance(item_shape, tuple) \
        else tuple(np.atleast_1d(item_shape).tolist())
    for d in dims:
        if not is_int(d) or d < 0:
            raise ValueError(f"item_shape {dims} must hold non-negative integers")
    return tuple(int(d) for d in dims)


class DenseStore(Store):
    """Fixed ``(dtype, item_shape)`` records.

    ``DenseStore.create(path, dtype, item_shape, mode=...)`` makes a store,
    ``DenseStore.open(path)`` opens one. The constructor is sugar for one of
    them: ``DenseStore(path)`` is ``open(path)``, ``DenseStore(path, dtype,
    item_shape)`` is ``create(path, dtype, item_shape, mode="append")`` (it
    opens an existing store after checking its identity matches).
    ``append(array)`` takes ``(B, *item_shape)`` of exactly ``dtype``. Reads:
    ``ds[i]`` → one record; ``ds[i, j]``, ``ds[a:b]``, ``ds[int_array]``,
    ``ds[bool_mask]`` → stacked ``(B, *item_shape)``. ``gather(idx, out=buf)``
    fills a caller's C-contiguous array (pinned memory, a reused buffer) with no
    extra copy.
    """

    kind = "dense"

    def __new__(cls, path=None, *args: Any, **kwargs: Any) -> "DenseStore":
        # A dense store of the original loaderx 1.7 opens read-only in place.
        if cls is DenseStore and _original.is_store177(path):
            return super().__new__(OriginalDenseStore)
        return super().__new__(cls)

    @classmethod
    def create(cls, path, dtype, item_shape=(), *, codec: str | None = None,
               level: int | None = None, dict_bytes: bytes | None = None,
               mode: str = "create") -> "DenseStore":
        """A new store of ``(dtype, item_shape)`` records at `path` (``()``:
        scalars). `mode` as for every writer (``loaderx._writer``):
        ``"create"`` refuses an existing one (`DestinationExistsError`),
        ``"append"`` opens it (its dtype, item shape and codec must match),
        ``"overwrite"`` replaces it. `codec` ``"raw"``, ``"zstd"`` (default)
        or ``"zstd_dict"`` with `dict_bytes`; `level` None is the codec's
        default. ``DenseStore(path, dtype, item_shape)`` is
        ``create(..., mode="append")``."""
        if dtype is None:
            raise TypeError("DenseStore.create needs a dtype")
        identity.check_shape(_item_shape(item_shape), identity.check_dtype(dtype).itemsize,
                             "item_shape")
        check_new_store(path, codec, level, dict_bytes)
        prepare_store(path, mode)
        return cls(path, dtype, item_shape, codec=codec, level=level, dict_bytes=dict_bytes)

    def __init__(self, path, dtype=None, item_shape=None, codec: str | None = None,
                 dict_bytes: bytes | None = None, *, level: int | None = None):
        create = dtype is not None or item_shape is not None
        ident = None
        fixed = 0
        if create:
            if dtype is None:
                raise TypeError("DenseStore needs a dtype to create a store")
            dt = identity.check_dtype(dtype)
            shape = identity.check_shape(_item_shape(item_shape), dt.itemsize, "item_shape")
            ident = identity.encode("dense", dt, shape)
            # A raw dense store uses the fixed-width layout: locations computed,
            # not looked up, and 4 bytes of index per record instead of 32.
            fixed = dt.itemsize * math.prod(shape)
        super().__init__(path, create=create, codec=codec, level=level, dict_bytes=dict_bytes,
                         ident=ident, fixed_size=fixed)
        found = self._identity
        if found.kind != "dense":
            self.close()
            raise IdentityError(f"{self._path}: store holds {found.kind} records, not dense ones "
                                "(use loaderx.dataset.open_store)", path=self._path)
        # A dense identity always names both (identity.decode checks it).
        assert found.dtype is not None
        assert found.item_shape is not None
        self._dtype: np.dtype = found.dtype
        self._item_shape: tuple = found.item_shape
        if create and (self._dtype != dt or self._item_shape != shape):
            self.close()
            raise IdentityError(f"{self._path}: existing store holds dtype={found.dtype}, "
                                f"item_shape={found.item_shape}; asked for dtype={dt}, "
                                f"item_shape={shape}", path=self._path)
        self._record_bytes = self._dtype.itemsize * math.prod(self._item_shape)
        if self._fixed_size and self._fixed_size != self._record_bytes:
            self.close()
            raise CorruptStoreError(f"{self._path}: the identity says {self._record_bytes}-byte "
                                    f"records, the store holds {self._fixed_size}-byte records",
                                    path=self._path)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def item_shape(self) -> tuple:
        return self._item_shape

    @property
    def record_bytes(self) -> int:
        return self._record_bytes

    def _describe(self) -> str:
        return f", dtype={self._dtype}, item_shape={self._item_shape}"

    def as_array(self) -> np.ndarray | None:
        """The records as one read-only ``(len, *item_shape)`` numpy array
        that memory-maps the store's ``data`` file, or None for a store that
        is not raw. A raw DenseStore keeps record ``i`` at byte
        ``i * record_bytes`` of that file, so the map is the data itself: no
        copy, nothing read until used (a scalar column's values for a
        predicate, or for numpy). It holds the records committed when it was
        made; a ``delete`` or ``compact`` afterwards moves bytes under it.
        A remote store's records are fetched through the cache (every one
        checked) into an array in memory instead: a map of the cache's
        replica would read what eviction drops later as zeros."""
        if not self._fixed_size:
            return None
        n = len(self)
        shape = (n,) + self._item_shape
        if n == 0 or self._remote is not None:
            whole = np.zeros(shape, self._dtype) if n == 0 else np.empty(shape, self._dtype)
            step = max(1, AS_ARRAY_CHUNK_BYTES // max(1, self._record_bytes))
            for start in range(0, n, step):  # (a chunk at a time: what the cache holds at once)
                self.gather(np.arange(start, min(n, start + step), dtype=np.int64),
                            out=whole[start:start + step])
            whole.flags.writeable = False
            return whole
        mapped = np.memmap(os.path.join(self._path, "data"), dtype=self._dtype, mode="r",
                           shape=shape)
        return mapped.view(np.ndarray)

    def append(self, array) -> int:
        """Append ``(B, *item_shape)`` records of exactly this dtype; returns the
        first index. A list (or a scalar, for a store of scalars) is read as
        ``np.asarray`` reads it, and must then have exactly this dtype too."""
        self._w(rows=True)
        if isinstance(array, (list, tuple, np.generic)):  # as the original loaderx took them
            array = np.asarray(array)
        if not isinstance(array, np.ndarray):
            raise TypeError(f"append takes a numpy array of dtype {self._dtype}, "
                            f"not {type(array).__name__}")
        if array.ndim == 0 and self._item_shape == ():  # one scalar record
            array = array.reshape(1)
        if array.dtype != self._dtype:
            raise IdentityError(f"{self._path}: array has dtype {array.dtype}, "
                                f"store holds {self._dtype}", path=self._path)
        if array.shape[1:] != self._item_shape or array.ndim != len(self._item_shape) + 1:
            raise SizeMismatchError(f"{self._path}: array has shape {array.shape}, expected "
                                    f"(B, *{self._item_shape})", path=self._path)
        n = array.shape[0]
        if n == 0:
            return len(self)
        rb = self._record_bytes
        step = max(1, APPEND_CHUNK_BYTES // max(rb, 1))

        def chunks():
            for start in range(0, n, step):
                part = np.ascontiguousarray(array[start:start + step])
                buf = byte_ptr(part)
                base = int(ffi.cast("uintptr_t", buf))
                ptrs = np.arange(len(part), dtype=U64) * U64(rb) + U64(base)
                sizes = np.full(len(part), rb, dtype=U64)
                yield ptrs, sizes, None, None, (part, buf)
        return self._append_chunks(chunks())

    def gather(self, indices, out: np.ndarray | None = None, *, packed: bool = False,
               threads: int = 0) -> Any:
        """Records `indices` stacked as ``(B, *item_shape)``, written into `out`
        when given (C-contiguous, writable, exact dtype and shape). `threads`
        caps the native threads (0: every usable core). ``packed=True``: the
        same batch as ``(values, row_splits)``, as a ragged store gives it
        (``Store.gather``); values is the batch itself, reshaped."""
        if type(threads) is not int or not 0 <= threads <= THREADS_MAX:  # (hot path: the
            threads = check_threads(threads)  # common case without a call; it raises the rest)
        result = None
        if type(indices) is np.ndarray and indices.ndim == 1:
            result = self._gather(indices, out, threads, exact=False)
        if result is None:
            idx, _ = self._indices(indices)
            result = self._gather(idx, out, threads)
            assert result is not None  # exact: an out-of-range index raises instead
        return _records.dense_packed(result) if packed else result

    def _pooled_batch(self, shape: tuple) -> np.ndarray:
        """The output of a large read without ``out=``: pooled library memory
        (loaderx._buffers), so repeated batches reuse pages that are already
        faulted in instead of being an ``mmap`` each."""
        try:
            return _buffers.POOL.empty(shape, self._dtype)
        except MemoryError:
            raise ZrecordMemoryError(f"{self._path}: a batch of shape {shape} ({self._dtype}) "
                                     "does not fit in memory", path=self._path) from None

    def _gather(self, idx: np.ndarray, out: np.ndarray | None, threads: int = 0,
                exact: bool = True) -> np.ndarray | None:
        """Reads records `idx` (a 1-D array) into `out` (a new batch when None).

        The one native read of every dense gather, kept lean: at 256 records
        of 200 B its Python part was a third of the batch. What it does not
        check, the native call or cffi does: the native call checks every
        index (a negative int64 reads as >= 2^63) and the destination's size,
        and ``ffi.from_buffer`` refuses a non-contiguous or read-only array.
        With ``exact=False`` (indices not normalised: any 1-D array) it
        returns None where the normalised retry would do better (an index
        out of range, a dtype other than native int64/uint64, a
        non-contiguous array), so the caller can take the slow path that
        wraps negatives and names the bad index; with ``exact=True`` (uint64
        indices from normalize_indices) it raises."""
        dt = idx.dtype
        if dt is not _I64 and dt is not _U64:
            assert not exact
            return None
        n = len(idx)
        shape = (n, *self._item_shape)
        if out is None:
            # Small batches: plain np.empty (glibc's heap has them warm).
            out = (_empty(shape, self._dtype) if n * self._record_bytes < _buffers.POOL.min_bytes
                   else self._pooled_batch(shape))
        elif type(out) is not np.ndarray or out.dtype is not self._dtype or out.shape != shape:
            # raises unless the dtype is equal, not identical
            out = check_out(out, shape, self._dtype, path=self._path)
        if not n:
            return out
        h = self._handle  # held for the call: keeps the handle's memory alive
        if h is None:
            self._h()  # raises ClosedError
        try:
            ip = _from_buffer(_T_U64, idx)
        except ValueError:  # not C-contiguous
            assert not exact
            return None
        try:
            # (Zero-size records: the native call still checks the indices.)
            op = _from_buffer(_T_U8, out if self._record_bytes else _DUMMY, True)
        except ValueError:  # not C-contiguous or read-only: the precise message
            check_out(out, shape, self._dtype, path=self._path)
            raise
        if self._remote is None:
            rc = lib.lx_gather(self._parts, 1, ip, n, op, out.nbytes, self._record_bytes, _NULL, 0,
                               threads)
        else:  # through the cache: fetched and checked first (docs/remote.md)
            rc = self._remote.gather(self._parts, ip, n, op, out.nbytes, self._record_bytes,
                                     threads, idx)
        del h
        if rc:
            if rc == RC_OUT_OF_RANGE and not exact:
                return None
            check(rc, self._path, "gather")
        return out

    def __getitem__(self, key):
        if type(key) is np.ndarray and key.ndim == 1:
            result = self._gather(key, None, 0, exact=False)
            if result is not None:
                return result
        idx, scalar = self._indices(key)
        out = self._gather(idx, None)
        return out[0] if scalar else out


class OriginalDenseStore(ReadOnly177, DenseStore):  # type: ignore[misc]
    """A dense store written by the original loaderx 1.7, read in place,
    read-only (loaderx._readonly177): ``DenseStore(path)`` returns one for
    such a directory; `dtype`, `item_shape` and `codec`, when given, must be
    the store's."""

    def __init__(self, path, dtype=None, item_shape=None, codec: str | None = None,
                 dict_bytes: bytes | None = None, *, level: int | None = None):
        self._open177(path, dtype, item_shape, codec, dict_bytes)
