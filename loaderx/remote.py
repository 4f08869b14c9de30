"""Remote datasets: stores and dataset directories in object storage
(``s3://``, ``gs://``, ``az://``, ``https://``), read through a node-local
cache. docs/remote.md is the user's guide; this module is the glue between
a store object and its cached replica. It builds on the stores and
registers the opener of URLs in `loaderx._openers` (the end of this file),
through which the stores, datasets and converters reach it: none of them
imports this module.

Opening ``s3://bucket/ds/col/part-00000`` fetches the store's ``meta``
(checked like any store's) and the versions (ETags) of its ``index`` and
``data``, then opens the cache's replica of exactly that version as a
normal store: O(1), no index download. The cache is native (src/Cache.zig
and its parts; loaderx._cachedir holds its handles): Python keeps only
the network. Reads go through `Binding.begin`, which starts the read
natively and fetches the byte ranges the native fetch plan names into the
replica's files until every record is present and checked (natively) and
kept from eviction for the read.

Versions: every fetch checks, once its bytes are in and before they count
as present, that the object is still the version the store was opened at
(its ETag), so a store replaced on the server raises `RemoteChangedError`
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
import threading
import warnings
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from . import _abi, _objstore, _openers
from ._cachedir import Cache, Replica, parse_limit
from ._checks import check_mode, path_arg
from ._lib import RESULTS, check, error_for, ffi, lib
from ._manifest import MANIFEST_NAME, checked_manifest
from ._objstore import Options, is_url, join
from .errors import (
    ConvertError,
    CorruptStoreError,
    DestinationExistsError,
    IdentityError,
    LoaderxError,
    LockedError,
    NotAStoreError,
    ReadOnlyError,
    RemoteChangedError,
    RemoteNotFoundError,
    StoreNotFoundError,
    ZrecordIOError,
)

__all__ = ["configure", "configured", "is_url", "Config"]

_BEGIN = _abi.BEGIN_FLAGS
_STATUS = _abi.FETCH_STATUS
_FLAGS = _abi.FETCH_FLAGS
_FILES = ("index", "data")
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
        self.cache_dir = os.path.abspath(os.path.expanduser(path_arg(d, "cache_dir")))
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
    Config(cache_dir, cache_limit, storage_options)  # (checks them: a bad one is refused here)
    for k, v in (("cache_dir", cache_dir), ("cache_limit", cache_limit),
                 ("storage_options", storage_options)):
        if v is not None:
            _DEFAULTS[k] = v


@contextlib.contextmanager
def configured(**settings: Any) -> Iterator[None]:
    """`configure(**settings)` for the block only: the defaults before it
    come back when it ends (the command line's --timeout)."""
    saved = dict(_DEFAULTS)
    configure(**settings)
    try:
        yield
    finally:
        _DEFAULTS.clear()
        _DEFAULTS.update(saved)


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
    for many shards); rebuilt in a forked child. Process-wide and kept, like
    an HTTP client's connection pool: named ``loaderx-net_N``, they are not
    a loader's threads (a closed DataLoader leaves none of those)."""
    global _POOL, _POOL_PID, _POOL_LOCK
    if _POOL_PID != os.getpid():
        _POOL_LOCK = threading.Lock()
        _POOL, _POOL_PID = None, os.getpid()
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(32, thread_name_prefix="loaderx-net")
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
    """A store object's link to the replica of the version it opened: the
    native read start, and the network fetches its plans ask for."""

    def __init__(self, url: str, cfg: Config, key: str, etags: dict, replica: Replica):
        self.url = url
        self.cfg = cfg
        self.key = key
        self.etags = etags
        self.rep = replica
        self.cache = replica.cache
        self.local_dir = replica.dir
        # A server without ETags: the version is pinned by the index, whole
        # in the replica since the open (see bind).
        self.weak = any(str(v).startswith(_objstore.WEAK) for v in etags.values())

    def __reduce__(self):
        return (_rebind, (self.url, self.cfg, {"key": self.key, "etags": self.etags}))

    def replica(self) -> Replica:
        return self.rep

    # -- reads
    def begin(self, indices: np.ndarray, pin: bool = False) -> int:
        """Makes records `indices` present and checked and protects them from
        eviction; returns a token for `end` (a prefetch, ``pin=True``, stays
        protected for the process's next prefetches instead)."""
        u = _records(indices)
        f = ffi.new("lx_fetch_t *")
        rc = lib.lx_replica_begin(self.rep.h, ffi.from_buffer("uint64_t[]", u), len(u),
                                  _BEGIN["pin"] if pin else 0, f)
        if rc == 0 and f.status == _STATUS["done"] and not f.flags:
            return int(f.tick)  # (a warm start: one native call)
        try:
            self._landing(rc, f)
            self._fetch(f)
        except BaseException:
            lib.lx_fetch_failed(f, 0)  # (releases what is still reserved)
            self.end(int(f.tick))
            raise
        return int(f.tick)

    def pin_warm(self, indices: np.ndarray) -> bool:
        """A prefetch of records `indices` that fetches nothing: when every
        one is present and checked, protects them as a prefetch does
        (``begin(pin=True)``) and returns True; otherwise False, for the
        caller's full prefetch."""
        u = _records(indices)
        if not len(u) or int(u.max()) >= self.rep.records:
            return False  # (the full prefetch names a bad index)
        f = ffi.new("lx_fetch_t *")
        check(lib.lx_replica_begin(self.rep.h, ffi.from_buffer("uint64_t[]", u), len(u),
                                   _BEGIN["pin"] | _BEGIN["warm_only"], f), self.url)
        return f.status == _STATUS["done"]

    def gather(self, parts, ip, n: int, op, nbytes: int, stride: int, threads: int,
               idx: np.ndarray) -> int:
        """A dense gather of records `idx` (``ip``: their uint64 cdata) into
        ``op`` through the cache; returns lx_gather's result. A warm batch
        (every record cached and checked) is one native call that starts the
        read, gathers and ends it; anything else starts it with `begin`."""
        read = ffi.new("uint32_t *")
        rc = lib.lx_gather_cached(self.rep.h, parts, 1, ip, n, op, nbytes, stride, threads,
                                  read)
        if read[0] or rc:
            return rc
        token = self.begin(idx)
        try:
            return lib.lx_gather(parts, 1, ip, n, op, nbytes, stride, ffi.NULL, 0, threads)
        finally:
            self.end(token)

    def nbytes(self, indices: np.ndarray) -> int:
        """Stored bytes of records `indices` (see Store.prefetch_size)."""
        u = _records(indices)
        out = ffi.new("uint64_t *")
        check(lib.lx_replica_nbytes(self.rep.h, ffi.from_buffer("uint64_t[]", u), len(u), out),
              self.url)
        return int(out[0])

    def end(self, tick: int) -> None:
        """The read of `begin` is over (a no-op for a prefetch's tick)."""
        lib.lx_replica_end(self.rep.h, tick)

    def verify_all(self) -> None:
        """Fetches (through the cache) and checks every record."""
        info = self.rep.info()
        count = int(info.record_count)
        per = max(1, _VERIFY_CHUNK_BYTES // max(1, int(info.data_size) // max(1, count)))
        for start in range(0, count, per):
            self.end(self.begin(np.arange(start, min(start + per, count), dtype=np.uint64)))

    def all_index(self) -> None:
        """Makes the whole record table present (a token window index needs
        every record's size)."""
        f = ffi.new("lx_fetch_t *")
        try:
            self._landing(lib.lx_replica_begin(self.rep.h, ffi.NULL, 0, _BEGIN["whole_index"],
                                               f), f)
            self._fetch(f)
        except BaseException:
            lib.lx_fetch_failed(f, 0)
            raise

    # -- the network side of a fetch
    def _fetch(self, f) -> None:
        """Moves fetch `f` on until its records are present and checked: each
        step's ranges (index and data at once) fetched into the replica's
        files, then `lx_fetch_landed` (which marks, checks and plans on)."""
        while f.status == _STATUS["ranges"]:
            try:
                map_concurrently(lambda k: self._download(k, f.files[k]),
                                 [k for k in (0, 1) if f.files[k].count])
            except BaseException as e:
                self._failed(f, e)
                continue  # (room made on a full disk: the step again)
            self._landing(lib.lx_fetch_landed(f), f)
        flags = int(f.flags)
        if flags & (_FLAGS["over_limit"] | _FLAGS["disk_nearly_full"]):
            self._warn(flags)
        if flags & _FLAGS["index_due"]:
            self._whole_index_later()

    def _download(self, k: int, req) -> int:
        which = _FILES[k]
        n, m = int(req.count), int(req.keep_count)
        keeps: list = [[] for _ in range(n)]
        for q, lo, hi in zip(ffi.unpack(req.keep_request, m), ffi.unpack(req.keep_lo, m),
                             ffi.unpack(req.keep_hi, m)):
            keeps[q].append((lo, hi))
        path = os.path.join(self.local_dir, which)
        try:
            # The data's bytes are checked against the index's checksums (of
            # the version opened: its fetches end with a HEAD) before any read
            # uses them, so data fetches skip that HEAD, a round trip each.
            return _objstore.get_ranges_into(join(self.url, which), self.cfg.options,
                                             ffi.unpack(req.starts, n), ffi.unpack(req.ends, n),
                                             path, keeps, self.etags.get(which), which != "data")
        except OSError as e:
            if not isinstance(e, LoaderxError):
                e.filename = path
            raise

    def _failed(self, f, e: BaseException) -> None:
        """The step's fetch failed with `e`: the native side punches what it
        was to write; a full disk makes room and plans it again (return),
        once; anything else is raised."""
        own = isinstance(e, OSError) and not isinstance(e, LoaderxError)
        err = e.errno if own and isinstance(e, OSError) and e.errno else 0
        check(lib.lx_fetch_failed(f, err))
        if f.status == _STATUS["ranges"]:
            return
        if own and isinstance(e, OSError):
            raise ZrecordIOError(f"{e.filename or self.local_dir}: writing fetched bytes into "
                                 f"the cache failed: {e.strerror or e}",
                                 path=self.local_dir) from None
        raise e

    def _landing(self, rc: int, f) -> None:
        """Raises the error of a native fetch call, if any: a record whose
        server bytes fail twice is named after a look at the server."""
        if rc == RESULTS["corrupt"] and int(f.flags) & _FLAGS["bad_record"]:
            self._server_damaged(int(f.bad_record))
        if rc:
            raise error_for(rc, None if rc == RESULTS["no_space"] else self.url)

    def _warn(self, flags: int) -> None:
        c = self.cache
        st = c.stats()
        if flags & _FLAGS["disk_nearly_full"] and c.warn_once("disk"):
            warnings.warn(f"loaderx cache {c.root}: its file system has {st.free} bytes free and "
                          f"the cache leaves {st.reserve} free (without a cache_limit), so it "
                          f"holds at most {st.limit} bytes and drops cached ranges as others "
                          "are read; free disk space, or set cache_limit (or "
                          "LOADERX_CACHE_LIMIT)", RuntimeWarning, stacklevel=6)
        if flags & _FLAGS["over_limit"] and c.warn_once("limit"):
            warnings.warn(f"loaderx cache {c.root} holds {st.used} bytes, over its limit of "
                          f"{st.limit}: every cached range is being read (raise cache_limit)",
                          RuntimeWarning, stacklevel=6)

    def _whole_index_later(self) -> None:
        """Fetches the rest of the index whole on a daemon thread (the
        native plan said it is due): after it, a cold batch is its data
        ranges only. An error ends it quietly: reads fetch their records'
        index blocks as before."""
        def run() -> None:
            try:
                self.all_index()
            except Exception:
                pass
        t = self.rep.whole_index = threading.Thread(target=run, name="loaderx-index",
                                                    daemon=True)
        t.start()

    def _server_damaged(self, record: int):
        for which in ("meta", "index", "data"):
            got = _objstore.head(join(self.url, which), self.cfg.options)
            want = self.etags.get(which)
            if want is not None and got["etag"] != want:
                raise RemoteChangedError(f"{join(self.url, which)}: the object changed on the "
                                         "server since it was opened (reopen the dataset to read "
                                         "the new version)", path=self.url)
        if self.weak:
            raise CorruptStoreError(f"{self.url}: record {record} fails its checksum as the "
                                    "server holds it: the store was replaced on the server (its "
                                    "server sends no ETag, so a replacement of the same size in "
                                    "the same second looks unchanged; reopen the dataset) or its "
                                    "bytes are damaged (run loaderx verify)", path=self.url)
        raise CorruptStoreError(f"{self.url}: record {record} fails its checksum as the server "
                                "holds it (the store's bytes on the server are damaged; run "
                                "loaderx verify)", path=self.url)


def _records(indices: np.ndarray) -> np.ndarray:
    """Record indices as the uint64 the native calls take (a negative one is
    huge: outside the store), without a copy when they are already."""
    u = np.ascontiguousarray(indices)
    return u if u.dtype == np.uint64 else u.astype(np.int64, copy=False).view(np.uint64)


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


def _parse_meta(url: str, meta: bytes):
    """The store's meta, parsed and checked natively (``lx_meta_t``)."""
    out = ffi.new("lx_meta_t *")
    rc = lib.lx_meta_parse(ffi.from_buffer("uint8_t[]", meta), len(meta), out)
    if rc == RESULTS["not_a_store"]:
        detail = error_for(rc)
        raise NotAStoreError(f"{url} holds no loaderx store ({detail})", path=url)
    check(rc, url)
    return out


def bind(url: str, cfg: Optional[Config] = None, pins: Optional[dict] = None) -> Binding:
    """Opens the remote store at `url`: its replica in the cache (made if
    missing or damaged) for the version on the server now, or for `pins`
    (the version a parent process opened: `RemoteChangedError` if it is
    gone). A server that sends no ETag has the store's index fetched whole
    here: every record is then checked against the version opened."""
    cfg = cfg or config()
    url = url.rstrip("/")
    cache = cfg.cache()
    if pins is not None:
        weak = any(str(v).startswith(_objstore.WEAK) for v in pins["etags"].values())
        try:
            rep = cache.replica(pins["key"], weak=weak, where=url)
        except StoreNotFoundError:
            rep = None  # (not whole here: opened from the server below)
        if rep is not None:
            return Binding(url, cfg, pins["key"], pins["etags"], rep)
    meta, layout, infos = _objects(url, cfg.options)
    etags = {which: info["etag"] for which, info in infos.items()}
    index = None
    if any(info["weak"] for info in infos.values()):
        index = _whole_index(url, cfg.options, int(layout.index_size), etags["index"])
    key = hashlib.sha256("\n".join([url, hashlib.sha256(meta).hexdigest(), str(etags["index"]),
                                    str(etags["data"]), str(infos["index"]["size"]),
                                    str(infos["data"]["size"])]
                                   + ([hashlib.sha256(index).hexdigest()] if index is not None
                                      else [])).encode()).hexdigest()[:32]
    if pins is not None and pins["key"] != key:
        raise RemoteChangedError(f"{url}: the store changed on the server since it was opened "
                                 "(reopen the dataset to read the new version)", path=url)
    rep = cache.replica(key, meta, {"url": url, "etags": etags}, index, index is not None, url)
    return Binding(url, cfg, key, etags, rep)


def _objects(url: str, opts: _objstore.Options) -> tuple:
    """The store's meta, its parse (``lx_meta_t``), and ``{meta, index,
    data}`` metadata (size, version) of its objects, fetched at once; sizes
    checked."""
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
    if index_info["size"] < layout.index_size or data_info["size"] < layout.data_size:
        raise CorruptStoreError(f"{url}: the store's index or data on the server is shorter than "
                                f"its meta says (an incomplete upload?): the server holds "
                                f"{index_info['size']} and {data_info['size']} bytes, the meta "
                                f"says {layout.index_size} and {layout.data_size}", path=url)
    return meta, layout, {"meta": meta_info, "index": index_info, "data": data_info}


def _whole_index(url: str, opts: _objstore.Options, index_size: int, etag: str) -> bytes:
    """The store's index, whole, of the version `etag` (a server without
    ETags: its size and Last-Modified). Pinning the version by the bytes
    themselves: every record read is checked against this index."""
    if not index_size:
        return b""
    data, _ = _objstore.get(join(url, "index"), opts, etag, (0, index_size))
    return data


# ----------------------------------------------------------------- datasets and writes

def read_bytes(url: str, cfg: Optional[Config] = None) -> tuple[bytes, Optional[str]]:
    """The object at `url` and its ETag."""
    cfg = cfg or config()
    data, info = _objstore.get(url, cfg.options)
    return data, None if info["weak"] else info["etag"]


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
    cfg = cfg or config()
    try:
        return read_bytes(join(url, MANIFEST_NAME), cfg)[0]
    except RemoteNotFoundError:
        if exists(join(url, "meta"), cfg):
            raise NotAStoreError(f"{url} is a single store, not a dataset directory; open it with "
                                 "loaderx.open_store", path=url) from None
        raise RemoteNotFoundError(f"{url}: no loaderx dataset here (no {MANIFEST_NAME})",
                                  path=url) from None


# ----------------------------------------------------------------- writes
# A dataset is written locally (in <cache_dir>/uploads, which eviction never
# touches), uploaded, and published by its manifest, written last: a reader
# never sees a partial dataset. Uploaded stores are never changed in place:
# an append adds parts under new names in the dataset's generation and a new
# manifest; an overwrite uploads a new generation directory, publishes its
# manifest, then deletes the old generation. The manifest is written with a
# conditional put (create-only, or
# only-if-unchanged since it was read): two writers never lose each other's
# shards, and a service without conditional writes refuses an append.

_SKIP_FILES = ("lock", "journal", ".loaderx-owner")


def _skipped(name: str) -> bool:
    return name in _SKIP_FILES or name.startswith("windows") or ".tmp" in name


def _files_under(root: str) -> list:
    """(relative key, local path) of every file a dataset or store needs."""
    out = []
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".loaderx-"))
        for name in sorted(files):
            if not _skipped(name):
                path = os.path.join(dirpath, name)
                out.append((os.path.relpath(path, root).replace(os.sep, "/"), path))
    return out


def _upload(pairs: list, url: str, cfg: Config, part_min: int = _objstore.PART_MIN) -> None:
    """Uploads [(key, local path)] under `url`, concurrently; every store's
    meta after its index and data (a store is published by its meta); files
    in multipart parts of at least `part_min` bytes (`_objstore.part_plan`)."""
    last = [p for p in pairs if p[0].rsplit("/", 1)[-1] in ("meta", "loaderx.json")]
    first = [p for p in pairs if p not in last]
    for batch in (first, last):
        map_concurrently(lambda p: _objstore.put(join(url, p[0]), cfg.options, p[1],
                                                 part_min=part_min), batch)


def _refuse_read_only(url: str) -> None:
    if not _objstore.writable(url):
        raise ReadOnlyError(f"{url}: {_objstore.scheme(url)}:// is read-only; write to s3://, "
                            "gs:// or az://", path=url)


def _occupied(url: str, cfg: Config) -> bool:
    """Whether any object lives under the prefix `url`."""
    try:
        return bool(_objstore.list_keys(url, cfg.options, limit=1))
    except RemoteNotFoundError:
        return False


def _exists_error(url: str, mode_hint: str) -> Exception:
    return DestinationExistsError(f"{url} already exists; pass {mode_hint}", path=url)


def write_store_to(url: str, mode: str, build: Callable[[str], Any],
                   cfg: Optional[Config] = None) -> None:
    """A single store for `url`: `build(local_dir)` writes and closes it
    locally, then it is uploaded (its meta last; the caller opens it from
    `url`). ``mode="append"`` is refused (append to a dataset instead)."""
    cfg = cfg or config()
    check_mode(mode)
    _refuse_read_only(url)
    url = url.rstrip("/")
    if mode == "append":
        raise ReadOnlyError(f"{url}: a remote store cannot be appended to in place; write a "
                            "dataset (loaderx.convert) and append parts to it", path=url)
    if mode == "create" and _occupied(url, cfg):
        raise _exists_error(url, 'mode="overwrite" to replace it')
    if mode == "overwrite" and _occupied(url, cfg) and not exists(join(url, "meta"), cfg):
        raise _exists_error(url, "another destination (it holds something that is not a "
                                 "loaderx store; remove it yourself)")
    with cfg.cache().staging() as local:  # held while in use, removed after
        path = os.path.join(local, "store")
        build(path)
        _upload(_files_under(path), url, cfg)


class Target:
    """A dataset destination in object storage, from the existence check to
    the published manifest (or nothing, on abort)."""

    def __init__(self, url: str, mode: str, cfg: Optional[Config] = None, cli: bool = False):
        self.cfg = cfg or config()
        check_mode(mode)
        _refuse_read_only(url)
        self.url = url.rstrip("/")
        self.old: Optional[dict] = None
        self.old_etag: Optional[str] = None
        if _occupied(self.url, self.cfg):
            try:
                text, self.old_etag = read_bytes(join(self.url, MANIFEST_NAME), self.cfg)
                self.old = checked_manifest(self.url, text)
            except RemoteNotFoundError:
                self.old = None
            if mode == "create":
                raise _exists_error(self.url, "--append or --overwrite" if cli
                                    else 'mode="append" or mode="overwrite"')
            if self.old is None:
                raise _exists_error(self.url, "another destination (it holds something that "
                                              "is not a loaderx dataset; remove it yourself)")
            if mode == "append" and "splits" in self.old:
                raise ConvertError(f"{self.url} holds splits; append to one split's directory")
        elif mode == "append":
            mode = "create"  # nothing there yet: as a local append would
        self.mode = mode
        self.uploaded: list = []

    def upload(self, local_root: str, fresh: dict) -> dict:
        """Uploads the local dataset directory `local_root` (its manifest
        `fresh`) where this write puts it, and returns the manifest to
        publish. Every write's objects have names of their own, so two
        writers never touch each other's: a create or overwrite puts the
        dataset in a new generation directory (``gen-<random>``), an append
        puts its parts in the dataset's generation under new names."""
        import random

        uid = "".join(random.choice("0123456789") for _ in range(12))
        move, manifest = _relocation(fresh, self.old if self.mode == "append" else None, uid)
        if self.mode == "append":
            assert self.old is not None  # an append to nothing became a create
            manifest = _appended(self.url, self.old, manifest)
        pairs = [(move(key), path) for key, path in _files_under(local_root)
                 if key != MANIFEST_NAME]
        self.uploaded += [join(self.url, k) for k, _ in pairs]
        _upload(pairs, self.url, self.cfg)
        return manifest

    def publish(self, manifest: dict) -> dict:
        """Writes `manifest` (from `upload`) with a conditional put; an
        overwrite then deletes the old dataset's objects."""
        import json

        body = (json.dumps(manifest, indent=2) + "\n").encode()
        put_mode: Any = "create" if self.old is None else {"e_tag": self.old_etag}
        try:
            _objstore.put(join(self.url, MANIFEST_NAME), self.cfg.options, body, put_mode)
        except Exception as e:
            raise _commit_error(self.url, e, self.mode) from None
        self.uploaded = []  # published: the manifest names them now
        if self.mode == "overwrite" and self.old is not None:
            _objstore.delete_many(_named_objects(self.url, self.old, self.cfg), self.cfg.options)
        return manifest

    def abort(self) -> None:
        """Deletes what this write uploaded and did not publish."""
        uploaded, self.uploaded = self.uploaded, []
        _objstore.delete_many(uploaded, self.cfg.options)


def write_dataset_to(url: str, mode: str, build: Callable[[str], dict],
                     cfg: Optional[Config] = None, cli: bool = False) -> dict:
    """A dataset for `url`: `build(local_dir)` converts into a new local
    directory and returns its manifest; the dataset is then uploaded and
    published per `mode` (see above). Returns the manifest written."""
    target = Target(url, mode, cfg, cli)
    try:
        with target.cfg.cache().staging() as local:
            root = os.path.join(local, "ds")
            fresh = build(root)
            if target.mode == "append" and target.old is not None:
                _appended(target.url, target.old, fresh)  # refuse a mismatch before uploading
            return target.publish(target.upload(root, fresh))
    finally:
        target.abort()


def _commit_error(url: str, e: Exception, mode: str) -> Exception:
    if isinstance(e, RemoteChangedError):
        return LockedError(f"{url}: another writer changed this dataset's manifest while this "
                           f"{mode} ran; nothing was published (run it again)", path=url)
    if isinstance(e, DestinationExistsError):
        return LockedError(f"{url}: another writer created this dataset while this conversion "
                           "ran; nothing was published", path=url)
    if "not supported" in str(e).lower() or "notimplemented" in str(e).lower():
        return ReadOnlyError(f"{url}: this service has no conditional writes, so an {mode} could "
                             "lose another writer's shards; refused (nothing was published)",
                             path=url)
    return e


def _relocation(fresh: dict, old: Optional[dict], uid: str) -> tuple:
    """``(key map, manifest)`` for uploading the local dataset `fresh`: to a
    new generation directory ``gen-<uid>``, or (an append to `old`) as parts
    named ``<uid>-part-NNNNN`` in `old`'s generation (or, for a version 1
    dataset, beside its parts)."""
    import copy
    own = fresh.get("generation")

    def inner(key: str) -> str:  # the key below fresh's own generation directory
        head, sep, rest = key.partition("/")
        return rest if own is not None and head == own and sep else key
    if old is None:
        gen = f"gen-{uid}"

        def move(key: str) -> str:
            return f"{gen}/{inner(key)}"
    else:
        base = old.get("generation")

        def move(key: str) -> str:
            folder, _, name = inner(key).rpartition("/")
            up, _, part = folder.rpartition("/")
            part = f"{up}/{uid}-{part}" if up else f"{uid}-{part}"
            return f"{base}/{part}/{name}" if base else f"{part}/{name}"
    m = copy.deepcopy(fresh)
    if old is None and own is not None:
        m["generation"] = gen
    if "splits" in m:
        m["splits"] = {k: move(f"{v}/x").rpartition("/")[0] for k, v in m["splits"].items()}
    else:
        for col in m["columns"].values():
            for sh in col["shards"]:
                sh["path"] = move(f"{sh['path']}/meta").rpartition("/")[0]
    return move, m


def _appended(url: str, old: dict, fresh: dict) -> dict:
    """The manifest of `old` with the shards of `fresh` added, after the
    checks a local append makes."""
    import copy
    if list(fresh["columns"]) != list(old["columns"]):
        raise ConvertError(f"{url}: appending columns {list(fresh['columns'])} to a dataset with "
                           f"columns {list(old['columns'])}; they must be the same")
    m = copy.deepcopy(old)
    for name, col in fresh["columns"].items():
        have = m["columns"][name]
        for key in ("kind", "dtype", "item_shape"):
            if have.get(key) != col.get(key):
                raise IdentityError(f"{url}: column {name!r} holds {key}={have.get(key)}, the new "
                                    f"data has {key}={col.get(key)}", path=url)
        have["shards"] += col["shards"]
    m["rows"] = old["rows"] + fresh["rows"]
    m["appended"] = list(old.get("appended", [])) + [fresh.get("source", {})]
    m["updated"] = fresh.get("updated", m.get("updated"))
    return m


def _named_objects(url: str, manifest: dict, cfg: Config) -> list:
    """Every object of the dataset a manifest describes (an overwrite's old
    data): its generation directory, or (version 1) the stores it names."""
    gen = manifest.get("generation")
    if gen is not None:
        prefix = join(url, gen)
        return [join(prefix, k) for k, _ in _objstore.list_keys(prefix, cfg.options)]
    out = []
    if "splits" in manifest:
        for sub in manifest["splits"].values():
            try:
                text, _ = read_bytes(join(url, sub, MANIFEST_NAME), cfg)
            except RemoteNotFoundError:
                continue
            out += _named_objects(join(url, sub), checked_manifest(url, text), cfg)
            out.append(join(url, sub, MANIFEST_NAME))
        return out
    for col in manifest["columns"].values():
        for sh in col["shards"]:
            out += [join(url, sh["path"], f) for f in ("meta", "index", "data")]
    return out


# ----------------------------------------------------------------- the opener of URLs

class _Opener:
    """Object storage as the core reaches it (`loaderx._openers.Remote`):
    registered below, so no store or dataset module imports this one."""

    @staticmethod
    def bind(url: str) -> Binding:
        return bind_for_open(url)

    @staticmethod
    def opening(bound: Any) -> Any:
        return opening(bound)

    @staticmethod
    def concurrently(fn: Callable, items: Sequence) -> list:
        return map_concurrently(fn, items)

    @staticmethod
    def exists(url: str) -> bool:
        return exists(url)

    @staticmethod
    def settings(cache_dir: Any, cache_limit: Any, storage_options: Any) -> Any:
        return using(config(cache_dir, cache_limit, storage_options))

    @staticmethod
    def resume(cfg: Config) -> Any:
        return using(cfg)

    @staticmethod
    def manifest_text(url: str) -> bytes:
        return manifest_text(url)

    @staticmethod
    def write_store(url: str, mode: str, build: Callable[[str], Any]) -> None:
        write_store_to(url, mode, build)

    @staticmethod
    def write_dataset(url: str, mode: str, build: Callable[[str], dict], cli: bool) -> dict:
        return write_dataset_to(url, mode, build, cli=cli)


_openers.register(_Opener())
