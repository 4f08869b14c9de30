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

The index. The prefix sums of the document lengths (8 B per document) are
built once, at construction: O(documents), natively. They are cached in the
store's directory (``windows-<itemsize>[-<separator>].idx``) and memory-mapped
on later constructions, checked against the store's record count and commit
generation (any append or delete rebuilds it); where the directory is not
writable the index lives in memory only. A ShardSet's index is its shards'
indices put together (a copy: 8 B per document in memory).

A TokenWindows reads the documents it was built over. Documents appended
later are not in it; after a delete on its store (which moves the last
documents into the holes) every read raises ``SizeMismatchError``: build a
new one. Deletes followed by appends that bring a store back to at least its
old count are not detected.

A window gather is one native call: it binary-searches each window's first
document and copies only the documents the windows overlap, raw ones
straight from the store's mapping, compressed ones decoded once per call
even when two windows share one.
"""
from __future__ import annotations

import os
import struct
from typing import Any, List, Optional, Tuple

import numpy as np

from . import _buffers
from ._lib import check, ffi, lib
from ._records import parts_array
from ._store import check_threads, normalize_indices
from .errors import IdentityError, SizeMismatchError

__all__ = ["TokenWindows"]

_MAGIC = b"LXWIDX01"
_HEADER = struct.Struct("<8sQQQI4x")  # magic, generation, docs, separator, itemsize


class TokenWindows:
    """Token windows of `store` (see the module docs)."""

    kind = "dense"

    def __init__(self, store: Any, seq_len: int, *, separator: Optional[int] = None):
        if getattr(store, "kind", None) != "ragged" \
                or not callable(getattr(store, "__loaderx_parts__", None)):
            raise TypeError("TokenWindows reads a RaggedStore or a ShardSet of them, "
                            f"not {type(store).__name__}")
        dtype = np.dtype(store.dtype)
        if dtype.kind not in "iu" or dtype.itemsize not in (1, 2, 4, 8):
            raise IdentityError("token documents must hold integers of 1, 2, 4 or 8 bytes, "
                                f"not {dtype}")
        if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) \
                or not 1 <= seq_len < 2**63:
            raise ValueError(f"seq_len must be an int from 1 to 2**63 - 1, got {seq_len!r}")
        if separator is not None:
            info = np.iinfo(dtype)
            if isinstance(separator, bool) or not isinstance(separator, (int, np.integer)) \
                    or not info.min <= separator <= info.max:
                raise ValueError(f"separator must be a token id of {dtype}, got {separator!r}")
        if len(store) == 0:
            raise ValueError("TokenWindows needs at least one document")
        self._store = store
        self._dtype = dtype
        self._seq_len = int(seq_len)
        self._separator = None if separator is None else int(separator)
        self._part_list = store.__loaderx_parts__()
        self._parts = parts_array(self._part_list)
        self._prefix = _index_of(store, dtype.itemsize, self._separator)
        total = int(self._prefix[-1])
        self._len = (total - 1) // self._seq_len if total else 0
        sep = 0 if self._separator is None else self._separator & ((1 << (8 * dtype.itemsize)) - 1)
        self._spec = ffi.new("lx_windows_t *", {
            "prefix": ffi.cast("uint64_t *", self._prefix.ctypes.data),
            "docs": len(self._prefix) - 1, "seq_len": self._seq_len, "separator": sep,
            "has_separator": self._separator is not None, "itemsize": dtype.itemsize})
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
        scalar = isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_))
        got = self.gather([key] if scalar else key)
        return got[0] if scalar else got

    def __loaderx_windows__(self) -> Tuple[List[Tuple[Any, int]], Any]:
        """The protocol by which the DataLoader reads windows natively:
        (document parts, the lx_windows_t of this corpus)."""
        return list(self._part_list), self._spec

    def __reduce__(self):
        # A reference: the store (itself a reference) and the parameters.
        return (_rebuild, (self._store, self._seq_len, self._separator))

    def __repr__(self) -> str:
        sep = f", separator={self._separator}" if self._separator is not None else ""
        return f"TokenWindows({self._store!r}, seq_len={self._seq_len}{sep}, len={self._len})"


def _rebuild(store: Any, seq_len: int, separator: Optional[int]) -> "TokenWindows":
    return TokenWindows(store, seq_len, separator=separator)


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
        scalar = isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_))
        got = self.gather([key] if scalar else key)
        return got[0] if scalar else got

    def __loaderx_windows__(self):
        return self._windows.__loaderx_windows__()

    def __reduce__(self):
        return (_segments_of, (self._windows,))


def _segments_of(windows: TokenWindows) -> TokenSegments:
    return windows.segments


def _out(out: Optional[np.ndarray], shape: tuple, dtype: np.dtype) -> np.ndarray:
    if out is None:
        return _buffers.empty(shape, dtype)
    if not isinstance(out, np.ndarray) or out.dtype != dtype or out.shape != shape:
        raise SizeMismatchError(f"out must be a {dtype} array of shape {shape}, got "
                                f"{getattr(out, 'dtype', type(out).__name__)}"
                                f"{getattr(out, 'shape', '')}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise SizeMismatchError("out must be C-contiguous and writable")
    return out


# ----------------------------------------------------------------- the index

def _index_of(store: Any, itemsize: int, separator: Optional[int]) -> np.ndarray:
    """The prefix sums of `store`'s documents (a ShardSet's: its shards' put
    together, a separator between shards too)."""
    shards = getattr(store, "shards", None)
    if shards is None:
        return _store_index(store, itemsize, separator)
    pieces, offset = [], 0
    nonempty = [s for s in shards if len(s)]
    for k, shard in enumerate(nonempty):
        p = _store_index(shard, itemsize, separator)
        pieces.append(p[:-1] + offset)
        offset += int(p[-1]) + (1 if separator is not None and k + 1 < len(nonempty) else 0)
    pieces.append(np.array([offset], np.uint64))
    return np.ascontiguousarray(np.concatenate(pieces), dtype=np.uint64)


def _store_index(store: Any, itemsize: int, separator: Optional[int]) -> np.ndarray:
    docs = len(store)
    generation = store.generation
    sep = separator if separator is not None else -1
    if getattr(store, "is_remote", False):
        store._remote.all_index()  # every document's size; the cache goes in the replica
    cache = os.path.join(getattr(store, "_native_path", store.path), f"windows-{itemsize}"
                         + (f"-{sep}" if separator is not None else "") + ".idx")
    cached = _load_cache(cache, generation, docs, sep, itemsize)
    if cached is not None:
        return cached
    prefix = np.empty(docs + 1, np.uint64)
    handles = store.__loaderx_parts__()
    parts = parts_array(handles)
    check(lib.lx_windows_index(parts, len(handles), itemsize, separator is not None,
                               ffi.cast("uint64_t *", prefix.ctypes.data), docs),
          store.path, "token window index")
    _save_cache(cache, prefix, generation, docs, sep, itemsize)
    return prefix


def _load_cache(path: str, generation: int, docs: int, sep: int,
                itemsize: int) -> Optional[np.ndarray]:
    try:
        with open(path, "rb") as f:
            header = f.read(_HEADER.size)
        if len(header) != _HEADER.size:
            return None
        magic, gen, n, s, size = _HEADER.unpack(header)
        if magic != _MAGIC or gen != generation or n != docs or s != sep & (2**64 - 1) \
                or size != itemsize:
            return None
        prefix = np.memmap(path, dtype=np.uint64, mode="r", offset=_HEADER.size, shape=(docs + 1,))
    except (OSError, ValueError):
        return None
    return prefix


def _save_cache(path: str, prefix: np.ndarray, generation: int, docs: int, sep: int,
                itemsize: int) -> None:
    """Best effort: a store directory that is not writable keeps no cache."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(_HEADER.pack(_MAGIC, generation, docs, sep & (2**64 - 1), itemsize))
            f.write(prefix.tobytes())
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
