"""Stores written by the real original loaderx 1.7.7 (installed from the package
index into a cached virtualenv, tests/_lx177.py; skipped with the reason when
it cannot be had): every kind it writes (tests/_lx177_writer.py) is read in
place and converted with every record's dtype, shape and bytes identical to
what 1.7.7 wrote and reads back; `info` and `verify` describe them; writes are
refused with the convert command; a store open in 1.7.7 is refused and one
open here is refused by 1.7.7; damage to a real store raises CorruptStoreError
naming the file; its sampler and DataLoader sequences are reproduced exactly
by ``sampler="1.7.7"``; torch's DataLoader reads a batch in one
``__getitems__`` call."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import numpy as np
import pytest
from _lx177 import run177, write_stores

import loaderx
from loaderx import DenseStore, RaggedStore
from loaderx.zsampler import Sampler177
from loaderx.errors import BusyError, CorruptStoreError, IdentityError, ReadOnlyError

STORES = [
    "bytes_dict", "bytes_zstd", "dense_bool", "dense_deleted", "dense_deleted_compacted",
    "dense_dict_balanced", "dense_dict_fast", "dense_dict_max", "dense_empty",
    "dense_multichunk", "dense_raw", "dense_raw_compacted", "dense_scalar", "dense_scalar_raw",
    "dense_structured", "dense_zstd", "ragged_1d", "ragged_1d_raw", "ragged_deleted_compacted",
    "ragged_dict", "ragged_mixed_ranks", "ragged_multichunk", "ragged_nd",
]
#: Small stores (no sparse 4 GiB chunk) that tests may copy and damage.
SMALL = "dense_zstd"


@pytest.fixture(scope="module")
def old(tmp_path_factory):
    """The directory of every store 1.7.7 wrote, and what it holds."""
    root = write_stores(tmp_path_factory.mktemp("lx177") / "stores")
    expected = dict(np.load(os.path.join(root, "expected.npz")))
    assert sorted(expected["stores"].tolist()) == STORES
    return root, expected


def _expected(expected: dict, name: str):
    if name in expected:
        return expected[name]
    dtype = np.dtype(str(expected[name + ".dtype"]))
    values, dims = expected[name + ".values"], expected[name + ".dims"].tolist()
    out, at, d = [], 0, 0
    for ndim in expected[name + ".ndim"].tolist():
        shape = tuple(dims[d:d + ndim])
        d += ndim
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        out.append(values[at:at + n].view(dtype).reshape(shape))
        at += n
    return out


def _every(store):
    n = len(store)
    if store.kind == "dense":
        return store[np.arange(n)] if n else np.empty((0,) + store.item_shape, store.dtype)
    return store[np.arange(n)] if n else []


def _assert_same(name, want, got):
    if isinstance(want, np.ndarray):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), name
        assert got.tobytes() == want.tobytes(), name
        return
    assert len(got) == len(want), name
    for i, (w, g) in enumerate(zip(want, got)):
        assert (g.dtype, g.shape) == (w.dtype, w.shape), f"{name} record {i}"
        assert g.tobytes() == w.tobytes(), f"{name} record {i}"


# ----------------------------------------------------------------- every kind, exactly


@pytest.mark.parametrize("name", STORES)
def test_every_store_reads_in_place_exactly(old, name):
    root, expected = old
    want = _expected(expected, name)
    cls = DenseStore if name.startswith("dense") else RaggedStore
    for opened in (loaderx.open_store(os.path.join(root, name)), cls(os.path.join(root, name))):
        with opened as s:
            assert isinstance(s, cls) and s.codec == str(expected["codec." + name])
            assert s.has_dict() == bool(expected["has_dict." + name])
            _assert_same(name, want, _every(s))
            if len(s) > 3:  # random order, repeats, negatives, a scalar
                idx = np.array([3, 0, -1, 3, len(s) // 2])
                pick = [want[int(i)] for i in idx]
                got = s.gather(idx) if cls is RaggedStore else list(s.gather(idx))
                _assert_same(name, pick, got)
                _assert_same(name, [want[-1]], [s[-1]])


@pytest.mark.parametrize("name", STORES)
def test_every_store_converts_exactly(old, tmp_path, name):
    root, expected = old
    data = loaderx.convert(os.path.join(root, name), tmp_path / "new", progress=False)
    col = data[name]
    assert isinstance(col, DenseStore if name.startswith("dense") else RaggedStore)
    _assert_same(name, _expected(expected, name), _every(col))
    if "dict" in name:  # the store's own dictionary is kept
        with RaggedStore(os.path.join(root, name)) if name.startswith(("ragged", "bytes")) \
                else DenseStore(os.path.join(root, name)) as s:
            assert col.codec == "zstd_dict" and col.dictionary() == s.dictionary()


def test_info_and_verify_describe_a_1_7_store(old, cli):
    root, _ = old
    for name, kind in (("dense_dict_max", "dense (uint8[192]); converts to a DenseStore uint8[192]"),
                       ("ragged_multichunk", "ragged (uint8); converts to a RaggedStore uint8")):
        path = os.path.join(root, name)
        info = cli("info", path)
        assert info.returncode == 0, info.stderr
        assert "a store of the original loaderx 1.7, format version 4" in info.stdout
        assert f"kind:      {kind}" in info.stdout
        verify = cli("verify", path)
        assert verify.returncode == 0, verify.stderr
        assert "records of a store written by the original loaderx 1.7 verified" in verify.stdout
    assert "2 chunk files" in cli("info", os.path.join(root, "ragged_multichunk")).stdout


# ----------------------------------------------------------------- read-only, locked


def test_writes_are_refused_with_the_command_that_converts(old):
    root, _ = old
    path = os.path.join(root, "ragged_1d")
    with loaderx.open_store(path) as s:
        for write in (lambda: s.append([np.arange(3, dtype=np.int32)]), lambda: s.delete(0),
                      s.compact, lambda: s.append_packed(np.arange(3, dtype=np.int32), [0, 3])):
            with pytest.raises(ReadOnlyError, match=r"loaderx\.convert\(.*ragged_1d.*, DEST\)"):
                write()
    with pytest.raises(TypeError, match="is not a loaderx 3 store .*convert it"):
        loaderx.ShardSet([path])
    with pytest.raises(IdentityError, match="holds ragged records, not dense"):
        DenseStore(path)
    with pytest.raises(IdentityError, match="asked for dtype=int64"):
        RaggedStore(path, np.int64)
    with RaggedStore(path, np.int32) as s:  # 1.7's create-or-open spelling, matching
        assert s.kind == "ragged"


def test_a_store_open_in_1_7_7_is_refused_and_the_other_way_round(old):
    root, _ = old
    path = os.path.join(root, "dense_raw")
    holder = subprocess.Popen(
        [_python177(), "-I", "-c", "import sys, loaderx.zrecord as z\n"
         f"s = z.DenseStore({path!r}); print('open', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")})
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(BusyError, match="open in loaderx 1.7"):
            DenseStore(path)
    finally:
        holder.communicate("", timeout=60)
    with DenseStore(path) as s:
        out = run177(f"import loaderx.zrecord as z\ntry:\n    z.DenseStore({path!r})\n"
                     "except z.ZrecordError as e:\n    print(e)", cwd=root)
        assert "store is busy" in out.stdout
        assert len(s) == 257
    run177(f"import loaderx.zrecord as z\nz.DenseStore({path!r}).close()", cwd=root)


def _python177():
    from _lx177 import python177
    return python177()


# ----------------------------------------------------------------- damage


def _damaged(root, tmp_path, name=SMALL):
    dest = tmp_path / name
    shutil.copytree(os.path.join(root, name), dest)
    return dest


@pytest.mark.parametrize("damage, file, words", [
    (lambda p: (p / "meta.zr").write_bytes((p / "meta.zr").read_bytes()[:20]), "meta.zr",
     "20 bytes; loaderx 1.7's meta.zr is exactly 32"),
    (lambda p: (p / "store.zr").write_bytes(b"XXXX" + (p / "store.zr").read_bytes()[4:]),
     "store.zr", "bad magic"),
    (lambda p: (p / "store.zr").write_bytes((p / "store.zr").read_bytes()[:40]), "store.zr",
     "bytes of type identity"),
    (lambda p: os.truncate(p / "0.chunk", 100), "0.chunk", "shorter than the write frontier"),
    (lambda p: os.remove(p / "0.loc"), "0.loc", "missing"),
    (lambda p: os.truncate(p / "0.loc", 16 * 10), "0.loc", "shorter than the 300 entries"),
    (lambda p: _patch(p / "0.loc", 16 * 7 + 12, 3), "0.loc",
     "entry 7 (record 7) lies in chunk 3, past the last chunk"),
    (lambda p: _patch(p / "0.loc", 16 * 9 + 8, 81), "0.loc",
     "entry 9 (record 9) holds 81 bytes, not the 80 of a dense float32[4, 5] record"),
    # (1.7.7 places compressed records in the order its threads finish them:
    # the record at offset 0 is any record.)
    (lambda p: _flip(p / "0.chunk", 1), "0.chunk", "does not decode to its 80 bytes"),
    (lambda p: (p / "dict.zr").write_bytes(b"x"), "dict.zr", "present, but the store's codec"),
])
def test_a_damaged_1_7_store_names_the_file_and_what_is_wrong(old, tmp_path, damage, file,
                                                                words):
    root, _ = old
    path = _damaged(root, tmp_path)
    damage(path)
    for attempt in (lambda: DenseStore(path)[np.arange(300)],
                    lambda: loaderx.convert(path, tmp_path / "new", progress=False)):
        with pytest.raises(CorruptStoreError) as e:
            attempt()
        assert f"{path / file}: " in str(e.value) and words in str(e.value), str(e.value)
    assert not (tmp_path / "new").exists()


def _patch(file, offset, value):
    data = bytearray(file.read_bytes())
    data[offset:offset + 4] = int(value).to_bytes(4, "little")
    file.write_bytes(bytes(data))


def _flip(file, offset):
    data = bytearray(file.read_bytes())
    data[offset] ^= 0xFF
    file.write_bytes(bytes(data))


def test_a_missing_dictionary_and_a_fifo_chunk_are_named(old, tmp_path):
    root, _ = old
    path = _damaged(root, tmp_path, "bytes_dict")
    os.remove(path / "dict.zr")
    with pytest.raises(CorruptStoreError, match=r"dict\.zr: missing, but the store's codec"):
        RaggedStore(path)
    path = _damaged(root, tmp_path / "fifo")
    os.remove(path / "0.chunk")
    os.mkfifo(path / "0.chunk")
    t0 = time.monotonic()
    with pytest.raises(CorruptStoreError, match=r"0\.chunk: is a FIFO \(named pipe\)"):
        loaderx.convert(path, tmp_path / "new", progress=False)
    assert time.monotonic() - t0 < 30


# ----------------------------------------------------------------- the loader and samplers


def test_a_dataloader_reads_1_7_stores_in_place(old):
    root, expected = old
    with loaderx.open_store(os.path.join(root, "dense_scalar")) as labels:
        streams = {"x": DenseStore(os.path.join(root, "dense_zstd")), "y": labels[:300]}
    with loaderx.DataLoader(streams, batch_size=32, seed=3, stop_after=12) as loader:
        for batch in loader:
            assert batch["x"].shape == (32, 4, 5) and batch["y"].shape == (32,)
    want_x = expected["dense_zstd"]
    with loaderx.DataLoader({"x": streams["x"]}, batch_size=16, mode="sequential",
                            stop_after=20) as loader:
        got = np.concatenate([b["x"] for b in loader])
    assert got.tobytes() == np.concatenate([want_x, want_x[:20]]).tobytes()
    seq = RaggedStore(os.path.join(root, "ragged_nd"))
    with loaderx.DataLoader({"seq": seq}, batch_size=10, mode="sequential", packed=True,
                            stop_after=3) as loader:
        values, splits = next(loader)["seq"]
    _assert_same("ragged_nd", _expected(expected, "ragged_nd")[:10],
                 np.split(values, splits[1:-1]))


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_sampler_177_reproduces_1_7_7_exactly(old, mode):
    _, expected = old
    keys = [k for k in expected if k.startswith(f"sampler.{mode}.")]
    assert len(keys) == 5
    for key in keys:
        length, batch, seed = map(int, key.split(".")[2:])
        want = expected[key]
        s = Sampler177(length, batch, mode, seed)
        got = np.stack([s.next() for _ in range(len(want))])
        assert got.dtype == np.uint64 and (got == want).all(), key
        s.seek(17)
        assert (s.next() == want[17]).all() and (s.at(3) == want[3]).all(), key


@pytest.mark.parametrize("mode, seed", [(1, 1), (2, 42), (0, 5)])
def test_a_dataloader_with_sampler_177_continues_a_1_7_7_run(old, mode, seed):
    root, expected = old
    want = expected[f"loader.{mode}.{seed}"]  # 1.7.7's DataLoader, one transform thread
    with DenseStore(os.path.join(root, "dense_scalar")) as labels:
        with loaderx.DataLoader({"y": labels}, 4, mode=mode, seed=seed,
                                sampler="1.7.7") as loader:
            got = np.stack([next(loader)["y"] for _ in range(len(want))])
            state = loader.state_dict()
        assert (got == want).all()
        with loaderx.DataLoader({"y": labels}, 4, mode=mode, seed=seed, sampler="1.7.7",
                                step=11) as resumed:  # a run stopped at step 11 on 1.7.7
            assert (next(resumed)["y"] == want[11]).all()
            resumed.load_state_dict(state)
            assert resumed.step == len(want)


def test_torch_fetches_a_batch_in_one_getitems_call(old, tmp_path):
    torch = pytest.importorskip("torch")
    from loaderx.dense import OriginalDenseStore

    root, expected = old
    want = expected["dense_zstd"]
    calls = []

    def counted(cls):
        class Counted(cls):
            def __getitems__(self, indices):
                calls.append(list(indices))
                return super().__getitems__(indices)
        return Counted

    with DenseStore(tmp_path / "new", want.dtype, want.shape[1:]) as new:
        new.append(want)
    for store in (counted(OriginalDenseStore)(os.path.join(root, "dense_zstd")),
                  counted(DenseStore)(tmp_path / "new")):
        calls.clear()
        sampler = torch.utils.data.BatchSampler(range(len(store)), batch_size=8, drop_last=False)
        loader = torch.utils.data.DataLoader(store, batch_sampler=sampler,
                                             collate_fn=torch.from_numpy)
        batches = list(loader)
        assert len(batches) == len(calls) == 38 and calls[0] == list(range(8))
        assert torch.cat(batches).numpy().tobytes() == want.tobytes()
        store.close()
