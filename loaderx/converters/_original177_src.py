"""Stores written by the original loaderx 1.7 (``store.zr``, ``meta.zr``,
``N.loc``, ``N.chunk``, ``dict.zr``; the layout is described in
``loaderx._original``), converted into a dataset: one column named after the
store's directory, with every record's dtype, shape and bytes identical.

What each becomes: a dense store, a `DenseStore` of its ``dtype`` and
``item_shape`` (``()``: scalar records); a ragged store (1.7's bytes stores
too: ``RaggedStore(path, np.uint8)``), a `RaggedStore` of its dtype whose
record i has the shape 1.7 recorded for it. A ``zstd_dict`` store keeps its
dictionary (the column is ``zstd_dict`` with the same dictionary, at level 19
unless ``level=`` says otherwise) when the conversion compresses.

The whole store is checked when it is opened (both headers, the identity,
every table entry), before anything is written; every record is decoded
while it is converted; damage raises `CorruptStoreError` naming the file. The
store stays locked against loaderx 1.7 (a shared lock on ``meta.zr``) while
it is read, so 1.7 cannot change it under the conversion.
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from .._original import DICT_NAME, VERSION, Layout177
from ._columns import ColumnSpec, ConvertError, Packed
from ._source import Batch, Options, Source, row_tasks, rows_per_batch

__all__ = ["Original177Source", "summary177"]

#: zstd's dictionary magic number: a trained dictionary, which a loaderx store can keep.
_ZSTD_DICT_MAGIC = b"\x37\xa4\x30\xec"


class Original177Source(Source):
    """One store of the original loaderx 1.7, as one column named after its directory."""

    kind = "loaderx-original"
    # Opened per process, never pickled (Source.__getstate__ leaves _open* behind).
    _open_layout: Layout177 | None = None

    def __init__(self, path: str, options: Options):
        super().__init__(options)
        self.path = os.path.abspath(path)
        name = os.path.basename(self.path.rstrip(os.sep)) or "records"
        self.name = name
        if options.columns not in (None, [name]) or options.skip_columns:
            raise ConvertError(
                f"{self.path}: a store of the original loaderx is one column, {name!r}; "
                "columns= and skip_columns= do not apply"
            )
        if options.row_length:
            raise ConvertError(f"{self.path}: row_length applies to NumPy sources, not to a store "
                               "of the original loaderx")
        if options.dtype is not None or options.item_shape is not None:
            flags = options.flags
            raise ConvertError(
                f"{self.path}: a store of the original loaderx 1.7 names its own dtype and "
                f"shape (store.zr); {flags.opt('dtype', '...')} and "
                f"{flags.opt('item_shape', '...')} apply to the 0.9 layout only")
        layout = self._layout()  # checks the whole store
        self.rows = layout.length
        self.store_kind = layout.kind
        self.codec = layout.codec
        if layout.kind == "dense":
            self.spec = ColumnSpec(name, "dense", layout.dtype, layout.item_shape)
        else:
            self.spec = ColumnSpec(name, "ragged", layout.dtype, None)

    def _layout(self) -> Layout177:
        if self._open_layout is None:
            self._open_layout = Layout177(self.path)
        return self._open_layout

    def close(self) -> None:
        layout, self._open_layout = self._open_layout, None
        if layout is not None:
            layout.close()

    # -- the Source interface

    def specs(self) -> list[ColumnSpec]:
        return [self.spec]

    def row_count(self) -> int:
        return self.rows

    def tasks(self, workers: int) -> list:
        return row_tasks(self.rows, workers)

    def dictionaries(self, codecs: dict) -> dict:
        """The store's own trained dictionary for its column, when it is a
        ``zstd_dict`` store and the column is compressed."""
        d = self._layout().dictionary
        if not d or codecs.get(self.name) != "zstd" or not d.startswith(_ZSTD_DICT_MAGIC):
            return {}
        codecs[self.name] = "zstd_dict"
        return {self.name: d}

    def read(self, task, specs, batch_bytes: int) -> Iterator[Batch]:
        start, stop = task
        layout = self._layout()
        logic, _ = layout.stored_bytes()
        step = rows_per_batch(logic / max(1, self.rows), batch_bytes)
        try:
            for a in range(start, stop, step):
                b = min(a + step, stop)
                yield Batch(b - a, {self.name: self.records(a, b)}, b - a)
        finally:
            self.close()

    def records(self, a: int, b: int):
        """Records a..b, as the column's store appends them."""
        layout = self._layout()
        idx = np.arange(a, b, dtype=np.int64)
        if self.store_kind == "dense":
            out = np.empty((b - a,) + tuple(layout.item_shape or ()), layout.dtype)
            layout.records(idx, out.reshape(-1).view(np.uint8))
            return out
        buf, sizes, shapes = layout.ragged(idx)
        values = buf.view(layout.dtype)
        if all(len(s) == 1 for s in shapes):
            splits = np.zeros(len(idx) + 1, np.int64)
            np.cumsum(sizes // layout.dtype.itemsize, out=splits[1:])
            return Packed(values, splits)
        records, at = [], 0
        for shape, n in zip(shapes, (sizes // layout.dtype.itemsize).tolist()):
            records.append(values[at:at + n].reshape(shape))
            at += n
        return records

    def describe(self, file_rows: list | None = None) -> dict:
        return {"type": "loaderx-original", "path": self.path, "format_version": VERSION,
                "layout": "1.7", "schema": self.store_kind}


def summary177(path: str) -> dict:
    """What `loaderx info` says about a store of the original loaderx 1.7
    (raises `CorruptStoreError` for damage its checks find; frames are not
    decoded)."""
    src = Original177Source(path, Options())
    layout = src._layout()
    try:
        logic, stored = layout.stored_bytes()
        dict_path = os.path.join(src.path, DICT_NAME)
        return {
            "path": src.path,
            "layout": "loaderx-original-1.7",
            "format_version": VERSION,
            "records": src.rows,
            "kind": layout.kind,
            "dtype": str(layout.dtype),
            "shape": list(layout.item_shape) if layout.item_shape is not None else None,
            "becomes": src.spec.describe(),
            "chunks": layout.chunks_used(),
            "codecs": {layout.codec: src.rows} if src.rows else {},
            "dictionary_bytes": os.path.getsize(dict_path) if layout.dictionary else 0,
            "payload_bytes": logic,
            "stored_bytes": stored,
            "readable": True,
        }
    finally:
        src.close()
