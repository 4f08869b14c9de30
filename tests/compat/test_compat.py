"""The original loaderx's API keeps working, silently: the Quick Start of each of
its READMEs (0.7.3, 0.9.1, 0.9.4, 1.7.7, read from the real distributions'
metadata; skipped without a package index) runs unchanged; 1.7.7's names
(``loaderx.utils.train_dict``, ``loaderx.zrecord.DICT_TIERS``, ``has_dict``,
``__getitems__``), its DataLoader keywords and positional order, and streams
written for it (``__len__`` + ``__getitems__``) work; ``sampler="1.7.7"`` is
checked. (Stores written by 1.7.7 and its exact sequences:
tests/compat/test_original177.py.)"""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from _lx177 import readme
from _user_code import run_python

import loaderx
from loaderx import DataLoader, DenseStore, RaggedStore, Zrecord

QUICK_START = re.compile(r"^## Quick Start\n```python\n(.*?)^```", re.S | re.M)


@pytest.mark.parametrize("version", ["0.7.3", "0.9.1", "0.9.4", "1.7.7"])
def test_the_quick_start_of_every_original_readme_runs_unchanged(tmp_path, version):
    match = QUICK_START.search(readme(version))
    assert match, f"loaderx {version}'s README has no Quick Start block"
    np.save(tmp_path / "data.npy", np.arange(1000 * 8, dtype=np.float32).reshape(1000, 8))
    np.save(tmp_path / "label.npy", np.arange(1000, dtype=np.int64) % 10)
    # The blocks use numpy as np without importing it (the READMEs import it earlier).
    code = "import numpy as np\n" + match.group(1)
    run_python(f"loaderx {version} README", code, ["-W", "error::DeprecationWarning", "-c", code],
               tmp_path)


def _streams(tmp_path, n=64):
    with DenseStore(tmp_path / "x", np.int64, ()) as s:
        s.append(np.arange(n, dtype=np.int64))
    return {"x": DenseStore(tmp_path / "x")}


def test_dataloader_takes_the_original_keywords_and_positional_order(tmp_path):
    streams = _streams(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # silently: the original's spellings never warn
        with DataLoader(streams, num_workers=3, batch_size=8, prefetch_size=2, mode=2, seed=42,
                        transform=lambda b: b) as loader:
            assert (loader.workers, loader.prefetch, loader.batch_size) == (3, 2, 8)
            assert "seed=42" in repr(loader) and "CYCLIC" in repr(loader)
        with DataLoader(streams, 2, 4) as loader:  # 1.7: (streams, num_workers, batch_size)
            assert (loader.workers, loader.batch_size) == (2, 4)
        with DataLoader(streams, 1, 4, 3, 0, 7, lambda b: b["x"]) as loader:
            assert (loader.workers, loader.prefetch) == (1, 3)
            assert next(loader).tolist() == [0, 1, 2, 3]  # mode 0: SEQUENTIAL
        with DataLoader(streams, 16) as loader:  # one positional: loaderx 3's batch_size
            assert loader.batch_size == 16
        with DataLoader(streams, batch_size=8, num_workers=0) as loader:
            assert loader.workers == 1  # the original clamped 0 to one thread


def test_the_original_keywords_cannot_contradict_the_new_ones(tmp_path):
    streams = _streams(tmp_path)
    with pytest.raises(TypeError, match="num_workers= .* and workers="):
        DataLoader(streams, num_workers=2, workers=2)
    with pytest.raises(TypeError, match="prefetch_size= .* and prefetch="):
        DataLoader(streams, prefetch_size=2, prefetch=3)
    with pytest.raises(TypeError, match="got mode twice"):
        DataLoader(streams, 1, 4, 2, 0, mode="iid")
    with pytest.raises(TypeError, match="at most 7 positional"):
        DataLoader(streams, 1, 4, 2, 0, 1, None, 9)


def test_a_stream_written_for_1_7_works_unchanged(tmp_path):
    class Squares:  # the original's stream protocol: __len__ and __getitems__
        def __len__(self):
            return 40

        def __getitems__(self, idxs):
            assert idxs.dtype == np.uint64
            return (np.asarray(idxs, np.int64) ** 2)[:, None].repeat(2, 1)

    class Words:
        def __len__(self):
            return 40

        def __getitems__(self, idxs):
            return [np.arange(int(i) % 5 + 1, dtype=np.int32) for i in idxs]

    streams = dict(_streams(tmp_path, 40), sq=Squares(), w=Words())
    with DataLoader(streams, batch_size=8, mode="sequential", stop_after=6) as loader:
        for batch in loader:
            x = batch["x"]
            assert (batch["sq"] == (x ** 2)[:, None].repeat(2, 1)).all()
            assert [len(r) for r in batch["w"]] == (x % 5 + 1).tolist()

    class Wrong(Squares):
        def __getitems__(self, idxs):
            return np.zeros((len(idxs), 3), np.float32) if idxs[0] else super().__getitems__(idxs)

    with DataLoader({"s": Wrong()}, batch_size=4, mode="sequential", seed=1) as loader:
        next(loader)
        with pytest.raises(TypeError, match=r"returned float32\[4, 3\], expected int64\[4, 2\]"):
            next(loader)


def test_train_dict_dict_tiers_has_dict_and_getitems(tmp_path):
    from loaderx.utils import train_dict
    from loaderx.zrecord import DICT_TIER_DEFAULT, DICT_TIERS

    assert DICT_TIERS == {"fast": {"size": 32 << 10, "samples": 4 << 20},
                          "balanced": {"size": 128 << 10, "samples": 16 << 20},
                          "max": {"size": 1 << 20, "samples": 64 << 20}}
    assert DICT_TIER_DEFAULT == "balanced" and train_dict is loaderx.train_dict
    text = np.frombuffer(b"".join(b'{"id": %d, "tag": "t%d"}   ' % (i, i % 7)
                                  for i in range(3000)), np.uint8)[:3000 * 24].reshape(-1, 24)
    d = train_dict(text, tier=None, path=tmp_path / "dict.bin")
    assert (tmp_path / "dict.bin").read_bytes() == d
    with DenseStore(tmp_path / "d", np.uint8, (24,), "zstd_dict", d) as s:  # 1.7's order
        s.append(text)
        assert s.has_dict() and s.__getitems__([2, 0]).tolist() == text[[2, 0]].tolist()
    with RaggedStore(tmp_path / "r", np.int32, "raw") as r:
        r.append([np.arange(3, dtype=np.int32)])
        assert not r.has_dict() and r.__getitems__([0])[0].tolist() == [0, 1, 2]
    with Zrecord(tmp_path / "z", create=True) as z:
        z.append([b"ab"])
        assert not z.has_dict() and z.__getitems__([0]) == [b"ab"]


def test_the_older_spellings_read_as_they_did(tmp_path):
    from loaderx.converter import from_numpy
    from loaderx.dataset import Dataset, DenseDataset, RaggedDataset, pad

    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    from_numpy(tmp_path / "x", x).close()
    loaderx.write_dataset(tmp_path / "w.zr", x)
    with Dataset(tmp_path / "x") as ds:  # 0.9.1: packed, one row per dense record
        values, splits = ds[[4, 1]]
        assert values.tolist() == x[[4, 1]].tolist() and splits.tolist() == [0, 1, 2]
    assert isinstance(DenseDataset(tmp_path / "x"), DenseStore) and RaggedDataset is RaggedStore
    assert loaderx.Dataset(tmp_path / "w.zr")[[4, 1]].tolist() == x[[4, 1]].tolist()  # 0.7
    padded, lengths = pad(np.arange(5), [0, 2, 5], pad_value=-1)  # 0.9: pad(values, row_splits)
    assert padded.tolist() == [[0, 1, -1], [2, 3, 4]] and lengths.tolist() == [2, 3]


def test_sampler_1_7_7_is_checked(tmp_path):
    streams = _streams(tmp_path, 10)
    with DataLoader(streams, 4, sampler="1.7.7") as loader:
        assert "seed=42" in repr(loader)  # 1.7.7's default seed with its sampler
        assert loader.steps_per_epoch == 2 and loader.epoch_of(5) == 2
    with pytest.raises(ValueError, match="sampler must be None"):
        DataLoader(streams, 4, sampler="1.7")
    with pytest.raises(ValueError, match="shard="):
        DataLoader(streams, 4, sampler="1.7.7", shard=(0, 2))
    with pytest.raises(ValueError, match="served them as one short batch"):
        DataLoader(streams, 16, sampler="1.7.7")
    with DataLoader(streams, 16, mode="iid", sampler="1.7.7", stop_after=2) as loader:
        assert [len(b["x"]) for b in loader] == [16, 16]


def test_dense_append_takes_what_1_7_7_took(tmp_path):
    with DenseStore(tmp_path / "s", np.int64, ()) as s:
        assert s.append([1, 2, 3]) == 0 and s.append(np.int64(5)) == 3  # a list; one scalar
        assert s[np.arange(4)].tolist() == [1, 2, 3, 5]
    with DenseStore(tmp_path / "f", np.float32, (2,)) as f:
        with pytest.raises(loaderx.IdentityError, match="float64"):
            f.append([[1.0, 2.0]])  # np.asarray gives float64: the dtype must match, as in 1.7.7
        with pytest.raises(TypeError, match="not dict"):
            f.append({})
