"""The remote layer's parts that need no server (the fast tier): cache limit
parsing, how the fetch client groups ranges and leases file descriptors
(loaderx._objstore), and the upgrade of a version 1 cache directory."""
from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("obstore")

from loaderx import _cachedir  # noqa: E402

from _lxlayout import CACHE_HEAD_OFFSETS  # noqa: E402
from _remote_helpers import NONE, SEQ, cache_head  # noqa: E402


def test_limit_parsing():
    assert _cachedir.parse_limit("200GiB") == 200 << 30
    assert _cachedir.parse_limit("1.5 MB") == 1_500_000
    assert _cachedir.parse_limit(4096) == 4096
    for bad in (0, -1, "x", "10 parsecs", True):
        with pytest.raises(ValueError):
            _cachedir.parse_limit(bad)


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


@pytest.mark.parametrize("url", ["ftp://host/x", "file:///tmp/x", "hdfs://nn/p", "S3A://b/k"])
def test_a_url_of_a_scheme_loaderx_does_not_read_is_refused_not_written_as_a_path(
        tmp_path, monkeypatch, url):
    """Before, `ftp://x/y` was a relative path: convert wrote ./ftp:/x/y."""
    import subprocess
    import sys

    import loaderx

    monkeypatch.chdir(tmp_path)
    scheme = url.partition("://")[0]
    for call in (lambda: loaderx.from_numpy(url, np.arange(3)),
                 lambda: loaderx.convert({"x": np.arange(3)}, url, progress=False),
                 lambda: loaderx.open_dataset(url), lambda: loaderx.open_store(url)):
        with pytest.raises(ValueError, match=f"does not read {scheme}:// URLs; it reads s3://"):
            call()
    out = subprocess.run([sys.executable, "-m", "loaderx", "info", url],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and f"does not read {scheme}://" in out.stderr
    assert "Traceback" not in out.stderr
    assert os.listdir(tmp_path) == []  # nothing was written under a path named after the URL


def test_every_failed_request_of_a_fetch_is_retrieved_not_logged_at_exit(caplog):
    """Before, when two ranged calls of one fetch failed, the first error was
    raised and the second task's was left unretrieved: asyncio printed "Task
    exception was never retrieved" with its traceback on stderr."""
    import asyncio
    import gc

    from loaderx import _objstore

    async def fails(n):
        await asyncio.sleep(0.01 * n)
        raise OSError(f"request {n}")

    async def fine():
        return 7

    with caplog.at_level("ERROR", logger="asyncio"):
        with pytest.raises(OSError, match="request 1"):
            asyncio.run(_objstore._all([fine(), fails(1), fails(2), fails(3)]))
        assert asyncio.run(_objstore._all([fine(), fine()])) == [7, 7]
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_configure_refuses_a_bad_setting_at_once_and_keeps_the_defaults():
    """Before, ``remote.configure(cache_dir=5)`` or ``storage_options=5`` was
    kept, and every later remote open failed with os.fspath's "expected
    str, bytes or os.PathLike object, not int"."""
    from loaderx import remote
    from loaderx.errors import InvalidArgumentError

    before = dict(remote._DEFAULTS)
    for kwargs, error, said in (
            ({"cache_dir": 5}, TypeError, "cache_dir must be a path .*not int"),
            ({"cache_dir": "a\0b"}, InvalidArgumentError, "cache_dir 'a\\\\x00b' contains a NUL"),
            ({"storage_options": 5}, TypeError, "storage_options must be a dict, not int"),
            ({"storage_options": {1: 2}}, InvalidArgumentError, "keys must be strings"),
            ({"cache_limit": "lots"}, InvalidArgumentError, "cache_limit must be a positive")):
        with pytest.raises(error, match=said):
            remote.configure(**kwargs)
        assert remote._DEFAULTS == before, kwargs
    with pytest.raises(TypeError, match="cache_dir must be a path"):
        remote.Config(cache_dir=5)
