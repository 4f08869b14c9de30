"""A PNG writer for tests, written for them: every colour type and bit depth,
each row with a different filter (so the decoder's five unfilters all run),
optionally Adam7-interlaced, plus the RGB the image stage should read back
(alpha dropped, 16-bit samples to their high byte, grey and palette
expanded). Pillow cannot write most of these variants.

Run as a script, it (re)writes the fixtures src/image/png.zig's tests embed:
src/image/testdata/png_*.png and their expected RGB (.rgb), and
src/image/testdata/pngs.zig, the list of them."""
from __future__ import annotations

import os
import struct
import sys
import zlib
from typing import List, Tuple

import numpy as np

SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
         (0, 1, 1, 2)]


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def _filter(kind: int, row: bytes, prev: bytes, bpp: int) -> bytes:
    out = bytearray(len(row))
    for i, x in enumerate(row):
        a = row[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        pred = [0, a, b, (a + b) // 2, _paeth(a, b, c)][kind]
        out[i] = (x - pred) & 0xFF
    return bytes([kind]) + bytes(out)


def _pack(samples: np.ndarray, depth: int) -> bytes:
    """One scanline's samples (1-D, already in sample order) as bytes."""
    if depth == 16:
        return samples.astype(">u2").tobytes()
    if depth == 8:
        return samples.astype(np.uint8).tobytes()
    bits = np.unpackbits(samples.astype(np.uint8)[:, None], axis=1)[:, 8 - depth:]
    return np.packbits(bits.reshape(-1)).tobytes()


def _scanlines(pixels: np.ndarray, depth: int, spp: int) -> List[bytes]:
    h = pixels.shape[0]
    return [_pack(pixels[y].reshape(-1), depth) for y in range(h)]


def _filtered(lines: List[bytes], bpp: int, start: int) -> bytes:
    out, prev = [], bytes(len(lines[0])) if lines else b""
    for k, line in enumerate(lines):
        out.append(_filter((start + k) % 5, line, prev, bpp))
        prev = line
    return b"".join(out)


def write_png(pixels: np.ndarray, color: int, depth: int, palette=None,
              interlace: bool = False) -> bytes:
    """pixels: (H, W, samples) of values < 2**depth."""
    h, w, spp = pixels.shape
    assert spp == SAMPLES[color]
    bpp = max(1, spp * depth // 8)
    if interlace:
        raw = b""
        for i, (x0, y0, dx, dy) in enumerate(ADAM7):
            sub = pixels[y0::dy, x0::dx]
            if sub.shape[0] and sub.shape[1]:
                raw += _filtered(_scanlines(sub, depth, spp), bpp, i)
    else:
        raw = _filtered(_scanlines(pixels, depth, spp), bpp, 0)
    data = zlib.compress(raw, 6)
    parts = [b"\x89PNG\r\n\x1a\n",
             _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color, 0, 0, int(interlace)))]
    if palette is not None:
        parts.append(_chunk(b"PLTE", bytes(np.asarray(palette, np.uint8).reshape(-1))))
    # Two IDAT chunks: the decoder joins them.
    half = len(data) // 2
    parts += [_chunk(b"IDAT", data[:half]), _chunk(b"IDAT", data[half:]), _chunk(b"IEND", b"")]
    return b"".join(parts)


def expected_rgb(pixels: np.ndarray, color: int, depth: int, palette=None) -> np.ndarray:
    """What the stage reads: (H, W, 3) uint8."""
    v = pixels.astype(np.int64)
    if depth == 16:
        v = v >> 8
    elif depth < 8 and color == 0:
        v = v * (255 // (2 ** depth - 1))
    if color == 3:
        pal = np.asarray(palette, np.uint8)
        return pal[pixels[..., 0]]
    if color in (0, 4):
        return np.repeat(v[..., :1], 3, axis=2).astype(np.uint8)
    return v[..., :3].astype(np.uint8)


def cases(seed: int = 0) -> List[Tuple[str, bytes, np.ndarray]]:
    """(name, png bytes, expected RGB) for every colour type and depth,
    plain and interlaced, at odd sizes."""
    rng = np.random.default_rng(seed)
    out = []
    for color, depths in [(0, [1, 2, 4, 8, 16]), (2, [8, 16]), (3, [1, 2, 4, 8]),
                          (4, [8, 16]), (6, [8, 16])]:
        for depth in depths:
            for interlace in (False, True):
                h, w = 13, 19
                px = rng.integers(0, 2 ** depth, (h, w, SAMPLES[color]))
                palette = None
                if color == 3:
                    palette = rng.integers(0, 256, (2 ** depth, 3))
                png = write_png(px, color, depth, palette, interlace)
                name = f"png_c{color}_d{depth}{'_i' if interlace else ''}"
                out.append((name, png, expected_rgb(px, color, depth, palette)))
    return out


def main() -> int:
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src",
                        "image", "testdata")
    lines = ["//! Generated by tests/_png_fixtures.py: PNGs of every colour type and depth",
             "//! with the RGB the decoder must give.", "",
             "pub const Case = struct { png: []const u8, rgb: []const u8, width: u32 };", "",
             "pub const all = [_]Case{"]
    for name, png, rgb in cases():
        with open(os.path.join(root, name + ".png"), "wb") as f:
            f.write(png)
        with open(os.path.join(root, name + ".rgb"), "wb") as f:
            f.write(rgb.tobytes())
        lines.append(f'    .{{ .png = @embedFile("{name}.png"), .rgb = @embedFile("{name}.rgb"), '
                     f'.width = {rgb.shape[1]} }},')
    lines.append("};")
    with open(os.path.join(root, "pngs.zig"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
