"""The node-local cache of remote stores as Python holds it: thin wrappers of
the native cache and replica handles (src/Cache.zig owns the cache directory
and the protocol its processes share, src/Replica.zig a replica), the cache's
settings, and the ``loaderx cache`` command's view of a directory. Nothing
here knows a byte of the cache's files: loaderx/remote.py fetches what a
native fetch plan names, and that is all Python does for the cache."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import uuid
from typing import Any, Iterator, Optional

import numpy as np

from . import _abi
from ._checks import is_int
from ._lib import check, error_for, ffi, lib
from .errors import InvalidArgumentError

__all__ = ["Cache", "Replica", "parse_limit", "describe", "clear", "CACHE_POLICY"]

#: How a cache sizes itself and plans fetches (src/Cache.zig, ``Policy``):
#: the library's defaults, passed at every open of a cache (so a change here
#: holds for caches opened after it). ``limit`` comes from ``cache_limit``.
CACHE_POLICY: dict = dict(_abi.CACHE_POLICY)

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40}


def parse_limit(limit: Any) -> Optional[int]:
    """`cache_limit` as bytes: an int, or a string such as ``"200GiB"``,
    ``"500MB"``; None for no fixed limit."""
    if limit is None:
        return None
    if is_int(limit):
        if limit <= 0:
            raise InvalidArgumentError(f"cache_limit must be positive, got {limit}")
        return int(limit)
    if isinstance(limit, str):
        text = limit.strip().lower().replace(" ", "")
        num = text.rstrip("kmgtib")
        unit = text[len(num):]
        try:
            value = float(num)
        except ValueError:
            value = -1.0
        if unit in _UNITS and value > 0:
            return int(value * _UNITS[unit])
    raise InvalidArgumentError(f"cache_limit must be a positive number of bytes or a size such "
                               f"as '200GiB', got {limit!r}")


class Cache:
    """One cache directory, as this process uses it: the native handle (one
    per directory and process; a forked child claims its own slot natively).
    `Cache.get(root)`."""

    _instances: dict = {}
    _instances_lock = threading.Lock()

    @classmethod
    def get(cls, root: str, limit: Optional[int] = None) -> "Cache":
        """The cache at `root` (made if missing); made again if the directory
        was replaced (deleted and made anew) since. `limit` (when given) is
        its cache_limit from now on."""
        root = os.path.realpath(os.path.expanduser(root))
        with cls._instances_lock:
            c = cls._instances.get(root)
            if c is None or not c.stats().current:
                c = cls._instances[root] = cls(root)
        if limit is not None:
            c.limit = limit
        c.configure()
        return c

    def __init__(self, root: str, create: bool = True):
        self.root = root
        self.stores = os.path.join(root, "stores")
        self.limit: Optional[int] = None
        out = ffi.new("lx_cache **")
        check(lib.lx_cache_open(os.fsencode(root), 1 if create else 0, ffi.NULL, out), root,
              "opening the node-local cache")
        self.h = ffi.gc(out[0], lib.lx_cache_close)
        self.replicas: dict = {}  # native address -> Replica
        self.warned: dict = {}  # warning kind -> the pid that gave it (once per process)
        self._lock = threading.Lock()

    def configure(self) -> None:
        policy = ffi.new("lx_cache_policy_t *", dict(CACHE_POLICY, limit=self.limit or 0))
        check(lib.lx_cache_configure(self.h, policy), self.root)

    def stats(self) -> Any:
        """``lx_cache_stats_t``: tick, used, seq, limit, free, reserve, slot,
        read_mark, pin_mark, reads, pins, current, preallocate."""
        out = ffi.new("lx_cache_stats_t *")
        check(lib.lx_cache_stats(self.h, out), self.root)
        return out

    def used(self) -> int:
        return int(self.stats().used)

    def evict(self, unpin: bool = False) -> int:
        """Evicts what the limit asks now (after dropping this process's kept
        prefetches with `unpin`); returns the FETCH_FLAGS warning bits."""
        warn = ffi.new("uint32_t *")
        check(lib.lx_cache_evict(self.h, 1 if unpin else 0, warn), self.root)
        return int(warn[0])

    def replica(self, key: str, meta: Optional[bytes] = None, source: Optional[dict] = None,
                index: Optional[bytes] = None, weak: bool = False,
                where: Optional[str] = None) -> "Replica":
        """Replica `key` (made from `meta`, and the whole `index` of a server
        without ETags, when it is missing or damaged; with `meta` None, as it
        is, `StoreNotFoundError` when it is not whole). Errors name `where`."""
        text = json.dumps(source or {}, indent=2).encode()
        # Every buffer the spec points to stays referenced here until the call returns.
        parts = {"key": ffi.new("char[]", os.fsencode(key)),
                 "meta": ffi.from_buffer("uint8_t[]", meta) if meta is not None else ffi.NULL,
                 "source": ffi.from_buffer("uint8_t[]", text),
                 "index": ffi.from_buffer("uint8_t[]", index) if index else ffi.NULL}
        spec = ffi.new("lx_replica_spec_t *", dict(
            parts, meta_len=len(meta) if meta is not None else 0, source_len=len(text),
            index_len=len(index) if index else 0, weak=1 if weak else 0))
        out = ffi.new("lx_replica **")
        check(lib.lx_replica_open(self.h, spec, out), where)
        del parts
        address = int(ffi.cast("uintptr_t", out[0]))
        with self._lock:
            r = self.replicas.get(address)
            if r is None:
                r = self.replicas[address] = Replica(self, out[0], key)
        return r

    def warn_once(self, kind: str) -> bool:
        """Whether warning `kind` is still to be given in this process."""
        if self.warned.get(kind) == os.getpid():
            return False
        self.warned[kind] = os.getpid()
        return True

    @contextlib.contextmanager
    def staging(self) -> Iterator[str]:
        """A new directory under ``uploads/`` for a conversion's files, held
        while in use (`clear` leaves it) and removed after."""
        name = uuid.uuid4().hex
        fd = ffi.new("int32_t *")
        check(lib.lx_cache_stage(self.h, name.encode(), fd), self.root, "staging")
        d = os.path.join(self.root, "uploads", name)
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)
            os.close(fd[0])

    def users(self) -> list:
        pids = ffi.new("int64_t[]", 64)
        count = ffi.new("uint64_t *")
        check(lib.lx_cache_users(self.h, pids, 64, count), self.root)
        return [int(p) for p in pids[0:min(64, int(count[0]))]] + [-1] * max(0, count[0] - 64)

    def uploads(self) -> tuple[list, int]:
        """(names of staging directories no conversion holds, count of held ones)."""
        buf = ffi.new("uint8_t[]", 1 << 16)
        n = ffi.new("uint64_t *")
        live = ffi.new("uint64_t *")
        check(lib.lx_cache_uploads(self.h, buf, len(buf), n, live), self.root)
        names = bytes(ffi.buffer(buf, n[0])).split(b"\0")
        return [x.decode() for x in names if x], int(live[0])


class Replica:
    """One replica as this process holds it: the native handle (owned by its
    cache), and the background fetch of its whole index."""

    def __init__(self, cache: Cache, h: Any, key: str):
        self.cache = cache
        self.h = h
        self.key = key
        self.dir = os.path.join(cache.stores, key)
        self.whole_index: Optional[threading.Thread] = None
        self.records = int(self.info().record_count)

    def info(self) -> Any:
        """``lx_replica_info_t``: geometry (record_count, data_size, fixed_size,
        index_size, index_shift, data_shift, index_blocks, data_blocks,
        regions) and counters (present_bytes, index_missing, evictions,
        checked_at, fetched, fetched_data, index_gets, whole_running,
        whole_started)."""
        out = ffi.new("lx_replica_info_t *")
        check(lib.lx_replica_info(ffi.NULL, ffi.NULL, self.h, out), self.dir)
        return out

    @property
    def fetched(self) -> int:
        """Bytes this process fetched for this replica (index and data)."""
        return int(self.info().fetched)

    def spans(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The data byte ranges ``[starts, ends)`` of `records` (each in the
        store, its index entry cached)."""
        u = np.ascontiguousarray(records, dtype=np.uint64)
        starts, ends = np.empty_like(u), np.empty_like(u)
        check(lib.lx_replica_spans(self.h, ffi.from_buffer("uint64_t[]", u), len(u),
                                   ffi.from_buffer("uint64_t[]", starts, require_writable=True),
                                   ffi.from_buffer("uint64_t[]", ends, require_writable=True)),
              self.dir)
        return starts.astype(np.int64), ends.astype(np.int64)


def _opened(root: str) -> Cache:
    """The cache directory `root` as this process has it, else opened
    without making anything (`StoreNotFoundError` when it is not a cache)."""
    root = os.path.realpath(os.path.expanduser(os.fspath(root)))
    mine = Cache._instances.get(root)
    return mine if mine is not None else Cache(root, create=False)


def _disk_bytes(path: str) -> int:
    """Bytes `path` (a file or a tree) takes on disk (holes excluded)."""
    total = 0
    for dirpath, _, files in os.walk(path) if os.path.isdir(path) else [("", [], [path])]:
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total


def _replica_entry(c: Cache, name: str) -> dict:
    d = os.path.join(c.stores, name)
    entry: dict = {"key": name, "url": None, "versions": None}
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(d, "source.json"), encoding="utf-8") as f:
            source = json.load(f)
        entry["url"], entry["versions"] = source.get("url"), source.get("etags")
    out = ffi.new("lx_replica_info_t *")
    rc = lib.lx_replica_info(c.h, os.fsencode(name), ffi.NULL, out)
    if rc:
        entry["error"] = str(error_for(rc))
    else:
        entry.update(records=int(out.record_count), size_bytes=int(out.index_size + out.data_size),
                     cached_bytes=int(out.present_bytes))
    entry["disk_bytes"] = _disk_bytes(d)
    return entry


def describe(root: str) -> dict:
    """What the cache directory `root` holds: its replicas (URL, versions,
    records, bytes cached of their full size), the bytes on disk, the
    processes using it, and the staging directories of conversions (live,
    or left by a conversion that was killed)."""
    c = _opened(root)
    users = c.users()
    left, live = c.uploads()
    names = sorted(os.listdir(c.stores)) if os.path.isdir(c.stores) else []
    replicas = [_replica_entry(c, n) for n in names if not n.startswith(".")]
    return {
        "root": c.root,
        "cached_bytes": sum(r.get("cached_bytes", 0) for r in replicas),
        "disk_bytes": _disk_bytes(c.root),
        "processes": users,
        "replicas": replicas,
        "uploads_live": live,
        "uploads_left": len(left),
        "uploads_left_bytes": sum(_disk_bytes(os.path.join(c.root, "uploads", n)) for n in left),
    }


def clear(root: str) -> int:
    """Empties the cache directory `root`: every replica, what killed
    conversions left under ``uploads/`` and what an interrupted clear left.
    Refused (`BusyError`, naming the processes) while a process uses the
    cache; the staging directory of a conversion still running is left
    alone. Returns the bytes freed on disk."""
    c = _opened(root)
    gone = f".cleared-{uuid.uuid4().hex[:8]}"
    check(lib.lx_cache_clear(c.h, gone.encode()))
    path = os.path.join(c.root, gone)
    freed = _disk_bytes(path)
    shutil.rmtree(path, ignore_errors=True)
    return freed
