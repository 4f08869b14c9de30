"""The byte store's ``delete`` (duplicates, unsorted, negative indices,
slices, masks) against a Python model of swap-last deletion, and ``compact``
reclaiming everything."""
from __future__ import annotations

import os
import random

import numpy as np
import pytest

from loaderx.errors import CorruptStoreError, RecordIndexError
from loaderx.zrecord import DenseStore, Zrecord  # noqa: F401
from _lxformat import snapshot
from _bytestore import model_delete, payload, resolve
from _helpers import expected_moves, swap_last_order


# ----------------------------------------------------------------- 3. delete and compact

def test_compact_refuses_records_that_overlap(tmp_path):
    """A table whose entries share bytes (a forged or damaged store: each
    entry in bounds, its checksum sealed) is refused by compact before
    anything moves. Before the check, compact's rounds computed a negative
    gap and moved bytes over live records."""
    from _lxformat import StoreImage

    path = tmp_path / "s"
    with Zrecord(path, create=True, codec="raw") as z:
        z.append([bytes([i]) * 100 for i in range(6)])
        z.delete([1])  # a hole, so compact has work to do
    img = StoreImage.load(path)
    img.put_loc(3, offset=img.loc(2)["offset"] + 50)  # half of record 2, half of the next
    img.write(path)
    before = snapshot(path)
    with Zrecord(path) as z:
        with pytest.raises(CorruptStoreError, match="overlaps"):
            z.compact()
    after = snapshot(path)
    assert after["data"] == before["data"] and after["index"] == before["index"]


def test_delete_model_sanity():
    assert model_delete(list(range(10)), [2, 8]) == [0, 1, 9, 3, 4, 5, 6, 7]
    assert model_delete(list(range(6)), [5, 0, 0, 4]) == [3, 1, 2]
    assert model_delete(list(range(5)), [3, 4]) == [0, 1, 2]
    assert model_delete(list(range(5)), range(5)) == []


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_delete_swap_last_and_compact(tmp_path, codec):
    path = tmp_path / "del"
    model = [payload(i, 3) for i in range(400)]
    z = Zrecord(path, create=True, codec=codec)
    z.append(model)

    def check(step):
        nonlocal z
        assert len(z) == len(model), step
        assert z[:] == model, step
        st = z.stats()
        assert st["records"] == len(model)
        assert st["chunk_bytes"] == st["live_bytes"] + st["reclaimable"]
        if codec == "raw":
            assert st["live_bytes"] == sum(map(len, model)), step
        z.close()
        z = Zrecord(path)
        assert z[:] == model, f"{step}: after reopen"

    keys = [  # each a function of the current length
        lambda n: 5,
        lambda n: -1,
        lambda n: -n + 2,
        lambda n: [10, 3, 10, -2, 0, 3, 10],                          # duplicates, unsorted, negative
        lambda n: np.array([n - 1, n - 3, n - 1], dtype=np.int32),     # only top positions: nothing moves
        lambda n: np.array([n - 2, 4, -n], dtype=np.int64),
        lambda n: slice(2, 60, 7),
        lambda n: slice(None, None, -25),
        lambda n: (1, 2, 4),
        lambda n: np.array([7, 7, 7], dtype=np.uint64),
        lambda n: [],
    ]
    for step, make in enumerate(keys):
        key = make(len(model))
        positions = resolve(key, len(model))
        z.delete(key)
        model = model_delete(model, positions)
        check(f"delete #{step} {key!r}")
    mask = np.zeros(len(model), dtype=bool)
    mask[np.random.default_rng(0).choice(len(model), 40, replace=False)] = True
    positions = resolve(mask, len(model))
    z.delete(mask)
    model = model_delete(model, positions)
    check("mask")

    # Out of range: refused whole, nothing deleted.
    before = z.stats()
    for bad in ([0, len(model)], len(model), -len(model) - 1, [1, -len(model) - 5]):
        with pytest.raises(RecordIndexError):
            z.delete(bad)
    with pytest.raises(RecordIndexError):
        z.delete(np.ones(len(model) + 1, dtype=bool))
    assert z.stats() == before
    check("refused deletes")

    # Random rounds of deletes, appends and compacts.
    rng = random.Random(11)
    next_id = 10_000
    for rnd in range(25):
        op = rng.random()
        if op < 0.5 and model:
            key = [rng.randrange(-len(model), len(model)) for _ in range(rng.randrange(1, 12))]
            positions = resolve(key, len(model))
            z.delete(key)
            model = model_delete(model, positions)
        elif op < 0.8:
            new = [payload(next_id + k, 3) for k in range(rng.randrange(1, 30))]
            next_id += len(new)
            assert z.append(new) == len(model)
            model += new
        else:
            z.compact()
            st = z.stats()
            assert st["reclaimable"] == 0 and st["chunk_bytes"] == st["live_bytes"]
        assert z[:] == model, f"round {rnd}"
    check("random rounds")

    # compact: chunk_bytes shrinks to live_bytes, the data file to match.
    st = z.stats()
    z.delete(list(range(0, len(model), 3)))
    model = model_delete(model, range(0, len(model), 3))
    st = z.stats()
    assert st["reclaimable"] > 0
    live = st["live_bytes"]
    z.compact()
    st = z.stats()
    assert st == {"records": len(model), "live_bytes": live, "chunk_bytes": live, "reclaimable": 0}
    assert os.path.getsize(path / "data") == live
    assert z[:] == model
    z.verify()
    check("compact")
    z.compact()  # nothing to do
    assert z.stats()["reclaimable"] == 0 and z[:] == model

    # Delete everything, compact to nothing, then reuse.
    z.delete(slice(None))
    model = []
    check("delete all")
    z.compact()
    assert z.stats() == {"records": 0, "live_bytes": 0, "chunk_bytes": 0, "reclaimable": 0}
    assert z.append([b"again", b""]) == 0
    model = [b"again", b""]
    check("reuse")
    z.verify()
    z.close()


def test_delete_follows_the_original_order_and_returns_its_moves(tmp_path):
    """Before the fix the store filled each hole with the highest survivor:
    deleting {2, 3} from ten records gave [0,1,9,8,...] where the original
    loaderx gives [0,1,8,9,4,5,6,7]; delete returned nothing."""
    for codec, path in (("raw", tmp_path / "dense_raw"), ("zstd", tmp_path / "dense_zstd")):
        with DenseStore(path, np.int64, (), codec=codec) as ds:
            ds.append(np.arange(10))
            moves = ds.delete([3, 2])
            assert ds[:].tolist() == [0, 1, 8, 9, 4, 5, 6, 7]
            assert moves.tolist() == [[8, 2], [9, 3]]
    rng = np.random.default_rng(5)
    with Zrecord(tmp_path / "z", create=True) as z:
        model = [bytes([i % 256, i // 256]) for i in range(500)]
        z.append(model)
        for _ in range(30):
            key = rng.integers(0, len(model), rng.integers(1, 20)).tolist()
            order = swap_last_order(len(model), key)
            moves = z.delete(key)
            assert moves.tolist() == expected_moves(order)
            model = [model[p] for p in order]
            assert z[:] == model
