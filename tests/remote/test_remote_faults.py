"""Faulty and hostile servers (the fault proxy of tests/_servers.py): transient
faults are retried, hard ones raise OS errors naming the URL, bad bytes fail
their checksums, servers without ETags, short or broken bodies, lying sizes
and silence end in exact bytes or a clear error in bounded time; and a
seeded corpus of hostile servers (LOADERX_FUZZ_SERVER_CASES, LOADERX_FUZZ_SEED)."""
from __future__ import annotations

import os
import re
import threading
import time

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")

import loaderx  # noqa: E402
from loaderx.errors import (  # noqa: E402
    CorruptStoreError,
    RemoteChangedError,
    RemoteIOError,
    RemoteNotFoundError,
    RemotePermissionError,
)

from _helpers import assert_same  # noqa: E402
from _remote_helpers import N, RAW, REC, opened  # noqa: E402
from _servers import range_server  # noqa: E402

pytestmark = pytest.mark.slow


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


def test_the_cli_says_when_a_server_keeps_it_waiting_and_takes_a_timeout(tmp_path):
    """Before, ``loaderx info s3://...`` against a server that never answers
    sat silent for 4 minutes (60 s x 4 attempts) before it failed; it had no
    way to shorten that."""
    import socket
    import subprocess
    import sys

    from loaderx import _objstore

    assert _objstore.slow_notice is None  # the library itself says nothing
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    env = dict(os.environ, AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s",
               AWS_REGION="us-east-1", AWS_ALLOW_HTTP="true",
               AWS_ENDPOINT_URL=f"http://127.0.0.1:{sock.getsockname()[1]}",
               LOADERX_CACHE_DIR=str(tmp_path / "cache"))
    try:
        t = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "loaderx", "info", "s3://b/ds", "--timeout",
                              "0.5"], env=env, capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t
    finally:
        sock.close()
    lines = out.stderr.splitlines()
    assert out.returncode == 1 and len(lines) == 2, out.stderr
    assert lines[0] == ("loaderx info: s3://b/ds/loaderx.json: no answer after 0.5 s; still "
                        "trying (it gives up after 2 s; --timeout SECONDS shortens that)")
    assert "no complete answer within 2 s" in lines[1]
    assert took < 15
    out = subprocess.run([sys.executable, "-m", "loaderx", "info", "s3://b/ds", "--timeout", "0"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "must be a number of seconds above 0" in out.stderr


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
