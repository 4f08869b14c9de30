"""The seeded fuzz corpus of hostile stores (tests/faults/test_corruption_corpus.py).

`build_bases` writes six small stores with loaderx: DenseStore raw (the
fixed-width layout), DenseStore zstd, RaggedStore 1-D (raw), RaggedStore n-D
(zstd, shapes in aux bytes), a zstd_dict Zrecord, and a token store
(RaggedStore uint16, zstd in seekable frames of 64 bytes, with the
windows.idx a TokenWindows wrote). `make_case(bases, seed, i)`
turns case number i into one mutated copy of a base, deterministically: the
families take turns (`SCHEDULE`), enumerated hostile variants are walked in
order so every run covers all of them, and a `random.Random` seeded by
(seed, i) picks the rest.

Each case says what a correct engine may show for it (`Case.states`): the
possible record lists of the store (usually just the original records; a delete
journal allows before and after), where each record is an original's number, a
literal payload, or None (no content expectation: the record is hostile by
construction and only the crash/exception invariants apply).

This module holds the random families, the crafted variants of the store's
layout (header, commit, table entries, zstd frames) and the schedule;
tests/_fuzz_crafted.py the crafted variants of what is typed (identities,
ragged shapes, delete journals, dictionaries, windows.idx); tests/_fuzz_common.py
the bases and the helpers both use.
"""
from __future__ import annotations

import random
import struct

from _lxformat import BLOB_OFFSET, COMMIT_OFFSET, LOC, U64_MAX, StoreImage, block, frame, raw_frame
from _xxhash import record_checksum
from _fuzz_common import BASE_NAMES, Base, Case, original_states, reseal_live, victim
from _fuzz_crafted import (
    DICT_VARIANTS,
    IDENTITY_VARIANTS,
    JOURNAL_VARIANTS,
    NATIVE_IDENTITY_VARIANTS,
    SHAPE_VARIANTS,
    WINDOWS_VARIANTS,
    fam_dict,
    fam_identity,
    fam_journal,
    fam_native_identity,
    fam_shape,
    fam_windows,
)


# ----------------------------------------------------------------- helpers


def _region(img: StoreImage, name: str, rng: random.Random) -> tuple[int, int]:
    """A byte range of file `name` worth mutating (meta: header, commit or blobs)."""
    size = len(img.files[name])
    if name != "meta":
        return 0, size
    return rng.choice([(0, 112), (COMMIT_OFFSET, COMMIT_OFFSET + 64), (BLOB_OFFSET, size)])


def _pick_file(img: StoreImage, rng: random.Random) -> str:
    names = [
        n
        for n in ("meta", "index", "data", "index", "data", "journal", "windows.idx")
        if len(img.files.get(n, b""))
    ]
    return rng.choice(names)


def _payload_expect(img: StoreImage, loc: dict):
    """What a table entry denotes when that is knowable here: the payload of a
    raw record inside the committed data, else None."""
    end = loc["offset"] + loc["aux_size"] + loc["stored_size"]
    if (
        loc["codec"] != 0
        or loc["stored_size"] != loc["raw_size"]
        or end > img.commit()["data_size"]
    ):
        return None
    return bytes(img.files["data"][loc["offset"] + loc["aux_size"] : end])


# ----------------------------------------------------------------- random families


def fam_flip(img, base, rng, k, bases):
    """Random bit flips in one file; no checksum is fixed."""
    name = _pick_file(img, rng)
    lo, hi = _region(img, name, rng)
    buf = img.files[name]
    bits = [(rng.randrange(lo, hi), rng.randrange(8)) for _ in range(rng.choice((1, 1, 2, 3)))]
    for at, bit in bits:
        buf[at] ^= 1 << bit
    return f"flip {name} bits {bits}", original_states(base), "typed"


def fam_overwrite(img, base, rng, k, bases):
    """A run of bytes in one file overwritten (noise, 0x00, 0xFF or bytes copied from elsewhere)."""
    name = _pick_file(img, rng)
    lo, hi = _region(img, name, rng)
    buf = img.files[name]
    at = rng.randrange(lo, hi)
    n = min(rng.choice((1, 2, 4, 8, 16, 64)), len(buf) - at)
    how = rng.choice(("noise", "zero", "ones", "copy"))
    if how == "noise":
        new = rng.randbytes(n)
    elif how == "copy":
        src = rng.randrange(0, max(1, len(buf) - n))
        new = bytes(buf[src : src + n])
    else:
        new = (b"\0" if how == "zero" else b"\xff") * n
    buf[at : at + n] = new
    return f"overwrite {name}[{at}:{at + n}] with {how}", original_states(base), "typed"


def fam_truncate(img, base, rng, k, bases):
    """One file cut short, emptied, removed or extended."""
    name = ("meta", "index", "data", "lock")[k % 4]
    buf = img.files[name]
    how = rng.choice(("zero", "minus1", "random", "remove", "extend"))
    if how == "remove":
        del img.files[name]
    elif how == "extend":
        buf.extend(rng.randbytes(rng.choice((1, 100, 5000))))
    else:
        sizes = {"zero": 0, "minus1": max(0, len(buf) - 1), "random": rng.randrange(len(buf) + 1)}
        size = sizes[how]
        del buf[size:]
    return (
        f"truncate {name}: {how} (now {len(img.files.get(name, b''))} bytes)",
        original_states(base),
        "typed",
    )


def fam_flip_sealed(img, base, rng, k, bases):
    """Random bit flips in one struct (header, commit, a table entry or the
    identity), then every checksum over it recomputed: garbage that passes them."""
    part = ("header", "commit", "entry", "user", "entry")[k % 5]
    if part == "entry" and img.fixed:
        part = "commit"
    states, compare = original_states(base), "typed"
    if part == "header":
        raw = bytearray(img.files["meta"][0:104])
        _flip_bits(raw, rng)
        img.files["meta"][0:104] = raw
        img.put_header()
    elif part == "commit":
        raw = bytearray(img.files["meta"][COMMIT_OFFSET : COMMIT_OFFSET + 56])
        _flip_bits(raw, rng)
        img.files["meta"][COMMIT_OFFSET : COMMIT_OFFSET + 56] = raw
        img.put_commit()
        n = img.count
        if n <= len(base.records):
            # The durability contract: records past the commit's durable count
            # may be dropped by the first open after a crash (they are checked
            # and the intact prefix kept), so any prefix from there is allowed.
            durable = min(img.commit()["durable_count"], n)
            states = [list(range(k)) for k in range(durable, n + 1)]
    elif part == "entry":
        i = victim(img, rng)
        raw = bytearray(img.files["index"][i * LOC.size : i * LOC.size + 24])
        raw += img.files["index"][i * LOC.size + 28 : (i + 1) * LOC.size]
        _flip_bits(raw, rng)
        fields = dict(zip(("offset", "stored_size", "raw_size"), struct.unpack_from("<3Q", raw)))
        fields["codec"], fields["_reserved"], fields["aux_size"] = struct.unpack_from(
            "<BBH", raw, 24
        )
        loc = img.put_loc(i, **fields)
        states[0][i] = _payload_expect(img, loc)
    else:
        user = bytearray(img.user_bytes())
        _flip_bits(user, rng)
        img.put_blobs(user=bytes(user))
        compare = "bytes"
    return f"flip {part} and reseal its checksums", states, compare


def _flip_bits(buf: bytearray, rng: random.Random) -> None:
    for _ in range(rng.choice((1, 1, 2, 4))):
        buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)


# ----------------------------------------------------------------- crafted: header


def _shift_split(img: StoreImage, d: int) -> None:
    """Moves the dictionary/identity boundary; the blob checksum stays valid."""
    h = img.header()
    d = max(-h["dict_size"], min(d, h["user_size"]))
    img.put_header(dict_size=h["dict_size"] + d, user_size=h["user_size"] - d)


def _fixed_consistent(img: StoreImage, size: int) -> None:
    n = img.count
    img.put_header(fixed_size=size, codec=0)
    img.put_commit(data_size=n * size, live_bytes=n * size)


def _bytes_view(img: StoreImage) -> str:
    img.put_blobs(user=b"")
    return "bytes"


HEADER_VARIANTS = (
    ("format_version 0", lambda img: img.put_header(format_version=0)),
    ("format_version 4 (newer)", lambda img: img.put_header(format_version=4)),
    (
        "format_version 2 (a native identity read as msgpack)",
        lambda img: img.put_header(format_version=2),
    ),
    ("format_version 2^32-1", lambda img: img.put_header(format_version=2**32 - 1)),
    ("header_size 0", lambda img: img.put_header(header_size=0)),
    ("header_size 113", lambda img: img.put_header(header_size=113)),
    ("codec 3", lambda img: img.put_header(codec=3)),
    ("codec 255", lambda img: img.put_header(codec=255)),
    ("codec raw", lambda img: img.put_header(codec=0)),
    ("codec zstd", lambda img: img.put_header(codec=1)),
    ("codec zstd_dict", lambda img: img.put_header(codec=2)),
    ("level -2^31", lambda img: img.put_header(level=-(2**31))),
    ("level 2^31-1", lambda img: img.put_header(level=2**31 - 1)),
    ("level 0", lambda img: img.put_header(level=0)),
    ("flags all ones", lambda img: img.put_header(flags=U64_MAX)),
    (
        "reserved fields set",
        lambda img: img.put_header(_reserved0=b"\xff\xff\xff", _reserved1_0=U64_MAX, _reserved1_2=7),
    ),
    ("uid changed", lambda img: img.put_header(uid=img.header()["uid"] ^ 0x5A5A)),
    ("frame_size 63", lambda img: img.put_header(frame_size=63)),
    ("frame_size 2^30+1", lambda img: img.put_header(frame_size=2**30 + 1)),
    ("frame_size 2^64-1", lambda img: img.put_header(frame_size=U64_MAX)),
    ("frame_size 64", lambda img: img.put_header(frame_size=64)),
    ("dict/identity boundary +1", lambda img: _shift_split(img, 1)),
    ("dict/identity boundary -1", lambda img: _shift_split(img, -1)),
    ("identity moved into the dictionary", lambda img: _shift_split(img, 1 << 40)),
    ("dictionary moved into the identity", lambda img: _shift_split(img, -(1 << 40))),
    ("identity removed (blob resealed)", _bytes_view),
    ("dict_size 2^32 (implausible)", lambda img: img.put_header(dict_size=2**32)),
    (
        "blob of 4 GiB - 1",
        lambda img: img.put_header(dict_size=2**32 - 1 - img.header()["user_size"]),
    ),
    ("dict_size 2^28 (past the file)", lambda img: img.put_header(dict_size=2**28)),
    ("user_size 2^40", lambda img: img.put_header(user_size=2**40)),
    (
        "blob sizes sum overflows",
        lambda img: img.put_header(dict_size=U64_MAX - img.header()["user_size"] + 2),
    ),
    (
        "blob checksum stale",
        lambda img: img.put_header(blob_checksum=img.header()["blob_checksum"] ^ 1),
    ),
    ("fixed_size 0", lambda img: img.put_header(fixed_size=0)),
    ("fixed_size 1", lambda img: img.put_header(fixed_size=1)),
    ("fixed_size 2^63", lambda img: img.put_header(fixed_size=2**63)),
    ("fixed_size 2^64-1", lambda img: img.put_header(fixed_size=U64_MAX)),
    ("fixed_size 4, commit made consistent", lambda img: _fixed_consistent(img, 4)),
    ("fixed_size 2^61, commit made consistent", lambda img: _fixed_consistent(img, 2**61)),
    (
        "magic byte-swapped",
        lambda img: img.put_header(
            magic=int.from_bytes(img.header()["magic"].to_bytes(8, "little"), "big")
        ),
    ),
    ("magic + 1", lambda img: img.put_header(magic=img.header()["magic"] + 1)),
)


def fam_header(img, base, rng, k, bases):
    """A header field set to a hostile value, header checksum valid."""
    name, fn = HEADER_VARIANTS[k % len(HEADER_VARIANTS)]
    compare = fn(img) or "typed"
    return f"header: {name}", original_states(base), compare


# ----------------------------------------------------------------- crafted: commit


def _prefix(img: StoreImage, k: int, fix_live: bool = True) -> list:
    if img.fixed:
        img.put_commit(record_count=k, data_size=k * img.fixed, live_bytes=k * img.fixed)
    else:
        img.put_commit(record_count=k)
        if fix_live:
            img.put_commit(live_bytes=img.live_total())
    return [list(range(k))]


def _set_data_size(img: StoreImage, size: int) -> None:
    img.put_commit(data_size=size, live_bytes=min(img.commit()["live_bytes"], size))


COMMIT_VARIANTS = (
    ("record_count 0", lambda img, r: _prefix(img, 0)),
    ("record_count a prefix", lambda img, r: _prefix(img, r.randrange(1, img.count))),
    (
        "record_count a prefix, live_bytes stale",
        lambda img, r: _prefix(img, r.randrange(1, img.count), False),
    ),
    ("record_count + 1", lambda img, r: img.put_commit(record_count=img.count + 1)),
    ("record_count 2^32", lambda img, r: img.put_commit(record_count=2**32)),
    ("record_count 2^59 + 1", lambda img, r: img.put_commit(record_count=2**59 + 1)),
    ("record_count 2^62 + 1", lambda img, r: img.put_commit(record_count=2**62 + 1)),
    ("record_count 2^64-1", lambda img, r: img.put_commit(record_count=U64_MAX)),
    ("data_size 0", lambda img, r: _set_data_size(img, 0)),
    ("data_size - 1", lambda img, r: _set_data_size(img, img.commit()["data_size"] - 1)),
    ("data_size past the file", lambda img, r: _set_data_size(img, len(img.files["data"]) + 1)),
    ("data_size 2^63", lambda img, r: _set_data_size(img, 2**63)),
    ("data_size 2^64-1", lambda img, r: _set_data_size(img, U64_MAX)),
    (
        "live_bytes > data_size",
        lambda img, r: img.put_commit(live_bytes=img.commit()["data_size"] + 1),
    ),
    ("live_bytes 0", lambda img, r: img.put_commit(live_bytes=0)),
    (
        "durable, generation, reserved at max",
        lambda img, r: img.put_commit(
            durable_count=U64_MAX, generation=U64_MAX, durable_data_size=U64_MAX, durable_live_bytes=1
        ),
    ),
)


def fam_commit(img, base, rng, k, bases):
    """A commit field set to a hostile value, commit checksum valid."""
    name, fn = COMMIT_VARIANTS[k % len(COMMIT_VARIANTS)]
    n = img.count
    states = fn(img, rng) or [list(range(n))]
    return f"commit: {name}", states, "typed"


# ----------------------------------------------------------------- crafted: table entries


def _loc_set(img, i, rng, **fields):
    loc = img.put_loc(i, **fields)
    return _payload_expect(img, loc)


def _wrap_total(img, i, rng):
    """aux_size + stored_size overflows u64 to a small total (0 to 5)."""
    aux = max(img.loc(i)["aux_size"], 1)
    return _loc_set(
        img, i, rng, aux_size=aux, stored_size=(1 << 64) - aux + rng.choice((0, min(5, aux - 1)))
    )


def _alias(img, i, rng):
    j = rng.choice([x for x in range(img.count) if x != i])
    img.put_loc(i, **img.loc(j))
    reseal_live(img)
    return ("orig", j)


ENTRY_VARIANTS = (
    ("offset = data_size", lambda img, i, r: _loc_set(img, i, r, offset=img.commit()["data_size"])),
    (
        "offset = data_size - 1",
        lambda img, i, r: _loc_set(img, i, r, offset=img.commit()["data_size"] - 1),
    ),
    ("offset 2^63", lambda img, i, r: _loc_set(img, i, r, offset=2**63)),
    ("offset 2^64-1", lambda img, i, r: _loc_set(img, i, r, offset=U64_MAX)),
    (
        "offset so that the end wraps",
        lambda img, i, r: _loc_set(
            img,
            i,
            r,
            offset=((1 << 64) - img.loc(i)["stored_size"] - img.loc(i)["aux_size"] + 3) & U64_MAX,
        ),
    ),
    (
        "offset random inside the data",
        lambda img, i, r: _loc_set(
            img, i, r, offset=r.randrange(max(1, img.commit()["data_size"]))
        ),
    ),
    ("stored_size 0", lambda img, i, r: _loc_set(img, i, r, stored_size=0)),
    (
        "stored_size + 1",
        lambda img, i, r: _loc_set(img, i, r, stored_size=img.loc(i)["stored_size"] + 1),
    ),
    ("stored_size 2^63", lambda img, i, r: _loc_set(img, i, r, stored_size=2**63)),
    ("stored_size 2^64-1", lambda img, i, r: _loc_set(img, i, r, stored_size=U64_MAX)),
    ("aux_size + stored_size wraps", _wrap_total),
    ("raw_size 0", lambda img, i, r: _loc_set(img, i, r, raw_size=0)),
    ("raw_size + 1", lambda img, i, r: _loc_set(img, i, r, raw_size=img.loc(i)["raw_size"] + 1)),
    ("raw_size 2^40", lambda img, i, r: _loc_set(img, i, r, raw_size=2**40)),
    ("raw_size 2^64-1", lambda img, i, r: _loc_set(img, i, r, raw_size=U64_MAX)),
    (
        "raw and stored size 2^64-1",
        lambda img, i, r: _loc_set(img, i, r, raw_size=U64_MAX, stored_size=U64_MAX),
    ),
    ("codec 0", lambda img, i, r: _loc_set(img, i, r, codec=0)),
    ("codec 1", lambda img, i, r: _loc_set(img, i, r, codec=1)),
    ("codec 2", lambda img, i, r: _loc_set(img, i, r, codec=2)),
    ("codec 3", lambda img, i, r: _loc_set(img, i, r, codec=3)),
    ("aux_size 65535", lambda img, i, r: _loc_set(img, i, r, aux_size=65535)),
    ("aux_size 8", lambda img, i, r: _loc_set(img, i, r, aux_size=8)),
    (
        "checksum stale",
        lambda img, i, r: img.put_loc(i, checksum=img.loc(i)["checksum"] ^ 0x10) and ("orig", i),
    ),
    ("alias of another entry", _alias),
)


def _fixed_alias(img, i, rng):
    j = rng.choice([x for x in range(img.count) if x != i])
    f = img.fixed
    img.files["data"][i * f : (i + 1) * f] = img.fixed_record(j)
    img.put_sum(i, img.sum(j))
    return ("orig", j)


FIXED_VARIANTS = (
    ("checksum stale", lambda img, i, r: img.put_sum(i, img.sum(i) ^ 1) or ("orig", i)),
    (
        "checksum of another record",
        lambda img, i, r: img.put_sum(i, img.sum((i + 1) % img.count)) or ("orig", i),
    ),
    ("record bytes of another record, checksum resealed", _fixed_alias),
    ("record bytes zeroed, checksum resealed", lambda img, i, r: _fixed_zero(img, i)),
)


def _fixed_zero(img, i):
    f = img.fixed
    img.files["data"][i * f : (i + 1) * f] = bytes(f)
    img.put_sum(i, record_checksum(b"", bytes(f), i))
    return bytes(f)


def fam_entry(img, base, rng, k, bases):
    """A table entry (or fixed-width checksum) forged with a valid record checksum."""
    i = victim(img, rng)
    variants = FIXED_VARIANTS if img.fixed else ENTRY_VARIANTS
    name, fn = variants[k % len(variants)]
    want = fn(img, i, rng)
    states = original_states(base)
    states[0][i] = want[1] if isinstance(want, tuple) else want
    return f"entry {i}: {name}", states, "typed"


# ----------------------------------------------------------------- crafted: zstd frames


def _point_at(img: StoreImage, i: int, payload: bytes, raw_size: int, codec: int = 1) -> None:
    """Appends record i's aux bytes and `payload` to the data and points entry i there."""
    loc = img.loc(i)
    aux = bytes(img.files["data"][loc["offset"] : loc["offset"] + loc["aux_size"]])
    at = img.append_data(aux + payload, live=False)
    img.put_loc(
        i, offset=at, aux_size=len(aux), stored_size=len(payload), raw_size=raw_size, codec=codec
    )
    reseal_live(img)


def _rle(size: int, claim: int | None, byte: bytes = b"\x07") -> bytes:
    blocks, left = [], size
    while True:
        n = min(left, 128 << 10)
        left -= n
        blocks.append(block("rle", byte, size=n, last=left == 0))
        if left == 0:
            return frame(blocks, claim, checksum_of=byte * size if claim == size else None)


def _other_bytes(p: bytes, rng: random.Random) -> bytes:
    return bytes(b ^ 0x5A for b in p) if p else b""


SKIPPABLE = (0x184D2A50).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"

# (name, fn(payload, rng) -> (stored bytes, raw_size, codec, expectation)); an
# expectation "orig" means the record's own content.
FRAME_VARIANTS = (
    ("valid raw-block frame", lambda p, r: (raw_frame(p), len(p), 1, "orig")),
    (
        "valid frame without checksum",
        lambda p, r: (raw_frame(p, checksum=False), len(p), 1, "orig"),
    ),
    (
        "valid frame of other bytes",
        lambda p, r: (raw_frame(_other_bytes(p, r)), len(p), 1, _other_bytes(p, r)),
    ),
    ("RLE frame of 1 MiB", lambda p, r: (_rle(1 << 20, 1 << 20), 1 << 20, 1, b"\x07" * (1 << 20))),
    ("frame claims 2^40 bytes", lambda p, r: (_rle(128 << 10, 1 << 40), 1 << 40, 1, None)),
    (
        "frame claims 2^40 bytes, table says the true size",
        lambda p, r: (_rle(128 << 10, 1 << 40), len(p), 1, None),
    ),
    ("frame claims 2^33 bytes", lambda p, r: (_rle(128 << 10, 1 << 33), 1 << 33, 1, None)),
    (
        "content size unknown, raw_size 2^64-1",
        lambda p, r: (frame([block("raw", p, last=True)], None), U64_MAX, 1, None),
    ),
    (
        "content size unknown, raw_size true",
        lambda p, r: (frame([block("raw", p, last=True)], None), len(p), 1, "orig"),
    ),
    ("garbage, raw_size 2^64-2", lambda p, r: (r.randbytes(len(p) + 8), U64_MAX - 1, 1, None)),
    ("content size field 2^64-1", lambda p, r: (_rle(16, U64_MAX), U64_MAX, 1, None)),
    (
        "wrong content checksum",
        lambda p, r: (
            frame([block("raw", p, last=True)], len(p), checksum_of=p + b"!"),
            len(p),
            1,
            "orig",
        ),
    ),
    (
        "window too large",
        lambda p, r: (
            frame(
                [block("raw", p, last=True)], len(p), single_segment=False, window_descriptor=0xF8
            ),
            len(p),
            1,
            None,
        ),
    ),
    (
        "reserved block type",
        lambda p, r: (frame([block("reserved", b"x", last=True)], len(p)), len(p), 1, None),
    ),
    (
        "compressed block of noise",
        lambda p, r: (
            frame([block("compressed", r.randbytes(40), last=True)], len(p)),
            len(p),
            1,
            None,
        ),
    ),
    (
        "frame names a dictionary id",
        lambda p, r: (raw_frame(p, dict_id=r.randrange(1, 2**31)), len(p), 1, None),
    ),
    ("skippable frame, raw_size 0", lambda p, r: (SKIPPABLE, 0, 1, b"")),
    ("truncated frame", lambda p, r: (raw_frame(p)[:-3], len(p), 1, None)),
    (
        "two frames, the second empty",
        lambda p, r: (raw_frame(p) + raw_frame(b""), len(p), 1, "orig"),
    ),
    (
        "two frames, the second not empty",
        lambda p, r: (raw_frame(p) + raw_frame(b"zz"), len(p), 1, "orig"),
    ),
    ("zstd_dict frame in any store", lambda p, r: (raw_frame(p), len(p), 2, "orig")),
    (
        "RLE block larger than the content size",
        lambda p, r: (frame([block("rle", b"\x01", size=100, last=True)], 10), 10, 1, None),
    ),
    (
        "raw block longer than the payload",
        lambda p, r: (frame([block("raw", b"x" * 10, size=1000, last=True)], 1000), 1000, 1, None),
    ),
)


def _frame_past_eof(img, i, rng):
    """A frame whose raw block runs past the data file, behind an entry whose
    aux_size + stored_size wraps to 0 (so the range check passes)."""
    loc = img.loc(i)
    payload = frame([block("raw", b"", size=128 << 10, last=True)], 1 << 20)
    at = img.append_data(b"\0" + payload, live=False)
    img.put_loc(
        i,
        offset=at,
        aux_size=1,
        stored_size=U64_MAX,
        raw_size=1 << 20,
        codec=1,
        checksum=loc["checksum"],
    )
    return None


def fam_frame(img, base, rng, k, bases):
    """Record i re-pointed at a hand-made zstd frame (valid record checksum)."""
    i = victim(img, rng)
    variants = FRAME_VARIANTS + (("raw block past the end of the data file", None),)
    name, fn = variants[k % len(variants)]
    states = original_states(base)
    if fn is None:
        states[0][i] = _frame_past_eof(img, i, rng)
        return f"record {i}: {name}", states, "typed"
    payload = base.records[i][2]
    stored, raw_size, codec, want = fn(payload, rng)
    _point_at(img, i, stored, raw_size, codec)
    states[0][i] = i if want == "orig" else want
    return f"record {i}: {name}", states, "typed"


# ----------------------------------------------------------------- the schedule

GENERAL = ("dense_zstd", "ragged_1d", "ragged_nd", "bytes_dict", "tokens")
SCHEDULE = (
    (fam_flip, BASE_NAMES),
    (fam_overwrite, BASE_NAMES),
    (fam_truncate, BASE_NAMES),
    (fam_flip_sealed, BASE_NAMES),
    (fam_flip, BASE_NAMES),
    (fam_header, BASE_NAMES),
    (fam_commit, BASE_NAMES),
    (fam_entry, BASE_NAMES),
    (fam_entry, GENERAL),
    (fam_frame, GENERAL),
    (fam_identity, BASE_NAMES),
    (fam_native_identity, BASE_NAMES),
    (fam_native_identity, BASE_NAMES),
    (fam_journal, BASE_NAMES),
    (fam_journal, BASE_NAMES),
    (fam_shape, ("ragged_1d", "ragged_nd")),
    (fam_dict, BASE_NAMES),
    (fam_flip_sealed, BASE_NAMES),
    (fam_overwrite, BASE_NAMES),
    (fam_windows, ("tokens",)),
    (fam_windows, ("tokens",)),
)


VARIANT_COUNTS = {
    fam_truncate: 4,
    fam_flip_sealed: 5,
    fam_header: len(HEADER_VARIANTS),
    fam_commit: len(COMMIT_VARIANTS),
    fam_entry: len(ENTRY_VARIANTS),
    fam_frame: len(FRAME_VARIANTS) + 1,
    fam_identity: len(IDENTITY_VARIANTS),
    fam_native_identity: len(NATIVE_IDENTITY_VARIANTS),
    fam_shape: len(SHAPE_VARIANTS),
    fam_journal: len(JOURNAL_VARIANTS),
    fam_dict: len(DICT_VARIANTS),
    fam_windows: len(WINDOWS_VARIANTS),
}


def make_case(bases: dict[str, Base], seed: int, i: int) -> Case:
    """Case number i of the corpus seeded by `seed` (a pure function of both)."""
    fam, names = SCHEDULE[i % len(SCHEDULE)]
    # Family turn number: which enumerated variant this case takes.
    turn = sum(1 for j in range(i % len(SCHEDULE)) if SCHEDULE[j][0] is fam)
    per_round = sum(1 for f, _ in SCHEDULE if f is fam)
    k = (i // len(SCHEDULE)) * per_round + turn
    rng = random.Random(f"loaderx-fuzz/{seed}/{i}")
    # Enumerated variants meet a different base in each round through them.
    count = VARIANT_COUNTS.get(fam, 1)
    name = names[(k // count + k % count + seed) % len(names)]
    base = bases[name]
    img = StoreImage(base.files)
    what, states, compare = fam(img, base, rng, k, bases)
    return Case(i, name, fam.__name__[4:], what, img, states, compare)
