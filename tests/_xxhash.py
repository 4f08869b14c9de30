"""XXH64 and the short-input path of XXH3-64 in pure Python, for tests that
forge store files with valid checksums (see src/format.zig; the seeds come
from the generated tests/_lxlayout.py).

Kept, not replaced by the library's own checksum through the C ABI: an
implementation written from the published algorithm pins the format. The
format's checksums come from Zig's std.hash, so a Zig upgrade that changed
them, or an edited seed, would silently change what every store on disk must
match; a forger that borrowed the library's function would follow the change
and every test would still pass. tests/store/test_format.py checks this module
against the library on random inputs of every length path instead.

Written from the published algorithm descriptions (xxHash's spec: XXH64's
four-lane accumulate/merge/avalanche, XXH3's 0-240 byte paths over its default
192-byte secret); checked against the engine in tests/store/test_format.py.
Only what the store format needs is here: XXH3 inputs longer than 240 bytes
never reach it (`record_checksum` switches to XXH64 there, as the engine does).
"""

from __future__ import annotations

import struct

from _lxlayout import RECORD_XXH3_MAX, SEED_RECORD

MASK = (1 << 64) - 1

P64_1 = 0x9E3779B185EBCA87
P64_2 = 0xC2B2AE3D27D4EB4F
P64_3 = 0x165667B19E3779F9
P64_4 = 0x85EBCA77C2B2AE63
P64_5 = 0x27D4EB2F165667C5
P32_1 = 0x9E3779B1
P32_2 = 0x85EBCA77
P32_3 = 0xC2B2AE3D

# XXH3's default secret (kSecret), 192 bytes.
SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)

def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & MASK


def _u64(b: bytes, at: int) -> int:
    return struct.unpack_from("<Q", b, at)[0]


def _u32(b: bytes, at: int) -> int:
    return struct.unpack_from("<I", b, at)[0]


# ----------------------------------------------------------------- XXH64


def _lane(acc: int, lane: int) -> int:
    acc = (acc + lane * P64_2) & MASK
    return (_rotl(acc, 31) * P64_1) & MASK


def _merge(h: int, v: int) -> int:
    h ^= _lane(0, v)
    return (h * P64_1 + P64_4) & MASK


def _avalanche64(h: int) -> int:
    h = ((h ^ (h >> 33)) * P64_2) & MASK
    h = ((h ^ (h >> 29)) * P64_3) & MASK
    return h ^ (h >> 32)


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of `data`."""
    data = bytes(data)
    n = len(data)
    at = 0
    if n >= 32:
        v = [
            (seed + P64_1 + P64_2) & MASK,
            (seed + P64_2) & MASK,
            seed & MASK,
            (seed - P64_1) & MASK,
        ]
        stripes = n // 32
        words = struct.unpack_from(f"<{4 * stripes}Q", data, 0)
        for s in range(stripes):
            for k in range(4):
                v[k] = _lane(v[k], words[4 * s + k])
        at = 32 * stripes
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & MASK
        for k in range(4):
            h = _merge(h, v[k])
    else:
        h = (seed + P64_5) & MASK
    h = (h + n) & MASK
    while at + 8 <= n:
        h ^= _lane(0, _u64(data, at))
        h = (_rotl(h, 27) * P64_1 + P64_4) & MASK
        at += 8
    if at + 4 <= n:
        h ^= (_u32(data, at) * P64_1) & MASK
        h = (_rotl(h, 23) * P64_2 + P64_3) & MASK
        at += 4
    while at < n:
        h ^= (data[at] * P64_5) & MASK
        h = (_rotl(h, 11) * P64_1) & MASK
        at += 1
    return _avalanche64(h)


# ----------------------------------------------------------------- XXH3 (<= 240 bytes)


def _avalanche3(h: int) -> int:
    h = ((h ^ (h >> 37)) * 0x165667919E3779F9) & MASK
    return h ^ (h >> 32)


def _rrmxmx(h: int, n: int) -> int:
    h ^= _rotl(h, 49) ^ _rotl(h, 24)
    h = (h * 0x9FB21C651E98DF25) & MASK
    h ^= ((h >> 35) + n) & MASK
    h = (h * 0x9FB21C651E98DF25) & MASK
    return h ^ (h >> 28)


def _fold(a: int, b: int) -> int:
    """The 128-bit product of a and b, its halves xored."""
    p = a * b
    return (p & MASK) ^ (p >> 64)


def _mix16(data: bytes, at: int, secret_at: int, seed: int) -> int:
    lo = _u64(data, at) ^ ((_u64(SECRET, secret_at) + seed) & MASK)
    hi = _u64(data, at + 8) ^ ((_u64(SECRET, secret_at + 8) - seed) & MASK)
    return _fold(lo, hi)


def _xxh3_0to16(data: bytes, seed: int) -> int:
    n = len(data)
    if n > 8:
        flip1 = ((_u64(SECRET, 24) ^ _u64(SECRET, 32)) + seed) & MASK
        flip2 = ((_u64(SECRET, 40) ^ _u64(SECRET, 48)) - seed) & MASK
        lo = _u64(data, 0) ^ flip1
        hi = _u64(data, n - 8) ^ flip2
        swapped = int.from_bytes(lo.to_bytes(8, "little"), "big")
        return _avalanche3((n + swapped + hi + _fold(lo, hi)) & MASK)
    if n >= 4:
        low32 = seed & 0xFFFFFFFF
        seed ^= int.from_bytes(low32.to_bytes(4, "little"), "big") << 32
        flip = ((_u64(SECRET, 8) ^ _u64(SECRET, 16)) - seed) & MASK
        word = (_u32(data, n - 4) + (_u32(data, 0) << 32)) & MASK
        return _rrmxmx(word ^ flip, n)
    if n > 0:
        combined = (data[0] << 16) | (data[n >> 1] << 24) | data[n - 1] | (n << 8)
        flip = ((_u32(SECRET, 0) ^ _u32(SECRET, 4)) + seed) & MASK
        return _avalanche64(combined ^ flip)
    return _avalanche64(seed ^ _u64(SECRET, 56) ^ _u64(SECRET, 64))


def _xxh3_17to128(data: bytes, seed: int) -> int:
    n = len(data)
    acc = (n * P64_1) & MASK
    # Pairs of 16-byte blocks from both ends, outermost last.
    for k in range((n - 1) // 32, -1, -1):
        acc += _mix16(data, 16 * k, 32 * k, seed)
        acc += _mix16(data, n - 16 * (k + 1), 32 * k + 16, seed)
    return _avalanche3(acc & MASK)


def _xxh3_129to240(data: bytes, seed: int) -> int:
    n = len(data)
    acc = (n * P64_1) & MASK
    for k in range(8):
        acc += _mix16(data, 16 * k, 16 * k, seed)
    acc = _avalanche3(acc & MASK)
    for k in range(8, n // 16):
        acc += _mix16(data, 16 * k, 16 * (k - 8) + 3, seed)
    acc += _mix16(data, n - 16, 136 - 17, seed)
    return _avalanche3(acc & MASK)


def xxh3_64(data: bytes, seed: int = 0) -> int:
    """XXH3-64 of `data` (at most 240 bytes: the only inputs the format hashes with it)."""
    data = bytes(data)
    n = len(data)
    if n > 240:
        raise ValueError(f"xxh3_64 here covers inputs up to 240 bytes, got {n}")
    if n <= 16:
        return _xxh3_0to16(data, seed & MASK)
    if n <= 128:
        return _xxh3_17to128(data, seed & MASK)
    return _xxh3_129to240(data, seed & MASK)


def record_checksum(aux: bytes, stored: bytes, index: int) -> int:
    """The 32-bit checksum src/format.zig `storedChecksum` keeps for record
    `index`: its bytes' checksum bound to its index."""
    if not aux and len(stored) <= RECORD_XXH3_MAX:
        return (xxh3_64(stored, SEED_RECORD) & 0xFFFFFFFF) ^ index_tweak(index)
    return (xxh64(bytes(aux) + bytes(stored), SEED_RECORD) & 0xFFFFFFFF) ^ index_tweak(index)


def index_tweak(index: int) -> int:
    """src/format.zig `indexTweak`: splitmix64's finalizer, low 32 bits."""
    z = (index + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return (z ^ (z >> 31)) & 0xFFFFFFFF
