"""loaderx's own data as a source: a dataset directory or a single store,
local or at a URL (``s3://``, ``gs://``, ``az://``, ``https://``, read
through the node-local cache as `open_dataset` reads it). Converting one
makes a local (or uploaded) copy of its records with the codec, level and
workers asked for: `loaderx convert s3://bucket/ds ./ds` is how a remote
dataset becomes a local one.

Every column keeps what its manifest says of it (text, categories, labels
and the like; the codec is the conversion's), a column's nulls keep their
mask, and the records are exactly the source's, in order. Each column of
the copy records the ``content_id`` of the column it copies (its manifest's
``content``), so a subset's checkpoint taken on the source resumes on the
copy (loaderx.subset). A dataset of splits converts split by split.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import numpy as np

from .. import _objstore, _openers
from .._manifest import MANIFEST_NAME, read_manifest
from .._writer import is_store_dir
from ..columns import Column
from ..dataset import open_dataset
from ..zrecord import open_store
from ._columns import ColumnSpec, ConvertError, Nullable, Packed
from ._source import Batch, Options, Source, ramped, row_tasks, rows_per_batch, select_columns

__all__ = ["LoaderxSource", "is_loaderx_data", "loaderx_splits"]

#: What a column's manifest entry says that the copy's entry gets from its
#: spec instead (or that the conversion decides anew).
_OWN_KEYS = ("kind", "dtype", "item_shape", "codec", "shards", "valid", "valid_of", "content")


def _join(root: str, name: str) -> str:
    return _objstore.join(root, name) if _objstore.is_url(root) else os.path.join(root, name)


def _exists(path: str) -> bool:
    if _objstore.is_url(path):
        return _openers.remote(path).exists(path)
    return os.path.isfile(path)


def is_loaderx_data(path: str) -> bool:
    """Whether `path` (a directory or a URL) holds a loaderx dataset or store."""
    if not _objstore.is_url(path):
        return os.path.isfile(os.path.join(path, MANIFEST_NAME)) or is_store_dir(path)
    return _exists(_join(path, MANIFEST_NAME)) or _exists(_join(path, "meta"))


def loaderx_splits(path: str) -> list | None:
    """``[(split, path)]`` of a loaderx dataset of splits at `path`, else None."""
    if not _exists(_join(path, MANIFEST_NAME)):
        return None
    manifest = read_manifest(path)
    if "splits" not in manifest:
        return None
    return [(name, _join(path, sub)) for name, sub in manifest["splits"].items()]


def _raw(stream: Any) -> tuple:
    """(values' store or ShardSet, mask's or None) of an opened column."""
    if isinstance(stream, Column):
        return stream.stream, stream.valid
    return stream, None


def _content(stream: Any) -> dict | None:
    """The manifest's ``content`` for a copy of `stream`'s records."""
    cid = getattr(stream, "content_id", None)
    return None if cid is None else {"id": cid, "rows": len(stream)}


class LoaderxSource(Source):
    """A loaderx dataset (its value columns; masks come with their columns)
    or a single store (one column, named after its directory)."""

    kind = "loaderx"
    _open_streams: dict | None = None  # per process, never pickled

    def __init__(self, path: str, options: Options):
        super().__init__(options)
        if options.row_length or options.fill_null:
            raise ConvertError(f"{path}: row_length and fill_null apply to NumPy and Arrow "
                               "sources, not to loaderx data (its records are copied as they are)")
        self.path = path if _objstore.is_url(path) else os.path.abspath(path)
        self.dataset = _exists(_join(path, MANIFEST_NAME))
        # The settings URL opens use here, carried to worker processes.
        self.settings: Any = None
        with self._settings() as settings:
            self.settings = settings
            self.entries = read_manifest(self.path)["columns"] if self.dataset else None
            self._open_streams = self._open(None)
            self.rows = len(next(iter(self._open_streams.values())))
            available = list(self._open_streams)
            self.names = select_columns(available, options, self.path)
            self._specs = [self._spec(n) for n in self.names]
        self.close()

    def _settings(self) -> Any:
        if not _objstore.is_url(self.path):
            return contextlib.nullcontext()
        opener = _openers.remote(self.path)
        if self.settings is None:
            return opener.settings(None, None, None)
        return opener.resume(self.settings)

    def _open(self, names: list | None) -> dict:
        """``{column: opened}`` of the value columns (masks inside `Column`s)."""
        if not self.dataset:
            name = self.path.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1] or "records"
            return {name: open_store(self.path)}
        opened = open_dataset(self.path, names)
        assert self.entries is not None  # read with the manifest
        for name in [n for n in opened if self.entries.get(n, {}).get("valid_of")]:
            opened.pop(name)  # a mask: read (and closed) through its column (Column.valid)
        return opened

    def _spec(self, name: str) -> ColumnSpec:
        stream = self._streams()[name]
        values, mask = _raw(stream)
        entry = (self.entries or {}).get(name, {})
        extra = {k: v for k, v in entry.items() if k not in _OWN_KEYS}
        content = _content(values)
        if content is not None:
            extra["content"] = content
        kind = values.kind
        dtype = np.dtype(np.uint8) if kind == "bytes" else np.dtype(values.dtype)
        shape = tuple(values.item_shape) if kind == "dense" else None
        return ColumnSpec(name, kind, dtype, shape, extra=extra,
                          mask_content=None if mask is None else _content(mask))

    def _streams(self) -> dict:
        if self._open_streams is None:
            with self._settings():
                self._open_streams = self._open(self.names)
        return self._open_streams

    def close(self) -> None:
        streams, self._open_streams = self._open_streams, None
        for stream in (streams or {}).values():
            stream.close()

    # -- the Source interface

    def specs(self) -> list[ColumnSpec]:
        return list(self._specs)

    def row_count(self) -> int:
        return self.rows

    def tasks(self, workers: int) -> list:
        return row_tasks(self.rows, workers)

    def read(self, task, specs, batch_bytes: int) -> Iterator[Batch]:
        start, stop = task
        try:
            streams = self._streams()
            step = rows_per_batch(self._row_bytes(streams, specs), batch_bytes)
            for a, b in ramped(start, stop, step):
                idx = np.arange(a, b, dtype=np.int64)
                columns = {s.name: _records(streams[s.name], s, idx) for s in specs}
                yield Batch(b - a, columns, b - a)
        finally:
            self.close()

    def _row_bytes(self, streams: dict, specs: list[ColumnSpec]) -> float:
        total = 0.0
        for s in specs:
            values, _ = _raw(streams[s.name])
            n = max(1, len(values))
            total += s.record_bytes() or values.stats()["live_bytes"] / n
        return total

    def describe(self, file_rows: list | None = None) -> dict:
        return {"type": "loaderx", "path": self.path,
                "layout": "dataset" if self.dataset else "store"}


def _records(stream: Any, spec: ColumnSpec, idx: np.ndarray) -> Any:
    """Records `idx` of an opened column as its store appends them (and its
    mask, when it has one)."""
    values, mask = _raw(stream)
    if spec.kind == "dense":
        got: Any = values.gather(idx)
    elif spec.kind == "bytes":
        data, splits = values.gather(idx, packed=True)
        got = Packed(np.asarray(data, np.uint8).reshape(-1), splits)
    else:
        got = values.gather(idx)
    if mask is None:
        return got
    return Nullable(got, np.asarray(mask.gather(idx), dtype=bool).reshape(-1))
