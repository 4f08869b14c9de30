"""`Zrecord`: the raw byte-record store (pre-encoded images, opaque payloads)."""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from . import identity
from ._records import byte_view, writable_bytes
from ._writer import prepare_store
from ._store import (U64, Store, check_new_store, chunks_of, deprecated, packed_chunks, pointers,
                     row_splits)
from .errors import IdentityError, SizeMismatchError


def _bytes_records(records: Iterable) -> Iterator[np.ndarray]:
    if isinstance(records, (bytes, bytearray, memoryview, str)):
        raise TypeError(f"append takes an iterable of records, not one {type(records).__name__} "
                        "(iterating it gives single characters or ints); wrap it in a list")
    for i, r in enumerate(records):
        if isinstance(r, np.ndarray):
            if r.dtype.hasobject:
                raise TypeError(f"record {i} is an array of Python objects ({r.dtype}), "
                                "not bytes")
            if not r.flags.c_contiguous:
                r = np.ascontiguousarray(r)
            yield r.reshape(-1).view(np.uint8) if r.nbytes else np.zeros(0, np.uint8)
            continue
        try:
            yield _flat_bytes(r)
        except TypeError:
            raise TypeError(f"record {i} is a {type(r).__name__}, "
                            "not a bytes-like object") from None


def _flat_bytes(obj) -> np.ndarray:
    """The bytes of a bytes-like object (copied when it is not contiguous) as
    a uint8 array; TypeError when it is not bytes-like."""
    mv = memoryview(obj)
    return byte_view(mv if mv.c_contiguous else memoryview(mv.tobytes()))


class Zrecord(Store):
    """Raw byte records (pre-encoded images, opaque payloads).

    ``Zrecord.create(path, mode=...)`` makes a store, ``Zrecord.open(path)``
    opens one (a missing store raises `FileNotFoundError` and nothing is
    created). ``Zrecord(path)`` is ``open(path)``; ``Zrecord(path,
    create=True)`` is ``create(path, mode="append")``: it makes the store if
    the path holds none and opens it if it does. Records in: any bytes-like;
    out: ``bytes`` (``z[i]``) or a list of bytes (``z[list]``, slices).
    `codec` (default ``"zstd"`` when creating) and `level`, when given for an
    existing store, must match it (`IdentityError` otherwise).
    """

    kind = "bytes"
    dtype = np.dtype(np.uint8)
    item_shape = None

    @classmethod
    def create(cls, path, *, codec: str | None = None, level: int | None = None,
               dict_bytes: bytes | None = None, mode: str = "create") -> "Zrecord":
        """A new byte store at `path`; `mode`, `codec`, `level` and
        `dict_bytes` as for `DenseStore.create`. ``Zrecord(path,
        create=True)`` is ``create(path, mode="append")``."""
        check_new_store(path, codec, level, dict_bytes)
        prepare_store(path, mode)
        return cls(path, create=True, codec=codec, level=level, dict_bytes=dict_bytes)

    def __init__(self, path, *, create: bool = False, codec: str | None = None,
                 level: int | None = None, dict_bytes: bytes | None = None):
        super().__init__(path, create=create, codec=codec, level=level, dict_bytes=dict_bytes,
                         ident=identity.encode("bytes"))
        kind = self._identity.kind
        if kind != "bytes":
            self.close()
            other = "DenseStore" if kind == "dense" else "RaggedStore"
            raise IdentityError(f"{self._path}: store holds {kind} records; open it with {other} "
                                "or loaderx.dataset.open_store", path=self._path)

    def append(self, records: Iterable) -> int:
        """Append bytes-like records; returns the index of the first one."""
        self._w(rows=True)

        def chunks():
            for chunk in chunks_of(_bytes_records(records)):
                ptrs, sizes, keep = pointers(chunk)
                yield ptrs, sizes, None, None, keep
        return self._append_chunks(chunks())

    def append_packed(self, data, offsets) -> int:
        """Append records given packed: record i is bytes
        ``data[offsets[i]:offsets[i + 1]]`` (Arrow's binary and string layout,
        with ``offsets[0] == 0``). One native append with no Python object per
        record. Returns the index of the first record."""
        self._w(rows=True)
        if isinstance(data, np.ndarray) and data.dtype.hasobject:
            raise TypeError(f"data is an array of Python objects ({data.dtype}), not bytes")
        try:
            flat = _flat_bytes(data) if not isinstance(data, np.ndarray) \
                else data.reshape(-1).view(np.uint8)
        except TypeError:
            raise TypeError(f"data is a {type(data).__name__}, not a bytes-like object") from None
        flat = np.ascontiguousarray(flat)
        splits = row_splits(offsets, len(flat), "offsets")
        return self._append_chunks(packed_chunks(flat, splits[:-1], np.diff(splits)))

    def gather_into(self, indices, out, offsets=None) -> np.ndarray:
        """Deprecated: ``gather(indices, out=buffer, packed=True)`` reads the
        records back to back into `out` and returns ``(values, row_splits)``.
        Reads records into the caller's writable, C-contiguous buffer `out`
        back to back, or each at byte ``offsets[i]`` (non-negative integers).
        Returns the records' sizes (uint64), from the same snapshot as the
        bytes."""
        deprecated("Zrecord.gather_into(indices, out)",
                   "gather(indices, out=out, packed=True), which returns (values, row_splits)")
        if offsets is None:
            _, splits = self.gather(indices, out=out, packed=True)
            return np.diff(splits).astype(U64)
        dest = writable_bytes(out)
        idx, _ = self._indices(indices)
        values, splits = self.gather(idx, packed=True)
        sizes = np.diff(splits).astype(U64)
        starts = _checked_offsets(offsets, len(sizes))
        room = U64(dest.nbytes)
        # (room - start, not start + size: that wraps past 2**64 for a huge offset)
        too_big = (starts > room) | (sizes > room - np.minimum(starts, room))
        if too_big.any():
            i = int(np.argmax(too_big))
            raise SizeMismatchError(f"{self._path}: record {int(idx[i])} ({int(sizes[i])} bytes "
                                    f"at offset {int(starts[i])}) does not fit the "
                                    f"{dest.nbytes}-byte buffer", path=self._path)
        for a, s, n in zip(starts.tolist(), splits[:-1].tolist(), sizes.tolist()):
            dest[a:a + n] = values[s:s + n]
        return sizes


def _checked_offsets(offsets, n: int) -> np.ndarray:
    arr = np.asarray(offsets)
    if arr.shape != (n,):
        raise ValueError(f"offsets has shape {arr.shape}, expected ({n},)")
    if n and arr.dtype.kind not in "iu":
        raise TypeError(f"offsets must be integers, not {arr.dtype}")
    if n and arr.dtype.kind == "i" and int(arr.min()) < 0:
        raise ValueError(f"offsets must be non-negative, got {int(arr.min())}")
    return arr.astype(U64)
