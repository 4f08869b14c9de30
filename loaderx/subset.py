"""`select`: the records of a dataset that match a predicate, as views.

``loaderx.select(ds, "lang = 'en' AND quality > 0.8")`` returns ``{column:
View}`` with the dataset's columns, holding only the matching records, in
source order. `ds` is what `open_dataset` returns (or its path, or the
result of an earlier `select`); `where` is

* a SQL boolean expression over the scalar columns (comparisons,
  ``AND``/``OR``/``NOT``, ``IN``, ``BETWEEN``, ``LIKE``/``ILIKE``, ``IS
  [NOT] NULL``, arithmetic), evaluated with pyarrow.compute
  (``engine="arrow"``, see `loaderx._sql`); SQL beyond that — subqueries and
  joins against other files such as ``id IN (SELECT id FROM
  read_parquet('keep.parquet'))``, function calls, CASE — runs on DuckDB
  when it is installed (``engine="duckdb"`` forces it), as one expression
  on a connection that reads only the files the predicate names and can
  write, attach, install, load or change nothing (`loaderx._duckdb_guard`);
* a numpy bool mask (one value per record) or an array of record indices
  (any order, duplicates counted once), from any engine you like.

Bad input raises ``ValueError`` naming the problem: an unknown column, a
syntax error (with its position), a type mismatch (``label = 'x'`` on an int
column), a column that is not scalar, text that is not one expression (a
``;`` and a statement, a ``UNION`` after the condition). Whatever rows an
engine gives are checked (inside the dataset, none twice) before a
selection exists.

Only the columns a predicate names are read, as zero-copy memory maps of
their raw stores (`loaderx.columns.scalar_chunks`), in chunks on every
usable core. The result's columns are `View`s: a view maps its index space
through the sorted int64 array of selected record indices (``view.rows``),
so ``len(view)`` is the count, ``view[i]`` is record ``rows[i]`` of the
column, and a gather maps its indices with numpy and then makes one store
gather. Views are streams wherever a store is: `DataLoader` (the sampler
visits only the selected records; sharding and resume as for any dataset),
`Mixture`, the torch/JAX adapters, `select` again (which narrows the
subset). A view pickles as its column (a reference) plus the selection: the
index array, or, for more than 2**20 records, the dataset path and the
predicate, evaluated again on unpickling and checked against the
fingerprint. ``view.fingerprint`` identifies the selected records of that
dataset (its columns' paths and lengths, and a hash of the index set); the
loader's state records it, so resuming with another subset, or a subset of
a changed dataset, is refused.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from . import _duckdb_guard as guard
from . import _locks, _sql
from ._checks import path_arg
from ._lib import usable_cores
from ._objstore import is_url
from ._store import deprecated, normalize_indices
from .columns import Column, column_parts, is_scalar, scalar_chunks, store_path_of, text_chunks
from .dataset import open_dataset
from .dense import DenseStore
from .shardset import ShardSet
from .streams import NativePart, native_parts

__all__ = ["select", "View", "Selection"]

#: Selections of up to this many records pickle as their index array;
#: larger ones as the dataset path and predicate (when they have both).
PICKLE_ROWS_MAX = 1 << 20

#: A DataLoader reads a view of small fixed-size records from a compact
#: private copy of them (see `View.native_parts`) when the copy takes at most
#: this many bytes (0: never). Records larger than COMPACT_RECORD_MAX bytes
#: span cache lines and pages of their own, so scattering costs them little.
COMPACT_BYTES_MAX = 256 << 20
COMPACT_RECORD_MAX = 4096
_ENGINES = (None, "arrow", "duckdb")


# ----------------------------------------------------------------- the selection

class Selection:
    """The selected records of one dataset: a sorted, unique, read-only
    int64 array `rows` into its index space of `total` records, with what
    made it (`where`: the predicate text, or None for a mask / index array).
    `identity` names the dataset's records wherever they are (each column's
    ``content_id``, see `_identity`); `legacy` is what loaderx 3.0 named
    them by (the columns' paths and lengths), accepted from old checkpoints."""

    def __init__(self, rows: np.ndarray, total: int, *, where: Optional[str], dataset: str,
                 identity: str, source: Optional[str] = None, engine: Optional[str] = None,
                 legacy: Optional[str] = None):
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        rows.flags.writeable = False
        self.rows = rows
        self.total = int(total)
        self.where = where
        self.dataset = dataset  # for people: the dataset directory or a column's path
        self.identity = identity  # the columns' content, wherever they are
        self.legacy = legacy  # the columns' paths and lengths (3.0's fingerprints)
        self.source = source  # the dataset directory, if it came from one
        self.engine = engine
        self._fingerprint: Optional[str] = None

    @property
    def fingerprint(self) -> str:
        """``subset of K of N records (columns ...): data blake2b:D, rows
        blake2b:R``: D names the dataset's records (its columns' content
        ids: kinds, dtypes, shapes, lengths and each store's id, which a copy
        of its files keeps), R the index set. No path: a checkpoint taken
        on ``s3://...`` resumes on a copy anywhere; another dataset or
        another subset differs in D or R."""
        if self._fingerprint is None:
            data = hashlib.blake2b(self.identity.encode(), digest_size=12).hexdigest()
            rows = hashlib.blake2b(self.rows.astype("<i8", copy=False).tobytes(),
                                   digest_size=12).hexdigest()
            columns = self.identity.split("\n", 1)[0]
            self._fingerprint = (f"subset of {len(self.rows):,} of {self.total:,} records "
                                 f"({columns}): data blake2b:{data}, rows blake2b:{rows}")
        return self._fingerprint

    @property
    def fingerprint_aliases(self) -> Tuple[str, ...]:
        """Older spellings of `fingerprint` a checkpoint may hold: loaderx
        3.0's (the dataset's path, its columns' paths and lengths), which
        still resumes where the dataset has not moved."""
        if self.legacy is None:
            return ()
        h = hashlib.blake2b(digest_size=12)
        h.update(self.legacy.encode())
        h.update(self.rows.astype("<i8", copy=False).tobytes())
        return (f"subset of {self.dataset}: {len(self.rows):,} of {self.total:,} records, "
                f"blake2b:{h.hexdigest()}",)

    def describe(self) -> str:
        how = f"where {self.where}" if self.where is not None else "by index"
        return f"{len(self.rows):,} of {self.total:,} records of {self.dataset} {how}"

    def __reduce__(self):
        if self.where is not None and self.source is not None and len(self.rows) > PICKLE_ROWS_MAX:
            return (_reselect, (self.source, self.where, self.engine, self.fingerprint))
        return (_restore, (self.rows, self.total, self.where, self.dataset, self.identity,
                           self.source, self.engine, self.legacy))


def _restore(rows, total, where, dataset, identity, source, engine, legacy=None) -> Selection:
    return Selection(rows, total, where=where, dataset=dataset, identity=identity, source=source,
                     engine=engine, legacy=legacy)


def _reselect(source: str, where: str, engine: Optional[str], fingerprint: str) -> Selection:
    """A pickled selection, evaluated again on its dataset; the same records or an error."""
    opened = open_dataset(source)
    try:
        selection = _select(opened, where, engine, source)[1]
    finally:
        for stream in opened.values():
            stream.close()
    if fingerprint not in (selection.fingerprint,) + selection.fingerprint_aliases:
        raise ValueError(f"the subset {where!r} of {source} no longer selects the records it "
                         f"did when it was pickled: it was {fingerprint}, it is now "
                         f"{selection.fingerprint} (the dataset, or a file the predicate "
                         "reads, changed)")
    return selection


# ----------------------------------------------------------------- views

def _room_for(nbytes: int) -> Optional[str]:
    """Where a view's compact copy of `nbytes` goes: shared memory
    (/dev/shm) when it has room to spare, else the temporary directory,
    else nowhere (None). Room to spare is twice the copy plus 64 MiB: other
    programs share /dev/shm (torch's worker processes pass tensors through
    it, and a container's is often 64 MiB), and a copy must never fill it."""
    for where in ("/dev/shm", tempfile.gettempdir()):
        try:
            free = shutil.disk_usage(where).free
        except OSError:
            continue
        if os.path.isdir(where) and free >= 2 * nbytes + (64 << 20):
            return where
    return None


#: A store's writes, which a view does not pass on to its base.
_BASE_WRITES = frozenset({"append", "append_packed", "delete", "compact", "sync", "keep_rows",
                          "read_only"})
#: The name of a compact copy's directory begins with this (see `_sweep_compact_copies`).
_COPY_PREFIX = "loaderx-view-"
#: A compact copy is written in appends of about this many bytes.
COMPACT_APPEND_BYTES = 16 << 20


def _write_compact(base: Any, rows: np.ndarray, first: np.ndarray, shape: tuple, record: int,
                   where: str) -> Any:
    """The records `rows` of `base` (`first`: the first of them, read
    already) as a raw DenseStore made in the directory `where`, open for
    reading. On POSIX the directory is removed as soon as the store is
    open (its first append opens every file and takes the writer lock;
    later appends and every read go through those descriptors), so the
    rest of the copy is written nameless: a process killed while it
    copies leaves nothing behind, and the memory goes with the handle."""
    copy = DenseStore(os.path.join(where, "records"), base.dtype, shape, codec="raw")
    try:
        copy.append(first)
        if os.name == "posix":
            shutil.rmtree(where)
        step = max(1, COMPACT_APPEND_BYTES // record)
        for start in range(1, len(rows), step):
            copy.append(base.gather(rows[start:start + step]))
    except BaseException:
        copy.close()
        raise
    return copy


def _sweep_compact_copies(room: str) -> None:
    """Removes the compact copies in `room` whose builder died in the
    instant between making the directory and removing it (their owner
    file's lock is free, see `loaderx._locks`): a copy is nameless the rest
    of its life, so nothing else of it can be left behind."""
    try:
        names = [n for n in os.listdir(room) if n.startswith(_COPY_PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(room, name)
        if _locks.abandoned(path):
            shutil.rmtree(path, ignore_errors=True)


class View:
    """One column of a `select` result: the column's records at
    ``rows`` (see the module docs). Reads like the column: ``len``,
    ``view[i]``, ``view[a:b]``, ``view[idx]``, ``gather(idx, out=None)``."""

    def __init__(self, base: Any, selection: Selection, name: str = "", owned: bool = False):
        self._base = base
        self._selection = selection
        self._name = name
        self._owned = owned
        self._u64: Optional[np.ndarray] = None
        self._compact: Any = None  # the compact copy: None (not decided), False (none) or a store
        self._compact_lock = threading.Lock()

    # -- identity
    @property
    def base(self) -> Any:
        """The column this view selects from (a store, ShardSet or Column)."""
        return self._base

    @property
    def selection(self) -> Selection:
        return self._selection

    @property
    def rows(self) -> np.ndarray:
        """The selected record indices of the column (sorted, read-only int64)."""
        return self._selection.rows

    @property
    def where(self) -> Optional[str]:
        return self._selection.where

    @property
    def fingerprint(self) -> str:
        return self._selection.fingerprint

    @property
    def fingerprint_aliases(self) -> Tuple[str, ...]:
        return self._selection.fingerprint_aliases

    @property
    def kind(self) -> str:
        return self._base.kind

    @property
    def dtype(self) -> np.dtype:
        return self._base.dtype

    @property
    def item_shape(self) -> Any:
        return self._base.item_shape

    @property
    def valid(self) -> Optional["View"]:
        """The validity mask of a nullable column, as a view of the same records."""
        mask = getattr(self._base, "valid", None)
        return View(mask, self._selection, f"{self._name}.valid") if mask is not None else None

    def __len__(self) -> int:
        return len(self._selection.rows)

    # -- reads
    def _mapped(self, indices) -> np.ndarray:
        rows = self._selection.rows
        if type(indices) is np.ndarray and indices.ndim == 1 and indices.dtype == np.int64:
            # The loader's path (a sampler's batch): numpy checks the bounds.
            try:
                return rows.take(indices)
            except IndexError:
                pass  # the slow path names the bad index
        idx, _ = normalize_indices(indices, len(self))
        return rows[idx]

    def __getitems__(self, indices) -> Any:
        """``gather(indices)``: a batch in one call (the original loaderx's
        batch-read protocol, and torch's DataLoader's)."""
        return self.gather(indices)

    def gather(self, indices, out: Optional[np.ndarray] = None, *, packed: bool = False,
               threads: int = 0) -> Any:
        """Records `indices` of this view: the base column's records
        ``rows[indices]``, in one gather of the base (``out=`` and
        ``packed=`` as the base takes them, see ``Store.gather``)."""
        mapped = self._mapped(indices)
        kw: Dict[str, Any] = {"threads": threads} if threads else {}
        if packed:
            kw["packed"] = True
        if out is not None:
            kw["out"] = out
        return self._base.gather(mapped, **kw)

    def gather_packed(self, indices, *, threads: int = 0) -> Tuple[np.ndarray, np.ndarray]:
        """Deprecated spelling of ``gather(indices, packed=True)``."""
        deprecated("View.gather_packed(indices)", "gather(indices, packed=True)")
        return self.gather(indices, packed=True, threads=threads)

    def prefetch(self, indices) -> None:
        """The stream protocol's ``prefetch``: the base column's records
        ``rows[indices]`` made ready to read (a remote column fetches them
        into its cache; the DataLoader reads a view natively only after
        this). A base without ``prefetch`` needs none."""
        hook = getattr(self._base, "prefetch", None)
        if callable(hook):
            hook(self._mapped(indices))

    @property
    def ring_stages_prefetch(self) -> bool:
        """As ``Store.ring_stages_prefetch``, when the base column's is."""
        return (type(self).prefetch is View.prefetch
                and getattr(self._base, "ring_stages_prefetch", False) is True)

    def prefetch_warm(self, indices) -> bool:
        """The stream protocol's ``prefetch_warm``, of the base column's
        records ``rows[indices]`` (False when the base has none)."""
        warm = getattr(self._base, "prefetch_warm", None)
        return bool(warm(self._mapped(indices))) if callable(warm) else False

    @property
    def is_remote(self) -> bool:
        """The base column's records are remote (fetched by ``prefetch``)."""
        return bool(getattr(self._base, "is_remote", False))

    def prefetch_size(self, indices) -> int:
        """The bytes ``prefetch(indices)`` brings in (the loader's
        ``prefetch_bytes`` budget), as the base column counts them."""
        size = getattr(self._base, "prefetch_size", None)
        mapped = self._mapped(indices)
        if callable(size):
            return int(size(mapped))
        if self.kind == "dense":
            return len(mapped) * int(self._base.dtype.itemsize
                                     * int(np.prod(self._base.item_shape, dtype=np.int64)))
        raise TypeError(f"column {self._name!r} cannot say what a prefetch of it costs")

    def __getitem__(self, key):
        idx, scalar = normalize_indices(key, len(self))
        got = self.gather(idx)
        return got[0] if scalar else got

    @property
    def native_parts(self) -> Any:
        """The stream protocol's ``native_parts()``: each store of the base
        column that holds selected records, with the selected records of it
        (``rows``: sorted uint64 local indices), so the DataLoader's native
        ring reads the view with no Python in between. Absent (``hasattr`` is
        False) where a native read would not give the column's records as
        they are (text, a list column with nulls): those are read by Python."""
        if not callable(getattr(self._base, "native_parts", None)):
            raise AttributeError(f"column {self._name!r} is read by Python, not natively")
        return self._native_parts

    def _native_parts(self) -> List[NativePart]:
        compact = self._compact_copy()
        if compact is not None:
            return compact.native_parts()
        base = native_parts(self._base)
        assert base is not None  # checked by the property
        if self._u64 is None:
            self._u64 = self._selection.rows.astype(np.uint64)
        rows = self._u64
        firsts = [part.first for part in base] + [len(self._base)]
        out = []
        for part, end in zip(base, firsts[1:]):
            a = int(np.searchsorted(rows, part.first))
            b = int(np.searchsorted(rows, end))
            if b > a:
                local = rows[a:b] - np.uint64(part.first)
                if part.rows is not None:  # the base part selects records itself
                    local = np.asarray(part.rows, np.uint64)[local]
                out.append(NativePart(part.handle, a, np.ascontiguousarray(local), part.remote))
        return out

    def _compact_copy(self) -> Any:
        """The selected records as one raw store of their own, made once per
        view for the DataLoader's native reads, or None where it does not
        pay. A view's records are scattered over its base: a 10% subset of
        2 M records of 72 B spans ten times the memory a dataset of its size
        does, and random batches of it miss caches and the TLB ten times as
        often (the loader ran at 0.56x such a dataset; 0.94x for the same
        view when its records were contiguous). So a local dense base with
        records of at most COMPACT_RECORD_MAX bytes, when the copy takes at
        most COMPACT_BYTES_MAX bytes and half the base's records, is copied
        (decoded, raw) into a private store in shared memory (/dev/shm where
        there is one) that is unlinked once open (before its second append:
        a process killed while it copies leaves nothing behind, see
        `_write_compact`): the memory goes with the view. The copy holds
        the records the view selected when it was made; like the view's
        rows (docs/select.md), it does not follow a later `delete` or
        `compact` of the store. Any thread may ask (one builds it,
        under a lock). Nothing closes it: the view and every loader reading
        it hold its handle, and the last to let go frees it (`close()` of the
        view only lets go, so a running loader keeps reading). A forked
        child shares the parent's (read-only) mapping; a pickled view makes
        its own."""
        if self._compact is None:
            with self._compact_lock:
                if self._compact is None:
                    self._compact = self._build_compact() or False
        return self._compact or None

    def _build_compact(self) -> Any:
        base, rows = self._base, self._selection.rows
        if not isinstance(base, (DenseStore, ShardSet)) or base.kind != "dense" or base.is_remote:
            return None
        shape = tuple(base.item_shape or ())  # dense: a tuple (() for scalars)
        record = int(base.dtype.itemsize * int(np.prod(shape, dtype=np.int64)))
        if not (0 < record <= COMPACT_RECORD_MAX and 2 * len(rows) <= len(base)
                and 0 < len(rows) * record <= COMPACT_BYTES_MAX):
            return None
        room = _room_for(len(rows) * record)
        if room is None:
            return None  # no room for it: the view is read from its base
        _sweep_compact_copies(room)
        try:
            first = base.gather(rows[:1])  # nothing on disk yet while the base is read
            where = tempfile.mkdtemp(prefix=_COPY_PREFIX, dir=room)
        except OSError:
            return None
        owner = None
        store = None
        try:
            owner = _locks.own(where)  # a sweep leaves the copy alone while this builds it
            store = _write_compact(base, rows, first, shape, record, where)
        except OSError:
            pass  # no room after all: the view is read from its base
        finally:
            if owner is not None:
                os.close(owner)
            # On every way out (an error, Ctrl-C) the files go (on POSIX
            # they went once the copy was open, see _write_compact).
            if store is None or os.name == "posix":
                shutil.rmtree(where, ignore_errors=True)
        if store is not None and os.name != "posix":
            weakref.finalize(store, shutil.rmtree, where, True)
        assert store is None or len(store) == len(rows)
        return store

    def __getattr__(self, attr: str) -> Any:
        # What the column says about its records (categories, text, path,
        # codec, ...) is the column's. Read protocols are never the base's:
        # a native read of the base would read every record, not these.
        if attr.startswith("_") or attr in ("native_parts", "native_windows", "shards", "lengths",
                                             "prefetch", "prefetch_size"):
            raise AttributeError(attr)
        if attr in _BASE_WRITES:
            # The base's would act on the base's indices, not the view's.
            raise AttributeError(f"a select view is read-only: it has no {attr} (its rows were "
                                 "chosen when it was made; select again for other rows)")
        return getattr(self._base, attr)

    def close(self) -> None:
        """Closes the column if `select` opened it (from a path), and lets go
        of the view's compact copy if a DataLoader made one: a loader still
        reading it keeps it (its native parts hold the handle) and it is
        freed with the last of them, as a view that does not own its column
        never stopped a running loader."""
        with self._compact_lock:
            self._compact = None
        if self._owned:
            self._base.close()

    def __reduce__(self):
        return (View, (self._base, self._selection, self._name))

    def __repr__(self) -> str:
        return f"View({self._name!r}: {self._selection.describe()})"


# ----------------------------------------------------------------- select

def select(dataset: Any, where: Any, *, engine: Optional[str] = None) -> Dict[str, View]:
    """The records of `dataset` where `where` holds, as ``{column: View}``
    (see the module docs). `engine`: None (pyarrow.compute, DuckDB for SQL
    beyond the subset when installed), ``"arrow"`` or ``"duckdb"``."""
    if engine not in _ENGINES:
        raise ValueError(f"engine must be None, 'arrow' or 'duckdb', got {engine!r}")
    owned = False
    source = None
    if isinstance(dataset, (str, bytes, os.PathLike)):
        source = _located(path_arg(dataset, "dataset path"))
        dataset = open_dataset(source)
        owned = True
    try:
        bases, selection = _select(dataset, where, engine, source)
    except BaseException:
        if owned:
            for stream in dataset.values():
                stream.close()
        raise
    return {name: View(base, selection, name, owned) for name, base in bases.items()}


def _select(dataset: Any, where: Any, engine: Optional[str],
            source: Optional[str]) -> Tuple[Dict[str, Any], Selection]:
    bases, prior = _bases(dataset)
    first = next(iter(bases.values()))
    total = len(first)
    space = len(prior.rows) if prior is not None else total
    if isinstance(where, str):
        local, used = _sql_rows(bases, prior, where, engine, space)
    else:
        local, used = _given_rows(where, space), None
    local = _checked_rows(local, space, where)
    rows = prior.rows[local] if prior is not None else local
    text = where if isinstance(where, str) else None
    if prior is not None and prior.where is not None and text is not None:
        text = f"({prior.where}) AND ({text})"
    elif prior is not None:
        text = None
    dataset_name, identity, legacy = _identity(bases)
    if prior is not None:
        source = source or prior.source
    source = source or store_path_of(first)
    return bases, Selection(rows, total, where=text, dataset=dataset_name, identity=identity,
                            source=source if text is not None else None, engine=used,
                            legacy=legacy)


def _bases(dataset: Any) -> Tuple[Dict[str, Any], Optional[Selection]]:
    """The columns to select from, and the selection they already are (views)."""
    if not isinstance(dataset, Mapping) or not dataset:
        raise TypeError("select takes a dataset: a non-empty dict of column -> store "
                        f"(open_dataset's result) or its path, not {type(dataset).__name__}")
    if all(isinstance(v, Mapping) for v in dataset.values()):
        raise TypeError(f"this dataset holds splits {list(dataset)}; select from one split "
                        f"(ds[{next(iter(dataset))!r}])")
    views = [v for v in dataset.values() if isinstance(v, View)]
    if views and len(views) != len(dataset):
        raise TypeError("select takes the columns of one dataset or of one earlier select, "
                        "not a mix of views and stores")
    selections = {id(v.selection) for v in views}
    if len(selections) > 1:
        raise TypeError("these views come from different selects; select from one of them")
    for name, stream in dataset.items():
        if not callable(getattr(stream, "gather", None)) or not hasattr(stream, "kind"):
            raise TypeError(f"column {name!r} is a {type(stream).__name__}, not a loaderx "
                            "stream")
    if views:
        return {n: v.base for n, v in dataset.items()}, views[0].selection
    lengths = {n: len(s) for n, s in dataset.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"the columns have different lengths: {lengths}")
    return dict(dataset), None


def _identity(bases: Dict[str, Any]) -> Tuple[str, str, str]:
    """(the dataset for people, the columns' content for the fingerprint,
    loaderx 3.0's identity: the columns' paths and lengths). The content is
    a first line naming the columns, then a line per column: its
    ``content_id`` (see ``Store.content_id``), or, for a column of stores
    without one (written before stores had an id), its absolute paths and
    lengths as before."""
    content, legacy = [], []
    for name, base in bases.items():
        stores = column_parts(base)
        paths = [_located(getattr(s, "path", "") or "") for s in stores]
        place = f"{paths}:{[len(s) for s in stores]}"
        legacy.append(f"{name}={place}")
        stream = base.stream if isinstance(base, Column) else base
        content.append(f"{name}={getattr(stream, 'content_id', None) or place}")
    first = next(iter(bases.values()))
    root = store_path_of(first)
    if root is None:
        path = getattr(column_parts(first)[0], "path", None)
        root = _located(path) if path else "an in-memory dataset"
    columns = f"columns {', '.join(map(str, bases))}"
    return root, "\n".join([columns] + content), ";".join(legacy)


def _located(path: Any) -> str:
    """A dataset's or store's path made absolute; a URL as it is."""
    path = os.fspath(path)
    return path if is_url(path) else os.path.abspath(path)


def _given_rows(where: Any, space: int) -> np.ndarray:
    """The indices a mask or an index array selects, sorted and unique."""
    if where is None:
        raise TypeError("select needs a predicate: a SQL string, a bool mask or indices")
    arr = np.asarray(where)
    if arr.dtype == np.bool_:
        if arr.shape != (space,):
            raise ValueError(f"the mask has shape {arr.shape}; the dataset has {space} records")
        return np.flatnonzero(arr).astype(np.int64)
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        raise TypeError("select takes a SQL string, a bool mask or a 1-D array of record "
                        f"indices, not {arr.dtype} of shape {arr.shape}")
    idx, _ = normalize_indices(arr, space)
    return _sorted_unique(idx.astype(np.int64))


def _checked_rows(rows: Any, space: int, where: Any) -> np.ndarray:
    """The rows an engine found, as a selection holds them (sorted int64),
    once they are rows at all: integers, each in ``0 <= r < space``, none
    twice. Every engine's answer passes here before a Selection exists:
    an engine (a DuckDB query above all) that answers with rows of its own
    making must not make a view read another record, or one twice."""
    what = f"the predicate {where!r}" if isinstance(where, str) else "the mask or index array"
    rows = np.asarray(rows)
    if rows.ndim != 1 or (rows.size and rows.dtype.kind not in "iu"):
        raise ValueError(f"{what} gave {rows.dtype} values of shape {rows.shape}, not row "
                         "numbers")
    rows = rows.astype(np.int64, copy=False)
    if not len(rows):
        return rows
    if len(rows) > 1 and not bool(np.all(rows[1:] > rows[:-1])):
        rows = np.sort(rows)
        repeated = np.flatnonzero(rows[1:] == rows[:-1])
        if len(repeated):
            raise ValueError(f"{what} gave row {int(rows[repeated[0]])} more than once; a "
                             "selection holds each record once (a set operation such as "
                             "UNION ALL is not a condition)")
    if rows[0] < 0 or rows[-1] >= space:
        bad = int(rows[0]) if rows[0] < 0 else int(rows[-1])
        raise ValueError(f"{what} gave row {bad}, outside the {space:,} records it selects "
                         "from (a set operation such as UNION is not a condition)")
    return rows


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """Sorted, without repeats (np.unique hashes, which is slower for this)."""
    values = np.sort(values)
    if len(values) > 1:
        values = values[np.concatenate(([True], values[1:] != values[:-1]))]
    return values


# ----------------------------------------------------------------- SQL

def _infos(bases: Dict[str, Any]) -> Dict[str, _sql.ColumnInfo]:
    infos = {}
    for name, base in bases.items():
        infos[name] = column_info(name, base)
    return infos


def column_info(name: str, base: Any) -> _sql.ColumnInfo:
    """What a predicate can know of column `name` (its SQL type, dtype, nulls,
    categories); `loaderx info` lists the same."""
    dtype = np.dtype(getattr(base, "dtype", np.uint8))
    if isinstance(base, Column) and base.text:
        return _sql.ColumnInfo(name, "string", dtype, nullable=base.valid is not None,
                               describe="strings")
    if not is_scalar(base):
        shape = list(base.item_shape) if base.kind == "dense" else ""
        return _sql.ColumnInfo(name, "", dtype, describe=f"{base.kind} {dtype}{shape} records",
                               nullable=isinstance(base, Column) and base.valid is not None)
    nullable = isinstance(base, Column) and base.valid is not None
    if isinstance(base, Column) and base.categorical:
        cats = list(base.categories or [])
        kind = "string" if all(isinstance(c, str) for c in cats) else "int"
        return _sql.ColumnInfo(name, kind, dtype, categories=cats, nullable=True,
                               describe=f"categories of {kind}s")
    labels = list(base.categories) if isinstance(base, Column) and base.categories is not None \
        and not base.categorical else None
    return _sql.ColumnInfo(name, _sql.sql_type(dtype), dtype, labels=labels, nullable=nullable,
                           describe=str(dtype))


def _sql_rows(bases: Dict[str, Any], prior: Optional[Selection], where: str,
              engine: Optional[str], space: int) -> Tuple[np.ndarray, str]:
    infos = _infos(bases)
    if engine == "duckdb":
        return _duckdb_rows(bases, prior, where, space, infos), "duckdb"
    try:
        tree = _sql.parse(where)
        _sql.check(tree, infos, where)
    except _sql.NeedsDuckDB as e:
        if engine == "arrow":
            raise ValueError(f"the predicate uses {e.what}, which the arrow engine does not "
                             "evaluate; use engine='duckdb' (pip install duckdb)") from None
        if not _have_duckdb():
            raise ValueError(f"the predicate uses {e.what}, which needs DuckDB: pip install "
                             "duckdb (or write it with comparisons, AND/OR/NOT, IN, BETWEEN, "
                             "LIKE and IS NULL)") from None
        return _duckdb_rows(bases, prior, where, space, infos), "duckdb"
    _require_pyarrow()
    tree = _sql.fold_categoricals(tree, infos)
    return _arrow_rows(bases, prior, tree, where, space, infos), "arrow"


def _have_duckdb() -> bool:
    try:
        import duckdb  # noqa: F401
    except ImportError:
        return False
    return True


def _require_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ImportError("select with a SQL predicate needs pyarrow: pip install "
                          "'loaderx[convert]' (or pass a numpy bool mask or indices)") from None


def _arrow_rows(bases, prior, tree: _sql.Node, where: str, space: int, infos) -> np.ndarray:
    data = {name: _ColumnData(bases[name], infos[name], prior) for name in tree.columns()}

    def fetch(name, start, stop, how):
        return data[name].arrow(start, stop, how)

    def run(start: int) -> np.ndarray:
        stop = min(start + _sql.CHUNK_ROWS, space)
        return _sql.evaluate(tree, _sql.Chunk(start, stop, fetch)) + start

    import pyarrow as pa

    starts = list(range(0, space, _sql.CHUNK_ROWS))
    try:
        if len(starts) <= 1:
            found = [run(s) for s in starts]
        else:
            with ThreadPoolExecutor(min(usable_cores(), len(starts)), "loaderx-select") as pool:
                found = list(pool.map(run, starts))
    except (pa.ArrowException, ZeroDivisionError, OverflowError) as e:
        raise ValueError(f"evaluating the predicate {where!r}: {e}") from None
    return np.concatenate(found) if found else np.zeros(0, np.int64)


class _ColumnData:
    """One column's values for the evaluator: numpy arrays per store
    (memory-mapped), read for a range of positions of the index space
    (through the prior selection's rows when selecting from views)."""

    def __init__(self, base: Any, info: _sql.ColumnInfo, prior: Optional[Selection]):
        self.info = info
        self.rows = prior.rows if prior is not None else None
        self.text = isinstance(base, Column) and base.text
        self.valid = getattr(base, "valid", None) if isinstance(base, Column) else None
        stream = base.stream if isinstance(base, Column) else base
        # A column of records is asked only whether each is null: its mask.
        self.records = info.type == ""
        self.valid_chunks = scalar_chunks(self.valid) if self.valid is not None else None
        self.chunks: list
        if self.records:
            assert self.valid_chunks is not None  # (only a column with nulls is asked so)
            self.chunks = self.valid_chunks
        else:
            self.chunks = text_chunks(stream) if self.text else scalar_chunks(stream)
        self.starts = np.cumsum([0] + [self._length(c) for c in self.chunks])
        # A mask's parts may split the records otherwise than the values' (an
        # append that brought a column's first nulls masks the old rows in one part).
        self.valid_starts = np.cumsum([0] + [len(c) for c in self.valid_chunks]) \
            if self.valid_chunks is not None else None
        self.categories = info.categories

    def _length(self, chunk) -> int:
        return len(chunk[1]) - 1 if self.text else len(chunk)

    def _pieces(self, start: int, stop: int, starts: Optional[np.ndarray] = None):
        """(store k, local indices or a slice) covering positions start..stop,
        for stores beginning at `starts` (the values' by default)."""
        starts = self.starts if starts is None else starts
        if self.rows is None:
            k0 = int(np.searchsorted(starts, start, side="right")) - 1
            k = k0
            while start < stop:
                end = min(stop, int(starts[k + 1]))
                if end > start:
                    yield k, slice(start - int(starts[k]), end - int(starts[k]))
                start = end
                k += 1
            return
        want = self.rows[start:stop]
        shard = np.searchsorted(starts, want, side="right") - 1
        for k in np.unique(shard).tolist():
            yield k, want[shard == k] - int(starts[k])

    def numpy(self, chunks, start: int, stop: int,
              starts: Optional[np.ndarray] = None) -> np.ndarray:
        got = [chunks[k][where] for k, where in self._pieces(start, stop, starts)]
        if len(got) == 1:
            return got[0]
        return np.concatenate(got) if got else chunks[0][:0]

    def arrow(self, start: int, stop: int, how: Any) -> Any:
        import pyarrow as pa

        valid = self.numpy(self.valid_chunks, start, stop, self.valid_starts) \
            if self.valid_chunks else None
        if self.text:
            return self._strings(pa, start, stop, valid)
        if self.records:  # (a null where there is no record: IS NULL is all it is asked)
            assert valid is not None
            return pa.array(np.zeros(len(valid), np.int8), mask=~valid)
        values = self.numpy(self.chunks, start, stop)
        if self.categories is not None:
            _check_codes(values, len(self.categories), self.info.name)
        if how == "codes":
            return values
        if self.categories is not None:
            codes = pa.array(values, mask=values < 0)
            dictionary = pa.array(self.categories)
            return pa.DictionaryArray.from_arrays(codes, dictionary).dictionary_decode()
        nulls = None if valid is None else ~valid
        kind = values.dtype.kind
        if how is True and kind in "fMm":  # NaN and NaT are nulls
            missing = np.isnan(values) if kind == "f" else np.isnat(values)
            if missing.any():
                nulls = missing if nulls is None else nulls | missing
        if nulls is not None and nulls.any():
            return pa.array(values, mask=nulls)
        return pa.array(values)

    def _strings(self, pa, start: int, stop: int, valid) -> Any:
        pieces = []
        for k, where in self._pieces(start, stop):
            buf, offsets = self.chunks[k]
            whole = pa.Array.from_buffers(pa.large_string(), len(offsets) - 1,
                                          [None, pa.py_buffer(offsets), pa.py_buffer(buf)])
            pieces.append(whole[where.start:where.stop] if isinstance(where, slice)
                          else whole.take(pa.array(where)))
        arr = pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)
        if valid is not None and not valid.all():
            arr = _with_nulls(pa, arr, valid)
        return arr


def _check_codes(codes: np.ndarray, count: int, name: str) -> None:
    """A categorical's codes name one of its `count` categories, or -1 (null)."""
    if len(codes) and (int(codes.min()) < -1 or int(codes.max()) >= count):
        bad = int(codes.min()) if int(codes.min()) < -1 else int(codes.max())
        raise ValueError(f"column {name!r} holds the code {bad}, but its manifest names "
                         f"{count} categories (the column or its manifest was changed)")


def _with_nulls(pa, arr, valid: np.ndarray):
    import pyarrow.compute as pc

    return pc.if_else(pa.array(valid), arr, pa.scalar(None, arr.type))


# ----------------------------------------------------------------- DuckDB

def _duckdb_rows(bases, prior, where: str, space: int, infos) -> np.ndarray:
    try:
        import duckdb
    except ImportError:
        raise ValueError("engine='duckdb' needs DuckDB: pip install duckdb") from None
    _require_pyarrow()
    import pyarrow as pa

    named = [n for n in bases if _mentions(where, n)]
    subquery = re.search(r"\bselect\b", where, re.IGNORECASE) is not None \
        or "range" in {n.lower() for n in named}
    arrays = {}
    for name in named:
        if not infos[name].type:
            raise _sql.not_scalar(infos[name], duckdb=True)
        data = _ColumnData(bases[name], infos[name], prior)
        arrays[name] = _whole_column(pa, data, space, infos[name])
    row = "__loaderx_row"
    if subquery or not arrays:
        # A positional join is fastest for plain predicates, but a subquery
        # joined under it is slow: there, the row numbers are a column.
        arrays[row] = pa.array(np.arange(space, dtype=np.int64))
        prefix = f'SELECT "{row}" FROM data WHERE '
    else:
        prefix = f'SELECT r.range AS "{row}" FROM data POSITIONAL JOIN range({space}) r WHERE '
    try:
        found = guard.run(duckdb, pa.table(arrays), prefix, where, usable_cores())[row]
    except duckdb.Error as e:
        raise _duckdb_error(e, where, list(bases)) from None
    return np.asarray(found)


def _mentions(where: str, name: str) -> bool:
    quoted = f'"{name}"' in where or f"`{name}`" in where
    return quoted or re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", where, re.I) is not None


def _whole_column(pa, data: _ColumnData, space: int, info: _sql.ColumnInfo):
    """A column over the whole index space for DuckDB: zero-copy chunks
    where the values allow, nulls (NaN, NaT, masked) as nulls,
    categoricals as dictionaries (DuckDB reads them as strings)."""
    chunks = []
    step = _sql.CHUNK_ROWS
    for start in range(0, space, step):
        stop = min(start + step, space)
        if data.categories is not None:
            codes = data.arrow(start, stop, "codes")
            chunks.append(pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0),
                                                         pa.array(data.categories)))
        else:
            chunks.append(data.arrow(start, stop, True))
    if not chunks:
        return pa.chunked_array([], type=pa.int64())
    return pa.chunked_array(chunks)


def _duckdb_error(e: Exception, where: str, columns: List[str]) -> ValueError:
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    hint = ""
    if "Referenced column" in text or "not found in FROM clause" in text:
        hint = f"; the columns are {columns}"
    elif "Could not convert" in text or "Conversion Error" in text or "Cannot compare" in text:
        hint = " (a type mismatch: compare numbers with numbers, strings with strings)"
    elif "Permission Error" in text:
        hint = (" (a predicate reads only the existing files its string literals name, with "
                "duckdb>=1.2, and writes, attaches and loads nothing)")
    return ValueError(f"DuckDB could not evaluate the predicate {where!r}: {first}{hint}")
