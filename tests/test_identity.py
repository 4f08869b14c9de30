"""The type identity a typed store keeps (src/format.zig `Identity`,
loaderx/identity.py): stores of every earlier format keep opening with their
dtype, shape and records, and what is stored is checked at open."""
import os
import sys

import numpy as np
import pytest

import loaderx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
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
