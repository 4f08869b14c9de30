"""Tests of `loaderx.errors`: one base, `LoaderxError`, that `ZrecordError`
(the original's name) is the same class as; every exception importable from
the package top level and from its old home; each derives from the standard
exception that means the same."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import loaderx
import loaderx.converters
import loaderx.dataset
import loaderx.errors
import loaderx.zrecord


def test_zrecord_error_is_the_loaderx_error():
    assert loaderx.ZrecordError is loaderx.LoaderxError
    assert loaderx.zrecord.ZrecordError is loaderx.zrecord.LoaderxError is loaderx.LoaderxError
    with pytest.raises(loaderx.ZrecordError):
        raise loaderx.CorruptStoreError("x: damaged", path="x")


def test_every_exported_exception_derives_from_the_base():
    exported = [getattr(loaderx, n) for n in loaderx.__all__ if n.endswith("Error")]
    assert len(exported) == 30  # ImageError came with loaderx.image
    for cls in exported:
        assert issubclass(cls, loaderx.LoaderxError), cls
        assert getattr(loaderx.errors, cls.__name__) is cls


@pytest.mark.parametrize("name, standard", [
    ("DestinationExistsError", FileExistsError),
    ("ConvertError", ValueError),
    ("MissingDependencyError", ImportError),
    ("MissingRemoteDependencyError", ImportError),
    ("SizeMismatchError", ValueError),
    ("ArgumentTypeError", TypeError),
    ("NoSpaceError", OSError),
    ("ZrecordMemoryError", MemoryError),
])
def test_the_once_unexported_exceptions_keep_their_standard_bases(name, standard):
    cls = getattr(loaderx, name)
    assert issubclass(cls, standard)
    error = pickle.loads(pickle.dumps(cls("what went wrong")))
    assert type(error) is cls and str(error) == "what went wrong"


def test_old_homes_still_name_the_same_classes():
    assert loaderx.dataset.DestinationExistsError is loaderx.DestinationExistsError
    assert loaderx.converters.ConvertError is loaderx.ConvertError
    assert loaderx.converters.MissingDependencyError is loaderx.MissingDependencyError
    assert issubclass(loaderx.MissingRemoteDependencyError, loaderx.MissingDependencyError)


def test_an_existing_destination_is_caught_by_name_from_the_package(tmp_path):
    loaderx.from_numpy(tmp_path / "s", np.ones((2, 2))).close()
    with pytest.raises(loaderx.DestinationExistsError, match='mode="append"'):
        loaderx.from_numpy(tmp_path / "s", np.ones((2, 2)))
