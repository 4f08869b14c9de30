"""`ShardSet`: several stores of one type identity read as one index space.

A dataset written in parallel (``loaderx.convert(..., workers=N)``, the Ray
writer) ends up as one shard store per worker and column. A ``ShardSet`` puts
the shards of a column back together: record ``i`` of the set is record
``i - offset[k]`` of shard ``k``, in the order the shards were given, and every
read form behaves exactly like one store of that kind (``DenseStore``,
``RaggedStore`` or ``Zrecord``): negative indices wrap, an index out of range
raises ``IndexError``, results come back in request order.

The index space is fixed when the set is built: it covers the records each
shard held then. Opening is O(number of shards); a gather is one native call
that splits its indices by shard (a binary search per index), holds a read on
every shard and decodes every record straight into the result, on all
cores. A ``ShardSet`` is a stream anywhere a store is: in a ``DataLoader``
(read by the loader's native threads), in a ``Mixture``. It pickles as a
reference (its shards' paths), reopened read-only.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Sequence

import numpy as np

from . import _buffers, _objstore, _openers, _records
from ._checks import check_out, is_stream
from ._lib import check
from ._store import deprecated, normalize_indices
from .errors import ClosedError, IdentityError, ZrecordMemoryError
from .streams import NativePart
from .zrecord import open_store

__all__ = ["ShardSet"]

def _open(shard: Any) -> tuple[Any, bool]:
    """An open store for `shard` (a path or a store) and whether we opened it."""
    if isinstance(shard, (str, os.PathLike)):
        return open_store(shard), True
    if not is_stream(shard):
        raise TypeError(
            f"a shard must be a store path or an open DenseStore, RaggedStore or "
            f"Zrecord, not {type(shard).__name__}"
        )
    if getattr(shard, "selection", None) is not None:
        # A ShardSet reads whole stores: over a view it read the first
        # records of the view's store, not the view's.
        raise TypeError("a shard must be a whole store, not a select view (a subset of "
                        f"{getattr(shard.base, 'path', 'its store')}): select over the "
                        "ShardSet instead, or pass the stores")
    return shard, False


def _identity(store: Any) -> tuple:
    item_shape = store.item_shape
    return (store.kind, np.dtype(store.dtype), None if item_shape is None else tuple(item_shape))


def _name(store: Any, position: int) -> str:
    path = getattr(store, "path", None)
    return f"shard {position} ({path})" if path else f"shard {position}"


def _check_identities(stores: Sequence[Any]) -> None:
    first = _identity(stores[0])
    for position, store in enumerate(stores[1:], start=1):
        ident = _identity(store)
        for field, mine, theirs in zip(("kind", "dtype", "item_shape"), first, ident):
            if mine != theirs:
                raise IdentityError(
                    f"ShardSet: {_name(stores[0], 0)} has {field}={mine} but "
                    f"{_name(store, position)} has {field}={theirs}; every shard must hold "
                    "the same kind, dtype and item_shape"
                )


def _check_native(stores: list) -> None:
    """Every shard is read natively (a store of the original loaderx 1.7,
    read in place, is not)."""
    for position, store in enumerate(stores):
        if not callable(getattr(store, "native_parts", None)):
            raise TypeError(f"ShardSet: {_name(store, position)} is not a loaderx 3 store "
                            f"({type(store).__name__}); convert it (loaderx.convert) to put it "
                            "in a ShardSet")


class ShardSet:
    """Stores of one type identity (kind, dtype, item_shape) as one index space.

    ``ShardSet(shards)``: `shards` are store paths (opened with
    ``loaderx.open_store`` and closed by ``close()``) or open stores (left open
    by ``close()``; their owner closes them). Mismatched identities are refused
    with an ``IdentityError`` naming both shards and both values.

    Reads: ``parts[i]``, ``parts[a:b]``, ``parts[int_array]``,
    ``parts[bool_mask]`` and ``parts.gather(idx, out=None, packed=False)``
    return what one store of that kind returns. ``len(parts) == sum(parts.lengths)``.
    """

    def __init__(self, shards: Sequence[Any], *, cache_dir=None, cache_limit=None,
                 storage_options=None):
        self._stores: list = []
        self._owned: list = []
        self._copied_from: str | None = None  # see content_id
        if isinstance(shards, (str, os.PathLike)) or not isinstance(shards, Sequence):
            raise TypeError(
                f"ShardSet takes a list of stores or store paths, not {type(shards).__name__}"
            )
        if not shards:
            raise ValueError("ShardSet needs at least one shard")
        try:
            with _remote_opens(shards, cache_dir, cache_limit, storage_options):
                for shard in shards:
                    store, owned = _open(shard)
                    self._stores.append(store)
                    self._owned.append(owned)
            _check_identities(self._stores)
            _check_native(self._stores)
        except BaseException:
            self.close()
            raise
        lengths = np.array([len(s) for s in self._stores], dtype=np.int64)
        self._lengths = tuple(int(n) for n in lengths)
        self._len = int(lengths.sum())
        self._kind, self._dtype, self._item_shape = _identity(self._stores[0])
        # The shards as one native index space. Holding their handles keeps
        # the parts valid even if an owner closes a shard (reads then fail
        # with ClosedError instead of touching freed memory).
        self._part_list = []
        self._part_remotes = []  # parallel: each part's remote binding, or None
        offset = 0
        for store, n in zip(self._stores, self._lengths):
            if n:  # an empty shard holds no index: no part
                for part in store.native_parts():
                    self._part_list.append((part.handle, offset + part.first))
                    self._part_remotes.append(part.remote)
            offset += n
        self._parts = _records.parts_array(self._part_list) if self._part_list else None
        self._starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        self._remote = [k for k, st in enumerate(self._stores) if getattr(st, "is_remote", False)]
        self._closed = False

    # -- identity and bookkeeping
    @property
    def shards(self) -> tuple:
        """The shard stores, in index order."""
        return tuple(self._stores)

    @property
    def lengths(self) -> tuple:
        """Records per shard (fixed when the set was built)."""
        return self._lengths

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def item_shape(self) -> tuple | None:
        """The record shape of dense shards; None for ragged and byte shards."""
        return self._item_shape

    @property
    def codec(self) -> str:
        """The shards' codec, or ``"mixed"`` when they differ."""
        codecs = {s.codec for s in self._stores}
        return codecs.pop() if len(codecs) == 1 else "mixed"

    @property
    def record_bytes(self) -> int:
        """Bytes of one dense record."""
        if self._kind != "dense":
            raise AttributeError(f"record_bytes applies to dense shards, these are {self._kind}")
        return int(self._dtype.itemsize * int(np.prod(self._item_shape, dtype=np.int64)))

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        self._check_open()
        return self._len

    def stats(self) -> dict:
        """The shards' ``stats()`` added up."""
        self._check_open()
        total: dict = {}
        for store in self._stores:
            for key, value in store.stats().items():
                total[key] = total.get(key, 0) + value
        return total

    def verify(self) -> None:
        """``verify()`` every shard (raises the first shard's error)."""
        self._check_open()
        for store in self._stores:
            store.verify()

    @property
    def is_remote(self) -> bool:
        """Whether any shard is read from object storage."""
        return bool(self._remote)

    @property
    def content_id(self) -> str | None:
        """Which records the set holds, wherever its shards' files are: the
        shards' ``content_id`` in order (the converted-from data's, when a
        dataset's manifest says so; see ``Store.content_id``); None when a
        shard has none."""
        if self._copied_from is not None:
            return self._copied_from
        ids = []
        for store in self._stores:
            cid = getattr(store, "content_id", None)
            if cid is None:
                return None
            ids.append(str(cid))
        return " + ".join(ids)

    def prefetch_size(self, indices) -> int:
        """The bytes `prefetch(indices)` brings into the cache (the shards'
        `prefetch_size` added up), for a loader's ``prefetch_bytes``."""
        self._check_open()
        idx, _ = normalize_indices(indices, self._len)
        shard = np.searchsorted(self._starts, idx.astype(np.int64), side="right") - 1
        total = 0
        for k in np.unique(shard).tolist():
            total += self._stores[k].prefetch_size(idx[shard == k].astype(np.int64)
                                                     - self._starts[k])
        return total

    def _remote_run(self, idx: np.ndarray, pin: bool) -> list:
        """Makes the remote shards' records of `idx` present and checked,
        every shard concurrently; returns [(store, token)] for `_remote_end`."""
        work = self._remote_shares(idx)

        def one(item):
            store, local = item
            if pin:
                store.prefetch(local)
                return store, None
            return store, store._remote_begin(local.astype(np.uint64))
        if len(work) <= 1:
            return [one(item) for item in work]
        return _openers.remote(work[0][0].path).concurrently(one, work)

    def _remote_shares(self, idx: np.ndarray) -> list:
        """[(store, its local record indices)] of the remote shards that hold
        records of `idx` (global indices)."""
        shard = np.searchsorted(self._starts, idx.astype(np.int64), side="right") - 1
        shares = []
        for k in self._remote:
            mine = idx[shard == k]
            if len(mine):
                shares.append((self._stores[k], mine.astype(np.int64) - self._starts[k]))
        return shares

    def _remote_begin(self, idx: np.ndarray) -> list | None:
        return self._remote_run(idx, pin=False) if self._remote and len(idx) else None

    @staticmethod
    def _remote_end(tokens: list | None) -> None:
        for store, token in tokens or ():
            store._remote_end(token)

    # -- reads
    def native_parts(self) -> list:
        """The shards as native parts (the stream protocol, ``loaderx.streams``)."""
        self._check_open()
        return [NativePart(handle, first, None, remote)
                for (handle, first), remote in zip(self._part_list, self._part_remotes)]

    def __getitems__(self, indices) -> Any:
        """``gather(indices)``: a batch in one call (the original loaderx's
        batch-read protocol, and torch's DataLoader's)."""
        return self.gather(indices)

    def gather(self, indices, out: np.ndarray | None = None, *, packed: bool = False,
               threads: int = 0):
        """Records `indices` in request order, as one store of the shards'
        kind gives them (``Store.gather``): a ``(B, *item_shape)`` array for
        dense shards (written into `out` when given), else a list;
        ``packed=True`` gives ``(values, row_splits)``."""
        self._check_open()
        idx, _ = normalize_indices(indices, self._len)
        if self._kind == "dense":
            batch = self._gather_dense(idx, out, threads)
            return _records.dense_packed(batch) if packed else batch
        buf, raw, aux = self._read(idx, threads)
        return _records.variable_batch(self._kind, self._dtype, buf, raw, aux, idx, None, out,
                                       packed)

    def _read(self, idx: np.ndarray, threads: int):
        if not self._part_list:  # every shard is empty: so is idx
            return np.zeros(0, np.uint8), np.zeros(0, np.uint64), np.zeros(0, np.uint64)
        tokens = self._remote_begin(idx)
        try:
            return _records.read_variable(self._parts, len(self._part_list), idx,
                                          threads, None)
        finally:
            self._remote_end(tokens)

    def _gather_dense(self, idx: np.ndarray, out: np.ndarray | None, threads: int) -> np.ndarray:
        shape = (len(idx),) + self._item_shape
        if out is None:
            try:
                out = _buffers.empty(shape, self._dtype)
            except MemoryError:
                raise ZrecordMemoryError(f"ShardSet: a batch of shape {shape} "
                                         "does not fit in memory") from None
        else:
            check_out(out, shape, self._dtype, holds="the shards hold")
        if len(idx) and self._part_list:
            tokens = self._remote_begin(idx)
            try:
                rc = _records.gather_into(self._parts, len(self._part_list), idx, out,
                                          self.record_bytes, threads, None)
            finally:
                self._remote_end(tokens)
            check(rc, None, "ShardSet gather")
        return out

    @property
    def ring_stages_prefetch(self) -> bool:
        """As ``Store.ring_stages_prefetch``: every shard is remote (a local
        one's prefetch reads it into memory) and ``prefetch`` is the library's."""
        return (len(self._remote) == len(self._stores)
                and type(self).prefetch is ShardSet.prefetch)

    def prefetch_warm(self, indices) -> bool:
        """As ``Store.prefetch_warm``, over the remote shards (False for a
        shard set with none)."""
        self._check_open()
        idx, _ = normalize_indices(indices, self._len)
        if not self._remote or not len(idx):
            return False
        return all(store.prefetch_warm(local) for store, local in self._remote_shares(idx))

    def prefetch(self, indices, *, wait: bool = True) -> None:
        """As ``Store.prefetch``: remote shards fetch their records into the
        node-local cache (all shards at once); local ones bring theirs into
        memory, in one native call."""
        self._check_open()
        idx, _ = normalize_indices(indices, self._len)
        if not len(idx):
            return
        if self._remote:
            self._remote_run(idx, pin=True)
        if self._part_list:
            _records.prefetch(self._parts, len(self._part_list), idx, wait, None)

    def gather_packed(self, indices, *, threads: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Deprecated spelling of ``gather(indices, packed=True)``."""
        deprecated("ShardSet.gather_packed(indices)", "gather(indices, packed=True)")
        return self.gather(indices, packed=True, threads=threads)

    def __getitem__(self, key):
        self._check_open()
        idx, scalar = normalize_indices(key, self._len)
        got = self.gather(idx)
        return got[0] if scalar else got

    # -- lifetime
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("ShardSet is closed")

    def close(self) -> None:
        """Close the shards this set opened from paths. Idempotent."""
        self._closed = True
        stores, owned = self._stores, self._owned
        for store, mine in zip(stores, owned):
            if mine:
                store.close()

    def __enter__(self) -> "ShardSet":
        self._check_open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        # A reference, not the data: the shards' paths, reopened read-only
        # (remote shards as the versions they opened, through their cache).
        paths = [getattr(store, "path", None) for store in self._stores]
        if any(p is None for p in paths):
            raise TypeError("this ShardSet holds shards without a path and cannot be pickled")
        if self._remote:
            return (_reopen_stores, (list(self._stores),))
        return (_reopen, (paths,))

    def __repr__(self) -> str:
        if getattr(self, "_closed", True):
            return "ShardSet(closed)"
        shape = f", item_shape={self._item_shape}" if self._kind == "dense" else ""
        return (
            f"ShardSet({len(self._stores)} shards, len={self._len}, kind={self._kind!r}, "
            f"dtype={self._dtype}{shape}, codec={self.codec!r})"
        )


def _reopen_stores(stores: list) -> "ShardSet":
    shards = ShardSet(stores)
    shards._owned = [True] * len(stores)  # reopened for this set: it closes them
    return shards


def _remote_opens(shards: Sequence[Any], cache_dir, cache_limit, storage_options):
    """A context in which the URL shards open with these settings, opened
    (their network round trips) concurrently up front."""
    urls = [os.fspath(s) for s in shards
            if isinstance(s, (str, os.PathLike)) and _objstore.is_url(os.fspath(s))]
    if not urls:
        return contextlib.nullcontext()
    opener = _openers.remote(urls[0])
    stack = contextlib.ExitStack()
    stack.enter_context(opener.settings(cache_dir, cache_limit, storage_options))
    try:
        stack.enter_context(opener.opening(_openers.bind_all(urls)))
    except BaseException:
        stack.close()
        raise
    return stack


def _reopen(paths: list) -> "ShardSet":
    shards = ShardSet(paths)  # opened from paths: the set owns (and closes) them
    for store in shards.shards:
        store.read_only()
    return shards
