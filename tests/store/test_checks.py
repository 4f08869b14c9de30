"""Tests of `loaderx._checks`, the argument checks several entry points share:
each bad input is refused by every entry point that takes it with the same
exception class and the same words (a DenseStore, a ShardSet and token
windows for ``out=``; the stores and `convert` for a zstd level; the loader
and a Mixture for a dict of streams; every writer for ``mode=``)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import loaderx
from loaderx import DataLoader, DenseStore, Mixture, RaggedStore, ShardSet, TokenWindows
from loaderx._checks import KINDS, check_level, is_int, is_stream
from loaderx.errors import (ArgumentTypeError, IdentityError, InvalidArgumentError,
                            SizeMismatchError)


@pytest.fixture
def dense(tmp_path):
    with DenseStore(tmp_path / "d", np.int32, (3,)) as s:
        s.append(np.arange(30, dtype=np.int32).reshape(10, 3))
        yield s


def _refusal(call):
    with pytest.raises(Exception) as info:
        call()
    return type(info.value), str(info.value).split(": ")[-1]


def _bad_outs(shape, dtype):
    read_only = np.zeros(shape, dtype)
    read_only.flags.writeable = False
    strided = np.zeros((shape[0], shape[1] * 2), dtype)[:, ::2]
    return {
        "not an array": ([0] * shape[0], TypeError, "out must be a numpy array, not list"),
        "dtype": (np.zeros(shape, np.float64), IdentityError, "out has dtype float64"),
        "shape": (np.zeros((shape[0] + 1, shape[1]), dtype), SizeMismatchError,
                  f"out has shape ({shape[0] + 1}, {shape[1]}), the batch needs {shape}"),
        "strided": (strided, SizeMismatchError, "out must be C-contiguous"),
        "read-only": (read_only, SizeMismatchError, "out is read-only"),
    }


def test_every_dense_gather_refuses_a_bad_out_the_same_way(tmp_path, dense):
    with RaggedStore(tmp_path / "tok", np.int32) as docs:
        docs.append([np.arange(n, dtype=np.int32) for n in (5, 9, 4, 7)])
        windows = TokenWindows(docs, 3)
        shards = ShardSet([dense])
        idx = np.arange(2)
        for name, (out, cls, words) in _bad_outs((2, 3), np.int32).items():
            for reader in (dense, shards):
                with pytest.raises(cls, match=re.escape(words)):
                    reader.gather(idx, out=out)
            out_w, cls_w, words_w = _bad_outs((2, 4), np.int32)[name]
            with pytest.raises(cls_w, match=re.escape(words_w)):
                windows.gather(idx, out=out_w)
        good = np.empty((2, 4), np.int32)
        assert windows.gather(idx, out=good) is good
        assert good.tolist() == [[0, 1, 2, 3], [3, 4, 0, 1]]


def test_a_zero_level_is_refused_alike_by_stores_and_convert(tmp_path):
    store = _refusal(lambda: DenseStore(tmp_path / "s", np.uint8, (4,), level=0))
    convert = _refusal(lambda: loaderx.convert({"x": np.zeros((4, 2))}, tmp_path / "c",
                                               level=0, progress=False))
    assert store == convert
    assert store[0] is InvalidArgumentError and issubclass(store[0], ValueError)
    assert "level must be a non-zero int zstd level or None" in store[1]
    assert not (tmp_path / "s").exists() and not (tmp_path / "c").exists()
    with pytest.raises(ArgumentTypeError, match="level must be an int, not str"):
        check_level("3")
    with pytest.raises(InvalidArgumentError, match="zstd level 4294967296 is out of range"):
        check_level(2**32)
    check_level(None)
    check_level(np.int64(-5))


def test_a_bad_write_mode_is_refused_alike_by_every_writer(tmp_path):
    words = "mode must be one of ('create', 'append', 'overwrite'), got 'replace'"
    calls = [
        lambda: loaderx.from_numpy(tmp_path / "a", np.zeros((2, 2)), mode="replace"),
        lambda: loaderx.from_iterator(tmp_path / "b", [np.zeros(2)], mode="replace"),
        lambda: loaderx.convert({"x": np.zeros((2, 2))}, tmp_path / "c", mode="replace",
                                progress=False),
    ]
    for call in calls:
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value) == words


def test_the_loader_and_a_mixture_check_streams_with_the_same_words(dense):
    with pytest.raises(TypeError) as loader:
        DataLoader({"x": dense, "y": [1, 2]}, batch_size=2)
    with pytest.raises(TypeError) as mixture:
        Mixture({"a": {"x": dense, "y": [1, 2]}}, {"a": 1})
    assert str(mixture.value) == f"source 'a': {loader.value}"
    assert "stream 'y' is not a loaderx store" in str(loader.value)
    with pytest.raises(ValueError, match="streams is empty"):
        DataLoader({}, batch_size=2)
    with pytest.raises(ValueError, match="source 'a' is empty: give at least one"):
        Mixture({"a": {}}, {"a": 1})
    with pytest.raises(ValueError, match="source 'a': streams must all have the same length"):
        Mixture({"a": {"x": dense, "y": np.zeros(3)}}, {"a": 1})


def test_the_shared_predicates():
    assert KINDS == ("dense", "ragged", "bytes")
    assert [is_int(v) for v in (3, np.int8(3), np.uint64(3), True, np.bool_(True), 3.0, "3")] \
        == [True, True, True, False, False, False, False]
    assert is_stream(loaderx.ArrayStream(np.zeros((2, 2))))
    assert not is_stream(np.zeros(2)) and not is_stream([1])
