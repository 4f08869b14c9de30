"""Every public callable that takes a path refuses one with a NUL byte by
name (loaderx's `InvalidArgumentError`, or a TypeError where it takes an
open store, never the OS's "embedded null byte"), and a bytes path is the
file system's (os.fsdecode), as Python's own `os` functions take it."""
from __future__ import annotations

import numpy as np
import pytest
from _helpers import path_callables

import loaderx
from loaderx.errors import InvalidArgumentError


def _calls(p, data):
    """``{(callable, parameter): call with the path `p`, or a reason it is not called}``."""
    lx = loaderx
    return {
        ("loaderx.zrecord.open_store", "path"): lambda: lx.open_store(p),
        ("loaderx.dataset.open_dataset", "path"): lambda: lx.open_dataset(p),
        ("loaderx._manifest.read_manifest", "path"): lambda: lx.dataset.read_manifest(p),
        ("loaderx.dataset.labels", "dataset"): lambda: lx.labels(p, "x"),
        ("loaderx.subset.select", "dataset"): lambda: lx.select(p, "x > 3"),
        ("loaderx.converters.convert", "source"): lambda: lx.convert(p, data / "o", progress=0),
        ("loaderx.converters.convert", "dest"): lambda: lx.convert({"x": np.arange(3)}, p),
        ("loaderx.converters.convert_to_directory", "source"): (
            lambda: lx.converters.convert_to_directory(p, data / "o", progress="off")),
        ("loaderx.converters.convert_to_directory", "dest"): (
            lambda: lx.converters.convert_to_directory({"x": np.arange(3)}, p)),
        ("loaderx.converters.open_source", "source"): lambda: lx.converters.open_source(
            p, __import__("loaderx.converters._source", fromlist=["Options"]).Options()),
        ("loaderx.dataset.from_numpy", "path"): lambda: lx.from_numpy(p, np.arange(4)),
        ("loaderx.dataset.from_iterator", "path"): lambda: lx.from_iterator(p, [np.arange(3)]),
        ("loaderx.dataset.write_dataset", "path"): lambda: lx.dataset.write_dataset(p, np.ones(2)),
        ("loaderx.bytestore.Zrecord", "path"): lambda: lx.Zrecord(p),
        ("loaderx.bytestore.Zrecord.create", "path"): lambda: lx.Zrecord.create(p),
        ("loaderx.dense.DenseStore", "path"): lambda: lx.DenseStore(p),
        ("loaderx.dense.DenseStore.create", "path"): lambda: lx.DenseStore.create(p, np.uint8),
        ("loaderx._store.Store.open", "path"): lambda: lx.RaggedStore.open(p),
        ("loaderx.ragged.RaggedStore", "path"): lambda: lx.RaggedStore(p),
        ("loaderx.ragged.RaggedStore.create", "path"): lambda: lx.RaggedStore.create(p, np.int32),
        ("loaderx.shardset.ShardSet", "shards"): lambda: lx.ShardSet([p, p]),
        ("loaderx.tokens.TokenWindows", "store"): lambda: lx.TokenWindows(p, 8),
        ("loaderx.mixture.Mixture", "sources"): lambda: lx.Mixture({"a": {"x": p}}, {"a": 1}),
        ("loaderx.dataloader.DataLoader", "streams"): lambda: lx.DataLoader({"x": p}, 4),
        ("loaderx.dictionary.train_dict", "source"): "takes records or an open store, no path",
        ("loaderx.dictionary.train_dict", "path"): (
            lambda: lx.train_dict([bytes([i]) * 64 for i in range(16)], path=p)),
        ("loaderx.legacy.Dataset", "path"): lambda: lx.Dataset(p),
        ("loaderx.legacy.PackedDataset", "path"): lambda: lx.dataset.Dataset(p),
        ("loaderx.subset.Selection", "dataset"): "a description for people, never opened",
        ("loaderx.subset.Selection", "source"): "the dataset a selection came from, as select "
                                                "recorded it (select checks it)",
        ("loaderx.ray.write_dataset", "dest"): "starts Ray; it writes through convert's dest",
        ("loaderx.ray.read_dataset", "dest"): "starts Ray; it opens through open_dataset",
    }


def test_every_public_path_refuses_a_nul_byte_by_name(tmp_path):
    """Before, open_dataset, select, convert and train_dict passed a NUL on to
    the OS, whose ValueError "embedded null byte" named nothing."""
    calls = _calls(str(tmp_path / "d\0s"), tmp_path)
    missing = sorted(path_callables() - set(calls))
    assert not missing, f"path-taking callables the walk does not call: {missing}"
    called = 0
    for key, call in calls.items():
        if isinstance(call, str):
            continue
        with pytest.raises((InvalidArgumentError, TypeError)) as caught:
            call()
        text = str(caught.value)
        assert "d\\x00s" in text and "embedded null" not in text, f"{key}: {text}"
        if isinstance(caught.value, TypeError):  # takes an open store: says so
            assert "open it first" in text, f"{key}: {text}"
        called += 1
    assert called >= 25
    assert list(tmp_path.iterdir()) == []  # nothing was written anywhere


def test_a_bytes_path_is_the_file_systems(tmp_path):
    lx = loaderx
    data = tmp_path / "ds"
    lx.convert({"x": np.arange(6)}, bytes(data), progress="off")["x"].close()
    with lx.open_dataset(bytes(data))["x"] as x:
        assert x[:].tolist() == list(range(6))
    assert lx.dataset.read_manifest(bytes(data))["columns"].keys() == {"x"}
    assert len(lx.select(bytes(data), "x > 3")["x"]) == 2
    with lx.from_numpy(bytes(tmp_path / "n"), np.arange(3)) as n:
        assert n.path == str(tmp_path / "n")
    assert lx.train_dict([bytes([i]) * 64 for i in range(16)], path=bytes(tmp_path / "d"))
    assert (tmp_path / "d").stat().st_size > 0
