"""Python hops per read: how many loaderx Python functions one call enters.

    python scripts/count_hops.py

Counts the Python-level calls (``sys.setprofile`` "call" events) inside the
loaderx package for one ``DenseStore[idx]`` of 256 random records and for
one ``next()`` of a 2-worker DataLoader over that store (warm: after a few
batches), and prints them with the functions entered, so a refactor's
"fewer layers" claim is a number (issue 23's "hops"). It runs whichever
loaderx is first on ``sys.path`` (PYTHONPATH=<tree> to compare trees).
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


def main() -> None:
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
