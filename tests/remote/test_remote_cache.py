"""The remote cache within one process (src/Cache.zig, src/Replica.zig through
loaderx._cachedir): limits kept, eviction around prefetched steps, the
stamps a read leaves in the mapped state (tests/_lxlayout.py), a dead
evictor's sequence repaired, damaged or deleted caches rebuilt and never
trusted, and the `loaderx cache` command."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")

import loaderx  # noqa: E402
from loaderx import _cachedir  # noqa: E402

from _helpers import assert_same  # noqa: E402
from _remote_helpers import (  # noqa: E402
    N,
    NONE,
    RAW,
    REC,
    SEQ,
    _env,
    cache_head,
    opened,
    replica_state,
)

pytestmark = pytest.mark.slow


def test_cache_limit_is_kept_and_a_prefetched_step_is_never_evicted(tmp_path, s3, url, proxy,
                                                                     data):
    dense, _ = data
    base, faults = proxy
    limit = 40 * REC
    ds = opened(url, tmp_path / "cache", s3, base, columns=["raw"], cache_limit=limit)
    store = ds["raw"]
    cache = store._remote.cache
    try:
        step = np.array([1, 2, 3, 250])
        store.prefetch(step)  # the loader's next step
        data_get = lambda m, p: m == "GET" and p.endswith("/data")  # noqa: E731
        rng = np.random.default_rng(3)
        for _ in range(30):  # reads that need eviction
            idx = rng.choice(N, 8, replace=False)
            assert_same(store[idx], dense[idx])
            assert cache.used() <= limit + 4 * REC + 8 * (REC + 8192)
        # Evictions ran, each between an odd and an even eviction sequence.
        seq = int(cache.stats().seq)
        assert seq > 0 and seq % 2 == 0
        # The prefetched step's records are still there: no fetch to read them.
        before = faults.body_bytes(data_get)
        assert_same(store[step], dense[step])
        assert faults.body_bytes(data_get) == before
        # Later prefetches release it (PIN_CALLS of them); then it may go.
    finally:
        store.close()


def test_a_cache_limit_below_one_batch_overflows_instead_of_deadlocking(tmp_path, s3, url, data):
    dense, _ = data
    ds = opened(url, tmp_path / "cache", s3, columns=["raw"], cache_limit=REC)
    store = ds["raw"]
    try:
        with pytest.warns(RuntimeWarning, match="over its limit"):
            got = store[np.arange(50)]
        assert_same(got, dense[:50])
        assert_same(store[np.arange(50, 100)], dense[50:100])
    finally:
        store.close()
    with pytest.raises(ValueError, match="cache_limit"):
        opened(url, tmp_path / "cache", s3, cache_limit="lots")


def test_a_cache_on_a_nearly_full_disk_warns_and_reads_exact_records(tmp_path, s3, url, data,
                                                                    monkeypatch):
    """Without a cache_limit the cache leaves a share of its file system free;
    when that leaves it less than the share, it says so once (a training run
    would fetch its data again and again) and reads stay exact."""
    dense, _ = data
    monkeypatch.delenv("LOADERX_CACHE_LIMIT", raising=False)
    # The whole disk as the reserve: nothing fits.
    monkeypatch.setitem(_cachedir.CACHE_POLICY, "free_reserve_ppm", 1_000_000)
    ds = opened(url, tmp_path / "cache", s3, columns=["raw"])
    store = ds["raw"]
    try:
        with pytest.warns(RuntimeWarning, match="bytes free and the cache leaves"):
            assert_same(store[np.arange(40)], dense[:40])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per process
            assert_same(store[np.arange(40, 80)], dense[40:80])
            assert_same(store[np.arange(40)], dense[:40])
    finally:
        store.close()
    ds = opened(url, tmp_path / "cache2", s3, columns=["raw"], cache_limit="1GiB")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an explicit limit: the free space is not asked
            assert_same(ds["raw"][np.arange(40)], dense[:40])
    finally:
        ds["raw"].close()


def test_threads_gathering_under_a_tight_cache_limit_read_exact_records(tmp_path, s3, url, data):
    # Warm gathers (no lock) on four threads while their cold misses fetch
    # and evict: every batch exact, nothing left in flight.
    dense, _ = data
    ds = opened(url, tmp_path / "cache", s3, columns=["raw"], cache_limit=60 * REC)
    store = ds["raw"]
    errors = []

    def reader(seed):
        rng = np.random.default_rng(seed)
        hot = rng.choice(N, 6, replace=False)
        try:
            for k in range(40):
                idx = hot if k % 2 else rng.choice(N, 6, replace=False)
                got = store[idx]
                if not np.array_equal(got, dense[idx]):
                    errors.append((seed, k))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors[:3]
        st = store._remote.cache.stats()
        assert st.reads == 0
        assert st.seq > 0  # evictions ran meanwhile
    finally:
        store.close()


def test_a_read_stamps_every_region_of_a_record_many_regions_long(tmp_path, s3):
    # A ragged store's regions are a few mean records long; one record 2,000
    # times the mean spans many. Every one is stamped, so eviction keeps the
    # middle of a long record a reader is reading, not just its two ends.
    rng = np.random.default_rng(11)
    recs = [rng.integers(0, 1 << 30, size=30, dtype=np.int32) for _ in range(400)]
    recs[200] = rng.integers(0, 1 << 30, size=60_000, dtype=np.int32)
    loaderx.from_iterator(str(tmp_path / "long"), recs, codec="raw").close()
    url = s3.upload_dir(str(tmp_path / "long"), "long-record")
    store = loaderx.open_store(url, cache_dir=str(tmp_path / "cache"),
                               storage_options=s3.options())
    try:
        assert np.array_equal(store[200], recs[200])
        r = store._remote.replica()
        s, e = r.spans(np.array([200]))
        rsh = int(r.info().data_shift) + 6
        first, last = int(s[0]) >> rsh, (int(e[0]) - 1) >> rsh
        assert last - first >= 3  # the record spans more than two regions
        fetched = r.fetched
        tick = store._remote.begin(np.array([200]))
        store._remote.end(tick)
        assert r.fetched == fetched  # present and checked: nothing fetched
        atime = replica_state(r)["atime"]
        assert (atime[first:last + 1] == tick).all()
        assert (atime[:first] < tick).all() and (atime[last + 1:] < tick).all()
    finally:
        store.close()


@pytest.mark.parametrize("column", ["raw", "rag"])
def test_a_read_stamps_exactly_its_records_regions_and_fetches_only_the_unchecked(
        tmp_path, s3, url, column):
    # The native start of a read (src/Replica.zig, src/Cache.zig: the tick,
    # the watermark, the stamps, the unchecked records) against the layout
    # in numpy: a raw dense store's fixed records, a ragged store's entries.
    ds = opened(url, tmp_path / "cache", s3, columns=[column])
    store = ds[column].shards[0] if hasattr(ds[column], "shards") else ds[column]
    try:
        b, r = store._remote, store._remote.replica()
        info = r.info()
        rng = np.random.default_rng(5)
        warm = rng.choice(int(info.record_count), 40, replace=False)
        store[np.sort(warm)]  # fetched and checked (entries too)
        state = replica_state(r)
        atime, ptime = state["atime"], state["ptime"]
        for pin in (False, True):
            before_a, before_p = atime.copy(), ptime.copy()
            u = np.concatenate([warm[:25], [-1, int(info.record_count)]]).astype(np.int64)
            st = r.cache.stats()
            mark = (st.pin_mark if pin else st.read_mark)
            assert mark == NONE  # no read in flight, no prefetch kept
            fetched = r.fetched
            tick = b.begin(u, pin=pin)
            st = r.cache.stats()
            assert r.fetched == fetched  # every record of u in range was checked
            if pin:
                assert tick == 0 and st.pin_mark == st.tick  # a prefetch: no read to end
                tick = int(st.tick)
            else:
                assert tick == st.tick  # the tick taken
            # The slot held none: the read's tick protects its regions now.
            assert (st.pin_mark if pin else st.read_mark) == tick
            if pin:
                r.cache.evict(unpin=True)
            else:
                b.end(tick)
            st = r.cache.stats()
            assert (st.pin_mark if pin else st.read_mark) == NONE
            s, e = r.spans(warm[:25])
            rsh = int(info.data_shift) + 6
            regions = np.unique(np.concatenate([np.arange(lo >> rsh, ((hi - 1) >> rsh) + 1)
                                                for lo, hi in zip(s, e) if hi > lo]))
            want_a = before_a.copy()
            want_a[regions] = tick
            assert (atime == want_a).all()
            want_p = before_p.copy()
            if pin:
                want_p[regions] = tick
            assert (ptime == want_p).all()
        # Records this process has not checked are fetched (what of them is
        # missing: their blocks may be cached with their neighbours') and
        # checked: a warm prefetch says no before, and yes after.
        fresh = np.setdiff1d(np.arange(int(info.record_count)), warm)[:3].astype(np.int64)
        u = np.concatenate([fresh[::-1], warm[:2]]).astype(np.int64)
        assert not b.pin_warm(u)
        data = r.info().fetched_data
        b.end(b.begin(u))
        assert b.pin_warm(u)
        s, e = r.spans(fresh)
        block = 1 << int(info.data_shift)
        assert int(r.info().fetched_data) - data <= int((e - s).sum()) + 3 * (2 * block + 4096)
    finally:
        store.close()


def test_a_read_meeting_a_dead_evictors_sequence_waits_for_the_lock_and_repairs_it(
        tmp_path, s3, url, data):
    # A read takes no lock unless the cache's eviction sequence is odd (an
    # eviction runs, or died running): then it waits for the lock and, the
    # holder gone, makes the sequence even. Its records are checked again.
    import fcntl
    dense, _ = data
    ds = opened(url, tmp_path / "cache", s3, columns=["raw"])
    store = ds["raw"]
    try:
        idx = np.array([1, 5, 9])
        assert_same(store[idx], dense[idx])
        cache = store._remote.cache
        r = store._remote.replica()
        head, state = cache_head(cache), replica_state(r)
        fd = os.open(os.path.join(cache.root, "lock"), os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)  # the evictor, holding the lock
        head[SEQ] += np.uint64(1)  # ... in the middle of an eviction
        state["head"][state["evictions"]] += np.uint64(1)  # ... that evicted from this replica
        threading.Timer(0.3, lambda: os.close(fd)).start()  # then dies
        t0 = time.monotonic()
        assert_same(store[idx], dense[idx])
        assert time.monotonic() - t0 >= 0.25  # it waited for the lock
        assert int(cache.stats().seq) % 2 == 0
        info = r.info()
        assert info.checked_at == info.evictions  # checked again, after the eviction
        # With the sequence even again, a read takes no lock: it reads while
        # another process holds it.
        fd = os.open(os.path.join(cache.root, "lock"), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            assert_same(store[idx], dense[idx])
        finally:
            os.close(fd)
    finally:
        store.close()


def test_a_tampered_or_torn_cache_is_refetched_never_returned(tmp_path, s3, url, data):
    dense, _ = data
    cache = tmp_path / "cache"
    ds = opened(url, cache, s3, columns=["zz"])
    store = ds["zz"].shards[0]
    idx = np.arange(10)
    assert_same(store[idx], dense[idx])
    replica = store._remote.local_dir
    store.close()
    # Damage the cached bytes: garbage over record data, and a "present"
    # block of zeros (what a power loss can leave: the bit without the bytes).
    with open(os.path.join(replica, "data"), "r+b") as f:
        f.seek(100)
        f.write(b"\xff" * 300)
        f.seek(2 * REC)
        f.write(bytes(REC))
    # A new process (this one has checked those records already).
    code = ("import sys, numpy as np, loaderx\n"
            "url, cache, endpoint = sys.argv[1:4]\n"
            "opts = {'endpoint': endpoint, 'access_key_id': 'testing', "
            "'secret_access_key': 'testing', 'region': 'us-east-1', 'allow_http': 'true'}\n"
            "ds = loaderx.open_dataset(url, columns=['zz'], cache_dir=cache, storage_options=opts)\n"
            "sys.stdout.buffer.write(ds['zz'][np.arange(10)].tobytes())\n")
    out = subprocess.run([sys.executable, "-c", code, url, str(cache), s3.endpoint],
                         env=_env(), capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout == dense[idx].tobytes()


def test_a_cache_directory_deleted_between_opens_is_made_anew_not_trusted(tmp_path, s3, url,
                                                                          data):
    dense, _ = data
    cache = tmp_path / "cache"
    for _ in range(2):
        ds = opened(url, cache, s3, columns=["raw"])
        assert_same(ds["raw"][[1, 2, 300]], dense[[1, 2, 300]])
        ds["raw"].close()
        shutil.rmtree(cache)


def test_a_damaged_replica_is_moved_aside_and_rebuilt_at_the_next_open(tmp_path, s3, url, data):
    dense, _ = data
    cache = tmp_path / "cache"
    idx = np.array([1, 2, 300])

    def read() -> str:
        store = loaderx.open_store(f"{url}/{RAW}", cache_dir=str(cache),
                                   storage_options=s3.options())
        try:
            assert_same(store[idx], dense[idx])
            return store._remote.local_dir
        finally:
            store.close()
    where = read()
    for damage in ("cache.state", "meta", "index", "data.fetch"):
        if damage == "index":  # half of it cut off
            with open(os.path.join(where, "index"), "r+b") as f:
                f.truncate(os.path.getsize(f.name) // 2)
        else:
            os.remove(os.path.join(where, damage))
        assert read() == where, damage  # the same replica, made again
        assert os.listdir(cache / "stores") == [os.path.basename(where)]  # nothing left aside


_HOLDER = r"""
import sys, numpy as np, loaderx
url, cache, endpoint = sys.argv[1:4]
opts = {"endpoint": endpoint, "access_key_id": "testing", "secret_access_key": "testing",
        "region": "us-east-1", "allow_http": "true"}
ds = loaderx.open_dataset(url, columns=["raw"], cache_dir=cache, storage_options=opts)
ds["raw"][np.arange(0, 400, 3)]
print("ready", flush=True)
sys.stdin.read()  # holds the cache until its stdin ends
"""


def test_the_cache_command_lists_replicas_and_clears_only_an_unused_cache(tmp_path, s3, url,
                                                                           data):
    import json

    dense, _ = data
    cache = tmp_path / "cache"
    env = dict(_env(), **s3.env, LOADERX_CACHE_DIR=str(cache))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "loaderx", "cache", *args], env=env,
                              capture_output=True, text=True, timeout=120)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, url, str(cache), s3.endpoint],
                              env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        report = json.loads(cli("--json").stdout)  # the default directory: LOADERX_CACHE_DIR
        assert report["root"] == os.path.realpath(cache)
        assert report["processes"] == [holder.pid]
        (rep,) = report["replicas"]
        assert rep["url"] == f"{url}/{RAW}" and rep["records"] == N
        assert rep["size_bytes"] == N * (REC + 4)  # data and a raw store's 4 B index entries
        # 134 records of 3,000 B were read: at least those, not everything.
        assert 134 * REC <= rep["cached_bytes"] < rep["size_bytes"]
        assert report["cached_bytes"] == rep["cached_bytes"] <= report["disk_bytes"]
        out = cli()
        assert out.returncode == 0 and f"in use by 1 process (pid {holder.pid})" in out.stdout
        assert f"{url}/{RAW}: " in out.stdout and f"{N:,} records" in out.stdout
        out = cli("--clear")
        assert out.returncode == 1 and f"in use by process {holder.pid}" in out.stderr
        assert json.loads(cli("--json").stdout)["cached_bytes"] == rep["cached_bytes"]
    finally:
        holder.communicate(timeout=60)
    # A conversion killed while uploading left its staging directory; one
    # still running (here: this process, holding its own) keeps it.
    left = cache / "uploads" / "0123456789abcdef"
    left.mkdir(parents=True)
    (left / "data").write_bytes(b"x" * 100_000)
    interrupted = cache / ".cleared-0badc0de"  # a clear killed before it removed its files
    (interrupted / "stores").mkdir(parents=True)
    with _cachedir.Cache.get(str(cache)).staging() as live:
        report = json.loads(cli("--json").stdout)
        assert report["processes"] == []
        assert (report["uploads_live"], report["uploads_left"]) == (1, 1)
        assert report["uploads_left_bytes"] >= 100_000
        assert "left by killed conversions: 1 staging directory" in cli().stdout
        out = cli("--clear")
        assert out.returncode == 0 and out.stdout.startswith(f"cleared {os.path.realpath(cache)}")
        assert os.path.isdir(live) and not left.exists() and not interrupted.exists()
    report = json.loads(cli("--json").stdout)
    assert (report["replicas"], report["cached_bytes"], report["uploads_left"]) == ([], 0, 0)
    assert not os.path.exists(live)
    # The cache works on after a clear: records are fetched again, exact.
    ds = opened(url, cache, s3)
    try:
        assert_same(ds["raw"][np.array([3, 399])], dense[[3, 399]])
    finally:
        ds["raw"].close()
    out = cli(str(tmp_path / "nothing-here"))
    assert out.returncode == 1 and "not a loaderx cache directory" in out.stderr
