"""Reads of stores whose records are not in the page cache (src/store_cold.zig):
`prefetch(indices)` brings exactly the records asked for into memory and
returns once they are there, and gathers of a cold store, raw or compressed,
dense or ragged, return the same values as warm ones.

Residency is observed with `mincore` on a mapping of the test's own; the records are dropped from the page
cache with `posix_fadvise(DONTNEED)`. Where that does not make them cold (a
file system without a page cache of its own, such as tmpfs) the residency
tests skip.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
import threading

import numpy as np
import pytest

from loaderx import DenseStore, RaggedStore, ShardSet
from loaderx.errors import ClosedError, RecordIndexError

PAGE = os.sysconf("SC_PAGE_SIZE")
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None
if _LIBC is not None:
    _LIBC.mmap.restype = ctypes.c_void_p
    _LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                           ctypes.c_int, ctypes.c_long]
    _LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    _LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
RECORD = 3 * 4096  # 12 KiB: whole pages, each record its own
COUNT = 600


def _drop(path) -> None:
    """Every page of the store's files out of the page cache (none is mapped)."""
    for name in ("data", "index"):
        fd = os.open(os.path.join(path, name), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _cached(path, offset: int) -> bool:
    """Whether the data file's page at `offset` is in the page cache
    (`mincore` on a mapping of our own: it reads nothing, unlike
    `preadv(RWF_NOWAIT)`, which still starts readahead on a miss)."""
    fd = os.open(os.path.join(path, "data"), os.O_RDONLY)
    try:
        at = offset - offset % PAGE
        addr = _LIBC.mmap(None, PAGE, mmap.PROT_READ, mmap.MAP_SHARED, fd, at)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap failed")
        vec = (ctypes.c_ubyte * 1)()
        rc = _LIBC.mincore(addr, PAGE, vec)
        _LIBC.munmap(addr, PAGE)
        if rc != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return bool(vec[0] & 1)
    finally:
        os.close(fd)


def _records(n: int = COUNT) -> np.ndarray:
    rng = np.random.default_rng(12)
    return rng.integers(0, 255, (n, RECORD), dtype=np.uint8)


@pytest.fixture
def cold_raw(tmp_path):
    if _LIBC is None or not hasattr(os, "posix_fadvise"):
        pytest.skip("needs mincore and posix_fadvise (Linux)")
    ref = _records()
    path = tmp_path / "raw"
    with DenseStore(path, np.uint8, (RECORD,), codec="raw") as ds:
        ds.append(ref)
    _drop(path)
    if any(_cached(path, i * RECORD) for i in range(0, COUNT, 37)):
        pytest.skip("posix_fadvise(DONTNEED) leaves the pages cached on this file system")
    return path, ref


def test_prefetch_brings_exactly_the_records_in(cold_raw):
    path, ref = cold_raw
    idx = np.array([5, 400, 17, 599, 250])
    with DenseStore(path) as ds:
        ds.prefetch(idx)
        for i in idx:
            for page in range(3):
                assert _cached(path, i * RECORD + page * 4096), (i, page)
        # Records not asked for stay out (readahead did not read around them).
        others = [i for i in range(100, 200, 7)]
        assert not any(_cached(path, i * RECORD) for i in others)
        np.testing.assert_array_equal(ds[idx], ref[idx])


def test_prefetch_without_waiting_queues_the_reads(cold_raw):
    path, ref = cold_raw
    idx = np.array([3, 300, 301, 302, 598])
    with DenseStore(path) as ds:
        ds.prefetch(idx, wait=False)
        np.testing.assert_array_equal(ds[idx], ref[idx])
        assert all(_cached(path, i * RECORD + 2 * 4096) for i in idx)
        assert not any(_cached(path, i * RECORD) for i in range(100, 200, 7))


def test_a_gather_after_prefetch_takes_no_major_fault(cold_raw):
    import resource

    path, ref = cold_raw
    idx = np.random.default_rng(1).choice(COUNT, 64, replace=False)
    with DenseStore(path) as ds:
        ds.prefetch(idx)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        got = ds[idx]
        assert resource.getrusage(resource.RUSAGE_SELF).ru_majflt == before
        np.testing.assert_array_equal(got, ref[idx])


def test_a_cold_gather_reads_its_records_explicitly(cold_raw):
    """The first gather of a cold store finds it cold and queues exactly its
    records' reads: the values are right and neighbours stay uncached."""
    path, ref = cold_raw
    idx = np.arange(300, 600, 10)
    with DenseStore(path) as ds:
        np.testing.assert_array_equal(ds[idx], ref[idx])
        np.testing.assert_array_equal(ds.gather(idx[::-1], threads=1), ref[idx[::-1]])
    assert not any(_cached(path, i * RECORD) for i in range(0, 290, 7))


@pytest.mark.parametrize("codec", ["zstd", "raw"])
def test_cold_gathers_of_every_kind_return_the_stored_values(tmp_path, codec):
    rng = np.random.default_rng(3)
    dense = rng.integers(0, 4, (500, 3000), dtype=np.uint8)  # compressible
    ragged = [rng.integers(0, 1000, rng.integers(1, 3000), dtype=np.int32) for _ in range(300)]
    with DenseStore(tmp_path / "d", np.uint8, (3000,), codec=codec) as ds:
        ds.append(dense)
    with RaggedStore(tmp_path / "r", np.int32, codec=codec) as rs:
        rs.append(ragged)
    if hasattr(os, "posix_fadvise"):
        _drop(tmp_path / "d")
        _drop(tmp_path / "r")
    idx = rng.integers(0, 300, 200)
    with DenseStore(tmp_path / "d") as ds, RaggedStore(tmp_path / "r") as rs:
        ds.prefetch(idx[:50])
        np.testing.assert_array_equal(ds[idx], dense[idx])
        rs.prefetch(idx[50:])
        for got, i in zip(rs[idx], idx):
            np.testing.assert_array_equal(got, ragged[i])
        values, splits = rs.gather(idx, packed=True)
        np.testing.assert_array_equal(values, np.concatenate([ragged[i] for i in idx]))
        assert splits[-1] == len(values)


def test_prefetch_takes_every_index_form_and_checks_them(tmp_path):
    ref = _records(50)
    with DenseStore(tmp_path / "s", np.uint8, (RECORD,), codec="raw") as ds:
        ds.append(ref)
        ds.prefetch([1, -1, 3])
        ds.prefetch(slice(10, 20))
        ds.prefetch(np.zeros(50, dtype=bool))
        ds.prefetch([])
        with pytest.raises(RecordIndexError, match="out of range"):
            ds.prefetch([0, 50])
        with pytest.raises(TypeError):
            ds.prefetch(["a"])
    with pytest.raises(ClosedError):
        ds.prefetch([0])


def test_prefetch_is_thread_safe_and_idempotent(tmp_path):
    ref = _records(200)
    path = tmp_path / "t"
    with DenseStore(path, np.uint8, (RECORD,), codec="raw") as ds:
        ds.append(ref)
    if hasattr(os, "posix_fadvise"):
        _drop(path)
    with DenseStore(path) as ds:
        errors = []

        def work(seed: int) -> None:
            rng = np.random.default_rng(seed)
            try:
                for _ in range(20):
                    idx = rng.integers(0, 200, 32)
                    ds.prefetch(idx)
                    ds.prefetch(idx)
                    np.testing.assert_array_equal(ds[idx], ref[idx])
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []


def test_a_shardset_prefetches_from_every_shard(tmp_path):
    ref = _records(90)
    paths = []
    for k in range(3):
        paths.append(tmp_path / f"shard{k}")
        with DenseStore(paths[-1], np.uint8, (RECORD,), codec="raw") as ds:
            ds.append(ref[30 * k:30 * (k + 1)])
    if _LIBC is None or not hasattr(os, "posix_fadvise"):
        pytest.skip("needs mincore and posix_fadvise (Linux)")
    for path in paths:
        _drop(path)
    if any(_cached(path, 0) for path in paths):
        pytest.skip("posix_fadvise(DONTNEED) leaves the pages cached on this file system")
    with ShardSet([str(p) for p in paths]) as shards:
        idx = np.array([5, 35, 89, 60])
        shards.prefetch(idx)
        for i in idx:
            assert _cached(paths[i // 30], (i % 30) * RECORD), i
        assert not _cached(paths[0], 20 * RECORD)
        np.testing.assert_array_equal(shards[idx], ref[idx])
        shards.prefetch(idx, wait=False)
        with pytest.raises(RecordIndexError):
            shards.prefetch([90])
