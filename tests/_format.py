"""The on-disk format of a store (src/format.zig) for tests that damage or
craft stores: XXH64 written out in Python, file snapshots and patches, and
rewriting a store's identity blob with valid checksums."""
from __future__ import annotations

import os
import struct

# On-disk layout (src/format.zig), for the damage tests only.
HEADER_CHECKSUM_SEED = 0x4C58
COMMIT_CHECKSUM_SEED = 0x4C59
COMMIT_OFFSET = 4096
LOC = struct.Struct("<QQQIBBH")  # RecordLoc: offset, stored_size, raw_size, checksum, codec, _, aux_size


_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5, _M64 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5, (1 << 64) - 1


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _xxround(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M64, 31) * _P1) & _M64


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 (the engine's header/commit checksum), written out in Python."""
    n, p = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M64, (seed + _P2) & _M64, seed & _M64, (seed - _P1) & _M64]
        while p + 32 <= n:
            for k in range(4):
                v[k] = _xxround(v[k], int.from_bytes(data[p:p + 8], "little"))
                p += 8
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M64
        for k in range(4):
            h = (((h ^ _xxround(0, v[k])) * _P1) + _P4) & _M64
    else:
        h = (seed + _P5) & _M64
    h = (h + n) & _M64
    while p + 8 <= n:
        h ^= _xxround(0, int.from_bytes(data[p:p + 8], "little"))
        h = (_rotl(h, 27) * _P1 + _P4) & _M64
        p += 8
    if p + 4 <= n:
        h ^= (int.from_bytes(data[p:p + 4], "little") * _P1) & _M64
        h = (_rotl(h, 23) * _P2 + _P3) & _M64
        p += 4
    while p < n:
        h ^= (data[p] * _P5) & _M64
        h = (_rotl(h, 11) * _P1) & _M64
        p += 1
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    return h ^ (h >> 32)


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
