"""Crafted variants of the fuzz corpus of hostile stores (tests/_fuzz_cases.py)
for what a store's records are typed with: identities (msgpack and native),
ragged shapes in aux bytes, delete journals, zstd dictionaries and the token
window index (windows.idx). Each family takes (image, base, rng, k, bases)
and returns (what, states, compare), as tests/_fuzz_cases.py's do."""
from __future__ import annotations

import random
import struct

import msgpack
import numpy as np

from _lxformat import (
    SEED_WINDOWS_ENDS,
    SEED_WINDOWS_INDEX,
    U64_MAX,
    WINDOWS_INDEX,
    WINDOWS_INDEX_FIELDS,
    StoreImage,
    pack_identity,
    pack_windows_index,
    unpack_windows_index,
)
from _xxhash import index_tweak, xxh64
from _fuzz_common import Base, original_states, reseal_live, victim


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
    return f"format-2 identity: {name} (R={size})", original_states(base), "bytes"


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
    return f"identity: {name} (R={size})", original_states(base), "bytes"


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
    i = victim(img, rng)
    name, fn = SHAPE_VARIANTS[k % len(SHAPE_VARIANTS)]
    item = np.dtype(base.records[0][0]).itemsize
    aux, payload, want = fn(item)
    at = img.append_data(aux + payload, live=False)
    img.put_loc(
        i, offset=at, aux_size=len(aux), stored_size=len(payload), raw_size=len(payload), codec=0
    )
    reseal_live(img)
    states = original_states(base)
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


def delete_plan(img: StoreImage, rng: random.Random, k: int):
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
    entries, c, after = delete_plan(img, rng, 1 if hostile else rng.randrange(1, n))
    pre = img.commit()
    if variant == "valid":
        img.put_journal(entries, c)
        return [orig, after]
    if variant == "valid, deletes every record":
        entries, c, after = delete_plan(img, rng, n)
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
    return f"dictionary: {name}", original_states(base), "typed"


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
    return f"windows.idx: {name}", original_states(base), "typed"
