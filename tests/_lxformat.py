"""A store's files as bytes, with the structs of src/format.zig (their
formats, offsets and constants generated into tests/_lxlayout.py), for tests
that forge stores: change any field and re-seal every checksum that covers it
(header, commit, blobs, record checksums, journal), or leave them stale.

`StoreImage` holds the files of one store directory (meta, index, data, lock,
journal) and writes them back. The zstd frame builders write frames by hand
from the zstd format description (RFC 8878): raw and RLE blocks, any frame
content size, optional content checksum (low 32 bits of XXH64, seed 0).
The helpers at the end (snapshot, restore, patch, flip, ...) damage a store's
files in place, for the corruption tests.
"""

from __future__ import annotations

import os
import struct

from _lxlayout import (
    BLOB_OFFSET,
    COMMIT_FIELDS,
    COMMIT_FORMAT,
    COMMIT_OFFSET,
    HEADER_FIELDS,
    HEADER_FORMAT,
    IDENTITY_FIELDS,
    IDENTITY_FORMAT,
    IDENTITY_MAGIC,
    IDENTITY_NDIM_MAX,
    IDENTITY_VERSION,
    JOURNAL_ENTRY_FORMAT,
    JOURNAL_HEADER_FORMAT,
    JOURNAL_MAGIC,
    KINDS,
    LOC_FIELDS,
    LOC_FORMAT,
    SEED_BLOB,
    SEED_COMMIT,
    SEED_HEADER,
    SEED_JOURNAL,
    SEED_JOURNAL_ENTRIES,
    SEED_WINDOWS_ENDS,
    SEED_WINDOWS_INDEX,
    WINDOWS_INDEX_FIELDS,
    WINDOWS_INDEX_FORMAT,
    WINDOWS_INDEX_NAME,
)
from _xxhash import record_checksum, xxh64

# The structs of src/format.zig (their formats come from tests/_lxlayout.py,
# which `zig build forger-layout` generates from it).
U64_MAX = (1 << 64) - 1
HEADER = struct.Struct(HEADER_FORMAT)
COMMIT = struct.Struct(COMMIT_FORMAT)
LOC = struct.Struct(LOC_FORMAT)
JOURNAL_HEADER = struct.Struct(JOURNAL_HEADER_FORMAT)
JOURNAL_ENTRY = struct.Struct(JOURNAL_ENTRY_FORMAT)
WINDOWS_INDEX = struct.Struct(WINDOWS_INDEX_FORMAT)
IDENTITY = struct.Struct(IDENTITY_FORMAT)

FILES = ("meta", "index", "data", "lock", "journal", WINDOWS_INDEX_NAME)


def pack_header(h: dict, seal: bool = True) -> bytes:
    h = dict(h)
    raw = HEADER.pack(*(h[f] for f in HEADER_FIELDS))
    if seal:
        h["checksum"] = xxh64(raw[:-8], SEED_HEADER)
        raw = HEADER.pack(*(h[f] for f in HEADER_FIELDS))
    return raw


def pack_commit(c: dict, seal: bool = True) -> bytes:
    c = dict(c)
    if seal:
        c["checksum"] = xxh64(COMMIT.pack(*(c[f] for f in COMMIT_FIELDS))[:-8], SEED_COMMIT)
    return COMMIT.pack(*(c[f] for f in COMMIT_FIELDS))


def pack_loc(loc: dict) -> bytes:
    return LOC.pack(*(loc[f] for f in LOC_FIELDS))


def unpack_loc(raw: bytes) -> dict:
    return dict(zip(LOC_FIELDS, LOC.unpack(raw)))


def unpack_windows_index(raw: bytes) -> tuple[dict, list[int]]:
    """(header fields, ends) of a windows.idx file's bytes (ends: whatever
    whole u64s follow the header)."""
    h = dict(zip(WINDOWS_INDEX_FIELDS, WINDOWS_INDEX.unpack_from(raw, 0)))
    body = raw[WINDOWS_INDEX.size:]
    ends = list(struct.unpack_from(f"<{len(body) // 8}Q", body))
    return h, ends


def pack_windows_index(h: dict, ends: list[int], seal: bool = True) -> bytes:
    """A windows.idx file; with `seal`, docs and both checksums are recomputed."""
    h = dict(h)
    body = struct.pack(f"<{len(ends)}Q", *ends)
    if seal:
        h["docs"] = len(ends)
        h["ends_checksum"] = xxh64(body, SEED_WINDOWS_ENDS)
        raw = WINDOWS_INDEX.pack(*(h[f] for f in WINDOWS_INDEX_FIELDS))
        h["checksum"] = xxh64(raw[:-8], SEED_WINDOWS_INDEX)
    return WINDOWS_INDEX.pack(*(h[f] for f in WINDOWS_INDEX_FIELDS)) + body


class StoreImage:
    """The files of one store, editable as structs. Every `put_*` re-seals the
    checksums covering what it changed unless told `seal=False`."""

    def __init__(self, files: dict[str, bytes]):
        self.files = {k: bytearray(v) for k, v in files.items()}

    @classmethod
    def load(cls, path) -> "StoreImage":
        files = {}
        for name in FILES:
            p = os.path.join(path, name)
            if os.path.isfile(p):
                with open(p, "rb") as f:
                    files[name] = f.read()
        return cls(files)

    def copy(self) -> "StoreImage":
        return StoreImage(self.files)

    def write(self, path) -> None:
        os.makedirs(path, exist_ok=True)
        for name, data in self.files.items():
            with open(os.path.join(path, name), "wb") as f:
                f.write(data)

    # -- meta: header, commit, blobs
    def header(self) -> dict:
        return dict(zip(HEADER_FIELDS, HEADER.unpack_from(self.files["meta"], 0)))

    def put_header(self, seal: bool = True, **fields) -> None:
        h = self.header()
        h.update(fields)
        self.files["meta"][0 : HEADER.size] = pack_header(h, seal)

    def commit(self) -> dict:
        return dict(zip(COMMIT_FIELDS, COMMIT.unpack_from(self.files["meta"], COMMIT_OFFSET)))

    def put_commit(self, seal: bool = True, **fields) -> None:
        c = self.commit()
        c.update(fields)
        self.files["meta"][COMMIT_OFFSET : COMMIT_OFFSET + COMMIT.size] = pack_commit(c, seal)

    @property
    def count(self) -> int:
        return self.commit()["record_count"]

    @property
    def fixed(self) -> int:
        return self.header()["fixed_size"]

    def dict_bytes(self) -> bytes:
        h = self.header()
        return bytes(self.files["meta"][BLOB_OFFSET : BLOB_OFFSET + h["dict_size"]])

    def user_bytes(self) -> bytes:
        h = self.header()
        at = BLOB_OFFSET + h["dict_size"]
        return bytes(self.files["meta"][at : at + h["user_size"]])

    def put_blobs(
        self, dict_bytes: bytes | None = None, user: bytes | None = None, seal: bool = True
    ) -> None:
        """Replaces the dictionary and/or the identity blob (sizes, blob checksum)."""
        d = self.dict_bytes() if dict_bytes is None else bytes(dict_bytes)
        u = self.user_bytes() if user is None else bytes(user)
        meta = self.files["meta"]
        del meta[BLOB_OFFSET:]
        meta.extend(d + u)
        fields = {"dict_size": len(d), "user_size": len(u)}
        if seal:
            fields["blob_checksum"] = xxh64(d + u, SEED_BLOB)
        self.put_header(seal=seal, **fields)

    # -- records
    def loc(self, i: int) -> dict:
        return unpack_loc(self.files["index"][i * LOC.size : (i + 1) * LOC.size])

    def record_parts(self, loc: dict) -> tuple[bytes, bytes] | None:
        """(aux, stored) bytes a table entry names, or None when outside the data file."""
        data = self.files["data"]
        start, aux = loc["offset"], loc["aux_size"]
        end = start + aux + loc["stored_size"]
        if end > len(data):
            return None
        return bytes(data[start : start + aux]), bytes(data[start + aux : end])

    def put_loc(self, i: int, seal: bool = True, **fields) -> dict:
        """Rewrites entry i; with `seal`, its checksum is recomputed over the
        bytes it now names (when they lie inside the data file)."""
        loc = (
            self.loc(i)
            if (i + 1) * LOC.size <= len(self.files["index"])
            else dict.fromkeys(LOC_FIELDS, 0)
        )
        loc.update(fields)
        if seal and "checksum" not in fields:
            parts = self.record_parts(loc)
            if parts is not None and loc["stored_size"] <= 1 << 24:
                loc["checksum"] = record_checksum(*parts, i)
        index = self.files["index"]
        if len(index) < (i + 1) * LOC.size:
            index.extend(bytes((i + 1) * LOC.size - len(index)))
        index[i * LOC.size : (i + 1) * LOC.size] = pack_loc(loc)
        return loc

    def sum(self, i: int) -> int:
        return struct.unpack_from("<I", self.files["index"], 4 * i)[0]

    def put_sum(self, i: int, value: int) -> None:
        struct.pack_into("<I", self.files["index"], 4 * i, value)

    def fixed_record(self, i: int) -> bytes:
        f = self.fixed
        return bytes(self.files["data"][i * f : (i + 1) * f])

    def append_data(self, payload: bytes, live: bool = True) -> int:
        """Appends bytes to the data file and the commit's data_size (and live_bytes)."""
        c = self.commit()
        at = c["data_size"]
        data = self.files["data"]
        del data[at:]
        data.extend(payload)
        self.put_commit(
            data_size=at + len(payload), live_bytes=c["live_bytes"] + (len(payload) if live else 0)
        )
        return at

    def live_total(self) -> int:
        """Stored bytes (aux + payload) of the committed records per the table."""
        n = self.count
        if self.fixed:
            return n * self.fixed
        return sum(self.loc(i)["aux_size"] + self.loc(i)["stored_size"] for i in range(n))

    # -- the delete journal
    def put_journal(
        self,
        entries: list[tuple[int, dict]],
        commit: dict,
        *,
        entries_checksum: int | None = None,
        seal: bool = True,
        entry_count: int | None = None,
    ) -> None:
        body = b"".join(JOURNAL_ENTRY.pack(index, pack_loc(loc)) for index, loc in entries)
        if entries_checksum is None:
            entries_checksum = xxh64(body, SEED_JOURNAL_ENTRIES)
        count = len(entries) if entry_count is None else entry_count
        head = JOURNAL_HEADER.pack(JOURNAL_MAGIC, count, pack_commit(commit), entries_checksum, 0)
        checksum = xxh64(head[:-8], SEED_JOURNAL) if seal else 0
        head = JOURNAL_HEADER.pack(
            JOURNAL_MAGIC, count, pack_commit(commit), entries_checksum, checksum
        )
        self.files["journal"] = bytearray(head + body)

    def single_record(self, i: int) -> "StoreImage":
        """A store holding only record i of this one, with the same header,
        dictionary and data bytes and no identity: what verify() says of it
        is what verify() says of record i alone."""
        out = StoreImage({"meta": self.files["meta"], "lock": b""})
        out.put_blobs(user=b"")
        c = self.commit()
        if self.fixed:
            f = self.fixed
            out.files["data"] = bytearray(self.files["data"][i * f : (i + 1) * f])
            out.files["index"] = bytearray(self.files["index"][4 * i : 4 * i + 4])
            out.put_commit(record_count=1, data_size=f, live_bytes=f, durable_count=1,
                           durable_data_size=f, durable_live_bytes=f)
            return out
        loc = self.loc(i)
        out.files["data"] = bytearray(self.files["data"])
        out.files["index"] = bytearray(pack_loc(loc))
        live = min(loc["aux_size"] + loc["stored_size"], c["data_size"])
        out.put_commit(record_count=1, data_size=c["data_size"], live_bytes=live, durable_count=1,
                       durable_data_size=c["data_size"], durable_live_bytes=live)
        return out


# ----------------------------------------------------------------- zstd frames

ZSTD_MAGIC = 0xFD2FB528
BLOCK_MAX = 128 << 10


def block(kind: str, payload: bytes = b"", size: int | None = None, last: bool = False) -> bytes:
    """One block: `raw` (payload), `rle` (payload is one byte, repeated `size`
    times), `compressed` (payload as given, usually garbage) or `reserved`."""
    code = {"raw": 0, "rle": 1, "compressed": 2, "reserved": 3}[kind]
    if size is None:
        size = len(payload)
    head = (size << 3) | (code << 1) | int(last)
    return head.to_bytes(3, "little") + payload


def frame(
    blocks: list[bytes],
    content_size: int | None,
    *,
    checksum_of: bytes | None = None,
    single_segment: bool = True,
    window_descriptor: int = 0,
    dict_id: int | None = None,
) -> bytes:
    """A zstd frame from hand-made blocks. `content_size` None leaves the
    size unknown (then the frame cannot be single-segment); `checksum_of`
    appends the content checksum of those bytes."""
    if content_size is None:
        single_segment = False
        fcs_flag, fcs = 0, b""
    elif content_size < 256 and single_segment:
        fcs_flag, fcs = 0, content_size.to_bytes(1, "little")
    elif 256 <= content_size < 65536 + 256:
        fcs_flag, fcs = 1, (content_size - 256).to_bytes(2, "little")
    elif content_size < 1 << 32:
        fcs_flag, fcs = 2, content_size.to_bytes(4, "little")
    else:
        fcs_flag, fcs = 3, content_size.to_bytes(8, "little")
    did_flag, did = 0, b""
    if dict_id is not None:
        did_flag, did = 3, dict_id.to_bytes(4, "little")
    descriptor = (
        (fcs_flag << 6)
        | (int(single_segment) << 5)
        | (int(checksum_of is not None) << 2)
        | did_flag
    )
    out = ZSTD_MAGIC.to_bytes(4, "little") + bytes([descriptor])
    if not single_segment:
        out += bytes([window_descriptor])
    out += did + fcs + b"".join(blocks)
    if checksum_of is not None:
        out += (xxh64(checksum_of, 0) & 0xFFFFFFFF).to_bytes(4, "little")
    return out


def raw_frame(content: bytes, checksum: bool = True, **kw) -> bytes:
    """A valid frame holding `content` in raw blocks."""
    chunks = [content[i : i + BLOCK_MAX] for i in range(0, len(content), BLOCK_MAX)] or [b""]
    blocks = [block("raw", c, last=(k == len(chunks) - 1)) for k, c in enumerate(chunks)]
    return frame(blocks, len(content), checksum_of=content if checksum else None, **kw)


# ----------------------------------------------------------------- the type identity


def pack_identity(kind: str = "dense", descr: bytes = b"'<f4'", name: bytes = b"float32", *,
                  itemsize: int = 4, item_shape=(), flags: int = 0, **fields) -> bytes:
    """A native identity (format.Identity, then its texts) from its parts;
    `fields` overrides any raw field (magic, version, header_size, ndim,
    descr_size, name_size, _reserved0, ...)."""
    h = dict.fromkeys(IDENTITY_FIELDS, 0)
    h.update(magic=IDENTITY_MAGIC, version=IDENTITY_VERSION, header_size=IDENTITY.size,
             kind=KINDS[kind] if isinstance(kind, str) else kind, ndim=len(item_shape),
             flags=flags, itemsize=itemsize, descr_size=len(descr), name_size=len(name))
    for k, d in enumerate(item_shape):
        h[f"item_shape_{k}"] = d
    h.update(fields)
    return IDENTITY.pack(*(h[f] for f in IDENTITY_FIELDS)) + descr + name


def unpack_identity(raw: bytes) -> dict:
    """The fields of a native identity, `item_shape` as a tuple, with its
    `descr` and `name` texts."""
    h = dict(zip(IDENTITY_FIELDS, IDENTITY.unpack_from(raw, 0)))
    h["item_shape"] = tuple(h.pop(f"item_shape_{k}") for k in range(IDENTITY_NDIM_MAX))[:h["ndim"]]
    at = IDENTITY.size
    h["descr"] = bytes(raw[at:at + h["descr_size"]])
    h["name"] = bytes(raw[at + h["descr_size"]:at + h["descr_size"] + h["name_size"]])
    return h


# -- in-place damage: the files of a store on disk, byte by byte


def snapshot(path) -> dict:
    """name -> bytes of every file in a store directory."""
    out = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            out[name] = f.read()
    return out


def restore(path, snap: dict) -> None:
    for name, data in snap.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)


def patch(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def flip(path, offset: int, mask: int = 0xFF) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def record_loc(store_path, i: int) -> tuple:
    with open(os.path.join(store_path, "index"), "rb") as f:
        f.seek(i * LOC.size)
        return LOC.unpack(f.read(LOC.size))


def rewrite_identity(store_path, blob: bytes, **header) -> None:
    """Replaces the store's user blob (its type identity) with `blob`, and
    any header fields given (format_version=2 for a msgpack identity), with
    valid blob and header checksums, as a hostile file would."""
    image = StoreImage.load(store_path)
    image.put_blobs(user=blob)
    if header:
        image.put_header(**header)
    image.write(store_path)
