"""Suite-wide settings and the fixtures the test folders share.

Layout: the tests live in one folder per layer (store/, loader/, convert/,
remote/, select/, tokens/, image/, adapters/, compat/, faults/, project/);
the modules they share (``_helpers``, ``_servers``, the fuzz corpora, the
store forger...) stay in tests/ itself, which this file puts on ``sys.path``
so that every folder imports them by name (``from _servers import MotoS3``).
A folder's own fixtures are in its conftest.py.

Tiers: tests marked ``slow`` (kill -9 and fork sweeps, subprocess-heavy
tests, S3 servers, the bench smoke, the fuzz corpora, the real 1.7.7
package, the docs' blocks) run after the rest; .ci/run runs
``-m "not slow"`` first, so a failure shows in minutes, then ``-m slow``.

Remote caches get a fixed size: without a ``cache_limit`` a cache leaves 5%
of its file system free and evicts to stay under that, so on a nearly full
disk a warm read fetches again and tests asserting what crosses the network
would fail by where they ran. Tests of limits pass their own; the test of the
free-space rule unsets this."""
import os
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

os.environ.setdefault("LOADERX_CACHE_LIMIT", "4GiB")

from _helpers import counting_store, run_cli  # noqa: E402


# Files whose tests take 5-55 s each on 2 cores: they lead their tier, so
# pytest-xdist deals them out one per worker in its first round instead of
# handing a worker several of them in one later chunk. (Not test_ray.py: its
# tests share a module fixture, a local Ray instance per worker that runs them.)
LONG = frozenset({"test_bench_smoke.py", "test_corruption_corpus.py",
                  "test_bytes_concurrency.py", "test_dataloader_ring.py",
                  "test_examples.py", "test_cli.py", "test_bytes_crash.py"})


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    """The fast tier first, then the tests marked ``slow``, each tier's
    longest files first, otherwise in the order collected (after the folders'
    conftest.py files have marked theirs)."""
    items.sort(key=lambda item: (item.get_closest_marker("slow") is not None,
                                 item.path.name not in LONG))


@pytest.fixture(scope="session")
def s3():
    """moto's S3 server on loopback with the bucket ``loaderx-test``
    (_servers.MotoS3), one per pytest session: tests write under prefixes of
    their own (`MotoS3.upload_dir`) or buckets of their own (`new_bucket`)."""
    pytest.importorskip("moto")
    pytest.importorskip("obstore")
    from _servers import MotoS3

    server = MotoS3()
    yield server
    server.stop()


@pytest.fixture
def proxy(s3):
    """A fault-injecting, counting HTTP proxy in front of the session's S3
    server: (base URL, _servers.Faults)."""
    from _servers import fault_proxy

    server, base, faults = fault_proxy(s3.endpoint)
    yield base, faults
    faults.release.set()  # (ends any "hang")
    server.shutdown()


@pytest.fixture
def cli():
    """The command line as a user runs it: ``cli("info", path)`` runs
    ``python -m loaderx info PATH`` in a fresh process (the repository on
    PYTHONPATH) and returns the CompletedProcess (text output); keywords:
    ``cwd``, ``env`` (added to the environment), ``timeout``."""
    return run_cli


@pytest.fixture
def store(tmp_path):
    """A dense store whose record i is i (int64), 200 records (the loader
    tests' store; a test file with a store of its own defines its own)."""
    yield from counting_store(tmp_path)
