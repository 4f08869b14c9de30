"""Remote datasets: stores and dataset directories in object storage
(``s3://``, ``gs://``, ``az://``, ``https://``), read through a node-local
cache. docs/remote.md is the user's guide; this module is the glue between
a store object and its cached replica.

Opening ``s3://bucket/ds/col/part-00000`` fetches the store's ``meta``
(checked like any store's) and the versions (ETags) of its ``index`` and
``data``, then opens the cache's replica of exactly that version as a
normal store (loaderx._cache): O(1), no index download. Reads go through
`Binding.begin`, which makes the records' bytes present and checked before
the native engine reads them, and keeps them from eviction while it does.

Versions: every range read asks for the version the store was opened at
(If-Match), so a store replaced on the server raises `RemoteChangedError`
instead of mixing versions; reopening reads the new one (a new replica).
loaderx's writers never change an uploaded store: they add new ones and
write a new manifest last.

Settings of an open, in order of precedence: the arguments
(``cache_dir=``, ``cache_limit=``, ``storage_options=``) of `open_dataset`,
`open_store`, ``ShardSet``; then `configure()`; then the environment
(``LOADERX_CACHE_DIR``, ``LOADERX_CACHE_LIMIT``); then ``~/.cache/loaderx``
with no fixed limit (the cache keeps 5% of its file system free).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import hashlib
import os
import struct
import threading
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from . import _objstore
from ._cache import Cache, Layout, parse_limit
from ._objstore import Options, is_url, join
from .errors import (
    CorruptStoreError,
    NotAStoreError,
    RemoteChangedError,
    RemoteNotFoundError,
    ZrecordError,
)

__all__ = ["configure", "is_url", "Config"]

_HEADER = struct.Struct("<QIIB3xiQQQQQ")  # magic .. fixed_size (format.Header's head)
_COMMIT = struct.Struct("<QQQQQQQQ")
_MAGIC = 0x0145524F5453584C
_PAGE = 4096
#: Records checked per chunk by verify().
_VERIFY_CHUNK_BYTES = 64 << 20


class Config:
    """Where and how remote stores are cached and reached (picklable)."""

    def __init__(self, cache_dir: Optional[str] = None, cache_limit: Any = None,
                 storage_options: Any = None):
        d = cache_dir if cache_dir is not None else _DEFAULTS.get("cache_dir")
        if d is None:
            d = os.environ.get("LOADERX_CACHE_DIR") or os.path.join(
                os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                  ".cache"), "loaderx")
        self.cache_dir = os.path.abspath(os.path.expanduser(os.fspath(d)))
        limit = cache_limit if cache_limit is not None else _DEFAULTS.get("cache_limit")
        if limit is None:
            limit = os.environ.get("LOADERX_CACHE_LIMIT") or None
        self.cache_limit = parse_limit(limit)
        if isinstance(storage_options, Options):
            self.options = storage_options
        else:
            so = storage_options if storage_options is not None else _DEFAULTS.get(
                "storage_options")
            if so is not None and not isinstance(so, dict):
                raise TypeError(f"storage_options must be a dict, not {type(so).__name__}")
            self.options = Options(so)

    def cache(self) -> Cache:
        return Cache.get(self.cache_dir, self.cache_limit)

    def __reduce__(self):
        return (Config, (self.cache_dir, self.cache_limit, self.options))

    def __repr__(self) -> str:
        return f"Config(cache_dir={self.cache_dir!r}, cache_limit={self.cache_limit})"


_DEFAULTS: dict = {}
_CURRENT: contextvars.ContextVar = contextvars.ContextVar("loaderx_remote", default=None)


def configure(*, cache_dir: Optional[str] = None, cache_limit: Any = None,
              storage_options: Optional[dict] = None) -> None:
    """Process-wide defaults for remote opens that do not pass their own
    (``DenseStore("s3://...")``, pickled stores reopened elsewhere keep
    theirs). Arguments left None keep their current default."""
    if cache_limit is not None:
        parse_limit(cache_limit)
    for k, v in (("cache_dir", cache_dir), ("cache_limit", cache_limit),
                 ("storage_options", storage_options)):
        if v is not None:
            _DEFAULTS[k] = v


def config(cache_dir: Any = None, cache_limit: Any = None,
           storage_options: Any = None) -> Config:
    """The settings of one open: the arguments, else the enclosing `using`,
    else the defaults."""
    outer = _CURRENT.get()
    if outer is not None and cache_dir is None and cache_limit is None and storage_options is None:
        return outer
    if outer is not None:
        cache_dir = outer.cache_dir if cache_dir is None else cache_dir
        cache_limit = outer.cache_limit if cache_limit is None else cache_limit
        storage_options = outer.options if storage_options is None else storage_options
    return Config(cache_dir, cache_limit, storage_options)


@contextlib.contextmanager
def using(cfg: Config) -> Iterator[Config]:
    """Opens of URLs inside use `cfg` (stores a dataset or ShardSet opens)."""
    token = _CURRENT.set(cfg)
    try:
        yield cfg
    finally:
        _CURRENT.reset(token)


# ----------------------------------------------------------------- a thread pool

_POOL: Optional[concurrent.futures.ThreadPoolExecutor] = None
_POOL_PID = -1
_POOL_LOCK = threading.Lock()


def pool() -> concurrent.futures.ThreadPoolExecutor:
    """Threads for concurrent network work (opens of many shards, fetches
    for many shards); rebuilt in a forked child."""
    global _POOL, _POOL_PID, _POOL_LOCK
    if _POOL_PID != os.getpid():
        _POOL_LOCK = threading.Lock()
        _POOL, _POOL_PID = None, os.getpid()
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(32, thread_name_prefix="loaderx-remote")
        return _POOL


def map_concurrently(fn: Callable, items: Sequence) -> list:
    """``[fn(x) for x in items]``, run on the pool when there are several;
    the first error is raised once all have finished."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    ctx = contextvars.copy_context()
    futures = [pool().submit(ctx.copy().run, fn, x) for x in items]
    concurrent.futures.wait(futures)
    return [f.result() for f in futures]


# ----------------------------------------------------------------- opening a store

class Binding:
    """A store object's link to the replica of the version it opened."""

    def __init__(self, url: str, cfg: Config, key: str, etags: dict, layout: Layout):
        self.url = url
        self.cfg = cfg
        self.key = key
        self.etags = etags
        self.layout = layout
        self.cache = cfg.cache()
        self.local_dir = os.path.join(self.cache.stores, key)

    def __reduce__(self):
        return (_rebind, (self.url, self.cfg, {"key": self.key, "etags": self.etags}))

    def replica(self):
        return self.cache.replica(self.key)

    # -- reads
    def begin(self, indices: np.ndarray, check: Callable, pin: bool = False) -> int:
        """Makes records `indices` present and checked and protects them from
        eviction; returns a token for `end` (a prefetch, ``pin=True``, stays
        protected for the process's next prefetches instead)."""
        r = self.replica()
        lay = r.layout
        u = np.unique(np.asarray(indices, dtype=np.uint64))
        u = u[u < np.uint64(lay.record_count)].astype(np.int64)
        if not lay.fixed and len(r.unchecked(u)):
            self._fetch_index(r, u)
        starts, ends = r.ranges(u)
        rsh = lay.dshift + 6
        live = ends > starts
        regions = np.unique(np.concatenate([starts[live] >> rsh, (ends[live] - 1) >> rsh]))
        with self.cache.locked() as p:
            tick = r.stamp(p, regions, pin)
            todo = r.unchecked(u)
        if not len(todo):
            return tick
        try:
            blocks = r.data_blocks(starts, ends)
            jobs = [lambda: r.fetch("data", blocks, self._downloader(r))]
            if lay.fixed:  # the checksums live in the index: fetched alongside the data
                jobs.append(lambda: self._fetch_index(r, todo))
            map_concurrently(lambda job: job(), jobs)
            self._check(r, todo, check)
        except BaseException:
            self.end(tick)
            raise
        return tick

    def end(self, tick: int) -> None:
        """The read of `begin` is over (a no-op for a prefetch's tick)."""
        self.cache.end(tick)

    def _fetch_index(self, r, u: np.ndarray) -> None:
        r.fetch("index", r.index_blocks(u), self._downloader(r))

    def _downloader(self, r) -> Callable:
        def download(which: str, starts: list, ends: list, keeps: list) -> int:
            return _objstore.get_ranges_into(join(self.url, which), self.cfg.options, starts,
                                             ends, os.path.join(r.dir, which), keeps,
                                             self.etags.get(which))
        return download

    def _check(self, r, todo: np.ndarray, check: Callable) -> None:
        bad = check(todo)
        if len(bad):
            mask = np.ones(len(todo), bool)
            mask[bad] = False
            r.mark_checked(todo[mask])
            # Torn or tampered cache bytes: drop them, fetch again, check again.
            todo = todo[bad]
            r.drop(todo)
            self._fetch_index(r, todo)
            starts, ends = r.ranges(todo)
            r.fetch("data", r.data_blocks(starts, ends), self._downloader(r))
            bad = check(todo)
            if len(bad):
                r.drop(todo[bad])
                self._server_damaged(int(todo[bad][0]))
        r.mark_checked(todo)

    def _server_damaged(self, record: int):
        for which in ("meta", "index", "data"):
            got = _objstore.head(join(self.url, which), self.cfg.options)
            want = self.etags.get(which)
            if want is not None and got["etag"] != want:
                raise RemoteChangedError(f"{join(self.url, which)}: the object changed on the "
                                         "server since it was opened (reopen the dataset to read "
                                         "the new version)", path=self.url)
        raise CorruptStoreError(f"{self.url}: record {record} fails its checksum as the server "
                                "holds it (the store's bytes on the server are damaged; run "
                                "loaderx verify)", path=self.url)

    def verify_all(self, check: Callable) -> None:
        """Fetches (through the cache) and checks every record."""
        lay = self.layout
        per = max(1, _VERIFY_CHUNK_BYTES // max(1, lay.data_size // max(1, lay.record_count)))
        for start in range(0, lay.record_count, per):
            idx = np.arange(start, min(start + per, lay.record_count), dtype=np.uint64)
            self.end(self.begin(idx, check))

    def all_index(self) -> None:
        """Makes the whole record table present (a token window index needs
        every record's size)."""
        r = self.replica()
        if r.layout.iblocks:
            r.fetch("index", np.arange(r.layout.iblocks, dtype=np.int64), self._downloader(r))


def _rebind(url: str, cfg: Config, pins: dict) -> "Binding":
    return bind(url, cfg, pins)


_BOUND: contextvars.ContextVar = contextvars.ContextVar("loaderx_bound", default=None)


@contextlib.contextmanager
def opening(bound: Any) -> Iterator[None]:
    """Store constructors inside open these bindings (a `Binding`, or a dict
    ``{url: Binding}``) for their URLs instead of opening them again."""
    if isinstance(bound, Binding):
        bound = {bound.url: bound}
    token = _BOUND.set(bound)
    try:
        yield
    finally:
        _BOUND.reset(token)


def bind_for_open(url: str) -> Binding:
    b = (_BOUND.get() or {}).get(url.rstrip("/"))
    return b if b is not None else bind(url)


def _parse_meta(url: str, meta: bytes) -> Layout:
    if len(meta) < 2 * _PAGE or _HEADER.unpack_from(meta, 0)[0] != _MAGIC:
        raise NotAStoreError(f"{url} holds no loaderx store (its meta has no loaderx header)",
                             path=url)
    fixed = _HEADER.unpack_from(meta, 0)[9]
    count, data_size, _live, durable, *_ = _COMMIT.unpack_from(meta, _PAGE)
    if durable != count:
        raise CorruptStoreError(
            f"{url}: this store was uploaded while a writer had it open ({count - durable} "
            "records since its last sync); open and close it locally, then upload it again",
            path=url)
    return Layout(int(count), int(data_size), int(fixed))


def bind(url: str, cfg: Optional[Config] = None, pins: Optional[dict] = None) -> Binding:
    """Opens the remote store at `url`: its replica in the cache (made if
    missing) for the version on the server now, or for `pins` (the version
    a parent process opened: `RemoteChangedError` if it is gone)."""
    cfg = cfg or config()
    url = url.rstrip("/")
    cache = cfg.cache()
    if pins is not None and cache.has_replica(pins["key"]):
        return Binding(url, cfg, pins["key"], pins["etags"], cache.replica(pins["key"]).layout)
    opts = cfg.options

    def meta_get():
        return _objstore.get(join(url, "meta"), opts)

    def head(which):
        return _objstore.head(join(url, which), opts)
    try:
        got = map_concurrently(lambda f: f(), [meta_get, lambda: head("index"),
                                                lambda: head("data")])
    except RemoteNotFoundError:
        raise RemoteNotFoundError(f"{url}: no loaderx store here (no meta, index and data "
                                  "objects under this prefix)", path=url) from None
    (meta, meta_info), index_info, data_info = got
    layout = _parse_meta(url, meta)
    etags = {"meta": meta_info["etag"], "index": index_info["etag"], "data": data_info["etag"]}
    if index_info["size"] < layout.index_size or data_info["size"] < layout.data_size:
        raise CorruptStoreError(f"{url}: the store's index or data on the server is shorter than "
                                "its meta says (an incomplete upload?)", path=url)
    key = hashlib.sha256("\n".join([url, hashlib.sha256(meta).hexdigest(), str(etags["index"]),
                                    str(etags["data"]), str(index_info["size"]),
                                    str(data_info["size"])]).encode()).hexdigest()[:32]
    if pins is not None and pins["key"] != key:
        raise RemoteChangedError(f"{url}: the store changed on the server since it was opened "
                                 "(reopen the dataset to read the new version)", path=url)

    def check(local: str) -> None:
        from ._store import stored_kind
        try:
            stored_kind(local)
        except ZrecordError as e:
            raise type(e)(f"{url}: {str(e).replace(local, '').lstrip(': ')}", path=url) from None
    cache.materialize(key, meta, layout, {"url": url, "etags": etags}, check)
    return Binding(url, cfg, key, etags, layout)


# ----------------------------------------------------------------- datasets and writes

def read_bytes(url: str, cfg: Optional[Config] = None) -> tuple[bytes, Optional[str]]:
    """The object at `url` and its ETag."""
    cfg = cfg or config()
    data, info = _objstore.get(url, cfg.options)
    return data, info["etag"]


def exists(url: str, cfg: Optional[Config] = None) -> bool:
    cfg = cfg or config()
    try:
        _objstore.head(url, cfg.options)
        return True
    except RemoteNotFoundError:
        return False


def manifest_text(url: str, cfg: Optional[Config] = None) -> bytes:
    """The bytes of the dataset manifest under `url`; errors name what is
    there instead (a single store, nothing)."""
    from .dataset import MANIFEST_NAME
    cfg = cfg or config()
    try:
        return read_bytes(join(url, MANIFEST_NAME), cfg)[0]
    except RemoteNotFoundError:
        if exists(join(url, "meta"), cfg):
            raise NotAStoreError(f"{url} is a single store, not a dataset directory; open it with "
                                 "loaderx.open_store", path=url) from None
        raise RemoteNotFoundError(f"{url}: no loaderx dataset here (no {MANIFEST_NAME})",
                                  path=url) from None
