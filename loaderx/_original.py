"""Stores written by the original loaderx (the package this one succeeds under
the same name), read without its library: safe file access for both of its
layouts, and the whole of its 1.7 layout (`Layout177`), which loaderx reads
in place (read-only, ``DenseStore(path)`` / ``RaggedStore(path)`` /
``open_store``) and converts (``loaderx.convert``). The older 0.9 layout is
read only to convert it (``converters/_original_src``).

The 1.7 layout, as loaderx 1.7.7 writes it (every integer little-endian, the
byte order of every platform it was published for):

* ``store.zr``: a 32-byte typed header (magic ``"LXST"`` u32, version u8 = 1,
  kind u8: 1 dense, 2 ragged, 2 reserved bytes, record_bytes u64: a dense
  record's width, 0 for ragged, identity_len u64, 8 reserved bytes), then
  the type identity: msgpack ``{"dtype": ..., "item_shape": [...]}`` (dense)
  or ``{"dtype": ...}`` (ragged); the dtype is ``dtype.str``, or numpy's
  ``descr`` list for a structured dtype;
* ``meta.zr``: exactly 32 bytes: magic ``"ZREC"`` u32, version u8 = 4, codec
  u8 (0 raw, 1 zstd, 2 zstd with ``dict.zr``: one codec per store, every
  record stored as that codec's output), tail_chunk u32, tail_offset u32
  (the write frontier), length u64 (physical records), 10 reserved bytes;
* ``N.loc``: the record table, 2**28 entries of 16 bytes per segment file:
  offset u32, phys_length u32, logic_length u32, chunk_id u32;
* ``N.chunk``: record bytes (a record never straddles two chunks, whose
  offsets are u32);
* ``dict.zr``: the zstd dictionary of a ``zstd_dict`` store.

A dense store's record i is physical record i. A ragged store's record i is
two physical records: ``2i`` its payload, ``2i + 1`` its shape (uint64
``[ndim, *shape]``), both stored with the store's codec.

What a reader checks, as 1.7.7 does when it opens a store, before any record
is read: both headers, the identity, the chunk files up to ``tail_chunk``
(sizes within their capacity and the frontier), every table entry (its chunk,
its byte range, a dense record's width). Damage raises `CorruptStoreError`
naming the file and what is wrong. A reader holds a shared ``flock`` on
``meta.zr`` as long as it is open: loaderx 1.7.7 takes an exclusive one for
every handle, so a store open in 1.7.7 is refused here (`BusyError`), and
1.7.7 cannot open (and so write) a store loaderx is reading (the lock is
`loaderx._locks.share_original`, with every other lock taken from Python).

Every file is opened only if it is a regular file (``lstat``, then
``O_NOFOLLOW | O_NONBLOCK`` and ``fstat``): a FIFO, device, socket or
symbolic link is refused by name instead of blocking or being followed.
"""
from __future__ import annotations

import math
import mmap
import os
import stat
from typing import Any

import numpy as np

from . import _locks, identity
from ._lib import error_for, ffi, lib
from .errors import (BusyError, ClosedError, CorruptStoreError, DictionaryError,
                     NewerFormatError)

__all__ = ["is_store177", "is_original", "kind177", "open_regular", "read_regular", "map_regular",
           "Layout177", "convert_command", "STORE_NAME", "META_NAME", "DICT_NAME", "CODECS"]

STORE_NAME = "store.zr"
META_NAME = "meta.zr"
DICT_NAME = "dict.zr"
CODECS = ("raw", "zstd", "zstd_dict")
KINDS = {1: "dense", 2: "ragged"}
TYPED_HEADER = np.dtype([("magic", "<u4"), ("version", "u1"), ("kind", "u1"),
                         ("reserved0", "<u2"), ("record_bytes", "<u8"),
                         ("identity_len", "<u8"), ("reserved1", "<u8")])
HEADER = np.dtype([("magic", "<u4"), ("version", "u1"), ("codec", "u1"),
                   ("tail_chunk", "<u4"), ("tail_offset", "<u4"), ("length", "<u8"),
                   ("reserved", "V10")])
LOC = np.dtype([("offset", "<u4"), ("phys_length", "<u4"), ("logic_length", "<u4"),
                ("chunk_id", "<u4")])
TYPED_MAGIC = 0x5453584C  # "LXST"
TYPED_VERSION = 1
MAGIC = 0x4345525A  # "ZREC"
VERSION = 4
#: Entries per ``.loc`` segment, bytes a chunk's offsets address, the largest record.
SEG_RECORDS = 1 << 28
CHUNK_CAPACITY = 1 << 32
RECORD_MAX = 1 << 31
#: Bounds of what a reader loads whole: the identity, and the dictionary.
IDENTITY_MAX = 1 << 20
DICT_MAX = 1 << 31
#: Dimensions of a ragged record's shape (numpy's own limit).
NDIM_MAX = 64
#: Entries checked at a time at open (bounds the temporaries of the checks).
CHECK_BLOCK = 1 << 20
_FILE_TYPES = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
               (stat.S_ISLNK, "a symbolic link"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
_EMPTY = np.zeros(1, np.uint8)


# ----------------------------------------------------------------- detection


def is_original(path: str) -> bool:
    """A directory holding the original loaderx's ``meta.zr`` (either layout;
    a ``meta.zr`` that is not a regular file too: reading it then refuses it
    by name)."""
    return os.path.isdir(path) and os.path.lexists(os.path.join(path, META_NAME))


def is_store177(path: Any) -> bool:
    """A directory in the original loaderx's 1.7 layout: its ``store.zr``, or
    a 32-byte ``meta.zr`` of version 4 (the 0.9 layout's header is 16 bytes,
    then its table, and its version is a u16 below 4)."""
    try:
        p = os.fspath(path)
    except TypeError:
        return False
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not is_original(p):
        return False
    if os.path.lexists(os.path.join(p, STORE_NAME)):
        return True
    try:
        fd = open_regular(p, META_NAME)
    except CorruptStoreError:
        return False
    try:
        if os.fstat(fd).st_size != HEADER.itemsize:
            return False
        head = os.pread(fd, 6, 0)
    finally:
        os.close(fd)
    return len(head) == 6 and head[:4] == b"ZREC" and head[4] == VERSION


def kind177(path: str) -> str:
    """The kind (``dense``/``ragged``) a 1.7 store's ``store.zr`` names;
    ``dense`` when it cannot be read (opening it then says what is wrong)."""
    try:
        raw = read_regular(path, STORE_NAME, TYPED_HEADER.itemsize + IDENTITY_MAX)
    except CorruptStoreError:
        return "dense"
    kind = raw[5] if len(raw) >= TYPED_HEADER.itemsize and raw[:4] == b"LXST" else 1
    return KINDS.get(kind, "dense")


def convert_command(path: str) -> str:
    """The one line that converts the original store at `path`."""
    return f"loaderx.convert({path!r}, DEST) (or `loaderx convert {path} DEST`)"


# ----------------------------------------------------------------- regular files only


def _damaged(file: str, text: str, path: str) -> CorruptStoreError:
    return CorruptStoreError(f"{file}: {text} (a damaged store written by the original loaderx)",
                             path=path)


def _not_regular(file: str, mode: int, path: str) -> CorruptStoreError:
    what = next((name for test, name in _FILE_TYPES if test(mode)), "not a regular file")
    hint = " (loaderx does not follow links inside a store: copy the file in its place)" \
        if stat.S_ISLNK(mode) else ""
    return CorruptStoreError(f"{file}: is {what}, not a regular file; a store of the original "
                             f"loaderx is read only from regular files{hint}", path=path)


def open_regular(path: str, name: str) -> int:
    """A read-only descriptor of file `name` of the store directory `path`,
    which must be a regular file (`CorruptStoreError` naming it otherwise,
    `FileNotFoundError`-derived `CorruptStoreError` when missing). Never
    blocks (a FIFO is refused, not opened for good) and never follows a
    symbolic link."""
    file = os.path.join(path, name)
    try:
        st = os.lstat(file)
    except FileNotFoundError:
        raise _damaged(file, "missing", path) from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(file, st.st_mode, path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
    try:
        fd = os.open(file, flags)
    except OSError as e:
        raise CorruptStoreError(f"{file}: cannot be opened ({e.strerror})", path=path) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):  # replaced between the lstat and the open
        os.close(fd)
        raise _not_regular(file, st.st_mode, path)
    return fd


def read_regular(path: str, name: str, limit: int) -> bytes:
    """The whole of regular file `name` (at most `limit` bytes, else damaged)."""
    fd = open_regular(path, name)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise _damaged(os.path.join(path, name), f"{size:,} bytes, more than the "
                           f"{limit:,} this file can hold", path)
        data = os.pread(fd, size, 0) if size else b""
        if len(data) != size:
            raise _damaged(os.path.join(path, name), "shorter than its size", path)
        return data
    finally:
        os.close(fd)


def map_regular(path: str, name: str) -> tuple[Any, int]:
    """``(read-only mmap or b"", size)`` of regular file `name`."""
    fd = open_regular(path, name)
    try:
        size = os.fstat(fd).st_size
        return (mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else b""), size
    finally:
        os.close(fd)


# ----------------------------------------------------------------- the 1.7 layout


def _identity_dtype(value: Any, depth: int = 0) -> Any:
    """numpy's dtype description from 1.7.7's identity (a type string, or a
    descr list whose tuples msgpack stored as lists)."""
    if depth > identity.NDIM_MAX:
        raise ValueError("the dtype nests too deeply")
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise TypeError(f"the dtype is {value!r}, not a type string or a field list")
    fields = []
    for f in value:
        if not isinstance(f, list) or not 2 <= len(f) <= 3:
            raise TypeError(f"a dtype field is {f!r}, not [name, type(, shape)]")
        name = tuple(f[0]) if isinstance(f[0], list) else f[0]
        fmt = _identity_dtype(f[1], depth + 1)
        fields.append((name, fmt, tuple(f[2])) if len(f) == 3 else (name, fmt))
    return fields


def _decode_identity(raw: bytes, kind: str, file: str, path: str) -> tuple:
    """(dtype, item_shape or None) from 1.7.7's msgpack identity."""
    import msgpack

    try:
        ident = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises many unrelated types on hostile input
        raise _damaged(file, f"its type identity is not msgpack ({type(e).__name__})",
                       path) from None
    expected = {"dtype", "item_shape"} if kind == "dense" else {"dtype"}
    if not isinstance(ident, dict) or set(ident) != expected:
        raise _damaged(file, f"its type identity is {ident!r}, not a map of {sorted(expected)}",
                       path)
    try:
        dtype = np.dtype(_identity_dtype(ident["dtype"]))
    except Exception as e:  # numpy raises many types for a hostile description
        raise _damaged(file, f"its dtype {ident['dtype']!r} cannot be built "
                       f"({type(e).__name__}: {e})", path) from None
    if dtype.hasobject or dtype.itemsize == 0 or dtype.subdtype is not None:
        raise _damaged(file, f"its dtype {dtype} cannot hold records", path)
    if kind == "ragged":
        return dtype, None
    shape = ident["item_shape"]
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape) \
            or len(shape) > identity.NDIM_MAX:
        raise _damaged(file, f"its item_shape {shape!r} is not a list of sizes", path)
    return dtype, tuple(shape)


class Layout177:
    """One store of the 1.7 layout, open for reading: its checked headers,
    identity and record table (memory-mapped), its chunks (memory-mapped) and
    dictionary, and the shared lock on ``meta.zr`` (see the module docs).
    `records(phys, dst)` decodes physical records. Thread-safe for reads;
    `close()` may run while reads are in flight (a read holds the maps it
    uses, which are then unmapped when it returns)."""

    def __init__(self, path: str):
        self.path = path
        self.kind, self.record_bytes, self.dtype, self.item_shape = self._typed()
        self._lock_fd = open_regular(path, META_NAME)
        try:
            self._lock()
            head = self._header()
            self.codec = CODECS[int(head["codec"])]
            self.tail_chunk = int(head["tail_chunk"])
            self.tail_offset = int(head["tail_offset"])
            self.physical = int(head["length"])
            self.length = self.physical // 2 if self.kind == "ragged" else self.physical
            self.dictionary = self._dictionary()
            self._chunks: list | None = None
            self._chunks, self.chunk_sizes = self._open_chunks()
            self._segments = self._open_table()
            self._check_table()
        except BaseException:
            self.close()
            raise

    # -- opening and checking

    def _typed(self) -> tuple:
        file = os.path.join(self.path, STORE_NAME)
        if not os.path.lexists(file):
            raise _damaged(file, "missing: the store's creation did not finish (loaderx 1.7 "
                           "writes it when a store is created)", self.path)
        raw = read_regular(self.path, STORE_NAME, TYPED_HEADER.itemsize + IDENTITY_MAX)
        if len(raw) < TYPED_HEADER.itemsize:
            raise _damaged(file, f"{len(raw)} bytes, shorter than its 32-byte header", self.path)
        h = np.frombuffer(raw, TYPED_HEADER, count=1)[0]
        if int(h["magic"]) != TYPED_MAGIC:
            raise _damaged(file, f"bad magic {raw[:4]!r}, expected b'LXST'", self.path)
        if int(h["version"]) != TYPED_VERSION:
            raise NewerFormatError(f"{file}: typed header version {int(h['version'])} of the "
                                   f"original loaderx; this loaderx reads version "
                                   f"{TYPED_VERSION} (loaderx 1.7)", path=self.path)
        kind = KINDS.get(int(h["kind"]))
        if kind is None:
            raise _damaged(file, f"kind {int(h['kind'])}, not 1 (dense) or 2 (ragged)", self.path)
        if int(h["identity_len"]) != len(raw) - TYPED_HEADER.itemsize:
            raise _damaged(file, f"its header says {int(h['identity_len']):,} bytes of type "
                           f"identity, the file holds {len(raw) - 32:,}", self.path)
        dtype, shape = _decode_identity(raw[TYPED_HEADER.itemsize:], kind, file, self.path)
        record_bytes = int(h["record_bytes"])
        want = dtype.itemsize * math.prod(shape) if shape is not None else 0
        if record_bytes != want or (kind == "dense" and not 0 < want <= RECORD_MAX):
            raise _damaged(file, f"record_bytes {record_bytes:,} does not match the identity "
                           f"({dtype}{list(shape or [])}: {want:,})", self.path)
        return kind, record_bytes, dtype, shape

    def _lock(self) -> None:
        if not _locks.share_original(self._lock_fd):
            raise BusyError(f"{self.path}: the store is open in loaderx 1.7 (a process holds "
                            "its lock on meta.zr); close it there first", path=self.path)

    def _header(self) -> Any:
        file = os.path.join(self.path, META_NAME)
        raw = os.pread(self._lock_fd, HEADER.itemsize + 1, 0)
        if len(raw) != HEADER.itemsize:
            raise _damaged(file, f"{len(raw)} bytes; loaderx 1.7's meta.zr is exactly 32",
                           self.path)
        h = np.frombuffer(raw, HEADER, count=1)[0]
        if int(h["magic"]) != MAGIC:
            raise _damaged(file, f"bad magic {raw[:4]!r}, expected b'ZREC'", self.path)
        if int(h["version"]) != VERSION:
            raise NewerFormatError(f"{file}: format version {int(h['version'])} of the original "
                                   f"loaderx; this loaderx reads version {VERSION} (loaderx 1.7) "
                                   "and the 0.9 layout", path=self.path)
        if int(h["codec"]) >= len(CODECS):
            raise _damaged(file, f"codec {int(h['codec'])}, not 0 (raw), 1 (zstd) or 2 "
                           "(zstd_dict)", self.path)
        if int(h["tail_chunk"]) == 0xFFFFFFFF or int(h["tail_offset"]) > CHUNK_CAPACITY:
            raise _damaged(file, f"its write frontier (chunk {int(h['tail_chunk'])}, offset "
                           f"{int(h['tail_offset']):,}) is out of range", self.path)
        if self.kind == "ragged" and int(h["length"]) % 2:
            raise _damaged(file, f"{int(h['length']):,} physical records; a ragged store "
                           "holds two per record", self.path)
        return h

    def _dictionary(self) -> bytes:
        present = os.path.lexists(os.path.join(self.path, DICT_NAME))
        if self.codec != "zstd_dict":
            if present:
                raise _damaged(os.path.join(self.path, DICT_NAME), f"present, but the store's "
                               f"codec is {self.codec}", self.path)
            return b""
        if not present:
            raise _damaged(os.path.join(self.path, DICT_NAME), "missing, but the store's codec "
                           "is zstd_dict", self.path)
        d = read_regular(self.path, DICT_NAME, DICT_MAX)
        if not d:
            raise _damaged(os.path.join(self.path, DICT_NAME), "empty", self.path)
        return d

    def _open_chunks(self) -> tuple[list, np.ndarray]:
        chunks, sizes = [], np.zeros(self.tail_chunk + 1, np.int64)
        for c in range(self.tail_chunk + 1):
            name = f"{c}.chunk"
            m, size = map_regular(self.path, name)
            chunks.append(np.frombuffer(m, np.uint8) if size else _EMPTY[:0])
            sizes[c] = size
            if size > CHUNK_CAPACITY:
                raise _damaged(os.path.join(self.path, name), f"{size:,} bytes, past the "
                               "4 GiB a chunk addresses", self.path)
        if sizes[-1] < self.tail_offset:
            raise _damaged(os.path.join(self.path, f"{self.tail_chunk}.chunk"),
                           f"{int(sizes[-1]):,} bytes, shorter than the write frontier "
                           f"({self.tail_offset:,}) meta.zr records", self.path)
        return chunks, sizes

    def _open_table(self) -> list[np.ndarray]:
        segments = []
        for s in range(-(-self.physical // SEG_RECORDS)):
            name = f"{s}.loc"
            count = min(SEG_RECORDS, self.physical - s * SEG_RECORDS)
            m, size = map_regular(self.path, name)
            if size < count * LOC.itemsize:
                raise _damaged(os.path.join(self.path, name), f"{size:,} bytes, shorter than the "
                               f"{count:,} entries meta.zr commits ({count * 16:,} bytes)",
                               self.path)
            segments.append(np.frombuffer(m, LOC, count=count))
        return segments

    def _check_table(self) -> None:
        for s, seg in enumerate(self._segments):
            for start in range(0, len(seg), CHECK_BLOCK):
                self._check_block(s, start, seg[start:start + CHECK_BLOCK])

    def _check_block(self, s: int, start: int, e: np.ndarray) -> None:
        cid = e["chunk_id"].astype(np.int64)
        phys = e["phys_length"].astype(np.int64)
        logic = e["logic_length"].astype(np.int64)
        end = e["offset"].astype(np.int64) + phys
        size = self.chunk_sizes[np.minimum(cid, self.tail_chunk)]
        limit = np.where(cid == self.tail_chunk, np.minimum(size, self.tail_offset), size)
        checks = [
            (cid > self.tail_chunk, "lies in chunk {c}, past the last chunk ({t})"),
            ((phys == 0) | (logic == 0) | (logic > RECORD_MAX),
             "has stored size {p:,} and record size {l:,} (each must be 1 to 2 GiB)"),
            (end > limit, "(offset {o:,}, stored size {p:,}) ends past the end of "
                          "{c}.chunk ({z:,} bytes written)"),
        ]
        if self.codec == "raw":
            checks.append((phys != logic, "is stored raw, but its stored size {p:,} differs "
                                          "from its record size {l:,}"))
        if self.kind == "dense":
            checks.append((logic != self.record_bytes, "holds {l:,} bytes, not the "
                           f"{self.record_bytes:,} of a dense {self.dtype}"
                           f"{list(self.item_shape or ())} record"))
        for bad, text in checks:
            if bad.any():
                k = int(np.argmax(bad))
                raise self._bad_entry(s, start + k, e[k], text, int(limit[k]))

    def _bad_entry(self, s: int, k: int, e: Any, text: str, written: int) -> CorruptStoreError:
        where = s * SEG_RECORDS + k
        what = self.entry_name(where)
        text = text.format(c=int(e["chunk_id"]), t=self.tail_chunk, p=int(e["phys_length"]),
                           l=int(e["logic_length"]), o=int(e["offset"]), z=written)
        return _damaged(os.path.join(self.path, f"{s}.loc"), f"entry {k:,} ({what}) {text}",
                        self.path)

    def entry_name(self, phys: int) -> str:
        """What physical record `phys` is, in words."""
        if self.kind == "dense":
            return f"record {phys:,}"
        return f"record {phys // 2:,}'s {'shape' if phys % 2 else 'payload'}"

    # -- reading

    def _maps(self) -> tuple[list, list]:
        """(table segments, chunk arrays), held by the caller for its read."""
        chunks = self._chunks
        if chunks is None:
            raise ClosedError(f"{self.path}: store is closed", path=self.path)
        return self._segments, chunks

    def entries(self, phys: np.ndarray, segments: list | None = None) -> np.ndarray:
        """The table entries of physical records `phys` (int64, in range)."""
        if segments is None:
            segments = self._maps()[0]
        if len(segments) == 1:
            return segments[0][phys]
        seg = phys >> 28
        out = np.empty(len(phys), LOC)
        for s in np.unique(seg).tolist():
            pick = seg == s
            out[pick] = segments[s][phys[pick] & (SEG_RECORDS - 1)]
        return out

    def records(self, phys: np.ndarray, dst: np.ndarray | None = None) -> tuple:
        """Physical records `phys` (int64, in range) decoded end to end:
        ``(buffer, sizes)``, into `dst` (C-contiguous uint8 of exactly their
        size) when given."""
        segments, chunks = self._maps()
        e = self.entries(phys, segments)
        sizes = e["logic_length"].astype(np.uint64)
        if dst is None:
            dst = np.empty(int(sizes.sum()), np.uint8)
        cid = e["chunk_id"]
        if len(e) == 0:
            return dst, sizes
        if (cid == cid[0]).all():
            self._decode(chunks, phys, e, dst, sizes)
            return dst, sizes
        # Records in several chunks: each chunk's records decoded together,
        # then put at their places in request order.
        starts = np.zeros(len(e), np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        for c in np.unique(cid).tolist():
            pick = np.flatnonzero(cid == c)
            part = np.empty(int(sizes[pick].sum()), np.uint8)
            self._decode(chunks, phys[pick], e[pick], part, sizes[pick])
            at = 0
            for k, n in zip(pick.tolist(), sizes[pick].tolist()):
                dst[starts[k]:starts[k] + n] = part[at:at + n]
                at += n
        return dst, sizes

    def _decode(self, chunks: list, phys: np.ndarray, e: np.ndarray, dst: np.ndarray,
                sizes: np.ndarray) -> None:
        """Records of table entries `e`, all in one chunk, into `dst`."""
        c = int(e["chunk_id"][0])
        src = chunks[c]
        offsets = np.ascontiguousarray(e["offset"], np.uint64)
        stored = np.ascontiguousarray(e["phys_length"], np.uint64)
        codecs = np.full(len(e), CODECS.index(self.codec), np.uint8)
        d = self.dictionary
        bad = ffi.new("uint64_t *")
        rc = lib.lx_decode_frames(
            _ptr(src), len(src), _ptr(offsets, "uint64_t[]"), _ptr(stored, "uint64_t[]"),
            _ptr(codecs), len(e), _ptr(dst, writable=True), len(dst),
            _ptr(np.ascontiguousarray(sizes, np.uint64), "uint64_t[]"),
            d if d else ffi.NULL, len(d), bad)
        if rc == 0:
            return
        err = error_for(rc)
        if bad[0] >= len(e):
            if isinstance(err, DictionaryError):
                raise _damaged(os.path.join(self.path, DICT_NAME),
                               f"not a usable zstd dictionary ({err})", self.path)
            raise err
        k = int(bad[0])
        raise _damaged(os.path.join(self.path, f"{c}.chunk"),
                       f"{self.entry_name(int(phys[k]))} ({self.codec}, offset "
                       f"{int(e['offset'][k]):,}, stored size {int(e['phys_length'][k]):,}) does "
                       f"not decode to its {int(e['logic_length'][k]):,} bytes: {err}", self.path)

    def shapes(self, idx: np.ndarray) -> list[tuple]:
        """The shapes of ragged records `idx` (int64, in range), checked
        against their payload sizes."""
        buf, sizes = self.records(idx * 2 + 1)
        payload = self.entries(idx * 2)["logic_length"]
        out, at = [], 0
        item = self.dtype.itemsize
        for k, n in enumerate(sizes.tolist()):
            words = buf[at:at + n]
            at += n
            dims = np.frombuffer(words, "<u8") if n % 8 == 0 else np.zeros(0, "<u8")
            if len(dims) == 0 or len(dims) != int(dims[0]) + 1 or int(dims[0]) > NDIM_MAX:
                raise self._bad_shape(int(idx[k]), f"its shape record ({n} bytes) is not "
                                      "[ndim, *shape] in uint64")
            shape = tuple(int(d) for d in dims[1:])
            if math.prod(shape) * item != int(payload[k]):
                raise self._bad_shape(int(idx[k]), f"its shape {shape} of {self.dtype} is "
                                      f"{math.prod(shape) * item:,} bytes, its payload "
                                      f"{int(payload[k]):,}")
            out.append(shape)
        return out

    def ragged(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, list]:
        """Ragged records `idx` (int64, in range): ``(payloads end to end,
        payload sizes, shapes)``."""
        shapes = self.shapes(idx)
        buf, sizes = self.records(idx * 2)
        return buf, sizes, shapes

    def _bad_shape(self, record: int, text: str) -> CorruptStoreError:
        seg = (2 * record + 1) >> 28
        return _damaged(os.path.join(self.path, f"{seg}.loc"), f"record {record:,}: {text}",
                        self.path)

    def stored_bytes(self) -> tuple[int, int]:
        """(bytes of the records, stored bytes of every live physical record:
        a ragged store's shapes too)."""
        segments = self._maps()[0]
        every = 2 if self.kind == "ragged" else 1  # (a segment holds an even count)
        logic = sum(int(s["logic_length"][::every].sum(dtype=np.int64)) for s in segments)
        phys = sum(int(s["phys_length"].sum(dtype=np.int64)) for s in segments)
        return logic, phys

    def chunks_used(self) -> int:
        return len(self.chunk_sizes)

    def close(self) -> None:
        """Release the lock and the maps (a map still in use by a read in
        flight is unmapped when that read lets go of it). Idempotent."""
        fd, self._lock_fd = getattr(self, "_lock_fd", -1), -1
        if fd >= 0:
            os.close(fd)
        maps = [getattr(a, "base", None) for a in (getattr(self, "_chunks", None) or [])]
        maps += [getattr(a, "base", None) for a in (getattr(self, "_segments", None) or [])]
        self._chunks = None
        self._segments = []
        for m in maps:
            if isinstance(m, mmap.mmap):
                try:
                    m.close()
                except BufferError:  # a read in flight still uses it
                    pass


def _ptr(arr: Any, ctype: str = "uint8_t[]", writable: bool = False):
    if isinstance(arr, np.ndarray) and arr.nbytes == 0:
        arr = _EMPTY
    return ffi.from_buffer(ctype, arr, require_writable=writable)
