"""Remote datasets (loaderx.remote, the native cache through
loaderx._cachedir, loaderx._objstore) against real servers on loopback:
moto's S3, a Range-honouring HTTP server and a fault-injecting proxy that
counts the bytes it forwards. Tests that look inside the cache's mapped
state use the layout generated from src/cache_format.zig (tests/_lxlayout.py)."""
from __future__ import annotations

import contextlib
import os
import re
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
from loaderx import _cachedir, remote  # noqa: E402
from loaderx.errors import (  # noqa: E402
    CorruptStoreError,
    ReadOnlyError,
    RemoteChangedError,
    RemoteIOError,
    RemoteNotFoundError,
    RemotePermissionError,
)

from _helpers import assert_same  # noqa: E402
from _lxlayout import (  # noqa: E402
    CACHE_HEAD_OFFSETS,
    CACHE_PAGE,
    CACHE_STATE_SIZE,
    REPLICA_HEAD_OFFSETS,
)
from _servers import MotoS3, fault_proxy, range_server  # noqa: E402

REC = 3000  # bytes of a dense record
# The parts of the test dataset, below its generation directory.
RAW = "gen-000001/raw/part-00000"
ZZ = "gen-000001/zz/part-0000"
N = 400


@pytest.fixture(scope="module")
def s3():
    server = MotoS3()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    dense = rng.integers(0, 256, size=(N, REC), dtype=np.uint8)
    ragged = [rng.integers(0, 1000, size=int(rng.integers(0, 60)), dtype=np.int32)
              for _ in range(N)]
    return dense, ragged


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory, data):
    """A local dataset directory: a raw dense column, a zstd dense column in
    two shards, a ragged column (the converter's layout)."""
    dense, ragged = data
    root = str(tmp_path_factory.mktemp("ds") / "ds")
    loaderx.convert({"raw": dense, "z": dense.reshape(N, 30, 100)}, root, codec="raw",
                    progress="off")
    # Add a zstd column split into two shards and a ragged one by hand.
    man = loaderx.dataset.read_manifest(root)
    half = N // 2
    gen = man.get("generation", ".")  # the generation directory (manifest version 2)
    for k, part in enumerate((dense[:half], dense[half:])):
        loaderx.from_numpy(f"{root}/{gen}/zz/part-{k:05d}", part, codec="zstd").close()
    loaderx.from_iterator(f"{root}/{gen}/rag/part-00000", ragged).close()
    pre = "" if gen == "." else f"{gen}/"
    man["columns"]["zz"] = {"kind": "dense", "dtype": "uint8", "item_shape": [REC], "codec": "zstd",
                            "shards": [{"path": f"{pre}zz/part-{k:05d}", "rows": half}
                                       for k in (0, 1)]}
    man["columns"]["rag"] = {"kind": "ragged", "dtype": "int32", "item_shape": None,
                             "codec": "zstd", "shards": [{"path": f"{pre}rag/part-00000",
                                                          "rows": N}]}
    import json
    with open(f"{root}/loaderx.json", "w") as f:
        json.dump(man, f)
    return root


@pytest.fixture(scope="module")
def url(s3, local_ds):
    return s3.upload_dir(local_ds, "datasets/ds")


@pytest.fixture
def proxy(s3):
    server, base, faults = fault_proxy(s3.endpoint)
    yield base, faults
    faults.release.set()  # (ends any "hang")
    server.shutdown()


NONE = 2**64 - 1  # a watermark with nothing behind it


def replica_state(r) -> dict:
    """A replica's mapped ``cache.state`` as numpy arrays (the layout
    src/cache_format.zig documents): head words by name, the bitmaps and ticks."""
    info = r.info()
    mm = np.memmap(os.path.join(r.dir, "cache.state"), np.uint8, "r+")
    head = mm[:CACHE_PAGE].view(np.uint64)
    words = mm[CACHE_PAGE:].view(np.uint64)
    iw, n = -(-int(info.index_blocks) // 64), int(info.regions)
    return {"head": head, "evictions": REPLICA_HEAD_OFFSETS["evictions"] // 8,
            "ibits": words[:iw], "dwords": words[iw:iw + n], "atime": words[iw + n:iw + 2 * n],
            "ptime": words[iw + 2 * n:iw + 3 * n]}


def cache_head(cache) -> np.ndarray:
    """The cache's mapped ``state`` head (u64 words; CACHE_HEAD_OFFSETS)."""
    mm = np.memmap(os.path.join(cache.root, "state"), np.uint8, "r+", shape=(CACHE_STATE_SIZE,))
    return mm[:CACHE_PAGE].view(np.uint64)


SEQ = CACHE_HEAD_OFFSETS["seq"] // 8


def opened(url, cache, s3, endpoint=None, **kw):
    return loaderx.open_dataset(url, cache_dir=str(cache), storage_options=s3.options(endpoint),
                                **kw)


def test_a_dataset_uploaded_by_any_tool_reads_byte_for_byte_as_the_local_copy(
        tmp_path, s3, url, local_ds, data):
    dense, ragged = data
    ds = opened(url, tmp_path / "cache", s3)
    local = loaderx.open_dataset(local_ds)
    try:
        assert list(ds) == list(local)
        idx = np.array([5, N - 1, 0, 5, 200, 199])
        for name in ("raw", "z", "zz"):
            assert_same(ds[name][idx], local[name][idx])
            col = ds[name]
            assert (col.shards[0] if name == "zz" else col).path.startswith("s3://")
        got = ds["rag"][idx]
        for g, i in zip(got, idx):
            assert_same(g, ragged[i])
        values, splits = ds["rag"].gather(idx, packed=True) if hasattr(ds["rag"], "gather") \
            else (None, None)
        if values is not None:
            assert_same(values, np.concatenate([ragged[i] for i in idx]))
        assert_same(ds["raw"][:], dense)
        assert repr(ds["raw"]).startswith("DenseStore('s3://")
    finally:
        for s in list(ds.values()) + list(local.values()):
            s.close()


def test_remote_stores_refuse_every_mutation_naming_the_url(tmp_path, s3, url):
    store = loaderx.open_store(f"{url}/{RAW}", cache_dir=str(tmp_path),
                               storage_options=s3.options())
    try:
        with pytest.raises(ReadOnlyError, match="s3://.*read-only"):
            store.append(np.zeros((1, REC), np.uint8))
        with pytest.raises(ReadOnlyError):
            store.delete([0])
    finally:
        store.close()
    with pytest.raises(ReadOnlyError, match="cannot be created"):
        loaderx.DenseStore(f"{url}/new", np.uint8, (3,))


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


def test_server_bytes_that_fail_their_checksum_raise_corrupt_store(tmp_path, data):
    """An HTTP server whose data bytes were damaged (same ETag)."""
    dense, _ = data
    root = tmp_path / "www"
    loaderx.from_numpy(str(root / "s"), dense, codec="raw").close()
    server, base = range_server(str(root), fixed_etag='"v1"')
    try:
        store = loaderx.open_store(f"{base}/s", cache_dir=str(tmp_path / "c"))
        assert_same(store[[1, 2]], dense[[1, 2]])
        with open(root / "s" / "data", "r+b") as f:
            f.seek(7 * REC + 5)
            f.write(b"\x00\x01")
        with pytest.raises(CorruptStoreError, match=r"record 7 fails its checksum as the server"):
            store[[7]]
        assert_same(store[[1, 2]], dense[[1, 2]])  # what was read stays readable
        store.close()
    finally:
        server.shutdown()


def test_an_https_style_server_serves_a_dataset(tmp_path, local_ds, data):
    dense, ragged = data
    server, base = range_server(os.path.dirname(local_ds))
    try:
        ds = loaderx.open_dataset(f"{base}/ds", cache_dir=str(tmp_path / "c"))
        idx = [3, 1, 399]
        assert_same(ds["z"][idx], dense.reshape(N, 30, 100)[idx])
        for g, i in zip(ds["rag"][idx], idx):
            assert_same(g, ragged[i])
        for s in ds.values():
            s.close()
    finally:
        server.shutdown()


def test_gcs_and_azure_urls_read_a_dataset_through_their_own_clients(tmp_path, local_ds, data):
    """gs:// and az:// go through obstore's Google and Azure clients (their
    request paths and signing), pointed at a loopback server by their own
    settings: a service account's gcs_base_url, an Azure endpoint."""
    import base64
    import json

    dense, ragged = data
    root = tmp_path / "served"
    shutil.copytree(local_ds, root / "bkt" / "some" / "ds")
    server, base = range_server(str(root))
    gcs_key = json.dumps({"disable_oauth": True, "client_email": "", "private_key": "",
                          "private_key_id": "", "gcs_base_url": base})
    setups = {
        "gs://bkt/some/ds": {"google_service_account_key": gcs_key, "allow_http": True},
        "az://bkt/some/ds": {"azure_storage_account_name": "devaccount",
                             "azure_storage_account_key": base64.b64encode(b"k" * 32).decode(),
                             "azure_storage_endpoint": base, "allow_http": True},
    }
    try:
        for k, (url, opts) in enumerate(setups.items()):
            ds = loaderx.open_dataset(url, cache_dir=str(tmp_path / f"c{k}"), storage_options=opts)
            idx = [7, 0, 399, 7]
            assert_same(ds["zz"][idx], dense[idx])
            for g, i in zip(ds["rag"][idx], idx):
                assert_same(g, ragged[i])
            for s in ds.values():
                s.close()
            missing = f"{url}-missing"
            with pytest.raises(RemoteNotFoundError, match=re.escape(missing)) as e:
                loaderx.open_dataset(missing, cache_dir=str(tmp_path / "c"), storage_options=opts)
            assert isinstance(e.value, FileNotFoundError)
            with loaderx.open_store(f"{url}/{ZZ}0", cache_dir=str(tmp_path / "c"),
                                    storage_options=opts) as store:
                with pytest.raises(ReadOnlyError, match=re.escape(url) + ".*read-only"):
                    store.append(dense[:1])
    finally:
        server.shutdown()


def test_a_store_replaced_on_the_server_keeps_its_cached_version_or_raises(tmp_path, s3, data):
    dense, _ = data
    local = tmp_path / "v1"
    loaderx.from_numpy(str(local), dense, codec="raw").close()
    url = s3.upload_dir(str(local), "replaced/s")
    store = loaderx.open_store(url, cache_dir=str(tmp_path / "c"), storage_options=s3.options())
    assert_same(store[[0, 1]], dense[[0, 1]])
    # Replace the store (a new version of every object) while it is open.
    loaderx.from_numpy(str(tmp_path / "v2"), np.zeros_like(dense), codec="raw").close()
    s3.upload_dir(str(tmp_path / "v2"), "replaced/s")
    assert_same(store[[0, 1]], dense[[0, 1]])  # cached: the version it opened
    with pytest.raises(RemoteChangedError, match="changed on the server"):
        store[[50]]
    store.close()
    # Reopened: the new version, from a new replica.
    store = loaderx.open_store(url, cache_dir=str(tmp_path / "c"), storage_options=s3.options())
    assert not store[[0, 50]].any()
    store.close()


def test_transient_faults_are_retried_and_reads_stay_exact(tmp_path, s3, url, proxy, data):
    dense, _ = data
    base, faults = proxy
    ds = opened(url, tmp_path / "cache", s3, base, columns=["raw"])
    try:
        data_get = lambda m, p: m == "GET" and p.endswith("/data")  # noqa: E731
        faults.add("503", 2, data_get)
        faults.add("reset", 2, data_get)
        faults.add("500", 1, data_get)
        idx = np.array([10, 20, 30, 300])
        assert_same(ds["raw"][idx], dense[idx])
        assert faults.take("GET", "/x/data") is None  # every planned fault was used
    finally:
        ds["raw"].close()


def test_hard_failures_raise_os_errors_naming_the_url_quickly(tmp_path, s3, url, proxy):
    base, faults = proxy
    opts = s3.options()
    with pytest.raises(RemoteNotFoundError, match="no-such/store") as e:
        loaderx.open_store(f"s3://{s3.bucket}/no-such/store", cache_dir=str(tmp_path),
                           storage_options=opts)
    assert isinstance(e.value, FileNotFoundError)
    with pytest.raises(FileNotFoundError, match="no-such-bucket"):
        loaderx.open_dataset("s3://no-such-bucket/ds", cache_dir=str(tmp_path),
                             storage_options=opts)
    faults.add("403", 10)
    with pytest.raises(RemotePermissionError, match="access denied") as e:
        opened(url, tmp_path, s3, base)
    assert isinstance(e.value, PermissionError)
    # An unreachable endpoint: a closed port. Bounded by the retry budget.
    import socket
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    fast = dict(opts, endpoint=f"http://127.0.0.1:{port}",
                retry_config={"max_retries": 1, "retry_timeout": __import__("datetime").timedelta(
                    seconds=2)})
    t = time.monotonic()
    with pytest.raises(RemoteIOError, match=f"127.0.0.1:{port}|s3://") as e:
        loaderx.open_dataset(url, cache_dir=str(tmp_path), storage_options=fast)
    assert isinstance(e.value, OSError)
    assert time.monotonic() - t < 30


@pytest.fixture
def bare_aws_env(monkeypatch, tmp_path):
    """An environment with no AWS setting at all (no credentials, profile or
    config files: HOME is empty), and fresh clients before and after."""
    from loaderx import _objstore

    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    _objstore._forget_clients()
    yield monkeypatch
    _objstore._forget_clients()


def test_a_plain_http_endpoint_without_allow_http_names_the_setting(tmp_path, s3, url,
                                                                    bare_aws_env):
    """AWS_ENDPOINT_URL=http://... without AWS_ALLOW_HTTP: the client refuses
    the scheme ("builder error"); the error says which setting allows it,
    at once (never retried)."""
    bare_aws_env.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    opts = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}
    t = time.monotonic()
    with pytest.raises(RemoteIOError, match=r"plain http://.*AWS_ALLOW_HTTP=true.*allow_http") \
            as e:
        loaderx.open_dataset(url, cache_dir=str(tmp_path), storage_options=opts)
    assert str(e.value).startswith(url) and time.monotonic() - t < 5
    bare_aws_env.setenv("AWS_ALLOW_HTTP", "true")  # the setting it names: then it reads
    from loaderx import _objstore
    _objstore._forget_clients()
    ds = loaderx.open_dataset(url, cache_dir=str(tmp_path), storage_options=opts)
    assert len(ds["raw"]) == N
    for col in ds.values():
        col.close()


def test_no_credentials_anywhere_is_a_permission_error_naming_where_they_go(tmp_path, s3, url,
                                                                            bare_aws_env):
    """No keys, no profile, and a metadata service that gives none (here a
    server on loopback that answers every request with an error, standing
    in for 169.254.169.254): `RemotePermissionError`, naming the variables
    and the profile files, without the retries of a transient fault."""
    os.makedirs(tmp_path / "empty")
    server, metadata = range_server(str(tmp_path / "empty"))
    bare_aws_env.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    bare_aws_env.setenv("AWS_ALLOW_HTTP", "true")
    bare_aws_env.setenv("AWS_METADATA_ENDPOINT", metadata)
    try:
        t = time.monotonic()
        with pytest.raises(RemotePermissionError, match="no credentials found") as e:
            loaderx.open_store(f"{url}/{RAW}", cache_dir=str(tmp_path),
                               storage_options={"region": "us-east-1"})
        assert time.monotonic() - t < 30
    finally:
        server.shutdown()
    text = str(e.value)
    assert text.startswith(f"{url}/{RAW}")
    for named in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE",
                  "~/.aws/credentials", "storage_options"):
        assert named in text, named
    assert isinstance(e.value, PermissionError)


def test_url_paths_everywhere(tmp_path, s3, url, data):
    dense, _ = data
    opts = s3.options()
    shards = loaderx.ShardSet([f"{url}/{ZZ}0", f"{url}/{ZZ}1"],
                              cache_dir=str(tmp_path), storage_options=opts)
    assert shards.is_remote and len(shards) == N
    assert shards.prefetch_warm([0, N - 1]) is False  # nothing fetched yet
    assert_same(shards[[0, N - 1]], dense[[0, N - 1]])
    assert shards.prefetch_warm([0, N - 1]) is True and shards.prefetch_warm([1]) is False
    shards.close()
    remote.configure(cache_dir=str(tmp_path / "default"), storage_options=opts)
    try:
        store = loaderx.DenseStore(f"{url}/{RAW}")
        assert_same(store[[4]], dense[[4]])
        assert str(tmp_path / "default") in store._remote.local_dir
        store.close()
    finally:
        remote._DEFAULTS.clear()
    man = loaderx.dataset.read_manifest(url, storage_options=opts)
    assert man["rows"] == N
    with pytest.raises(loaderx.NotAStoreError, match="single store"):
        loaderx.dataset.read_manifest(f"{url}/{RAW}", storage_options=opts)


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


def test_uploads_use_parts_s3_takes_at_any_size(tmp_path, s3):
    from loaderx import _objstore

    mib, gib = 1 << 20, 1 << 30
    # obstore's default 5 MiB parts stop a file at 48.8 GiB (S3: 10,000 parts).
    for nbytes in (0, 1, 5 * mib, 48 * gib, 49 * gib, 156 * gib, 1 << 40, 5 << 40):
        part, in_flight = _objstore.part_plan(nbytes)
        assert part >= _objstore.PART_MIN and part % mib == 0
        assert -(-nbytes // part) < _objstore.PARTS_MAX
        assert 2 <= in_flight <= 12 and (in_flight == 2 or part * in_flight <= 256 * mib)
    # The plan reaches the server: 40 MiB go up in three 16 MiB parts (a
    # multipart object's ETag ends in its part count).
    path = tmp_path / "big"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 40 * mib, np.uint8).tobytes())
    url = f"s3://{s3.bucket}/parts/big"
    _objstore.put(url, _objstore.Options(s3.options()), str(path))
    head = s3.client().head_object(Bucket=s3.bucket, Key="parts/big")
    assert head["ContentLength"] == 40 * mib and head["ETag"].strip('"').endswith("-3")


def test_limit_parsing():
    assert _cachedir.parse_limit("200GiB") == 200 << 30
    assert _cachedir.parse_limit("1.5 MB") == 1_500_000
    assert _cachedir.parse_limit(4096) == 4096
    for bad in (0, -1, "x", "10 parsecs", True):
        with pytest.raises(ValueError):
            _cachedir.parse_limit(bad)


_READER = r"""
import sys, numpy as np, loaderx
url, cache, endpoint = sys.argv[1:4]
opts = {"endpoint": endpoint, "access_key_id": "testing", "secret_access_key": "testing",
        "region": "us-east-1", "allow_http": "true"}
ds = loaderx.open_dataset(url, columns=["raw"], cache_dir=cache, storage_options=opts)
idx = np.arange(0, 400, 3)
print(int(ds["raw"][idx].astype(np.int64).sum()))
"""


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(loaderx.__file__)))]
        + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def test_processes_sharing_a_cache_fetch_each_byte_once(tmp_path, s3, url, proxy, data):
    dense, _ = data
    base, faults = proxy
    env = _env()
    args = [sys.executable, "-c", _READER, url, str(tmp_path / "one"), base]
    assert subprocess.run(args, env=env, capture_output=True, timeout=120).returncode == 0
    data_get = lambda m, p: m == "GET" and p.endswith("/data")  # noqa: E731
    one = faults.body_bytes(data_get)
    faults.reset_counts()
    args[4] = str(tmp_path / "shared")
    procs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(4)]
    want = str(int(dense[np.arange(0, 400, 3)].astype(np.int64).sum()))
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
        assert out.decode().strip() == want
    assert faults.body_bytes(data_get) <= 1.1 * one, (faults.body_bytes(data_get), one)


def test_prefetch_is_idempotent_thread_safe_and_makes_reads_local(tmp_path, s3, url, proxy, data):
    """A stand-in for the loader's prefetch thread: prefetch(step s + 2)
    runs while step s is read."""
    dense, _ = data
    base, faults = proxy
    ds = opened(url, tmp_path / "cache", s3, base, columns=["raw", "zz"])
    steps = [np.random.default_rng(s).choice(N, 12, replace=False) for s in range(12)]
    import threading
    errors = []

    def prefetcher():
        try:
            for s in steps:
                for col in ds.values():
                    col.prefetch(s)
                    col.prefetch(s)  # idempotent
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    t = threading.Thread(target=prefetcher)
    t.start()
    t.join()
    assert not errors
    faults.reset_counts()
    for s in steps:
        for name in ("raw", "zz"):
            assert_same(ds[name][s], dense[s])
    assert faults.body_bytes() == 0  # everything was prefetched
    # What a step costs the loader's prefetch_bytes budget: stored bytes.
    assert ds["raw"].prefetch_size(steps[0]) == 12 * REC
    assert ds["zz"].prefetch_size(steps[0]) == sum(
        s.stats()["live_bytes"] // len(s) for s in ds["zz"].shards) // 2 * 12
    for col in ds.values():
        col.close()


class _Rows:
    """A torch map-style dataset over a store (module level: spawn pickles it)."""

    def __init__(self, store):
        self.store = store

    def __len__(self):
        return len(self.store)

    def __getitem__(self, i):
        return self.store[[i]][0]


def test_torch_workers_read_a_remote_store_with_fork_and_spawn(tmp_path, s3, url, data):
    """obstore's runtime does not survive fork(): a forked worker of a
    process that used it reads through a helper process of its own; a
    spawned one reopens the pickled store (the same version, same cache)."""
    torch_data = pytest.importorskip("torch.utils.data")
    dense, _ = data
    store = loaderx.open_store(f"{url}/{ZZ}1", cache_dir=str(tmp_path),
                               storage_options=s3.options())
    half = N // 2
    try:
        assert_same(store[[0]], dense[[half]])  # the parent's runtime now exists
        for ctx in ("fork", "spawn"):
            loader = torch_data.DataLoader(_Rows(store), batch_size=50, num_workers=1,
                                           multiprocessing_context=ctx)
            got = np.concatenate([b.numpy() for b in loader])
            assert_same(got, dense[half:])
    finally:
        store.close()


def test_a_forked_child_fetches_through_its_helper_process(tmp_path, s3, url, data):
    dense, _ = data
    store = loaderx.open_store(f"{url}/{RAW}", cache_dir=str(tmp_path),
                               storage_options=s3.options())
    try:
        assert_same(store[[0]], dense[[0]])
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit code
            code = 1
            try:
                code = 0 if np.array_equal(store[[7, 390]], dense[[7, 390]]) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        store.close()


def test_the_loader_reads_a_remote_dataset_as_the_local_copy_and_resumes_across(
        tmp_path, s3, url, local_ds):
    ds = opened(url, tmp_path / "cache", s3, columns=["raw", "rag"])
    local = loaderx.open_dataset(local_ds, columns=["raw", "rag"])
    try:
        a = loaderx.DataLoader(ds, batch_size=16, seed=3, workers=2)
        b = loaderx.DataLoader(local, batch_size=16, seed=3, workers=2)
        for _ in range(3):
            x, y = next(a), next(b)
            assert_same(x["raw"], y["raw"])
            assert all(np.array_equal(p, q) for p, q in zip(x["rag"], y["rag"]))
        state = a.state_dict()
        a.close()
        b.close()
        # A state from the remote run resumes on the local copy, and back.
        c = loaderx.DataLoader(local, batch_size=16, seed=3, workers=2)
        c.load_state_dict(state)
        d = loaderx.DataLoader(ds, batch_size=16, seed=3, workers=2)
        d.load_state_dict(c.state_dict())
        assert_same(next(c)["raw"], next(d)["raw"])
        c.close()
        d.close()
    finally:
        for s in list(ds.values()) + list(local.values()):
            s.close()


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


def test_the_native_ring_reads_remote_streams_and_views_only_after_their_prefetch(
        tmp_path, s3, url, local_ds, monkeypatch):
    # The ring reads a remote store's cache replica natively: holes read as
    # zeros, so every step must be fetched (prefetch) before it is built. A
    # view maps its indices to the base's records, and so must its prefetch.
    ds = opened(url, tmp_path / "cache", s3, columns=["raw"])
    local = loaderx.open_dataset(local_ds, columns=["raw"])
    rows = np.arange(3, len(local["raw"]), 7)
    pins, warm = [], []
    begin, pin_warm = remote.Binding.begin, remote.Binding.pin_warm

    def counted(self, indices, pin=False):
        if pin:
            pins.append(len(indices))
        return begin(self, indices, pin)

    def counted_warm(self, indices):
        ready = pin_warm(self, indices)
        if ready:
            warm.append(len(indices))
        return ready
    monkeypatch.setattr(remote.Binding, "begin", counted)
    monkeypatch.setattr(remote.Binding, "pin_warm", counted_warm)
    try:
        for remote_streams, local_streams in (
                (ds, local), (loaderx.select(ds, rows), loaderx.select(local, rows))):
            a = loaderx.DataLoader(remote_streams, batch_size=16, seed=5, workers=2)
            b = loaderx.DataLoader(local_streams, batch_size=16, seed=5, workers=2)
            pins.clear()
            warm.clear()
            steps = 2 * len(rows) // 16 + 3  # more than a cycle
            for _ in range(steps):
                x, y = next(a), next(b)
                assert_same(x["raw"], y["raw"])
            # Native: no Python worker threads read these streams.
            assert not [t for t in threading.enumerate() if t.name.startswith("loaderx-worker")]
            a.close()
            b.close()
            # Records not cached are fetched step by step; once cached (the
            # view's second cycle), a run of steps is pinned in one call
            # (prefetch_warm), not one per step.
            assert pins and all(n == 16 for n in pins)
            if remote_streams is not ds:
                assert warm and all(n % 16 == 0 and n >= 2 * 16 for n in warm)
                assert len(pins) + len(warm) < steps
    finally:
        for s in list(ds.values()) + list(local.values()):
            s.close()


def test_convert_to_a_url_uploads_then_publishes_and_never_writes_a_local_s3_folder(
        tmp_path, s3, data, monkeypatch):
    dense, _ = data
    monkeypatch.chdir(tmp_path)
    opts = s3.options()
    remote.configure(cache_dir=str(tmp_path / "cache"), storage_options=opts)
    try:
        url = f"s3://{s3.bucket}/written/ds"
        ds = loaderx.convert({"x": dense[:100], "y": np.arange(100, dtype=np.int64)}, url,
                             progress="off")
        assert not os.path.exists(tmp_path / "s3:")
        assert_same(ds["x"][[0, 99]], dense[[0, 99]])
        for s in ds.values():
            s.close()
        with pytest.raises(loaderx.dataset.DestinationExistsError, match="already exists"):
            loaderx.convert({"x": dense[:10], "y": np.arange(10, dtype=np.int64)}, url,
                            progress="off")
        # Append adds shards and a new manifest (a conditional put).
        ds = loaderx.convert({"x": dense[100:150], "y": np.arange(100, 150, dtype=np.int64)}, url,
                             mode="append", progress="off")
        assert len(ds["x"]) == 150
        assert_same(ds["y"][:], np.arange(150, dtype=np.int64))
        assert_same(ds["x"][[120]], dense[[120]])
        for s in ds.values():
            s.close()
        with pytest.raises(loaderx.IdentityError, match="dtype"):
            loaderx.convert({"x": dense[:5].astype(np.int16), "y": np.arange(5)}, url,
                            mode="append", progress="off")
        # Overwrite: the new dataset, the old stores deleted after it is published.
        before = {o["Key"] for o in s3.client().list_objects_v2(
            Bucket=s3.bucket, Prefix="written/ds/")["Contents"]}
        ds = loaderx.convert({"x": dense[:7], "y": np.arange(7, dtype=np.int64)}, url,
                             mode="overwrite", progress="off")
        assert len(ds["x"]) == 7
        for s in ds.values():
            s.close()
        after = {o["Key"] for o in s3.client().list_objects_v2(
            Bucket=s3.bucket, Prefix="written/ds/")["Contents"]}
        assert not (before & after) - {"written/ds/loaderx.json"}
        # A single store.
        st = loaderx.from_numpy(f"s3://{s3.bucket}/written/one", dense[:20])
        assert st.is_remote and st.path == f"s3://{s3.bucket}/written/one"
        assert_same(st[:], dense[:20])
        st.close()
        rg = loaderx.from_iterator(f"s3://{s3.bucket}/written/rag", [np.arange(3), np.arange(5)])
        assert_same(rg[1], np.arange(5))
        rg.close()
        with pytest.raises(ReadOnlyError, match="append"):
            loaderx.from_numpy(f"s3://{s3.bucket}/written/one", dense[:2], mode="append")
        with pytest.raises(ReadOnlyError, match="read-only"):
            loaderx.convert({"x": dense[:2]}, "https://example.com/ds", progress="off")
    finally:
        remote._DEFAULTS.clear()


def test_an_append_racing_another_writer_publishes_nothing(tmp_path, s3, data, monkeypatch):
    dense, _ = data
    opts = s3.options()
    remote.configure(cache_dir=str(tmp_path / "cache"), storage_options=opts)
    try:
        url = f"s3://{s3.bucket}/raced/ds"
        loaderx.converters.convert_to_directory({"x": dense[:10]}, url, progress="off")
        real = remote.Target.publish

        def late(self, fresh):  # another writer appends first
            monkeypatch.setattr(remote.Target, "publish", real)
            loaderx.converters.convert_to_directory({"x": dense[10:12]}, url, mode="append",
                                                    progress="off")
            return real(self, fresh)
        monkeypatch.setattr(remote.Target, "publish", late)
        with pytest.raises(loaderx.LockedError, match="another writer"):
            loaderx.converters.convert_to_directory({"x": dense[20:25]}, url, mode="append",
                                                    progress="off")
        monkeypatch.setattr(remote.Target, "publish", real)
        man = loaderx.dataset.read_manifest(url, storage_options=opts)
        assert man["rows"] == 12  # the other writer's append, not ours
        keys = [o["Key"] for o in s3.client().list_objects_v2(
            Bucket=s3.bucket, Prefix="raced/ds/")["Contents"]]
        named = {f"raced/ds/{sh['path']}/{f}" for sh in man["columns"]["x"]["shards"]
                 for f in ("meta", "index", "data")}
        assert set(keys) - {"raced/ds/loaderx.json"} == named  # ours were deleted
    finally:
        remote._DEFAULTS.clear()


def test_the_cli_takes_urls(tmp_path, s3, url, data):
    dense, _ = data
    env = dict(_env(), **s3.env, LOADERX_CACHE_DIR=str(tmp_path / "cache"))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "loaderx", *args], env=env,
                              capture_output=True, text=True, timeout=120)
    out = cli("info", url, "--json")
    assert out.returncode == 0, out.stderr
    import json
    report = json.loads(out.stdout)
    assert report["path"] == url and report["rows"] == N
    out = cli("verify", url)
    assert out.returncode == 0 and "ok:" in out.stdout, out.stderr
    np.save(tmp_path / "x.npy", dense[:30])
    dst = f"s3://{s3.bucket}/cli/ds"
    out = cli("convert", str(tmp_path / "x.npy"), dst, "-q")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "s3:").exists()
    out = cli("convert", str(tmp_path / "x.npy"), dst, "-q")
    assert out.returncode == 1 and "--append or --overwrite" in out.stderr
    out = cli("info", f"s3://{s3.bucket}/no/such")
    assert out.returncode == 1 and "s3://" in out.stderr


def test_token_windows_over_a_remote_corpus_read_as_over_the_local_one(tmp_path, s3, data):
    _, ragged = data
    docs = [np.abs(r).astype(np.uint16) for r in ragged]
    loaderx.from_iterator(str(tmp_path / "tok"), docs).close()
    url = s3.upload_dir(str(tmp_path / "tok"), "tokens/s")
    local = loaderx.TokenWindows(loaderx.RaggedStore(str(tmp_path / "tok")), 64, separator=0)
    store = loaderx.open_store(url, cache_dir=str(tmp_path / "c"), storage_options=s3.options())
    tw = loaderx.TokenWindows(store, 64, separator=0)
    assert tw.is_remote and len(tw) == len(local)
    idx = np.array([0, len(tw) - 1, 17, 3])
    assert tw.prefetch_warm(idx[:2]) is False and local.prefetch_warm(idx[:2]) is False
    tw.prefetch(idx[:2])
    assert tw.prefetch_warm(idx[:2]) is True
    assert_same(tw[idx], local[idx])
    assert_same(tw.segments[idx], local.segments[idx])
    store.close()


def test_a_process_killed_mid_fetch_leaves_nothing_marked_and_nothing_locked(
        tmp_path, s3, url, proxy, data):
    import signal
    dense, _ = data
    base, faults = proxy
    cache = tmp_path / "cache"
    faults.delay = 30.0
    faults.add("slow", 100, lambda m, p: m == "GET" and p.endswith("raw/part-00000/data"))
    code = ("import sys, numpy as np, loaderx\n"
            "url, cache, endpoint = sys.argv[1:4]\n"
            "opts = {'endpoint': endpoint, 'access_key_id': 'testing', "
            "'secret_access_key': 'testing', 'region': 'us-east-1', 'allow_http': 'true'}\n"
            "ds = loaderx.open_dataset(url, columns=['raw'], cache_dir=cache, "
            "storage_options=opts)\n"
            "ds['raw'][np.arange(0, 400, 7)]\n")
    child = subprocess.Popen([sys.executable, "-c", code, url, str(cache), base], env=_env(),
                             stderr=subprocess.PIPE)
    try:
        assert faults.slow_started.wait(120), child.stderr.read() if child.poll() else ""
        time.sleep(0.3)  # the child holds its fetch locks and waits for bytes
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    faults.plan.clear()
    # Nothing the child fetched is marked present; its locks died with it.
    ds = opened(url, cache, s3, base, columns=["raw"])
    store = ds["raw"]
    replica = store._remote.replica()
    assert not replica_state(replica)["dwords"].any()
    t = time.monotonic()
    idx = np.arange(0, 400, 7)
    assert_same(store[idx], dense[idx])
    assert time.monotonic() - t < 20
    store.close()


# ----------------------------------------------------------------- kill -9 beside others (issue 38)

_SHARER = r"""
import sys, hashlib, json, warnings, numpy as np, loaderx
from loaderx._lib import lib
url, cache, endpoint, limit, pause, plan = sys.argv[1:7]
warnings.simplefilter("ignore")  # (a cache over its limit says so)
if int(pause):
    lib.lx_debug_cache_pause(int(pause))  # every eviction sleeps after its first region
opts = {"endpoint": endpoint, "access_key_id": "testing", "secret_access_key": "testing",
        "region": "us-east-1", "allow_http": "true"}
col = loaderx.open_dataset(url, columns=["raw"], cache_dir=cache, storage_options=opts,
                           cache_limit=int(limit) or None)["raw"]
print("open", flush=True)
for batch in json.loads(plan):
    got = col[np.asarray(batch)]
    print(json.dumps(batch), hashlib.sha256(got.tobytes()).hexdigest(), flush=True)
"""


def _sharer(url, cache, endpoint, plan, limit=0, pause=0):
    """A process reading `plan` (batches of the raw column) through `cache`,
    printing "open", then each batch and the digest of its bytes."""
    import json
    p = subprocess.Popen([sys.executable, "-c", _SHARER, url, str(cache), endpoint, str(limit),
                          str(pause), json.dumps(plan)], env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "open", p.stderr.read() if p.poll() else ""
    return p


def _exact(dense, lines: list) -> int:
    """How many batch lines (from `_sharer`) there are, each checked exact."""
    import hashlib
    import json
    for line in lines:
        batch, digest = line.rsplit(" ", 1)
        assert digest == hashlib.sha256(dense[json.loads(batch)].tobytes()).hexdigest(), batch
    return len(lines)


def _finished(p, dense) -> int:
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    return _exact(dense, out.splitlines())


def _replica_dir(cache) -> str:
    (key,) = [k for k in os.listdir(os.path.join(cache, "stores")) if not k.startswith(".")]
    return os.path.join(cache, "stores", key)


def test_a_process_killed_mid_fetch_beside_two_others_leaves_every_reader_exact(
        tmp_path, s3, url, proxy, data):
    """Three processes share a cache. One is killed (kill -9) in the middle of
    a fetch: some of its ranges written, others still coming, its fetch
    locks held. The two others, waiting for those locks, fetch the blocks
    themselves once it is gone: every batch exact, nothing of the dead
    one's marked present; later readers read every record exactly."""
    import fcntl
    dense, _ = data
    base, faults = proxy
    cache = tmp_path / "cache"
    src = f"{url}/{RAW}"  # (the dataset's URL: the replica of its raw column)
    rng = np.random.default_rng(21)
    shared = sorted(rng.choice(N, 60, replace=False).tolist())
    faults.delay = 30.0  # two of the victim's data requests never come in time
    faults.add("slow", 2, lambda m, p: m == "GET" and p.endswith("raw/part-00000/data"))
    victim = _sharer(url, cache, base, [shared])
    try:
        assert faults.slow_started.wait(60)
        time.sleep(0.5)  # its other ranges land in the files; its locks stay held
        d = _replica_dir(cache)
        fd = os.open(os.path.join(d, "data.fetch"), os.O_RDWR)
        try:  # another process holds fetch locks on the data
            with pytest.raises(OSError):
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 0, 0)
        finally:
            os.close(fd)
        others = [_sharer(url, cache, s3.endpoint, [shared, sorted(rng.choice(N, 30).tolist())])
                  for _ in range(2)]
        time.sleep(1.0)  # both wait for the victim's locks now
        assert all(p.poll() is None for p in others)
        victim.kill()  # SIGKILL: no cleanup runs
        victim.wait(30)
        t = time.monotonic()
        assert [_finished(p, dense) for p in others] == [2, 2]
        assert time.monotonic() - t < 30  # (not the 120 s a stuck fetcher is given)
    finally:
        if victim.poll() is None:
            victim.kill()
    faults.plan.clear()
    reader = _sharer(url, cache, s3.endpoint, [list(range(k, k + 50)) for k in range(0, N, 50)])
    assert _finished(reader, dense) == N // 50
    store = loaderx.open_store(src, cache_dir=str(cache), storage_options=s3.options())
    try:
        assert_same(store[np.arange(N)], dense)
    finally:
        store.close()


def test_a_process_killed_mid_eviction_beside_two_others_leaves_every_reader_exact(
        tmp_path, s3, url, data):
    """Three processes share a cache under a small limit. One is killed
    (kill -9) in the middle of an eviction: the cache's lock held, its
    eviction sequence odd, a region dropped. The others, one reading all
    along and one started meanwhile, wait for the lock, repair the
    sequence, check their records again and read on: every batch exact,
    and later readers read every record exactly."""
    dense, _ = data
    cache = tmp_path / "cache"
    limit = 40 * REC
    rng = np.random.default_rng(22)

    def batches(n):
        return [sorted(rng.choice(N, 8, replace=False).tolist()) for _ in range(n)]
    evictor = _sharer(url, cache, s3.endpoint, batches(60), limit=limit, pause=60_000)
    first = _sharer(url, cache, s3.endpoint, batches(60), limit=limit)
    second = None
    try:
        mm = np.memmap(cache / "state", np.uint8, "r", shape=(CACHE_PAGE,))
        head = mm.view(np.uint64)
        deadline = time.monotonic() + 60
        seen = []
        while time.monotonic() < deadline:  # the evictor paused mid-eviction: odd, and staying
            seen = (seen + [int(head[SEQ])])[-4:]
            if len(seen) == 4 and seen[0] % 2 == 1 and len(set(seen)) == 1:
                break
            time.sleep(0.25)
        else:
            raise AssertionError(f"no eviction paused: sequence {seen}")
        second = _sharer(url, cache, s3.endpoint, batches(30), limit=limit)
        time.sleep(1.0)  # (it waits for the lock too)
        evictor.kill()  # SIGKILL in the middle of an eviction
        evictor.wait(30)
        assert _finished(first, dense) == 60 and _finished(second, dense) == 30
        assert int(head[SEQ]) % 2 == 0  # repaired, and every eviction since ended
        _exact(dense, evictor.stdout.read().splitlines())  # what it read before: exact too
    finally:
        for p in (evictor, first, second):
            if p is not None and p.poll() is None:
                p.kill()
    reader = _sharer(url, cache, s3.endpoint, [list(range(k, k + 50)) for k in range(0, N, 50)],
                     limit=limit)
    assert _finished(reader, dense) == N // 50


def test_a_cache_directory_deleted_between_opens_is_made_anew_not_trusted(tmp_path, s3, url,
                                                                          data):
    dense, _ = data
    cache = tmp_path / "cache"
    for _ in range(2):
        ds = opened(url, cache, s3, columns=["raw"])
        assert_same(ds["raw"][[1, 2, 300]], dense[[1, 2, 300]])
        ds["raw"].close()
        shutil.rmtree(cache)


_PRESSURE = r"""
import sys, signal, os, numpy as np, loaderx
url, cache, endpoint, limit, mode = sys.argv[1:6]
opts = {"endpoint": endpoint, "access_key_id": "testing", "secret_access_key": "testing",
        "region": "us-east-1", "allow_http": "true"}
col = loaderx.open_dataset(url, columns=["raw"], cache_dir=cache, cache_limit=int(limit),
                           storage_options=opts)["raw"]
if mode == "read":  # many reads under a small limit: eviction pressure
    rng = np.random.default_rng(5)
    for _ in range(25):
        col[rng.choice(400, 8, replace=False)]
else:  # pin everything, then die without a word
    col.prefetch(np.arange(400))
    print("pinned", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_eviction_spares_other_processes_pins_and_ignores_dead_ones(tmp_path, s3, url, proxy,
                                                                    data):
    dense, _ = data
    base, faults = proxy
    cache = tmp_path / "cache"
    limit = 40 * REC
    ds = opened(url, cache, s3, base, columns=["raw"], cache_limit=limit)
    store = ds["raw"]
    step = np.array([3, 133, 266, 399])
    store.prefetch(step)  # this process's next step
    args = [sys.executable, "-c", _PRESSURE, url, str(cache), base, str(limit), "read"]
    done = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data_get = lambda m, p: m == "GET" and p.endswith("raw/part-00000/data")  # noqa: E731
    before = faults.body_bytes(data_get)
    assert_same(store[step], dense[step])  # still cached: the other process evicted around it
    assert faults.body_bytes(data_get) == before
    # A process that pinned everything and died blocks nothing: once this
    # process's own kept prefetches are older history too, all may go.
    args[-1] = "pin-and-die"
    died = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=120)
    assert "pinned" in died.stdout, died.stderr
    cache = store._remote.cache
    assert cache.used() > limit
    cache.evict(unpin=True)  # (this process's kept prefetches dropped first)
    assert cache.used() <= limit
    assert_same(store[step], dense[step])  # fetched again
    store.close()


def test_fetch_calls_keep_their_ranges_apart_and_cover_each_once():
    from loaderx import _objstore

    rng = np.random.default_rng(11)
    gap, per = _objstore.COALESCE_GAP, _objstore.RANGES_PER_CALL
    for n in (1, 5, 40, 300):
        starts = np.sort(rng.choice(64 * gap // 4096, n, replace=False)) * 4096
        ends = starts + rng.integers(1, 4096, n)
        starts, ends = starts.tolist()[::-1], ends.tolist()[::-1]  # any order in
        groups = _objstore._calls(starts, ends)
        assert sorted(i for g in groups for i in g) == list(range(n))
        for g in groups:
            assert 1 <= len(g) <= per
            assert all(starts[b] - ends[a] > gap for a, b in zip(g, g[1:]))


def test_making_room_for_file_descriptors_never_closes_one_a_fetch_writes_through(tmp_path):
    # A fetch writes through a leased descriptor while another thread opens
    # more cache files than the table keeps: only idle descriptors close (a
    # CI run lost an index fetch to EBADF when all of them did).
    from loaderx import _objstore

    files = _objstore._Files()
    paths = []
    for i in range(files.LIMIT + 8):
        paths.append(tmp_path / f"f{i}")
        paths[-1].write_bytes(b"\0" * 8)
    with files.lease(str(paths[0])) as busy:
        for p in paths[1:]:
            with files.lease(str(p)) as fd:
                os.pwrite(fd, b"x", 0)
        os.pwrite(busy, b"busy", 2)
        with files.lease(str(paths[0])) as again:
            assert again == busy  # one descriptor per file, reused
    assert paths[0].read_bytes() == b"\0\0busy\0\0"
    assert len(files._fds) <= files.LIMIT
    with files.lease(str(paths[0])) as fd:  # idle now: may be closed on the next overflow
        assert os.fstat(fd).st_ino == paths[0].stat().st_ino


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


def test_a_version_1_cache_directory_is_upgraded_in_place(tmp_path):
    import gc
    root = str(tmp_path / "cache")
    c = _cachedir.Cache(root)
    head = cache_head(c)
    del c
    gc.collect()  # (the native handle closed: the next open reads the file anew)
    version = CACHE_HEAD_OFFSETS["version"] // 8
    head[version], head[SEQ] = 1, np.uint64(NONE)  # version 1: word 4 unused, all ones
    c = _cachedir.Cache(root)
    assert int(head[version]) == 2 and int(head[SEQ]) == 0 and int(c.stats().seq) == 0


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


# ----------------------------------------------------------------- full disks (issue 37)

@contextlib.contextmanager
def small_disk(path, kind: str = "tmpfs", size_mb: int = 8):
    """A small file system mounted at `path`: a tmpfs (a RAM disk, the
    natural cache of a node without local disks) or ext4 on a loop device;
    skips where this process may not mount one (not root, or no permission
    in this container)."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root on Linux")
    os.makedirs(path, exist_ok=True)
    image = f"{path}.img"
    if kind == "tmpfs":
        cmds = [["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)]]
    else:
        with open(image, "wb") as f:
            f.truncate(size_mb << 20)
        cmds = [["mkfs.ext4", "-q", "-F", image], ["mount", "-o", "loop", image, str(path)]]
    for cmd in cmds:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            pytest.skip(f"cannot make a small {kind} here: {e}")
        if done.returncode != 0:
            pytest.skip(f"cannot make a small {kind} here: {done.stderr.strip()}")
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
        with contextlib.suppress(OSError):
            os.remove(image)


BIG_N, BIG_REC = 3000, 4000  # 12 MB of raw records: more than an 8 MiB tmpfs holds


@pytest.fixture(scope="module")
def big(s3, tmp_path_factory):
    rng = np.random.default_rng(37)
    dense = rng.integers(0, 256, size=(BIG_N, BIG_REC), dtype=np.uint8)
    local = str(tmp_path_factory.mktemp("big") / "s")
    loaderx.from_numpy(local, dense, codec="raw").close()
    return s3.upload_dir(local, "big/s"), dense


# Runs in a child (a SIGBUS would end the test run): steps of reads of one
# store, each printed as "<step> ok <sum>" or "<step> <error class> <message>".
_DISK_STEPS = r"""
import os, sys, json, numpy as np, loaderx
url, cache, endpoint, limit, steps = sys.argv[1:6]
opts = {"endpoint": endpoint, "access_key_id": "testing", "secret_access_key": "testing",
        "region": "us-east-1", "allow_http": "true"}
store = loaderx.open_store(url, cache_dir=cache, storage_options=opts,
                           cache_limit=None if limit == "-" else int(limit))
for k, step in enumerate(json.loads(steps)):
    if step[0] == "fill":  # what is left of the file system, taken by another file
        fd = os.open(step[1], os.O_WRONLY | os.O_CREAT, 0o644)
        for size in (1 << 16, 4096, 1):
            try:
                while True:
                    os.write(fd, b"x" * size)
            except OSError:
                pass
        os.close(fd)
        continue
    if step[0] == "remove":
        os.remove(step[1])
        continue
    try:
        got = store[np.asarray(step[1])]
        print(k, "ok", int(got.astype(np.int64).sum()), flush=True)
    except Exception as e:
        print(k, type(e).__name__, str(e).replace("\n", " "), flush=True)
"""


def _disk_steps(s3, url, cache, steps, limit=None) -> list:
    import json
    done = subprocess.run([sys.executable, "-c", _DISK_STEPS, url, str(cache), s3.endpoint,
                           "-" if limit is None else str(limit), json.dumps(steps)],
                          env=_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"the reader died ({done.returncode}): {done.stderr[-3000:]}"
    return [line.split(" ", 2) for line in done.stdout.splitlines()]


def _sum(dense, idx) -> str:
    return str(int(dense[np.asarray(idx)].astype(np.int64).sum()))


def test_a_cache_on_a_full_tmpfs_never_faults_it_says_so_and_reads_on_once_there_is_room(
        tmp_path, s3, url, data):
    """A read of a replica must never fault: on a full tmpfs a hole read
    through a mapping (an index entry never fetched, a state page never
    written) is a SIGBUS. Every page is allocated before anything maps or
    marks it; a fetch with no room is a NoSpaceError naming the cache."""
    dense, _ = data
    with small_disk(tmp_path / "ram") as ram:
        idx = list(range(0, 200, 3))
        filler = os.path.join(ram, "filler")
        got = _disk_steps(s3, f"{url}/{ZZ}0", os.path.join(ram, "cache"),
                          [["fill", filler], ["read", idx], ["remove", filler], ["read", idx]])
    assert got[0][1] == "NoSpaceError", got
    assert os.path.join(ram, "cache") in got[0][2] and "full" in got[0][2]
    assert got[1][1:] == ["ok", _sum(dense, idx)], got


def test_a_gather_larger_than_a_tmpfs_cache_is_a_clear_error_and_smaller_ones_read_on(
        tmp_path, s3, big):
    """cache_limit below the tmpfs, a gather larger than the space: a
    NoSpaceError naming the cache, the bytes needed and the limit; the
    cache keeps working for batches that fit (every byte exact)."""
    url, dense = big
    rng = np.random.default_rng(3)
    small = [np.sort(rng.choice(BIG_N, 300, replace=False)).tolist() for _ in range(6)]
    with small_disk(tmp_path / "ram") as ram:
        cache = os.path.join(ram, "cache")
        got = _disk_steps(s3, url, cache, [["read", list(range(BIG_N))]] + [
            ["read", s] for s in small], limit=6_000_000)
    kind, text = got[0][1], got[0][2]
    assert kind == "NoSpaceError", got[0]
    assert cache in text and "cache_limit 6000000 bytes" in text
    assert re.search(r": \d+ bytes of a replica's data do not fit", text), text
    assert [g[1:] for g in got[1:]] == [["ok", _sum(dense, s)] for s in small]


@pytest.mark.parametrize("kind", ["tmpfs", "ext4"])
def test_a_full_disk_evicts_fetches_again_and_leaves_nothing_unmarked_behind(tmp_path, s3, big,
                                                                             kind):
    """A cache_limit above the file system's size: a fetch that finds it
    full evicts what no reader uses and fetches again (exact bytes); one
    that cannot fit even then is a NoSpaceError, and the bytes it wrote are
    freed (a failed write punches its holes), so the next process reads on."""
    url, dense = big
    batches = [list(range(k * 250, (k + 1) * 250)) for k in range(10)]  # 1 MB each, 10 MB
    with small_disk(tmp_path / "ram", kind, 8 if kind == "tmpfs" else 11) as ram:
        cache = os.path.join(ram, "cache")
        got = _disk_steps(s3, url, cache, [["read", b] for b in batches], limit=1 << 30)
        assert [g[1:] for g in got] == [["ok", _sum(dense, b)] for b in batches]
        before = shutil.disk_usage(ram).used
        got = _disk_steps(s3, url, cache, [["read", list(range(BIG_N))]], limit=1 << 30)
        assert got[0][1] == "NoSpaceError" and cache in got[0][2], got
        assert "cache_limit 1073741824 bytes" in got[0][2]
        # What the failed gather wrote is punched out again (eviction may
        # have freed more): the disk holds no more than before it (ext4's
        # own bookkeeping aside).
        assert shutil.disk_usage(ram).used <= before + (64 << 10)
        got = _disk_steps(s3, url, cache, [["read", batches[0]]], limit=1 << 30)
        assert got[0][1:] == ["ok", _sum(dense, batches[0])]


def test_bytes_no_block_marks_present_are_reclaimed_when_the_disk_fills(tmp_path, s3, big):
    """A cache wedged by bytes nothing marks present (a process killed
    mid-fetch, an older loaderx after a failed write): eviction never saw
    them; a fetch that finds the disk full punches them and reads on."""
    url, dense = big
    with small_disk(tmp_path / "ram") as ram:
        cache = os.path.join(ram, "cache")
        assert _disk_steps(s3, url, cache, [["read", [0]]], limit=1 << 30)[0][1] == "ok"
        (key,) = [k for k in os.listdir(os.path.join(cache, "stores")) if not k.startswith(".")]
        path = os.path.join(cache, "stores", key, "data")
        fd = os.open(path, os.O_WRONLY)
        try:  # junk over the tail of the data, unmarked, until the disk is full
            at = BIG_N * BIG_REC - (1 << 16)
            with contextlib.suppress(OSError):
                while at > (1 << 20):
                    os.pwrite(fd, b"\xee" * (1 << 16), at)
                    at -= 1 << 16
        finally:
            os.close(fd)
        assert shutil.disk_usage(ram).free < 64 << 10
        idx = list(range(10, 400))  # bytes 40 KB to 1.6 MB: holes, beyond the junk
        got = _disk_steps(s3, url, cache, [["read", idx]], limit=1 << 30)
    assert got[0][1:] == ["ok", _sum(dense, idx)], got


# ----------------------------------------------------------------- damaged replicas (issue 37)

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


# ----------------------------------------------------------------- remote columns (issue 37)

def test_select_and_scalar_columns_of_a_remote_dataset_read_fetched_checked_records(
        tmp_path, s3, monkeypatch):
    """A predicate over a remote column reads its records through the cache
    (a replica's holes are not empty strings or zeros), by a dataset, its
    URL, or the command line."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    n = 1000
    x = np.arange(n, dtype=np.int64)
    pq.write_table(pa.table({"t": [f"t{i % 10}" for i in range(n)], "x": x}),
                   tmp_path / "t.parquet")
    loaderx.convert(str(tmp_path / "t.parquet"), str(tmp_path / "local"), progress="off")
    url = s3.upload_dir(str(tmp_path / "local"), "typed/ds")
    ds = opened(url, tmp_path / "cache", s3)
    try:
        assert_same(loaderx.select(ds, "t = 't5'")["x"].rows, x[5::10])
        assert len(loaderx.select(ds, "t = ''")["x"]) == 0
        assert_same(loaderx.select(ds, "x >= 990 AND t <> 't9'")["x"].rows, x[990:999])
        whole = ds["x"].as_array()
        assert_same(whole, x) and not whole.flags.writeable
    finally:
        for col in ds.values():
            col.close()
    remote.configure(cache_dir=str(tmp_path / "cache2"), storage_options=s3.options())
    try:
        views = loaderx.select(url, "t = 't5'")
        assert_same(views["x"].rows, x[5::10])
        assert views["x"].selection.source == url  # (re-selected from there when unpickled)
        for v in views.values():
            v.close()
    finally:
        remote._DEFAULTS.clear()
    env = dict(_env(), **s3.env, LOADERX_CACHE_DIR=str(tmp_path / "cache3"))
    out = subprocess.run([sys.executable, "-m", "loaderx", "select", url, "t = 't5'", "--count"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "100", out.stderr


# ----------------------------------------------------------------- hostile servers (issue 37)

def test_a_server_without_etags_never_mixes_versions(tmp_path, s3, proxy, data):
    """No ETag: the version is pinned by the store's index, fetched whole at
    open (and the objects' sizes and Last-Modified). A store replaced while
    open gives the records of the version opened, or an error naming it;
    never a record of the new one. Reopened, it reads the new version."""
    dense, _ = data
    base, faults = proxy
    faults.add("noetag", 10**9)
    idx = np.array([0, 1, 100, 101, 200, 201, 300, 301])
    for codec in ("raw", "zstd"):
        old, new = tmp_path / f"old-{codec}", tmp_path / f"new-{codec}"
        loaderx.from_numpy(str(old), dense, codec=codec).close()
        loaderx.from_numpy(str(new), dense[::-1].copy(), codec=codec).close()  # the same sizes
        u = s3.upload_dir(str(old), f"noetag/{codec}")
        store = loaderx.open_store(u, cache_dir=str(tmp_path / "c"),
                                   storage_options=s3.options(base))
        try:
            assert_same(store[[0, 1]], dense[[0, 1]])
            s3.upload_dir(str(new), f"noetag/{codec}")  # replaced, likely in the same second
            for batch in (idx, *([i] for i in idx)):
                try:
                    got = store[batch]
                except (RemoteChangedError, CorruptStoreError) as e:
                    assert u in str(e)
                else:
                    assert_same(got, dense[batch])
        finally:
            store.close()
        store = loaderx.open_store(u, cache_dir=str(tmp_path / "c"),
                                   storage_options=s3.options(base))
        try:
            assert_same(store[idx], dense[::-1][idx])
        finally:
            store.close()


def test_a_short_or_broken_body_is_retried_and_named_once_retries_run_out(tmp_path, s3, url,
                                                                           proxy, data):
    import itertools
    dense, _ = data
    base, faults = proxy
    data_get = lambda m, p: m == "GET" and p.endswith("/data")  # noqa: E731
    u = f"{url}/{RAW}"
    store = loaderx.open_store(u, cache_dir=str(tmp_path / "c"), storage_options=s3.options(base))
    try:
        for kind in ("short", "cut", "reset", "longlen"):
            faults.add(kind, 2, data_get)
        idx = np.array([3, 30, 130, 230, 330])
        assert_same(store[idx], dense[idx])
        assert faults.take("GET", "/x/data") is None  # every planned fault was met, and retried
        for kind, says in (("short", "short response"), ("reset", "connection reset during "
                                                                   "the body")):
            faults.plan.clear()
            faults.add(kind, 10**6, data_get)
            with pytest.raises(RemoteIOError, match=says) as e:
                store[[50]]
            assert f"{u}/data" in str(e.value)
        # Every third response reset mid-body: random batches read on, exact.
        faults.plan.clear()
        counter = itertools.count()
        faults.add("reset", 10**6, lambda m, p: data_get(m, p) and next(counter) % 3 == 2)
        rng = np.random.default_rng(10)
        for _ in range(15):
            batch = rng.choice(N, 16, replace=False)
            assert_same(store[batch], dense[batch])
    finally:
        store.close()


def test_a_lying_server_s_sizes_end_in_exact_bytes_or_an_error_naming_the_url(tmp_path, s3, url,
                                                                                proxy, data):
    dense, _ = data
    base, faults = proxy
    u = f"{url}/{RAW}"
    opts = s3.options(base)
    faults.add("bighead", 10**6)  # every object "a petabyte": the store's own meta rules
    with loaderx.open_store(u, cache_dir=str(tmp_path / "c"), storage_options=opts) as store:
        assert_same(store[[7, 399]], dense[[7, 399]])
    faults.plan.clear()
    faults.add("smallhead", 10**6)
    with pytest.raises(CorruptStoreError, match=re.escape(u) + ".*shorter than its meta"):
        loaderx.open_store(u, cache_dir=str(tmp_path / "c2"), storage_options=opts)
    # A meta that declares more data than a file system takes (and HEADs
    # to match): refused before any file is made, or by the file system,
    # naming the URL; never a bare OSError.
    faults.plan.clear()
    faults.add("bighead", 10**6)
    for data_size in (1 << 46, 1 << 60):
        forged = tmp_path / f"forged-{data_size}"
        loaderx.from_numpy(str(forged), dense[:4], codec="raw").close()
        with open(forged / "meta", "r+b") as f:
            f.seek(4096 + 8)
            f.write(data_size.to_bytes(8, "little"))
        fu = s3.upload_dir(str(forged), f"forged/{data_size}")
        with pytest.raises(loaderx.LoaderxError, match=re.escape(fu)) as e:
            loaderx.open_store(fu, cache_dir=str(tmp_path / "c3"), storage_options=opts)
        assert isinstance(e.value, (CorruptStoreError, loaderx.ZrecordIOError)), e.value


def test_a_server_that_never_answers_fails_within_timeout_times_attempts(tmp_path, s3, url,
                                                                        proxy):
    """A dead endpoint (it accepts connections and never answers) is a
    RemoteIOError within the request timeout times the attempts (4), at an
    open or in the middle of reads, however obstore's own retries go."""
    import socket
    from loaderx import _objstore
    base, faults = proxy
    u = f"{url}/{RAW}"
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections complete in the kernel's backlog: never answered
    bound = 0.5 * _objstore.ATTEMPTS
    try:
        opts = dict(s3.options(f"http://127.0.0.1:{sock.getsockname()[1]}"), timeout="0.5s")
        t = time.monotonic()
        with pytest.raises(RemoteIOError, match=f"no complete answer within {bound:g} s") as e:
            loaderx.open_store(u, cache_dir=str(tmp_path / "c"), storage_options=opts)
        assert time.monotonic() - t < bound + 1.5
        assert u in str(e.value)
    finally:
        sock.close()
    opts = dict(s3.options(base), timeout="0.5s")
    with loaderx.open_store(u, cache_dir=str(tmp_path / "c"), storage_options=opts) as store:
        faults.add("hang", 10**6, lambda m, p: m == "GET" and p.endswith("/data"))
        t = time.monotonic()
        with pytest.raises(RemoteIOError, match="no complete answer") as e:
            store[[5, 6]]
        assert time.monotonic() - t < bound + 1.5
        assert f"{u}/data" in str(e.value)


# ----------------------------------------------------------------- the hostile-server corpus

#: Cases of the seeded hostile-server corpus in a suite run (a few seconds);
#: LOADERX_FUZZ_SERVER_CASES=N runs more, LOADERX_FUZZ_SEED=S another corpus.
HOSTILE_CASES = int(os.environ.get("LOADERX_FUZZ_SERVER_CASES", "16"))
_HOSTILE_KINDS = ("503", "500", "reset", "cut", "short", "longlen", "noetag", "bighead",
                  "smallhead", "hang")
_HOSTILE_WHERE = {
    "any": None,
    "data": lambda m, p: m == "GET" and p.endswith("/data"),
    "index": lambda m, p: m == "GET" and p.endswith("/index"),
    "head": lambda m, p: m == "HEAD",
    "meta": lambda m, p: m == "GET" and p.endswith("/meta"),
}
_HOSTILE_TIMEOUT_S = 0.3  # the request timeout of a case: a "hang" costs 4 x this


@pytest.fixture(scope="module")
def hostile_stores(s3, tmp_path_factory):
    """Three small stores (raw dense, zstd dense, ragged) in two versions of
    the same sizes, the first uploaded: ``{kind: (url, v1 dir, v2 dir, v1)}``."""
    rng = np.random.default_rng(41)
    root = tmp_path_factory.mktemp("hostile")
    dense = rng.integers(0, 256, size=(64, 2000), dtype=np.uint8)
    ragged = [rng.integers(0, 1000, size=int(rng.integers(1, 400)), dtype=np.int32)
              for _ in range(64)]
    out = {}
    for kind, v1, v2, make in (
            ("raw", dense, dense[::-1].copy(), lambda p, v: loaderx.from_numpy(p, v, codec="raw")),
            ("zstd", dense, dense[::-1].copy(),
             lambda p, v: loaderx.from_numpy(p, v, codec="zstd")),
            ("ragged", ragged, ragged[::-1], lambda p, v: loaderx.from_iterator(p, v))):
        for name, version in (("v1", v1), ("v2", v2)):
            make(str(root / f"{kind}-{name}"), version).close()
        out[kind] = (s3.upload_dir(str(root / f"{kind}-v1"), f"hostile/{kind}"),
                     str(root / f"{kind}-v1"), str(root / f"{kind}-v2"), v1)
    return out


def _outcome(fn, want, url: str, cache: str) -> tuple:
    """(``exact`` | ``clear`` | ``wrong`` | ``other``, seconds, detail,
    result) of ``fn()``: the bytes of the version opened (any result when
    `want` is None), a loaderx error naming the URL or the cache, or
    anything else (another version's bytes, a foreign exception, an
    unclear error)."""
    t = time.monotonic()
    try:
        got = fn()
    except loaderx.LoaderxError as e:
        took = time.monotonic() - t
        named = url in str(e) or cache in str(e)
        return ("clear" if named else "other"), took, f"{type(e).__name__}: {e}", None
    except Exception as e:
        return "other", time.monotonic() - t, f"{type(e).__name__}: {e}", None
    took = time.monotonic() - t
    if want is None:
        return "exact", took, "", got
    same = (all(np.array_equal(g, w) for g, w in zip(got, want)) and len(got) == len(want)
            if isinstance(want, list) else np.array_equal(got, want))
    return ("exact" if same else "wrong"), took, "" if same else "another version's bytes", got


def hostile_case(rng, s3, base: str, faults, stores: dict, cache: str) -> list:
    """One seeded case: 1-3 faults (a kind, how many responses, which ones),
    an open through the proxy, random batches, sometimes the store replaced
    on the server between them. Returns [(step, outcome, seconds, detail)]."""
    kind = ["raw", "zstd", "ragged"][int(rng.integers(3))]
    url, v1_dir, v2_dir, v1 = stores[kind]
    faults.plan.clear()
    faults.release = threading.Event()
    plan = []
    for _ in range(int(rng.integers(1, 4))):
        fault = _HOSTILE_KINDS[int(rng.integers(len(_HOSTILE_KINDS)))]
        count = [1, 2, 3, 10**6][int(rng.integers(4))]
        where = list(_HOSTILE_WHERE)[int(rng.integers(len(_HOSTILE_WHERE)))]
        faults.add(fault, count, _HOSTILE_WHERE[where])
        plan.append(f"{fault}x{count}@{where}")
    replace_at = int(rng.integers(0, 6))  # before batch k (< 3), or never
    opts = dict(s3.options(base), timeout=f"{_HOSTILE_TIMEOUT_S}s")
    steps = []
    store = None
    try:
        *opened_, store = _outcome(lambda: loaderx.open_store(url, cache_dir=cache,
                                                              storage_options=opts),
                                   None, url, cache)
        steps.append(("open", *opened_))
        for k in range(3 if store is not None else 0):
            if k == replace_at:
                s3.upload_dir(v2_dir, f"hostile/{kind}")
            idx = rng.choice(64, int(rng.integers(1, 24)), replace=False)
            want = [v1[i] for i in idx] if kind == "ragged" else v1[idx]
            steps.append((f"batch {k}", *_outcome(lambda: store[idx], want, url, cache)[:3]))
    finally:
        faults.release.set()
        faults.plan.clear()
        if store is not None:
            store.close()
        if replace_at < 3:
            s3.upload_dir(v1_dir, f"hostile/{kind}")
    return [(f"{kind} {' '.join(plan)}",) + s for s in steps]


def test_hostile_servers_end_in_exact_bytes_or_a_clear_error_in_bounded_time(
        tmp_path, s3, proxy, hostile_stores):
    """The fault proxy in seeded random sequences (short bodies, bodies cut
    off or reset, no ETags, lying sizes, a server that never answers, 5xx,
    a store replaced on the server mid-read) over random batches of three
    kinds of store: every step ends in the bytes of the version opened or a
    loaderx error naming the URL or the cache, within the read budget
    (the request timeout x ATTEMPTS) of each request round it makes."""
    from loaderx import _objstore
    base, faults = proxy
    seed = int(os.environ.get("LOADERX_FUZZ_SEED", "37"))
    rng = np.random.default_rng(seed)
    bound = 3 * _HOSTILE_TIMEOUT_S * _objstore.ATTEMPTS + 3.0
    tally: dict = {}
    bad = []
    slowest = 0.0
    for case in range(HOSTILE_CASES):
        cache = str(tmp_path / f"c{case}")
        for what, step, outcome, took, detail in hostile_case(rng, s3, base, faults,
                                                               hostile_stores, cache):
            tally[outcome] = tally.get(outcome, 0) + 1
            slowest = max(slowest, took)
            if outcome not in ("exact", "clear") or took > bound:
                bad.append(f"case {case} ({what}), {step}: {outcome} in {took:.1f} s: {detail}")
    print(f"hostile servers, seed {seed}: {HOSTILE_CASES} cases, {sum(tally.values())} steps: "
          + ", ".join(f"{v} {k}" for k, v in sorted(tally.items()))
          + f"; slowest step {slowest:.1f} s (bound {bound:.1f} s)")
    assert not bad, "\n".join(bad)


# ----------------------------------------------------------------- every path takes a URL (issue 38)

#: Parameters that name a place to read or write.
PATH_PARAMS = ("path", "paths", "shards", "dataset", "source", "dest", "src", "dst", "store",
               "sources", "streams")
#: The public modules whose path-taking callables the walk finds by themselves.
PUBLIC_MODULES = ("loaderx", "loaderx.dataset", "loaderx.zrecord", "loaderx.legacy",
                  "loaderx.subset", "loaderx.converters", "loaderx.shardset", "loaderx.tokens",
                  "loaderx.mixture", "loaderx.dataloader", "loaderx.utils", "loaderx.converter",
                  "loaderx.ray")


def _path_callables() -> set:
    """``{(callable, parameter)}`` of every public callable (a class: its
    constructor, ``create`` and ``open``) with a parameter in PATH_PARAMS."""
    import importlib
    import inspect

    found = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if isinstance(obj, type) and issubclass(obj, BaseException) or not callable(obj):
                continue
            targets = [(obj, obj)]
            if isinstance(obj, type):
                targets = [(obj, obj.__init__)] + [(getattr(obj, m), getattr(obj, m))
                                                   for m in ("create", "open") if m in vars(obj)]
            for key, fn in targets:
                try:
                    params = inspect.signature(fn).parameters
                except (TypeError, ValueError):
                    continue
                found |= {(_callable_name(key), p) for p in params if p in PATH_PARAMS}
    return found


def _callable_name(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _walk_calls(c) -> dict:
    """``{(callable, parameter): (how the walk calls it with an s3:// URL, what
    it must do: "works", "refused", or a reason it is not called here)}``."""
    lx = loaderx
    new = c["new"]
    return {
        ("loaderx.zrecord.open_store", "path"): (lambda: lx.open_store(c["dense"]), "works"),
        ("loaderx.dataset.open_dataset", "path"): (lambda: lx.open_dataset(c["ds"]), "works"),
        ("loaderx._manifest.read_manifest", "path"): (lambda: lx.dataset.read_manifest(c["ds"]),
                                                      "works"),
        ("loaderx.dataset.labels", "dataset"): (lambda: lx.labels(c["ds"], "raw"), "works"),
        ("loaderx.subset.select", "dataset"): (lambda: lx.select(c["ds"], np.arange(N) < 9),
                                               "works"),
        ("loaderx.converters.convert", "source"): (
            lambda: lx.convert(c["ds"], c["tmp"] / "from-url", progress="off"), "works"),
        ("loaderx.converters.convert", "dest"): (
            lambda: lx.convert({"x": np.arange(5)}, new(), progress="off"), "works"),
        ("loaderx.converters.convert_to_directory", "source"): (
            lambda: lx.converters.convert_to_directory(c["dense"], c["tmp"] / "one-store",
                                                       progress="off"), "works"),
        ("loaderx.converters.convert_to_directory", "dest"): (
            lambda: lx.converters.convert_to_directory({"x": np.arange(5)}, new(),
                                                       progress="off"), "works"),
        ("loaderx.converters.open_source", "source"): (
            lambda: lx.converters.open_source(c["ds"], __import__(
                "loaderx.converters._source", fromlist=["Options"]).Options()), "works"),
        ("loaderx.dataset.from_numpy", "path"): (lambda: lx.from_numpy(new(), np.arange(4)),
                                                 "works"),
        ("loaderx.dataset.from_iterator", "path"): (
            lambda: lx.from_iterator(new(), [np.arange(3)]), "works"),
        ("loaderx.dataset.write_dataset", "path"): (
            lambda: lx.dataset.write_dataset(new(), np.arange(4)), "works"),
        ("loaderx.bytestore.Zrecord", "path"): (lambda: lx.Zrecord(c["bytes"]), "works"),
        ("loaderx.bytestore.Zrecord.create", "path"): (lambda: lx.Zrecord.create(new()),
                                                       "refused"),
        ("loaderx.dense.DenseStore", "path"): (lambda: lx.DenseStore(c["dense"]),
                                                        "works"),
        ("loaderx.dense.DenseStore.create", "path"): (
            lambda: lx.DenseStore.create(new(), np.uint8, (3,)), "refused"),
        ("loaderx._store.Store.open", "path"): (lambda: lx.RaggedStore.open(c["ragged"]),
                                                "works"),
        ("loaderx.ragged.RaggedStore", "path"): (lambda: lx.RaggedStore(c["ragged"]),
                                                          "works"),
        ("loaderx.ragged.RaggedStore.create", "path"): (
            lambda: lx.RaggedStore.create(new(), np.int32), "refused"),
        ("loaderx.shardset.ShardSet", "shards"): (
            lambda: lx.ShardSet([c["dense"], c["dense"]]), "works"),
        ("loaderx.tokens.TokenWindows", "store"): (
            lambda: lx.TokenWindows(c["ragged"], 8), "refused"),  # a path: open it first
        ("loaderx.mixture.Mixture", "sources"): (
            lambda: lx.Mixture({"a": {"x": c["dense"]}}, {"a": 1}), "refused"),
        ("loaderx.dataloader.DataLoader", "streams"): (
            lambda: lx.DataLoader({"x": c["dense"]}, 4), "refused"),
        ("loaderx.dictionary.train_dict", "source"): (
            lambda: lx.train_dict(lx.open_store(c["ragged"]), "fast"), "works"),
        ("loaderx.dictionary.train_dict", "path"): (
            lambda: lx.train_dict([b"x" * 64] * 16, path=new()), "refused"),
        ("loaderx.legacy.Dataset", "path"): (lambda: lx.Dataset(c["dense"]), "works"),
        ("loaderx.legacy.PackedDataset", "path"): (
            lambda: lx.dataset.Dataset(c["ragged"]), "works"),
        ("loaderx.subset.Selection", "dataset"): (None, "a description for people, never opened"),
        ("loaderx.subset.Selection", "source"): (
            None, "the dataset a selection came from, as select recorded it (select takes URLs)"),
        ("loaderx.ray.write_dataset", "dest"): (
            None, "starts Ray: tests/test_ray.py writes to s3:// (moto) and reads it back"),
        ("loaderx.ray.read_dataset", "dest"): (
            None, "starts Ray: tests/test_ray.py reads what it wrote to s3:// back"),
    }


def _close(got) -> None:
    values = got.values() if isinstance(got, dict) else [got]
    for v in values:
        _close(v) if isinstance(v, dict) else getattr(v, "close", lambda: None)()


def _walked(fn, url_part: str) -> str:
    """What one call did: "works", or "refused" with an error that is
    loaderx's (or a TypeError) and names the URL; never a raw OS error or a
    URL taken for a local path (``<cwd>/s3:/...``)."""
    try:
        got = fn()
    except Exception as e:  # noqa: BLE001 - judged below
        text = str(e)
        assert isinstance(e, (loaderx.LoaderxError, TypeError)), f"{type(e).__name__}: {text}"
        assert url_part in text, f"{type(e).__name__} does not name the URL: {text}"
        assert "s3:/" not in text.replace("s3://", ""), f"a URL taken for a path: {text}"
        return "refused"
    _close(got)
    return "works"


def test_every_public_path_takes_a_url_or_refuses_it_naming_it(tmp_path, s3, url):
    """Every public callable with a path parameter (found by signature in
    the public modules, so a new one must join the table) given an s3://
    URL: it works, or it refuses the URL with a loaderx error naming it."""
    from loaderx import _objstore

    bytes_dir = tmp_path / "bytes"
    with loaderx.Zrecord.create(str(bytes_dir)) as records:
        records.append([b"ab", b"", b"cde"])
    made = iter(range(1000))
    c = {"ds": url, "dense": f"{url}/{RAW}", "ragged": f"{url}/gen-000001/rag/part-00000",
         "bytes": s3.upload_dir(str(bytes_dir), "walk/bytes"), "tmp": tmp_path,
         "new": lambda: f"s3://{s3.bucket}/walk/new-{next(made)}"}
    calls = _walk_calls(c)
    missing = sorted(_path_callables() - set(calls))
    assert not missing, f"path-taking callables the walk does not call: {missing}"
    remote.configure(cache_dir=str(tmp_path / "cache"), storage_options=s3.options())
    try:
        done = {}
        for key, (fn, want) in calls.items():
            if fn is None:
                continue
            got = _walked(fn, "s3://")
            assert got == want, f"{key}: {got}, expected {want}"
            done[key] = got
        assert sum(1 for v in done.values() if v == "works") >= 20
        _adapters_read_urls(c)
    finally:
        remote._DEFAULTS.clear()
        _objstore._forget_clients()


def _adapters_read_urls(c) -> None:
    """The torch and JAX adapters over a dataset opened from its URL."""
    ds = loaderx.open_dataset(c["ds"], ["raw"])
    try:
        local = ds["raw"][:8]
        torch = pytest.importorskip("torch")
        import loaderx.torch as lxtorch

        adapter = lxtorch.IterableDataset(
            lambda rank, world: loaderx.DataLoader(ds, 8, mode="sequential",
                                                   shard=(rank, world)), rank=0, world=1)
        batch = next(iter(adapter))
        assert isinstance(batch["raw"], torch.Tensor)
        assert_same(batch["raw"].numpy(), local)
        adapter.close()
        jax = pytest.importorskip("jax")
        import loaderx.jax as lxjax

        sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:1]),
                                                                ("d",)),
                                              jax.sharding.PartitionSpec("d"))
        with loaderx.DataLoader(ds, 8, mode="sequential") as loader:
            got = next(lxjax.global_batches(loader, sharding))
        assert_same(np.asarray(got["raw"]), local)
    finally:
        ds["raw"].close()


def test_the_cli_takes_a_url_for_every_path_or_refuses_it_naming_it(tmp_path, s3, url, local_ds,
                                                                     capsys):
    """`loaderx info / verify / select / convert / compact / train-dict` with an
    s3:// URL for each path they take."""
    from loaderx import _objstore
    from loaderx.__main__ import main

    loaderx.convert({"x": np.arange(50)}, str(tmp_path / "scalar"), progress="off")
    scalar = s3.upload_dir(str(tmp_path / "scalar"), "cli-walk/scalar")
    remote.configure(cache_dir=str(tmp_path / "cache"), storage_options=s3.options())
    store = f"{url}/{RAW}"
    runs = [
        (["info", url, "--json"], 0), (["info", store], 0), (["verify", store], 0),
        (["select", scalar, "x < 5", "--count"], 0),
        (["convert", url, str(tmp_path / "copy"), "-q"], 0),
        (["convert", store, f"s3://{s3.bucket}/cli-walk/one", "-q"], 0),
        (["compact", store], 1),  # a remote store is read-only
        (["train-dict", f"{url}/gen-000001/rag/part-00000", "-o", str(tmp_path / "d")], 0),
        (["train-dict", store, "-o", f"s3://{s3.bucket}/d"], 1),
        (["select", scalar, "x < 5", "--out", f"s3://{s3.bucket}/rows.npy"], 1),
    ]
    try:
        for argv, want in runs:
            capsys.readouterr()
            rc = main(argv)
            err = capsys.readouterr().err
            assert rc == want, (argv, err)
            if rc:
                assert "s3://" in err and "[Errno" not in err, (argv, err)
                assert "s3:/" not in err.replace("s3://", ""), (argv, err)
    finally:
        remote._DEFAULTS.clear()
        _objstore._forget_clients()
    copy = loaderx.open_dataset(str(tmp_path / "copy"))
    local = loaderx.open_dataset(local_ds)
    assert list(copy) == list(local) == ["raw", "z", "zz", "rag"]
    for name in copy:
        for got, want in zip(copy[name][[0, 7, N - 1]], local[name][[0, 7, N - 1]]):
            assert_same(got, want)
    for col in list(copy.values()) + list(local.values()):
        col.close()


def test_a_subset_checkpoint_taken_on_s3_resumes_on_a_local_copy(tmp_path, s3, url, local_ds):
    """A subset's fingerprint names the records, not where they are: a state
    taken over the dataset at its s3:// URL resumes on the local directory
    its files came from, and on a local copy converted from the URL."""
    remote.configure(cache_dir=str(tmp_path / "cache"), storage_options=s3.options())
    try:
        mask = np.arange(N) % 3 == 0
        view = loaderx.select(url, mask)["raw"]
        with loaderx.DataLoader({"raw": view}, 8, seed=1) as loader:
            next(loader)
            state = loader.state_dict()
            expected = next(loader)["raw"]
        view.close()
        loaderx.convert(url, str(tmp_path / "converted"), progress="off")
    finally:
        remote._DEFAULTS.clear()
    for where in (local_ds, str(tmp_path / "converted")):
        local = loaderx.select(where, mask)["raw"]
        assert local.fingerprint == state["fingerprints"]["raw"], where
        with loaderx.DataLoader({"raw": local}, 8, seed=1) as loader:
            loader.load_state_dict(state)
            assert_same(next(loader)["raw"], expected)
        local.close()


def test_a_failed_open_leaves_no_request_to_abort_the_interpreter_at_exit(s3, tmp_path):
    """Opening a missing dataset raised while sibling requests were still in
    flight; one that finished during interpreter finalisation made obstore's
    runtime thread take the GIL there, and the process died of SIGABRT after
    the script's last line (about 1 run in 4 before the fix)."""
    import json

    code = ("import json, sys, loaderx\n"
            "try:\n"
            "    loaderx.open_dataset('s3://loaderx-test/no-such-dataset', cache_dir=sys.argv[2],"
            " storage_options=json.loads(sys.argv[1]))\n"
            "except FileNotFoundError:\n"
            "    pass\n")
    for run in range(15):
        proc = subprocess.run([sys.executable, "-c", code, json.dumps(s3.options()),
                               str(tmp_path / f"c{run}")], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, (run, proc.returncode, proc.stderr[-2000:])
