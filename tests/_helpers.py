"""Helpers shared by the Python test modules."""
from __future__ import annotations

import numpy as np


def assert_same(got, expected) -> None:
    """Byte-exact equality with the same dtype and shape (works for structured
    dtypes, bools and -0.0 alike)."""
    got = np.asarray(got)
    expected = np.asarray(expected)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    if got.tobytes() != expected.tobytes():
        np.testing.assert_array_equal(got, expected)
        raise AssertionError(f"bytes differ:\n{got!r}\n!=\n{expected!r}")
