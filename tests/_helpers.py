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


def swap_last_order(n: int, positions) -> list[int]:
    """The original loaderx delete rule, one record at a time, written
    independently of the engine: in descending order, each deleted position
    receives the current last record, then the last position goes. Returns
    the new order as old positions."""
    order = list(range(n))
    for d in sorted(set(int(p) for p in positions), reverse=True):
        order[d] = order[-1]
        order.pop()
    return order


def expected_moves(order: list[int]) -> list[list[int]]:
    """The (from, to) pairs `delete` reports for a new `order`: every record
    now at a position other than its old one, ascending by `to`."""
    return [[old, new] for new, old in enumerate(order) if old != new]
