"""Building and reopening stores: converters from NumPy data and iterables,
`open_store` by persisted identity, and `pad` for ragged batches."""
from __future__ import annotations

import mmap
import os
from typing import Iterable

import numpy as np

from ._store import Store, stored_kind
from .zrecord import DenseStore, RaggedStore, Zrecord

__all__ = ["from_numpy", "from_iterator", "open_store", "pad"]


def from_numpy(path, array, *, codec: str = "zstd", level: int | None = None,
               dict_bytes: bytes | None = None, chunk_bytes: int = 64 << 20,
               progress=None) -> DenseStore:
    """Stream `array` (rows are records; an ``np.load(..., mmap_mode="r")``
    array or a path to a ``.npy`` file) into a new DenseStore in chunks of about
    `chunk_bytes`, so memory stays bounded whatever the array's size. Returns
    the open store. `progress(done_rows, total_rows)` is called after each chunk.
    """
    if isinstance(array, (str, os.PathLike)):
        array = np.load(array, mmap_mode="r")
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy takes a numpy array or a .npy path, not {type(array).__name__}")
    if array.ndim == 0:
        raise ValueError("from_numpy needs an array with a record axis (ndim >= 1)")
    if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
    store = DenseStore(path, array.dtype, array.shape[1:], codec=codec, level=level, dict_bytes=dict_bytes)
    try:
        row_bytes = max(1, array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64)))
        step = max(1, chunk_bytes // row_bytes)
        n = array.shape[0]
        release = _page_releaser(array)
        for start in range(0, n, step):
            store.append(np.ascontiguousarray(array[start:start + step]))
            # A memory-mapped source keeps every page it touched mapped (and
            # counted in RSS) until unmapped; drop the chunk's pages once copied.
            release(start, min(start + step, n))
            if progress is not None:
                progress(min(start + step, n), n)
    except BaseException:
        store.close()
        raise
    return store


def _page_releaser(array: np.ndarray):
    """A function (start_row, stop_row) that unmaps the pages of those rows of a
    C-contiguous np.memmap source (MADV_DONTNEED: file-backed pages are simply
    re-read if touched again); a no-op for anything else."""
    mm = getattr(array, "_mmap", None)
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED") \
            or not array.flags.c_contiguous:
        return lambda start, stop: None
    base = np.frombuffer(mm, dtype=np.uint8).ctypes.data
    data = array.ctypes.data
    row_bytes = array.strides[0] if array.ndim and array.shape[0] > 1 else array.nbytes
    page = mmap.PAGESIZE

    def release(start: int, stop: int) -> None:
        lo = data - base + start * row_bytes
        hi = data - base + stop * row_bytes
        lo = (lo // page) * page
        hi = (hi // page) * page
        if hi > lo:
            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    return release


def from_iterator(path, iterable: Iterable, *, dtype=None, codec: str = "zstd", level: int | None = None,
                  dict_bytes: bytes | None = None) -> RaggedStore:
    """Build a RaggedStore from an iterable of arrays (one pass). With
    ``dtype=None`` the first record's dtype is used. Returns the open store."""
    it = iter(iterable)
    first = []
    if dtype is None:
        try:
            head = next(it)
        except StopIteration:
            raise ValueError("from_iterator needs a dtype when the iterable is empty") from None
        head = np.asarray(head) if not isinstance(head, (bytes, bytearray, memoryview)) else np.frombuffer(head, np.uint8)
        dtype = head.dtype
        first = [head]
    store = RaggedStore(path, dtype, codec=codec, level=level, dict_bytes=dict_bytes)
    try:
        store.append(_chain(first, it))
    except BaseException:
        store.close()
        raise
    return store


def _chain(head, rest):
    yield from head
    yield from rest


def open_store(path) -> Store:
    """Open an existing store as the class its persisted identity names
    (DenseStore, RaggedStore or Zrecord)."""
    kind = stored_kind(path)
    if kind == "dense":
        return DenseStore(path)
    if kind == "ragged":
        return RaggedStore(path)
    return Zrecord(path)


def pad(records, *, max_len: int | None = None, value=0) -> tuple[np.ndarray, np.ndarray]:
    """Pad a list of arrays along their first axis: returns ``(padded, lengths)``
    with ``padded`` of shape ``(B, max_len, *trailing)`` and int64 ``lengths``.
    All records must share dtype and trailing dimensions. A `max_len` smaller
    than the longest record is an error, never a silent truncation."""
    arrays = [np.asarray(r) for r in records]
    lengths = np.array([a.shape[0] if a.ndim else -1 for a in arrays], dtype=np.int64)
    if (lengths < 0).any():
        raise ValueError(f"record {int(np.flatnonzero(lengths < 0)[0])} is a scalar; pad needs a first axis")
    longest = int(lengths.max()) if len(arrays) else 0
    if max_len is None:
        max_len = longest
    elif not isinstance(max_len, (int, np.integer)) or max_len < 0:
        raise ValueError(f"max_len must be a non-negative int, got {max_len!r}")
    elif max_len < longest:
        i = int(np.argmax(lengths))
        raise ValueError(f"record {i} has length {longest}, longer than max_len={max_len}")
    if not arrays:
        return np.zeros((0, max_len)), lengths
    dtype, trailing = arrays[0].dtype, arrays[0].shape[1:]
    for i, a in enumerate(arrays):
        if a.dtype != dtype or a.shape[1:] != trailing:
            raise ValueError(f"record {i} has dtype {a.dtype} and trailing shape {a.shape[1:]}, "
                             f"record 0 has {dtype} and {trailing}")
    out = np.full((len(arrays), int(max_len)) + trailing, value, dtype=dtype)
    for i, a in enumerate(arrays):
        out[i, :a.shape[0]] = a
    return out, lengths

