"""What crosses the network and when (through the counting fault proxy):
cold batches fetch at most 1.5x their payload, a store's index comes in
slivers, with a batch or whole in the background by the cache's policy
(loaderx._cachedir.CACHE_POLICY), close ranges are not merged, prefetch
makes later reads local, and a warm gather is one native call."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")

import loaderx  # noqa: E402
from loaderx import _cachedir, remote  # noqa: E402

from _helpers import assert_same  # noqa: E402
from _remote_helpers import N, NONE, REC, ZZ, opened  # noqa: E402
from _servers import fault_proxy  # noqa: E402

pytestmark = pytest.mark.slow


def test_cold_random_batches_fetch_at_most_1_5x_their_payload(tmp_path, s3, url, proxy):
    base, faults = proxy
    ds = opened(url, tmp_path / "cache", s3, base)
    try:
        replicas = [s._remote.replica() for s in [ds["raw"]] + list(ds["zz"].shards)]
        counted = sum(r.fetched for r in replicas)
        rng = np.random.default_rng(1)
        faults.reset_counts()
        payload = 0
        for _ in range(5):
            idx = rng.choice(N, 16, replace=False)
            for name in ("raw", "zz"):
                ds[name][idx]
            payload += 2 * 16 * REC
        _settled(replicas)  # (the whole index of a shard, fetched in the background)
        got = faults.body_bytes(lambda m, p: m == "GET")
        assert payload <= got <= 1.5 * payload, (got, payload)
        # What the replicas count as fetched (the bench's figures) is what
        # crossed the network: index and data downloads overlap on two
        # threads, and the count lost one's bytes when they did.
        assert sum(r.fetched for r in replicas) - counted == got
        # Warm: nothing more crosses the network.
        before = faults.body_bytes()
        ds["raw"][idx]
        assert faults.body_bytes() == before
    finally:
        for s in ds.values():
            s.close()


def _settled(replicas) -> None:
    for r in replicas:
        if r.whole_index is not None:
            r.whole_index.join(30)
            assert not r.whole_index.is_alive()


@contextlib.contextmanager
def zz_shard(tmp_path, s3, url, proxy):
    """Shard 0 of the dataset's zstd column through the fault proxy (200
    records of 3,000 B, a 6,400 B table in 13 blocks of 512 B), its replica,
    and a blank record of requests."""
    base, faults = proxy
    store = loaderx.open_store(f"{url}/{ZZ}0", cache_dir=str(tmp_path / "cache"),
                               storage_options=s3.options(base))
    try:
        r = store._remote.replica()
        assert r.info().index_size == 6400 and r.info().index_blocks == 13
        faults.reset_counts()
        yield store, r
    finally:
        store.close()


def _index_missing(r) -> int:
    """Index blocks not present."""
    info = r.info()
    return int(info.index_missing) >> int(info.index_shift)


def _gets(faults, obj: str, what: str = "bytes") -> int:
    """Body bytes (or the count) of the GETs of one of a store's objects."""
    match = (lambda m, p: m == "GET" and p.endswith("/" + obj))
    return faults.body_bytes(match) if what == "bytes" else faults.count(match)


def test_a_small_index_comes_whole_with_the_first_cold_batch(
        tmp_path, s3, url, proxy, data, monkeypatch):
    # Two records' entries would cost two GETs, worth more than the whole
    # table (INDEX_REQUEST_BYTES a GET): the table comes whole, in requests
    # of WHOLE_INDEX_CHUNK bytes, with the batch; later batches GET data only.
    monkeypatch.setitem(_cachedir.CACHE_POLICY, "whole_index_chunk", 2048)
    dense, _ = data
    faults = proxy[1]
    with zz_shard(tmp_path, s3, url, proxy) as (store, r):
        assert_same(store[np.array([3, 150])], dense[[3, 150]])
        assert not _index_missing(r)
        assert r.whole_index is None  # (no background fetch: it came with the batch)
        index_gets = _gets(faults, "index", "count")
        assert index_gets == 4, index_gets  # 6,400 B in requests of 2,048 B
        assert _gets(faults, "index") == 6400
        faults.reset_counts()
        later = np.array([100, 120, 199])
        assert_same(store[later], dense[later])
        assert _gets(faults, "index", "count") == 0


def test_an_index_over_the_batch_cap_does_not_come_with_a_batch(
        tmp_path, s3, url, proxy, data, monkeypatch):
    # The same table, worth two GETs, but over INDEX_WITH_BATCH_MAX: the
    # batch fetches its own two blocks only.
    monkeypatch.setitem(_cachedir.CACHE_POLICY, "index_with_batch_max", 4096)
    dense, _ = data
    with zz_shard(tmp_path, s3, url, proxy) as (store, r):
        assert_same(store[np.array([3, 150])], dense[[3, 150]])
        # Blocks 0 and 9, 4 KiB apart: one request of blocks 0-9 (the gap's
        # bytes read and dropped), two blocks kept.
        assert _gets(proxy[1], "index") == 10 * 512
        assert _index_missing(r) == 11


def _three_cold_batches(store, dense):
    """Records in index blocks 0 and 9 (one request), 12, then 6."""
    for idx in ([3, 150], [199], [100]):
        assert_same(store[np.array(idx)], dense[idx])
        yield idx


def test_index_gets_add_up_to_the_whole_index(tmp_path, s3, url, proxy, data, monkeypatch):
    # A GET worth 2,048 B: one batch's GET of its blocks is worth less than
    # the table, and so are two; the third batch's GET with the two before
    # it is worth more than what is missing, so it brings the table whole.
    monkeypatch.setitem(_cachedir.CACHE_POLICY, "index_request_bytes", 2048)
    dense, _ = data
    with zz_shard(tmp_path, s3, url, proxy) as (store, r):
        cold = _three_cold_batches(store, dense)
        next(cold)
        assert _index_missing(r) == 11 and r.info().index_gets == 1
        next(cold)
        assert _index_missing(r) == 10 and r.info().index_gets == 2
        assert r.whole_index is None  # 2 x 2,048 B < 5,120 B missing
        next(cold)
        assert not _index_missing(r)
        assert r.whole_index is None  # it came with the batch


def test_index_gets_over_the_batch_cap_bring_the_index_in_the_background(
        tmp_path, s3, url, proxy, data, monkeypatch):
    # As above with the table over INDEX_WITH_BATCH_MAX: each batch fetches
    # its own blocks, and once their GETs are worth the missing table it
    # comes whole in the background (the data fetched never outweighs it
    # here: WHOLE_INDEX_AFTER set out of reach).
    monkeypatch.setitem(_cachedir.CACHE_POLICY, "index_request_bytes", 2048)
    monkeypatch.setitem(_cachedir.CACHE_POLICY, "index_with_batch_max", 4096)
    monkeypatch.setitem(_cachedir.CACHE_POLICY, "whole_index_after", 1 << 40)
    dense, _ = data
    faults = proxy[1]
    with zz_shard(tmp_path, s3, url, proxy) as (store, r):
        cold = _three_cold_batches(store, dense)
        next(cold)
        next(cold)
        assert r.whole_index is None and r.info().index_gets == 2
        next(cold)
        assert r.info().index_gets == 3  # 6,144 B worth > 4,608 B missing
        _settled([r])
        assert r.whole_index is not None and not _index_missing(r)
        faults.reset_counts()
        later = np.array([20, 60, 120])
        assert_same(store[later], dense[later])
        assert _gets(faults, "index") == 0


def test_the_whole_index_is_fetched_once_the_data_fetched_outweighs_it(
        tmp_path, s3, url, proxy, data, monkeypatch):
    # Where a GET costs less than the table (INDEX_REQUEST_BYTES set low, as
    # for a large index) a few records fetch their own index blocks only;
    # once the process has fetched 4x the index's missing bytes in data, the
    # rest of the index comes whole, in the background, and a cold batch
    # then GETs data only.
    monkeypatch.setitem(_cachedir.CACHE_POLICY, "index_request_bytes", 512)
    dense, _ = data
    faults = proxy[1]
    with zz_shard(tmp_path, s3, url, proxy) as (store, r):
        assert_same(store[np.array([3, 150])], dense[[3, 150]])
        assert r.whole_index is None and _index_missing(r)
        rng = np.random.default_rng(4)
        first = rng.choice(np.arange(4, 100), 12, replace=False)  # 36 KB > 4 x 6,400 B
        assert_same(store[first], dense[first])
        _settled([r])
        assert r.whole_index is not None
        assert not _index_missing(r)
        assert r.fetched <= 1.5 * r.info().fetched_data  # the index, whole, a share of the data
        faults.reset_counts()
        later = np.array([100, 120, 199])
        assert_same(store[later], dense[later])  # cold records, their entries known
        assert _gets(faults, "index") == 0
        assert _gets(faults, "data") > 0
        # ... and no HEAD: the data's bytes are checked against the index
        # (of the version opened), so their GETs need no version check after.
        assert faults.count(lambda m, p: m == "HEAD") == 0
        assert r.info().whole_started  # (once per process: never due again)


def test_first_batch_of_a_large_store_fetches_a_sliver_of_its_index(tmp_path, s3):
    """No full index download before the first batch: 10^6 records (a 32 MB
    table), a batch reads a few KiB of it."""
    n = 1_000_000
    local = str(tmp_path / "big")
    st = loaderx.Zrecord(local, create=True)
    st.append_packed(np.arange(n, dtype=np.uint8), np.arange(n + 1, dtype=np.int64))
    st.close()
    url = s3.upload_dir(local, "big/store")
    server, base, faults = fault_proxy(s3.endpoint)
    try:
        store = loaderx.open_store(url, cache_dir=str(tmp_path / "c"),
                                   storage_options=s3.options(base))
        idx = np.array([3, 999_999, 500_000])
        assert store[idx] == [bytes([i % 256]) for i in idx]
        index_bytes = faults.body_bytes(lambda m, p: m == "GET" and p.endswith("/index"))
        assert 0 < index_bytes <= 3 * 4096, index_bytes
        store.close()
    finally:
        server.shutdown()


def test_close_ranges_are_fetched_as_asked_not_merged_by_the_client(tmp_path, s3, proxy):
    # Records 128 KiB apart: every gap is more than the cache's 4 KiB merge
    # gap, and all lie within obstore's 1 MiB coalescing distance, which
    # would fetch the gaps too if they went out in one get_ranges call.
    base, faults = proxy
    rec = 64 << 10
    arr = np.random.default_rng(3).integers(0, 256, (48, rec), np.uint8)
    loaderx.from_numpy(str(tmp_path / "s"), arr, codec="raw").close()
    url = s3.upload_dir(str(tmp_path / "s"), "spaced/s")
    store = loaderx.open_store(url, cache_dir=str(tmp_path / "c"),
                               storage_options=s3.options(base))
    try:
        faults.reset_counts()
        idx = np.arange(0, 48, 3)
        assert_same(store[idx], arr[idx])
        data_get = lambda m, p: m == "GET" and p.endswith("/data")  # noqa: E731
        assert faults.count(data_get) == len(idx)
        assert len(idx) * rec <= faults.body_bytes(data_get) <= len(idx) * rec * 1.1
    finally:
        store.close()


def test_prefetch_is_idempotent_thread_safe_and_makes_reads_local(tmp_path, s3, url, proxy, data):
    """Stand-ins for the loader's prefetch thread: three threads prefetch
    overlapping steps (each one all of them, from a different start) while
    the first half of them is read; the second half, read afterwards, fetches
    nothing."""
    dense, _ = data
    base, faults = proxy
    ds = opened(url, tmp_path / "cache", s3, base, columns=["raw", "zz"])
    steps = [np.random.default_rng(s).choice(N, 12, replace=False) for s in range(12)]
    import threading
    errors, started, overlapped = [], threading.Barrier(4), []

    def prefetcher(k):
        try:
            started.wait(30)
            for s in steps[4 * k:] + steps[:4 * k]:
                for col in ds.values():
                    col.prefetch(s)
                    col.prefetch(s)  # idempotent
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=prefetcher, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        started.wait(30)
        for s in steps[:6]:  # read while the prefetches run
            overlapped.append(any(t.is_alive() for t in threads))
            for name in ("raw", "zz"):
                assert_same(ds[name][s], dense[s])
    finally:
        for t in threads:
            t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert overlapped[0]  # (at least the first step was read while they ran)
    faults.reset_counts()
    for s in steps[6:] + steps[:6]:
        for name in ("raw", "zz"):
            assert_same(ds[name][s], dense[s])
        for col in ds.values():
            col.prefetch(s)  # again: nothing left to fetch
    assert faults.body_bytes() == 0  # everything was prefetched
    # What a step costs the loader's prefetch_bytes budget: stored bytes.
    assert ds["raw"].prefetch_size(steps[0]) == 12 * REC
    assert ds["zz"].prefetch_size(steps[0]) == sum(
        s.stats()["live_bytes"] // len(s) for s in ds["zz"].shards) // 2 * 12
    for col in ds.values():
        col.close()


def test_prefetch_warm_fetches_nothing_and_says_whether_records_are_cached(
        tmp_path, s3, url, local_ds):
    ds = opened(url, tmp_path / "cache", s3, columns=["raw", "rag"])
    local = loaderx.open_dataset(local_ds, columns=["raw"])
    try:
        for name in ("raw", "rag"):
            col = ds[name]
            fetched = col._remote.replica().fetched
            assert col.prefetch_warm([3, 9, 40]) is False
            assert col._remote.replica().fetched == fetched  # nothing fetched
            col.prefetch([3, 9])
            assert col.prefetch_warm([3, 9]) is True
            assert col.prefetch_warm([3, 9, 40]) is False
            # A view asks its base for the records it maps to.
            view = loaderx.select({name: col}, np.array([9, 3, 40]))[name]
            assert view.prefetch_warm([0, 1]) is True and view.prefetch_warm([2]) is False
        # A local store has nothing to fetch: it says False (its prefetch is
        # readahead, which the loader leaves to the native ring).
        assert local["raw"].prefetch_warm([0]) is False
    finally:
        for s in list(ds.values()) + list(local.values()):
            s.close()


def test_a_warm_dense_gather_is_one_native_call_and_a_miss_takes_the_full_start(
        tmp_path, s3, url, data, monkeypatch):
    dense, _ = data
    ds = opened(url, tmp_path / "cache", s3, columns=["raw"])
    store = ds["raw"]
    begins = []
    full = remote.Binding.begin
    monkeypatch.setattr(remote.Binding, "begin",
                        lambda self, *a, **k: begins.append(1) or full(self, *a, **k))
    try:
        idx = np.array([4, 40, 399, 7])
        assert_same(store[idx], dense[idx])  # cold: the full start, fetched and checked
        assert len(begins) == 1
        for _ in range(3):  # warm: lx_gather_cached alone
            assert_same(store[idx], dense[idx])
            assert_same(store.gather(idx[::-1]), dense[idx[::-1]])
        assert len(begins) == 1
        assert_same(store[[4, 5]], dense[[4, 5]])  # 5 is not cached: a miss, then the full start
        assert len(begins) == 2
        st = store._remote.cache.stats()
        assert st.reads == 0 and st.read_mark == NONE  # nothing left in flight
        with pytest.raises(IndexError):
            store[np.array([4, N])]
    finally:
        store.close()
