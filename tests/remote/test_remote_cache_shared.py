"""Processes sharing one remote cache: each byte fetched once, forked and
spawned workers, and kill -9 in the middle of a fetch or of an eviction
beside other readers (issue 38): every reader stays exact, nothing of the
dead process's is marked present, its locks and pins block nothing."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")

import loaderx  # noqa: E402

from _helpers import assert_same  # noqa: E402
from _lxlayout import CACHE_PAGE  # noqa: E402
from _remote_helpers import N, RAW, REC, SEQ, ZZ, _env, opened, replica_state  # noqa: E402

pytestmark = pytest.mark.slow


_READER = r"""
import sys, numpy as np, loaderx
url, cache, endpoint = sys.argv[1:4]
opts = {"endpoint": endpoint, "access_key_id": "testing", "secret_access_key": "testing",
        "region": "us-east-1", "allow_http": "true"}
ds = loaderx.open_dataset(url, columns=["raw"], cache_dir=cache, storage_options=opts)
idx = np.arange(0, 400, 3)
print(int(ds["raw"][idx].astype(np.int64).sum()))
"""


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
