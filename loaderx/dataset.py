"""Building and reopening stores and datasets: converters from NumPy data and
iterables, `open_store` by persisted identity, `open_dataset` for a dataset
directory (one store or `ShardSet` per column, described by ``loaderx.json``),
and `pad` for ragged batches.

Writers never append to existing data by accident: ``mode="create"`` (the
default) refuses an existing destination, ``mode="append"`` adds to it and
``mode="overwrite"`` replaces it (only if it is a loaderx store or empty).
"""
from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import warnings
from typing import Any, Callable, Iterable, Iterator, Sized

import numpy as np

from . import _locks, _objstore, _openers, _writer, identity
from ._checks import drop_source_rows, path_arg
from ._manifest import (
    MANIFEST_NAME,
    check_inside,
    col_rows,
    manifest_error,
    read_manifest,
)
from ._store import check_new_store
from .columns import wrap_columns
from .dictionary import train_dict
from .errors import (
    BusyError,
    CorruptStoreError,
    DestinationExistsError,
    DictionaryError,
    ZrecordError,
)
from .legacy import DenseDataset, RaggedDataset
from .legacy import PackedDataset as Dataset  # the original 0.9.1's (see loaderx.legacy)
from .shardset import ShardSet
from .zrecord import DenseStore, RaggedStore, open_store

__all__ = ["from_numpy", "from_iterator", "open_store", "open_dataset", "read_manifest", "pad",
           "labels", "DestinationExistsError", "MANIFEST_NAME", "write_dataset", "Dataset",
           "DenseDataset", "RaggedDataset"]

#: A dictionary trained by a writer sees at most this many bytes of records.
_DICT_SAMPLE_BYTES = 16 << 20
#: Records per append of `from_iterator` (each append is atomic).
_ITERATOR_CHUNK_RECORDS = 16384
#: Opens of a dataset that another process replaces faster than this many
#: times in a row give up with BusyError.
_OPEN_ATTEMPTS = 50


def write_dataset(path, array, codec: str = "zstd", **options) -> None:
    """The original loaderx 0.7's spelling of `from_numpy` (the store is
    closed when it returns); `options` are `from_numpy`'s."""
    from_numpy(path, array, codec=codec, **options).close()


def from_numpy(path, array, *, codec: str = "zstd", level: int | None = None,
               dict_bytes: bytes | None = None, dict_size: int | None = None,
               chunk_bytes: int = 64 << 20, progress=None, mode: str = "create") -> DenseStore:
    """Stream `array` (rows are records; an ``np.load(..., mmap_mode="r")``
    array or a path to a ``.npy`` file) into a DenseStore in chunks of about
    `chunk_bytes`, so memory stays bounded whatever the array's size. Returns
    the open store. `mode`, `codec`, `dict_size` and `progress` (counted in
    rows) are the writers' one vocabulary (`loaderx._writer`): ``mode=
    "create"`` refuses an existing store, ``"append"`` adds to it,
    ``"overwrite"`` replaces it. The whole write is one atomic append (all or
    nothing), and an overwrite builds the new store beside the old one and
    swaps it in once complete: a source that fails part-way, or Ctrl-C,
    leaves what was there as it was. A URL
    `path` (``s3://``, ``gs://``, ``az://``) builds the store locally,
    uploads it and returns it opened from there (read-only; ``"append"`` is
    refused: append to a dataset instead).

    ``codec="zstd_dict"`` without `dict_bytes` trains the dictionary here, as
    the original loaderx did: from up to 16 MiB of rows drawn at random with a
    fixed seed (the same array gives the same dictionary), at most `dict_size`
    bytes (default 128 KiB, `train_dict`'s "balanced" tier). When zstd cannot
    train one (too few or too uniform rows) the store is plain ``zstd``, with a
    warning. `level` None is the codec's default: 3, or 19 for ``zstd_dict``.
    Appending to an existing ``zstd_dict`` store reuses its dictionary.
    """
    if isinstance(array, (str, os.PathLike)):
        array = np.load(array, mmap_mode="r")
    if not isinstance(array, np.ndarray):
        raise TypeError("from_numpy takes a numpy array or a .npy path, "
                        f"not {type(array).__name__}")
    if array.ndim == 0:
        raise ValueError("from_numpy needs an array with a record axis (ndim >= 1)")
    if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
    if array.dtype.hasobject:
        raise TypeError(f"dtype {array.dtype} holds Python objects, which cannot be stored")
    row_bytes = max(1, array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64)))
    step = max(1, chunk_bytes // row_bytes)
    n = array.shape[0]

    def chunks():
        for start in range(0, n, step):
            stop = min(start + step, n)
            yield np.ascontiguousarray(array[start:stop]), stop - start
            # A memory-mapped source keeps every page it touched mapped (and
            # counted in RSS) until unmapped; drop the chunk's pages once copied.
            drop_source_rows(array, start, stop)

    return _write_store(path, DenseStore, (array.dtype, array.shape[1:]), chunks(), n, "rows",
                        lambda: array, codec=codec, level=level, dict_bytes=dict_bytes,
                        dict_size=dict_size, progress=progress, mode=mode)


def from_iterator(path, iterable: Iterable, *, dtype=None, codec: str = "zstd",
                  level: int | None = None, dict_bytes: bytes | None = None,
                  dict_size: int | None = None, progress=None,
                  mode: str = "create") -> RaggedStore:
    """Build a RaggedStore from an iterable of arrays (one pass). With
    ``dtype=None`` the first record's dtype is used. Returns the open store.
    `mode`, `codec`, `dict_bytes`, `dict_size` and `progress` (counted in
    records; the total is ``len(iterable)`` when it has one) as in
    `from_numpy`; ``codec="zstd_dict"`` without `dict_bytes` trains the
    dictionary on the first records (up to 16 MiB), which are then written."""
    it = iter(iterable)
    first: list = []
    if dtype is None:
        try:
            head = next(it)
        except StopIteration:
            raise ValueError("from_iterator needs a dtype when the iterable is empty") from None
        head = np.asarray(head) if not isinstance(head, (bytes, bytearray, memoryview)) \
            else np.frombuffer(head, np.uint8)
        dtype = head.dtype
        first = [head]
    records = _chain(first, it)
    sample: list = []

    def training_sample() -> list:
        # The first records, kept to be written after the dictionary is trained.
        size = 0
        for record in records:
            sample.append(record)
            size += np.asarray(record).nbytes if not isinstance(record, (bytes, bytearray,
                                                                         memoryview)) \
                else len(record)
            if size >= _DICT_SAMPLE_BYTES:
                break
        return [np.ascontiguousarray(np.asarray(r, dtype=dtype)).tobytes()
                if not isinstance(r, (bytes, bytearray, memoryview)) else bytes(r)
                for r in sample]

    def chunks():
        rest = _chain(sample, records)
        while True:
            chunk = list(itertools.islice(rest, _ITERATOR_CHUNK_RECORDS))
            if not chunk:
                return
            yield chunk, len(chunk)

    total = len(iterable) if isinstance(iterable, Sized) else None
    return _write_store(path, RaggedStore, (dtype,), chunks(), total, "records",
                        training_sample, codec=codec, level=level, dict_bytes=dict_bytes,
                        dict_size=dict_size, progress=progress, mode=mode)


def _chain(head, rest):
    yield from head
    yield from rest


def _write_store(path, cls: type, ident: tuple, chunks: Iterator[tuple[Any, int]],
                 total: int | None, unit: str, sample: Callable[[], Any], *, codec: str,
                 level: int | None, dict_bytes: bytes | None, dict_size: int | None, progress,
                 mode: str) -> Any:
    """The one writer of a single store (`from_numpy`, `from_iterator`):
    `cls(path, *ident, ...)` created under `mode` with `codec`, then
    every ``(records, count)`` of `chunks` appended, `progress` counting
    `count` of `total` in `unit`. ``sample()`` gives what a ``zstd_dict``
    dictionary is trained on when none is given."""
    path = path_arg(path, "store path")
    if _objstore.is_url(path):  # built locally, uploaded, then opened from there
        _openers.remote(path).write_store(path, mode, lambda local: _write_store(
            local, cls, ident, chunks, total, unit, sample, codec=codec, level=level,
            dict_bytes=dict_bytes, dict_size=dict_size, progress=progress,
            mode="create").close())
        return open_store(path)
    codec = _writer.codec_of(codec)
    if dict_size is not None and (codec != "zstd_dict" or dict_bytes is not None):
        raise ValueError("dict_size= sizes the dictionary a writer trains, which it does for "
                         "codec='zstd_dict' without dict_bytes=")
    # Every argument is checked before "overwrite" may remove the store there.
    identity.check_dtype(ident[0])
    from .converters._progress import resolve_mode
    if not callable(progress):
        resolve_mode(progress)  # (a bad progress= raises here, and no bar is drawn)
    check_new_store(path, "zstd" if codec == "zstd_dict" and dict_bytes is None else codec,
                    level, dict_bytes)
    # The whole write is one atomic append, and nothing that was there is
    # lost when it fails: an append leaves the store as it was, a create
    # leaves nothing, and an overwrite builds the new store beside the old
    # one, which it replaces only once the write succeeded.
    there = _writer.check_store(path, mode)
    appending = there and mode == "append"
    replacing = there and mode == "overwrite"
    where = _writer.replacement_dir(path) if replacing else path
    was_dir = os.path.isdir(where)
    if codec == "zstd_dict" and dict_bytes is None:
        codec, dict_bytes = _own_dictionary(path, cls, sample, dict_size, appending)
    from .converters._progress import make_progress
    store = None
    try:
        store = cls(where, *ident, codec=codec, level=level, dict_bytes=dict_bytes)
        with make_progress(progress, total, os.path.basename(path), unit) as bar, \
                store.one_append():
            for records, count in chunks:
                store.append(records)
                bar.update(count)
    except BaseException:
        if store is not None:
            store.close()
        if not appending:  # what this call created goes (an empty directory stays)
            shutil.rmtree(where, ignore_errors=True)
            if was_dir:
                os.makedirs(where, exist_ok=True)
        raise
    if replacing:
        store.close()
        _writer.swap_in(where, path)
        store = cls(path)
    return store


def _own_dictionary(path, cls: type, sample: Callable[[], Any], size: int | None,
                    appending: bool) -> tuple:
    """(codec, dictionary) for a zstd_dict store a writer makes: an existing
    store's own, else one trained on ``sample()`` (a bounded, seeded sample)."""
    if appending:
        with cls(path) as existing:
            if existing.codec == "zstd_dict":
                return "zstd_dict", existing.dictionary()
    try:
        return "zstd_dict", train_dict(sample(), "balanced", size=size)
    except DictionaryError as e:
        warnings.warn(f"{os.fspath(path)}: no dictionary ({e}); the store uses plain zstd",
                      stacklevel=4)
        return "zstd", None


def open_dataset(path, columns: Iterable[str] | None = None, *, cache_dir=None,
                 cache_limit=None, storage_options=None) -> dict:
    """Open a dataset directory: ``{column: store or ShardSet}`` in manifest
    order, ready for ``DataLoader``. A directory of splits (a converted
    ``DatasetDict``) gives ``{split: {column: ...}}``. `columns` picks a subset.
    Opening is O(number of shards); the caller closes what it gets.

    While another process overwrites or appends to the dataset, this gives
    the dataset before or after that, whole: it holds a shared lock on the
    generation it opens (version 2 manifests), and reads the manifest again
    if what it named was replaced meanwhile.

    `path` may be a URL (``s3://bucket/ds``, ``gs://``, ``az://``,
    ``https://``): the dataset is read through a node-local cache in
    `cache_dir` (default ``$LOADERX_CACHE_DIR`` or ``~/.cache/loaderx``)
    holding at most `cache_limit` bytes (an int or ``"200GiB"``), with
    `storage_options` for the object store; see docs/remote.md. Its manifest
    is read once and its shards opened concurrently, each at the version on
    the server now (loaderx's writers never change a published object, so no
    lock is needed there)."""
    p = path_arg(path, "dataset path")
    if isinstance(columns, (str, bytes)):
        raise TypeError(f"columns must be a list of column names, not the string {columns!r}")
    wanted = None if columns is None else list(columns)
    if _objstore.is_url(p):
        with _openers.remote(p).settings(cache_dir, cache_limit, storage_options):
            return _open_manifest(p, read_manifest(p), wanted)
    for _ in range(_OPEN_ATTEMPTS):
        seen = _manifest_id(p)
        manifest = read_manifest(p)
        opened = _open_generation(p, manifest, wanted, seen)
        if opened is not None:
            return opened
    raise BusyError(f"{p}: the dataset was replaced {_OPEN_ATTEMPTS} times while it was being "
                    "opened; open it again", path=p)


def _manifest_id(p: str) -> tuple | None:
    """Which file the manifest of `p` is now (a writer replaces it by a
    rename, which makes a new file)."""
    try:
        st = os.stat(os.path.join(p, MANIFEST_NAME))
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _open_generation(p: str, manifest: dict, wanted: list | None,
                     seen: tuple | None) -> dict | None:
    """What `manifest` (read from the file `seen`) describes, opened; None
    when it was replaced meanwhile (then the caller reads it again)."""
    generation = manifest.get("generation")
    try:
        if generation is None:  # version 1: parts straight under `p`, no lock to take
            lock: Any = contextlib.nullcontext(True)
        else:
            lock = _locks.reading(check_inside(p, generation, "the generation directory"))
        with lock as held:
            if held:
                return _open_manifest(p, manifest, wanted)
    except (ZrecordError, OSError):
        if _manifest_id(p) != seen:
            return None  # replaced meanwhile: read it again
        raise
    if _manifest_id(p) != seen:
        return None
    raise manifest_error(p, f"names generation {generation!r}, which is missing")


def _open_manifest(p: str, manifest: dict, wanted: list | None) -> dict:
    if "splits" in manifest:
        splits: dict = {}
        try:
            for split, sub in manifest["splits"].items():
                splits[split] = open_dataset(check_inside(p, sub, f"split {split!r}"), wanted)
        except BaseException:
            for split_columns in splits.values():
                for store in split_columns.values():
                    store.close()
            raise
        return splits
    columns = manifest["columns"]
    names = list(columns) if wanted is None else list(wanted)
    for name in names:
        if name not in columns:
            raise KeyError(f"{p}: no column {name!r}; the dataset has {list(columns)}")
    # A column's validity mask comes with it (loaderx.columns).
    masks = [columns[n].get("valid") for n in names]
    names += [m for m in masks if m in columns and m not in names]
    opened: dict = {}
    try:
        with _parts_opened(p, columns, names):
            for name in names:
                opened[name] = _open_column(p, name, columns[name], manifest["version"])
    except BaseException:
        for store in opened.values():
            store.close()
        raise
    return wrap_columns(opened, columns)


def _parts_opened(root: str, columns: dict, names: list) -> Any:
    """A context in which the parts of a dataset at a URL open from bindings
    made up front, all at once (each is a few requests); nothing locally."""
    if not _objstore.is_url(root):
        return contextlib.nullcontext()
    urls = [_objstore.join(root, s["path"]) for n in names for s in columns[n]["shards"]]
    return _openers.remote(root).opening(_openers.bind_all(urls))


def _open_column(root: str, name: str, col: dict, version: int) -> Any:
    shards = col["shards"]
    paths = [check_inside(root, s["path"], f"column {name!r} part {s['path']}") for s in shards]
    opened = open_store(paths[0]) if len(paths) == 1 else ShardSet(paths)
    copied = col.get("content")
    if copied is not None and copied["rows"] == col_rows(col):
        # Converted from loaderx data: the records are that data's (see content_id).
        opened._copied_from = copied["id"]
    try:
        stores = opened.shards if isinstance(opened, ShardSet) else [opened]
        for s, store in zip(shards, stores):
            _check_part(root, name, col, s, store, version)
            store.keep_rows(f"column {name!r} of the dataset {root}")
            if len(store) != s["rows"]:
                raise CorruptStoreError(
                    f"{root}: column {name!r} shard {s['path']} holds {len(store)} records, the "
                    f"manifest says {s['rows']}; it was changed after it was written (run "
                    "loaderx verify)", path=store.path)
    except BaseException:
        opened.close()
        raise
    return opened


def _check_part(root: str, name: str, col: dict, shard: dict, store: Any, version: int) -> None:
    """A part holds what the manifest says its column holds: kind, dtype,
    item_shape and (version 2) codec."""
    shape = store.item_shape
    have = {"kind": store.kind, "dtype": str(store.dtype),
            "item_shape": None if shape is None else list(shape)}
    want = {key: col.get(key) for key in have}
    if version >= 2:
        have["codec"], want["codec"] = store.codec, shard.get("codec", col.get("codec"))
    for key, value in have.items():
        if want.get(key) != value:
            raise CorruptStoreError(
                f"{root}: column {name!r} part {shard['path']} holds {key} {value}; the manifest "
                f"says {want.get(key)} (the part was replaced or the manifest edited)",
                path=store.path)


def labels(dataset, column: str) -> list[str] | None:
    """The label names of `column`, so that ``labels(ds, "label")[code]``
    names the label `code`: an image folder's class folders, a Hugging Face
    ``ClassLabel``'s names, a categorical column's categories. None for a
    column without names. `dataset` is a dataset directory or the dict
    `open_dataset` returned (a split's, for a converted ``DatasetDict``)."""
    manifest, where = _manifest_of(dataset, column)
    columns = manifest["columns"]
    if column not in columns:
        raise KeyError(f"{where}: no column {column!r}; the dataset has {list(columns)}")
    entry = columns[column]
    # "class_names" is what loaderx 0.1 manifests called them; a categorical's
    # codes are named by its "categories" (loaderx.columns).
    names = entry.get("labels", entry.get("class_names"))
    if names is None and isinstance(entry.get("categories"), list):
        names = [str(c) for c in entry["categories"]]
    if names is None:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise manifest_error(where, f"column {column!r} has malformed 'labels'")
    return list(names)


def _manifest_of(dataset, column: str) -> tuple[dict, str]:
    """(manifest, directory) of a dataset directory path or of the columns
    `open_dataset` returned (found from the column's first shard)."""
    if isinstance(dataset, (str, bytes, os.PathLike)):
        where = path_arg(dataset, "dataset path")
    elif isinstance(dataset, dict):
        if column not in dataset:
            raise KeyError(f"no column {column!r}; the dataset has {list(dataset)}")
        store = dataset[column]
        shards = getattr(store, "shards", None)
        shard = getattr(shards[0] if shards else store, "path", None)
        if not isinstance(shard, str):
            raise TypeError(f"column {column!r} is a {type(store).__name__}, not a column "
                            "open_dataset opened; labels reads a dataset's manifest: give the "
                            "dataset's directory or what open_dataset returned")
        if _objstore.is_url(shard):  # DEST/gen-N/<column dir>/part-NNNNN (or without gen-N)
            for where in (shard.rsplit("/", 3)[0], shard.rsplit("/", 2)[0]):
                try:
                    found = read_manifest(where)
                except ZrecordError:
                    continue
                entry = found.get("columns", {}).get(column) or {}
                first = (entry.get("shards") or [{}])[0].get("path")
                if isinstance(first, str) and _objstore.join(where, first) == shard:
                    return found, where
            raise ValueError(f"column {column!r} ({shard}) was not opened from a dataset; "
                             "give the dataset's URL")
        shard = os.path.abspath(shard)
        # DEST/gen-N/<column dir>/part-NNNNN, or DEST/<column dir>/part-NNNNN (version 1)
        for where in (os.path.dirname(os.path.dirname(os.path.dirname(shard))),
                      os.path.dirname(os.path.dirname(shard))):
            manifest = read_manifest(where) \
                if os.path.isfile(os.path.join(where, MANIFEST_NAME)) else None
            entry = (manifest or {}).get("columns", {}).get(column) or {}
            first = (entry.get("shards") or [{}])[0].get("path")
            if manifest is not None and isinstance(first, str) \
                    and os.path.join(where, first) == shard:
                return manifest, where
        raise ValueError(f"column {column!r} ({shard}) was not opened from a dataset "
                         "directory; give the directory's path")
    else:
        raise TypeError(f"labels takes a dataset directory or the dict open_dataset returned, "
                        f"not {type(dataset).__name__}")
    manifest = read_manifest(where)
    if "splits" in manifest:
        raise ValueError(f"{where} holds the splits {list(manifest['splits'])}; give one "
                         "split's directory")
    return manifest, where


def pad(records, row_splits=None, *, max_len: int | None = None, value=0,
        pad_value=None) -> tuple[np.ndarray, np.ndarray]:
    """Pad a list of arrays along their first axis: returns ``(padded, lengths)``
    with ``padded`` of shape ``(B, max_len, *trailing)`` and int64 ``lengths``.
    All records must share dtype and trailing dimensions. A `max_len` smaller
    than the longest record is an error, never a silent truncation. The
    original loaderx's ``pad(values, row_splits, max_len, pad_value)`` (a
    packed batch) works too."""
    if row_splits is not None:
        splits = np.asarray(row_splits, dtype=np.int64)
        records = [records[a:b] for a, b in zip(splits[:-1].tolist(), splits[1:].tolist())]
    if pad_value is not None:
        value = pad_value
    arrays = [np.asarray(r) for r in records]
    lengths = np.array([a.shape[0] if a.ndim else -1 for a in arrays], dtype=np.int64)
    if (lengths < 0).any():
        raise ValueError(f"record {int(np.flatnonzero(lengths < 0)[0])} is a scalar; "
                         "pad needs a first axis")
    longest = int(lengths.max()) if len(arrays) else 0
    if max_len is None:
        max_len = longest
    elif not isinstance(max_len, (int, np.integer)) or max_len < 0:
        raise ValueError(f"max_len must be a non-negative int, got {max_len!r}")
    elif max_len < longest:
        i = int(np.argmax(lengths))
        raise ValueError(f"record {i} has length {longest}, longer than max_len={max_len}")
    if not arrays:
        return np.zeros((0, max_len)), lengths
    dtype, trailing = arrays[0].dtype, arrays[0].shape[1:]
    for i, a in enumerate(arrays):
        if a.dtype != dtype or a.shape[1:] != trailing:
            raise ValueError(f"record {i} has dtype {a.dtype} and trailing shape {a.shape[1:]}, "
                             f"record 0 has {dtype} and {trailing}")
    out = np.full((len(arrays), int(max_len)) + trailing, _pad_fill(value, dtype), dtype=dtype)
    for i, a in enumerate(arrays):
        out[i, :a.shape[0]] = a
    return out, lengths


def _pad_fill(value, dtype: np.dtype) -> np.ndarray:
    """`value` as one element of `dtype`; ValueError when it is not one
    exactly (1.5 for ints, 2 for bools, 'xyz' for 'U2'; a float
    dtype rounds, which is what it is for)."""
    try:
        fill = np.array(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"value={value!r} cannot pad records of dtype {dtype} ({e})") from None
    if fill.ndim:
        raise ValueError(f"value={value!r} is not one element of the records' dtype {dtype}")
    if dtype.kind in "biuSU" and fill.item() != value:
        raise ValueError(f"value={value!r} cannot pad records of dtype {dtype}: it would be "
                         f"stored as {fill.item()!r}")
    return fill

