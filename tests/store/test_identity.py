"""The type identity a typed store keeps (src/format.zig `Identity`,
loaderx/identity.py): stores of every earlier format keep opening with their
dtype, shape and records, and what is stored is checked at open."""
import os
import sys

import msgpack
import numpy as np
import pytest
from _helpers import TESTS
from _lxformat import pack_identity, rewrite_identity

import loaderx
from loaderx import DenseStore, open_store
from loaderx.errors import CorruptStoreError, NewerFormatError

sys.path.insert(0, os.path.join(TESTS, "fixtures"))
import format2_stores  # noqa: E402


def _needs(name):
    spelling = format2_stores.CASES[name][1]
    if spelling in ("bfloat16", "float8_e5m2"):
        pytest.importorskip("ml_dtypes")


@pytest.mark.parametrize("name", sorted(format2_stores.CASES))
def test_format2_stores_open_with_their_identity_and_records(tmp_path, name):
    """Stores written by the format-2 writer (msgpack identities) open, read
    and verify; appends keep them readable."""
    _needs(name)
    kind, spelling, shape, codec, frame = format2_stores.CASES[name]
    path = tmp_path / name
    format2_stores.write(name, path)
    want = format2_stores.expected(name)
    with loaderx.open_store(path) as s:
        assert s.kind == kind and s.codec == codec
        s.verify()
        if kind == "bytes":
            assert s[list(range(len(s)))] == want
            return
        assert s.dtype == format2_stores.dtype_of(spelling)
        if kind == "dense":
            assert s.item_shape == shape
            got = s[np.arange(len(s))]
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        else:
            got = s[list(range(len(s)))]
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()
        s.append(want[:1])
        assert len(s) == len(want) + 1
    with loaderx.open_store(path) as s:
        s.verify()


DTYPES = [
    np.float32, ">i4", np.bool_, "S7", "<U3", "<M8[ns]", "<c16", np.uint64,
    np.dtype([("a", "<i4"), ("b", ">f8", (2, 3))]),
    np.dtype([("a", "u1"), ("b", "<i8")], align=True),
    np.dtype({"names": ["a", "b"], "formats": ["<i4", "<f8"], "titles": ["T1", "T2"]}),
    np.dtype([("x", [("y", [("z", "<u2")])])]),
    np.dtype([("héllo", "<i2")]),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes_round_trip_through_the_native_identity(tmp_path, dtype):
    dt = np.dtype(dtype)
    data = np.zeros((3, 2), dt)
    data.view(np.uint8)[...] = np.arange(data.nbytes, dtype=np.uint8).reshape(data.view(np.uint8).shape)
    with loaderx.DenseStore(tmp_path / "d", dt, (2,)) as ds:
        ds.append(data)
    with loaderx.RaggedStore(tmp_path / "r", dt) as rs:
        rs.append([data[0], data[1:]])
    with loaderx.open_store(tmp_path / "d") as ds:
        assert ds.dtype == dt and ds.dtype.names == dt.names and ds.item_shape == (2,)
        assert ds[np.arange(3)].tobytes() == data.tobytes()
    with loaderx.open_store(tmp_path / "r") as rs:
        assert rs.dtype == dt
        assert [a.tobytes() for a in rs[[0, 1]]] == [data[0].tobytes(), data[1:].tobytes()]


def test_a_named_dtype_reads_as_raw_bytes_where_its_package_is_missing(tmp_path, monkeypatch):
    """A bfloat16 store opened where ml_dtypes is not installed: its records
    come back as raw bytes of the same size, not an error."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = (np.arange(6, dtype=np.float32) / 3).astype(ml_dtypes.bfloat16).reshape(3, 2)
    loaderx.from_numpy(tmp_path / "bf", a)
    from loaderx import identity
    monkeypatch.setattr(identity, "_dtype_named", lambda name: None)
    with loaderx.open_store(tmp_path / "bf") as s:
        assert s.dtype == np.dtype("V2")
        assert s[np.arange(3)].tobytes() == a.tobytes()


def _open_raw(path, spec, fixed_size=0):
    out = loaderx._lib.ffi.new("lx_store **")
    rc = loaderx._lib.lib.lx_open(os.fsencode(str(path)), 1, 0, 0, loaderx._lib.ffi.NULL, 0, spec,
                                  fixed_size, 0, out)
    if rc == 0:
        loaderx._lib.lib.lx_free(out[0])
    return rc, loaderx._lib.ffi.string(loaderx._lib.lib.lx_last_error()).decode()


@pytest.mark.parametrize("case", ["kind 9", "ndim 40", "descr not ASCII", "descr empty",
                                  "fixed width of another size", "named without a name"])
def test_lx_open_refuses_a_bad_identity_and_creates_nothing(tmp_path, case):
    """The library checks a create's identity as it checks an open's, before
    anything exists on disk."""
    ffi = loaderx._lib.ffi
    spec = ffi.new("lx_identity_t *")
    spec.kind, spec.itemsize, spec.ndim = 1, 4, 1
    spec.item_shape[0] = 3
    texts = {"descr": b"'<f4'", "name": b"float32"}
    fixed = 12
    if case == "kind 9":
        spec.kind = 9
    elif case == "ndim 40":
        spec.ndim = 40
    elif case == "descr not ASCII":
        texts["descr"] = "'é'".encode()
    elif case == "descr empty":
        texts["descr"] = b""
    elif case == "fixed width of another size":
        fixed = 16
    else:
        spec.flags, texts["name"] = 1, b""
    keep = {k: ffi.from_buffer("uint8_t[]", v) for k, v in texts.items()}
    spec.descr, spec.descr_size = keep["descr"], len(texts["descr"])
    spec.name, spec.name_size = keep["name"], len(texts["name"])
    rc, message = _open_raw(tmp_path / "s", spec, fixed)
    assert rc == loaderx._abi.RESULTS["invalid"], message
    assert "identity" in message or "kind" in message
    assert not (tmp_path / "s").exists()
    spec.kind, spec.ndim, spec.flags = 1, 1, 0
    texts = {"descr": b"'<f4'", "name": b"float32"}
    keep = {k: ffi.from_buffer("uint8_t[]", v) for k, v in texts.items()}
    spec.descr, spec.descr_size = keep["descr"], 5
    spec.name, spec.name_size = keep["name"], 7
    assert _open_raw(tmp_path / "s", spec, 12)[0] == 0


def test_every_ml_dtypes_scalar_type_round_trips(tmp_path):
    """float8_e5m2 saves its descr as '<f1', which numpy cannot parse back: the
    store was created, then refused as corrupt on open. Every ml_dtypes type
    now reopens as itself, values bit-exact."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import loaderx

    for name in ("bfloat16", "float8_e5m2", "float8_e4m3fn", "int4"):
        a = np.arange(8).astype(getattr(ml_dtypes, name)).reshape(4, 2)
        loaderx.from_numpy(tmp_path / name, a)
        with loaderx.open_store(tmp_path / name) as s:
            b = s[np.arange(4)]
            assert b.dtype == a.dtype and b.tobytes() == a.tobytes()


HOSTILE = {
    "object dtype": {"kind": "dense", "v": 1, "dtype": {"descr": "|O", "name": "object"}, "item_shape": []},
    "object field": {"kind": "dense", "v": 1, "dtype": {"descr": [["a", "<i4"], ["b", "|O"]], "name": "x"},
                     "item_shape": []},
    "negative shape": {"kind": "dense", "v": 1, "dtype": {"descr": "<f4", "name": "float32"},
                       "item_shape": [-3]},
    "huge shape": {"kind": "dense", "v": 1, "dtype": {"descr": "<f4", "name": "float32"},
                   "item_shape": [2**62, 2**62]},
    "overflowing shape": {"kind": "dense", "v": 1, "dtype": {"descr": "<f8", "name": "float64"},
                          "item_shape": [2**40, 2**30]},
    "unknown kind": {"kind": "tensorstore", "v": 1},
    "not a map": [1, 2, 3],
    "newer identity": {"kind": "dense", "v": 99},
    "string shape": {"kind": "dense", "v": 1, "dtype": {"descr": "<f4", "name": "float32"},
                     "item_shape": ["3"]},
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_format2_identities_are_refused_at_open(tmp_path, name):
    """Before the fix, an object dtype passed the open (the check ran only at
    create) and a gather then wrote file bytes into an object array: a
    segfault; bad shapes raised plain ValueError from numpy. (Format-2
    stores keep their identity as msgpack, which Python checks.)"""
    path = tmp_path / "s"
    with DenseStore(path, np.float32, ()) as ds:
        ds.append(np.arange(4, dtype=np.float32))
    rewrite_identity(path, msgpack.packb(HOSTILE[name]), format_version=2)
    for opener in (DenseStore, open_store):
        with pytest.raises(CorruptStoreError, match="identity"):
            opener(path)


HOSTILE_NATIVE = {
    "object dtype": dict(descr=b"'|O'", name=b"object", itemsize=8),
    "object field": dict(descr=b"[('a', '<i4'), ('b', '|O')]", itemsize=12),
    "huge shape": dict(item_shape=(2**62, 2**62)),
    "overflowing shape": dict(item_shape=(2**40, 2**30), itemsize=8),
    "unknown kind": dict(kind=7),
    "unknown flag": dict(flags=4),
    "descr not a literal": dict(descr=b"[[[("),
    "descr a call": dict(descr=b"__import__('os').getcwd()"),
    "descr a dict": dict(descr=b"{'a': 1}"),
    "descr not ASCII": dict(descr="'\u00e9'".encode()),
    "itemsize disagrees with the descr": dict(descr=b"'<f4'", itemsize=8),
    "named 'object' by flag": dict(descr=b"'|V8'", name=b"object", itemsize=8, flags=1),
    "size disagrees with its texts": dict(descr_size=2),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_NATIVE))
def test_hostile_native_identities_are_refused_at_open(tmp_path, name):
    """The native identity (format.zig) is checked by the library at open
    (its fields) and by identity.py (the dtype its text names): a forged one
    with valid checksums is refused with a message naming the identity."""
    path = tmp_path / "s"
    with DenseStore(path, np.float32, (), codec="zstd") as ds:
        ds.append(np.arange(4, dtype=np.float32))
    fields = dict(HOSTILE_NATIVE[name])
    rewrite_identity(path, pack_identity(fields.pop("kind", "dense"), fields.pop("descr", b"'<f4'"),
                                         fields.pop("name", b"float32"), **fields))
    for opener in (DenseStore, open_store):
        with pytest.raises(CorruptStoreError, match="identity"):
            opener(path)


def test_a_newer_native_identity_is_refused_as_newer(tmp_path):
    path = tmp_path / "s"
    with DenseStore(path, np.float32, (3,)) as ds:
        ds.append(np.zeros((2, 3), np.float32))
    rewrite_identity(path, pack_identity("dense", item_shape=(3,), version=2))
    with pytest.raises(NewerFormatError, match="identity has version 2"):
        open_store(path)


def test_a_fixed_width_store_must_agree_with_its_identity(tmp_path):
    """A raw dense store's records are found by arithmetic on the width the
    header names: an identity of another record size is refused at open."""
    path = tmp_path / "s"
    with DenseStore(path, np.float32, (3,), codec="raw") as ds:
        ds.append(np.zeros((2, 3), np.float32))
    rewrite_identity(path, pack_identity("dense", item_shape=(4,)))
    with pytest.raises(CorruptStoreError, match="differs from the store's fixed width"):
        open_store(path)
    rewrite_identity(path, pack_identity("ragged"))
    with pytest.raises(CorruptStoreError, match="not a dense one"):
        open_store(path)
