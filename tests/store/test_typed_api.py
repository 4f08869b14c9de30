"""The typed stores' type identity (dtype, item shape, kind, codec and level,
checked at open and named on a mismatch), the API common to `DenseStore`
and `RaggedStore`, and dictionary training (`train_dict`)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from _helpers import assert_same

import loaderx
from loaderx.errors import (
    ArgumentTypeError,
    ClosedError,
    DictionaryError,
    IdentityError,
    InvalidArgumentError,
)
from loaderx.zrecord import DenseStore, RaggedStore, Zrecord, train_dict
from _typed import (
    CODECS,
    DTYPES,
    ZSTD_DICT_MAGIC,
    assert_same_list,
    codec_kwargs,
    make_dense,
)

_TEXTS = [f'{{"id": {i}, "text": "record number {i}"}}'.encode() for i in range(400)]


# ----------------------------------------------------------------- 4. identity

def test_reopen_keeps_identity(tmp_path):
    for codec in CODECS:
        data = make_dense(DTYPES["int16"], (3, 4, 5), 20, seed=41)
        path = tmp_path / codec
        with DenseStore(path, np.int16, (3, 4, 5), **codec_kwargs(codec, data)) as ds:
            ds.append(data)
            dictionary = ds.dictionary()
        with DenseStore(path) as ds:
            assert (ds.dtype, ds.item_shape, ds.codec) == (np.dtype(np.int16), (3, 4, 5), codec)
            assert ds.dictionary() == dictionary
            assert_same(ds[:], data)
        # Passing the same identity again opens and checks it.
        with DenseStore(path, np.int16, (3, 4, 5)) as ds:
            assert len(ds) == 20


def test_dense_identity_mismatch_names_both(tmp_path):
    path = tmp_path / "d"
    with DenseStore(path, np.float32, (3,)) as ds:
        ds.append(np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError) as e:
        DenseStore(path, np.int16, (3,))
    assert "float32" in str(e.value) and "int16" in str(e.value)
    with pytest.raises(TypeError) as e:
        DenseStore(path, np.float32, (4,))
    assert "(3,)" in str(e.value) and "(4,)" in str(e.value)
    with DenseStore(path) as ds:  # untouched
        assert (ds.dtype, ds.item_shape, len(ds)) == (np.dtype(np.float32), (3,), 2)


def test_ragged_identity_mismatch_names_both(tmp_path):
    path = tmp_path / "r"
    RaggedStore(path, np.int32).close()
    with pytest.raises(TypeError) as e:
        RaggedStore(path, np.float64)
    assert "int32" in str(e.value) and "float64" in str(e.value)


def test_kind_mismatch(tmp_path):
    dense, ragged, raw = tmp_path / "dense", tmp_path / "ragged", tmp_path / "raw"
    DenseStore(dense, np.float32, (2,)).close()
    RaggedStore(ragged, np.float32).close()
    Zrecord(raw, create=True).close()
    for cls, path, holds in ((DenseStore, ragged, "ragged"), (RaggedStore, dense, "dense"),
                             (DenseStore, raw, "bytes"), (RaggedStore, raw, "bytes")):
        want = "dense" if cls is DenseStore else "ragged"
        with pytest.raises(IdentityError, match=f"store holds {holds} records, not {want} ones"):
            cls(path)
    with pytest.raises(IdentityError, match="store holds ragged records, not dense ones"):
        DenseStore(ragged, np.float32, (2,))
    with pytest.raises(IdentityError, match="store holds dense records, not ragged ones"):
        RaggedStore(dense, np.float32)
    with pytest.raises(IdentityError, match="store holds dense records; open it with DenseStore"):
        Zrecord(dense)


def test_missing_store_is_not_created(tmp_path):
    for cls in (DenseStore, RaggedStore):
        with pytest.raises(FileNotFoundError):
            cls(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()


def test_object_dtype_refused(tmp_path):
    # (a plain TypeError, as for the library's other argument checks)
    refused = "holds Python objects, which cannot be stored"
    with pytest.raises(TypeError, match=f"dtype object {refused}"):
        DenseStore(tmp_path / "d", object, (2,))
    with pytest.raises(TypeError, match=f"dtype object {refused}"):
        RaggedStore(tmp_path / "r", object)
    with pytest.raises(TypeError, match=r"dtype \[\('a', '<i4'\), \('o', 'O'\)\] " + refused):
        DenseStore(tmp_path / "s", np.dtype([("a", "<i4"), ("o", "O")]), ())
    assert not (tmp_path / "d").exists()
    assert not (tmp_path / "r").exists()
    assert not (tmp_path / "s").exists()


def test_a_dtype_without_width_is_refused(tmp_path):
    """Before, ``DenseStore.create(p, str, (2,))`` made a ``<U0`` store: every
    string appended to it read back as ""."""
    for dtype, shown in ((str, "<U0"), (bytes, "|S0"), ("V0", "|V0"), (np.dtype([]), r"\[\]")):
        with pytest.raises(TypeError, match=f"dtype {shown} has no width .*'U16'"):
            DenseStore.create(tmp_path / "d", dtype, (2,))
        with pytest.raises(TypeError, match=f"dtype {shown} has no width"):
            RaggedStore.create(tmp_path / "r", dtype)
    with pytest.raises(TypeError, match="dtype <U0 has no width"):
        loaderx.from_iterator(tmp_path / "n", [np.zeros(3, "U1")], dtype=str)
    assert sorted(os.listdir(tmp_path)) == []


def test_structured_dtype_round_trips(tmp_path):
    nested = np.dtype([("id", "<u8"), ("pos", "<f4", (3,)), ("tag", "S4"),
                       ("inner", [("x", "<i2"), ("y", "u1")])])
    data = np.zeros(6, nested)
    data["id"] = np.arange(6)
    data["pos"] = np.arange(18, dtype=np.float32).reshape(6, 3)
    data["tag"] = [b"ab", b"cd", b"", b"abcd", b"x", b"yz"]
    data["inner"]["x"] = -np.arange(6)
    data["inner"]["y"] = 200
    with DenseStore(tmp_path / "d", nested, ()) as ds:
        ds.append(data)
    with DenseStore(tmp_path / "d") as ds:
        assert ds.dtype == nested
        assert ds.dtype.names == nested.names
        assert_same(ds[:], data)
        assert_same(ds[3], data[3])
    with RaggedStore(tmp_path / "r", nested) as rs:
        rs.append([data[:2], data[2:]])
    with RaggedStore(tmp_path / "r") as rs:
        assert rs.dtype == nested
        assert_same_list(rs[:], [data[:2], data[2:]])


def test_dense_append_wrong_dtype_or_shape(tmp_path):
    with DenseStore(tmp_path / "d", np.float32, (3, 4)) as ds:
        ds.append(np.zeros((2, 3, 4), np.float32))
        with pytest.raises(IdentityError, match="float64"):
            ds.append(np.zeros((2, 3, 4), np.float64))
        with pytest.raises(ValueError, match=r"\(2, 4, 3\)"):
            ds.append(np.zeros((2, 4, 3), np.float32))
        with pytest.raises(ValueError):
            ds.append(np.zeros((3, 4), np.float32))  # one record without the batch axis
        with pytest.raises(TypeError):
            ds.append([[[0.0] * 4] * 3])
        assert len(ds) == 2
        # A non-contiguous batch of the right type is fine.
        src = np.arange(48, dtype=np.float32).reshape(4, 4, 3).transpose(0, 2, 1)
        assert ds.append(src) == 2
        assert_same(ds[2:], src)


@pytest.mark.parametrize("cls", ["dense", "ragged"])
@pytest.mark.parametrize("case", ["dict-codec-without-dict", "dict-with-zstd", "dict-with-raw", "garbage-dict"])
def test_dictionary_errors_leave_nothing(tmp_path, cls, case):
    path = tmp_path / "store"
    kwargs = {
        "dict-codec-without-dict": {"codec": "zstd_dict"},
        "dict-with-zstd": {"codec": "zstd", "dict_bytes": train_dict(make_dense(DTYPES["uint8"], (64,), 50, 42), "fast")},
        "dict-with-raw": {"codec": "raw", "dict_bytes": b"\x37\xa4\x30\xec" + bytes(200)},
        "garbage-dict": {"codec": "zstd_dict", "dict_bytes": b"this is not a zstd dictionary" * 10},
    }[case]
    with pytest.raises(DictionaryError) as e:
        if cls == "dense":
            DenseStore(path, np.uint8, (64,), **kwargs)
        else:
            RaggedStore(path, np.uint8, **kwargs)
    assert isinstance(e.value, ValueError)
    assert not path.exists(), os.listdir(path)


def test_compression_level_is_selectable(tmp_path):
    rng = np.random.default_rng(43)
    words = [w.encode() for w in ("alpha", "beta", "gamma", "delta", "records", "loader", "zstd",
                                  "compression", "dictionary", "store", "the", "of", "and")]
    text = b" ".join(words[i] for i in rng.integers(0, len(words), 200_000))
    data = np.frombuffer(text[:16 * 65536], np.uint8).reshape(16, 65536)
    sizes = {}
    for level in (1, 19):
        with DenseStore(tmp_path / f"l{level}", np.uint8, (65536,), codec="zstd", level=level) as ds:
            assert ds.level == level
            ds.append(data)
            sizes[level] = ds.stats()["live_bytes"]
            assert_same(ds[:], data)
    assert sizes[19] < sizes[1] < data.nbytes
    with pytest.raises(TypeError):
        DenseStore(tmp_path / "bad", np.uint8, (4,), level="high")


def test_unknown_codec(tmp_path):
    with pytest.raises(ValueError, match="lz4"):
        DenseStore(tmp_path / "d", np.uint8, (4,), codec="lz4")
    assert not (tmp_path / "d").exists()


def test_codec_and_level_of_the_wrong_kind_are_named(tmp_path):
    """Before the fix, ``codec=["zstd"]`` raised "unhashable type: 'list'" and
    ``level=2**40`` cffi's "integer 1099511627776 does not fit 'int'"."""
    with pytest.raises(InvalidArgumentError, match="codec"):
        DenseStore(tmp_path / "a", np.int8, (), codec=["zstd"])
    with pytest.raises(InvalidArgumentError, match="level 1099511627776"):
        DenseStore(tmp_path / "b", np.int8, (), level=2**40)
    with pytest.raises(ValueError, match="tier"):
        train_dict(_TEXTS, [])


def test_level_zero_is_refused_before_anything_is_created(tmp_path):
    """level=0 passed the argument check, the store was created at zstd's
    default (3), then the reopen check refused 0 != 3 and left the new store
    behind."""
    with pytest.raises(InvalidArgumentError, match="level 0 is not a zstd level"):
        DenseStore(tmp_path / "d", np.uint8, (4,), level=0)
    assert not (tmp_path / "d").exists()


# ----------------------------------------------------------------- 5. the common API

def _dense(path):
    ds = DenseStore(path, np.int32, (5,), codec="zstd")
    ds.append(np.arange(100, dtype=np.int32).reshape(20, 5))
    return ds


def _ragged(path):
    rs = RaggedStore(path, np.int32, codec="zstd")
    rs.append([np.arange(i, dtype=np.int32) for i in range(1, 21)])
    return rs


MAKERS = {"dense": _dense, "ragged": _ragged}


@pytest.mark.parametrize("kind", list(MAKERS))
def test_common_api(tmp_path, kind):
    path = tmp_path / kind
    s = MAKERS[kind](path)
    assert len(s) == 20
    assert s.dtype == np.int32
    assert s.item_shape == ((5,) if kind == "dense" else None)
    assert s.codec == "zstd"
    assert s.path == os.fspath(path)
    text = repr(s)
    assert type(s).__name__ in text and os.fspath(path) in text and "20" in text

    st = s.stats()
    assert st["records"] == 20
    assert st["reclaimable"] == 0
    assert st["chunk_bytes"] == st["live_bytes"] + st["reclaimable"]
    assert st["live_bytes"] > 0
    s.sync()
    s.verify()

    s.delete([0, 1, 2])
    st2 = s.stats()
    assert st2["records"] == len(s) == 17
    assert st2["live_bytes"] < st["live_bytes"]
    assert st2["reclaimable"] > 0
    assert st2["chunk_bytes"] == st2["live_bytes"] + st2["reclaimable"]
    s.compact()
    st3 = s.stats()
    assert st3["records"] == 17
    assert st3["reclaimable"] == 0
    assert st3["live_bytes"] == st3["chunk_bytes"] == st2["live_bytes"]
    s.verify()
    s.close()
    s.close()  # idempotent
    assert "closed" in repr(s)


@pytest.mark.parametrize("kind", list(MAKERS))
def test_context_manager_and_closed_use(tmp_path, kind):
    path = tmp_path / kind
    with MAKERS[kind](path) as s:
        assert len(s) == 20
    assert s.closed
    calls = {
        "len": lambda: len(s),
        "getitem": lambda: s[0],
        "gather": lambda: s.gather([0]),
        "append": lambda: s.append(np.zeros((1, 5), np.int32) if kind == "dense" else [np.zeros(2, np.int32)]),
        "delete": lambda: s.delete(0),
        "compact": lambda: s.compact(),
        "stats": lambda: s.stats(),
        "sync": lambda: s.sync(),
        "verify": lambda: s.verify(),
        "enter": lambda: s.__enter__(),
    }
    if kind == "ragged":
        calls["gather_packed"] = lambda: s.gather([0], packed=True)
    for name, call in calls.items():
        with pytest.raises(ClosedError) as e:
            call()
        assert isinstance(e.value, ValueError), name
    s.close()
    # The data survived the context manager's close.
    with type(s)(path) as again:
        assert len(again) == 20


def test_sync_makes_data_visible_to_a_new_handle(tmp_path):
    with _dense(tmp_path / "d") as ds:
        ds.sync()
        with DenseStore(tmp_path / "d") as other:
            assert_same(other[:], np.arange(100, dtype=np.int32).reshape(20, 5))


# ----------------------------------------------------------------- 6. train_dict

def _dict_source(count=200, width=256, seed=51):
    rng = np.random.default_rng(seed)
    vocab = np.frombuffer(b"loaderx records stores zstd dictionary training samples ", np.uint8)
    return vocab[rng.integers(0, len(vocab), (count, width))] ^ (rng.random((count, width)) < 0.02).astype(np.uint8)


def _usable(dictionary: bytes, tmp_path, data, name) -> None:
    assert dictionary.startswith(ZSTD_DICT_MAGIC)
    with DenseStore(tmp_path / name, data.dtype, data.shape[1:], codec="zstd_dict", dict_bytes=dictionary) as ds:
        ds.append(data)
        assert ds.dictionary() == dictionary
        assert_same(ds[:], data)
        ds.verify()


def test_train_dict_from_array_iterable_and_store(tmp_path):
    data = _dict_source()
    from_array = train_dict(data, tier="fast")
    _usable(from_array, tmp_path, data, "a")
    from_bytes = train_dict((row.tobytes() for row in data), tier="fast")
    _usable(from_bytes, tmp_path, data, "b")
    with DenseStore(tmp_path / "src-dense", np.uint8, (256,)) as ds:
        ds.append(data)
        from_dense = train_dict(ds, tier="fast")
    _usable(from_dense, tmp_path, data, "c")
    with RaggedStore(tmp_path / "src-ragged", np.uint8) as rs:
        rs.append(row[: 100 + i % 100] for i, row in enumerate(data))
        from_ragged = train_dict(rs, tier="fast")
    _usable(from_ragged, tmp_path, data, "d")


def test_train_dict_tiers_and_size(tmp_path):
    data = _dict_source(count=400, width=512)
    caps = {"fast": 32 << 10, "balanced": 128 << 10, "max": 1 << 20}
    for tier, cap in caps.items():
        d = train_dict(data, tier=tier)
        assert 0 < len(d) <= cap
        assert d.startswith(ZSTD_DICT_MAGIC)
    assert train_dict(data) == train_dict(data, tier="balanced")  # the default tier, deterministic
    small = train_dict(data, tier="max", size=2048)
    assert 0 < len(small) <= 2048
    _usable(small, tmp_path, data, "small")
    with pytest.raises(ValueError):
        train_dict(data, size=100)


def test_train_dict_bad_tier_and_too_few_samples(tmp_path):
    data = _dict_source()
    with pytest.raises(ValueError, match="huge"):
        train_dict(data, tier="huge")
    with pytest.raises(DictionaryError):
        train_dict([b"abc", b"def", b"ghi"], tier="fast")
    with pytest.raises(DictionaryError):
        train_dict(data[:3], tier="fast")
    with pytest.raises(DictionaryError):
        train_dict(np.zeros((0, 16), np.uint8))
    with pytest.raises(DictionaryError):
        train_dict([b""] * 50)
    with RaggedStore(tmp_path / "empty", np.uint8) as rs:
        with pytest.raises(DictionaryError):
            train_dict(rs)
    with pytest.raises(TypeError):
        train_dict([object()] * 20)


def test_train_dict_on_a_few_bytes_is_a_clear_error_not_a_crash():
    # Eight one-byte samples once crashed zstd's trainer inside the library.
    with pytest.raises(DictionaryError, match="too small"):
        train_dict([bytes([i]) for i in range(8)], tier="fast")


@pytest.fixture(scope="module")
def dictionary():
    return train_dict(_TEXTS, "fast")


@pytest.mark.parametrize("bad, kind", [
    ("abc", ArgumentTypeError), (5, ArgumentTypeError), ([1, 2], ArgumentTypeError),
])
def test_dict_bytes_must_be_bytes_like(tmp_path, bad, kind):
    """Before the fix, ``dict_bytes="abc"`` raised "string argument without an
    encoding" and ``dict_bytes=5`` was read as five zero bytes ("not a zstd
    dictionary")."""
    with pytest.raises(kind, match="dict_bytes"):
        Zrecord(tmp_path / "z", create=True, codec="zstd_dict", dict_bytes=bad)


def test_dict_bytes_as_a_numpy_array(tmp_path, dictionary):
    """Before the fix, a numpy array of the dictionary's bytes raised numpy's
    "truth value of an array ... is ambiguous"."""
    arr = np.frombuffer(dictionary, np.uint8)
    with Zrecord(tmp_path / "z", create=True, codec="zstd_dict", dict_bytes=arr) as z:
        z.append(_TEXTS[:5])
        assert z.dictionary() == dictionary
    with Zrecord(tmp_path / "z", dict_bytes=arr) as z:  # reopen: the same dictionary
        assert z[4] == _TEXTS[4]


def test_train_dict_refuses_an_absurd_size():
    """Before the fix, ``size=2**40`` raised a bare MemoryError with no
    message (and a size just under physical memory was zero-filled first)."""
    with pytest.raises(ValueError, match="size"):
        train_dict(_TEXTS, size=2**40)


def test_numpy_ints_are_ints_for_level_and_dictionary_size(tmp_path):
    """level= and train_dict(size=) take numpy integers, as threads= and seq_len do."""
    rng = np.random.default_rng(0)
    with DenseStore(tmp_path / "d", np.uint8, (64,), level=np.int64(5)) as ds:
        assert ds.level == 5 and type(ds.level) is int
        ds.append(rng.integers(0, 4, (300, 64), dtype=np.uint8))
        d = train_dict(ds, size=np.int32(1024))
        assert 0 < len(d) <= 1024
