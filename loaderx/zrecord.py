"""Record stores: the raw byte store `Zrecord` and the typed NumPy stores
`DenseStore` (fixed dtype and item shape) and `RaggedStore` (one dtype, any
shape per record), all on the native engine (see ``src/Store.zig``).

Common contract
---------------
* A store is a directory. Records are addressed by a dense index space
  ``0..len``; negative indices wrap; out of range raises `IndexError`.
* Reads decode straight into NumPy memory in one native call per batch, with
  the GIL released, across the cores the process may use.
* ``append`` is atomic per call: after a crash a store holds a prefix of what
  was appended. ``sync()`` makes it survive a power loss; ``close()`` syncs.
* Many handles may have a store open, in one process or many. The first
  mutation through a handle takes the store's writer lock; another handle's
  mutation then raises `LockedError`. ``delete``/``compact`` need every other
  handle closed (`BusyError` otherwise). Reads and appends are thread-safe.
* ``delete(key)`` fills each deleted position below the new length with the
  highest surviving record ("swap-last"): indices are stable only until a delete.
* The type identity (kind, dtype, item shape) is stored with msgpack inside the
  store; `loaderx.dataset.open_store` reopens the right class from it.
"""
from __future__ import annotations

import math
import os
import threading
from typing import Any, Iterable, Iterator

import msgpack
import numpy as np

from . import _lib
from ._lib import check, ffi, lib
from .errors import (
    ArgumentTypeError,
    ClosedError,
    CorruptStoreError,
    DictionaryError,
    IdentityError,
    InvalidArgumentError,
    LockedError,
    BusyError,
    NotAStoreError,
    RecordIndexError,
    SizeMismatchError,
    StoreNotFoundError,
    ZrecordError,
)

__all__ = [
    "Zrecord", "DenseStore", "RaggedStore", "train_dict", "ZrecordError",
    "StoreNotFoundError", "NotAStoreError", "CorruptStoreError", "LockedError",
    "BusyError", "ClosedError", "RecordIndexError", "IdentityError",
    "SizeMismatchError", "DictionaryError",
]

IDENTITY_VERSION = 1
_U64 = np.uint64
_EMPTY_U64 = np.zeros(1, dtype=_U64)
_APPEND_CHUNK_BYTES = 64 << 20
_APPEND_CHUNK_RECORDS = 16384
_MAX_NDIM = 32


# ----------------------------------------------------------------- helpers

_T_U64 = ffi.typeof("uint64_t[]")
_T_U8 = ffi.typeof("uint8_t[]")
_RC_OUT_OF_RANGE = -9


def _u64_ptr(arr: np.ndarray):
    """A `uint64_t *` to a C-contiguous uint64 array (kept alive by the caller)."""
    return ffi.from_buffer(_T_U64, arr)


def _byte_ptr(arr: np.ndarray, writable: bool = False):
    if arr.nbytes == 0:
        return ffi.from_buffer(_T_U8, _EMPTY_U64, require_writable=writable)
    return ffi.from_buffer(_T_U8, arr, require_writable=writable)


def _unchecked_indices(key: Any) -> np.ndarray | None:
    """The hot path (a sampler's int64 batch): the key itself as uint64, with
    no Python-side check. The native call checks every index; a negative one
    reads as >= 2^63, fails that check, and the caller retries the slow path,
    which wraps negatives and names the bad index."""
    if type(key) is np.ndarray and key.ndim == 1 and key.dtype.itemsize == 8 and key.dtype.kind in "iu" \
            and key.flags.c_contiguous:
        return key.view(_U64)
    return None


def _normalize_indices(key: Any, n: int) -> tuple[np.ndarray, bool]:
    """Turns a read/delete key into (uint64 indices, is_scalar)."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        i = int(key)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise RecordIndexError(f"index {int(key)} is out of range for {n} records")
        return np.array([i], dtype=_U64), True
    if isinstance(key, slice):
        return np.arange(*key.indices(n), dtype=np.int64).astype(_U64), False
    if isinstance(key, tuple):
        key = list(key)
    arr = np.asarray(key)
    if arr.dtype == np.bool_:
        if arr.shape != (n,):
            raise RecordIndexError(f"boolean mask has shape {arr.shape}, expected ({n},)")
        return np.flatnonzero(arr).astype(_U64), False
    if arr.size == 0:
        return np.zeros(0, dtype=_U64), False
    if arr.dtype.kind not in "iu":
        raise TypeError(f"record indices must be integers, a slice or a boolean mask, not {arr.dtype}")
    if arr.ndim != 1:
        raise TypeError(f"record indices must be one-dimensional, got shape {arr.shape}")
    if arr.dtype.kind == "i":
        lo = int(arr.min())
        if lo < 0:
            arr = np.where(arr < 0, arr + n, arr)
            if int(arr.min()) < 0:
                raise RecordIndexError(f"index {lo} is out of range for {n} records")
    hi = int(arr.max())
    if hi >= n:
        raise RecordIndexError(f"index {hi} is out of range for {n} records")
    return np.ascontiguousarray(arr, dtype=_U64), False


def _dtype_identity(dtype: np.dtype) -> dict:
    return {"descr": np.lib.format.dtype_to_descr(dtype), "name": dtype.name}


def _descr_from_msgpack(d):
    """msgpack turns the tuples of a structured dtype's descr into lists; undo that."""
    if isinstance(d, str):
        return d
    fields = []
    for f in d:
        name, fmt = f[0], _descr_from_msgpack(f[1])
        fields.append((name, fmt, tuple(f[2])) if len(f) > 2 else (name, fmt))
    return fields


def _dtype_from_identity(ident: dict) -> np.dtype:
    name = ident.get("name", "")
    dt = np.lib.format.descr_to_dtype(_descr_from_msgpack(ident["descr"]))
    if dt.kind == "V" and dt.names is None and name and not name.startswith("void"):
        # A custom scalar type (bfloat16 & co) registered by ml_dtypes.
        try:
            import ml_dtypes  # noqa: F401
            dt = np.dtype(name)
        except (ImportError, TypeError):
            pass
    return dt


def _check_dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise TypeError(f"dtype {dt} holds Python objects, which cannot be stored; use a fixed-size dtype")
    return dt


# ----------------------------------------------------------------- base

class _Store:
    """Shared machinery: the native handle, identity, common operations.

    The native handle is freed by close() or, if a store is dropped unclosed,
    by ffi.gc (which does not sync: records appended are still in the page
    cache and survive a process exit, but only sync()/close() survive power loss).
    """

    kind: str = ""

    def __init__(self, path, *, create: bool, codec: str | None, level: int | None,
                 dict_bytes: bytes | None, identity: dict | None, fixed_size: int = 0):
        self._handle = None
        self._path = os.fspath(path)
        self._append_lock = threading.Lock()
        if codec is None:
            codec = "zstd"
        if codec not in _lib.CODECS:
            raise InvalidArgumentError(f"{self._path}: unknown codec {codec!r}; choose one of {sorted(_lib.CODECS)}",
                                       path=self._path)
        if level is not None and (not isinstance(level, int) or isinstance(level, bool)):
            raise ArgumentTypeError(f"{self._path}: level must be an int, not {type(level).__name__}", path=self._path)
        if dict_bytes is not None:
            dict_bytes = bytes(dict_bytes)
        if create:
            if codec == "zstd_dict" and not dict_bytes:
                raise DictionaryError(f"{self._path}: codec 'zstd_dict' needs dict_bytes (train one with train_dict)", path=self._path)
            if codec != "zstd_dict" and dict_bytes:
                raise DictionaryError(f"{self._path}: dict_bytes given but codec is {codec!r}; use codec='zstd_dict'", path=self._path)
        user = msgpack.packb(identity, use_bin_type=True) if identity is not None else b""
        out = ffi.new("lx_store **")
        d = dict_bytes or b""
        rc = lib.lx_open(self._path.encode(), 1 if create else 0, _lib.CODECS[codec], level or 0,
                         d if d else ffi.NULL, len(d), user if user else ffi.NULL, len(user),
                         fixed_size if codec == "raw" else 0, out)
        check(rc, self._path)
        self._handle = ffi.gc(out[0], lib.lx_close)
        info = ffi.new("lx_info_t *")
        lib.lx_info(self._handle, info)
        self._codec = _lib.CODEC_NAMES[info.codec]
        self._level = int(info.level)
        self._identity = self._read_identity()

    # -- identity
    def _blob(self, which: int) -> bytes:
        ptr = ffi.new("const uint8_t **")
        n = ffi.new("uint64_t *")
        check(lib.lx_blob(self._h(), which, ptr, n), self._path)
        return bytes(ffi.buffer(ptr[0], n[0])) if n[0] else b""

    def _read_identity(self) -> dict:
        raw = self._blob(1)
        if not raw:
            return {"kind": "bytes"}
        try:
            ident = msgpack.unpackb(raw, raw=False)
        except Exception as e:  # msgpack raises several unrelated types
            self.close()
            raise CorruptStoreError(f"{self._path}: the stored type identity is unreadable ({type(e).__name__})", path=self._path) from None
        if not isinstance(ident, dict) or "kind" not in ident:
            self.close()
            raise CorruptStoreError(f"{self._path}: the stored type identity is malformed", path=self._path)
        return ident

    def _h(self):
        if self._handle is None:
            raise ClosedError(f"{self._path}: store is closed", path=self._path)
        return self._handle

    # -- common API
    @property
    def path(self) -> str:
        return self._path

    @property
    def codec(self) -> str:
        return self._codec

    @property
    def level(self) -> int:
        return self._level

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __len__(self) -> int:
        return int(lib.lx_len(self._h()))

    def _indices(self, key) -> tuple[np.ndarray, bool]:
        return _normalize_indices(key, len(self))

    def delete(self, key) -> None:
        """Delete records (int, slice, index array or mask; duplicates allowed)."""
        idx, _ = self._indices(key)
        if len(idx):
            check(lib.lx_delete(self._h(), _u64_ptr(idx), len(idx)), self._path, "delete")

    def compact(self) -> None:
        """Reclaim the bytes of deleted records in place (re-runnable if interrupted)."""
        check(lib.lx_compact(self._h()), self._path, "compact")

    def stats(self) -> dict:
        """``{records, live_bytes, chunk_bytes, reclaimable}``; O(1)."""
        st = ffi.new("lx_stats_t *")
        check(lib.lx_stats(self._h(), st), self._path)
        return {"records": int(st.records), "live_bytes": int(st.live_bytes),
                "chunk_bytes": int(st.chunk_bytes), "reclaimable": int(st.reclaimable)}

    def sync(self) -> None:
        """Make every record appended through this handle durable."""
        check(lib.lx_sync(self._h()), self._path, "sync")

    def verify(self) -> None:
        """Check every record (checksum, location, decode); raises CorruptStoreError."""
        bad = ffi.new("uint64_t *")
        check(lib.lx_verify(self._h(), bad), self._path, "verify")

    def dictionary(self) -> bytes | None:
        """The store's zstd dictionary (``zstd_dict`` stores), else None."""
        d = self._blob(0)
        return d or None

    def close(self) -> None:
        """Sync and release the handle. Idempotent."""
        h, self._handle = self._handle, None
        if h is not None:
            try:
                check(lib.lx_sync(h), self._path, "sync")
            finally:
                ffi.release(h)

    def __enter__(self):
        self._h()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self):
        raise TypeError(f"{type(self).__name__} cannot be pickled; reopen it by path in the other process")

    def _describe(self) -> str:
        return ""

    def __repr__(self) -> str:
        if self._handle is None:
            return f"{type(self).__name__}({self._path!r}, closed)"
        extra = self._describe()
        return f"{type(self).__name__}({self._path!r}, len={len(self)}{extra}, codec={self._codec!r})"

    # -- native calls shared by the typed stores
    def _append_raw(self, ptrs: np.ndarray, sizes: np.ndarray, aux_ptrs=None, aux_sizes=None,
                    keep=None, *, stage: bool = False) -> int:
        first = ffi.new("uint64_t *")
        n = len(sizes)
        rc = lib.lx_append(
            self._h(), n,
            ffi.cast("const uint8_t *const *", ffi.from_buffer(ptrs)),
            _u64_ptr(sizes),
            ffi.cast("const uint8_t *const *", ffi.from_buffer(aux_ptrs)) if aux_ptrs is not None else ffi.NULL,
            _u64_ptr(aux_sizes) if aux_sizes is not None else ffi.NULL,
            1 if stage else 0,
            first)
        check(rc, self._path, "append")
        return int(first[0])

    def _append_chunks(self, chunks) -> int:
        """Appends chunks `(ptrs, sizes, aux_ptrs, aux_sizes, keep_alive)` as ONE
        atomic append: every chunk but the last is staged (written, invisible),
        the last publishes them all; an error drops what was staged. One chunk
        is held in memory ahead of the one being written."""
        with self._append_lock:
            first = None
            staged = False
            try:
                pending = None
                for chunk in chunks:
                    if pending is not None:
                        f = self._append_raw(*pending, stage=True)
                        staged = True
                        first = f if first is None else first
                    pending = chunk
                if pending is not None:
                    f = self._append_raw(*pending, stage=False)
                    first = f if first is None else first
                staged = False
            finally:
                if staged and self._handle is not None:
                    lib.lx_publish(self._handle, 0)
            return len(self) if first is None else first

    def _sizes(self, idx: np.ndarray, aux: bool) -> tuple[np.ndarray, np.ndarray | None]:
        raw = np.empty(len(idx), dtype=_U64)
        auxs = np.empty(len(idx), dtype=_U64) if aux else None
        if len(idx):
            check(lib.lx_sizes(self._h(), _u64_ptr(idx), len(idx), _u64_ptr(raw),
                               _u64_ptr(auxs) if aux else ffi.NULL), self._path)
        return raw, auxs

    def _gather_packed_bytes(self, idx: np.ndarray, sizes: np.ndarray, part: int = 0,
                             threads: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Reads records back to back into one uint8 buffer; returns (buffer, byte offsets[B+1])."""
        offsets = np.zeros(len(idx) + 1, dtype=_U64)
        np.cumsum(sizes, out=offsets[1:])
        buf = np.empty(int(offsets[-1]), dtype=np.uint8)
        if len(idx):
            rc = lib.lx_gather(self._h(), _u64_ptr(idx), len(idx), _byte_ptr(buf, True), buf.nbytes,
                               0, _u64_ptr(offsets), part, threads)
            check(rc, self._path, "gather")
        return buf, offsets


def _bytes_records(records: Iterable) -> Iterator[np.ndarray]:
    for i, r in enumerate(records):
        if isinstance(r, np.ndarray):
            if not r.flags.c_contiguous:
                r = np.ascontiguousarray(r)
            yield r.reshape(-1).view(np.uint8) if r.nbytes else np.zeros(0, np.uint8)
            continue
        try:
            mv = memoryview(r)
        except TypeError:
            raise TypeError(f"record {i} is a {type(r).__name__}, not a bytes-like object") from None
        yield np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv, dtype=np.uint8)


def _chunks(arrays: Iterable[np.ndarray]) -> Iterator[list[np.ndarray]]:
    """Bounded-memory chunks of an iterator of arrays."""
    chunk, nbytes = [], 0
    for a in arrays:
        chunk.append(a)
        nbytes += a.nbytes
        if nbytes >= _APPEND_CHUNK_BYTES or len(chunk) >= _APPEND_CHUNK_RECORDS:
            yield chunk
            chunk, nbytes = [], 0
    if chunk:
        yield chunk


def _pointers(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, list]:
    """(pointer array, size array, keep-alive list) for a list of contiguous arrays."""
    keep = []
    ptrs = np.empty(len(arrays), dtype=_U64)
    sizes = np.empty(len(arrays), dtype=_U64)
    for i, a in enumerate(arrays):
        buf = _byte_ptr(a)
        keep.append(buf)
        ptrs[i] = int(ffi.cast("uintptr_t", buf))
        sizes[i] = a.nbytes
    return ptrs, sizes, keep


# ----------------------------------------------------------------- Zrecord

class Zrecord(_Store):
    """Raw byte records (pre-encoded images, opaque payloads).

    ``Zrecord(path, create=True)`` makes the store if the path holds none (and
    opens it if it does); without ``create`` a missing store raises
    `FileNotFoundError` and nothing is created. Records in: any bytes-like;
    out: ``bytes`` (``z[i]``) or a list of bytes (``z[list]``, slices).
    """

    kind = "bytes"

    def __init__(self, path, *, create: bool = False, codec: str = "zstd", level: int | None = None,
                 dict_bytes: bytes | None = None):
        super().__init__(path, create=create, codec=codec, level=level, dict_bytes=dict_bytes,
                         identity={"kind": "bytes", "v": IDENTITY_VERSION})
        if self._identity.get("kind") != "bytes":
            kind = self._identity.get("kind")
            self.close()
            raise IdentityError(f"{self._path}: store holds {kind} records; open it with "
                                f"{'DenseStore' if kind == 'dense' else 'RaggedStore'} or loaderx.dataset.open_store",
                                path=self._path)

    dtype = np.dtype(np.uint8)
    item_shape = None

    def append(self, records: Iterable) -> int:
        """Append bytes-like records; returns the index of the first one."""
        self._h()

        def chunks():
            for chunk in _chunks(_bytes_records(records)):
                ptrs, sizes, keep = _pointers(chunk)
                yield ptrs, sizes, None, None, keep
        return self._append_chunks(chunks())

    def gather(self, indices, out=None, *, threads: int = 0) -> list[bytes]:
        """Records `indices` as a list of bytes, in request order."""
        if out is not None:
            raise TypeError("Zrecord.gather returns bytes; use gather_into(indices, buffer) to fill a buffer")
        idx, _ = self._indices(indices)
        return self._read(idx, threads)

    def _read(self, idx: np.ndarray, threads: int = 0) -> list[bytes]:
        sizes, _ = self._sizes(idx, aux=False)
        buf, offsets = self._gather_packed_bytes(idx, sizes, threads=threads)
        o = offsets.tolist()
        mv = memoryview(buf)
        return [mv[o[i]:o[i + 1]].tobytes() for i in range(len(idx))]

    def gather_into(self, indices, out, offsets=None) -> np.ndarray:
        """Read records into the caller's writable buffer `out` (bytes-like or
        array), back to back from offset 0 or at `offsets[i]`. Returns the
        records' sizes (uint64). Nothing is allocated per record."""
        idx, _ = self._indices(indices)
        sizes, _ = self._sizes(idx, aux=False)
        if offsets is None:
            offs = np.zeros(len(idx), dtype=_U64)
            if len(idx) > 1:
                np.cumsum(sizes[:-1], out=offs[1:])
        else:
            offs = np.ascontiguousarray(offsets, dtype=_U64)
            if offs.shape != (len(idx),):
                raise ValueError(f"offsets has shape {offs.shape}, expected ({len(idx)},)")
        dest = ffi.from_buffer("uint8_t[]", out, require_writable=True)
        if len(idx):
            check(lib.lx_gather(self._h(), _u64_ptr(idx), len(idx), dest, len(dest), 0, _u64_ptr(offs), 0, 0),
                  self._path, "gather_into")
        return sizes

    def __getitem__(self, key):
        idx, scalar = self._indices(key)
        out = self._read(idx)
        return out[0] if scalar else out


# ----------------------------------------------------------------- DenseStore

class DenseStore(_Store):
    """Fixed ``(dtype, item_shape)`` records.

    ``DenseStore(path, dtype, item_shape)`` creates the store (or opens it and
    checks the identity matches); ``DenseStore(path)`` opens an existing one.
    ``append(array)`` takes ``(B, *item_shape)`` of exactly ``dtype``. Reads:
    ``ds[i]`` → one record; ``ds[i, j]``, ``ds[a:b]``, ``ds[int_array]``,
    ``ds[bool_mask]`` → stacked ``(B, *item_shape)``. ``gather(idx, out=buf)``
    fills a caller's C-contiguous array (pinned memory, a reused buffer) with no
    extra copy.
    """

    kind = "dense"

    def __init__(self, path, dtype=None, item_shape=None, *, codec: str | None = None,
                 level: int | None = None, dict_bytes: bytes | None = None):
        create = dtype is not None or item_shape is not None
        if create:
            if dtype is None:
                raise TypeError("DenseStore needs a dtype to create a store")
            dt = _check_dtype(dtype)
            shape = () if item_shape is None else tuple(int(d) for d in np.atleast_1d(item_shape)) if not isinstance(item_shape, tuple) else tuple(int(d) for d in item_shape)
            if any(d < 0 for d in shape):
                raise ValueError(f"item_shape {shape} has a negative dimension")
            identity = {"kind": "dense", "v": IDENTITY_VERSION, "dtype": _dtype_identity(dt), "item_shape": list(shape)}
        else:
            if codec is not None or dict_bytes is not None:
                raise TypeError("codec/dict_bytes apply only when creating: pass dtype and item_shape")
            identity = None
        # A raw dense store uses the fixed-width layout: locations computed,
        # not looked up, and 4 bytes of index per record instead of 32.
        fixed = dt.itemsize * math.prod(shape) if create else 0
        super().__init__(path, create=create, codec=codec, level=level, dict_bytes=dict_bytes,
                         identity=identity, fixed_size=fixed)
        ident = self._identity
        if ident.get("kind") != "dense":
            self.close()
            raise IdentityError(f"{self._path}: store holds {ident.get('kind')} records, not dense ones "
                                "(use loaderx.dataset.open_store)", path=self._path)
        try:
            self._dtype = _dtype_from_identity(ident["dtype"])
            self._item_shape = tuple(int(d) for d in ident["item_shape"])
        except (KeyError, TypeError, ValueError) as e:
            self.close()
            raise CorruptStoreError(f"{self._path}: the stored dtype/shape identity is malformed ({e})", path=self._path) from None
        if create and (self._dtype != dt or self._item_shape != shape):
            found = (self._dtype, self._item_shape)
            self.close()
            raise IdentityError(f"{self._path}: existing store holds dtype={found[0]}, item_shape={found[1]}; "
                                f"asked for dtype={dt}, item_shape={shape}", path=self._path)
        self._record_bytes = self._dtype.itemsize * math.prod(self._item_shape)

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

    def append(self, array) -> int:
        """Append ``(B, *item_shape)`` records of exactly this dtype; returns the first index."""
        self._h()
        if not isinstance(array, np.ndarray):
            raise TypeError(f"append takes a numpy array of dtype {self._dtype}, not {type(array).__name__}")
        if array.dtype != self._dtype:
            raise IdentityError(f"{self._path}: array has dtype {array.dtype}, store holds {self._dtype}", path=self._path)
        if array.shape[1:] != self._item_shape or array.ndim != len(self._item_shape) + 1:
            raise SizeMismatchError(f"{self._path}: array has shape {array.shape}, expected (B, *{self._item_shape})",
                                    path=self._path)
        n = array.shape[0]
        if n == 0:
            return len(self)
        rb = self._record_bytes
        step = max(1, _APPEND_CHUNK_BYTES // max(rb, 1))

        def chunks():
            for start in range(0, n, step):
                part = np.ascontiguousarray(array[start:start + step])
                buf = _byte_ptr(part)
                base = int(ffi.cast("uintptr_t", buf))
                ptrs = np.arange(len(part), dtype=_U64) * _U64(rb) + _U64(base)
                sizes = np.full(len(part), rb, dtype=_U64)
                yield ptrs, sizes, None, None, (part, buf)
        return self._append_chunks(chunks())

    def gather(self, indices, out: np.ndarray | None = None, *, threads: int = 0) -> np.ndarray:
        """Records `indices` stacked as ``(B, *item_shape)``, written into `out`
        when given (C-contiguous, writable, exact dtype and shape). `threads`
        caps the native threads (0: every usable core)."""
        fast = _unchecked_indices(indices)
        if fast is not None:
            result = self._gather(fast, out, threads, exact=False)
            if result is not None:
                return result
        idx, _ = self._indices(indices)
        return self._gather(idx, out, threads)

    def _gather(self, idx: np.ndarray, out: np.ndarray | None, threads: int = 0,
                exact: bool = True) -> np.ndarray | None:
        """With ``exact=False`` (unchecked indices) returns None instead of
        raising on an out-of-range index, so the caller can retry the slow path."""
        shape = (len(idx),) + self._item_shape
        if out is None:
            out = np.empty(shape, dtype=self._dtype)
        else:
            if not isinstance(out, np.ndarray):
                raise TypeError(f"out must be a numpy array, not {type(out).__name__}")
            if out.dtype != self._dtype:
                raise IdentityError(f"out has dtype {out.dtype}, store holds {self._dtype}", path=self._path)
            if out.shape != shape:
                raise SizeMismatchError(f"out has shape {out.shape}, the batch needs {shape}", path=self._path)
            if not out.flags.c_contiguous:
                raise SizeMismatchError("out must be C-contiguous", path=self._path)
            if not out.flags.writeable:
                raise SizeMismatchError("out is read-only", path=self._path)
        if len(idx):
            rc = lib.lx_gather(self._h(), _u64_ptr(idx), len(idx), _byte_ptr(out, True),
                               out.nbytes, self._record_bytes, ffi.NULL, 0, threads)
            if rc == _RC_OUT_OF_RANGE and not exact:
                return None
            check(rc, self._path, "gather")
        return out

    def __getitem__(self, key):
        fast = _unchecked_indices(key)
        if fast is not None:
            result = self._gather(fast, None, exact=False)
            if result is not None:
                return result
        idx, scalar = self._indices(key)
        out = self._gather(idx, None)
        return out[0] if scalar else out


# ----------------------------------------------------------------- RaggedStore

def _encode_shape(shape: tuple) -> bytes:
    """Aux bytes of a record: none for 1-D (the size gives the length), else
    uint64 [ndim, *shape]."""
    if len(shape) == 1:
        return b""
    return np.array([len(shape), *shape], dtype="<u8").tobytes()


class RaggedStore(_Store):
    """One dtype; every record keeps its own shape (any rank, including ``()``
    and zero-length). Reads return a list of arrays in request order;
    ``gather_packed`` returns ``(values, row_splits)`` for records sharing
    their trailing dimensions — one flat buffer, no Python object per record.
    """

    kind = "ragged"

    def __init__(self, path, dtype=None, *, codec: str | None = None, level: int | None = None,
                 dict_bytes: bytes | None = None):
        create = dtype is not None
        identity = None
        if create:
            dt = _check_dtype(dtype)
            identity = {"kind": "ragged", "v": IDENTITY_VERSION, "dtype": _dtype_identity(dt)}
        elif codec is not None or dict_bytes is not None:
            raise TypeError("codec/dict_bytes apply only when creating: pass dtype")
        super().__init__(path, create=create, codec=codec, level=level, dict_bytes=dict_bytes, identity=identity)
        ident = self._identity
        if ident.get("kind") != "ragged":
            self.close()
            raise IdentityError(f"{self._path}: store holds {ident.get('kind')} records, not ragged ones "
                                "(use loaderx.dataset.open_store)", path=self._path)
        try:
            self._dtype = _dtype_from_identity(ident["dtype"])
        except (KeyError, TypeError, ValueError) as e:
            self.close()
            raise CorruptStoreError(f"{self._path}: the stored dtype identity is malformed ({e})", path=self._path) from None
        if create and self._dtype != dt:
            found = self._dtype
            self.close()
            raise IdentityError(f"{self._path}: existing store holds dtype={found}; asked for dtype={dt}", path=self._path)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    item_shape = None

    def _describe(self) -> str:
        return f", dtype={self._dtype}"

    def _as_record(self, i: int, x) -> np.ndarray:
        if isinstance(x, np.ndarray):
            if x.dtype != self._dtype:
                raise IdentityError(f"{self._path}: record {i} has dtype {x.dtype}, store holds {self._dtype}", path=self._path)
            # (np.ascontiguousarray would turn a 0-d record into a 1-d one)
            return x if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(x.shape)
        if isinstance(x, (bytes, bytearray, memoryview)):
            if self._dtype != np.uint8:
                raise IdentityError(f"{self._path}: record {i} is bytes but the store holds {self._dtype}", path=self._path)
            return np.frombuffer(x, dtype=np.uint8)
        try:
            a = np.asarray(x, dtype=self._dtype)
        except (TypeError, ValueError) as e:
            raise TypeError(f"record {i} cannot be read as {self._dtype}: {e}") from None
        return a if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(a.shape)

    def append(self, records: Iterable) -> int:
        """Append arrays (a one-pass iterator is fine); returns the first index."""
        self._h()
        if isinstance(records, np.ndarray) and records.dtype == self._dtype and records.ndim >= 1:
            records = list(records)
        arrays = (self._as_record(i, x) for i, x in enumerate(records))

        def chunks():
            for chunk in _chunks(arrays):
                for a in chunk:
                    if a.ndim > _MAX_NDIM:
                        raise ValueError(f"record has {a.ndim} dimensions; at most {_MAX_NDIM} are supported")
                ptrs, sizes, keep = _pointers(chunk)
                auxes = [np.frombuffer(_encode_shape(a.shape), dtype=np.uint8) for a in chunk]
                if any(len(x) for x in auxes):
                    aux_ptrs, aux_sizes, keep2 = _pointers(auxes)
                    yield ptrs, sizes, aux_ptrs, aux_sizes, (chunk, keep, auxes, keep2)
                else:
                    yield ptrs, sizes, None, None, (chunk, keep)
        return self._append_chunks(chunks())

    def _shapes(self, idx: np.ndarray, raw: np.ndarray, aux: np.ndarray) -> list[tuple]:
        """Each record's shape, checked against its byte size before anything is sized by it."""
        item = self._dtype.itemsize
        n = len(idx)
        if not aux.any():
            if item:
                if (raw % item).any():
                    bad = int(idx[np.flatnonzero(raw % item)[0]])
                    raise CorruptStoreError(f"{self._path}: record {bad} size is not a multiple of {item}", path=self._path)
            return [(int(r) // item,) if item else (0,) for r in raw]
        if (aux % 8).any() or (aux > 8 * (_MAX_NDIM + 1)).any():
            bad = int(idx[np.flatnonzero((aux % 8) | (aux > 8 * (_MAX_NDIM + 1)))[0]])
            raise CorruptStoreError(f"{self._path}: record {bad} has a damaged shape", path=self._path)
        buf, offs = self._gather_packed_bytes(idx, aux, part=1)
        words = buf.view("<u8")
        shapes = []
        wo = (offs // 8).tolist()
        for i in range(n):
            if aux[i] == 0:
                if item and int(raw[i]) % item:
                    raise CorruptStoreError(f"{self._path}: record {int(idx[i])} size is not a multiple of {item}", path=self._path)
                shapes.append((int(raw[i]) // item if item else 0,))
                continue
            w = words[wo[i]:wo[i + 1]]
            ndim = int(w[0])
            dims = tuple(int(d) for d in w[1:])
            if ndim != len(dims) or math.prod(dims) * item != int(raw[i]):
                raise CorruptStoreError(f"{self._path}: record {int(idx[i])} has a damaged shape {dims}", path=self._path)
            shapes.append(dims)
        return shapes

    def _read(self, idx: np.ndarray, threads: int = 0) -> list[np.ndarray]:
        raw, aux = self._sizes(idx, aux=True)
        shapes = self._shapes(idx, raw, aux)
        buf, offsets = self._gather_packed_bytes(idx, raw, threads=threads)
        item = self._dtype.itemsize
        if item == 0:
            return [np.zeros(s, dtype=self._dtype) for s in shapes]
        values = buf.view(self._dtype)
        eo = (offsets // item).tolist()
        out = []
        for i, s in enumerate(shapes):
            v = values[eo[i]:eo[i + 1]]
            out.append(v if len(s) == 1 else v.reshape(s))
        return out

    def gather(self, indices, out=None, *, threads: int = 0) -> list[np.ndarray]:
        """Records `indices` as a list of arrays, in request order."""
        if out is not None:
            raise TypeError("RaggedStore.gather returns a list; out= applies to DenseStore only")
        idx, _ = self._indices(indices)
        return self._read(idx, threads)

    def gather_packed(self, indices, *, threads: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(values, row_splits)``: the records concatenated along their first
        axis, and int64 row offsets (length B+1). Records must share their
        trailing dimensions (all 1-D, or all ``(n, *t)`` with the same ``t``)."""
        idx, _ = self._indices(indices)
        raw, aux = self._sizes(idx, aux=True)
        item = self._dtype.itemsize
        if aux.any():
            shapes = self._shapes(idx, raw, aux)
            trailing = None
            for i, s in enumerate(shapes):
                if len(s) == 0:
                    raise ValueError(f"record {int(idx[i])} is a scalar; gather_packed needs records with a first axis")
                if trailing is None:
                    trailing = s[1:]
                elif s[1:] != trailing:
                    raise ValueError(f"records do not share trailing dimensions: record {int(idx[i])} has shape {s}, "
                                     f"earlier ones (*, {', '.join(map(str, trailing))})")
            rows = np.array([s[0] for s in shapes], dtype=np.int64)
        else:
            trailing = ()
            if item and (raw % item).any():
                raise CorruptStoreError(f"{self._path}: a record size is not a multiple of {item}", path=self._path)
            rows = (raw // item).astype(np.int64) if item else np.zeros(len(idx), np.int64)
        buf, _ = self._gather_packed_bytes(idx, raw, threads=threads)
        row_splits = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(rows, out=row_splits[1:])
        trailing = trailing or ()
        values = buf.view(self._dtype).reshape((int(row_splits[-1]),) + tuple(trailing)) if item else \
            np.zeros((int(row_splits[-1]),) + tuple(trailing), self._dtype)
        return values, row_splits

    def __getitem__(self, key):
        idx, scalar = self._indices(key)
        out = self._read(idx)
        return out[0] if scalar else out


# ----------------------------------------------------------------- dictionaries

_TIERS = {"fast": (32 << 10, 4 << 20), "balanced": (128 << 10, 16 << 20), "max": (1 << 20, 64 << 20)}
_SAMPLE_MAX = 128 << 10  # zstd's trainer works on sample prefixes up to this size


def _sample_records(source, budget: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    if isinstance(source, _Store):
        n = len(source)
        if n == 0:
            raise DictionaryError(f"{source.path}: cannot train a dictionary on an empty store")
        order = rng.permutation(n)
        out, used = [], 0
        for start in range(0, n, 1024):
            idx = order[start:start + 1024]
            recs = source[idx]
            for r in recs:
                b = r.tobytes() if isinstance(r, np.ndarray) else bytes(r)
                b = b[:_SAMPLE_MAX]
                out.append(b)
                used += len(b)
                if used >= budget:
                    return out
        return out
    if isinstance(source, np.ndarray):
        if source.dtype.hasobject:
            raise TypeError("cannot train a dictionary on an object array")
        if source.ndim == 0 or len(source) == 0:
            raise DictionaryError("cannot train a dictionary on an empty array")
        rec = source[0].nbytes or 1
        take = min(len(source), max(1, budget // rec))
        idx = np.sort(rng.choice(len(source), size=take, replace=False))
        return [np.ascontiguousarray(source[i]).tobytes()[:_SAMPLE_MAX] for i in idx]
    out, used = [], 0
    for i, r in enumerate(source):
        if isinstance(r, np.ndarray):
            b = np.ascontiguousarray(r).tobytes()
        else:
            try:
                b = bytes(memoryview(r))
            except TypeError:
                raise TypeError(f"sample {i} is a {type(r).__name__}, not bytes-like or an array") from None
        b = b[:_SAMPLE_MAX]
        out.append(b)
        used += len(b)
        if used >= budget:
            break
    return out


def train_dict(source, tier: str = "balanced", *, size: int | None = None) -> bytes:
    """Train a zstd dictionary for a ``zstd_dict`` store.

    `source`: an array (rows are records), an iterable of records (bytes-like or
    arrays) or a store. `tier`: ``fast`` (32 KiB dictionary from a 4 MiB
    sample), ``balanced`` (128 KiB / 16 MiB) or ``max`` (1 MiB / 64 MiB);
    `size` overrides the dictionary size. Raises `DictionaryError` when zstd
    cannot train one (too few or too uniform samples).
    """
    if tier not in _TIERS:
        raise ValueError(f"unknown tier {tier!r}; choose one of {sorted(_TIERS)}")
    dict_size, budget = _TIERS[tier]
    if size is not None:
        if not isinstance(size, int) or size < 256:
            raise ValueError(f"size must be an int >= 256, got {size!r}")
        dict_size = size
    samples = [s for s in _sample_records(source, budget) if s]
    if len(samples) < 8:
        raise DictionaryError(f"need at least 8 non-empty samples to train a dictionary, got {len(samples)}")
    joined = b"".join(samples)
    sizes = np.array([len(s) for s in samples], dtype=_U64)
    out = bytearray(dict_size)
    out_len = ffi.new("uint64_t *")
    rc = lib.lx_train_dict(joined, _u64_ptr(sizes), len(samples), ffi.from_buffer(out), dict_size, out_len)
    check(rc, None, "train_dict")
    return bytes(out[:out_len[0]])
