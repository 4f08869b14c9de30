"""A writer of the original loaderx's 0.9 store layout, written for the
tests from the layout the original's README documents (no code of the original):

meta.zr: a 16-byte header (magic "ZREC", version u16, tail_chunk u16,
tail_offset u32, length u32), then one 16-byte entry per record (offset u32,
phys_length u32, logic_length u32, chunk_id u16, codec u8: 0 raw, 1 zstd,
2 zstd_dict, reserved u8); chunk files 0.zr, 1.zr, ...; dict.zr, the zstd
dictionary; schema.msgpack, the kind ("dense"/"ragged"), dtype and row shape.
Every integer little-endian.

zstd frames come from the standard library's compression.zstd (Python 3.14) or
the `zstandard` package, whichever is installed (`zstd()` is None with neither).
"""
from __future__ import annotations

import os
import struct

import msgpack
import numpy as np

HEADER = struct.Struct("<4sHHII")
ENTRY = struct.Struct("<IIIHBB")


class _Zstd:
    """zstd compression and dictionary training from what is installed."""

    def __init__(self):
        try:
            from compression import zstd as std  # Python >= 3.14
            self._std, self._pkg = std, None
        except ImportError:
            import zstandard
            self._std, self._pkg = None, zstandard

    @property
    def name(self) -> str:
        return "compression.zstd" if self._std else "zstandard"

    def compress(self, data: bytes, dictionary: bytes | None = None, level: int = 3) -> bytes:
        if self._std:
            zd = self._std.ZstdDict(dictionary) if dictionary else None
            return self._std.compress(data, level=level, zstd_dict=zd)
        zd = self._pkg.ZstdCompressionDict(dictionary) if dictionary else None
        return self._pkg.ZstdCompressor(level=level, dict_data=zd,
                                        write_content_size=True).compress(data)

    def train(self, samples: list[bytes], size: int) -> bytes:
        if self._std:
            return self._std.train_dict(samples, size).dict_content
        return self._pkg.train_dictionary(size, samples).as_bytes()


def zstd() -> _Zstd | None:
    try:
        return _Zstd()
    except ImportError:
        return None


def write_store(path, records: list[bytes], *, codecs=None, schema: dict | None = None,
                dictionary: bytes | None = None, chunk_bytes: int = 1 << 20,
                version: int = 1) -> list[dict]:
    """Writes `records` in the original layout; `codecs[i]` is 0, 1 or 2 (default
    all raw). Records fill a chunk up to `chunk_bytes`, then the next. Returns
    the entries written (dicts with the entry fields)."""
    os.makedirs(path, exist_ok=True)
    codecs = [0] * len(records) if codecs is None else list(codecs)
    z = zstd() if any(c for c in codecs) else None
    entries, chunk, offset = [], 0, 0
    out = open(os.path.join(path, "0.zr"), "wb")
    try:
        for data, codec in zip(records, codecs):
            stored = data if codec == 0 else z.compress(data, dictionary if codec == 2 else None)
            if offset and offset + len(stored) > chunk_bytes:
                out.close()
                chunk, offset = chunk + 1, 0
                out = open(os.path.join(path, f"{chunk}.zr"), "wb")
            out.write(stored)
            entries.append({"offset": offset, "phys_length": len(stored),
                            "logic_length": len(data), "chunk_id": chunk, "codec": codec})
            offset += len(stored)
    finally:
        out.close()
    with open(os.path.join(path, "meta.zr"), "wb") as f:
        f.write(HEADER.pack(b"ZREC", version, chunk, offset, len(entries)))
        for e in entries:
            f.write(ENTRY.pack(e["offset"], e["phys_length"], e["logic_length"], e["chunk_id"],
                               e["codec"], 0))
    if dictionary is not None:
        with open(os.path.join(path, "dict.zr"), "wb") as f:
            f.write(dictionary)
    if schema is not None:
        with open(os.path.join(path, "schema.msgpack"), "wb") as f:
            f.write(msgpack.packb(schema))
    return entries


def patch_entry(path, index: int, **fields) -> None:
    """Rewrites fields of entry `index` of meta.zr in place."""
    file = os.path.join(path, "meta.zr")
    with open(file, "r+b") as f:
        f.seek(HEADER.size + index * ENTRY.size)
        values = dict(zip(("offset", "phys_length", "logic_length", "chunk_id", "codec",
                           "reserved"), ENTRY.unpack(f.read(ENTRY.size))))
        values.update(fields)
        f.seek(HEADER.size + index * ENTRY.size)
        f.write(ENTRY.pack(*values.values()))


def dense_records(array: np.ndarray) -> list[bytes]:
    return [np.ascontiguousarray(r).astype(r.dtype.newbyteorder("<")).tobytes() for r in array]
