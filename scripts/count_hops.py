"""Python hops per read: how many loaderx Python functions one call enters.

    python scripts/count_hops.py            # a local store
    python scripts/count_hops.py --remote   # a store in object storage (moto)

Counts the Python-level calls (``sys.setprofile`` "call" events) inside the
loaderx package for one ``DenseStore[idx]`` of 256 random records and for
one ``next()`` of a 2-worker DataLoader over that store (warm: after a few
batches), and prints them with the functions entered, so a refactor's
"fewer layers" claim is a number (issue 23's "hops"). ``--remote`` reads the
same store from a moto S3 server on loopback (tests/_servers.py) through the
node-local cache, and counts per cold step (nothing cached) and per warm
step (everything cached and checked) both the Python calls of the calling
thread and the native calls (``lib.lx_*``) made from Python on any thread.
It runs whichever loaderx is first on ``sys.path`` (PYTHONPATH=<tree> to
compare trees).
"""
from __future__ import annotations

import collections
import os
import sys
import tempfile

import numpy as np

import loaderx
from loaderx import DataLoader, DenseStore

PACKAGE = os.path.dirname(os.path.abspath(loaderx.__file__))


def hops(fn):
    """(count, Counter of 'module.function') of loaderx calls made by fn()."""
    seen: collections.Counter = collections.Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            module = os.path.relpath(frame.f_code.co_filename, PACKAGE)
            seen[f"{module}:{frame.f_code.co_name}"] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return sum(seen.values()), seen


class NativeCalls:
    """Counts the calls of ``lib.lx_*`` made from Python (any thread): the
    ``lib`` every loaderx module imported is swapped for a counting proxy."""

    def __init__(self):
        from loaderx import _lib

        self.real = _lib.lib
        self.seen: collections.Counter = collections.Counter()
        self.modules = [m for name, m in list(sys.modules.items())
                        if name.startswith("loaderx") and getattr(m, "lib", None) is self.real]
        for m in self.modules:
            m.lib = self

    def __getattr__(self, name):
        fn = getattr(self.real, name)
        if not name.startswith("lx_") or name in ("lx_last_error", "lx_strerror"):
            return fn

        def call(*args):
            self.seen[name] += 1
            return fn(*args)
        return call

    def take(self) -> collections.Counter:
        out, self.seen = self.seen, collections.Counter()
        return out

    def restore(self) -> None:
        for m in self.modules:
            m.lib = self.real


#: A loader's calls once per life, not per step.
LOADER_LIFE = ("lx_loader_open", "lx_loader_stop", "lx_loader_free")


def _report(what: str, count: int, seen, native) -> None:
    calls = sum(native.values())
    print(f"{what}: {count} loaderx Python calls (calling thread), {calls} native calls")
    for name, n in seen.most_common():
        print(f"    {n:3d}  {name}")
    for name, n in native.most_common():
        print(f"    {n:3d}  lib.{name}")


def remote_main() -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))), "tests"))
    from _servers import MotoS3

    server = MotoS3()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            rows = np.arange(20_000 * 64, dtype=np.float32).reshape(20_000, 64)
            local = os.path.join(tmp, "x")
            loaderx.from_numpy(local, rows, codec="raw").close()
            url = server.upload_dir(local, "hops/x")
            idx = np.random.default_rng(0).integers(0, len(rows), 256)
            opts = server.options()
            with loaderx.open_store(url, cache_dir=os.path.join(tmp, "c"),
                                    storage_options=opts) as store:
                store[idx[:1]]  # (the first request's client set-up out of the count)
                native = NativeCalls()
                try:
                    count, seen = hops(lambda: store[idx])
                    _report("remote DenseStore[idx], cold", count, seen, native.take())
                    count, seen = hops(lambda: store[idx])
                    _report("remote DenseStore[idx], warm", count, seen, native.take())
                    steps = 32
                    for what in ("cold", "warm"):  # (the second run reads the same steps)
                        with DataLoader({"x": store}, 256, workers=2, seed=1) as loader:
                            native.take()
                            for _ in range(steps):
                                next(loader)
                        seen = native.take()
                        life = {name: seen.pop(name) for name in LOADER_LIFE if name in seen}
                        print(f"remote DataLoader, {what}: {sum(seen.values()) / steps:.2f} "
                              f"native calls per step (every thread, {steps} steps; besides "
                              f"the loader's {sum(life.values())} of opening and closing; "
                              "steps fetched ahead of the last one taken count too)")
                        for name, n in seen.most_common():
                            print(f"    {n:3d}  lib.{name}")
                finally:
                    native.restore()
    finally:
        server.stop()
    print(f"(loaderx from {PACKAGE})")


def main() -> None:
    if "--remote" in sys.argv[1:]:
        remote_main()
        return
    with tempfile.TemporaryDirectory() as tmp:
        rows = np.arange(100_000 * 8, dtype=np.float32).reshape(100_000, 8)
        path = os.path.join(tmp, "x")
        with DenseStore(path, np.float32, (8,)) as ds:
            ds.append(rows)
        idx = np.random.default_rng(0).integers(0, len(rows), 256)
        with DenseStore(path) as store:
            store[idx]
            count, seen = hops(lambda: store[idx])
            print(f"DenseStore[idx]: {count} loaderx Python calls")
            for name, n in seen.most_common():
                print(f"    {n:3d}  {name}")
            with DataLoader({"x": store}, 256, workers=2) as loader:
                for _ in range(5):
                    next(loader)
                count, seen = hops(lambda: next(loader))
            print(f"DataLoader next(): {count} loaderx Python calls (consumer thread)")
            for name, n in seen.most_common():
                print(f"    {n:3d}  {name}")
    print(f"(loaderx from {PACKAGE})")


if __name__ == "__main__":
    main()
