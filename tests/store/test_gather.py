"""The one read verb: ``gather(indices, out=None, *, packed=False,
threads=0)`` on every store kind, a ShardSet, a selected View and a dataset
column, with ``[]`` as its sugar; the deprecated aliases ``gather_packed`` and
``Zrecord.gather_into`` and ``DataLoader(ragged=...)``."""
from __future__ import annotations

import numpy as np
import pytest

import loaderx
from loaderx import DataLoader, DenseStore, RaggedStore, ShardSet, Zrecord
from loaderx.errors import IdentityError, SizeMismatchError

DOCS = [np.arange(n, dtype=np.int32) * (k + 1) for k, n in enumerate((3, 0, 5, 1, 4))]
BLOBS = [bytes([65 + k]) * n for k, n in enumerate((2, 0, 3, 5, 1))]
ROWS = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3)


@pytest.fixture
def stores(tmp_path):
    with DenseStore.create(tmp_path / "d", np.float32, (2, 3)) as d, \
            RaggedStore.create(tmp_path / "r", np.int32) as r, \
            Zrecord.create(tmp_path / "z") as z:
        d.append(ROWS)
        r.append(DOCS)
        z.append(BLOBS)
        yield d, r, z


IDX = [4, 0, 2, 2]


def test_gather_gives_each_kind_its_batch(stores):
    d, r, z = stores
    assert d.gather(IDX).shape == (4, 2, 3)
    assert (d.gather(IDX) == ROWS[IDX]).all()
    assert [a.tolist() for a in r.gather(IDX)] == [DOCS[i].tolist() for i in IDX]
    assert z.gather(IDX) == [BLOBS[i] for i in IDX]
    # [] is gather's sugar: one record for an int, a batch otherwise.
    assert (d[1] == ROWS[1]).all() and r[2].tolist() == DOCS[2].tolist() and z[3] == BLOBS[3]
    assert z[IDX] == z.gather(IDX)


def test_packed_is_the_append_packed_form_for_every_kind(stores):
    d, r, z = stores
    values, splits = r.gather(IDX, packed=True)
    assert splits.dtype == np.int64 and splits.tolist() == [0, 4, 7, 12, 17]
    assert values.tolist() == np.concatenate([DOCS[i] for i in IDX]).tolist()
    data, offsets = z.gather(IDX, packed=True)
    assert data.dtype == np.uint8 and offsets.tolist() == [0, 1, 3, 6, 9]
    assert bytes(data) == b"".join(BLOBS[i] for i in IDX)
    # A dense batch packed: records of shape (2, 3) as 2 rows each, no copy.
    dvalues, dsplits = d.gather(IDX, packed=True)
    assert dvalues.shape == (8, 3) and dsplits.tolist() == [0, 2, 4, 6, 8]
    assert (dvalues == ROWS[IDX].reshape(8, 3)).all()
    # What packed=True returns, append_packed writes back.
    r.append_packed(values, splits)
    assert [a.tolist() for a in r[5:]] == [DOCS[i].tolist() for i in IDX]
    z.append_packed(data, offsets)
    assert z[5:] == [BLOBS[i] for i in IDX]


def test_out_receives_the_values(stores):
    d, r, z = stores
    out = np.full((4, 2, 3), -1, np.float32)
    assert d.gather(IDX, out=out) is out and (out == ROWS[IDX]).all()
    big = np.full(20, -7, np.int32)
    values, splits = r.gather(IDX, out=big, packed=True)
    assert np.shares_memory(values, big) and values.tolist() == big[:17].tolist()
    assert big[17:].tolist() == [-7] * 3  # nothing past the values is touched
    buf = bytearray(12)
    data, offsets = z.gather(IDX, out=buf, packed=True)
    assert bytes(buf[:9]) == b"".join(BLOBS[i] for i in IDX) and offsets[-1] == 9


def test_out_errors_name_what_is_wrong(stores):
    d, r, z = stores
    with pytest.raises(TypeError, match="pass packed=True"):
        r.gather(IDX, out=np.zeros(20, np.int32))
    with pytest.raises(TypeError, match="pass packed=True"):
        z.gather(IDX, out=bytearray(20))
    with pytest.raises(SizeMismatchError, match="at least"):
        r.gather(IDX, out=np.zeros(16, np.int32), packed=True)
    with pytest.raises(IdentityError, match="dtype"):
        r.gather(IDX, out=np.zeros(20, np.int64), packed=True)
    with pytest.raises(SizeMismatchError, match="read-only"):
        ro = np.zeros(20, np.int32)
        ro.flags.writeable = False
        r.gather(IDX, out=ro, packed=True)
    with pytest.raises(SizeMismatchError, match="9 bytes"):
        z.gather(IDX, out=bytearray(8), packed=True)
    with pytest.raises(SizeMismatchError):
        d.gather(IDX, out=np.zeros((3, 2, 3), np.float32))


def test_packed_refuses_records_without_a_first_axis(tmp_path):
    with DenseStore.create(tmp_path / "s", np.int64) as s:
        s.append(np.arange(4))
        with pytest.raises(ValueError, match="first axis"):
            s.gather([0, 1], packed=True)
    with RaggedStore.create(tmp_path / "m", np.int32) as m:
        m.append([np.zeros((2, 3), np.int32), np.zeros((1, 4), np.int32)])
        with pytest.raises(ValueError, match="trailing dimensions"):
            m.gather([0, 1], packed=True)


def test_shardsets_views_and_columns_read_the_same_way(tmp_path, stores):
    d, r, z = stores
    for store in (d, r, z):
        with ShardSet([store, store]) as both:
            mine = store.gather(IDX, packed=True)
            theirs = both.gather([i + 5 for i in IDX], packed=True)
            assert all((a == b).all() for a, b in zip(mine, theirs))
    ds = loaderx.convert({"tok": np.arange(20, dtype=np.int64).reshape(10, 2),
                          "n": np.arange(10)}, tmp_path / "ds", progress=False)
    view = loaderx.select(ds, "n >= 2")["tok"]  # records 2..9
    values, splits = view.gather([3, 1], packed=True)
    assert values.tolist() == [10, 11, 6, 7] and splits.tolist() == [0, 2, 4]
    assert view[[3, 1]].tolist() == [[10, 11], [6, 7]]
    for column in ds.values():
        column.close()


def test_old_names_are_deprecated_aliases(stores):
    d, r, z = stores
    with pytest.warns(DeprecationWarning, match=r"gather\(indices, packed=True\)") as caught:
        values, splits = r.gather_packed(IDX)
    assert caught[0].filename == __file__  # it points at the caller's line
    assert splits.tolist() == r.gather(IDX, packed=True)[1].tolist()
    with ShardSet([r]) as one, pytest.warns(DeprecationWarning, match="packed=True"):
        assert one.gather_packed(IDX)[1].tolist() == splits.tolist()
    buf = bytearray(9)
    with pytest.warns(DeprecationWarning, match=r"gather\(indices, out=out, packed=True\)"):
        sizes = z.gather_into(IDX, buf)
    assert sizes.dtype == np.uint64 and sizes.tolist() == [1, 2, 3, 3]
    assert bytes(buf) == b"".join(BLOBS[i] for i in IDX)
    scattered = bytearray(b"." * 12)
    with pytest.warns(DeprecationWarning):
        z.gather_into([0, 2], scattered, offsets=[0, 6])
    assert bytes(scattered) == b"AA....CCC..."


def test_loader_packed_and_its_old_spelling(stores):
    _, r, _ = stores
    with DataLoader({"r": r}, 2, mode="sequential", workers=1, packed=True,
                    stop_after=1) as loader:
        values, splits = next(loader)["r"]
    assert values.tolist() == DOCS[0].tolist() and splits.tolist() == [0, 3, 3]
    with pytest.warns(DeprecationWarning, match=r"DataLoader\(packed=True\)"):
        loader = DataLoader({"r": r}, 2, mode="sequential", workers=1, ragged="packed",
                            stop_after=1)
    with loader:
        assert next(loader)["r"][1].tolist() == [0, 3, 3]
    with pytest.raises(TypeError, match="packed must be True or False"):
        DataLoader({"r": r}, 2, packed="yes")
