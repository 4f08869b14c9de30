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
import json
import mmap
import os
import shutil
from typing import Any, Iterable

import numpy as np

from . import _objstore
from ._store import Store, stored_kind
from .errors import CorruptStoreError, NotAStoreError, StoreNotFoundError, ZrecordError
from .zrecord import DenseStore, RaggedStore, Zrecord

__all__ = ["from_numpy", "from_iterator", "open_store", "open_dataset", "read_manifest", "pad",
           "DestinationExistsError", "MANIFEST_NAME"]

#: The manifest file of a dataset directory, and the version of its layout.
MANIFEST_NAME = "loaderx.json"
MANIFEST_FORMAT = "loaderx-dataset"
MANIFEST_VERSION = 1
_MODES = ("create", "append", "overwrite")


class DestinationExistsError(ZrecordError, FileExistsError):
    """A writer in ``mode="create"`` found data at its destination."""


def _store_files(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "meta"))


def prepare_store_path(path, mode: str, flag_style: str = "python") -> bool:
    """Apply `mode` to a store destination before a writer opens it. Returns
    True when the writer appends to an existing store. ``overwrite`` removes
    an existing store (never a directory that holds anything else)."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    p = os.fspath(path)
    if not os.path.lexists(p) or (os.path.isdir(p) and not os.listdir(p)):
        return False
    if mode == "append":
        return True
    if mode == "create":
        hint = ("--append or --overwrite" if flag_style == "cli"
                else 'mode="append" to add to it or mode="overwrite" to replace it')
        raise DestinationExistsError(f"{p} already exists; pass {hint}", path=p)
    if not (os.path.isdir(p) and _store_files(p)):
        raise DestinationExistsError(f"{p} exists and is not a loaderx store; refusing to "
                                     "overwrite it (remove it yourself)", path=p)
    shutil.rmtree(p)
    return False


def from_numpy(path, array, *, codec: str = "zstd", level: int | None = None,
               dict_bytes: bytes | None = None, chunk_bytes: int = 64 << 20,
               progress=None, mode: str = "create") -> DenseStore:
    """Stream `array` (rows are records; an ``np.load(..., mmap_mode="r")``
    array or a path to a ``.npy`` file) into a new DenseStore in chunks of about
    `chunk_bytes`, so memory stays bounded whatever the array's size. Returns
    the open store. `progress(done_rows, total_rows)` is called after each chunk.
    `mode`: ``"create"`` (an existing store at `path` is an error),
    ``"append"`` or ``"overwrite"``. A URL `path` (``s3://``, ``gs://``,
    ``az://``) builds the store locally, uploads it and returns it opened from
    there (read-only; ``"append"`` is refused: append to a dataset instead).
    """
    if _objstore.is_url(path):  # built locally, then uploaded (loaderx.remote)
        from . import remote
        return remote.write_store_to(path, mode, lambda local: from_numpy(
            local, array, codec=codec, level=level, dict_bytes=dict_bytes,
            chunk_bytes=chunk_bytes, progress=progress).close())
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
    prepare_store_path(path, mode)
    store = DenseStore(path, array.dtype, array.shape[1:], codec=codec, level=level,
                       dict_bytes=dict_bytes)
    try:
        row_bytes = max(1, array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64)))
        step = max(1, chunk_bytes // row_bytes)
        n = array.shape[0]
        release = _page_releaser(array)
        for start in range(0, n, step):
            store.append(np.ascontiguousarray(array[start:start + step]))
            # A memory-mapped source keeps every page it touched mapped (and
            # counted in RSS) until unmapped; drop the chunk's pages once copied.
            release(start, min(start + step, n))
            if progress is not None:
                progress(min(start + step, n), n)
    except BaseException:
        store.close()
        raise
    return store


def _page_releaser(array: np.ndarray):
    """A function (start_row, stop_row) that unmaps the pages of those rows of a
    C-contiguous np.memmap source (MADV_DONTNEED: file-backed pages are simply
    re-read if touched again); a no-op for anything else."""
    mm = getattr(array, "_mmap", None)
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED") \
            or not array.flags.c_contiguous:
        return lambda start, stop: None
    base = np.frombuffer(mm, dtype=np.uint8).ctypes.data
    data = array.ctypes.data
    row_bytes = array.strides[0] if array.ndim and array.shape[0] > 1 else array.nbytes
    page = mmap.PAGESIZE

    def release(start: int, stop: int) -> None:
        lo = data - base + start * row_bytes
        hi = data - base + stop * row_bytes
        lo = (lo // page) * page
        hi = (hi // page) * page
        if hi > lo:
            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    return release


def from_iterator(path, iterable: Iterable, *, dtype=None, codec: str = "zstd",
                  level: int | None = None, dict_bytes: bytes | None = None,
                  mode: str = "create") -> RaggedStore:
    """Build a RaggedStore from an iterable of arrays (one pass). With
    ``dtype=None`` the first record's dtype is used. Returns the open store.
    `mode` as in `from_numpy`."""
    if _objstore.is_url(path):  # built locally, then uploaded (loaderx.remote)
        from . import remote
        return remote.write_store_to(path, mode, lambda local: from_iterator(
            local, iterable, dtype=dtype, codec=codec, level=level,
            dict_bytes=dict_bytes).close())
    prepare_store_path(path, mode)
    it = iter(iterable)
    first = []
    if dtype is None:
        try:
            head = next(it)
        except StopIteration:
            raise ValueError("from_iterator needs a dtype when the iterable is empty") from None
        head = np.asarray(head) if not isinstance(head, (bytes, bytearray, memoryview)) \
            else np.frombuffer(head, np.uint8)
        dtype = head.dtype
        first = [head]
    store = RaggedStore(path, dtype, codec=codec, level=level, dict_bytes=dict_bytes)
    try:
        store.append(_chain(first, it))
    except BaseException:
        store.close()
        raise
    return store


def _chain(head, rest):
    yield from head
    yield from rest


def open_store(path, *, cache_dir=None, cache_limit=None, storage_options=None) -> Store:
    """Open an existing store as the class its persisted identity names
    (DenseStore, RaggedStore or Zrecord). O(1) in the record count.

    `path` may be a URL (``s3://``, ``gs://``, ``az://``, ``https://``): the
    store is read through the node-local cache in `cache_dir`, bounded by
    `cache_limit`, with `storage_options` for the object store (see
    docs/remote.md); they are ignored for a local path."""
    if _objstore.is_url(path):
        from . import remote
        cfg = remote.config(cache_dir, cache_limit, storage_options)
        with remote.using(cfg):
            with remote.opening({path.rstrip("/"): remote.bind_for_open(path)}):
                return _open_store(path)
    return _open_store(path)


def _open_store(path) -> Store:
    kind = stored_kind(path)
    if kind == "dense":
        return DenseStore(path)
    if kind == "ragged":
        return RaggedStore(path)
    return Zrecord(path)


# ----------------------------------------------------------------- dataset directories

def _manifest_error(path: str, what: str) -> CorruptStoreError:
    return CorruptStoreError(f"{path}: {MANIFEST_NAME} {what}", path=path)


def read_manifest(path, *, storage_options=None) -> dict:
    """The checked manifest of the dataset directory `path` (a dict); `path`
    may be a URL (`storage_options` as in `open_dataset`)."""
    p = os.fspath(path)
    if _objstore.is_url(p):
        from . import remote
        return _checked_manifest(p, remote.manifest_text(p, remote.config(
            storage_options=storage_options)))
    file = os.path.join(p, MANIFEST_NAME)
    if not os.path.isfile(file):
        if not os.path.exists(p):
            raise StoreNotFoundError(f"{p}: no such dataset directory", path=p)
        if _store_files(p):
            raise NotAStoreError(f"{p} is a single store, not a dataset directory; open it with "
                                 "loaderx.open_store", path=p)
        raise NotAStoreError(f"{p} is not a loaderx dataset directory (no {MANIFEST_NAME})", path=p)
    try:
        with open(file, "rb") as f:
            text = f.read()
    except OSError as e:
        raise _manifest_error(p, f"cannot be read ({e})") from None
    return _checked_manifest(p, text)


def _checked_manifest(p: str, text: bytes) -> dict:
    """`text` (a manifest file's bytes) parsed and checked."""
    try:
        manifest = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise _manifest_error(p, f"is not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise _manifest_error(p, f"is not a {MANIFEST_FORMAT} manifest")
    version = manifest.get("version")
    if not isinstance(version, int) or not 1 <= version <= MANIFEST_VERSION:
        raise _manifest_error(p, f"has version {version!r}; this loaderx reads up to "
                                 f"{MANIFEST_VERSION}")
    if "splits" in manifest:
        splits = manifest["splits"]
        if not isinstance(splits, dict) or not splits:
            raise _manifest_error(p, "has an empty or malformed 'splits'")
        for name, sub in splits.items():
            if not _inside(sub) or os.path.normpath(sub) == ".":
                raise _manifest_error(p, f"split {name!r} names {sub!r}, which is not a "
                                         "directory inside this one")
        return manifest
    _check_columns(p, manifest)
    return manifest


def _inside(sub: Any) -> bool:
    """Whether a manifest's relative path stays inside the dataset directory."""
    return (isinstance(sub, str) and not os.path.isabs(sub)
            and ".." not in sub.replace("\\", "/").split("/"))


def _shard_entry_ok(s: Any) -> bool:
    return isinstance(s, dict) and isinstance(s.get("path"), str) and isinstance(s.get("rows"), int)


def _check_columns(p: str, manifest: dict) -> None:
    columns, rows = manifest.get("columns"), manifest.get("rows")
    if not isinstance(columns, dict) or not columns or not isinstance(rows, int):
        raise _manifest_error(p, "needs 'rows' and a non-empty 'columns'")
    for name, col in columns.items():
        shards = col.get("shards") if isinstance(col, dict) else None
        if not isinstance(shards, list) or not shards or not all(map(_shard_entry_ok, shards)):
            raise _manifest_error(p, f"column {name!r} has malformed 'shards'")
        total = sum(s["rows"] for s in shards)
        if total != rows:
            raise _manifest_error(p, f"column {name!r} shards hold {total} rows, the dataset "
                                     f"{rows}")
        for s in shards:
            if not _inside(s["path"]):
                raise _manifest_error(p, f"column {name!r} names a shard outside the directory: "
                                         f"{s['path']!r}")


def open_dataset(path, columns: Iterable[str] | None = None, *, cache_dir=None,
                 cache_limit=None, storage_options=None) -> dict:
    """Open a dataset directory: ``{column: store or ShardSet}`` in manifest
    order, ready for ``DataLoader``. A directory of splits (a converted
    ``DatasetDict``) gives ``{split: {column: ...}}``. `columns` picks a subset.
    Opening is O(number of shards); the caller closes what it gets.

    `path` may be a URL (``s3://bucket/ds``, ``gs://``, ``az://``,
    ``https://``): the dataset is read through a node-local cache in
    `cache_dir` (default ``$LOADERX_CACHE_DIR`` or ``~/.cache/loaderx``)
    holding at most `cache_limit` bytes (an int or ``"200GiB"``), with
    `storage_options` for the object store; see docs/remote.md. The shards
    are opened concurrently, each at the version on the server now."""
    p = os.fspath(path)
    if _objstore.is_url(p):
        from . import remote
        cfg = remote.config(cache_dir, cache_limit, storage_options)
        with remote.using(cfg):
            return _open_dataset(p, columns, remote)
    return _open_dataset(p, columns, None)


def _join(root: str, sub: str) -> str:
    return _objstore.join(root, sub) if _objstore.is_url(root) else os.path.join(root, sub)


def _open_dataset(p: str, columns: Iterable[str] | None, remote: Any) -> dict:
    manifest = read_manifest(p)
    if "splits" in manifest:
        splits: dict = {}
        try:
            for split, sub in manifest["splits"].items():
                splits[split] = _open_dataset(_join(p, sub), columns, remote)
        except BaseException:
            for split_columns in splits.values():
                for store in split_columns.values():
                    store.close()
            raise
        return splits
    wanted = list(manifest["columns"]) if columns is None else list(columns)
    for name in wanted:
        if name not in manifest["columns"]:
            raise KeyError(f"{p}: no column {name!r}; the dataset has {list(manifest['columns'])}")
    opened: dict = {}
    bound: dict = {}
    if remote is not None:  # every shard's open (its network round trip) at once
        urls = [_join(p, s["path"]) for name in wanted for s in manifest["columns"][name]["shards"]]
        bound = dict(zip(urls, remote.map_concurrently(remote.bind, urls)))
    try:
        with remote.opening(bound) if remote is not None else contextlib.nullcontext():
            for name in wanted:
                opened[name] = _open_column(p, name, manifest["columns"][name]["shards"])
    except BaseException:
        for store in opened.values():
            store.close()
        raise
    return opened


def _open_column(root: str, name: str, shards: list) -> Any:
    from .shardset import ShardSet
    paths = [_join(root, s["path"]) for s in shards]
    opened = open_store(paths[0]) if len(paths) == 1 else ShardSet(paths)
    lengths = list(opened.lengths) if isinstance(opened, ShardSet) else [len(opened)]
    for s, n, shard_path in zip(shards, lengths, paths):
        if n != s["rows"]:
            opened.close()
            raise CorruptStoreError(
                f"{root}: column {name!r} shard {s['path']} holds {n} records, the manifest says "
                f"{s['rows']}; it was changed after it was written (run loaderx verify)",
                path=shard_path)
    return opened


def pad(records, *, max_len: int | None = None, value=0) -> tuple[np.ndarray, np.ndarray]:
    """Pad a list of arrays along their first axis: returns ``(padded, lengths)``
    with ``padded`` of shape ``(B, max_len, *trailing)`` and int64 ``lengths``.
    All records must share dtype and trailing dimensions. A `max_len` smaller
    than the longest record is an error, never a silent truncation."""
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
    out = np.full((len(arrays), int(max_len)) + trailing, value, dtype=dtype)
    for i, a in enumerate(arrays):
        out[i, :a.shape[0]] = a
    return out, lengths

