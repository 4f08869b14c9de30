"""A remote cache on a full disk (issue 37): a small tmpfs or ext4 mounted
for the test (skipped where this process may not mount one), read from a
child process (a SIGBUS would end the run): never a fault, a NoSpaceError
naming the cache, eviction and refetch, and bytes nothing marks reclaimed."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")

import loaderx  # noqa: E402

from _remote_helpers import ZZ, _env  # noqa: E402

pytestmark = pytest.mark.slow


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
