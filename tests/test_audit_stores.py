"""Regression tests from an adversarial audit of the store API (careless and
hostile inputs). Each failed before its fix; the docstrings say how: a wrong
result returned silently, data not written where the caller asked, or a raw
numpy/cffi exception that did not name the argument at fault.
"""
from __future__ import annotations

import numpy as np
import pytest

from loaderx import DenseStore, RaggedStore, TokenWindows, Zrecord, train_dict
from loaderx.errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    LockedError,
    RecordIndexError,
    SizeMismatchError,
)

_TEXTS = [f'{{"id": {i}, "text": "record number {i}"}}'.encode() for i in range(400)]


@pytest.fixture(scope="module")
def dictionary():
    return train_dict(_TEXTS, "fast")


# ----------------------------------------------------------------- indices

@pytest.mark.parametrize("dtype", [">i8", ">u8"])
def test_byte_swapped_index_arrays_read_the_records_they_name(tmp_path, dtype):
    """Before the fix, a big-endian int64/uint64 index array took the unchecked
    fast path with its bytes read as native: index 2**56 (out of range)
    silently returned record 1, and in-range indices only worked by a detour."""
    with DenseStore(tmp_path / "d", np.int64, ()) as ds:
        ds.append(np.arange(10, dtype=np.int64))
        assert ds[np.array([3, 9], dtype)].tolist() == [3, 9]
        assert ds.gather(np.array([2], dtype)).tolist() == [2]
        with pytest.raises(RecordIndexError, match=str(2**56)):
            ds[np.array([2**56], dtype)]
        with pytest.raises(RecordIndexError, match=str(2**56)):
            ds.gather(np.array([2**56], dtype), out=np.empty(1, np.int64))


def test_malformed_index_keys_name_the_indices(tmp_path):
    """Before the fix, ``ds[1, [2]]`` raised numpy's "inhomogeneous shape"
    ValueError and ``ds[[2**64]]`` said the indices were "not object"."""
    with DenseStore(tmp_path / "d", np.int64, ()) as ds:
        ds.append(np.arange(10, dtype=np.int64))
        with pytest.raises(TypeError, match="record indices"):
            ds[1, [2]]
        with pytest.raises(RecordIndexError, match=str(2**64)):
            ds[[2**64]]
        with pytest.raises(RecordIndexError, match=str(-2**63 - 1)):
            ds[[5, -2**63 - 1]]


@pytest.mark.parametrize("bad", [-1, 1.5, None, True, 2**40])
def test_threads_argument_is_checked_by_every_gather(tmp_path, bad):
    """Before the fix, ``threads=-1`` raised cffi's "can't convert negative
    number to unsigned", ``threads=1.5`` "an integer is required" (neither
    naming `threads`), and ``threads=True`` ran with one thread."""
    with RaggedStore(tmp_path / "r", np.int32) as rs, \
            DenseStore(tmp_path / "d", np.int32, ()) as ds, \
            Zrecord(tmp_path / "z", create=True) as z:
        rs.append([np.arange(9, dtype=np.int32)])
        ds.append(np.arange(3, dtype=np.int32))
        z.append([b"x"])
        tw = TokenWindows(rs, 4)
        calls = [lambda: ds.gather([0], threads=bad), lambda: rs.gather([0], threads=bad),
                 lambda: rs.gather_packed([0], threads=bad), lambda: z.gather([0], threads=bad),
                 lambda: tw.gather([0], threads=bad), lambda: tw.segments.gather([0], threads=bad)]
        for call in calls:
            with pytest.raises((TypeError, ValueError), match="threads"):
                call()
        assert ds.gather([2], threads=np.int64(1)).tolist() == [2]


# ----------------------------------------------------------------- appends

def test_ragged_append_refuses_floats_for_an_integer_store(tmp_path):
    """Before the fix, ``rs.append([[1.5, 2.7]])`` on an int32 store stored
    ``[1, 2]``: the fractions were truncated silently."""
    with RaggedStore(tmp_path / "r", np.int32) as rs:
        for record in ([1.5, 2.7], np.float64(3.9), [np.float32(1.0)], [1 + 2j]):
            with pytest.raises(TypeError, match="record 0 .*float|record 0 .*complex"):
                rs.append([record])
        assert len(rs) == 0
        rs.append([[1, 2], 3, [True]])  # Python ints and bools still convert
        assert [r.tolist() for r in rs[:]] == [[1, 2], 3, [1]]
        with pytest.raises(OverflowError, match="record 1"):
            rs.append([[1], [2**40]])
        assert len(rs) == 3
    with RaggedStore(tmp_path / "c", np.float32) as rf:
        with pytest.raises(TypeError, match="record 0 .*complex"):
            rf.append([[1 + 2j]])


def test_zrecord_append_takes_any_bytes_like_record(tmp_path):
    """Before the fix, a non-contiguous memoryview record raised "memoryview:
    casts are restricted to C-contiguous views", an object array "Cannot change
    data-type for array of references", and ``z.append(b"abc")`` said
    "record 0 is a int"; none named the record or the mistake."""
    with Zrecord(tmp_path / "z", create=True) as z:
        strided = memoryview(np.arange(16, dtype=np.int16).reshape(4, 4))[::2]
        z.append([strided])
        assert z[0] == np.arange(16, dtype=np.int16).reshape(4, 4)[::2].tobytes()
        z.append_packed(memoryview(b"abcdef")[::2], [0, 1, 3])
        assert z[1:] == [b"a", b"ce"]
        with pytest.raises(TypeError, match="record 1 .*object"):
            z.append([b"ok", np.array([b"a", None], dtype=object)])
        with pytest.raises(TypeError, match="data .*object"):
            z.append_packed(np.array([b"a"], dtype=object), [0, 1])
        with pytest.raises(TypeError, match="iterable of records"):
            z.append(b"abc")
        assert len(z) == 3


# ----------------------------------------------------------------- gather_into

@pytest.mark.parametrize("make", [
    lambda: np.zeros((3, 2), np.uint8, order="F"),
    lambda: np.zeros((3, 4), np.uint8)[:, :2],
    lambda: np.zeros(8, np.int32)[::2],
    lambda: memoryview(bytearray(12))[::2],
])
def test_gather_into_refuses_a_buffer_it_cannot_fill_in_place(tmp_path, make):
    """Before the fix, a Fortran-order or sliced 2-D `out` was filled through a
    temporary copy: gather_into returned the sizes but the caller's buffer
    stayed zero. Strided int32 arrays and memoryviews raised raw numpy errors."""
    with Zrecord(tmp_path / "z", create=True) as z:
        z.append([b"abcdef"])
        out = make()
        with pytest.raises(SizeMismatchError, match="out must be C-contiguous"):
            z.gather_into([0], out)
        assert not bytes(np.asarray(out).tobytes()).strip(b"\0")
        with pytest.raises(TypeError, match="out .*list"):
            z.gather_into([0], [0] * 8)


def test_gather_into_offsets_past_the_buffer_do_not_wrap(tmp_path):
    """Before the fix, an offset near 2**64 wrapped the end past zero, passed
    the fit check, and numpy raised "could not broadcast ... into shape (0,)"."""
    with Zrecord(tmp_path / "z", create=True) as z:
        z.append([b"abcdef", b"x"])
        for offset in (2**64 - 2, 2**64 - 1, 11):
            with pytest.raises(SizeMismatchError, match="does not fit the 10-byte buffer"):
                z.gather_into([1, 0], bytearray(10), np.array([0, offset], np.uint64))
        with pytest.raises(SizeMismatchError, match="does not fit"):
            z.gather_into([0], bytearray(10), [2**63])


# ----------------------------------------------------------------- store options

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


def test_codec_and_level_of_the_wrong_kind_are_named(tmp_path):
    """Before the fix, ``codec=["zstd"]`` raised "unhashable type: 'list'" and
    ``level=2**40`` cffi's "integer 1099511627776 does not fit 'int'"."""
    with pytest.raises(InvalidArgumentError, match="codec"):
        DenseStore(tmp_path / "a", np.int8, (), codec=["zstd"])
    with pytest.raises(InvalidArgumentError, match="level 1099511627776"):
        DenseStore(tmp_path / "b", np.int8, (), level=2**40)
    with pytest.raises(ValueError, match="tier"):
        train_dict(_TEXTS, [])


def test_train_dict_refuses_an_absurd_size():
    """Before the fix, ``size=2**40`` raised a bare MemoryError with no
    message (and a size just under physical memory was zero-filled first)."""
    with pytest.raises(ValueError, match="size"):
        train_dict(_TEXTS, size=2**40)


def test_token_windows_seq_len_past_uint64(tmp_path):
    """Before the fix, ``seq_len=2**70`` raised cffi's "int too big to convert"."""
    with RaggedStore(tmp_path / "r", np.int32) as rs:
        rs.append([np.arange(9, dtype=np.int32)])
        with pytest.raises(ValueError, match="seq_len"):
            TokenWindows(rs, 2**70)


def test_append_from_inside_the_records_of_an_append_raises(tmp_path):
    """Before the fix, a records iterator that appended to the same store
    (a callback writing a side record, say) hung forever on the append lock
    its own caller held."""
    with Zrecord(tmp_path / "z", create=True) as z:
        def records():
            yield b"a"
            z.append([b"inner"])
            yield b"b"
        with pytest.raises(LockedError, match="append called while producing the records"):
            z.append(records())
        assert z.append([b"c"]) == 0  # the store is usable afterwards, nothing half-written
        assert z[:] == [b"c"]


def test_numpy_ints_are_ints_for_level_and_dictionary_size(tmp_path):
    """level= and train_dict(size=) take numpy integers, as threads= and seq_len do."""
    rng = np.random.default_rng(0)
    with DenseStore(tmp_path / "d", np.uint8, (64,), level=np.int64(5)) as ds:
        assert ds.level == 5 and type(ds.level) is int
        ds.append(rng.integers(0, 4, (300, 64), dtype=np.uint8))
        d = train_dict(ds, size=np.int32(1024))
        assert 0 < len(d) <= 1024


def test_ragged_append_refuses_one_flat_array(tmp_path):
    """``rs.append(tokens)`` with one 1-D array stored one 0-d record per token,
    silently: a document appended without its brackets. It is refused, naming
    the fix; nothing is stored. (0-d records in a list stay allowed.)"""
    with RaggedStore(tmp_path / "r", np.int32) as rs:
        for records in (np.arange(5, dtype=np.int32), np.arange(5.0)):
            with pytest.raises(TypeError, match=r"5 scalar records; pass \[array\]"):
                rs.append(records)
        assert len(rs) == 0
        rs.append([np.arange(5, dtype=np.int32), np.int32(7)])
        assert rs[0].tolist() == [0, 1, 2, 3, 4] and rs[1].shape == ()


def test_level_zero_is_refused_before_anything_is_created(tmp_path):
    """level=0 passed the argument check, the store was created at zstd's
    default (3), then the reopen check refused 0 != 3 and left the new store
    behind."""
    with pytest.raises(InvalidArgumentError, match="level 0 is not a zstd level"):
        DenseStore(tmp_path / "d", np.uint8, (4,), level=0)
    assert not (tmp_path / "d").exists()


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
