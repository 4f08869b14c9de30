"""The on-disk format of a store (src/format.zig) for tests that damage
stores in place: file snapshots and patches, and rewriting a store's
identity blob with valid checksums (XXH64 from _xxhash; the fuzz corpus's
_lxformat.StoreImage edits whole stores)."""
from __future__ import annotations

import os
import struct

from _xxhash import xxh64  # noqa: F401  (re-exported for the damage tests)

# On-disk layout (src/format.zig), for the damage tests only.
HEADER_CHECKSUM_SEED = 0x4C58
COMMIT_CHECKSUM_SEED = 0x4C59
COMMIT_OFFSET = 4096
LOC = struct.Struct("<QQQIBBH")  # RecordLoc: offset, stored_size, raw_size, checksum, codec, _, aux_size


BLOB_CHECKSUM_SEED = 0x4C5C
BLOB_OFFSET = 8192
HEADER = struct.Struct("<QIIB3xiQQQQQ5QQ")  # format.Header: 112 bytes


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


def rewrite_identity(store_path, blob: bytes) -> None:
    """Replaces the store's user blob (its type identity) with `blob`, with a
    valid blob and header checksum, as a hostile file would."""
    meta = os.path.join(store_path, "meta")
    with open(meta, "rb") as f:
        data = bytearray(f.read())
    fields = list(HEADER.unpack_from(data, 0))
    # magic, version, header_size, codec, level, flags, dict_size, user_size, blob_checksum, ...
    dict_size = fields[6]
    dictionary = bytes(data[BLOB_OFFSET:BLOB_OFFSET + dict_size])
    fields[7] = len(blob)
    fields[8] = xxh64(dictionary + blob, BLOB_CHECKSUM_SEED)
    packed = bytearray(HEADER.pack(*fields))
    packed[104:112] = xxh64(bytes(packed[:104]), HEADER_CHECKSUM_SEED).to_bytes(8, "little")
    data[0:112] = packed
    del data[BLOB_OFFSET + dict_size:]
    data += blob
    with open(meta, "wb") as f:
        f.write(data)
