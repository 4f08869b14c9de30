"""`RaggedStore`: one dtype, every record with its own shape; and
`OriginalRaggedStore`, what ``RaggedStore(path)`` opens (read-only) for a
ragged store written by the original loaderx 1.7 (loaderx._readonly177)."""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from . import _original, identity
from ._checks import is_int
from ._readonly177 import ReadOnly177
from ._writer import prepare_store
from ._store import Store, check_new_store, chunks_of, deprecated, packed_chunks, pointers
from ._store import row_splits as _row_splits
from .errors import IdentityError


def encode_shape(shape: tuple) -> bytes:
    """Aux bytes of a record: none for 1-D (the size gives the length), else
    uint64 [ndim, *shape]."""
    if len(shape) == 1:
        return b""
    return np.array([len(shape), *shape], dtype="<u8").tobytes()


# Raw bytes in one zstd frame of a long token document (see RaggedStore);
# the measurements behind the choice are in CHANGELOG.md (2026-12-02).
TOKEN_FRAME_SIZE = 4 << 10


class RaggedStore(Store):
    """One dtype; every record keeps its own shape (any rank, including ``()``
    and zero-length). ``gather`` (and ``rs[...]``) returns a list of arrays in
    request order; ``gather(idx, packed=True)`` returns ``(values,
    row_splits)`` for records sharing their trailing dimensions — one flat
    buffer, no Python object per record.
    A batch's sizes, shapes and bytes come from one native call on one
    snapshot of the store, so no record is ever stitched from two.

    `frame_size` (zstd codecs, set at create): records longer than this many
    bytes are stored as independent zstd frames of that size plus a seek
    table (zstd's seekable format), so a `TokenWindows` window decodes only
    the few KiB it returns instead of its whole document. ``None`` (the
    default) means `TOKEN_FRAME_SIZE` (4 KiB) for integer dtypes (token
    documents) and 0 for the rest; 0 stores every record as one frame.
    ``rs[i]`` returns whole records either way.

    ``RaggedStore.create(path, dtype, mode=...)`` makes a store,
    ``RaggedStore.open(path)`` opens one; ``RaggedStore(path)`` is ``open``,
    ``RaggedStore(path, dtype)`` is ``create(path, dtype, mode="append")``.
    """

    kind = "ragged"
    item_shape = None

    def __new__(cls, path=None, *args: Any, **kwargs: Any) -> "RaggedStore":
        # A ragged store of the original loaderx 1.7 opens read-only in place.
        if cls is RaggedStore and _original.is_store177(path):
            return super().__new__(OriginalRaggedStore)
        return super().__new__(cls)

    @classmethod
    def create(cls, path, dtype, *, codec: str | None = None, level: int | None = None,
               dict_bytes: bytes | None = None, frame_size: int | None = None,
               mode: str = "create") -> "RaggedStore":
        """A new store of `dtype` records at `path`; `mode`, `codec`, `level`
        and `dict_bytes` as for `DenseStore.create`, `frame_size` as above.
        ``RaggedStore(path, dtype)`` is ``create(..., mode="append")``."""
        if dtype is None:
            raise TypeError("RaggedStore.create needs a dtype")
        _frame_size(frame_size, identity.check_dtype(dtype), codec)
        check_new_store(path, codec, level, dict_bytes)
        prepare_store(path, mode)
        return cls(path, dtype, codec=codec, level=level, dict_bytes=dict_bytes,
                   frame_size=frame_size)

    def __init__(self, path, dtype=None, codec: str | None = None,
                 dict_bytes: bytes | None = None, *, level: int | None = None,
                 frame_size: int | None = None):
        create = dtype is not None
        ident = None
        frames = 0
        if create:
            dt = identity.check_dtype(dtype)
            ident = identity.encode("ragged", dt)
            frames = _frame_size(frame_size, dt, codec)
        super().__init__(path, create=create, codec=codec, level=level, dict_bytes=dict_bytes,
                         ident=ident, frame_size=frames)
        if frame_size is not None and frame_size != self._frame_size:
            self.close()
            raise IdentityError(f"{self._path}: existing store has frame_size="
                                f"{self._frame_size} (asked for {frame_size})", path=self._path)
        found = self._identity
        if found.kind != "ragged":
            self.close()
            raise IdentityError(f"{self._path}: store holds {found.kind} records, not ragged ones "
                                "(use loaderx.dataset.open_store)", path=self._path)
        assert found.dtype is not None  # a ragged identity always names it (identity.decode)
        self._dtype: np.dtype = found.dtype
        if create and self._dtype != dt:
            self.close()
            raise IdentityError(f"{self._path}: existing store holds dtype={found.dtype}; "
                                f"asked for dtype={dt}", path=self._path)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    def _describe(self) -> str:
        return f", dtype={self._dtype}"

    def _as_record(self, i: int, x) -> np.ndarray:
        if isinstance(x, np.ndarray):
            if x.dtype != self._dtype:
                raise IdentityError(f"{self._path}: record {i} has dtype {x.dtype}, "
                                    f"store holds {self._dtype}", path=self._path)
            a = x
        elif isinstance(x, (bytes, bytearray, memoryview)):
            if self._dtype != np.uint8:
                raise IdentityError(f"{self._path}: record {i} is bytes but the store holds "
                                    f"{self._dtype}", path=self._path)
            a = np.frombuffer(x, dtype=np.uint8)
        else:
            a = self._converted(i, x)
        if a.ndim > identity.NDIM_MAX:
            raise ValueError(f"record {i} has {a.ndim} dimensions; "
                             f"at most {identity.NDIM_MAX} are supported")
        # (np.ascontiguousarray would turn a 0-d record into a 1-d one)
        return a if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(a.shape)

    def _converted(self, i: int, x) -> np.ndarray:
        """Record `i` given as a list or scalar, converted to the store's dtype
        (one conversion; values it would change are refused: fractions,
        imaginary parts, integers out of range)."""
        try:
            probe = np.asarray(x)
        except (TypeError, ValueError) as e:
            raise TypeError(f"record {i} cannot be read as {self._dtype}: {e}") from None
        found, want = probe.dtype, self._dtype
        if probe.size and ((found.kind in "fc" and want.kind in "biu")
                           or (found.kind == "c" and want.kind == "f")):
            raise TypeError(f"record {i} holds {found} values, which {want} cannot hold "
                            f"exactly; convert (and round) them yourself, as a {want} array")
        if probe.size and found.kind in "iu" and want.kind in "iu":
            lo, hi, info = int(probe.min()), int(probe.max()), np.iinfo(want)
            if lo < info.min or hi > info.max:
                raise OverflowError(f"record {i} does not fit {want}: it holds "
                                    f"{lo if lo < info.min else hi}")
        try:  # (float64 for [], which holds nothing to lose; object for huge ints)
            return probe.astype(want, copy=False) if found.kind != "O" \
                else np.asarray(x, dtype=want)
        except OverflowError as e:
            raise OverflowError(f"record {i} does not fit {want}: {e}") from None
        except (TypeError, ValueError) as e:
            raise TypeError(f"record {i} cannot be read as {want}: {e}") from None

    def append(self, records: Iterable) -> int:
        """Append arrays (a one-pass iterator is fine); returns the first index."""
        self._w(rows=True)
        if isinstance(records, np.ndarray) and records.ndim == 1 and not records.dtype.hasobject:
            # Each element would become one 0-d record: a document without its brackets.
            raise TypeError(f"{self._path}: append takes an iterable of records, and this 1-D "
                            f"array of {len(records)} values would make {len(records)} scalar "
                            "records; pass [array] to append it as one record, or "
                            "append_packed(values, row_splits) for many (a flat token "
                            "stream is read as it is by TokenWindows.from_array(array, "
                            "seq_len))")
        if isinstance(records, np.ndarray) and records.dtype == self._dtype and records.ndim >= 1:
            records = list(records)
        arrays = (self._as_record(i, x) for i, x in enumerate(records))

        def chunks():
            for chunk in chunks_of(arrays):
                ptrs, sizes, keep = pointers(chunk)
                auxes = [np.frombuffer(encode_shape(a.shape), dtype=np.uint8) for a in chunk]
                if any(len(x) for x in auxes):
                    aux_ptrs, aux_sizes, keep2 = pointers(auxes)
                    yield ptrs, sizes, aux_ptrs, aux_sizes, (chunk, keep, auxes, keep2)
                else:
                    yield ptrs, sizes, None, None, (chunk, keep)
        return self._append_chunks(chunks())

    def append_packed(self, values, row_splits) -> int:
        """Append records given packed, the form ``gather(indices, packed=True)`` returns:
        record i is ``values[row_splits[i]:row_splits[i + 1]]``, of shape
        ``(n_i, *values.shape[1:])``. One native append with no Python object
        per record (the way to write a tokenized corpus: one flat token array
        and its document offsets). Returns the index of the first record."""
        self._w(rows=True)
        values = np.asarray(values)
        if values.dtype != self._dtype:
            raise IdentityError(f"{self._path}: values have dtype {values.dtype}, "
                                f"store holds {self._dtype}", path=self._path)
        if values.ndim == 0 or values.ndim > identity.NDIM_MAX:
            raise ValueError(f"values must have 1 to {identity.NDIM_MAX} dimensions, "
                             f"got shape {values.shape}")
        values = np.ascontiguousarray(values)
        splits = _row_splits(row_splits, len(values))
        trailing = values.shape[1:]
        row_bytes = self._dtype.itemsize * int(np.prod(trailing, dtype=np.int64))
        counts = np.diff(splits)
        aux = None
        if trailing:  # every record's shape, as encode_shape writes it
            aux = np.empty((len(counts), 2 + len(trailing)), dtype="<u8")
            aux[:, 0] = values.ndim
            aux[:, 1] = counts
            aux[:, 2:] = trailing
        return self._append_chunks(packed_chunks(values.reshape(-1).view(np.uint8),
                                                 splits[:-1] * row_bytes, counts * row_bytes,
                                                 aux))

    def gather_packed(self, indices, *, threads: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Deprecated spelling of ``gather(indices, packed=True)``."""
        deprecated("RaggedStore.gather_packed(indices)", "gather(indices, packed=True)")
        return self.gather(indices, packed=True, threads=threads)


def _frame_size(frame_size, dtype: np.dtype, codec: str | None) -> int:
    """The frame size a new store is created with (see RaggedStore)."""
    if codec == "raw":
        if frame_size:
            raise ValueError("frame_size applies to the zstd codecs, not codec='raw'")
        return 0
    if frame_size is None:
        return TOKEN_FRAME_SIZE if dtype.kind in "iu" else 0
    if not is_int(frame_size) \
            or not (frame_size == 0 or 64 <= frame_size <= 1 << 30):
        raise ValueError(f"frame_size must be 0 or 64 to 2**30 bytes, got {frame_size!r}")
    return int(frame_size)


class OriginalRaggedStore(ReadOnly177, RaggedStore):  # type: ignore[misc]
    """A ragged store written by the original loaderx 1.7 (its bytes stores
    too: ``RaggedStore(path, np.uint8)``), read in place, read-only
    (loaderx._readonly177): ``RaggedStore(path)`` returns one for such a
    directory; `dtype` and `codec`, when given, must be the store's."""

    def __init__(self, path, dtype=None, codec: str | None = None,
                 dict_bytes: bytes | None = None, *, level: int | None = None,
                 frame_size: int | None = None):
        self._open177(path, dtype, None, codec, dict_bytes)
