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
