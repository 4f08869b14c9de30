"""The node-local cache of remote stores: a partial local replica per store
version, shared by every process on the node.

Layout of a cache directory::

    lock          flock: the cache's state lock (short sections, no I/O wait)
    state         mapped: tick counter, bytes present, one watermark per slot
    slots.lock    byte k: a POSIX lock held by the live process in slot k
    stores/<key>/ a replica: meta, index, data (sparse, at their own
                  offsets), lock, cache.state (presence bitmaps, region
                  access ticks), index.fetch and data.fetch (fetch locks),
                  source.json (the URL and versions, for people)

A replica IS a store directory: ``meta`` is the server's, complete and
checked at open; ``index`` and ``data`` have their full sizes with holes
where nothing was fetched. The native engine opens it as any store and reads
cached records through its mappings, exactly as it reads a local store.
Nothing reads a record before `Replica.ensure` made it present and checked.

Presence. ``index`` and ``data`` are tracked in blocks (512 B to 64 KiB,
chosen per store from its sizes, so a random record costs a few percent of
overfetch and a bitmap stays small): bit b set = block b holds the server's
bytes. A process fetches a block's bytes, writes them at their offset, and
only then sets the bit (under the lock), so a killed process never leaves a
block marked present that is not; a power loss can (the bitmap may reach the
disk before the data), which the next check catches: every record's
checksum is checked on its first read by each process, and a record that
fails is dropped from the cache and fetched again (then, if the server's
bytes fail too, `CorruptStoreError`).

No read of a replica faults. A hole of a sparse file read or written
through a shared mapping needs a fresh page, which a full tmpfs cannot give
(SIGBUS), so every page that is mapped is allocated first: ``cache.state``
whole when it is made, a fetch's blocks (``fallocate``, where a mapped
hole can fault: not on ext4, xfs or btrfs) before its bytes are written;
and nothing reads a block that is not marked present. A fetch
that fails punches every range it was to write (nothing of it is marked,
so nothing else would ever free it). A full file system is a
`NoSpaceError` naming the cache, after one more try: the fetch first evicts
what no reader uses and punches bytes no block marks present (`sweep`:
what a process killed mid-fetch wrote). The limit counts what blocks take
on disk, in whole 4 KiB units.

A replica that is not whole (a file missing or of the wrong size; see
`Cache.intact`) is moved aside and made again under the cache's lock at
the next open; its users keep their open files.

Each byte is fetched once per node: a fetcher holds POSIX byte-range locks
on the blocks it fetches (``*.fetch``, byte b = block b); another process
that needs them waits for those locks (never while holding its own), then
finds the blocks present. Locks of a process that dies are released by the
kernel, and its unmarked blocks are simply fetched again.

Eviction (``cache_limit``). ``data`` is evicted in regions of 64 blocks,
least recently used first (a global tick stamped on every region a read
touches), by clearing their bits and punching holes (``fallocate``), under
the lock and the region's fetch locks. It never drops what a reader uses:
each process publishes in its slot two watermarks, the tick of its oldest
gather in flight and that of the oldest of its last `PIN_CALLS` prefetches
(which the loader reads next; a prefetch also stamps its regions'
``ptime``), and a read stamps its regions with its tick before it looks at
their bits. A read takes no lock for it (src/replica.zig: the watermark
and the stamps come before the read of the cache's eviction sequence,
which an eviction makes odd before it reads any of them; a read that meets
an eviction waits for it, one that follows an eviction checks its records
again). Only regions last read before every live
process's oldest gather, and last prefetched before every oldest kept
prefetch, are evicted; a slot whose process died is ignored.
When everything is in use, the cache grows past its limit instead of
waiting: eviction only ever slows reads, never blocks them. The index is
never evicted (at most 32 B per record). Only replicas are ever evicted:
nothing in the cache is the only copy of anything.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import mmap
import os
import shutil
import struct
import sys
import threading
import time
import uuid
import warnings
from typing import Any, Callable, Iterator, Optional

import numpy as np

from ._checks import is_int
from ._lib import check, ffi, lib
from .errors import (
    BusyError,
    CorruptStoreError,
    InvalidArgumentError,
    LoaderxError,
    NoSpaceError,
    StoreNotFoundError,
    ZrecordIOError,
)

__all__ = ["Cache", "Replica", "Layout", "parse_limit"]

_MAGIC = 0x31454843584C  # "LXCHE1"
_GLOBAL_SIZE = 4096 + 1024 * 16
_USED_AT = 3 * 8  # the state's bytes present: word 3 of its head (see Cache._head)
_VERSION = 2
_STATE_MAGIC = 0x31415453584C  # "LXSTA1"
SLOTS = 1024
_NONE = np.uint64(2**64 - 1)
#: Prefetch calls a process keeps protected from eviction (the loader reads
#: each prefetched step within this many later prefetches; src/replica.zig).
PIN_CALLS = len(ffi.new("lx_reads_t *").pins)
#: Fetch planning: blocks closer than MAX_GAP bytes are fetched in one
#: request (the gap's bytes are read and dropped), up to REQUEST_MAX bytes.
MAX_GAP = 4 << 10
REQUEST_MAX = 8 << 20
#: The whole index is fetched (in the background, WHOLE_INDEX_CHUNK bytes a
#: request) once this process has fetched WHOLE_INDEX_AFTER times its missing
#: bytes in data, or has made as many GETs of index blocks as the missing
#: index is worth at INDEX_REQUEST_BYTES a GET (having paid for it once in
#: requests, it buys it: never more than twice the cheaper of the two), and
#: when it is at most 1/WHOLE_INDEX_SHARE of the cache's limit: a random
#: batch's records then cost no index GETs (one per record where the index
#: is large).
WHOLE_INDEX_AFTER = 4
WHOLE_INDEX_SHARE = 8
WHOLE_INDEX_CHUNK = 1 << 20
#: What one ranged GET costs, in bytes of transfer: a batch whose index
#: blocks would take more GETs than the whole missing index is worth at this
#: rate fetches the index whole instead, in WHOLE_INDEX_CHUNK requests (a
#: 10^6-record raw store's 4 MB of checksums: 4 GETs instead of one per
#: record). A GET of 12 KiB cost ~0.65 ms on the bench's loopback server,
#: where a large GET streams ~450 MB/s (~300 KB in that time); on S3 a
#: request's first byte costs tens of ms, megabytes of transfer.
INDEX_REQUEST_BYTES = 64 << 10
#: ... and only while the missing index is at most this: one round of
#: concurrent WHOLE_INDEX_CHUNK requests, so a batch of thousands of records
#: never waits for hundreds of megabytes of index (a larger one comes in the
#: background, see WHOLE_INDEX_AFTER).
INDEX_WITH_BATCH_MAX = 16 << 20
#: A process waits this long for another's fetch of the same blocks, then
#: fetches them itself.
FETCH_WAIT_S = 120.0
#: Without a cache_limit: keep this share of the file system free (at least 1 GiB).
FREE_RESERVE = 0.05
_REGION_BLOCKS = 64  # data blocks per eviction region: one u64 of bitmap

_ENTRY_DTYPE = np.dtype([("offset", "<u8"), ("stored", "<u8"), ("raw", "<u8"),
                         ("checksum", "<u4"), ("codec", "u1"), ("reserved", "u1"),
                         ("aux", "<u2")])
assert _ENTRY_DTYPE.itemsize == 32

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


def _log2_floor(x: float) -> int:
    return max(0, int(x).bit_length() - 1) if x >= 1 else 0


def _log2_ceil(x: int) -> int:
    return (int(x) - 1).bit_length() if x > 1 else 0


class Layout:
    """What a replica's geometry depends on: the store's shape (from its
    meta) and the blocks chosen for it."""

    def __init__(self, record_count: int, data_size: int, fixed: int):
        self.record_count = record_count
        self.data_size = data_size
        self.fixed = fixed
        self.entry = 4 if fixed else 32
        self.index_size = record_count * self.entry
        avg = data_size / record_count if record_count else 0
        # Data blocks: about an eighth of a record (overfetch of a random
        # record ~ one block), >= 512 B, and at most 2**27 of them.
        self.dshift = min(24, max(9, _log2_floor(avg / 8), _log2_ceil(-(-data_size // 2**27))))
        # Index blocks: also <= an eighth of a record, and ~4096 of them at most.
        want = min(self.index_size / 4096, avg / 8) if record_count else 0
        self.ishift = min(16, max(9, _log2_floor(want)))
        self.dblocks = -(-data_size >> self.dshift) if data_size else 0
        self.iblocks = -(-self.index_size >> self.ishift) if self.index_size else 0
        self.regions = -(-self.dblocks // _REGION_BLOCKS)


_STATE_HEADER = struct.Struct("<QQQQQQQQQQ")  # magic, version, count, data, fixed, ishift,
#                                               dshift, iblocks, regions, evictions
_EVICTIONS_AT = 9 * 8


class _ReplicaState:
    """The mapped ``cache.state`` of one replica (any process's view)."""

    def __init__(self, path: str, layout: Optional[Layout] = None):
        fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        try:
            size = os.fstat(fd).st_size
            if size < 4096:
                raise CorruptStoreError(f"{path}: cache state is truncated")
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        head = _STATE_HEADER.unpack_from(self.mm, 0)
        if head[0] != _STATE_MAGIC or head[1] != 1:
            raise CorruptStoreError(f"{path}: not a loaderx cache state")
        count, data, fixed = head[2], head[3], head[4]
        self.layout = layout or Layout(count, data, fixed)
        lay = self.layout
        if (lay.record_count, lay.data_size, lay.fixed, lay.ishift, lay.dshift, lay.iblocks,
                lay.regions) != head[2:9] or size < _state_size(lay):
            raise CorruptStoreError(f"{path}: cache state disagrees with its store")
        ibytes, dwords = _bitmap_sizes(lay)
        self.header = np.frombuffer(self.mm, np.uint64, 10, 0)
        self.ibits = np.frombuffer(self.mm, np.uint8, ibytes, 4096)
        self.dwords = np.frombuffer(self.mm, np.uint64, dwords, 4096 + ibytes)
        self.dbits = self.dwords.view(np.uint8)
        self.atime = np.frombuffer(self.mm, np.uint64, dwords, 4096 + ibytes + dwords * 8)
        self.ptime = np.frombuffer(self.mm, np.uint64, dwords, 4096 + ibytes + dwords * 16)

    @property
    def evictions(self) -> int:
        return int(self.header[9])


#: A file system allocates in units of 2**_DISK_SHIFT bytes (a tmpfs page, an
#: ext4 or xfs block): a present block smaller than that still takes a whole
#: unit on disk, which is what the cache counts against its limit (eight
#: random 512 B blocks are 32 KiB of a tmpfs, not 4 KiB).
_DISK_SHIFT = 12


def _footprint(words: np.ndarray, shift: int) -> int:
    """Bytes on disk of the present blocks of bitmap `words` (uint64, each
    64 aligned blocks of 2**shift bytes), in whole allocation units."""
    if shift >= _DISK_SHIFT:
        return int(_popcount64(words).sum()) << shift
    per = 1 << (_DISK_SHIFT - shift)  # blocks per unit: 2 to 8
    folded = np.array(words, np.uint64)
    step = 1
    while step < per:  # bit k becomes the OR of bits k .. k + per - 1
        folded |= folded >> np.uint64(step)
        step <<= 1
    first = np.uint64(sum(1 << k for k in range(0, 64, per)))  # each unit's first bit
    return int(_popcount64(folded & first).sum()) << _DISK_SHIFT


def _present_bytes(st: _ReplicaState) -> int:
    """Bytes a replica's present blocks take on disk, index and data."""
    lay = st.layout
    return _footprint(st.dwords, lay.dshift) + _footprint(st.ibits.view(np.uint64), lay.ishift)


def _bitmap_sizes(lay: Layout) -> tuple[int, int]:
    ibytes = -(-lay.iblocks // 64) * 8
    return ibytes, lay.regions


def _state_size(lay: Layout) -> int:
    ibytes, dwords = _bitmap_sizes(lay)
    return 4096 + ibytes + dwords * 24


def _create_state(path: str, lay: Layout) -> None:
    """A replica's state file, every page of it on disk: the bitmaps and
    ticks are written through a shared mapping, and a write (or a read) of
    a hole of a full tmpfs through one is a SIGBUS."""
    size = _state_size(lay)
    with open(path, "wb") as f:
        f.write(_STATE_HEADER.pack(_STATE_MAGIC, 1, lay.record_count, lay.data_size, lay.fixed,
                                   lay.ishift, lay.dshift, lay.iblocks, lay.regions, 0))
        f.truncate(size)
        f.flush()
        if _fallocate_fn() is not None:
            _allocate(f.fileno(), 0, size)
        if os.fstat(f.fileno()).st_blocks * 512 < size:  # no fallocate here: real zeros
            zeros = bytes(1 << 20)
            for at in range(4096, size, len(zeros)):
                f.seek(at)
                f.write(zeros[:min(len(zeros), size - at)])


def _popcount64(words: np.ndarray) -> np.ndarray:
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(words).astype(np.int64)
    return np.unpackbits(words.view(np.uint8)).reshape(-1, 64).sum(1).astype(np.int64)


def _bits_get(bits: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    return ((bits[blocks >> 3] >> (blocks & 7).astype(np.uint8)) & 1).astype(bool)


def _bits_set(bits: np.ndarray, blocks: np.ndarray) -> int:
    """Sets the bits of `blocks` (unique); returns how many were clear."""
    if not len(blocks):
        return 0
    new = int((~_bits_get(bits, blocks)).sum())
    np.bitwise_or.at(bits, blocks >> 3, (1 << (blocks & 7)).astype(np.uint8))
    return new


def _bits_clear(bits: np.ndarray, blocks: np.ndarray) -> None:
    if len(blocks):
        np.bitwise_and.at(bits, blocks >> 3, (~(1 << (blocks & 7))).astype(np.uint8))


def _runs(blocks: np.ndarray) -> list:
    """Sorted unique blocks as ``[(first, end), ...]`` runs of consecutive ones."""
    if not len(blocks):
        return []
    cut = np.flatnonzero(np.diff(blocks) != 1) + 1
    firsts = np.concatenate(([blocks[0]], blocks[cut]))
    lasts = np.concatenate((blocks[cut - 1], [blocks[-1]]))
    return list(zip(firsts.tolist(), (lasts + 1).tolist()))


def _spans(first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """The sorted unique union of the block ranges ``[first[i], last[i]]``."""
    if not len(first):
        return np.zeros(0, np.int64)
    lengths = last - first + 1
    total = int(lengths.sum())
    starts = np.repeat(first - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return np.unique(starts + np.arange(total, dtype=np.int64))


def _requests(runs: list, sh: int, size: int, request_max: int) -> tuple[list, list, list]:
    """``(starts, ends, keeps)`` of the requests that fetch block `runs`
    (sorted ``(first, end)`` runs of blocks of 2**sh bytes of a file of
    `size` bytes): runs closer than MAX_GAP merged into one request of at
    most `request_max` bytes (the gap is read and dropped), longer ones
    split; ``keeps[i]`` are the byte ranges of request i to write."""
    starts: list = []
    ends: list = []
    keeps: list = []
    for b0, b1 in runs:
        lo, hi = b0 << sh, min(b1 << sh, size)
        if starts and lo - ends[-1] <= MAX_GAP and hi - starts[-1] <= request_max:
            ends[-1] = hi
            keeps[-1].append((lo, hi))
            continue
        while hi - lo > request_max:
            starts.append(lo)
            ends.append(lo + request_max)
            keeps.append([(lo, lo + request_max)])
            lo += request_max
        starts.append(lo)
        ends.append(hi)
        keeps.append([(lo, hi)])
    return starts, ends, keeps


#: What a write to a full file system fails with (a full disk, a user's quota).
_FULL = (errno.ENOSPC, errno.EDQUOT)

_libc: Any = None


def _fallocate_fn() -> Any:
    """libc's ``fallocate`` (the Linux system call, never glibc's
    ``posix_fallocate`` emulation, which writes zeros over bytes another
    process may be writing), or None where there is none."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64,
                                        ctypes.c_int64]
        except (OSError, AttributeError):
            _libc = False
    return _libc.fallocate if _libc else None


def _allocate(fd: int, offset: int, length: int) -> None:
    """Gives the byte range of a file its blocks before anything is written
    there: a full file system says so here (`OSError` ENOSPC) instead of
    halfway through a write, and a tmpfs page that is on disk can be read
    through a mapping without a fault (a hole of a full tmpfs read that way
    is a SIGBUS). A file system without ``fallocate`` is left as it is."""
    fn = _fallocate_fn()
    if length <= 0 or fn is None:
        return
    while fn(fd, 0, offset, length) != 0:
        err = ctypes.get_errno()
        if err == errno.EINTR:
            continue
        if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return  # (no preallocation here: the writes report a full disk)
        raise OSError(err, os.strerror(err))


#: File systems whose holes read through a mapping as the zero page and
#: whose writes fail cleanly when full (ext2-4, xfs, btrfs, by statfs
#: f_type): a fetch there skips allocating its blocks first (a few
#: microseconds a range). Anything else (tmpfs, an overlay on one, a
#: system that does not say) is allocated first.
_BLOCK_FILE_SYSTEMS = (0xEF53, 0x58465342, 0x9123683E)


def _maps_need_pages(path: str) -> bool:
    """Whether a fetch into a cache at `path` allocates its blocks before
    writing them (see _BLOCK_FILE_SYSTEMS)."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(256)  # struct statfs; f_type first
        if libc.statfs(os.fsencode(path), buf) != 0:
            return True
    except (OSError, AttributeError):
        return True
    return struct.unpack_from("q", buf.raw, 0)[0] not in _BLOCK_FILE_SYSTEMS


def _punch(fd: int, offset: int, length: int, zero: bool = True) -> None:
    """Frees a byte range of a file (it reads as zeros); best effort. Where
    holes cannot be punched, `zero` writes zeros over it instead (same
    reads, space kept)."""
    if length <= 0:
        return
    fn = _fallocate_fn()
    # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
    if (fn is not None and fn(fd, 0x02 | 0x01, offset, length) == 0) or not zero:
        return
    zeros = bytes(min(length, 1 << 20))
    done = 0
    while done < length:
        n = min(len(zeros), length - done)
        os.pwrite(fd, zeros[:n], offset + done)
        done += n


def _extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The ``[start, end)`` byte ranges of a sparse file that hold data,
    below `size` (SEEK_DATA/SEEK_HOLE; the whole file where the system has
    no such seek)."""
    at = 0
    while at < size:
        try:
            lo = os.lseek(fd, at, getattr(os, "SEEK_DATA"))
            hi = min(size, os.lseek(fd, lo, getattr(os, "SEEK_HOLE")))
        except (OSError, AttributeError) as e:
            if getattr(e, "errno", None) == errno.ENXIO:
                return  # nothing but a hole from `at` on
            yield at, size
            return
        if lo >= size:
            return
        yield lo, hi
        at = hi


def _more_descriptors() -> None:
    """Raises this process's soft limit of open files to its hard limit (a
    replica holds a few descriptors, and a dataset may have thousands of
    shards); best effort."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass


def _file_id(path: str) -> Optional[tuple]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _open_lockfile(path: str) -> int:
    """A descriptor of one of the cache's lock files (made if missing)."""
    return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)


def _lockf(fd: int, start: int, length: int, wait: bool) -> bool:
    """An exclusive POSIX lock on bytes [start, start+length) of `fd`."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB), length, start, 0)
        return True
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise


def _unlockf(fd: int, start: int, length: int) -> None:
    fcntl.lockf(fd, fcntl.LOCK_UN, length, start, 0)


#: Bumped in every forked child: what a process holds is rebuilt there
#: (cheaper to check on every read than a getpid call).
_FORKS = [0]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))


@contextlib.contextmanager
def _flocked(root: str) -> Iterator[None]:
    """The cache's state lock (``flock`` on ``lock``) through a descriptor of
    its own, for one-off use by a process that holds no slot."""
    fd = _open_lockfile(os.path.join(root, "lock"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class _Guard:
    """The cache's state lock as a context manager: this process's threads
    (a reentrant lock), then other processes (``flock``)."""

    def __init__(self, proc: "_Proc"):
        self.proc = proc

    def __enter__(self) -> "_Proc":
        p = self.proc
        p.tlock.acquire()
        if p.depth == 0:
            try:
                fcntl.flock(p.lock_fd, fcntl.LOCK_EX)
            except BaseException:
                p.tlock.release()
                raise
        p.depth += 1
        return p

    def __exit__(self, *exc) -> None:
        p = self.proc
        p.depth -= 1
        try:
            if p.depth == 0:
                fcntl.flock(p.lock_fd, fcntl.LOCK_UN)
        finally:
            p.tlock.release()


class _Proc:
    """What one process holds in a cache (rebuilt in a forked child)."""

    def __init__(self, cache: "Cache"):
        self.pid = os.getpid()
        self.forks = _FORKS[0]
        self.tlock = threading.RLock()
        self.lock_fd = _open_lockfile(os.path.join(cache.root, "lock"))
        self.slots_fd = _open_lockfile(os.path.join(cache.root, "slots.lock"))
        self.slot = -1
        for k in range(SLOTS):
            if _lockf(self.slots_fd, k, 1, wait=False):
                self.slot = k
                break
        if self.slot < 0:
            raise InvalidArgumentError(f"{cache.root}: more than {SLOTS} processes share this "
                                       "cache directory")
        # Its reads in flight and kept prefetches, and where it publishes
        # them (src/replica.zig, which locks them).
        self.reads = ffi.new("lx_reads_t *")
        head = ffi.from_buffer("uint64_t[]", cache._head)
        marks = ffi.from_buffer("uint64_t[]", cache._watermarks)
        self.reads.tick = head + 2
        self.reads.seq = head + 4
        self.reads.marks = marks + 2 * self.slot
        self.reads.lock_fd = self.lock_fd
        self._keep = (head, marks)
        self.replicas: dict = {}  # key -> Replica
        self.depth = 0  # nesting of locked()
        self.warned = False  # over an explicit cache_limit
        self.warned_full = False  # evicting to keep the file system's reserve free
        self.guard = _Guard(self)


class Cache:
    """One cache directory, as this process uses it. `Cache.get(root)`."""

    _instances: dict = {}
    _instances_lock = threading.Lock()

    @classmethod
    def get(cls, root: str, limit: Optional[int] = None) -> "Cache":
        """The cache at `root` (made if missing); one object per directory
        and process, made again if the directory was replaced (deleted and
        made anew) since."""
        root = os.path.realpath(os.path.expanduser(root))
        with cls._instances_lock:
            c = cls._instances.get(root)
            if c is None or not c._current():
                c = cls(root)
                cls._instances[root] = c
        if limit is not None:
            c.limit = limit
        return c

    def __init__(self, root: str):
        _more_descriptors()
        self.root = root
        self.limit: Optional[int] = None
        self.stores = os.path.join(root, "stores")
        os.makedirs(self.stores, exist_ok=True)
        self._proc: Optional[_Proc] = None
        self._proc_lock = threading.Lock()
        state = os.path.join(root, "state")
        with _flocked(self.root):
            if not os.path.exists(state) or os.path.getsize(state) < _GLOBAL_SIZE:
                tmp = f"{state}.{uuid.uuid4().hex[:8]}"
                with open(tmp, "wb") as f:
                    f.write(struct.pack("<QQQQQ", _MAGIC, _VERSION, 0, 0, 0))
                    f.write(b"\xff" * (_GLOBAL_SIZE - 4096))
                    f.truncate(_GLOBAL_SIZE)
                    f.flush()
                os.replace(tmp, state)
        fd = os.open(state, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        try:
            self._mm = mmap.mmap(fd, _GLOBAL_SIZE)
        finally:
            os.close(fd)
        head = np.frombuffer(self._mm, np.uint64, 5, 0)
        if int(head[0]) != _MAGIC or int(head[1]) not in (1, _VERSION):
            raise CorruptStoreError(f"{root}: not a loaderx cache directory of this version "
                                    "(remove it)")
        if int(head[1]) == 1:
            # Version 1 locked every read; version 2 reads without the lock
            # and counts evictions in word 4 (all ones in a version-1 file).
            with _flocked(self.root):
                if int(head[1]) == 1:
                    head[4] = 0
                    head[1] = _VERSION
        self._head = head  # [magic, version, tick, used bytes, eviction sequence]
        self._state_id = _file_id(state)
        self.preallocate = _maps_need_pages(root)
        # Per slot: the oldest read in flight, the oldest prefetch kept.
        self._watermarks = np.frombuffer(self._mm, np.uint64, 2 * SLOTS, 4096).reshape(SLOTS, 2)

    def _current(self) -> bool:
        """Whether the directory still holds the state this object maps."""
        return _file_id(os.path.join(self.root, "state")) == self._state_id

    def proc(self) -> _Proc:
        p = self._proc
        if p is not None and p.forks != _FORKS[0]:
            # A forked child: the parent's locks, slot and descriptors are not
            # its own (a thread of the parent may have held the lock at fork).
            self._proc_lock = threading.Lock()
            self._proc = p = None
        if p is None:
            with self._proc_lock:
                p = self._proc
                if p is None:
                    p = self._proc = _Proc(self)
                    self._watermarks[p.slot] = _NONE
        return p

    def locked(self) -> _Guard:
        """The cache's state lock (this process's threads, then other
        processes); ``with cache.locked() as proc:``."""
        return self.proc().guard

    # -- reads in use (eviction watermarks)
    def end(self, tick: int) -> None:
        """The read of `tick` (Replica.begin_read) is over (natively
        thread-safe: the process's reads have their own lock)."""
        lib.lx_replica_end(self.proc().reads, tick)

    def _min_watermarks(self, p: _Proc) -> tuple[int, int]:
        """The oldest read in flight and the oldest prefetch kept, over every
        live process (under the lock)."""
        live = np.flatnonzero((self._watermarks != _NONE).any(axis=1)).tolist()
        low = [int(_NONE), int(_NONE)]
        for k in live:
            if k != p.slot and _lockf(p.slots_fd, k, 1, wait=False):
                _unlockf(p.slots_fd, k, 1)  # its process is gone
                self._watermarks[k] = _NONE
                continue
            low = [min(low[0], int(self._watermarks[k, 0])),
                   min(low[1], int(self._watermarks[k, 1]))]
        return low[0], low[1]

    # -- accounting and eviction
    def add_used(self, nbytes: int) -> None:
        self._head[3] = np.uint64(max(0, int(self._head[3]) + nbytes))

    def used(self) -> int:
        return int(self._head[3])

    def _effective_limit(self, used: int) -> int:
        if self.limit is not None:
            return self.limit
        free, reserve = self._free_and_reserve()
        return max(0, used + free - reserve)

    def _free_and_reserve(self) -> tuple:
        """Bytes free on the cache's file system, and the share of it the
        cache leaves free when it has no cache_limit."""
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize, max(1 << 30, int(FREE_RESERVE * st.f_blocks
                                                            * st.f_frsize))

    def maybe_evict(self, p: _Proc) -> None:
        """Evicts least recently used regions until the cache is under 90% of
        its limit (under the lock); what is in use stays, past the limit."""
        limit = self._effective_limit(self.used())
        if self.used() <= limit:
            return
        replicas = self._all_replicas(p)
        used = sum(r.present_bytes() for r in replicas)
        self._head[3] = np.uint64(used)
        if used <= limit:
            return
        target = int(limit * 0.9)
        if self.limit is None and not p.warned_full:
            free, reserve = self._free_and_reserve()
            if limit < reserve:  # a nearly full disk, not a big cache that filled it
                p.warned_full = True
                warnings.warn(f"loaderx cache {self.root}: its file system has {free} bytes "
                              f"free and the cache leaves {reserve} free (without a "
                              f"cache_limit), so it holds at most {limit} bytes and drops "
                              "cached ranges as others are read; free disk space, or set "
                              "cache_limit (or LOADERX_CACHE_LIMIT)", RuntimeWarning,
                              stacklevel=5)
        seq = p.reads.seq
        lib.lx_cache_evicting(seq)  # odd: reads that start now wait (src/replica.zig)
        try:
            used = self._evict(p, replicas, used, target)
        finally:
            lib.lx_cache_evicting(seq)  # even: every eviction is counted
        self._head[3] = np.uint64(used)
        if used > limit and not p.warned:
            p.warned = True
            warnings.warn(f"loaderx cache {self.root} holds {used} bytes, over its limit of "
                          f"{limit}: every cached range is being read (raise cache_limit)",
                          RuntimeWarning, stacklevel=5)

    def _evict(self, p: _Proc, replicas: list, used: int, target: int) -> int:
        """Evicts the least recently used regions no read uses until `used`
        is at most `target` or none is left; returns the new `used`."""
        reading, pinned = (np.uint64(w) for w in self._min_watermarks(p))
        cands = []
        for k, r in enumerate(replicas):
            st = r.state
            present = np.flatnonzero((st.dwords != 0) & (st.atime < reading)
                                     & (st.ptime < pinned))
            if len(present):
                cands.append((st.atime[present], np.full(len(present), k), present))
        if cands:
            times = np.concatenate([c[0] for c in cands])
            which = np.concatenate([c[1] for c in cands])
            regions = np.concatenate([c[2] for c in cands])
            for j in np.argsort(times, kind="stable").tolist():
                if used <= target:
                    break
                used -= replicas[int(which[j])].evict_region(p, int(regions[j]))
        return used

    def no_space(self, need: int, what: str, err: OSError) -> NoSpaceError:
        """The error of a fetch of `need` bytes of `what` that found the
        cache's file system full (`err`); ``.need`` is the bytes."""
        try:
            free = self._free_and_reserve()[0]
        except OSError:
            free = -1
        limit = f"cache_limit {self.limit} bytes" if self.limit is not None else \
            "no cache_limit"
        why = os.strerror(err.errno or errno.ENOSPC)
        e = NoSpaceError(f"{self.root}: the cache's file system is full ({why}): {need} bytes "
                         f"of a replica's {what} do not fit in {free} bytes "
                         f"free ({limit}; the cache holds {self.used()} bytes, and what is "
                         "being read is never evicted); free space, set a cache_limit below "
                         "the file system's size, or read smaller batches", path=self.root)
        e.need = need  # type: ignore[attr-defined]
        return e

    def make_room(self, need: int) -> None:
        """After a fetch of `need` bytes found the file system full: evicts
        the least recently used regions no reader uses until `need` bytes
        are free of them (under the lock), and punches what no block marks
        present (`Replica.sweep`)."""
        with self.locked() as p:
            replicas = self._all_replicas(p)
            used = sum(r.present_bytes() for r in replicas)
            seq = p.reads.seq
            lib.lx_cache_evicting(seq)  # odd: reads that start now wait (src/replica.zig)
            try:
                used = self._evict(p, replicas, used, max(0, used - need - (need >> 3)))
            finally:
                lib.lx_cache_evicting(seq)
            self._head[3] = np.uint64(used)
            for r in replicas:
                for which in ("data", "index"):
                    with contextlib.suppress(OSError):
                        r.sweep(which)

    def _all_replicas(self, p: _Proc) -> list:
        out = []
        for name in os.listdir(self.stores):
            if name.startswith("."):
                continue
            r = p.replicas.get(name)
            if r is None:
                try:
                    r = Replica(self, name)
                except (OSError, CorruptStoreError):
                    continue
                p.replicas[name] = r
            out.append(r)
        return out

    # -- a conversion's files on their way to a bucket
    @contextlib.contextmanager
    def staging(self) -> Iterator[str]:
        """A new directory under ``uploads/`` for a conversion's files, held
        (a shared ``flock`` on it, taken under the cache's lock) while in use
        and removed after; `clear` removes only those whose process is gone."""
        up = os.path.join(self.root, "uploads")
        with _flocked(self.root):
            os.makedirs(up, exist_ok=True)
            d = os.path.join(up, uuid.uuid4().hex)
            os.mkdir(d)
            fd = os.open(d, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)
            os.close(fd)

    # -- replicas
    def replica(self, key: str, recheck: bool = False) -> "Replica":
        """This process's view of replica `key`; with `recheck` (at an open),
        made again if the replica was deleted and made anew meanwhile."""
        p = self.proc()
        r = p.replicas.get(key)
        if r is None or (recheck and not r.current()):
            with p.tlock:
                r = p.replicas.get(key)
                if r is None or (recheck and not r.current()):
                    r = p.replicas[key] = Replica(self, key)
        return r

    def intact(self, key: str, layout: Optional[Layout] = None, meta: Optional[bytes] = None,
               index: Optional[bytes] = None) -> bool:
        """Whether replica `key` is whole: every file there, ``index`` and
        ``data`` at the sizes of its state's layout (and of `layout`), the
        state's header and size right, its ``meta`` `meta` and its ``index``
        `index` when given (a replica whose index came whole at its open)."""
        d = os.path.join(self.stores, key)
        try:
            with open(os.path.join(d, "cache.state"), "rb") as f:
                head = _STATE_HEADER.unpack(f.read(_STATE_HEADER.size))
                size = os.fstat(f.fileno()).st_size
            lay = layout or Layout(*head[2:5])
            if head[:2] != (_STATE_MAGIC, 1) or size < _state_size(lay) or head[2:9] != (
                    lay.record_count, lay.data_size, lay.fixed, lay.ishift, lay.dshift,
                    lay.iblocks, lay.regions):
                return False
            for name, want in (("index", lay.index_size), ("data", lay.data_size), ("lock", 0),
                               ("index.fetch", None), ("data.fetch", None)):
                if want is not None and os.path.getsize(os.path.join(d, name)) != want:
                    return False
                if not os.path.isfile(os.path.join(d, name)):
                    return False
            if index is not None:
                with open(os.path.join(d, "index"), "rb") as f:
                    if f.read() != index:
                        return False
            with open(os.path.join(d, "meta"), "rb") as f:
                have = f.read(len(meta) + 1 if meta is not None else 2 * 4096)
            return have == meta if meta is not None else len(have) == 2 * 4096
        except (OSError, struct.error, ValueError):
            return False

    def materialize(self, key: str, meta: bytes, layout: Layout, source: dict,
                    check: Callable[[str], None], index: Optional[bytes] = None) -> str:
        """The replica directory `key`, made if it is not whole (`intact`):
        ``meta`` as given, ``index`` and ``data`` sparse at their full sizes
        (the `index` given whole and present), an empty state. `check(dir)`
        validates it (a native open) before it is published, under the
        cache's lock; a damaged replica there is moved aside and removed."""
        d = os.path.join(self.stores, key)
        if self.intact(key, layout, meta, index):
            return d
        tmp = os.path.join(self.stores, f".tmp-{key}-{uuid.uuid4().hex[:8]}")
        aside = os.path.join(self.stores, f".damaged-{key}-{uuid.uuid4().hex[:8]}")
        try:
            try:
                _build_replica(tmp, meta, layout, source, index)
            except OSError as e:
                raise self._unbuildable(e, source.get("url"), layout) from None
            check(tmp)
            with self.locked():
                if not self.intact(key, layout, meta, index):
                    if os.path.lexists(d):
                        os.rename(d, aside)  # damaged: its users keep their open files
                    os.rename(tmp, d)
                    if index is not None:
                        self.add_used(_present_bytes(_ReplicaState(
                            os.path.join(d, "cache.state"), layout)))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(aside, ignore_errors=True)
        return d

    def _unbuildable(self, e: OSError, url: Any, lay: Layout) -> Exception:
        what = (f"{url}: its replica (index {lay.index_size} bytes, data {lay.data_size} bytes, "
                f"sparse) cannot be made in {self.root}: {e.strerror or e}")
        if e.errno in _FULL:
            return NoSpaceError(f"{what}; free space on the cache's file system", path=self.root)
        return ZrecordIOError(f"{what} (a file system that takes files this large is needed)"
                              if e.errno == errno.EFBIG else what, path=self.root)


def _build_replica(d: str, meta: bytes, layout: Layout, source: dict,
                   index: Optional[bytes]) -> None:
    """A new replica's files in the directory `d` (made here)."""
    os.makedirs(d)
    for name, size in (("index", layout.index_size), ("data", layout.data_size),
                       ("lock", 0), ("index.fetch", 0), ("data.fetch", 0)):
        with open(os.path.join(d, name), "wb") as f:
            f.truncate(size)
    _create_state(os.path.join(d, "cache.state"), layout)
    with open(os.path.join(d, "source.json"), "w", encoding="utf-8") as f:
        json.dump(source, f, indent=2)
    if index is not None:
        assert len(index) == layout.index_size
        fd = os.open(os.path.join(d, "index"), os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            _allocate(fd, 0, len(index))
            _write_all(fd, memoryview(index), 0)
        finally:
            os.close(fd)
        st = _ReplicaState(os.path.join(d, "cache.state"), layout)
        _bits_set(st.ibits, np.arange(layout.iblocks, dtype=np.int64))
        st.mm.flush()
        del st
    with open(os.path.join(d, "meta"), "wb") as f:
        f.write(meta)


def _write_all(fd: int, view: memoryview, offset: int) -> None:
    """Writes all of `view` at `offset` (a short write is continued; one
    that writes nothing is a full disk)."""
    while len(view):
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]
        offset += n


class Replica:
    """One replica as this process sees it: its state, fetch locks, and the
    records it has checked."""

    def __init__(self, cache: Cache, key: str):
        self.cache = cache
        self.key = key
        self.dir = os.path.join(cache.stores, key)
        self.state = _ReplicaState(os.path.join(self.dir, "cache.state"))
        self._state_id = _file_id(os.path.join(self.dir, "cache.state"))
        self.layout = self.state.layout
        lay = self.layout
        self._fds: dict = {}
        self.fetch_tlock = {"index": threading.RLock(), "data": threading.RLock()}
        self._entries = None
        if not lay.fixed and lay.record_count:
            self._entries = np.memmap(os.path.join(self.dir, "index"), _ENTRY_DTYPE, "r",
                                      shape=(lay.record_count,))
        self._checked = np.zeros(-(-lay.record_count // 8), np.uint8)
        # The replica as the native start of a read sees it (src/replica.zig).
        st = self.state
        rep = self._rep = ffi.new("lx_replica_t *")
        keep = [ffi.from_buffer("uint64_t[]", st.atime), ffi.from_buffer("uint64_t[]", st.ptime),
                ffi.from_buffer("uint8_t[]", self._checked),
                ffi.from_buffer("uint64_t[]", st.header)]
        rep.atime, rep.ptime, rep.checked = keep[0], keep[1], keep[2]
        rep.evictions = keep[3] + 9
        rep.regions = len(st.atime)
        if self._entries is not None:
            keep.append(ffi.from_buffer("uint8_t[]", self._entries))
            rep.entries = keep[-1]
        rep.record_count, rep.fixed, rep.data_size = lay.record_count, lay.fixed, lay.data_size
        rep.region_shift = lay.dshift + 6
        rep.checked_at = st.evictions
        self._keep = keep
        self.fetched = 0  # bytes this process fetched for this replica (under _count_lock)
        self.fetched_data = 0  # the data's share of them
        self.index_gets = 0  # GETs this process made for index blocks (see index_due)
        self._count_lock = threading.Lock()
        self.whole_index: Optional[threading.Thread] = None  # its fetch (see index_due)
        self._index_pid = -1

    def current(self) -> bool:
        return _file_id(os.path.join(self.dir, "cache.state")) == self._state_id

    def fd(self, name: str) -> int:
        """A descriptor of one of the replica's files, kept open: closing any
        descriptor of a file drops this process's POSIX locks on it."""
        fd = self._fds.get(name)
        if fd is None:
            fd = self._fds.setdefault(name, os.open(os.path.join(self.dir, name),
                                                    os.O_RDWR | getattr(os, "O_CLOEXEC", 0)))
        return fd

    def present_bytes(self) -> int:
        return _present_bytes(self.state)

    # -- locations
    def index_blocks(self, u: np.ndarray) -> np.ndarray:
        return np.unique((u.astype(np.int64) * self.layout.entry) >> self.layout.ishift)

    def ranges(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Data byte ranges ``[starts, ends)`` of records `u` (their index
        blocks must be present)."""
        lay = self.layout
        if lay.fixed:
            s = u.astype(np.int64) * lay.fixed
            return s, s + lay.fixed
        assert self._entries is not None  # the table layout maps its entries
        e = self._entries[u.astype(np.int64)]
        s = e["offset"].astype(np.int64)
        end = s + e["aux"].astype(np.int64) + e["stored"].astype(np.int64)
        # A damaged entry must not send us fetching outside the data: it is
        # clamped here and fails its check.
        return np.minimum(s, lay.data_size), np.minimum(np.maximum(end, s), lay.data_size)

    def data_blocks(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        keep = ends > starts
        sh = self.layout.dshift
        return _spans(starts[keep] >> sh, (ends[keep] - 1) >> sh)

    # -- presence
    def missing(self, which: str, blocks: np.ndarray) -> np.ndarray:
        bits = self.state.ibits if which == "index" else self.state.dbits
        return blocks[~_bits_get(bits, blocks)] if len(blocks) else blocks

    def index_for(self, blocks: np.ndarray) -> np.ndarray:
        """The index blocks to fetch for a read that needs `blocks` (sorted,
        unique): the whole missing index when it costs less than the GETs of
        these blocks and the earlier reads' index GETs at INDEX_REQUEST_BYTES
        a GET, is at most INDEX_WITH_BATCH_MAX and fits the cache's share
        (WHOLE_INDEX_SHARE), otherwise `blocks`."""
        lay = self.layout
        need = self.missing("index", blocks)
        if not len(need) or (self.whole_index is not None and self.whole_index.is_alive()):
            return blocks
        gets = 1 + int(np.count_nonzero(np.diff(need) > 1 + (MAX_GAP >> lay.ishift)))
        worth = min((self.index_gets + gets) * INDEX_REQUEST_BYTES, INDEX_WITH_BATCH_MAX)
        if self._index_missing() > worth or not self._index_fits():
            with self._count_lock:
                self.index_gets += gets
            return blocks
        return np.arange(lay.iblocks, dtype=np.int64)

    def _index_missing(self) -> int:
        """Bytes of the index not present (a popcount of its bitmap)."""
        lay = self.layout
        present = int(_popcount64(self.state.ibits.view(np.uint64)).sum())
        return (lay.iblocks - present) << lay.ishift

    def _index_fits(self) -> bool:
        """Whether the whole index is at most its share of the cache's limit
        (1/WHOLE_INDEX_SHARE): only then is it ever fetched whole."""
        limit = self.cache._effective_limit(self.cache.used())
        return self.layout.index_size * WHOLE_INDEX_SHARE <= limit

    def fetch(self, which: str, blocks: np.ndarray, download: Callable,
              request_max: int = REQUEST_MAX) -> None:
        """Makes `blocks` (sorted, unique) of `which` present: fetches the
        missing ones this process gets the fetch locks of, waits for the rest
        (fetched by others), and fetches what they left, in requests of at
        most `request_max` bytes. A full file system makes room (eviction of
        what no reader uses, and bytes nothing marks present) and fetches
        again, once; then `NoSpaceError`."""
        if not len(blocks) or not len(self.missing(which, blocks)):
            return  # (without waiting for this process's fetch of other blocks)
        try:
            self._fetch(which, blocks, download, request_max)
        except NoSpaceError as e:
            self.cache.make_room(getattr(e, "need", 0))
            self._fetch(which, blocks, download, request_max)

    def _fetch(self, which: str, blocks: np.ndarray, download: Callable,
               request_max: int) -> None:
        fd = self.fd(which + ".fetch")
        with self.fetch_tlock[which]:
            todo = self.missing(which, blocks)
            if not len(todo):
                return
            mine: list = []
            theirs: list = []
            for b0, b1 in _runs(todo):
                (mine if _lockf(fd, b0, b1 - b0, wait=False) else theirs).append((b0, b1))
            try:
                self._download(which, mine, download, request_max)
            finally:
                for b0, b1 in mine:
                    _unlockf(fd, b0, b1 - b0)
            for b0, b1 in theirs:
                got = self._wait_lock(fd, b0, b1)
                try:
                    rest = self.missing(which, np.arange(b0, b1, dtype=np.int64))
                    self._download(which, _runs(rest), download, request_max)
                finally:
                    if got:
                        _unlockf(fd, b0, b1 - b0)

    def index_due(self) -> bool:
        """Whether to fetch the rest of the index now, whole (see
        WHOLE_INDEX_AFTER): once per process, never for a store without one."""
        lay = self.layout
        if self._index_pid == os.getpid():
            return False  # (a forked child starts its own when due)
        rented = self.index_gets * INDEX_REQUEST_BYTES
        half = lay.index_size // 2
        if not lay.iblocks or (self.fetched_data < WHOLE_INDEX_AFTER * half and rented < half):
            return False  # (cheap tests first: most batches stop here)
        missing = self._index_missing()
        if not missing or (self.fetched_data < WHOLE_INDEX_AFTER * missing and rented < missing):
            return False
        return self._index_fits()

    def fetch_whole_index(self, download: Callable) -> threading.Thread:
        """Fetches the index's missing blocks on a daemon thread, a round of
        concurrent WHOLE_INDEX_CHUNK requests (INDEX_WITH_BATCH_MAX bytes) at
        a time: a read that needs index blocks waits for one round at most.
        An error ends it quietly: reads fetch their records' blocks as
        before."""
        def run() -> None:
            lay = self.layout
            step = max(1, INDEX_WITH_BATCH_MAX >> lay.ishift)
            try:
                todo = self.missing("index", np.arange(lay.iblocks, dtype=np.int64))
                for i in range(0, len(todo), step):
                    self.fetch("index", todo[i:i + step], download, WHOLE_INDEX_CHUNK)
            except Exception:
                pass
        self._index_pid = os.getpid()
        t = self.whole_index = threading.Thread(target=run, name="loaderx-index", daemon=True)
        t.start()
        return t

    def _wait_lock(self, fd: int, b0: int, b1: int) -> bool:
        deadline = time.monotonic() + FETCH_WAIT_S
        delay = 0.001
        while True:
            if _lockf(fd, b0, b1 - b0, wait=False):
                return True
            if time.monotonic() > deadline:
                return False  # a stuck fetcher: fetch them ourselves (same bytes)
            time.sleep(delay)
            delay = min(0.05, delay * 2)

    def _download(self, which: str, runs: list, download: Callable,
                  request_max: int = REQUEST_MAX) -> None:
        """Fetches block `runs` of `which` (this process holds their fetch
        locks) and marks them present. Their bytes are allocated on disk
        first where a mapped hole can fault (`Cache.preallocate`), and a
        failure anywhere punches every range this fetch was to write
        (nothing of it is marked present, so nothing else would ever free
        them): a full disk is a `NoSpaceError` naming the cache."""
        if not runs:
            return
        lay = self.layout
        sh = lay.ishift if which == "index" else lay.dshift
        size = lay.index_size if which == "index" else lay.data_size
        starts, ends, keeps = _requests(runs, sh, size, request_max)
        fd = self.fd(which)
        try:
            for lo, hi in (k for ks in keeps for k in ks) if self.cache.preallocate else ():
                _allocate(fd, lo, hi - lo)
            got = download(which, starts, ends, keeps)
        except BaseException as e:
            for lo, hi in (k for ks in keeps for k in ks):
                with contextlib.suppress(OSError):
                    _punch(fd, lo, hi - lo, zero=False)
            if isinstance(e, OSError) and e.errno in _FULL:
                need = sum(hi - lo for ks in keeps for lo, hi in ks)
                raise self.cache.no_space(need, which, e) from None
            if isinstance(e, OSError) and not isinstance(e, LoaderxError):
                raise ZrecordIOError(f"{self.dir}/{which}: writing fetched bytes into the "
                                     f"cache failed: {e.strerror or e}", path=self.dir) from None
            raise
        # Index and data downloads run on two threads: `self.fetched +=
        # download(...)` read the count before the download and lost the
        # other thread's bytes when both overlapped.
        with self._count_lock:
            self.fetched += got
            if which == "data":
                self.fetched_data += got
        blocks = np.concatenate([np.arange(b0, b1, dtype=np.int64) for b0, b1 in runs])
        with self.cache.locked() as p:
            bits = self.state.ibits if which == "index" else self.state.dbits
            words = bits.view(np.uint64)
            touched = np.unique(blocks >> 6)
            before = _footprint(words[touched], sh)
            _bits_set(bits, blocks)
            self.cache.add_used(_footprint(words[touched], sh) - before)
            if which == "data":
                self.cache.maybe_evict(p)

    def drop(self, records: np.ndarray, index: bool = True) -> None:
        """Forgets records `records` (they failed their check): their data
        blocks (and, with `index`, their index blocks) become missing, and
        every process checks its records again."""
        starts, ends = self.ranges(records)
        dblocks = self.data_blocks(starts, ends)
        iblocks = self.index_blocks(records) if index else np.zeros(0, np.int64)
        with self.cache.locked():
            _bits_clear(self.state.dbits, dblocks)
            _bits_clear(self.state.ibits, iblocks)
            self.state.header[9] += np.uint64(1)

    def evict_region(self, p: _Proc, r: int) -> int:
        """Drops region `r` unless a fetch holds part of it (under the cache
        lock); returns the bytes freed."""
        lay = self.layout
        b0 = r * _REGION_BLOCKS
        fd = self.fd("data.fetch")
        if not self.fetch_tlock["data"].acquire(blocking=False):
            return 0
        try:
            if not _lockf(fd, b0, _REGION_BLOCKS, wait=False):
                return 0
            try:
                freed = _footprint(self.state.dwords[r:r + 1], lay.dshift)
                self.state.dwords[r] = 0
                self.state.header[9] += np.uint64(1)
                lo = b0 << lay.dshift
                _punch(self.fd("data"), lo, min(lay.data_size, lo + (_REGION_BLOCKS << lay.dshift))
                       - lo)
            finally:
                _unlockf(fd, b0, _REGION_BLOCKS)
        finally:
            self.fetch_tlock["data"].release()
        return freed

    def sweep(self, which: str) -> None:
        """Punches the bytes on disk of `which` that no block marks present
        (what a process killed mid-fetch wrote, or an older loaderx left
        after a failed write), in the regions no fetch holds (under the
        cache lock); found with SEEK_DATA, so it costs what is on disk."""
        lay = self.layout
        sh = lay.ishift if which == "index" else lay.dshift
        size = lay.index_size if which == "index" else lay.data_size
        bits = self.state.ibits if which == "index" else self.state.dbits
        fd, lock_fd = self.fd(which), self.fd(which + ".fetch")
        if not self.fetch_tlock[which].acquire(blocking=False):
            return
        try:
            for lo, hi in _extents(fd, size):
                blocks = np.arange(lo >> sh, ((hi - 1) >> sh) + 1, dtype=np.int64)
                for b0, b1 in _runs(blocks[~_bits_get(bits, blocks)]):
                    if _lockf(lock_fd, b0, b1 - b0, wait=False):
                        try:
                            _punch(fd, b0 << sh, min(b1 << sh, size) - (b0 << sh), zero=False)
                        finally:
                            _unlockf(lock_fd, b0, b1 - b0)
        finally:
            self.fetch_tlock[which].release()

    # -- the read protocol
    def begin_read(self, p: _Proc, u: np.ndarray, pin: bool) -> tuple[int, np.ndarray]:
        """Starts a read of records `u` (int64; those outside the store are
        skipped), natively (src/replica.zig, no lock unless an eviction
        runs): its tick, the process's watermarks, its regions' ``atime``
        (and ``ptime`` with `pin`, a prefetch kept for the next PIN_CALLS
        prefetches) stamped with it. Returns the tick (for ``Cache.end``; a
        prefetch's needs none) and those of `u` this process has not
        checked, as `unchecked` does. The caller holds ``p.tlock``. A table
        layout's index entries of `u` must be present."""
        out = np.empty(len(u), np.int64)
        res = ffi.new("uint64_t[2]")  # unchecked count, tick
        # int64 records as the uint64 the ABI takes: a negative one is out of range.
        check(lib.lx_replica_begin(p.reads, self._rep, ffi.from_buffer("uint64_t[]", u), len(u),
                                   pin, p.depth > 0, ffi.from_buffer("uint64_t[]", out), res,
                                   res + 1), self.dir, "cache bookkeeping")
        return int(res[1]), out[:res[0]]

    def _reset_checked(self) -> None:
        ev = self.state.evictions
        if ev != self._rep.checked_at:
            self._checked[:] = 0
            self._rep.checked_at = ev

    def unchecked(self, u: np.ndarray) -> np.ndarray:
        """Records of `u` this process has not checked since the last eviction
        (any eviction: a record checked before it may have been refetched)."""
        self._reset_checked()
        return u[~_bits_get(self._checked, u.astype(np.int64))]

    def mark_checked(self, u: np.ndarray) -> None:
        if len(u):
            np.bitwise_or.at(self._checked, u >> 3, (1 << (u & 7)).astype(np.uint8))


# ----------------------------------------------------------------------------- for people
# (``loaderx cache``: what a cache directory holds, and clearing it)

_FLOCK = struct.Struct("hhxxxxqqixxxx")  # Linux's struct flock: type, whence, start, len, pid


def _opened(root: str) -> str:
    """`root` as a cache directory, checked: its real path."""
    root = os.path.realpath(os.path.expanduser(os.fspath(root)))
    state = os.path.join(root, "state")
    try:
        with open(state, "rb") as f:
            head = f.read(16)
    except FileNotFoundError:
        raise StoreNotFoundError(f"{root}: not a loaderx cache directory (no state file)",
                                 path=root) from None
    if len(head) < 16 or struct.unpack("<QQ", head) not in ((_MAGIC, 1), (_MAGIC, _VERSION)):
        raise CorruptStoreError(f"{root}: not a loaderx cache directory of this version")
    return root


def _users(slots_fd: int, own: int) -> list:
    """The processes using a cache (holding a slot of its ``slots.lock``,
    `slots_fd`): their pids where the system says (Linux: F_GETLK), else -1
    each; this process first when it holds slot `own` (>= 0)."""
    users = [os.getpid()] if own >= 0 else []
    for k in range(SLOTS):
        if k == own:
            continue  # (locking it again would succeed, and unlocking drop it)
        if sys.platform.startswith("linux"):
            got = fcntl.fcntl(slots_fd, fcntl.F_GETLK,
                              _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, k, 1, 0))
            kind, _, _, _, holder = _FLOCK.unpack(got)
            if kind != fcntl.F_UNLCK:
                users.append(holder)
        elif _lockf(slots_fd, k, 1, wait=False):
            _unlockf(slots_fd, k, 1)
        else:
            users.append(-1)
    return users


def _uploads(root: str) -> list:
    """``(path, live)`` of every staging directory under ``uploads/``
    (live: its conversion still holds it). Caller holds the cache's lock."""
    up = os.path.join(root, "uploads")
    out = []
    for name in sorted(os.listdir(up)) if os.path.isdir(up) else []:
        path = os.path.join(up, name)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            live = False
        except OSError:
            live = True
        finally:
            os.close(fd)
        out.append((path, live))
    return out


def _disk_bytes(path: str) -> int:
    """Bytes `path` (a file or a tree) takes on disk (holes excluded)."""
    total = 0
    for dirpath, _, files in os.walk(path) if os.path.isdir(path) else [("", [], [path])]:
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
    return total


@contextlib.contextmanager
def _held(root: str) -> Iterator[tuple[int, int]]:
    """The cache's lock; yields ``(descriptor of slots.lock, this process's
    slot or -1)``. A process using the cache lends its own descriptor:
    closing any descriptor of the file would drop its slot's lock."""
    mine = Cache._instances.get(root)
    p = mine._proc if mine is not None else None
    if p is not None and p.forks != _FORKS[0]:
        p = None  # the parent's
    slots = p.slots_fd if p is not None else _open_lockfile(os.path.join(root, "slots.lock"))
    try:
        with _flocked(root):
            yield slots, (p.slot if p is not None else -1)
    finally:
        if p is None:
            os.close(slots)


def describe(root: str) -> dict:
    """What the cache directory `root` holds: its replicas (URL, versions,
    records, bytes cached of their full size), the bytes on disk, the
    processes using it, and the staging directories of conversions (live,
    or left by a conversion that was killed)."""
    root = _opened(root)
    with _held(root) as (slots, own):
        users = _users(slots, own)
        uploads = _uploads(root)
    replicas = []
    stores = os.path.join(root, "stores")
    for name in sorted(os.listdir(stores)) if os.path.isdir(stores) else []:
        if name.startswith("."):
            continue
        d = os.path.join(stores, name)
        entry: dict = {"key": name, "url": None, "versions": None}
        with contextlib.suppress(OSError, ValueError):
            with open(os.path.join(d, "source.json"), encoding="utf-8") as f:
                source = json.load(f)
            entry["url"], entry["versions"] = source.get("url"), source.get("etags")
        try:
            st = _ReplicaState(os.path.join(d, "cache.state"))
        except (OSError, CorruptStoreError) as e:
            entry["error"] = str(e)
        else:
            lay = st.layout
            entry.update(records=lay.record_count, size_bytes=lay.index_size + lay.data_size,
                         cached_bytes=_present_bytes(st))
            del st
        entry["disk_bytes"] = _disk_bytes(d)
        replicas.append(entry)
    left = [p for p, live in uploads if not live]
    return {
        "root": root,
        "cached_bytes": sum(r.get("cached_bytes", 0) for r in replicas),
        "disk_bytes": _disk_bytes(root),
        "processes": users,
        "replicas": replicas,
        "uploads_live": sum(live for _, live in uploads),
        "uploads_left": len(left),
        "uploads_left_bytes": sum(_disk_bytes(p) for p in left),
    }


def clear(root: str) -> int:
    """Empties the cache directory `root`: every replica, what killed
    conversions left under ``uploads/`` and what an interrupted clear left.
    Refused (`BusyError`, naming the processes) while a process uses the
    cache; the staging directory of a conversion still running is left
    alone. Returns the bytes freed on disk."""
    root = _opened(root)
    gone = os.path.join(root, f".cleared-{uuid.uuid4().hex[:8]}")
    with _held(root) as (slots, own):
        users = _users(slots, own)
        if users:
            who = ", ".join(str(u) for u in users if u >= 0) or f"{len(users)}"
            raise BusyError(f"{root}: in use by process{'es' if len(users) > 1 else ''} {who}; "
                            "clear it once they have exited", path=root)
        os.mkdir(gone)
        stores = os.path.join(root, "stores")
        if os.path.isdir(stores):
            os.rename(stores, os.path.join(gone, "stores"))
        os.makedirs(stores)
        for k, (path, live) in enumerate(_uploads(root)):
            if not live:
                os.rename(path, os.path.join(gone, f"upload-{k}"))
        for name in os.listdir(root):  # what an interrupted clear left
            if name.startswith(".cleared-") and name != os.path.basename(gone):
                os.rename(os.path.join(root, name), os.path.join(gone, name))
        fd = os.open(os.path.join(root, "state"), os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        try:
            os.pwrite(fd, struct.pack("<Q", 0), _USED_AT)
        finally:
            os.close(fd)
    freed = _disk_bytes(gone)
    shutil.rmtree(gone, ignore_errors=True)
    return freed
