"""The test forger's view of the on-disk format agrees with the library's:
tests/_lxlayout.py (struct formats, offsets, constants) is generated from
src/format.zig by `zig build forger-layout` and must be current; what the
forger (tests/_lxformat.py) reads from a store is what the library reports;
and the pure-Python checksums (tests/_xxhash.py) are the library's on random
inputs of every length path (XXH3 0-16, 17-128, 129-240 bytes, XXH64 beyond
and with aux bytes)."""
import numpy as np
import pytest

import loaderx
from loaderx import DenseStore, RaggedStore, Zrecord
from loaderx._lib import check, ffi, lib
from _lxformat import IDENTITY, LOC, StoreImage, pack_commit, pack_header, unpack_identity
from _lxlayout import BLOB_OFFSET, COMMIT_OFFSET, FORMAT_VERSION, SEED_BLOB
from _xxhash import record_checksum, xxh3_64, xxh64
from _helpers import assert_generated_current


def test_generated_layout_is_current(tmp_path):
    """Regenerate _lxlayout.py from src/format.zig; the committed file must match."""
    assert_generated_current("forger-layout-print", "layout/_lxlayout.py", "tests/_lxlayout.py",
                             tmp_path)


def _stores(tmp_path):
    """A store of each layout: fixed width, table with aux, seekable, dictionary."""
    dense = tmp_path / "dense"
    with loaderx.DenseStore(dense, np.float32, (2, 3), codec="raw") as s:
        s.append(np.arange(30, dtype=np.float32).reshape(5, 2, 3))
    ragged = tmp_path / "ragged"
    with loaderx.RaggedStore(ragged, np.uint16, frame_size=64) as s:
        s.append([np.arange(n, dtype=np.uint16) for n in (1, 100, 7)] + [np.zeros((2, 3), np.uint16)])
    zdict = tmp_path / "zdict"
    recs = [b'{"id": %d, "name": "user%d"}' % (i, i) for i in range(300)]
    d = loaderx.train_dict(recs, size=1024)
    with loaderx.Zrecord(zdict, create=True, codec="zstd_dict", dict_bytes=d) as z:
        z.append(recs[:20])
    return [dense, ragged, zdict]


def _identity(path):
    with loaderx.open_store(path) as s:
        out = ffi.new("lx_identity_t *")
        check(lib.lx_identity(s._h(), out))
        info = ffi.new("lx_info_t *")
        check(lib.lx_info(s._h(), info))
        fields = {k: getattr(out, k) for k in ("kind", "flags", "encoding", "ndim", "itemsize",
                                                "descr_size", "name_size")}
        fields["item_shape"] = tuple(out.item_shape[0:out.ndim])
        return fields, info, s._blob("dtype_descr"), s._blob("dtype_name")


def test_forger_reads_what_the_library_writes(tmp_path):
    for path in _stores(tmp_path):
        img = StoreImage.load(path)
        meta = bytes(img.files["meta"])
        h = img.header()
        ident, info, descr, name = _identity(path)
        assert (h["format_version"], h["codec"], h["fixed_size"], h["frame_size"]) == (
            FORMAT_VERSION, info.codec, info.fixed_size, info.frame_size)
        # Re-sealing what was read reproduces the bytes: the checksum recipes agree.
        assert pack_header(h) == meta[:len(pack_header(h))]
        assert pack_commit(img.commit()) == meta[COMMIT_OFFSET:COMMIT_OFFSET + 64]
        blobs = meta[BLOB_OFFSET:]
        assert xxh64(blobs, SEED_BLOB) == h["blob_checksum"]
        assert img.dict_bytes() + img.user_bytes() == blobs
        stored = unpack_identity(img.user_bytes())
        assert ident["encoding"] == 1 and len(img.user_bytes()) == IDENTITY.size + len(descr) + len(name)
        for k in ("kind", "flags", "ndim", "itemsize", "descr_size", "name_size", "item_shape"):
            assert stored[k] == ident[k], k
        assert (stored["descr"], stored["name"]) == (descr, name)
        for i in range(img.count):
            if img.fixed:
                assert img.sum(i) == record_checksum(b"", img.fixed_record(i), i)
            else:
                assert img.loc(i)["checksum"] == record_checksum(*img.record_parts(img.loc(i)), i)


def _append_raw(z, records, auxes):
    keep = [ffi.from_buffer(r) for r in records] + [ffi.from_buffer(a) for a in auxes]
    n = len(records)
    ptrs = ffi.new("uint8_t *[]", [ffi.cast("uint8_t *", k) for k in keep[:n]])
    aux_ptrs = ffi.new("uint8_t *[]", [ffi.cast("uint8_t *", k) for k in keep[n:]])
    sizes = ffi.new("uint64_t[]", [len(r) for r in records])
    aux_sizes = ffi.new("uint64_t[]", [len(a) for a in auxes])
    first = ffi.new("uint64_t *")
    check(lib.lx_append(z._w(), n, ptrs, sizes, aux_ptrs, aux_sizes, 0, first))


@pytest.mark.parametrize("seed", [1, 2])
def test_record_checksums_match_the_library_on_random_inputs(tmp_path, seed):
    """Random bytes of every length path, with and without aux, stored raw:
    each table entry's checksum is what _xxhash computes for it."""
    rng = np.random.default_rng(seed)
    sizes = np.concatenate([np.arange(0, 260), rng.integers(0, 5000, 140)])
    records = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in sizes]
    auxes = [rng.integers(0, 256, int(rng.choice([0, 0, 1, 8, 31, 300])), dtype=np.uint8).tobytes()
             for _ in records]
    path = tmp_path / "z"
    with loaderx.Zrecord(path, create=True, codec="raw") as z:
        z.append([b"x"])  # record 0: so index 0 is not the only tweak tested
        _append_raw(z, records, auxes)
    img = StoreImage.load(path)
    assert img.count == len(records) + 1
    for i, (rec, aux) in enumerate(zip(records, auxes), start=1):
        loc = img.loc(i)
        assert (loc["stored_size"], loc["aux_size"]) == (len(rec), len(aux))
        assert loc["checksum"] == record_checksum(aux, rec, i), (len(rec), len(aux))
    assert LOC.size == 32


def test_hashes_known_answers():
    assert xxh64(b"") == 0xEF46DB3751D8E999
    assert xxh64(b"", 1) != xxh64(b"")
    assert xxh3_64(b"") == 0x2D06800538D394C2
    with pytest.raises(ValueError):
        xxh3_64(bytes(241))


def test_record_checksums_match_the_engine(tmp_path):
    """Every XXH3 length class (0, 1-3, 4-8, 9-16, 17-128, 129-240) and the
    XXH64 path (aux bytes, or more than 240 bytes), as the engine writes them."""
    rng = np.random.default_rng(5)
    recs = [
        rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        for n in list(range(0, 260)) + [1000, 5000]
    ]
    with Zrecord(tmp_path / "z", create=True, codec="raw") as z:
        z.append(recs)
    img = StoreImage.load(tmp_path / "z")
    bad = [len(r) for i, r in enumerate(recs) if img.loc(i)["checksum"] != record_checksum(b"", r, i)]
    assert not bad, f"record checksums differ from the engine's at sizes {bad[:10]}"

    shapes = [(2, 3), (), (0, 5), (3, 1, 2), (50, 4)]
    arrays = [np.arange(int(np.prod(s)), dtype="<i2").reshape(s) for s in shapes]
    with RaggedStore(tmp_path / "r", "<i2", codec="zstd") as s:
        s.append(arrays)
    img = StoreImage.load(tmp_path / "r")
    for i in range(len(arrays)):
        aux, stored = img.record_parts(img.loc(i))
        assert img.loc(i)["checksum"] == record_checksum(aux, stored, i), shapes[i]
    assert img.loc(4)["codec"] == 1, "the large ragged record should be a zstd frame"

    block_ = rng.integers(0, 9, size=(7, 3, 5)).astype("<f8")
    with DenseStore(tmp_path / "d", "<f8", (3, 5), codec="raw") as s:
        s.append(block_)
    img = StoreImage.load(tmp_path / "d")
    assert img.fixed == 120
    assert [img.sum(i) for i in range(7)] == [record_checksum(b"", r.tobytes(), i) for i, r in enumerate(block_)]
