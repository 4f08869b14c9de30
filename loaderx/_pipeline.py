"""The DataLoader's native pipeline (``src/Loader.zig``), as Python sees it:
the plan of a loader's columns and sources, and the ring that builds steps.

Every stream that speaks the parts protocol (``__loaderx_parts__``: stores and
ShardSets) is a *native column*: library threads gather it, dense records
into arrays the consumer submits, variable-size records (ragged, bytes) into
one new buffer per step, decoded on the consumer side without copying. Any
other stream object (``gather()`` and a ``kind``) is a *Python column*, read
on Python worker threads at the indices the ring computed. The ring computes
every step's indices (and, for a mixture, each record's source) exactly
once, for both kinds.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _abi, _lib, _records
from ._lib import ffi, lib
from .errors import LoaderClosedError
from .mixture import Mixture, source_seed

KINDS = ("dense", "ragged", "bytes")
COLUMN_DENSE = _abi.COLUMN_KINDS["dense"]
COLUMN_VARIABLE = _abi.COLUMN_KINDS["variable"]
COLUMN_WINDOWS = _abi.COLUMN_KINDS["windows"]
COLUMN_SEGMENTS = _abi.COLUMN_KINDS["segments"]


class Column:
    """One stream name of every batch, across the loader's sources."""

    def __init__(self, name: str, streams: List[Any]):
        self.name = name
        self.streams = streams
        first = streams[0]
        self.kind = first.kind
        self.dtype = np.dtype(getattr(first, "dtype", np.uint8))
        shape = tuple(first.item_shape) if self.kind == "dense" else None
        self.item_shape: Optional[Tuple[int, ...]] = shape
        # Token windows (and their segments) are read by the ring as windows
        # of a corpus; stores and ShardSets as records of their parts.
        # A remote stream is read through its gather() (which fetches its
        # records into the cache first) until the ring calls prefetch().
        remote = any(getattr(s, "is_remote", False) for s in streams)
        self.windows = not remote and all(callable(getattr(s, "__loaderx_windows__", None))
                                          for s in streams)
        self.segments = (self.windows and self.dtype == np.int32
                         and type(first).__name__ == "TokenSegments")
        self.native = not remote and (self.windows or all(
            callable(getattr(s, "__loaderx_parts__", None)) for s in streams))
        self.record_bytes = int(self.dtype.itemsize * np.prod(shape, dtype=np.int64)) \
            if shape is not None else 0

    @property
    def dense_shape(self) -> Tuple[int, ...]:
        """The item shape of a dense column (other kinds have none)."""
        assert self.item_shape is not None
        return self.item_shape

    @property
    def ring_kind(self) -> int:
        if self.windows:
            return COLUMN_SEGMENTS if self.segments else COLUMN_WINDOWS
        return COLUMN_DENSE if self.kind == "dense" else COLUMN_VARIABLE

    def parts_of(self, source: int) -> List[Tuple[Any, int]]:
        stream = self.streams[source]
        if self.windows:
            return stream.__loaderx_windows__()[0]
        return stream.__loaderx_parts__()

    @property
    def path(self) -> Optional[str]:
        return getattr(self.streams[0], "path", None)


class Plan:
    """The sources and columns of a loader: a dict of streams is one source,
    a `Mixture` several."""

    def __init__(self, streams: Any, seed: int):
        if isinstance(streams, Mixture):
            self.source_names = streams.names
            per_source = [streams.sources[n] for n in self.source_names]
            self.weights = streams.integer_weights
            self.mixture: Optional[Mixture] = streams
            self.seeds = [source_seed(seed, n) for n in self.source_names]
        else:
            self.source_names = [""]
            per_source = [streams]
            self.weights = [1]
            self.mixture = None
            self.seeds = [seed]
        names = list(per_source[0])
        self.columns = [Column(n, [src[n] for src in per_source]) for n in names]
        self.lengths = [len(next(iter(src.values()))) for src in per_source]

    @property
    def native(self) -> List[Column]:
        return [c for c in self.columns if c.native]

    @property
    def python(self) -> List[Column]:
        return [c for c in self.columns if not c.native]


class Ring:
    """The native prefetch ring over a plan's native columns. Steps are
    submitted in order with their destinations; ``wait(step)`` releases the
    GIL until the step is built. The ring keeps its stores alive: closing one
    while it runs fails the next step with ``ClosedError``."""

    def __init__(self, plan: Plan, *, batch_size: int, rank: int, world: int, base: Any,
                 seed: int, mode: int, window: int, threads: int, lanes: int) -> None:
        """`base` (a `loaderx._state.Base`): the first step, its position and,
        for a CYCLIC mixture, every source's cursor there."""
        self.plan = plan
        self.columns = plan.native
        self._keep: List[Any] = []  # handles and structs the native side points at
        config = ffi.new("lx_loader_config_t *", {
            "batch_size": batch_size, "rank": rank, "world": world, "position": base.position,
            "step": base.step, "seed": seed, "mode": mode, "window": window, "threads": threads,
            "lanes": lanes})
        cursors = base.cursors or [(0, 0, 0)] * len(plan.lengths)
        sources = ffi.new("lx_source_t[]", [
            {"length": n, "seed": s, "weight": w,
             "cursor": {"cycle": c[0], "offset": c[1], "steps_left": c[2]}}
            for n, s, w, c in zip(plan.lengths, plan.seeds, plan.weights, cursors)])
        columns = ffi.new("lx_column_t[]", max(1, len(self.columns)))
        parts = self._parts()
        for c, col in enumerate(self.columns):
            columns[c].kind = col.ring_kind
            columns[c].record_size = col.record_bytes
        specs = self._specs(len(plan.lengths))
        out = ffi.new("lx_loader **")
        _lib.check(lib.lx_loader_open(config, sources, len(plan.lengths), columns,
                                      len(self.columns), parts, len(self._part_list), specs, out),
                   None, "DataLoader")
        self.handle = ffi.gc(out[0], lib.lx_loader_free)
        self._width = max(1, len(self.columns))
        # Submits are serialized by the engine's lock; waits are not (Python
        # workers wait for different steps at once): their out-params are per call.
        self._dests = ffi.new("uint8_t *[]", self._width)
        # Threads inside lx_loader_wait: close() frees the ring only once none is left.
        self._users = 0
        self._users_changed = threading.Condition(threading.Lock())
        self._closed = False

    def _parts(self) -> Any:
        """Every (store handle, first, source, column) of the native columns."""
        self._part_list: List[Tuple[Any, int, int, int]] = []
        for c, col in enumerate(self.columns):
            for k in range(len(col.streams)):
                for handle, first in col.parts_of(k):
                    self._part_list.append((handle, first, k, c))
        parts = ffi.new("lx_loader_part_t[]", max(1, len(self._part_list)))
        for i, (handle, first, k, c) in enumerate(self._part_list):
            parts[i].store = handle
            parts[i].first = first
            parts[i].source = k
            parts[i].column = c
        self._keep.append(parts)
        return parts

    def _specs(self, source_count: int):
        """The window index of every (windows column, source), or NULL."""
        if not any(col.windows for col in self.columns):
            return ffi.NULL
        specs = ffi.new("lx_windows_t[]", len(self.columns) * source_count)
        for c, col in enumerate(self.columns):
            if col.windows:
                for k, stream in enumerate(col.streams):
                    specs[c * source_count + k] = stream.__loaderx_windows__()[1][0]
        self._keep.append(specs)
        return specs

    def submit(self, step: int, dests: Sequence[np.ndarray], indices: Optional[np.ndarray],
               sources: Optional[np.ndarray]) -> None:
        """Caller holds the engine's lock and has checked it is not closed."""
        d = self._dests
        for position, array in enumerate(dests):
            d[position] = ffi.cast("uint8_t *", array.__array_interface__["data"][0])
        idx = (ffi.cast("uint64_t *", indices.__array_interface__["data"][0])
               if indices is not None else ffi.NULL)
        src = (ffi.cast("uint16_t *", sources.__array_interface__["data"][0])
               if sources is not None else ffi.NULL)
        _lib.check(lib.lx_loader_submit(self.handle, step, d, idx, src), None, "DataLoader")

    def wait(self, step: int) -> Tuple[Optional[BaseException], List[Optional[np.ndarray]]]:
        """Blocks (GIL released) until ``step`` is built: (its error, the new
        buffers of its variable columns, owned by the arrays)."""
        with self._users_changed:
            if self._closed:
                return LoaderClosedError("DataLoader is closed"), []
            self._users += 1
        failed_out = ffi.new("uint32_t *")
        buffers = ffi.new("uint8_t *[]", self._width)
        lengths = ffi.new("uint64_t[]", self._width)
        try:
            rc = lib.lx_loader_wait(self.handle, step, failed_out, buffers, lengths)
            if rc == _lib.LX_OK:
                return None, [_records.owned_buffer(buffers[c], lengths[c])
                              if col.kind != "dense" else None
                              for c, col in enumerate(self.columns)]
            failed = failed_out[0]
            col = self.columns[failed] if failed < len(self.columns) else None
            error = _lib.error_for(rc, col.path if col is not None else None, "gather")
        finally:
            with self._users_changed:
                self._users -= 1
                self._users_changed.notify_all()
        if hasattr(error, "add_note"):
            column = f" (stream {col.name!r})" if col is not None else ""
            error.add_note("(loaderx: raised by the native prefetch ring "
                           f"building step {step}{column})")
        return error, []

    def reset(self, base: Any) -> None:
        """Continue at `base` (a `loaderx._state.Base`). Caller holds the
        engine's lock and has checked it is not closed."""
        cursors = ffi.NULL
        if base.cursors is not None:
            cursors = ffi.new("lx_cursor_t[]", [
                {"cycle": c[0], "offset": c[1], "steps_left": c[2]} for c in base.cursors])
        _lib.check(lib.lx_loader_reset(self.handle, base.step, base.position, cursors),
                   None, "DataLoader")

    def close(self) -> None:
        """Stop the threads, wait for every waiter to leave, free the ring."""
        with self._users_changed:
            if self._closed:
                return
            self._closed = True
        lib.lx_loader_stop(self.handle)  # wakes every waiter with "closed"
        with self._users_changed:
            while self._users:
                self._users_changed.wait()
        ffi.release(self.handle)


def decode_variable(col: Column, buf: np.ndarray, sizes: np.ndarray, indices: np.ndarray,
                    packed: bool) -> Any:
    """A variable column's batch from the ring's buffer and sizes."""
    n = len(indices)
    raw, aux = sizes[:n], sizes[n:]
    if col.kind == "bytes":
        return _records.to_bytes(buf, raw)
    ragged = _records.Ragged(buf, raw, aux, col.dtype, indices, col.path)
    return ragged.to_packed(indices) if packed else ragged.to_list()


def python_column(col: Column, indices: np.ndarray, sources: Optional[np.ndarray],
                  out: Optional[np.ndarray], gather_kwargs: Dict[str, Any],
                  packed: bool = False) -> Any:
    """A Python column's batch: each source's stream gathered at its records'
    indices, put back in the batch's order (``packed``: a ragged column as
    ``(values, row_splits)``, as the ring gives a store's)."""
    result = _python_records(col, indices, sources, out, gather_kwargs)
    if packed and col.kind == "ragged":
        return pack_records(col, result, indices)
    return result


def pack_records(col: Column, records: List[Any], indices: np.ndarray) -> Any:
    """A list of ragged records as ``(values, row_splits)``; the records must
    share their trailing dimensions (as for ``RaggedStore.gather_packed``)."""
    arrays = [np.asarray(record) for record in records]
    try:
        trailing = _records._common_trailing(indices, [a.shape for a in arrays])
    except ValueError as exc:
        raise ValueError(f"stream {col.name!r} (ragged='packed'): {exc}") from None
    row_splits = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.shape[0] for a in arrays], out=row_splits[1:])
    values = np.concatenate(arrays) if arrays else np.empty((0,) + trailing, col.dtype)
    return values.astype(col.dtype, copy=False), row_splits


def _python_records(col: Column, indices: np.ndarray, sources: Optional[np.ndarray],
                    out: Optional[np.ndarray], gather_kwargs: Dict[str, Any]) -> Any:
    def gather(stream, idx, out=None):
        kw = gather_kwargs if callable(getattr(stream, "__loaderx_parts__", None)) else {}
        if col.kind == "dense":
            return stream.gather(idx, out=out, **kw)
        return stream.gather(idx, **kw)
    if sources is None or len(col.streams) == 1:
        return gather(col.streams[0], indices.view(np.int64), out)
    result: Any = out if (col.kind == "dense" and out is not None) else (
        np.empty((len(indices),) + col.dense_shape, col.dtype) if col.kind == "dense"
        else [None] * len(indices))
    for k, stream in enumerate(col.streams):
        rows = np.flatnonzero(sources == k)
        if len(rows) == 0:
            continue
        got = gather(stream, indices[rows].view(np.int64))
        if col.kind == "dense":
            result[rows] = got
        else:
            for row, record in zip(rows.tolist(), got):
                result[row] = record
    return result
