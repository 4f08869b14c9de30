"""A store written by the original loaderx 1.7, read in place and read-only:
`ReadOnly177`, mixed into `OriginalDenseStore` (loaderx.dense) and
`OriginalRaggedStore` (loaderx.ragged), which ``DenseStore(path)``,
``RaggedStore(path)`` and ``open_store(path)`` return for such a directory.

They are the store classes they extend (``isinstance(s, DenseStore)``),
read as those read (``gather``, ``store[key]``, ``__getitems__``,
``packed=True``, ``out=``, ``len``, ``dtype``, ``item_shape``, ``codec``,
``stats``, ``verify``, ``dictionary``), pickle as a reference, and work as
DataLoader streams (read on the loader's Python threads: no native part).
Every mutation (``append``, ``delete``, ``compact``...) raises `ReadOnlyError`
with the one line that converts the store into a loaderx 3 store, which is
also what any use of a native handle needs.

Records are decoded by the library's codec (``lx_decode_frames``) from the
memory-mapped chunk files, one call per chunk a batch touches, on the calling
thread: a compatibility path, not the fast one (a converted store gathers on
every core, and the loader reads it natively).
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import _original, _records
from ._checks import check_out
from ._store import check_threads, normalize_indices
from .errors import ClosedError, IdentityError, ReadOnlyError

__all__ = ["ReadOnly177", "reopen"]

#: Records decoded at a time by `verify`.
_VERIFY_BLOCK = 4096


def reopen(cls: type, path: str) -> Any:
    """A pickled store of the original loaderx 1.7: reopened by path."""
    return cls(path)


class ReadOnly177:
    """The store API over `loaderx._original.Layout177` (see the module docs).
    Listed first in its classes' bases, so its methods win."""

    kind: str  # the store class's own ("dense" or "ragged")
    #: The stream protocol's native reading is not available: the loader reads
    #: this store on its Python threads (loaderx.streams).
    native_parts = None

    def _open177(self, path: Any, dtype: Any, item_shape: Any, codec: Any,
                 dict_bytes: Any) -> None:
        p = os.fspath(path)
        self._path = os.fsdecode(p) if isinstance(p, bytes) else p
        self._layout: _original.Layout177 | None = None
        self._handle = None
        self._remote = None
        self._readonly = True
        layout = _original.Layout177(self._path)
        try:
            self._check_asked(layout, dtype, item_shape, codec, dict_bytes)
        except BaseException:
            layout.close()
            raise
        self._layout = layout
        self._dtype = layout.dtype
        self._item_shape = layout.item_shape
        self._record_bytes = layout.record_bytes
        self._codec = layout.codec
        self._level = 0 if layout.codec == "raw" else 19 if layout.codec == "zstd_dict" else 3
        self._format_version = _original.VERSION
        self._frame_size = 0

    def _check_asked(self, layout: Any, dtype: Any, item_shape: Any, codec: Any,
                     dict_bytes: Any) -> None:
        """What the caller asked for (1.7.7's create-or-open spelling) must be
        what the store holds."""
        path = self._path
        if layout.kind != self.kind:
            raise IdentityError(f"{path}: store holds {layout.kind} records, not {self.kind} ones "
                                "(use loaderx.open_store)", path=path)
        asked = []
        if dtype is not None and np.dtype(dtype) != layout.dtype:
            asked.append(f"dtype={np.dtype(dtype)}")
        if item_shape is not None and self.kind == "dense":
            shape = tuple(int(d) for d in np.atleast_1d(np.asarray(item_shape, dtype=np.int64)))
            if shape != layout.item_shape:
                asked.append(f"item_shape={shape}")
        if codec is not None and codec != layout.codec:
            asked.append(f"codec={codec!r}")
        if asked:
            held = f", item_shape={layout.item_shape}" if self.kind == "dense" else ""
            raise IdentityError(f"{path}: existing store (the original loaderx 1.7) holds "
                                f"dtype={layout.dtype}{held}, codec={layout.codec!r}; asked for "
                                f"{', '.join(asked)}", path=path)
        if dict_bytes is not None:
            raise IdentityError(f"{path}: dict_bytes applies when a store is created, and this "
                                "one exists (a store of the original loaderx 1.7)", path=path)

    # -- what every call needs

    def _open(self) -> Any:
        layout = self._layout
        if layout is None:
            raise ClosedError(f"{self._path}: store is closed", path=self._path)
        return layout

    def _readonly_error(self, what: str) -> ReadOnlyError:
        return ReadOnlyError(
            f"{self._path}: {what} needs a loaderx 3 store, and this is a store of the original "
            f"loaderx 1.7, read in place read-only; convert it once with "
            f"{_original.convert_command(self._path)}", path=self._path)

    def _h(self) -> Any:
        self._open()
        raise self._readonly_error("this operation")

    def keep_rows(self, owner: str) -> "ReadOnly177":
        """Nothing to keep: no write reaches the store (Store.keep_rows)."""
        return self

    def _w(self, rows: bool = False) -> Any:
        self._open()
        raise self._readonly_error("writing")

    # -- reading

    def __len__(self) -> int:
        return self._open().length

    def gather(self, indices: Any, out: Any = None, *, packed: bool = False,
               threads: int = 0) -> Any:
        """Records `indices`, as the store class's own ``gather`` gives them."""
        check_threads(threads)
        idx, _ = normalize_indices(indices, len(self))
        if self.kind == "dense":
            batch = self._dense(idx, out)
            return _records.dense_packed(batch) if packed else batch
        return self._ragged(idx, out, packed)

    def __getitem__(self, key: Any) -> Any:
        idx, scalar = normalize_indices(key, len(self))
        got = self._dense(idx, None) if self.kind == "dense" else self._ragged(idx, None, False)
        return got[0] if scalar else got

    def __getitems__(self, indices: Any) -> Any:
        return self.gather(indices)

    def _dense(self, idx: np.ndarray, out: Any) -> np.ndarray:
        layout = self._open()
        shape = (len(idx),) + tuple(layout.item_shape)
        if out is None:
            out = np.empty(shape, layout.dtype)
        else:
            out = check_out(out, shape, layout.dtype, path=self._path)
        if len(idx):
            layout.records(idx.astype(np.int64), out.reshape(-1).view(np.uint8))
        return out

    def _ragged(self, idx: np.ndarray, out: Any, packed: bool) -> Any:
        layout = self._open()
        rows = idx.astype(np.int64)
        shapes = layout.shapes(rows)
        # The shapes as a loaderx 3 read gives them (none for a 1-D record),
        # after the payloads, so the one decoder of ragged batches reads them.
        aux = b"".join(b"" if len(s) == 1 else np.array((len(s),) + s, "<u8").tobytes()
                       for s in shapes)
        aux_sizes = np.array([0 if len(s) == 1 else 8 * (len(s) + 1) for s in shapes], np.uint64)
        payload = layout.entries(rows * 2)["logic_length"].astype(np.uint64)
        total = int(payload.sum())
        buf = np.empty(total + len(aux), np.uint8)
        layout.records(rows * 2, buf[:total])
        buf[total:] = np.frombuffer(aux, np.uint8)
        return _records.variable_batch("ragged", layout.dtype, buf, payload, aux_sizes, idx,
                                       self._path, out, packed)

    def verify(self) -> None:
        """Decode every record (and every ragged record's shape); raises
        `CorruptStoreError` naming the first that does not decode."""
        n = len(self)
        for start in range(0, n, _VERIFY_BLOCK):
            idx = np.arange(start, min(start + _VERIFY_BLOCK, n), dtype=np.uint64)
            if self.kind == "dense":
                self._dense(idx, None)
            else:
                self._ragged(idx, None, False)

    # -- what the store is

    def stats(self) -> dict:
        """``{records, live_bytes, chunk_bytes, reclaimable}``, as 1.7.7 counts
        them (stored bytes of the live records; chunk bytes up to its write
        frontier)."""
        layout = self._open()
        _, stored = layout.stored_bytes()
        sizes = layout.chunk_sizes.copy()
        sizes[-1] = layout.tail_offset
        chunk = int(sizes.sum())
        return {"records": layout.length, "live_bytes": stored, "chunk_bytes": chunk,
                "reclaimable": chunk - stored}

    @property
    def generation(self) -> int:
        """Always 0: nothing changes a store while loaderx reads it (1.7.7
        cannot open it then)."""
        self._open()
        return 0

    def dictionary(self) -> bytes | None:
        return self._open().dictionary or None

    def has_dict(self) -> bool:
        """Whether the store has a zstd dictionary (``dict.zr``), as in 1.7.7."""
        return bool(self._open().dictionary)

    def as_array(self) -> None:
        """None: the records are not one contiguous array in this layout."""
        return None

    @property
    def closed(self) -> bool:
        return self._layout is None

    @property
    def is_remote(self) -> bool:
        return False

    def prefetch(self, indices: Any, *, wait: bool = True) -> None:
        """Nothing to do (the stream protocol's hook): reads map the files."""
        normalize_indices(indices, len(self))

    def prefetch_warm(self, indices: Any) -> bool:
        return False

    def prefetch_size(self, indices: Any) -> int:
        idx, _ = normalize_indices(indices, len(self))
        st = self.stats()
        return int(round(len(idx) * st["live_bytes"] / max(1, st["records"])))

    def read_only(self) -> Any:
        return self

    def sync(self) -> None:
        """Nothing to sync: nothing is written."""
        self._open()

    def append(self, *args: Any, **kwargs: Any) -> int:
        raise self._readonly_error("append")

    def append_packed(self, *args: Any, **kwargs: Any) -> int:
        raise self._readonly_error("append_packed")

    def delete(self, key: Any) -> np.ndarray:
        raise self._readonly_error("delete")

    def compact(self) -> None:
        raise self._readonly_error("compact")

    def close(self) -> None:
        """Release the files and the lock (1.7.7 can open the store again).
        Idempotent."""
        layout, self._layout = getattr(self, "_layout", None), None
        if layout is not None:
            layout.close()

    def __enter__(self) -> Any:
        self._open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def __reduce__(self) -> tuple:
        return (reopen, (type(self), self._path))

    def __repr__(self) -> str:
        if self._layout is None:
            return f"{type(self).__name__}({self._path!r}, closed)"
        shape = f", item_shape={self._item_shape}" if self.kind == "dense" else ""
        return (f"{type(self).__name__}({self._path!r}, len={len(self)}, dtype={self._dtype}"
                f"{shape}, codec={self._codec!r}, read-only: the original loaderx 1.7)")
