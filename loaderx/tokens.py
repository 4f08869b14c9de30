"""`TokenWindows`: fixed-length token windows over a corpus of documents —
the batches of LLM pretraining, read natively at memcpy speed.

``TokenWindows(RaggedStore("web/tokens"), seq_len=2048)`` (or a ``ShardSet``
of 1-D token stores): the token stream is every document concatenated in
store (shard) order, with an optional ``separator`` token id inserted between
two documents (the usual end-of-text token). Window ``i`` covers tokens
``[i * seq_len, i * seq_len + seq_len + 1)`` — the inputs and the targets
shifted by one — crossing document boundaries; ``len(tw) == (total_tokens -
1) // seq_len``. ``tw[idx]`` and ``tw.gather(idx, out=buf)`` give
``(len(idx), seq_len + 1)`` arrays of the store's dtype; ``tw.segments`` is a
stream of the same shape (int32) holding each token's document ordinal
inside its window (0 for the first document it touches; a separator belongs
to the document it ends), for block-diagonal attention masks or position ids
that restart per document.

Both are streams for ``DataLoader`` (built by its native threads, no Python
thread) and for ``Mixture`` (the standard pretraining mix of sources), with
any sampler mode and sharding.

A raw ``DenseStore`` of token ids (how a 1-D token array converts) is one
document, read natively; a ShardSet of them is one document per shard.
``TokenWindows.from_array(np.memmap("train.bin", ...), seq_len)`` reads a
flat token array as it is (NumPy, a Python stream for the DataLoader).

Bounded decode. A window decodes only the tokens it returns: a token store
(a RaggedStore of integers, by default) keeps documents longer than 4 KiB as
independent zstd frames with a seek table, and a window decodes the one or
two frames its tokens lie in; raw documents are copied from the mapping.

The index. The prefix sums of the document lengths (8 B per document, in
memory) are built at construction, natively: from the store's
``windows.idx`` (format.zig) where it is valid, copied in and checked (its
checksum, its binding to this store and its durable records, spot checks
against the record table; never memory-mapped, so a file changed under a
reader cannot crash it), and from the record table for the documents it does
not cover, O(those documents). The file is rewritten (temporary file, fsync,
rename, directory fsync) when more documents are durable than it covers, and
a delete removes it before changing anything, so it never describes records
the store no longer holds; ``verify()`` checks every entry. A directory that
is not writable keeps the index in memory only. A ShardSet's index is its
shards' put together (a copy).

A TokenWindows reads the documents it was built over. Documents appended
later are not in it; after a delete on any of its stores (which moves the
last documents into the holes) every read raises ``SizeMismatchError``,
appends that bring the store back to its old length included: build a new
one.

A window gather is one native call: it binary-searches each window's first
document and copies only the documents the windows overlap, raw ones
straight from the store's mapping, compressed ones decoded a frame at a
time, each lane keeping its last decoded frames for the next window.
"""
from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple

import numpy as np

from . import _buffers
from ._checks import check_out, is_int
from ._lib import check, ffi, lib
from ._records import parts_array
from ._store import check_threads, normalize_indices
from ._subset_windows import SubsetWindows
from ._token_index import index_of
from .errors import IdentityError, SizeMismatchError

__all__ = ["TokenWindows", "ArrayTokenWindows"]

class TokenWindows:
    """Token windows of `store` (see the module docs)."""

    kind = "dense"

    def __new__(cls, store: Any, seq_len: int, *, separator: Optional[int] = None):
        if getattr(store, "selection", None) is not None and cls is TokenWindows:
            # Documents a `loaderx.select` view selects: windows over those alone.
            return SubsetWindows(store, seq_len, separator=separator)
        return super().__new__(cls)

    def __init__(self, store: Any, seq_len: int, *, separator: Optional[int] = None):
        if isinstance(store, np.ndarray):
            raise TypeError("TokenWindows reads stores; for a NumPy array (a memmap of a flat "
                            "token file) use TokenWindows.from_array(array, seq_len)")
        if isinstance(store, (str, os.PathLike)):
            raise TypeError(f"TokenWindows reads an open store, not the path "
                            f"{os.fspath(store)!r}: open it first with loaderx.open_store(path) "
                            "(local paths and URLs alike)")
        if getattr(store, "valid", None) is not None and getattr(store, "kind", None) == "ragged":
            name = store.name
            raise TypeError(f"column {name!r} has nulls (its mask {name}.valid), and a null is "
                            "no document: TokenWindows reads documents natively, with no mask; "
                            f"convert it with fill_null={{{name!r}: []}} (a null becomes an "
                            "empty document, which gives no tokens)")
        kind = getattr(store, "kind", None)
        shape = getattr(store, "item_shape", None)
        flat = kind == "dense" and shape is not None and tuple(shape) == ()
        if (kind != "ragged" and not flat) \
                or not callable(getattr(store, "native_parts", None)):
            raise TypeError("TokenWindows reads a RaggedStore of token documents, a DenseStore "
                            "of token ids (one document), or a ShardSet of either, not "
                            f"{type(store).__name__}; for a NumPy array use "
                            "TokenWindows.from_array")
        dtype = np.dtype(store.dtype)
        if dtype.kind not in "iu" or dtype.itemsize not in (1, 2, 4, 8):
            raise IdentityError("token documents must hold integers of 1, 2, 4 or 8 bytes, "
                                f"not {dtype}")
        seq_len = _check_seq_len(seq_len)
        if separator is not None:
            info = np.iinfo(dtype)
            if not is_int(separator) \
                    or not info.min <= separator <= info.max:
                raise ValueError(f"separator must be a token id of {dtype}, got {separator!r}")
        if len(store) == 0:
            raise ValueError("TokenWindows needs at least one document")
        self._store = store
        self._dtype = dtype
        self._seq_len = int(seq_len)
        self._separator = None if separator is None else int(separator)
        # A store of token ids is one document, and its part starts at that
        # document's number (lx_windows_index); documents are records otherwise.
        self._part_list = _flat_parts(store) if flat else _document_parts(store)
        self._parts = parts_array(self._part_list)
        # Read before the index: a delete from now on fails every read.
        epoch = ffi.new("uint64_t *")
        check(lib.lx_windows_epoch(self._parts, len(self._part_list), epoch), self.path,
              "token windows")
        self._prefix = index_of(store, dtype.itemsize, self._separator)
        total = int(self._prefix[-1])
        self._len = (total - 1) // self._seq_len if total else 0
        sep = 0 if self._separator is None else self._separator & ((1 << (8 * dtype.itemsize)) - 1)
        self._spec = ffi.new("lx_windows_t *", {
            "prefix": ffi.cast("uint64_t *", self._prefix.ctypes.data),
            "docs": len(self._prefix) - 1, "seq_len": self._seq_len, "separator": sep,
            "has_separator": self._separator is not None, "itemsize": dtype.itemsize,
            "epoch": epoch[0]})
        self.segments = TokenSegments(self)

    # -- identity
    @property
    def store(self) -> Any:
        return self._store

    @property
    def seq_len(self) -> int:
        return self._seq_len

    @property
    def separator(self) -> Optional[int]:
        return self._separator

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def item_shape(self) -> Tuple[int]:
        return (self._seq_len + 1,)

    @property
    def path(self) -> Optional[str]:
        return getattr(self._store, "path", None)

    @property
    def total_tokens(self) -> int:
        """Tokens in the stream, separators included."""
        return int(self._prefix[-1])

    def __len__(self) -> int:
        return self._len

    @property
    def is_remote(self) -> bool:
        """Whether the documents are read from object storage."""
        return bool(getattr(self._store, "is_remote", False))

    def _documents(self, idx: np.ndarray) -> np.ndarray:
        """The documents windows `idx` overlap (a remote corpus fetches them)."""
        first = idx.astype(np.uint64) * np.uint64(self._seq_len)
        last = first + np.uint64(self._seq_len)
        lo = np.searchsorted(self._prefix, first, side="right").astype(np.int64) - 1
        hi = np.searchsorted(self._prefix, last, side="right").astype(np.int64) - 1
        docs = len(self._prefix) - 2
        lo, hi = np.clip(lo, 0, docs), np.clip(hi, 0, docs)
        lengths = hi - lo + 1
        starts = np.repeat(lo - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
        return np.unique(starts + np.arange(int(lengths.sum()), dtype=np.int64))

    def prefetch_warm(self, indices) -> bool:
        """The stream protocol's ``prefetch_warm``: the documents windows
        `indices` overlap are all cached (and kept), fetching nothing; False
        for a local corpus."""
        if not self.is_remote:
            return False
        idx = normalize_indices(indices, self._len)[0]
        return bool(self._store.prefetch_warm(self._documents(idx)))

    def prefetch(self, indices) -> None:
        """Makes windows `indices` ready to read (the stream protocol's
        prefetch): a remote corpus fetches the documents they overlap into
        the node-local cache. A no-op for a local one."""
        if self.is_remote:
            idx = normalize_indices(indices, self._len)[0]
            self._store.prefetch(self._documents(idx))

    # -- reads
    def gather(self, indices, out: Optional[np.ndarray] = None, *, threads: int = 0) -> np.ndarray:
        """Windows `indices` as a ``(len(indices), seq_len + 1)`` array,
        written into `out` when given."""
        idx = normalize_indices(indices, self._len)[0]
        shape = (len(idx), self._seq_len + 1)
        out = _out(out, shape, self._dtype)
        self._gather(idx, out, None, threads)
        return out

    def _gather(self, idx: np.ndarray, tokens: Optional[np.ndarray], segments: Optional[np.ndarray],
                threads: int) -> None:
        threads = check_threads(threads)
        if len(idx) == 0:
            return
        handles = [h for h, _ in self._part_list]  # held for the call
        tok = ffi.cast("uint8_t *", tokens.ctypes.data) if tokens is not None else ffi.NULL
        seg = ffi.cast("int32_t *", segments.ctypes.data) if segments is not None else ffi.NULL
        remote = self._store._remote_begin(self._documents(idx)) if self.is_remote else None
        try:
            check(lib.lx_windows_gather(self._spec, self._parts, len(self._part_list),
                                        ffi.cast("uint64_t *", idx.ctypes.data), len(idx), tok,
                                        seg, threads),
                  self.path, "token windows")
        finally:
            if remote is not None:
                self._store._remote_end(remote)
        del handles

    def __getitem__(self, key):
        scalar = is_int(key)
        got = self.gather([key] if scalar else key)
        return got[0] if scalar else got

    def native_windows(self) -> Tuple[List[Any], Any, bool]:
        """The stream protocol (``loaderx.streams``): (document parts, the
        lx_windows_t of this corpus, False: tokens, not segments)."""
        return list(self._part_list), self._spec, False

    def __reduce__(self):
        # A reference: the store (itself a reference) and the parameters.
        return (_rebuild, (self._store, self._seq_len, self._separator))

    @staticmethod
    def from_array(tokens: np.ndarray, seq_len: int) -> "ArrayTokenWindows":
        """Windows of one flat token array (an in-memory array, or the
        ``np.memmap`` of a ``.bin``/``.npy`` token file as nanoGPT writes it):
        the whole array is one document; window ``i`` is
        ``tokens[i * seq_len : i * seq_len + seq_len + 1]``. Read with NumPy
        (one fancy index a batch); a DataLoader reads it as a Python stream.
        For the native path, store the tokens once (``DenseStore(path, dtype,
        codec="raw")`` holds them as they are) and pass that store."""
        return ArrayTokenWindows(tokens, seq_len)

    def __repr__(self) -> str:
        sep = f", separator={self._separator}" if self._separator is not None else ""
        return f"TokenWindows({self._store!r}, seq_len={self._seq_len}{sep}, len={self._len})"


def _rebuild(store: Any, seq_len: int, separator: Optional[int]) -> "TokenWindows":
    return TokenWindows(store, seq_len, separator=separator)


def _document_parts(store: Any) -> List[Tuple[Any, int]]:
    """A store's (or ShardSet's) documents as ``(handle, first)`` parts."""
    return [(part.handle, part.first) for part in store.native_parts()]


def _flat_parts(store: Any) -> List[Tuple[Any, int]]:
    shards = getattr(store, "shards", None)
    stores = [store] if shards is None else [s for s in shards if len(s)]
    for s in stores:
        if s.codec != "raw":
            raise ValueError(f"{s.path}: a DenseStore of token ids is read as one document "
                             f"when it is raw (its tokens back to back); this one is {s.codec}. "
                             "Store the tokens with codec='raw' (nothing to gain from "
                             "compressing single tokens one by one)")
    return [(s._h(), k) for k, s in enumerate(stores)]


def _check_seq_len(seq_len: Any) -> int:
    if not is_int(seq_len) or not 1 <= seq_len < 2**62:
        raise ValueError(f"seq_len must be an int from 1 to 2**62 - 1, got {seq_len!r}")
    return int(seq_len)


class ArrayTokenWindows:
    """`TokenWindows.from_array`: the windows of one 1-D token array."""

    kind = "dense"

    def __init__(self, tokens: np.ndarray, seq_len: int):
        if not isinstance(tokens, np.ndarray) or tokens.ndim != 1:
            raise TypeError("from_array takes a 1-D NumPy array of token ids, got "
                            f"{getattr(tokens, 'shape', type(tokens).__name__)}")
        if tokens.dtype.kind not in "iu":
            raise IdentityError(f"tokens must be integers, not {tokens.dtype}")
        self._tokens = tokens
        self._seq_len = _check_seq_len(seq_len)
        self._len = max(0, (len(tokens) - 1) // self._seq_len)
        # Window i as row i of a strided view: one fancy index reads a batch.
        step = tokens.strides[0]
        self._rows = np.lib.stride_tricks.as_strided(
            tokens, shape=(self._len, self._seq_len + 1),
            strides=(step * self._seq_len, step), writeable=False)
        self.segments = _ArraySegments(self)

    @property
    def dtype(self) -> np.dtype:
        return self._tokens.dtype

    @property
    def seq_len(self) -> int:
        return self._seq_len

    @property
    def separator(self) -> None:
        return None

    @property
    def item_shape(self) -> Tuple[int]:
        return (self._seq_len + 1,)

    @property
    def total_tokens(self) -> int:
        return len(self._tokens)

    def __len__(self) -> int:
        return self._len

    def gather(self, indices, out: Optional[np.ndarray] = None, *, threads: int = 0) -> np.ndarray:
        """Windows `indices` as a ``(len(indices), seq_len + 1)`` array,
        written into `out` when given."""
        check_threads(threads)
        idx = normalize_indices(indices, self._len)[0]
        out = _out(out, (len(idx), self._seq_len + 1), self.dtype)
        np.take(self._rows, idx.astype(np.intp, copy=False), axis=0, out=out)
        return out

    def __getitem__(self, key):
        scalar = is_int(key)
        got = self.gather([key] if scalar else key)
        return got[0] if scalar else got

    def __reduce__(self):
        # A memmap pickles as a reference to its file; any other array by value.
        t = self._tokens
        where = _file_offset(t)
        if where is not None:
            return (_array_windows_from_file,
                    (where[0], t.dtype.str, where[1], len(t), self._seq_len))
        return (ArrayTokenWindows, (np.ascontiguousarray(t), self._seq_len))

    def __repr__(self) -> str:
        return (f"TokenWindows.from_array({len(self._tokens)} tokens of {self.dtype}, "
                f"seq_len={self._seq_len}, len={self._len})")


def _file_offset(t: np.ndarray) -> Optional[Tuple[str, int]]:
    """(file, byte offset of t[0]) of a contiguous memmap, else None."""
    mm = getattr(t, "_mmap", None)
    if not isinstance(t, np.memmap) or t.filename is None or mm is None \
            or not t.flags.c_contiguous:
        return None
    import mmap

    mapped_from = t.offset - t.offset % mmap.ALLOCATIONGRANULARITY
    return t.filename, mapped_from + (t.ctypes.data - np.frombuffer(mm, np.uint8).ctypes.data)


def _array_windows_from_file(filename: str, dtype: str, offset: int, count: int,
                             seq_len: int) -> ArrayTokenWindows:
    tokens = np.memmap(filename, dtype=np.dtype(dtype), mode="r", offset=offset, shape=(count,))
    return ArrayTokenWindows(tokens, seq_len)


class _ArraySegments:
    """The segments of `from_array` windows: one document, all zeros."""

    kind = "dense"
    dtype = np.dtype(np.int32)

    def __init__(self, windows: ArrayTokenWindows):
        self._windows = windows

    @property
    def item_shape(self) -> Tuple[int]:
        return self._windows.item_shape

    def __len__(self) -> int:
        return len(self._windows)

    def gather(self, indices, out: Optional[np.ndarray] = None, *, threads: int = 0) -> np.ndarray:
        check_threads(threads)
        idx = normalize_indices(indices, len(self._windows))[0]
        out = _out(out, (len(idx), self._windows.seq_len + 1), self.dtype)
        out.fill(0)
        return out

    def __getitem__(self, key):
        scalar = is_int(key)
        got = self.gather([key] if scalar else key)
        return got[0] if scalar else got


class TokenSegments:
    """The document ordinals of a `TokenWindows`' windows, as a stream:
    int32 ``(len(idx), seq_len + 1)``."""

    kind = "dense"
    dtype = np.dtype(np.int32)

    def __init__(self, windows: TokenWindows):
        self._windows = windows

    @property
    def item_shape(self) -> Tuple[int]:
        return self._windows.item_shape

    @property
    def path(self) -> Optional[str]:
        return self._windows.path

    @property
    def is_remote(self) -> bool:
        return self._windows.is_remote

    def prefetch_warm(self, indices) -> bool:
        return self._windows.prefetch_warm(indices)

    def prefetch(self, indices) -> None:
        self._windows.prefetch(indices)

    def __len__(self) -> int:
        return len(self._windows)

    def gather(self, indices, out: Optional[np.ndarray] = None, *, threads: int = 0) -> np.ndarray:
        idx = normalize_indices(indices, len(self._windows))[0]
        out = _out(out, (len(idx), self._windows.seq_len + 1), self.dtype)
        self._windows._gather(idx, None, out, threads)
        return out

    def __getitem__(self, key):
        scalar = is_int(key)
        got = self.gather([key] if scalar else key)
        return got[0] if scalar else got

    def native_windows(self) -> Tuple[List[Any], Any, bool]:
        """The stream protocol: the windows' parts and index, True: segments."""
        return list(self._windows._part_list), self._windows._spec, True

    def __reduce__(self):
        return (_segments_of, (self._windows,))


def _segments_of(windows: TokenWindows) -> TokenSegments:
    return windows.segments


def _out(out: Optional[np.ndarray], shape: tuple, dtype: np.dtype) -> np.ndarray:
    """`out` checked as a DenseStore checks it, or a new pooled array."""
    if out is None:
        return _buffers.empty(shape, dtype)
    return check_out(out, shape, dtype, holds="the windows hold")
