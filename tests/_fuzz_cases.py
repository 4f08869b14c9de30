"""The seeded fuzz corpus of hostile stores (tests/test_corruption_corpus.py).

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
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import struct

import msgpack
import numpy as np

from _lxformat import (
    BLOB_OFFSET,
    COMMIT_OFFSET,
    LOC,
    SEED_WINDOWS_ENDS,
    SEED_WINDOWS_INDEX,
    U64_MAX,
    WINDOWS_INDEX,
    WINDOWS_INDEX_FIELDS,
    StoreImage,
    block,
    frame,
    pack_identity,
    pack_windows_index,
    raw_frame,
    unpack_windows_index,
)
from _xxhash import index_tweak, record_checksum, xxh64

BASE_NAMES = ("dense_raw", "dense_zstd", "ragged_1d", "ragged_nd", "bytes_dict", "tokens")
KINDS = {
    "dense_raw": "dense",
    "dense_zstd": "dense",
    "ragged_1d": "ragged",
    "ragged_nd": "ragged",
    "bytes_dict": "bytes",
    "tokens": "ragged",
}


@dataclasses.dataclass
class Base:
    name: str
    kind: str
    files: dict
    # Per record: (dtype str or None, shape tuple or None, payload bytes).
    records: list


@dataclasses.dataclass
class Case:
    index: int
    base: str
    family: str
    what: str
    image: StoreImage
    states: list | None
    compare: str = "typed"  # "typed": dtype, shape and bytes; "bytes": payload bytes only


# ----------------------------------------------------------------- bases


def _json_records(n: int, start: int = 0) -> list[bytes]:
    return [
        json.dumps(
            {
                "id": i,
                "name": f"user{i}",
                "tags": ["a", "b", str(i % 7)],
                "score": i * 3.5,
                "active": i % 3 == 0,
            }
        ).encode()
        for i in range(start, start + n)
    ]


def _typed_records(arrays) -> list:
    return [(a.dtype.str, a.shape, a.tobytes()) for a in arrays]


def build_bases(root) -> dict[str, Base]:
    """Writes the five base stores under `root` and returns their images."""
    from loaderx import DenseStore, RaggedStore, Zrecord, train_dict

    rng = np.random.default_rng(20240611)
    made = {}
    dense = rng.integers(-1000, 1000, size=(6, 2, 3)).astype("<i4")
    with DenseStore(os.path.join(root, "dense_raw"), "<i4", (2, 3), codec="raw") as s:
        s.append(dense)
    made["dense_raw"] = _typed_records(list(dense))
    rows = np.concatenate(
        [(np.arange(120) % 5).reshape(3, 40), rng.integers(0, 60000, size=(3, 40))]
    )
    rows = rows.astype("<u2")
    with DenseStore(os.path.join(root, "dense_zstd"), "<u2", (40,), codec="zstd") as s:
        s.append(rows)
    made["dense_zstd"] = _typed_records(list(rows))
    ragged = [rng.standard_normal(n).astype("<f4") for n in (0, 1, 30, 100, 7, 64)]
    with RaggedStore(os.path.join(root, "ragged_1d"), "<f4", codec="raw") as s:
        s.append(ragged)
    made["ragged_1d"] = _typed_records(ragged)
    shapes = [(2, 3), (0, 4), (), (5,), (3, 1, 2), (40, 3), (4,)]
    nd = [rng.integers(-9, 9, size=sh).astype("<i2") for sh in shapes]
    nd[5] = np.zeros((40, 3), "<i2") + np.arange(3, dtype="<i2")
    with RaggedStore(os.path.join(root, "ragged_nd"), "<i2", codec="zstd") as s:
        s.append(nd)
    made["ragged_nd"] = _typed_records(nd)
    dict_bytes = train_dict(_json_records(300), size=1024)
    recs = _json_records(5, 1000) + [b"", bytes(rng.integers(0, 256, 50, dtype=np.uint8))]
    with Zrecord(
        os.path.join(root, "bytes_dict"), create=True, codec="zstd_dict", dict_bytes=dict_bytes
    ) as z:
        z.append(recs)
    made["bytes_dict"] = [(None, None, r) for r in recs]
    from loaderx import TokenWindows

    tokens = [(np.arange(n) % 97 * 3 + k).astype("<u2") for k, n in enumerate((40, 0, 300, 7, 129, 90))]
    with RaggedStore(os.path.join(root, "tokens"), "<u2", codec="zstd", frame_size=64) as s:
        s.append(tokens)
    with RaggedStore(os.path.join(root, "tokens")) as s:
        TokenWindows(s, 5)  # writes windows.idx
    made["tokens"] = _typed_records(tokens)
    return {
        name: Base(name, KINDS[name], StoreImage.load(os.path.join(root, name)).files, made[name])
        for name in BASE_NAMES
    }


# ----------------------------------------------------------------- helpers


def _orig(base: Base) -> list:
    """The one allowed state: the base's records, unchanged."""
    return [list(range(len(base.records)))]


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


def _reseal_live(img: StoreImage) -> None:
    """Sets the commit's live_bytes to what the table says (verify checks it)."""
    total = img.live_total()
    if total <= img.commit()["data_size"]:
        img.put_commit(live_bytes=total)


def _victim(img: StoreImage, rng: random.Random) -> int:
    return rng.randrange(img.count)


# ----------------------------------------------------------------- random families


def fam_flip(img, base, rng, k, bases):
    """Random bit flips in one file; no checksum is fixed."""
    name = _pick_file(img, rng)
    lo, hi = _region(img, name, rng)
    buf = img.files[name]
    bits = [(rng.randrange(lo, hi), rng.randrange(8)) for _ in range(rng.choice((1, 1, 2, 3)))]
    for at, bit in bits:
        buf[at] ^= 1 << bit
    return f"flip {name} bits {bits}", _orig(base), "typed"


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
    return f"overwrite {name}[{at}:{at + n}] with {how}", _orig(base), "typed"


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
        _orig(base),
        "typed",
    )


def fam_flip_sealed(img, base, rng, k, bases):
    """Random bit flips in one struct (header, commit, a table entry or the
    identity), then every checksum over it recomputed: garbage that passes them."""
    part = ("header", "commit", "entry", "user", "entry")[k % 5]
    if part == "entry" and img.fixed:
        part = "commit"
    states, compare = _orig(base), "typed"
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
        i = _victim(img, rng)
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
    return f"header: {name}", _orig(base), compare


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
    _reseal_live(img)
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
    i = _victim(img, rng)
    variants = FIXED_VARIANTS if img.fixed else ENTRY_VARIANTS
    name, fn = variants[k % len(variants)]
    want = fn(img, i, rng)
    states = _orig(base)
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
    _reseal_live(img)


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
    i = _victim(img, rng)
    variants = FRAME_VARIANTS + (("raw block past the end of the data file", None),)
    name, fn = variants[k % len(variants)]
    states = _orig(base)
    if fn is None:
        states[0][i] = _frame_past_eof(img, i, rng)
        return f"record {i}: {name}", states, "typed"
    payload = base.records[i][2]
    stored, raw_size, codec, want = fn(payload, rng)
    _point_at(img, i, stored, raw_size, codec)
    states[0][i] = i if want == "orig" else want
    return f"record {i}: {name}", states, "typed"


# ----------------------------------------------------------------- crafted: identity


def _dense(descr, shape, name="hostile"):
    return {"kind": "dense", "v": 1, "dtype": {"descr": descr, "name": name}, "item_shape": shape}


def _ragged(descr, name="hostile"):
    return {"kind": "ragged", "v": 1, "dtype": {"descr": descr, "name": name}}


def _deep_descr(levels: int) -> bytes:
    """msgpack of a dense identity whose descr nests `levels` structs deep (hand-packed)."""
    head = msgpack.packb({"kind": "dense", "v": 1, "item_shape": []})
    inner = msgpack.packb("<i4")
    for _ in range(levels):
        inner = b"\x91" + b"\x92" + msgpack.packb("f") + inner  # [[ "f", inner ]]
    dtype = b"\x82" + msgpack.packb("descr") + inner + msgpack.packb("name") + msgpack.packb("x")
    return bytes([head[0] + 1]) + head[1:] + msgpack.packb("dtype") + dtype


P = msgpack.packb
# (name, fn(R) -> identity bytes), R = the byte size of a record of the base.
IDENTITY_VARIANTS = (
    ("dense |O", lambda R: P(_dense("|O", [R // 8], "object"))),
    (
        "dense struct with an object field",
        lambda R: P(_dense([["o", "|O"], ["pad", f"|V{R - 8}"]], [])),
    ),
    ("dense object subarray field", lambda R: P(_dense([["o", "|O", [R // 8]]], []))),
    (
        "dense nested struct with an object field",
        lambda R: P(_dense([["s", [["o", "|O"]]], ["p", f"|V{R - 8}"]], [])),
    ),
    ("ragged |O", lambda R: P(_ragged("|O"))),
    ("ragged struct with an object field", lambda R: P(_ragged([["o", "|O"]]))),
    ("dense item_shape [-R]", lambda R: P(_dense("|u1", [-R]))),
    ("dense item_shape [-1, -R]", lambda R: P(_dense("|u1", [-1, -R]))),
    ("dense item_shape [2^40]", lambda R: P(_dense("|u1", [2**40]))),
    ("dense item_shape [2^62, 2^62]", lambda R: P(_dense("|u1", [2**62, 2**62]))),
    ("dense item_shape [2^64-1]", lambda R: P(_dense("|u1", [U64_MAX]))),
    ("dense item_shape [0, 2^64-1]", lambda R: P(_dense("|u1", [0, U64_MAX]))),
    ("dense item_shape [R, 0]", lambda R: P(_dense("|u1", [R, 0]))),
    ("dense item_shape of 70 dimensions", lambda R: P(_dense("|u1", [1] * 69 + [R]))),
    ("dense item_shape [1.5]", lambda R: P(_dense("|u1", [1.5]))),
    ("dense item_shape ['x']", lambda R: P(_dense("|u1", ["x"]))),
    ("dense item_shape 'abc'", lambda R: P(_dense("|u1", "abc"))),
    ("dense item_shape None", lambda R: P(_dense("|u1", None))),
    ("dense item_shape {'a': 1}", lambda R: P(_dense("|u1", {"a": 1}))),
    ("dense item_shape [[1]]", lambda R: P(_dense("|u1", [[1]]))),
    ("descr '<i99'", lambda R: P(_dense("<i99", [R]))),
    ("descr ''", lambda R: P(_dense("", [R]))),
    ("descr 5", lambda R: P(_dense(5, [R]))),
    ("descr None", lambda R: P(_dense(None, [R]))),
    ("descr []", lambda R: P(_dense([], [R]))),
    ("descr [[]]", lambda R: P(_dense([[]], [R]))),
    ("descr [['a']]", lambda R: P(_dense([["a"]], [R]))),
    ("descr {'a': 1}", lambda R: P(_dense({"a": 1}, [R]))),
    ("descr nested 480 deep", lambda R: _deep_descr(480)),
    ("descr subarray [2^40]", lambda R: P(_dense([["a", "<i4", [2**40]]], []))),
    ("descr subarray [-1]", lambda R: P(_dense([["a", "<i4", [-1]]], []))),
    ("descr field name 5", lambda R: P(_dense([[5, "<i4"]], []))),
    ("descr duplicate field names", lambda R: P(_dense([["a", "<i4"], ["a", "<i4"]], []))),
    ("descr 'O'", lambda R: P(_dense("O", [R // 8]))),
    ("descr ',i4' (numpy parses it as Python)", lambda R: P(_dense(",i4", [R // 4]))),
    ("descr '<U1'", lambda R: P(_dense("<U1", [R // 4]))),
    ("descr '|V0'", lambda R: P(_dense("|V0", [R]))),
    ("descr '|b1'", lambda R: P(_dense("|b1", [R]))),
    ("dtype a list", lambda R: P({"kind": "dense", "dtype": ["<i4"], "item_shape": [R // 4]})),
    ("dtype a string", lambda R: P({"kind": "dense", "dtype": "<i4", "item_shape": [R // 4]})),
    ("dtype missing", lambda R: P({"kind": "ragged"})),
    ("dtype name 5", lambda R: P(_dense(f"|V{R}", [], 5))),
    ("dtype name 'object' on a void descr", lambda R: P(_dense(f"|V{R}", [], "object"))),
    ("kind 'nope'", lambda R: P({"kind": "nope"})),
    ("kind None", lambda R: P({"kind": None})),
    ("kind 5", lambda R: P({"kind": 5})),
    ("kind b'dense'", lambda R: P({"kind": b"dense"}, use_bin_type=True)),
    ("kind ['dense']", lambda R: P({"kind": ["dense"]})),
    ("kind missing", lambda R: P({"v": 1})),
    ("kind 'bytes'", lambda R: P({"kind": "bytes"})),
    ("kind an ext type", lambda R: P({"kind": msgpack.ExtType(5, b"dense")})),
    ("identity a list", lambda R: P(["dense"])),
    ("identity an int", lambda R: P(7)),
    ("identity a string", lambda R: P("dense")),
    ("identity nil", lambda R: P(None)),
    ("identity not msgpack", lambda R: b"\xc1\xc1"),
    ("identity truncated", lambda R: P(_dense("<i4", [R // 4]))[:-3]),
    ("identity with trailing bytes", lambda R: P({"kind": "bytes"}) + b"\x01"),
    ("identity nested 2000 deep", lambda R: b"\x91" * 2000 + b"\xc0"),
    (
        "identity claims 2^32-1 map entries",
        lambda R: b"\xdf\xff\xff\xff\xff" + P("kind") + P("bytes"),
    ),
    ("identity with invalid UTF-8", lambda R: b"\x81\xa4kind\xa5\xff\xfe\xfd\xfc\xfb"),
    ("identity version 999", lambda R: P({"kind": "bytes", "v": 999})),
)


def _record_size(base: Base, rng: random.Random) -> int:
    sizes = [len(r[2]) for r in base.records if r[2] and len(r[2]) % 8 == 0]
    return rng.choice(sizes) if sizes else 8


def fam_identity(img, base, rng, k, bases):
    """The stored identity of a format-2 store (msgpack) replaced (blob and
    header checksums valid)."""
    name, fn = IDENTITY_VARIANTS[k % len(IDENTITY_VARIANTS)]
    size = _record_size(base, rng)
    img.put_header(format_version=2)
    img.put_blobs(user=fn(size))
    return f"format-2 identity: {name} (R={size})", _orig(base), "bytes"


def _native(R, kind="dense", descr=None, shape=None, **kw):
    """A native identity of R-byte u1 records unless told otherwise."""
    if descr is None:
        descr = b"'|u1'"
    kw.setdefault("itemsize", 1)
    kw.setdefault("name", b"uint8")
    return pack_identity(kind, descr, item_shape=(R,) if shape is None else shape, **kw)


def _struct_descr(fields: str) -> bytes:
    return fields.encode("ascii")


# (name, fn(R) -> native identity bytes), R = the byte size of a record of the base.
NATIVE_IDENTITY_VARIANTS = (
    ("dense '|O'", lambda R: _native(R // 8, descr=b"'|O'", itemsize=8, name=b"object")),
    (
        "dense struct with an object field",
        lambda R: _native(0, descr=_struct_descr(f"[('o', '|O'), ('p', '|V{R - 8}')]"),
                          shape=(), itemsize=R),
    ),
    ("ragged '|O'", lambda R: _native(0, "ragged", b"'|O'", shape=(), itemsize=8)),
    ("item_shape (2^62, 2^62)", lambda R: _native(0, shape=(2**62, 2**62))),
    ("item_shape (2^40, 2^30), itemsize 8", lambda R: _native(0, shape=(2**40, 2**30), itemsize=8)),
    ("item_shape (2^64-1,)", lambda R: _native(0, shape=(U64_MAX,))),
    ("item_shape (0, 2^63)", lambda R: _native(0, shape=(0, 2**63))),
    ("item_shape (R, 0)", lambda R: _native(0, shape=(R, 0))),
    ("item_shape of 32 dimensions", lambda R: _native(0, shape=(1,) * 31 + (R,))),
    ("ndim 33", lambda R: _native(R, ndim=33)),
    ("ndim 255", lambda R: _native(R, ndim=255)),
    ("a dimension past ndim", lambda R: _native(R, item_shape_3=1)),
    ("kind 3", lambda R: _native(R, kind=3)),
    ("kind 255", lambda R: _native(R, kind=255)),
    ("kind bytes", lambda R: pack_identity("bytes", b"", b"", itemsize=0)),
    ("kind bytes naming a dtype", lambda R: _native(0, "bytes", shape=())),
    ("kind ragged with an item shape", lambda R: _native(R, "ragged")),
    ("version 2 (newer)", lambda R: _native(R, version=2)),
    ("version 0", lambda R: _native(R, version=0)),
    ("version 2^32-1", lambda R: _native(R, version=2**32 - 1)),
    ("magic wrong", lambda R: _native(R, magic=0x1234)),
    ("header_size 0", lambda R: _native(R, header_size=0)),
    ("header_size 297", lambda R: _native(R, header_size=297)),
    ("unknown flag", lambda R: _native(R, flags=2)),
    ("reserved field set", lambda R: _native(R, _reserved0=1)),
    ("descr empty", lambda R: _native(R, descr=b"")),
    ("descr not printable", lambda R: _native(R, descr=b"'|u\x01'")),
    ("descr not ASCII", lambda R: _native(R, descr="'\u00e9'".encode())),
    ("descr not a literal", lambda R: _native(R, descr=b"[[[(")),
    ("descr a call", lambda R: _native(R, descr=b"__import__('os').getcwd()")),
    ("descr an expression", lambda R: _native(R, descr=b"'<f4' + 'x'")),
    ("descr an int", lambda R: _native(R, descr=b"5")),
    ("descr a dict", lambda R: _native(R, descr=b"{'a': 1}")),
    ("descr a set", lambda R: _native(R, descr=b"{1, 2}")),
    ("descr nested 190 deep", lambda R: _native(R, descr=b"[('a', " * 190 + b"'<i4'" + b")]" * 190)),
    ("descr nested 5000 deep", lambda R: _native(R, descr=b"[" * 5000 + b"]" * 5000)),
    ("descr of 1 MiB", lambda R: _native(R, descr=b"'" + b"a" * (2**20 - 2) + b"'")),
    ("descr of 1 MiB + 1", lambda R: _native(R, descr=b"'" + b"a" * (2**20 - 1) + b"'")),
    ("descr subarray (2^40,)", lambda R: _native(0, descr=b"[('a', '<i4', (1099511627776,))]",
                                                shape=(), itemsize=4)),
    ("descr subarray (-1,)", lambda R: _native(0, descr=b"[('a', '<i4', (-1,))]", shape=())),
    ("descr field name 5", lambda R: _native(0, descr=b"[(5, '<i4')]", shape=(), itemsize=4)),
    ("descr duplicate field names", lambda R: _native(
        0, descr=b"[('a', '<i4'), ('a', '<i4')]", shape=(), itemsize=8)),
    ("descr ',i4'", lambda R: _native(R // 4, descr=b"',i4'", itemsize=4)),
    ("descr '<U1'", lambda R: _native(R // 4, descr=b"'<U1'", itemsize=4)),
    ("descr '|V0'", lambda R: _native(R, descr=b"'|V0'", itemsize=0)),
    ("descr '<i99'", lambda R: _native(R, descr=b"'<i99'")),
    ("itemsize disagrees with the descr", lambda R: _native(R // 8, descr=b"'<f4'", itemsize=8)),
    ("itemsize 2^63", lambda R: _native(1, itemsize=2**63)),
    ("by name, the name empty", lambda R: _native(R, flags=1, name=b"")),
    ("by name 'object'", lambda R: _native(R // 8, descr=b"'|V8'", itemsize=8, flags=1,
                                           name=b"object")),
    ("by name, an unknown name", lambda R: _native(R, flags=1, name=b"nonesuch")),
    ("by name ',i4'", lambda R: _native(R // 4, descr=b"'|V4'", itemsize=4, flags=1,
                                        name=b",i4")),
    ("name not printable", lambda R: _native(R, name=b"uint\x008")),
    ("name of 256 bytes", lambda R: _native(R, name=b"n" * 256)),
    ("a trailing byte", lambda R: _native(R) + b"x"),
    ("a byte short", lambda R: _native(R)[:-1]),
    ("only the header", lambda R: _native(R)[:296]),
    ("15 bytes", lambda R: _native(R)[:15]),
    ("text sizes overflow", lambda R: _native(R, descr_size=2**32 - 1, name_size=2**32 - 1)),
    ("a record one byte longer", lambda R: _native(R + 1)),
    ("ragged", lambda R: _native(0, "ragged", shape=())),
)


def fam_native_identity(img, base, rng, k, bases):
    """The stored native identity replaced (blob and header checksums valid)."""
    name, fn = NATIVE_IDENTITY_VARIANTS[k % len(NATIVE_IDENTITY_VARIANTS)]
    size = _record_size(base, rng)
    img.put_blobs(user=fn(size))
    return f"identity: {name} (R={size})", _orig(base), "bytes"


# ----------------------------------------------------------------- crafted: ragged shapes


def _words(*w: int) -> bytes:
    return struct.pack(f"<{len(w)}Q", *w)


# (name, fn(item size) -> (aux, payload, expectation)); expectation "payload"
# means the payload bytes are the record.
SHAPE_VARIANTS = (
    ("shape (0, 2^64-1)", lambda s: (_words(2, 0, U64_MAX), b"", None)),
    ("shape (2^64-1, 0)", lambda s: (_words(2, U64_MAX, 0), b"", None)),
    ("shape (0, 2^63, 2^63)", lambda s: (_words(3, 0, 2**63, 2**63), b"", None)),
    ("shape (2^32, 2^32)", lambda s: (_words(2, 2**32, 2**32), b"", None)),
    ("shape (2^63, 2)", lambda s: (_words(2, 2**63, 2), b"", None)),
    ("shape (0, 5)", lambda s: (_words(2, 0, 5), b"", "payload")),
    ("shape (5,) spelled out", lambda s: (_words(1, 5), b"\x01" * 5 * s, "payload")),
    ("shape ()", lambda s: (_words(0), b"\x02" * s, "payload")),
    ("shape () of no bytes", lambda s: (_words(0), b"", None)),
    ("ndim 3 with two dimensions", lambda s: (_words(3, 2, 3), b"\x03" * 6 * s, None)),
    ("ndim 2^64-1", lambda s: (_words(U64_MAX, 1), b"\x03" * s, None)),
    ("aux not a multiple of 8", lambda s: (_words(2, 2, 3) + b"\0" * 4, b"\x04" * 6 * s, None)),
    ("32 dimensions", lambda s: (_words(32, *[1] * 32), b"\x05" * s, "payload")),
    ("33 dimensions", lambda s: (_words(33, *[1] * 33), b"\x05" * s, None)),
    ("aux of 65535 bytes", lambda s: (b"\x01" * 65535, b"", None)),
    ("shape (1, 2^61), no bytes", lambda s: (_words(2, 1, 2**61), b"", None)),
)


def fam_shape(img, base, rng, k, bases):
    """A ragged record rewritten with hostile shape words (valid record checksum)."""
    i = _victim(img, rng)
    name, fn = SHAPE_VARIANTS[k % len(SHAPE_VARIANTS)]
    item = np.dtype(base.records[0][0]).itemsize
    aux, payload, want = fn(item)
    at = img.append_data(aux + payload, live=False)
    img.put_loc(
        i, offset=at, aux_size=len(aux), stored_size=len(payload), raw_size=len(payload), codec=0
    )
    _reseal_live(img)
    states = _orig(base)
    states[0][i] = payload if want == "payload" else want
    return f"record {i}: {name}", states, "typed"


# ----------------------------------------------------------------- crafted: delete journals


def _journal_loc(img: StoreImage, j: int, to: int) -> dict:
    """Record j's location as a delete's journal moves it to index `to` (its
    checksum re-bound to the new index, as the engine does)."""
    if not img.fixed:
        loc = dict(img.loc(j))
    else:
        f = img.fixed
        loc = {"offset": j * f, "stored_size": f, "raw_size": f, "checksum": img.sum(j), "codec": 0,
               "_reserved": 0, "aux_size": 0}
    loc["checksum"] ^= index_tweak(j) ^ index_tweak(to)
    return loc


def _delete_plan(img: StoreImage, rng: random.Random, k: int):
    """A valid delete of k records: (entries, commit, record list after it).
    k = 1 deletes a record below the last, so the journal has one entry."""
    n = img.count
    gone = sorted(rng.sample(range(n), k)) if k > 1 else [rng.randrange(n - 1)]
    new = n - k
    holes = [d for d in gone if d < new]
    survivors = [j for j in range(new, n) if j not in gone]
    rng.shuffle(survivors)
    after = list(range(new))
    entries = []
    for hole, j in zip(holes, survivors):
        after[hole] = j
        entries.append((hole, _journal_loc(img, j, hole)))
    c = img.commit()
    if img.fixed:
        c.update(record_count=new, data_size=new * img.fixed, live_bytes=new * img.fixed)
    else:
        freed = sum(img.loc(d)["aux_size"] + img.loc(d)["stored_size"] for d in gone)
        c.update(record_count=new, live_bytes=c["live_bytes"] - freed)
    # A live journal publishes the next generation, with everything durable.
    c.update(generation=c["generation"] + 1, durable_count=new, durable_data_size=c["data_size"],
             durable_live_bytes=c["live_bytes"])
    return entries, c, after


def _wrapped_index(img: StoreImage, t: int) -> int:
    """An index whose byte offsets in the table (and data) wrap to record t's."""
    if not img.fixed:
        return t + (1 << 59)
    f = img.fixed
    low = (f & -f).bit_length() - 1  # f = 2^low * odd
    return t + (1 << max(62, 64 - low))


def _journal(img, rng, variant):
    n = img.count
    orig = list(range(n))
    hostile = variant in ("entry past the data", "entry offset near 2^64")
    entries, c, after = _delete_plan(img, rng, 1 if hostile else rng.randrange(1, n))
    pre = img.commit()
    if variant == "valid":
        img.put_journal(entries, c)
        return [orig, after]
    if variant == "valid, deletes every record":
        entries, c, after = _delete_plan(img, rng, n)
        img.put_journal(entries, c)
        return [orig, after]
    if variant == "entries checksum stale":
        img.put_journal(entries, c, entries_checksum=12345)
        return [orig, after]
    if variant == "header checksum stale":
        img.put_journal(entries, c, seal=False)
        return [orig]
    if variant == "header cut to 50 bytes":
        img.put_journal(entries, c)
        del img.files["journal"][50:]
        return [orig]
    if variant == "empty":
        img.files["journal"] = bytearray()
        return [orig]
    if variant == "noise":
        img.files["journal"] = bytearray(rng.randbytes(96 + 40 * len(entries)))
        return [orig]
    return _journal_hostile(img, rng, variant, entries, c, after, pre)


def _journal_hostile(img, rng, variant, entries, c, after, pre):
    n = img.count
    orig = list(range(n))
    if variant in ("entry past the data", "entry offset near 2^64"):
        hole, loc = entries[0]
        far = (
            img.commit()["data_size"] + 1000 if variant == "entry past the data" else (1 << 64) - 8
        )
        entries[0] = (hole, dict(loc, offset=far))
        after = list(after)
        after[hole] = None
        img.put_journal(entries, c)
        return [orig, after]
    if variant == "index wraps":
        t, j = rng.sample(range(n), 2)
        img.put_journal([(_wrapped_index(img, t), _journal_loc(img, j, _wrapped_index(img, t)))], pre)
        return [orig]
    if variant == "index 2^40":
        img.put_journal([(1 << 40, _journal_loc(img, 0, 1 << 40))], pre)
        return [orig]
    if variant == "index just past the count":
        img.put_journal([(n + 3, _journal_loc(img, 0, n + 3))], pre)
        return [orig]
    if variant == "entry_count 2^40 - 1":
        img.put_journal(entries, c, entry_count=(1 << 40) - 1)
        return [orig]
    if variant == "entry_count 2^24":
        img.put_journal(entries, c, entry_count=1 << 24)
        return [orig]
    bad = {
        "commit claims more records": dict(c, record_count=n + 5),
        "commit live_bytes > data_size": dict(c, live_bytes=c["data_size"] + 1),
        "commit data_size past the file": dict(c, data_size=len(img.files["data"]) + 7),
    }[variant]
    img.put_journal(entries, bad)
    return [orig]


JOURNAL_VARIANTS = (
    "valid",
    "valid, deletes every record",
    "entries checksum stale",
    "header checksum stale",
    "header cut to 50 bytes",
    "empty",
    "noise",
    "entry past the data",
    "entry offset near 2^64",
    "index wraps",
    "index 2^40",
    "index just past the count",
    "entry_count 2^40 - 1",
    "entry_count 2^24",
    "commit claims more records",
    "commit live_bytes > data_size",
    "commit data_size past the file",
)


def fam_journal(img, base, rng, k, bases):
    """A delete journal left in the store (valid, damaged or hostile)."""
    variant = JOURNAL_VARIANTS[k % len(JOURNAL_VARIANTS)]
    return f"journal: {variant}", _journal(img, rng, variant), "typed"


# ----------------------------------------------------------------- crafted: dictionaries


def _dict_variant(d: bytes, name: str, rng: random.Random) -> bytes:
    if name == "noise of the same size":
        return rng.randbytes(len(d))
    if name == "magic then noise":
        return d[:4] + rng.randbytes(len(d) - 4)
    if name == "dictionary id changed":
        return d[:4] + rng.randbytes(4) + d[8:]
    if name == "content tail changed":
        return d[:-100] + bytes(b ^ 0xA5 for b in d[-100:])
    if name == "entropy tables damaged":
        return d[:8] + bytes(b ^ 0xFF for b in d[8:40]) + d[40:]
    if name == "cut in half":
        return d[: len(d) // 2]
    if name == "first 8 bytes":
        return d[:8]
    if name == "empty":
        return b""
    return d[:8] + bytes(60000)  # "64 KiB of zeros after the header"


DICT_VARIANTS = (
    "noise of the same size",
    "magic then noise",
    "dictionary id changed",
    "content tail changed",
    "entropy tables damaged",
    "cut in half",
    "first 8 bytes",
    "empty",
    "zeros after the header",
)


def fam_dict(img, base, rng, k, bases):
    """A damaged zstd dictionary (blob checksum valid); other bases get the
    codec zstd_dict and the damaged dictionary."""
    name = DICT_VARIANTS[k % len(DICT_VARIANTS)]
    d = StoreImage(bases["bytes_dict"].files).dict_bytes()
    img.put_blobs(dict_bytes=_dict_variant(d, name, rng))
    if img.header()["codec"] != 2 and not img.fixed:
        img.put_header(codec=2)
    return f"dictionary: {name}", _orig(base), "typed"


# ----------------------------------------------------------------- windows.idx


def _index_image(img: StoreImage):
    return unpack_windows_index(bytes(img.files["windows.idx"]))


def _put_index(img: StoreImage, h: dict, ends: list, seal_docs: bool = True) -> None:
    """windows.idx with both checksums valid (and `docs` as given unless `seal_docs`)."""
    if seal_docs:
        img.files["windows.idx"] = bytearray(pack_windows_index(h, ends))
        return
    body = struct.pack(f"<{len(ends)}Q", *ends)
    sealed = dict(h, ends_checksum=xxh64(body, SEED_WINDOWS_ENDS))
    raw = WINDOWS_INDEX.pack(*(sealed[f] for f in WINDOWS_INDEX_FIELDS))
    sealed["checksum"] = xxh64(raw[:-8], SEED_WINDOWS_INDEX)
    img.files["windows.idx"] = bytearray(
        WINDOWS_INDEX.pack(*(sealed[f] for f in WINDOWS_INDEX_FIELDS)) + body
    )


def _index_fields(**fields):
    def forge(img, rng):
        h, ends = _index_image(img)
        _put_index(img, dict(h, **fields), ends, seal_docs=False)

    return forge


def _index_relative(field: str, delta: int):
    def forge(img, rng):
        h, ends = _index_image(img)
        _put_index(img, dict(h, **{field: (h[field] + delta) % 2**64}), ends, seal_docs=False)

    return forge


def _index_ends(change):
    def forge(img, rng):
        h, ends = _index_image(img)
        _put_index(img, h, [v % 2**64 for v in change(list(ends), rng)])

    return forge


def _index_bytes(how: str):
    def forge(img, rng):
        buf = img.files["windows.idx"]
        if how == "flip header":
            buf[rng.randrange(0, 88)] ^= 1 << rng.randrange(8)
        elif how == "flip ends":
            buf[rng.randrange(88, len(buf))] ^= 1 << rng.randrange(8)
        elif how == "truncate":
            del buf[rng.randrange(len(buf)):]
        elif how == "extend":
            buf.extend(rng.randbytes(rng.choice((1, 8, 64))))
        elif how == "remove":
            del img.files["windows.idx"]

    return forge


def _swap_sizes(ends, rng):
    sizes = [b - a for a, b in zip([0] + ends, ends)]
    i = rng.randrange(len(sizes) - 1)
    sizes[i], sizes[i + 1] = sizes[i + 1], sizes[i]
    out, at = [], 0
    for n in sizes:
        at += n
        out.append(at)
    return out


WINDOWS_VARIANTS = (
    ("a header byte flipped", _index_bytes("flip header")),
    ("an offset byte flipped", _index_bytes("flip ends")),
    ("cut short", _index_bytes("truncate")),
    ("junk appended", _index_bytes("extend")),
    ("removed", _index_bytes("remove")),
    ("docs 2^61 (sealed)", _index_fields(docs=2**61)),
    ("docs 0 (sealed)", _index_fields(docs=0)),
    ("docs + 1 (sealed)", _index_relative("docs", 1)),
    ("generation + 1 (sealed)", _index_relative("generation", 1)),
    ("generation 2^64-1 (sealed)", _index_fields(generation=U64_MAX)),
    ("durable_count + 1 (sealed)", _index_relative("durable_count", 1)),
    ("durable_data_size 2^64-1 (sealed)", _index_fields(durable_data_size=U64_MAX)),
    ("another store's id (sealed)", _index_relative("store_uid", 1)),
    ("another header checksum (sealed)", _index_relative("store_header_checksum", 1)),
    ("version 2 (sealed)", _index_fields(version=2)),
    ("header_size 96 (sealed)", _index_fields(header_size=96)),
    ("magic + 1 (sealed)", _index_relative("magic", 1)),
    ("first gap 2^63 + its size (sealed)", _index_ends(lambda e, r: [v + 2**63 for v in e])),
    ("offsets shifted a token (sealed)", _index_ends(lambda e, r: e[:2] + [v + 2 for v in e[2:]])),
    ("offsets shifted a byte (sealed)", _index_ends(lambda e, r: e[:2] + [v + 1 for v in e[2:]])),
    ("two sizes swapped (sealed)", _index_ends(_swap_sizes)),
    ("an offset decreasing (sealed)", _index_ends(lambda e, r: e[:3] + [e[2] - 2] + e[4:])),
    ("last offset 2^64-1 (sealed)", _index_ends(lambda e, r: e[:-1] + [U64_MAX])),
    ("a prefix of it (sealed)", _index_ends(lambda e, r: e[: len(e) // 2])),
    ("more documents than the store (sealed)", _index_ends(lambda e, r: e + [e[-1] + 2] * 3)),
    ("empty (sealed)", _index_ends(lambda e, r: [])),
)


def fam_windows(img, base, rng, k, bases):
    """The token store's windows.idx damaged, or forged with valid checksums."""
    name, forge = WINDOWS_VARIANTS[k % len(WINDOWS_VARIANTS)]
    forge(img, rng)
    return f"windows.idx: {name}", _orig(base), "typed"


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
