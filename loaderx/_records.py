"""Native reads of an index space (one store, a ShardSet's shards) and the
decoding of variable-size batches, shared by every reader: the stores, the
ShardSet and the DataLoader.

An index space is an ``lx_part_t`` array: part k holds the records from its
``first`` index on. A dense read decodes straight into the caller's array
(``gather_into``). A variable-size read (ragged records, bytes) is one native
call on one snapshot that returns one library-owned buffer — every payload
back to back, then every record's aux bytes — with each record's sizes
(``read_variable``); the functions below turn that into bytes, arrays of
their own shapes, or packed ``(values, row_splits)`` without copying the
payload.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import _buffers, identity
from ._lib import check, ffi, lib
from .errors import CorruptStoreError, IdentityError, SizeMismatchError

_U64 = np.uint64
_T_U64 = ffi.typeof("uint64_t[]")
_T_U8 = ffi.typeof("uint8_t[]")
_EMPTY = np.zeros(1, dtype=_U64)


def parts_array(parts: list[tuple[Any, int]]):
    """An ``lx_part_t[]`` for ``[(handle, first), ...]`` (the caller keeps the
    handles alive as long as the array is used)."""
    arr = ffi.new("lx_part_t[]", len(parts))
    for k, (handle, first) in enumerate(parts):
        arr[k].store = handle
        arr[k].first = first
    return arr


def gather_into(parts, count: int, idx: np.ndarray, out: np.ndarray, stride: int, threads: int,
                path: str | None) -> int:
    """Reads records `idx` (uint64) into C-contiguous `out`, `stride` bytes
    each. Returns the native result (the caller checks it)."""
    dest = ffi.from_buffer(_T_U8, out if out.nbytes else _EMPTY, require_writable=True)
    return lib.lx_gather(parts, count, ffi.from_buffer(_T_U64, idx), len(idx), dest, out.nbytes,
                         stride, ffi.NULL, 0, threads)


def prefetch(parts, count: int, idx: np.ndarray, wait: bool, path: str | None) -> None:
    """Brings records `idx` (uint64) of the index space into memory ahead of a
    read (lx_prefetch); with ``wait=False`` returns once the reads are queued."""
    check(lib.lx_prefetch(parts, count, ffi.from_buffer(_T_U64, idx), len(idx), 0 if wait else 2),
          path, "prefetch")


def read_variable(parts, count: int, idx: np.ndarray, threads: int,
                  path: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Records `idx` from ONE snapshot: ``(buffer, payload sizes, aux sizes)``."""
    n = len(idx)
    raw = np.empty(n, dtype=_U64)
    aux = np.empty(n, dtype=_U64)
    if n == 0:
        return np.zeros(0, np.uint8), raw, aux
    # The buffer lands in an owner made before the call: however the caller
    # is interrupted afterwards, it is freed exactly once.
    out = _buffers.owner()
    length = ffi.new("uint64_t *")
    check(lib.lx_gather_alloc(parts, count, ffi.from_buffer(_T_U64, idx), n, threads,
                              ffi.from_buffer(_T_U64, raw), ffi.from_buffer(_T_U64, aux), out,
                              length),
          path, "gather")
    return _buffers.view(out, length[0]), raw, aux


# ----------------------------------------------------------------- decoding

def to_bytes(buf: np.ndarray, raw: np.ndarray) -> list[bytes]:
    ends = np.cumsum(raw).tolist()
    mv = buf.data  # the array's memoryview
    starts = [0] + ends[:-1]
    return [mv[a:b].tobytes() for a, b in zip(starts, ends)]


class Ragged:
    """A decoded batch of ragged records: the values of all records back to
    back, element offsets (B+1), and each record's shape (None when every
    record is 1-D)."""

    def __init__(self, buf: np.ndarray, raw: np.ndarray, aux: np.ndarray, dtype: np.dtype,
                 idx: np.ndarray, path: str | None):
        item = dtype.itemsize
        self.dtype = dtype
        self.count = len(idx)
        self.offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        # (A step's few numpy calls are most of a loader's per-step cost for
        # ragged records: bytes need no division and no check; wider items
        # are checked at once, as a size that is not a multiple of the item
        # loses its remainder from the element count.)
        if item == 1:
            np.cumsum(raw, out=self.offsets[1:])
            payload = int(self.offsets[-1])
        else:
            payload = int(raw.sum())
            if item:
                np.cumsum(raw // item, out=self.offsets[1:])
                if int(self.offsets[-1]) * item != payload:
                    bad = int(idx[np.flatnonzero(raw % item)[0]])
                    raise _damaged(path, bad, f"size (not a multiple of {item})")
        self.values = buf[:payload].view(dtype) if item else np.zeros(0, dtype)
        self.shapes = _shapes(idx, raw, aux, buf[payload:], item, path) if aux.any() else None

    def to_list(self) -> list[np.ndarray]:
        if self.dtype.itemsize == 0:
            return [np.zeros(s, self.dtype) for s in (self.shapes or [(0,)] * self.count)]
        eo = self.offsets.tolist()
        out = [self.values[eo[i]:eo[i + 1]] for i in range(self.count)]
        if self.shapes is not None:
            out = [v if len(s) == 1 else v.reshape(s) for v, s in zip(out, self.shapes)]
        return out

    def to_packed(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(values, row_splits)``; records must share their trailing dims."""
        if self.shapes is None:
            return self.values, self.offsets
        trailing = _common_trailing(idx, self.shapes)
        rows = np.array([s[0] for s in self.shapes], dtype=np.int64)
        row_splits = np.zeros(self.count + 1, dtype=np.int64)
        np.cumsum(rows, out=row_splits[1:])
        return self.values.reshape((int(row_splits[-1]),) + trailing), row_splits


def variable_batch(kind: str, dtype: np.dtype, buf: np.ndarray, raw: np.ndarray, aux: np.ndarray,
                   idx: np.ndarray, path: str | None, out: Any, packed: bool) -> Any:
    """The one result of a variable read (bytes or ragged records) for every
    reader: a list (bytes, or arrays of their own shapes) or, with `packed`,
    ``(values, row_splits)``, the values copied into `out` when given."""
    if not packed:
        if out is not None:
            raise TypeError(f"out= takes the {kind} records packed: pass packed=True, which "
                            "returns (values, row_splits) with values in out")
        return to_bytes(buf, raw) if kind == "bytes" \
            else Ragged(buf, raw, aux, dtype, idx, path).to_list()
    if kind == "bytes":
        values = buf[:int(raw.sum())]
        row_splits = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(raw, out=row_splits[1:])
    else:
        values, row_splits = Ragged(buf, raw, aux, dtype, idx, path).to_packed(idx)
    if out is None:
        return values, row_splits
    return _packed_into(out, values, kind, path), row_splits


def dense_packed(batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A dense batch ``(B, n, *t)`` in the packed form of ragged records:
    ``((B * n, *t), row_splits)`` with record i at rows ``[i*n, (i+1)*n)``;
    the values are the batch itself (a view, no copy)."""
    if batch.ndim < 2:
        raise ValueError("the records are scalars; packed=True needs records with a first axis")
    n = batch.shape[1]
    row_splits = np.arange(len(batch) + 1, dtype=np.int64) * n
    return batch.reshape((len(batch) * n,) + batch.shape[2:]), row_splits


def _packed_into(out: Any, values: np.ndarray, kind: str, path: str | None) -> np.ndarray:
    """`values` copied into the front of the caller's `out`; returns that part
    of `out`. Bytes go into any writable, C-contiguous buffer; ragged values
    into an array of their dtype and trailing shape with enough rows."""
    if kind == "bytes":
        dest = writable_bytes(out)
        if dest.nbytes < values.nbytes:
            raise SizeMismatchError(f"{path}: the records hold {values.nbytes} bytes, out only "
                                    f"{dest.nbytes}", path=path)
        dest[:values.nbytes] = values
        return dest[:values.nbytes]
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, not {type(out).__name__}")
    if out.dtype != values.dtype:
        raise IdentityError(f"out has dtype {out.dtype}, the records {values.dtype}", path=path)
    if out.shape[1:] != values.shape[1:] or out.ndim != values.ndim \
            or out.shape[0] < values.shape[0]:
        raise SizeMismatchError(f"out has shape {out.shape}; the records need at least "
                                f"{values.shape}", path=path)
    if not out.flags.c_contiguous:
        raise SizeMismatchError("out must be C-contiguous", path=path)
    if not out.flags.writeable:
        raise SizeMismatchError("out is read-only", path=path)
    dest = out[:len(values)]
    dest[...] = values
    return dest


def byte_view(mv: memoryview) -> np.ndarray:
    """A C-contiguous memoryview's memory as a flat uint8 array (no copy)."""
    return np.frombuffer(mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv,
                         dtype=np.uint8)


def writable_bytes(out) -> np.ndarray:
    """The caller's `out` as a writable uint8 view of the same memory."""
    if isinstance(out, np.ndarray):
        if out.dtype.hasobject:
            raise TypeError(f"out is an array of Python objects ({out.dtype}), not a buffer")
        contiguous = out.flags.c_contiguous
    else:
        try:
            mv = memoryview(out)
        except TypeError:
            raise TypeError(f"out must be a writable bytes-like object or array, "
                            f"not {type(out).__name__}") from None
        contiguous = mv.c_contiguous
    if not contiguous:
        # A reshape of it would be a copy: the records would never reach `out`.
        raise SizeMismatchError("out must be C-contiguous (records are written back to back)")
    if isinstance(out, np.ndarray):
        dest = out.reshape(-1).view(np.uint8)
    else:
        dest = byte_view(mv)
    if not dest.flags.writeable:
        raise ValueError("out is read-only")
    return dest


def _shapes(idx: np.ndarray, raw: np.ndarray, aux: np.ndarray, aux_bytes: np.ndarray, item: int,
            path: str | None) -> list[tuple]:
    """Each record's shape from its aux bytes, checked before anything is sized by it."""
    bad = (aux % 8 != 0) | (aux > 8 * (identity.NDIM_MAX + 1))
    if bad.any():
        raise _damaged(path, int(idx[np.flatnonzero(bad)[0]]), "shape")
    words = aux_bytes.view("<u8")
    ends = np.cumsum(aux // 8).tolist()
    shapes, start = [], 0
    for i, end in enumerate(ends):
        if end == start:
            shapes.append((int(raw[i]) // item if item else 0,))
            continue
        w = words[start:end].tolist()
        start = end
        try:
            dims = identity.check_shape(w[1:], item, "shape")
        except ValueError:
            raise _damaged(path, int(idx[i]), f"shape {tuple(w[1:])}") from None
        if w[0] != len(dims) or np.prod(dims, dtype=object) * item != int(raw[i]):
            raise _damaged(path, int(idx[i]), f"shape {dims}")
        shapes.append(dims)
    return shapes


def _damaged(path: str | None, index: int, what: str) -> CorruptStoreError:
    where = f"{path}: " if path else ""
    return CorruptStoreError(f"{where}record {index} has a damaged {what}", path=path)


def _common_trailing(idx: np.ndarray, shapes: list[tuple]) -> tuple:
    trailing = None
    for i, s in enumerate(shapes):
        if len(s) == 0:
            raise ValueError(f"record {int(idx[i])} is a scalar; packed=True needs records "
                             "with a first axis")
        if trailing is None:
            trailing = s[1:]
        elif s[1:] != trailing:
            raise ValueError(f"records do not share trailing dimensions: record {int(idx[i])} "
                             f"has shape {s}, earlier ones (*, {', '.join(map(str, trailing))})")
    return trailing or ()
