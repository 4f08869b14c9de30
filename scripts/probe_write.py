"""Durable write time of a raw DenseStore against np.save, alone.

    python scripts/probe_write.py [--rounds 7] [--dir DIR]

The dense layer's write rows (SPEC section 9: within 2x of the fastest
contender) take one to three writes per backend, interleaved with a dozen
other writers, on a disk and a VM whose write times move between rounds.
This probe times only the two: for each record size of the dense layer
(200 B, 12 KiB, 256 KiB; 8-16 MiB, as at --size small), in alternating
order, after an os.sync(): create + append + close of a raw DenseStore (the
bar's configuration), np.save, and a DenseStore with the default codec
(zstd: what a user gets without asking, held in the bench against the
fastest zstd contender, shown here beside npy for scale); each followed by
an fsync of every file made (bench_harness.fsync_tree, as the bench does).
Prints medians and the median of per-round ratios (npy time / loaderx time:
loaderx's rate over npy's).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

from bench_harness import fsync_tree

import loaderx

SHAPES = {"200 B": ((41943, 100), np.int16), "12 KiB": ((1365, 64, 64, 3), np.uint8),
          "256 KiB": ((64, 256, 256, 4), np.uint8)}


def _npy(directory: str, a: np.ndarray) -> None:
    np.save(os.path.join(directory, "data.npy"), a)


def _loaderx(directory: str, a: np.ndarray, codec: Optional[str] = "raw") -> None:
    """codec None: what a user gets without asking (zstd)."""
    with loaderx.DenseStore(os.path.join(directory, "store"), a.dtype, a.shape[1:],
                            codec=codec) as store:
        store.append(a)


def _loaderx_default(directory: str, a: np.ndarray) -> None:
    _loaderx(directory, a, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = ap.parse_args()
    base = tempfile.mkdtemp(dir=args.dir)
    try:
        for label, (shape, dtype) in SHAPES.items():
            a = np.random.default_rng(0).integers(0, 255, size=shape).astype(dtype)
            writers = [("loaderx", _loaderx), ("npy", _npy), ("default", _loaderx_default)]
            times: dict = {name: [] for name, _ in writers}
            for r in range(args.rounds):
                for name, write in writers if r % 2 == 0 else writers[::-1]:
                    directory = os.path.join(base, f"{name}{r}")
                    os.makedirs(directory)
                    os.sync()
                    t0 = time.perf_counter()
                    write(directory, a)
                    fsync_tree(Path(directory))
                    times[name].append(time.perf_counter() - t0)
                    shutil.rmtree(directory)
            mib = a.nbytes / 2**20

            def rate(name: str) -> float:
                return mib / statistics.median(times[name])

            def vs_npy(name: str) -> float:
                return statistics.median(n / x for n, x in zip(times["npy"], times[name]))

            print(f"{label:>8}, {mib:.0f} MiB: np.save {rate('npy'):7.0f} MiB/s, loaderx raw "
                  f"{rate('loaderx'):7.0f} MiB/s, loaderx / npy {vs_npy('loaderx'):.2f}x; "
                  f"default codec (zstd) {rate('default'):6.0f} MiB/s, "
                  f"{vs_npy('default'):.2f}x npy")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
