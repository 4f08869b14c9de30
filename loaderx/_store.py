"""The machinery every store kind shares: the native handle's lifetime, index
normalisation, marshalling of records to the C ABI, and the common API
(len, delete, compact, stats, sync, verify, close, pickling).

Handle lifetime: every native call counts itself in and out, so `close()`
may run on any thread at any time. It syncs, then marks the handle closed:
calls already running finish normally, later ones raise `ClosedError`, and
the files are unmapped when the last call leaves. The handle's memory is
freed when the last Python reference to it goes (``ffi.gc``), which also
closes a store that was dropped without `close()` (without syncing: records
appended are in the page cache and survive the process, but only
``sync()``/``close()`` survive a power loss).

Fork: the library makes each handle a forked child inherits the child's
own (src/Store.zig, "Fork"): the child never keeps the parent's writer lock,
and it holds its own shared lock on the store while it has the handle open.
Nothing here takes part.
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import Any, Iterable, Iterator

import numpy as np

from . import _lib, _objstore, _openers, _original, _records, identity
from ._checks import check_level, is_int, path_arg
from ._lib import check, ffi, lib
from .streams import NativePart
from .errors import (
    ArgumentTypeError,
    ClosedError,
    DictionaryError,
    IdentityError,
    InvalidArgumentError,
    LoaderxError,
    LockedError,
    NotAStoreError,
    ReadOnlyError,
    RecordIndexError,
)

U64 = np.uint64
_EMPTY_U64 = np.zeros(1, dtype=U64)
APPEND_CHUNK_BYTES = 64 << 20
APPEND_CHUNK_RECORDS = 16384
RC_OUT_OF_RANGE = _lib.RESULTS["out_of_range"]
_RC_FAILED = _lib.RESULTS["failed"]
_T_U64 = ffi.typeof("uint64_t[]")
_T_U8 = ffi.typeof("uint8_t[]")
#: The largest `threads` cap a gather takes (the native argument is a uint32).
THREADS_MAX = 2**32 - 1


def deprecated(old: str, new: str, stacklevel: int = 3) -> None:
    """Warns that the spelling `old` is deprecated in favour of `new` (still
    working; docs/migrating.md lists what the original loaderx spelled)."""
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=stacklevel)


# ----------------------------------------------------------------- marshalling

def u64_ptr(arr: np.ndarray):
    """A `uint64_t *` to a C-contiguous uint64 array (kept alive by the caller)."""
    return ffi.from_buffer(_T_U64, arr)


def byte_ptr(arr: Any, writable: bool = False):
    """A `uint8_t *` to a contiguous buffer (a 1-byte dummy when it is empty)."""
    if isinstance(arr, np.ndarray) and arr.nbytes == 0:
        return ffi.from_buffer(_T_U8, _EMPTY_U64, require_writable=writable)
    return ffi.from_buffer(_T_U8, arr, require_writable=writable)


def check_threads(threads: Any) -> int:
    """A gather's `threads` cap: an int from 0 (every usable core) to THREADS_MAX."""
    if type(threads) is int and 0 <= threads <= THREADS_MAX:
        return threads
    if not is_int(threads):
        raise ArgumentTypeError(f"threads must be an int (0: every usable core), "
                                f"not {type(threads).__name__}")
    if not 0 <= int(threads) <= THREADS_MAX:
        raise InvalidArgumentError(f"threads must be from 0 (every usable core) to "
                                   f"{THREADS_MAX}, got {int(threads)}")
    return int(threads)


def normalize_indices(key: Any, n: int) -> tuple[np.ndarray, bool]:
    """Turns a read/delete key into (uint64 indices, is_scalar)."""
    if is_int(key):
        i = int(key)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise RecordIndexError(f"index {int(key)} is out of range for {n} records")
        return np.array([i], dtype=U64), True
    if isinstance(key, slice):
        return np.arange(*key.indices(n), dtype=np.int64).astype(U64), False
    if isinstance(key, tuple):
        key = list(key)
    try:
        arr = np.asarray(key)
    except (TypeError, ValueError):  # a ragged nesting such as [1, [2]]
        raise TypeError("record indices must be integers, a slice or a boolean mask, "
                        f"not {_preview(key)}") from None
    if arr.dtype == object and arr.ndim == 1:
        _check_python_ints(arr.tolist(), n)
    if arr.dtype == np.bool_:
        if arr.shape != (n,):
            raise RecordIndexError(f"boolean mask has shape {arr.shape}, expected ({n},)")
        return np.flatnonzero(arr).astype(U64), False
    if arr.size == 0:
        return np.zeros(0, dtype=U64), False
    if arr.dtype.kind not in "iu":
        raise TypeError("record indices must be integers, a slice or a boolean mask, "
                        f"not {arr.dtype}")
    if arr.ndim != 1:
        raise TypeError(f"record indices must be one-dimensional, got shape {arr.shape}")
    if arr.dtype.kind == "i":
        # Wrap negatives in int64: a narrow type (int8) would overflow.
        arr = arr.astype(np.int64, copy=False)
        lo = int(arr.min())
        if lo < 0:
            arr = np.where(arr < 0, arr + n, arr)
            if int(arr.min()) < 0:
                raise RecordIndexError(f"index {lo} is out of range for {n} records")
    hi = int(arr.max())
    if hi >= n:
        raise RecordIndexError(f"index {hi} is out of range for {n} records")
    return np.ascontiguousarray(arr, dtype=U64), False


def _preview(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_python_ints(values: list, n: int) -> None:
    """Indices numpy keeps as Python objects: ints past 64 bits (out of range
    for any store) or anything else (left to the integer check)."""
    if not all(type(v) is int for v in values):
        return
    for v in values:
        if not -n <= v < n:
            raise RecordIndexError(f"index {v} is out of range for {n} records")


def chunks_of(arrays: Iterable[np.ndarray]) -> Iterator[list[np.ndarray]]:
    """Bounded-memory chunks of an iterator of arrays."""
    chunk, nbytes = [], 0
    for a in arrays:
        chunk.append(a)
        nbytes += a.nbytes
        if nbytes >= APPEND_CHUNK_BYTES or len(chunk) >= APPEND_CHUNK_RECORDS:
            yield chunk
            chunk, nbytes = [], 0
    if chunk:
        yield chunk


def pointers(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, list]:
    """(pointer array, size array, keep-alive list) for a list of contiguous arrays."""
    keep = []
    ptrs = np.empty(len(arrays), dtype=U64)
    sizes = np.empty(len(arrays), dtype=U64)
    for i, a in enumerate(arrays):
        buf = byte_ptr(a)
        keep.append(buf)
        ptrs[i] = int(ffi.cast("uintptr_t", buf))
        sizes[i] = a.nbytes
    return ptrs, sizes, keep


def row_splits(splits: Any, total: int, what: str = "row_splits") -> np.ndarray:
    """`splits` checked as the offsets of packed records into `total` rows:
    1-D integers, from 0 to `total`, never decreasing. As int64."""
    arr = np.asarray(splits)
    if arr.ndim != 1 or len(arr) == 0:
        raise ValueError(f"{what} must be one-dimensional with at least one entry (0), "
                         f"got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers, not {arr.dtype}")
    if arr.dtype == np.uint64 and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{what} holds {int(arr.max())}, past the {total} rows of the values")
    arr = arr.astype(np.int64, copy=False)
    if arr[0] != 0:
        raise ValueError(f"{what} must start at 0, not {int(arr[0])}")
    if arr[-1] != total:
        raise ValueError(f"{what} must end at the {total} rows of the values, "
                         f"not at {int(arr[-1])}")
    steps = np.diff(arr)
    if len(steps) and int(steps.min()) < 0:
        at = int(np.flatnonzero(steps < 0)[0])
        raise ValueError(f"{what} decreases at record {at}: {int(arr[at])} -> {int(arr[at + 1])}")
    return arr


def packed_chunks(data: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                  aux: np.ndarray | None = None) -> Iterator[tuple]:
    """The append chunks of records packed in one contiguous buffer: record i
    is bytes ``[starts[i], starts[i] + sizes[i])`` of `data`, and its aux part
    (when given) row i of the C-contiguous uint64 array `aux`. Pointer arrays
    come from numpy arithmetic, with no Python object per record; chunks are
    cut as `chunks_of` cuts them."""
    keep = byte_ptr(data)
    ptrs = starts.astype(U64) + U64(int(ffi.cast("uintptr_t", keep)))
    sizes = sizes.astype(U64)
    aux_ptrs = aux_sizes = None
    if aux is not None:
        row = aux.shape[1] * aux.itemsize
        aux_keep = byte_ptr(aux)
        aux_ptrs = (np.arange(len(aux), dtype=U64) * U64(row)
                    + U64(int(ffi.cast("uintptr_t", aux_keep))))
        aux_sizes = np.full(len(aux), row, dtype=U64)
        keep = (keep, aux_keep)
    ends = np.cumsum(sizes, dtype=U64)
    i = 0
    while i < len(sizes):
        before = int(ends[i - 1]) if i else 0
        full = int(np.searchsorted(ends, U64(before + APPEND_CHUNK_BYTES), side="left")) + 1
        j = max(i + 1, min(full, i + APPEND_CHUNK_RECORDS, len(sizes)))
        yield (ptrs[i:j], sizes[i:j], None if aux_ptrs is None else aux_ptrs[i:j],
               None if aux_sizes is None else aux_sizes[i:j], (data, aux, keep))
        i = j


def _original_text(path: str, cls: str) -> str:
    """Why `cls(path)` cannot open a store of the original loaderx, and what does."""
    convert = _original.convert_command(path)
    if _original.is_store177(path):
        return (f"{path} is a store of the original loaderx 1.7, which has dense and ragged "
                f"stores only: loaderx.open_store(path) reads it in place (read-only); "
                f"{convert} converts it")
    return (f"{path} is a store written by the original loaderx 0.9, read only to convert it: "
            f"{convert}")


def _identity_spec(ident: identity.Identity | None) -> tuple:
    """(lx_identity_t pointer or NULL, what keeps its texts alive) for a
    create's identity: the library writes and checks the stored bytes."""
    if ident is None:
        return ffi.NULL, None
    spec = ffi.new("lx_identity_t *")
    spec.kind = _lib._abi.STORE_KINDS[ident.kind]
    keep: tuple = ()
    if ident.dtype is not None:
        descr, name, flags = identity.describe(ident.dtype)
        keep = (ffi.from_buffer("uint8_t[]", descr), ffi.from_buffer("uint8_t[]", name))
        spec.flags = flags
        spec.itemsize = ident.dtype.itemsize
        spec.descr, spec.descr_size = keep[0], len(descr)
        spec.name, spec.name_size = keep[1], len(name)
    if ident.item_shape is not None:
        spec.ndim = len(ident.item_shape)
        spec.item_shape[0:len(ident.item_shape)] = list(ident.item_shape)
    return spec, keep


# ----------------------------------------------------------------- the base class

class Store:
    """Shared machinery of `Zrecord`, `DenseStore` and `RaggedStore`."""

    kind: str = ""
    dtype: Any = None

    def __init__(self, path, *, create: bool, codec: str | None, level: int | None,
                 dict_bytes: bytes | None, ident: identity.Identity | None, fixed_size: int = 0,
                 frame_size: int = 0):
        self._handle = None
        self._path = path_arg(path, "store path")
        self._readonly = False
        # Set when the store is a dataset's column (`keep_rows`): its record
        # count must stay the manifest's.
        self._rows_owner: str | None = None
        # A URL opens the cache's replica of the remote store (through the
        # opener loaderx._openers holds); the native engine reads that
        # directory, `path` stays the URL.
        self._remote = _remote_binding(self._path, create)
        self._native_path = self._remote.local_dir if self._remote is not None else self._path
        self._append_lock = threading.Lock()
        self._append_thread: int | None = None  # the thread inside _append_chunks
        self._staging_all = False  # inside `one_append`: every append stays staged
        # Held by a `one_append` block (and by each append): another thread's
        # append waits for the block instead of joining its transaction.
        self._block_lock = threading.RLock()
        # An append that failed inside the block after it began writing: the
        # block's staged appends are gone, so its end publishes nothing.
        self._block_broken: BaseException | None = None
        # The content id of the data this store was converted from, when a
        # dataset's manifest says so (loaderx.dataset; see `content_id`).
        self._copied_from: str | None = None
        d = _dict_bytes(dict_bytes, self._path)
        _check_codec_args(self._path, create, codec, level, d)
        level = None if level is None else int(level)
        spec = _identity_spec(ident)
        out = ffi.new("lx_store **")
        create_codec = codec if codec is not None else "zstd"
        rc = lib.lx_open(os.fsencode(self._native_path), 1 if create else 0,
                         _lib.CODECS[create_codec], level or 0, d if d else ffi.NULL, len(d),
                         spec[0],
                         fixed_size if create_codec == "raw" else 0,
                         frame_size if create_codec != "raw" else 0, out)
        if rc != 0 and _original.is_original(self._path):
            raise NotAStoreError(_original_text(self._path, type(self).__name__),
                                 path=self._path)
        check(rc, self._path)
        self._handle = ffi.gc(out[0], lib.lx_free)
        # This store as a one-part index space for the gathers (a call holds
        # the handle, so the struct's pointer outlives the call).
        self._parts = _records.parts_array([(self._handle, 0)])
        try:
            info = ffi.new("lx_info_t *")
            check(lib.lx_info(self._handle, info), self._path)
            self._codec = _lib.CODEC_NAMES[info.codec]
            self._level = int(info.level)
            self._format_version = int(info.format_version)
            self._fixed_size = int(info.fixed_size)
            self._frame_size = int(info.frame_size)
            self._uid = int(info.uid)
            self._identity = self._read_identity()
            self._check_reopen(codec, level, d)
        except BaseException:
            self.close()
            raise
        self._readonly = self._remote is not None

    def _check_reopen(self, codec: str | None, level: int | None, dict_bytes: bytes) -> None:
        """An explicit codec, level or dictionary must match an existing store's."""
        mismatch = []
        if codec is not None and codec != self._codec:
            mismatch.append(f"codec={self._codec!r} (asked for {codec!r})")
        if level is not None and self._codec != "raw" and level != self._level:
            mismatch.append(f"level={self._level} (asked for {level})")
        if dict_bytes and dict_bytes != (self._blob("dictionary") or b""):
            mismatch.append("a different dictionary")
        if mismatch:
            raise IdentityError(f"{self._path}: existing store has {', '.join(mismatch)}",
                                path=self._path)

    def _read_identity(self) -> identity.Identity:
        """The store's identity, as the library checked it at open (a
        format-2 store's msgpack is decoded and checked here)."""
        out = ffi.new("lx_identity_t *")
        check(lib.lx_identity(self._h(), out), self._path)
        encoding = identity.ENCODINGS[out.encoding]
        if encoding == "none":
            return identity.Identity("bytes", None, None)
        if encoding == "msgpack":
            return identity.decode_msgpack(self._blob("user"), self._path)
        shape = tuple(out.item_shape[0:out.ndim])
        return identity.from_native(out.kind, out.flags, out.itemsize, shape,
                                    self._blob("dtype_descr"), self._blob("dtype_name"),
                                    self._path)

    def _blob(self, which: str) -> bytes:
        h = self._h()
        n = ffi.new("uint64_t *")
        code = _lib._abi.BLOBS[which]
        check(lib.lx_blob(h, code, ffi.NULL, 0, n), self._path)
        if n[0] == 0:
            return b""
        buf = bytearray(n[0])
        check(lib.lx_blob(h, code, ffi.from_buffer(buf), len(buf), n), self._path)
        return bytes(buf[:n[0]])

    def _h(self):
        """The native handle; `ClosedError` once closed."""
        h = self._handle
        if h is None:
            raise ClosedError(f"{self._path}: store is closed", path=self._path)
        return h

    def native_parts(self) -> list:
        """This store as native parts: ``[NativePart(handle, 0, None)]`` (the
        stream protocol, ``loaderx.streams``: a ShardSet and the DataLoader
        read stores in native code; callers keep the handle alive while they
        use it)."""
        return [NativePart(self._h(), 0, None, self._remote)]

    @property
    def is_remote(self) -> bool:
        """Whether this store is read from object storage (through the cache)."""
        return self._remote is not None

    @property
    def content_id(self) -> str | None:
        """Which records this store holds, wherever its files are: its kind,
        dtype, item shape, length and the random id written when it was
        created, which every copy of its files keeps (local or uploaded);
        for a store of a dataset converted from loaderx data, the content id
        of that data (its manifest says so). A subset's checkpoint
        fingerprint is built from it, never from a path. None for a store
        written before stores had an id."""
        if self._copied_from is not None:
            return self._copied_from
        if not self._uid:
            return None
        ident = self._identity
        shape = "" if ident.item_shape is None else str(list(ident.item_shape))
        dtype = "" if ident.dtype is None else f" {ident.dtype}{shape}"
        return f"{ident.kind}{dtype} x{len(self)} #{self._uid:016x}"

    @property
    def ring_stages_prefetch(self) -> bool:
        """Whether this store's ``prefetch`` only brings its native parts'
        remote records into the node-local cache, which a staged ring does
        itself (loaderx._prefetch): it is remote and its ``prefetch`` is the
        library's (not a subclass's own)."""
        return self._remote is not None and type(self).prefetch is Store.prefetch

    def prefetch_warm(self, indices) -> bool:
        """The stream protocol's ``prefetch_warm``: True when records
        `indices` of a remote store are all in the node-local cache and
        checked, kept there as ``prefetch`` keeps them, fetching nothing
        (one native call for many steps); False otherwise (and always for a
        local store), for a ``prefetch``."""
        if self._remote is None:
            return False
        idx, _ = self._indices(indices)
        h = self._h()  # held for the call
        try:
            return self._remote.pin_warm(idx)
        finally:
            del h

    def prefetch_size(self, indices) -> int:
        """The bytes `prefetch(indices)` brings into the cache, for a loader's
        ``prefetch_bytes`` budget: exact for a dense raw store and for records
        whose table entries are cached, the store's mean record otherwise."""
        idx, _ = normalize_indices(indices, len(self))
        remote = self._remote
        if remote is not None:
            return remote.nbytes(idx)
        st = self.stats()
        return int(round(len(idx) * st["live_bytes"] / max(1, st["records"])))

    def _remote_begin(self, idx: np.ndarray) -> int | None:
        """Before a native read of `idx`: a remote store makes them present
        and checked; returns the token for `_remote_end` (None when local)."""
        remote = self._remote
        if remote is None or not len(idx):
            return None
        return remote.begin(idx)

    def _remote_end(self, token: int | None) -> None:
        if token is not None:
            self._remote.end(token)

    def read_only(self):
        """Makes this handle refuse every mutation from now on (`ReadOnlyError`);
        returns it. Unpickled stores come back read-only."""
        self._readonly = True
        return self

    def keep_rows(self, owner: str):
        """Makes this handle refuse every change of its record count (append,
        delete; `ReadOnlyError`) from now on: `owner` says what its rows stay
        aligned with (a dataset opens its columns so). Returns it."""
        self._rows_owner = owner
        return self

    def _w(self, rows: bool = False):
        """The native handle for a mutation (`rows`: one that changes the
        record count); `ReadOnlyError` for a store reopened from a pickle (a
        read-only reference) or, for `rows`, one that keeps its rows."""
        if rows and self._rows_owner is not None:
            raise ReadOnlyError(f"{self._path}: this store is {self._rows_owner}; appending or "
                                "deleting through it would misalign it with the other columns "
                                "(write the dataset anew: loaderx.from_numpy, from_iterator or "
                                "convert)", path=self._path)
        if self._remote is not None:
            raise ReadOnlyError(f"{self._path}: a remote store is read-only; write a dataset "
                                "locally and upload it (loaderx.convert, from_numpy and "
                                "from_iterator take a URL destination)", path=self._path)
        if self._readonly:
            raise ReadOnlyError(f"{self._path}: this store was reopened from a pickle, read-only; "
                                "open it by path to write", path=self._path)
        return self._h()

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
    def format_version(self) -> int:
        """The on-disk format version the store is written in (``loaderx info`` shows it)."""
        return self._format_version

    @property
    def closed(self) -> bool:
        return self._handle is None

    @property
    def frame_size(self) -> int:
        """Bytes of one zstd frame of a long record (0: one frame per record).
        Records longer than this are stored seekable: a token window decodes
        only the frames it reads (see RaggedStore)."""
        return self._frame_size

    def __len__(self) -> int:
        h = self._h()
        if self._remote is not None:  # the version it opened: its length never changes
            return self._remote.rep.records
        n = ffi.new("uint64_t *")
        check(lib.lx_len(h, n), self._path)
        return int(n[0])

    def _indices(self, key) -> tuple[np.ndarray, bool]:
        return normalize_indices(key, len(self))

    @classmethod
    def open(cls, path):
        """The existing store at `path`, opened (`StoreNotFoundError` when
        there is none; nothing is created). ``Cls(path)`` is the same call.
        Its kind must be this class's (`IdentityError` otherwise;
        ``loaderx.open_store`` opens any kind)."""
        return cls(path)

    def gather(self, indices, out=None, *, packed: bool = False, threads: int = 0) -> Any:
        """The one read verb of every store kind: records `indices` (an int
        array, list, slice or bool mask; negatives wrap) in request order.

        * a `DenseStore`: one ``(B, *item_shape)`` array;
        * a `RaggedStore`: a list of arrays; a `Zrecord`: a list of bytes.

        ``packed=True`` gives ``(values, row_splits)`` instead: the records
        concatenated along their first axis (bytes: back to back, uint8) and
        int64 offsets of length B+1, record i being
        ``values[row_splits[i]:row_splits[i + 1]]`` (the form
        ``append_packed`` takes). ``out=`` is where the values go: the
        ``(B, *item_shape)`` array of a dense batch, or (with
        ``packed=True``) a buffer at least as large as a variable batch's
        values, whose filled front is returned. `threads` caps the native
        threads (0: every usable core). ``store[key]`` is ``gather(key)``,
        with one record (not a list) for an int key."""
        idx, _ = self._indices(indices)
        return self._batch(idx, out, packed, threads)

    def _batch(self, idx: np.ndarray, out: Any, packed: bool, threads: int = 0) -> Any:
        """A variable batch (bytes, ragged) of normalized indices `idx`: one
        native read on one snapshot, decoded by the readers' one function."""
        buf, raw, aux = self._gather_alloc(idx, check_threads(threads))
        return _records.variable_batch(self.kind, self.dtype, buf, raw, aux, idx, self._path,
                                       out, packed)

    def __getitem__(self, key: Any) -> Any:
        idx, scalar = self._indices(key)
        got = self._batch(idx, None, False)
        return got[0] if scalar else got

    def delete(self, key) -> np.ndarray:
        """Delete records (int, slice, index array or mask; duplicates allowed).

        The original swap-last rule: in descending index order, each deleted
        index receives the current last record, then the length drops by one
        (deleting {2, 3} from ten records leaves ``[0,1,8,9,4,5,6,7]``).
        Returns the moves as an ``(M, 2)`` uint64 array of ``(from, to)``
        rows, ascending by ``to``: the record that was at ``from`` is now at
        ``to``; every other survivor kept its index. Durable when it returns.
        """
        h = self._w(rows=True)
        idx, _ = self._indices(key)
        moves = np.zeros((len(idx), 2), dtype=U64)
        if len(idx):
            count = ffi.new("uint64_t *")
            check(lib.lx_delete(h, u64_ptr(idx), len(idx),
                                ffi.cast("lx_move_t *", u64_ptr(moves.reshape(-1))), count),
                  self._path, "delete")
            moves = moves[:count[0]]
        return moves

    def prefetch(self, indices, *, wait: bool = True) -> None:
        """Make the records at `indices` ready to read (the stream protocol's
        `prefetch`, loaderx.Stream: a DataLoader calls it with each step's
        indices a few steps ahead for a remote store; a local one says
        ``is_remote`` False and its ring reads it directly). A remote store
        fetches them into the node-local cache, checks them and keeps them
        there for the reads that follow (docs/remote.md). A local store brings them into memory: it
        reads only what the page cache misses, explicitly and all at once
        (one queue of reads of the records' exact byte ranges), and only once
        reads have found the store cold, or on a probe every 32nd call; on a
        store in memory it costs about what a call costs. ``wait=False`` (local
        stores) returns as soon as the reads are queued: a local record can be
        read at any time, and a read of it waits only for what is still in
        flight. Thread-safe and idempotent."""
        idx, _ = self._indices(indices)
        h = self._h()  # held for the call: keeps the handle's memory alive
        if len(idx):
            if self._remote is not None:
                self._remote.begin(idx, pin=True)
            else:
                _records.prefetch(self._parts, 1, idx, wait, self._path)
        del h

    def compact(self) -> None:
        """Reclaim the bytes of deleted records in place (durable when it
        returns; re-runnable if interrupted)."""
        check(lib.lx_compact(self._w()), self._path, "compact")

    def stats(self) -> dict:
        """``{records, live_bytes, chunk_bytes, reclaimable}``; O(1)."""
        st = ffi.new("lx_stats_t *")
        check(lib.lx_stats(self._h(), st), self._path)
        return {"records": int(st.records), "live_bytes": int(st.live_bytes),
                "chunk_bytes": int(st.chunk_bytes), "reclaimable": int(st.reclaimable)}

    @property
    def generation(self) -> int:
        """Bumped by every commit (append, delete, compact, sync): a cache
        derived from the records is stale once this differs."""
        st = ffi.new("lx_stats_t *")
        check(lib.lx_stats(self._h(), st), self._path)
        return int(st.generation)

    def sync(self) -> None:
        """Make every record appended through this handle survive a power loss."""
        check(lib.lx_sync(self._h()), self._path, "sync")

    def verify(self) -> None:
        """Check every record (checksum, location, decode); raises CorruptStoreError.
        A remote store fetches every record through its cache and checks
        each one's location and checksum."""
        if self._remote is not None:
            self._h()
            self._remote.verify_all()
            return
        bad = ffi.new("uint64_t *")
        check(lib.lx_verify(self._h(), bad), self._path, "verify")

    def dictionary(self) -> bytes | None:
        """The store's zstd dictionary (``zstd_dict`` stores), else None."""
        return self._blob("dictionary") or None

    def has_dict(self) -> bool:
        """Whether the store has a zstd dictionary (the original loaderx's
        spelling of ``dictionary() is not None``)."""
        return self.dictionary() is not None

    def __getitems__(self, indices) -> Any:
        """``gather(indices)``: a batch in one call. The original loaderx's
        batch-read protocol, and the one torch's DataLoader uses for a
        dataset that has it (``DataLoader(store, batch_sampler=...)``)."""
        return self.gather(indices)

    def close(self) -> None:
        """Sync and release the handle. Idempotent; safe from any thread, also
        while other threads are inside calls on this store. A handle that an
        earlier error left failed (`HandleFailedError`, already raised then)
        closes without raising again."""
        h = self._handle
        if h is None:
            return
        try:
            rc = lib.lx_sync(h)
        finally:
            self._handle = None
            lib.lx_close(h)
        if rc != _RC_FAILED:
            check(rc, self._path, "sync")

    def __enter__(self):
        self._h()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        # A reference, not the data: unpickling reopens the store by path,
        # read-only (torch workers, multiprocessing spawn, Lightning); a
        # remote store reopens the same version, with the same cache settings.
        if self._remote is not None:
            return (_reopen_remote, (type(self), self._remote))
        return (_reopen, (type(self), self._path))

    def _describe(self) -> str:
        return ""

    def __repr__(self) -> str:
        if self._handle is None:
            return f"{type(self).__name__}({self._path!r}, closed)"
        return (f"{type(self).__name__}({self._path!r}, len={len(self)}{self._describe()}, "
                f"codec={self._codec!r})")

    # -- native calls shared by the typed stores
    def _append_raw(self, ptrs: np.ndarray, sizes: np.ndarray, aux_ptrs=None, aux_sizes=None,
                    keep=None, *, stage: bool = False) -> int:
        first = ffi.new("uint64_t *")
        rc = lib.lx_append(
            self._w(rows=True), len(sizes),
            ffi.cast("const uint8_t *const *", ffi.from_buffer(ptrs)),
            u64_ptr(sizes),
            (ffi.cast("const uint8_t *const *", ffi.from_buffer(aux_ptrs))
             if aux_ptrs is not None else ffi.NULL),
            u64_ptr(aux_sizes) if aux_sizes is not None else ffi.NULL,
            1 if stage else 0,
            first)
        check(rc, self._path, "append")
        return int(first[0])

    @contextlib.contextmanager
    def one_append(self) -> Iterator[None]:
        """Makes every append in the block ONE atomic append: each is written
        but stays invisible until the block ends without an error, which
        publishes them all at once; an error (or Ctrl-C) drops them and leaves
        the store as it was. Appends from other threads wait until the block
        ends. The writers that take an iterable use it."""
        self._w(rows=True)
        with self._block_lock:
            if self._staging_all:
                raise LockedError(f"{self._path}: one_append inside another one_append of this "
                                  "store; one block is one transaction", path=self._path)
            self._staging_all, self._block_broken = True, None
            try:
                yield
            except BaseException:
                self._staging_all = False
                self._drop_staged()
                raise
            self._staging_all = False
            broken, self._block_broken = self._block_broken, None
            if broken is not None:
                self._drop_staged()
                raise LoaderxError(f"{self._path}: an append inside this one_append failed after "
                                   f"it began writing ({type(broken).__name__}: {broken}), which "
                                   "dropped the block's appends; nothing of the block was "
                                   "published", path=self._path) from broken
            check(lib.lx_publish(self._w(rows=True), 1), self._path, "append")

    def _drop_staged(self) -> None:
        """Drops the records staged through this handle (after an error)."""
        h = self._handle
        if h is not None:
            lib.lx_publish(h, 0)

    def _append_chunks(self, chunks) -> int:
        """Appends chunks `(ptrs, sizes, aux_ptrs, aux_sizes, keep_alive)` as ONE
        atomic append: every chunk but the last is staged (written, invisible),
        the last publishes them all; an error drops what was staged. One chunk
        is held in memory ahead of the one being written."""
        self._w(rows=True)
        if self._append_thread == threading.get_ident():
            # The records iterator of an append on this thread appends again:
            # it would wait for the lock its own caller holds, forever.
            raise LockedError(f"{self._path}: append called while producing the records of "
                              "another append to this store; append after that call returns",
                              path=self._path)
        with self._block_lock, self._append_lock:
            self._append_thread = threading.get_ident()
            first = None
            staged = wrote = False
            try:
                pending = None
                for chunk in chunks:
                    if pending is not None:
                        wrote = True
                        f = self._append_raw(*pending, stage=True)
                        staged = True
                        first = f if first is None else first
                    pending = chunk
                if pending is not None:  # (inside one_append: published by it)
                    wrote = True
                    f = self._append_raw(*pending, stage=self._staging_all)
                    first = f if first is None else first
                staged = False
            except BaseException as e:
                if self._staging_all and wrote:
                    self._block_broken = e
                raise
            finally:
                self._append_thread = None
                if staged:
                    self._drop_staged()
            return len(self) if first is None else first

    def _gather_alloc(self, idx: np.ndarray,
                      threads: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Records `idx` from ONE snapshot: ``(buffer, payload sizes, aux sizes)``;
        the buffer holds every payload back to back, then every aux part, in
        request order. The buffer is library memory, freed with the array."""
        h = self._h()  # held for the call: keeps the handle's memory alive
        token = self._remote_begin(idx) if self._remote is not None else None
        try:
            buf = _records.read_variable(self._parts, 1, idx, threads, self._path)
        finally:
            self._remote_end(token)
        del h
        return buf


def _dict_bytes(dict_bytes: Any, path: str) -> bytes:
    """`dict_bytes` as bytes (b"" for None): any bytes-like object, a numpy
    array included; never an int (``bytes(5)`` is five zero bytes) or a str."""
    if dict_bytes is None:
        return b""
    try:
        return memoryview(dict_bytes).tobytes()
    except TypeError:
        raise ArgumentTypeError(f"{path}: dict_bytes must be bytes-like (from train_dict), "
                                f"not {type(dict_bytes).__name__}", path=path) from None


def check_new_store(path: Any, codec: str | None, level: int | None, dict_bytes: Any) -> None:
    """The codec arguments of a store about to be created, checked before a
    writer's ``mode="overwrite"`` removes what is there (nothing stored is
    lost to a bad argument)."""
    p = os.fspath(path)
    _check_codec_args(p, True, codec, level, _dict_bytes(dict_bytes, p))


def _check_codec_args(path: str, create: bool, codec: str | None, level: int | None,
                      dict_bytes: bytes) -> None:
    if codec is not None and (not isinstance(codec, str) or codec not in _lib.CODECS):
        raise InvalidArgumentError(f"{path}: unknown codec {codec!r}; "
                                   f"choose one of {sorted(_lib.CODECS)}", path=path)
    check_level(level, path)
    if not create:
        return
    if codec == "zstd_dict" and not dict_bytes:
        raise DictionaryError(f"{path}: codec 'zstd_dict' needs dict_bytes "
                              "(train one with train_dict)", path=path)
    if codec != "zstd_dict" and dict_bytes:
        raise DictionaryError(f"{path}: dict_bytes given but codec is {codec!r}; "
                              "use codec='zstd_dict'", path=path)


def stored_kind(path) -> str:
    """The kind (``bytes``, ``dense`` or ``ragged``) of the store at `path`,
    from its checked identity."""
    probe = Store.__new__(Store)
    Store.__init__(probe, path, create=False, codec=None, level=None, dict_bytes=None, ident=None)
    try:
        return probe._identity.kind
    finally:
        probe.close()


def _reopen(cls, path):
    return cls(path).read_only()


def _remote_binding(path: str, create: bool):
    """The replica binding of a URL (None for a local path)."""
    if not _objstore.is_url(path):
        return None
    if create:
        raise ReadOnlyError(f"{path}: a remote store cannot be created in place; write it locally "
                            "and upload it (loaderx.from_numpy, from_iterator and convert take a "
                            "URL destination)", path=path)
    return _openers.remote(path).bind(path)


def _reopen_remote(cls, binding):
    """A pickled remote store: the same version, through the same cache."""
    with _openers.remote(binding.url).opening(binding):
        return cls(binding.url)
