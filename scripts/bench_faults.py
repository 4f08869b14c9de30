"""Page faults per batch of loaderx's output memory, on four workloads.

    python scripts/bench_faults.py [--rounds N] [--smoke] [--against TREE]

What it measures: the minor page faults (``getrusage(RUSAGE_SELF).ru_minflt``)
a process takes per batch in steady state, and the median time per batch, on

  * ``loader``: a DataLoader over a 12 KiB-record uint8 DenseStore and an
    int64 label store, batch 256 (3 MiB per batch, as the loader bench);
  * ``loader-ragged``: a DataLoader over a RaggedStore of ~12 KiB int32
    records, batch 256;
  * ``ragged-gather``: ``RaggedStore[idx]`` of the same records, batch 256;
  * ``dense-256k``: ``DenseStore[idx]`` of 256 KiB records, batch 64 (16 MiB).

Each workload runs in a fresh process (``child`` mode): it validates its first
batches against the numpy source, takes warm-up batches (the pool fills),
then counts faults and times over the measured batches, dropping each batch
before the next as a training loop does. ``--against TREE`` also runs every
workload with ``PYTHONPATH=TREE`` (another loaderx checkout with its library
built, e.g. the commit before a change) and prints the two side by side,
interleaved round by round, with the ratio of the medians. ``--smoke`` runs
tiny sizes once (the test suite does; it checks the harness, not figures).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

ROOT = Path(__file__).resolve().parent.parent

WORKLOADS = ("loader", "loader-ragged", "ragged-gather", "dense-256k")

SIZES = {
    # records, batch, warm-up batches, measured batches, record bytes (dense)
    "full": {"loader": (4096, 256, 20, 200), "loader-ragged": (4096, 256, 20, 200),
             "ragged-gather": (4096, 256, 20, 200), "dense-256k": (512, 64, 10, 60)},
    "smoke": {"loader": (512, 32, 2, 4), "loader-ragged": (512, 32, 2, 4),
              "ragged-gather": (512, 32, 2, 4), "dense-256k": (64, 8, 2, 4)},
}
ITEM_BYTES = 12 << 10
ROW_BYTES = 256 << 10


def make_data(root: Path, size: str) -> None:
    """The stores every workload reads (written once, by this process)."""
    import numpy as np
    from loaderx import DenseStore, RaggedStore

    rng = np.random.default_rng(7)
    count = SIZES[size]["loader"][0]
    with DenseStore(root / "x", np.uint8, (ITEM_BYTES,), codec="raw") as x:
        for first in range(0, count, 512):
            n = min(512, count - first)
            x.append(rng.integers(0, 255, (n, ITEM_BYTES), dtype=np.uint8))
    with DenseStore(root / "y", np.int64, (), codec="raw") as y:
        y.append(np.arange(count, dtype=np.int64))
    with RaggedStore(root / "r", np.int32, codec="raw") as r:
        lengths = rng.integers(2500, 3500, count)
        r.append([np.full(n, i, np.int32) for i, n in enumerate(lengths)])
    rows = SIZES[size]["dense-256k"][0]
    with DenseStore(root / "big", np.uint8, (ROW_BYTES,), codec="raw") as big:
        for first in range(0, rows, 32):
            n = min(32, rows - first)
            big.append(np.full((n, ROW_BYTES), 0, np.uint8) + (np.arange(first, first + n)
                                                                 % 251).astype(np.uint8)[:, None])


def _batches(workload: str, root: Path, count: int, batch: int) -> Callable[[], Any]:
    """A function returning the next batch of `workload` (checked first)."""
    import numpy as np
    from loaderx import DataLoader, DenseStore, RaggedStore

    rng = np.random.default_rng(1)
    if workload in ("loader", "loader-ragged"):
        streams = ({"x": DenseStore(root / "x"), "y": DenseStore(root / "y")}
                   if workload == "loader" else {"r": RaggedStore(root / "r")})
        loader = DataLoader(streams, batch, seed=3)
        first = next(loader)
        if workload == "loader":
            ids = first["y"]
            np.testing.assert_array_equal(first["x"], streams["x"][ids])
        else:
            assert all((rec == rec[0]).all() for rec in first["r"])
        return lambda: next(loader)
    if workload == "ragged-gather":
        store = RaggedStore(root / "r")
        idx = rng.integers(0, count, batch)
        got = store[idx]
        assert [int(rec[0]) for rec in got] == idx.tolist()
        return lambda: store[rng.integers(0, count, batch)]
    big = DenseStore(root / "big")
    idx = rng.integers(0, len(big), batch)
    got = big[idx]
    assert (got[:, 0] == (idx % 251)).all() and (got[:, -1] == (idx % 251)).all()
    return lambda: big[rng.integers(0, len(big), batch)]


def child(workload: str, root: str, size: str) -> Dict[str, float]:
    """Runs one workload in this (fresh) process; prints its figures as JSON."""
    count, batch, warm, measured = SIZES[size][workload]
    take = _batches(workload, Path(root), count, batch)
    for _ in range(warm):
        take()
    times: List[float] = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(measured):
        start = time.perf_counter()
        got = take()
        times.append(time.perf_counter() - start)
        del got
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"faults": faults / measured, "us": statistics.median(times) * 1e6}


def run_child(tree: Path, workload: str, root: Path, size: str) -> Dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, __file__, "child", workload, str(root), size],
                         capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{workload} under {tree} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: List[str]) -> int:
    if argv[:1] == ["child"]:
        print(json.dumps(child(argv[1], argv[2], argv[3])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--against", type=Path, help="another loaderx tree to compare with")
    args = parser.parse_args(argv)
    size = "smoke" if args.smoke else "full"
    rounds = 1 if args.smoke else args.rounds
    trees = {"this": ROOT} | ({"against": args.against} if args.against else {})
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="loaderx-faults-") as tmp:
        make_data(Path(tmp), size)
        results: Dict[str, Dict[str, List[Dict[str, float]]]] = {}
        for _ in range(rounds):  # trees interleaved within each round
            for workload in WORKLOADS:
                for name, tree in trees.items():
                    got = run_child(tree, workload, Path(tmp), size)
                    results.setdefault(workload, {}).setdefault(name, []).append(got)
    print(f"faults per batch and median us per batch, median of {rounds} fresh processes "
          f"(load {os.getloadavg()[0]:.1f})")
    for workload, by_tree in results.items():
        cells = []
        for name, runs in by_tree.items():
            faults = statistics.median(r["faults"] for r in runs)
            us = statistics.median(r["us"] for r in runs)
            cells.append(f"{name}: {faults:8.1f} faults {us:9.0f} us")
        if "against" in by_tree:
            ratio = (statistics.median(r["us"] for r in by_tree["against"])
                     / statistics.median(r["us"] for r in by_tree["this"]))
            cells.append(f"speed this/against {ratio:.2f}x")
        print(f"{workload:14s} " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
