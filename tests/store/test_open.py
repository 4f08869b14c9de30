"""One way to create and open, for every store kind: ``Kind.create(path, ...,
mode=)`` makes a store under the writers' mode words, ``Kind.open(path)``
opens one and never creates; the constructors are sugar for exactly one of
the two."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import loaderx
from loaderx import DenseStore, RaggedStore, Zrecord
from loaderx.errors import DestinationExistsError, IdentityError, StoreNotFoundError

KINDS = {
    "dense": (lambda p, **kw: DenseStore.create(p, np.int16, (2,), **kw), DenseStore,
              np.array([[1, 2], [3, 4]], np.int16)),
    "ragged": (lambda p, **kw: RaggedStore.create(p, np.int16, **kw), RaggedStore,
               [np.array([1, 2, 3], np.int16), np.array([4], np.int16)]),
    "bytes": (lambda p, **kw: Zrecord.create(p, **kw), Zrecord, [b"ab", b"cde"]),
}


@pytest.mark.parametrize("kind", KINDS)
def test_create_then_open(tmp_path, kind):
    create, cls, records = KINDS[kind]
    path = tmp_path / kind
    with create(path) as s:
        assert type(s) is cls and s.kind == kind and len(s) == 0
        s.append(records)
    with cls.open(path) as s:
        assert len(s) == 2 and s.path == os.fspath(path)
    with loaderx.open_store(path) as s:
        assert type(s) is cls


@pytest.mark.parametrize("kind", KINDS)
def test_create_follows_the_mode_words(tmp_path, kind):
    create, cls, records = KINDS[kind]
    path = tmp_path / kind
    with create(path) as s:
        s.append(records)
    with pytest.raises(DestinationExistsError, match='mode="append" or mode="overwrite"'):
        create(path)
    with create(path, mode="append") as s:  # opens it, records kept
        assert len(s) == 2
        s.append(records)
    with cls.open(path) as s:
        assert len(s) == 4
    with create(path, mode="overwrite") as s:  # a new, empty store
        assert len(s) == 0
    with pytest.raises(ValueError, match="mode must be one of"):
        create(path, mode="replace")
    # An empty directory is no data: "create" fills it.
    os.mkdir(tmp_path / "empty")
    with create(tmp_path / "empty") as s:
        assert len(s) == 0


def test_overwrite_never_removes_what_is_not_a_store(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(DestinationExistsError, match="not a loaderx store"):
        Zrecord.create(tmp_path / "mine", mode="overwrite")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("kind", KINDS)
def test_open_never_creates(tmp_path, kind):
    _, cls, _ = KINDS[kind]
    with pytest.raises(StoreNotFoundError):
        cls.open(tmp_path / "missing")
    with pytest.raises(FileNotFoundError):
        cls(tmp_path / "missing")  # the constructor with a path only is open
    assert not (tmp_path / "missing").exists()


def test_open_checks_the_kind(tmp_path):
    with DenseStore.create(tmp_path / "d", np.float32, (3,)):
        pass
    with pytest.raises(IdentityError, match="dense"):
        RaggedStore.open(tmp_path / "d")
    with pytest.raises(IdentityError, match="dense"):
        Zrecord.open(tmp_path / "d")


def test_append_mode_checks_the_identity(tmp_path):
    with DenseStore.create(tmp_path / "d", np.float32, (3,)):
        pass
    with pytest.raises(IdentityError, match="item_shape"):
        DenseStore.create(tmp_path / "d", np.float32, (4,), mode="append")
    with RaggedStore.create(tmp_path / "r", np.int32):
        pass
    with pytest.raises(IdentityError, match="dtype"):
        RaggedStore.create(tmp_path / "r", np.int64, mode="append")


def test_the_constructors_are_silent_sugar(tmp_path):
    """The original package's spellings and this one's constructors keep
    working without a warning: each is one of create (mode="append") or open."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with DenseStore(tmp_path / "d", np.int8, (2,)) as d:  # create, mode="append"
            d.append(np.ones((3, 2), np.int8))
        with DenseStore(tmp_path / "d", np.int8, (2,)) as d:  # an existing one: opened
            assert len(d) == 3
        with DenseStore(tmp_path / "d") as d:  # open
            assert d.item_shape == (2,)
        with Zrecord(tmp_path / "z", create=True) as z:
            z.append([b"x"])
        with Zrecord(tmp_path / "z", create=True) as z:
            assert z[0] == b"x"
        with RaggedStore(tmp_path / "r", np.uint8) as r:
            assert r.dtype == np.uint8


def test_create_takes_the_codec_vocabulary(tmp_path):
    with DenseStore.create(tmp_path / "raw", np.uint8, (64,), codec="raw") as s:
        assert s.codec == "raw"
    texts = [f'{{"id": {i}, "name": "user {i}"}}'.encode() for i in range(500)]
    with Zrecord.create(tmp_path / "z", codec="zstd_dict",
                        dict_bytes=loaderx.train_dict(texts, "fast")) as z:
        z.append(texts)
        assert (z.codec, z.level) == ("zstd_dict", 19) and z[7] == texts[7]


def test_create_needs_the_identity(tmp_path):
    with pytest.raises(TypeError, match="dtype"):
        RaggedStore.create(tmp_path / "r", None)
    with pytest.raises(TypeError, match="dtype"):
        DenseStore.create(tmp_path / "d", None, (3,))
    assert not (tmp_path / "r").exists() and not (tmp_path / "d").exists()
