"""The stream protocol: what a `DataLoader` (and a `Mixture`) can read.

A stream is any object with the four members of :class:`Stream`: ``kind``
(``"dense"``, ``"ragged"`` or ``"bytes"``), ``dtype``, ``item_shape`` (dense
streams: the shape of one record, ``()`` for scalars), ``len()`` and
``gather(indices, out=None)``. That is enough: the loader reads such a stream
on its Python worker threads, at the indices its native ring computed. A
plain numpy array is a stream too (:class:`ArrayStream` wraps it: a dense,
in-memory, read-only stream of its rows), and so is a stream written for the
original loaderx 1.7: ``__len__`` and ``__getitems__(indices)``
(:class:`GetitemsStream` wraps it).

Optional capabilities, each found by ``getattr`` (nothing to inherit):

``native_parts() -> list[NativePart]``
    The stream is read by the native ring, with no Python in between.
    :class:`NativePart` is ``(handle, first, rows)``: ``handle`` an open
    store's native handle (cffi ``lx_store *``; the stream keeps it valid
    while it is open), ``first`` the stream index of the part's first record,
    ``rows`` ``None`` (the part's records are its store's records ``0..len``)
    or a C-contiguous sorted ``np.uint64`` array: stream index ``first + i``
    reads store record ``rows[i]`` (a selected subset). Parts are sorted by
    ``first`` from 0; a part ends where the next one begins. Stores and
    ShardSets return ``rows=None`` parts. The loader keeps the handles and
    rows arrays referenced while its ring runs. A fourth field, ``remote``,
    is the library's own: the remote binding of a store read from object
    storage (None otherwise), whose records the ring brings into the
    node-local cache itself before it reads them.

``native_windows() -> (list[NativePart], lx_windows_t spec, segments: bool)``
    Token windows read natively: the corpus's document parts (``rows`` must
    be ``None``), the window index (a cffi ``lx_windows_t *`` whose prefix
    sums the stream keeps alive), and whether the stream gives the windows'
    document ordinals (int32) rather than their tokens. ``TokenWindows`` and
    its ``segments`` implement it.

``prefetch(indices: np.ndarray) -> None``
    Called by the loader for each step's indices of this stream (a uint64
    array of ``batch_size`` record indices of this stream, in batch order;
    for a ``Mixture``, only the records drawn from this source) *before*
    that step is handed to the native ring, on one loader-owned thread
    (``loaderx-prefetch``), in step order, for the steps of the loader's
    window (at most ``prefetch + workers`` steps ahead of the consumer). It
    returns once every record at ``indices`` can be read natively (a remote
    dataset fetches them into its node-local cache; a local store may issue
    readahead); the ring builds the step only after it returned. If it
    raises, that step fails with that exception, raised by the ``next()``
    that would have returned it, like a gather error. It must be
    thread-safe (the same stream may sit in several loaders), idempotent
    (a step may be prefetched again after ``load_state_dict`` or an
    interrupted ``next()``), and must not assume it is called for every step
    (a reset skips steps) or that a prefetched step is ever read. It is not
    called for a loader with ``workers`` built before the stream was given
    it, nor after ``close()``; a call in progress at ``close()`` is waited
    for. ``indices`` is the loader's array: copy it to keep it. With
    ``DataLoader(prefetch_bytes=N)`` the hooks of the steps prefetched and
    not yet delivered stay within about N bytes (see ``prefetch_size``).
    A stream whose ``is_remote`` attribute is ``False`` is not prefetched
    by the loader: loaderx's own local stores, views and token windows
    have a ``prefetch`` for callers, but the native ring reads their
    records itself, cold ones at the device's queue depth, and a Python
    call per step cost more than it saved (4-9x fewer steps per second on
    warm 200-byte records, raw or zstd: CHANGELOG.md, 2026-12-03).

``prefetch_warm(indices: np.ndarray) -> bool``
    A ``prefetch`` that fetches nothing: True when every record of
    `indices` is ready already (and is now kept as ``prefetch`` keeps it),
    False otherwise; it must not fetch. The loader calls it once for a run
    of several steps (their indices laid end to end: half its window to all
    of it) on its prefetch thread, and calls ``prefetch`` per step only when
    it returns False or raises, so a warm epoch costs one call per run and
    a cold step is released as soon as its own fetch is done. Thread-safe,
    as ``prefetch`` is; ``indices`` is the loader's array (copy it to keep
    it). Not with ``prefetch_bytes``. loaderx's remote stores, views, shard
    sets and token windows have it (one native call; what it keeps is kept
    as ``prefetch`` keeps it: from eviction, for the process's next 128
    prefetches).

``prefetch_size(indices: np.ndarray) -> int``
    The bytes a ``prefetch(indices)`` call fetches (e.g. the records'
    stored sizes), for ``prefetch_bytes``. Without it, a dense stream's
    step counts record size times records; a ragged or bytes stream with a
    ``prefetch`` hook needs it when ``prefetch_bytes`` is given.

``fingerprint`` (attribute or property, ``str``)
    Identifies the record set (a subset's index set and the content of the
    dataset it came from, never where that is), for checkpoints that must
    not resume on other records.

``fingerprint_aliases`` (attribute or property, a tuple of ``str``)
    Older spellings of ``fingerprint`` for the same records, which a
    checkpoint may hold (a subset's loaderx 3.0.0 fingerprint named its
    dataset's path): a state holding one resumes too.
"""
from __future__ import annotations

import os
from typing import (Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Protocol, Tuple,
                    runtime_checkable)

import numpy as np

from ._checks import KINDS, is_int, is_stream  # noqa: F401 (is_int: streams.is_int, older name)

__all__ = ["Stream", "NativePart", "ArrayStream", "GetitemsStream", "KINDS"]


@runtime_checkable
class Stream(Protocol):
    """Something the loader can read (see the module docs)."""

    kind: str
    dtype: np.dtype
    item_shape: Tuple[int, ...]

    def __len__(self) -> int: ...

    def gather(self, indices: Any, out: Optional[np.ndarray] = None) -> Any: ...


class NativePart(NamedTuple):
    """One part of a natively read stream (see ``native_parts``)."""

    handle: Any
    first: int
    rows: Optional[np.ndarray] = None
    #: The library's own: the remote binding (``loaderx.remote.Binding``) of
    #: a store read from object storage, whose records the ring brings into
    #: the node-local cache before it reads them; None for a local store.
    remote: Any = None


class ArrayStream:
    """A numpy array as a dense stream of its rows: in memory, read-only
    (gathers copy rows out; nothing writes the array). ``DataLoader`` and
    ``Mixture`` wrap plain arrays in it; its workers gather it in Python."""

    kind = "dense"

    def __init__(self, array: np.ndarray):
        if not isinstance(array, np.ndarray) or array.ndim == 0:
            raise TypeError(f"an ArrayStream needs a numpy array with a first axis, "
                            f"got {type(array).__name__}")
        if array.dtype.hasobject:
            raise TypeError("an ArrayStream holds numbers, not Python objects (dtype object)")
        view = array.view()
        view.flags.writeable = False  # the loader never writes the caller's array
        self._array = view
        self.dtype = array.dtype
        self.item_shape = tuple(array.shape[1:])

    def __len__(self) -> int:
        return len(self._array)

    def gather(self, indices: Any, out: Optional[np.ndarray] = None) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        if out is None:
            return self._array[idx]
        np.take(self._array, idx, axis=0, out=out)
        return out

    def __repr__(self) -> str:
        return f"ArrayStream({self.dtype}{list(self._array.shape)})"


class GetitemsStream:
    """A stream written for the original loaderx 1.7 (``__len__`` and
    ``__getitems__(indices)``, which returns a ``(B, *item_shape)`` array for
    a dense stream and a list of arrays for a ragged one), read as a loaderx
    stream: ``DataLoader`` and ``Mixture`` wrap such an object in it. Its
    kind, dtype and item shape are those of record 0, read once here; every
    later batch must match them (a dense stream's `TypeError` says which
    differs). ``__getitems__`` gets ``uint64`` indices, as 1.7 gave them."""

    def __init__(self, source: Any):
        self.source = source
        self.dtype: np.dtype = np.dtype(np.uint8)
        self.item_shape: Optional[Tuple[int, ...]] = None
        self.kind = "dense"
        if len(source) == 0:
            return  # (the loader refuses an empty stream, naming it)
        first = source.__getitems__(np.zeros(1, np.uint64))
        if isinstance(first, np.ndarray) and first.ndim >= 1:
            self.dtype, self.item_shape = first.dtype, tuple(first.shape[1:])
        elif isinstance(first, (list, tuple)) and len(first) == 1:
            record = first[0]
            self.kind = "bytes" if isinstance(record, (bytes, bytearray)) else "ragged"
            self.dtype = np.asarray(record).dtype if self.kind == "ragged" else self.dtype
        else:
            raise TypeError(f"{type(source).__name__}.__getitems__([0]) returned "
                            f"{type(first).__name__}; a loader stream gives a (B, ...) array "
                            "(dense) or a list of B records (ragged)")

    def __len__(self) -> int:
        return len(self.source)

    def gather(self, indices: Any, out: Optional[np.ndarray] = None) -> Any:
        got = self.source.__getitems__(np.asarray(indices).astype(np.uint64))
        if self.kind != "dense":
            return list(got)
        batch = np.asarray(got)
        shape = (len(indices),) + tuple(self.item_shape or ())
        if batch.dtype != self.dtype or batch.shape != shape:
            raise TypeError(f"{type(self.source).__name__}.__getitems__ returned "
                            f"{batch.dtype}{list(batch.shape)}, expected {self.dtype}"
                            f"{list(shape)} (record 0's dtype and shape)")
        if out is None:
            return batch
        out[...] = batch
        return out

    def __repr__(self) -> str:
        return f"GetitemsStream({self.source!r})"


def as_stream(value: Any) -> Any:
    """`value` as a stream: a numpy array wrapped in an ArrayStream, an
    object with only 1.7's ``__len__`` and ``__getitems__`` in a
    GetitemsStream, anything else as it is."""
    if isinstance(value, np.ndarray):
        return ArrayStream(value)
    if not is_stream(value) and callable(getattr(value, "__getitems__", None)) \
            and hasattr(value, "__len__"):
        return GetitemsStream(value)
    return value


def check_streams(streams: Any, source: Optional[str] = None) -> Dict[str, Any]:
    """A loader's streams mapping (or a `Mixture` source's, named `source`),
    checked: non-empty, string names, streams (numpy arrays wrapped) of one
    non-zero length. The one check of a dict of streams, so a loader and a
    mixture refuse the same input with the same words."""
    owner = "streams" if source is None else f"source {source!r}"
    where = "" if source is None else f"source {source!r}: "
    if not isinstance(streams, Mapping):
        raise TypeError(
            f"{owner} must be a dict of name -> store, got {type(streams).__name__}"
        )
    if not streams:
        raise ValueError(f"{owner} is empty: give at least one name -> store")
    checked = {}
    for name, stream in streams.items():
        if not isinstance(name, str):
            raise TypeError(f"{where}stream names must be str, got {name!r}")
        stream = as_stream(stream)
        if isinstance(stream, (str, os.PathLike)):
            raise TypeError(
                f"{where}stream {name!r} is the path {os.fspath(stream)!r}: open it first with "
                "loaderx.open_store(path) (a dataset: loaderx.open_dataset(path)); both take "
                "local paths and URLs"
            )
        if not is_stream(stream):
            raise TypeError(
                f"{where}stream {name!r} is not a loaderx store (needs gather() and a kind in "
                f"{KINDS}): got {type(stream).__name__}"
            )
        checked[name] = stream
    lengths = {name: len(stream) for name, stream in checked.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"{where}streams must all have the same length, got {lengths}")
    first, length = next(iter(lengths.items()))
    if length == 0:
        empty = f"stream {first!r}" if source is None else owner
        raise ValueError(f"{empty} is empty (len 0): nothing to load{empty_note(checked[first])}")
    return checked


def empty_note(stream: Any) -> str:
    """Why an empty stream is empty, when it is a `loaderx.select` subset."""
    selection = getattr(stream, "selection", None)
    describe = getattr(selection, "describe", None)
    return f" (the subset selects {describe()})" if callable(describe) else ""


def native_parts(stream: Any) -> Optional[List[NativePart]]:
    """The stream's native parts, or None when the ring cannot read it."""
    method = getattr(stream, "native_parts", None)
    if not callable(method):
        return None
    return [NativePart(*part) for part in method()]


def native_windows(stream: Any) -> Optional[Tuple[List[NativePart], Any, bool]]:
    """``(parts, spec, segments)`` of a token-window stream, or None."""
    method = getattr(stream, "native_windows", None)
    if callable(method):
        parts, spec, segments = method()
        return [NativePart(*part) for part in parts], spec, bool(segments)
    return None


def prefetch_sizer(stream: Any) -> Optional[Callable[[np.ndarray], int]]:
    """How many bytes a stream's ``prefetch`` of some indices fetches: its
    ``prefetch_size(indices)``, else record size times records for a dense
    stream; None when neither is known."""
    size = getattr(stream, "prefetch_size", None)
    if callable(size):
        return size
    if getattr(stream, "kind", None) == "dense":
        shape = tuple(getattr(stream, "item_shape", ()))
        record = int(np.dtype(stream.dtype).itemsize * np.prod(shape, dtype=np.int64))
        return lambda indices: record * len(indices)
    return None


def warm_prefetcher(stream: Any) -> Optional[Callable[[np.ndarray], Any]]:
    """The stream's ``prefetch_warm``, or None."""
    warm = getattr(stream, "prefetch_warm", None)
    return warm if callable(warm) else None


def prefetcher(stream: Any) -> Optional[Callable[[np.ndarray], None]]:
    """The stream's ``prefetch`` hook the loader calls, or None (none for a
    stream that says it is local: ``is_remote`` False, see above)."""
    hook = getattr(stream, "prefetch", None)
    if not callable(hook) or getattr(stream, "is_remote", None) is False:
        return None
    return hook
