"""`from_numpy(..., codec="zstd_dict")` trains its own dictionary (a bounded,
seeded sample of the array's rows; `dict_size=` caps it), and zstd_dict stores
default to level 19 while other codecs keep level 3."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from loaderx import DenseStore, RaggedStore, Zrecord, from_numpy, train_dict
from loaderx.errors import IdentityError


def _rows(n: int = 4000, width: int = 96) -> np.ndarray:
    """Small similar records: a shared template with a few varying bytes."""
    rng = np.random.default_rng(0)
    x = np.tile(np.frombuffer(b'{"user": "name", "tags": ["a", "b"], "score": 0000000}' * 2,
                              np.uint8)[:width], (n, 1))
    x[:, 40:47] = rng.integers(48, 58, (n, 7), dtype=np.uint8)
    return x


def test_zstd_dict_trains_its_own_dictionary_deterministically(tmp_path):
    x = _rows()
    a = from_numpy(tmp_path / "a", x, codec="zstd_dict")
    b = from_numpy(tmp_path / "b", x, codec="zstd_dict")
    assert (a.codec, a.level) == ("zstd_dict", 19)
    assert a.dictionary() and a.dictionary() == b.dictionary()
    assert np.array_equal(a[np.arange(len(x))], x)
    with from_numpy(tmp_path / "plain", x) as plain:
        assert plain.stats()["chunk_bytes"] > a.stats()["chunk_bytes"]
    a.close()
    b.close()


def test_dict_size_caps_the_dictionary(tmp_path):
    x = _rows()
    with from_numpy(tmp_path / "s", x, codec="zstd_dict", dict_size=1024) as s:
        assert 0 < len(s.dictionary()) <= 1024
    with pytest.raises(ValueError, match="dict_size= sizes the dictionary a writer trains"):
        from_numpy(tmp_path / "t", x, codec="zstd", dict_size=1024)
    with pytest.raises(ValueError, match="size must be an int from 256"):
        from_numpy(tmp_path / "u", x, codec="zstd_dict", dict_size=10)


def test_a_given_dictionary_is_used_as_is(tmp_path):
    x = _rows()
    d = train_dict(x[:500], "fast")
    with from_numpy(tmp_path / "s", x, codec="zstd_dict", dict_bytes=d, level=7) as s:
        assert s.dictionary() == d and s.level == 7


def test_append_reuses_the_stores_dictionary(tmp_path):
    x = _rows()
    from_numpy(tmp_path / "s", x[:2000], codec="zstd_dict").close()
    with from_numpy(tmp_path / "s", x[2000:], codec="zstd_dict", mode="append") as s:
        assert len(s) == len(x) and np.array_equal(s[np.arange(len(x))], x)
    from_numpy(tmp_path / "z", x[:10]).close()
    with pytest.raises(IdentityError, match="codec='zstd'"):
        from_numpy(tmp_path / "z", x[10:], codec="zstd_dict", mode="append")


def test_untrainable_rows_fall_back_to_zstd_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="no dictionary .* plain zstd"):
        s = from_numpy(tmp_path / "s", np.zeros((3, 16), np.uint8), codec="zstd_dict")
    assert s.codec == "zstd" and len(s) == 3
    s.close()


def test_level_defaults_per_codec_and_reopen_checks_still_hold(tmp_path):
    d = train_dict(_rows(), "fast")
    with DenseStore(tmp_path / "d", np.uint8, (96,), codec="zstd_dict", dict_bytes=d) as s:
        assert s.level == 19
    with RaggedStore(tmp_path / "r", np.int32, codec="zstd_dict", dict_bytes=d) as r:
        assert r.level == 19
    with Zrecord(tmp_path / "z", create=True) as z:
        assert (z.codec, z.level) == ("zstd", 3)
    with DenseStore(tmp_path / "d") as s:  # reopened: no level asked, none checked
        assert s.level == 19
    with DenseStore(tmp_path / "d", level=19) as s:
        assert s.level == 19
    with pytest.raises(IdentityError, match=r"level=19 \(asked for 3\)"):
        DenseStore(tmp_path / "d", level=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with DenseStore(tmp_path / "x", np.uint8, (4,), codec="zstd_dict", dict_bytes=d,
                        level=5) as s:
            assert s.level == 5
