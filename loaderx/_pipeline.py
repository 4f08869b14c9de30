"""The plan of a DataLoader: its sources and columns, and how each column's
batch is made from what the native ring (``src/Loader.zig``) hands over.

Every stream the ring can read (``native_parts()``: stores, ShardSets,
selected views; ``native_windows()``: token windows) is a *native column*:
library threads gather it, dense records into one pool buffer per step,
variable-size records (ragged, bytes) into one buffer per step, decoded here
without copying. Any other stream (``gather()`` and a ``kind``, a numpy
array) is a *Python column*, read on the loader's Python worker threads at
the indices the ring computed. The ring computes every step's indices (and,
for a mixture, each record's source) exactly once, for both kinds.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from . import _abi, _records, image, streams
from .mixture import Mixture, source_seed

COLUMN_DENSE = _abi.COLUMN_KINDS["dense"]
COLUMN_VARIABLE = _abi.COLUMN_KINDS["variable"]
COLUMN_WINDOWS = _abi.COLUMN_KINDS["windows"]
COLUMN_SEGMENTS = _abi.COLUMN_KINDS["segments"]
COLUMN_IMAGE = _abi.COLUMN_KINDS["image"]


class Column:
    """One stream name of every batch, across the loader's sources."""

    def __init__(self, name: str, sources: List[Any]):
        self.name = name
        self.streams = sources
        first = sources[0]
        self.kind = first.kind
        #: What the streams hold (``kind`` is what the batch is: "dense" once
        #: an image pipeline makes fixed-size arrays of the records).
        self.source_kind = first.kind
        self.dtype = np.dtype(getattr(first, "dtype", np.uint8))
        shape = tuple(first.item_shape) if self.kind == "dense" else None
        self.item_shape: Optional[Tuple[int, ...]] = shape
        self.source_dtype, self.source_shape = self.dtype, shape or ()
        # Token windows (and their segments) are read by the ring as windows
        # of a corpus; stores, ShardSets and views as records of their parts.
        windows = [streams.native_windows(s) for s in sources]
        self.windows = all(w is not None for w in windows)
        self.segments = self.windows and all(w[2] for w in windows)  # type: ignore[index]
        self.native = self.windows or all(streams.native_parts(s) is not None for s in sources)
        self.prefetch = [streams.prefetcher(s) for s in sources]
        self.record_bytes = int(self.dtype.itemsize * np.prod(shape, dtype=np.int64)) \
            if shape is not None else 0
        #: An image pipeline (``DataLoader(image=)``): the column's batch is
        #: its fixed-size output, made by the ring (native) or a worker.
        self.image: Optional[Any] = None
        self.image_input: Optional[Tuple[int, ...]] = None
        self.image_native: Any = None

    def set_image(self, pipeline: Any, seed: int) -> None:
        """This column's records go through `pipeline` (loaderx.image)."""
        self.image_input = image.image_input(self.name, self.streams)
        self.image = pipeline
        shape = pipeline.shape(None if self.image_input is None else self.image_input[:2])
        if self.native:
            self.image_native = pipeline.column(seed, self.image_input)
        self.kind, self.dtype, self.item_shape = "dense", pipeline.dtype, shape
        self.record_bytes = int(self.dtype.itemsize * np.prod(shape, dtype=np.int64))

    @property
    def dense_shape(self) -> Tuple[int, ...]:
        """The item shape of a dense column (other kinds have none)."""
        assert self.item_shape is not None
        return self.item_shape

    @property
    def ring_kind(self) -> int:
        if self.image is not None:
            return COLUMN_IMAGE
        if self.windows:
            return COLUMN_SEGMENTS if self.segments else COLUMN_WINDOWS
        return COLUMN_DENSE if self.kind == "dense" else COLUMN_VARIABLE

    def parts_of(self, source: int) -> List[streams.NativePart]:
        stream = self.streams[source]
        if self.windows:
            found = streams.native_windows(stream)
            assert found is not None
            return found[0]
        parts = streams.native_parts(stream)
        assert parts is not None
        return parts

    def spec_of(self, source: int) -> Any:
        """The window index (lx_windows_t) of a windows column's source."""
        found = streams.native_windows(self.streams[source])
        assert found is not None
        return found[1]

    @property
    def path(self) -> Optional[str]:
        return getattr(self.streams[0], "path", None)


class Plan:
    """The sources and columns of a loader: a dict of streams is one source,
    a `Mixture` several."""

    def __init__(self, sources: Any, seed: int, images: Optional[Mapping[str, Any]] = None):
        if isinstance(sources, Mixture):
            self.source_names = sources.names
            per_source = [sources.sources[n] for n in self.source_names]
            self.weights = sources.integer_weights
            self.mixture: Optional[Mixture] = sources
            self.seeds = [source_seed(seed, n) for n in self.source_names]
        else:
            self.source_names = [""]
            per_source = [sources]
            self.weights = [1]
            self.mixture = None
            self.seeds = [seed]
        names = list(per_source[0])
        self.columns = [Column(n, [src[n] for src in per_source]) for n in names]
        self.lengths = [len(next(iter(src.values()))) for src in per_source]
        self.image_seed = seed
        if images:
            self._set_images(images, seed)

    def _set_images(self, images: Mapping[str, Any], seed: int) -> None:
        if not isinstance(images, Mapping):
            raise TypeError(f"image= takes a dict of stream name -> loaderx.image.Pipeline, "
                            f"got {type(images).__name__}")
        by_name = {c.name: c for c in self.columns}
        for name, pipeline in images.items():
            if name not in by_name:
                raise ValueError(f"image= names stream {name!r}, which is not one of "
                                 f"{list(by_name)}")
            if not isinstance(pipeline, image.Pipeline):
                raise TypeError(f"image[{name!r}] must be a loaderx.image.Pipeline, "
                                f"got {type(pipeline).__name__}")
            by_name[name].set_image(pipeline, seed)

    @property
    def native(self) -> List[Column]:
        return [c for c in self.columns if c.native]

    @property
    def python(self) -> List[Column]:
        return [c for c in self.columns if not c.native]

    @property
    def prefetching(self) -> bool:
        """Some stream has a ``prefetch`` hook."""
        return any(hook is not None for c in self.columns for hook in c.prefetch)


def decode_variable(col: Column, buf: np.ndarray, sizes: np.ndarray, indices: np.ndarray,
                    packed: bool) -> Any:
    """A variable column's batch from the ring's buffer and sizes."""
    n = len(indices)
    # (A byte stream's batch stays a list of bytes in the loader, packed or not.)
    return _records.variable_batch(col.kind, col.dtype, buf, sizes[:n], sizes[n:], indices,
                                   col.path, None, packed and col.kind != "bytes")


def python_column(col: Column, indices: np.ndarray, sources: Optional[np.ndarray],
                  out: Optional[np.ndarray], gather_kwargs: Dict[str, Any],
                  packed: bool = False, image_key: Tuple[int, int, int] = (0, 0, 0)) -> Any:
    """A Python column's batch: each source's stream gathered at its records'
    indices, put back in the batch's order (``packed``: a ragged column as
    ``(values, row_splits)``, as the ring gives a store's); through its image
    pipeline, keyed by `image_key` (seed, step, position), when it has one."""
    if col.image is not None:
        records = _python_records(col, indices, sources, None, gather_kwargs)
        if col.image_input is not None:
            records = np.asarray(records, np.uint8)
        seed, step, position = image_key
        return col.image.apply(records, seed=seed, step=step, position=position)
    result = _python_records(col, indices, sources, out, gather_kwargs)
    if packed and col.kind == "ragged":
        return pack_records(col, result, indices)
    return result


def pack_records(col: Column, records: List[Any], indices: np.ndarray) -> Any:
    """A list of ragged records as ``(values, row_splits)``; the records must
    share their trailing dimensions (as for ``RaggedStore.gather(indices, packed=True)``)."""
    arrays = [np.asarray(record) for record in records]
    try:
        trailing = _records._common_trailing(indices, [a.shape for a in arrays])
    except ValueError as exc:
        raise ValueError(f"stream {col.name!r} (packed=True): {exc}") from None
    row_splits = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.shape[0] for a in arrays], out=row_splits[1:])
    values = np.concatenate(arrays) if arrays else np.empty((0,) + trailing, col.dtype)
    return values.astype(col.dtype, copy=False), row_splits


def _python_records(col: Column, indices: np.ndarray, sources: Optional[np.ndarray],
                    out: Optional[np.ndarray], gather_kwargs: Dict[str, Any]) -> Any:
    def gather(stream, idx, out=None):
        kw = gather_kwargs if streams.native_parts(stream) is not None else {}
        if col.source_kind == "dense":
            return stream.gather(idx, out=out, **kw)
        return stream.gather(idx, **kw)
    if sources is None or len(col.streams) == 1:
        return gather(col.streams[0], indices.view(np.int64), out)
    result: Any = out if (col.source_kind == "dense" and out is not None) else (
        np.empty((len(indices),) + col.source_shape, col.source_dtype)
        if col.source_kind == "dense"
        else [None] * len(indices))
    for k, stream in enumerate(col.streams):
        rows = np.flatnonzero(sources == k)
        if len(rows) == 0:
            continue
        got = gather(stream, indices[rows].view(np.int64))
        if col.source_kind == "dense":
            result[rows] = got
        else:
            for row, record in zip(rows.tolist(), got):
                result[row] = record
    return result
