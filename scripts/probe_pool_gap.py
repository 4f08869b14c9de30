"""What a gap between two gathers costs the second one, and what the pool's
polling window costs a caller's own threads.

    python scripts/probe_pool_gap.py [--baseline DIR] [--rounds 3]

A diagnostic behind one constant (src/pool.zig, ``poll_ns``): the pool's
worker threads poll for a while after a job before they sleep on a futex,
because a sleeping worker joins the next gather late (its wake-up). The
probe times a 256 x 12 KiB raw gather (a 20,000-record DenseStore, sorted
random indices, reused output) after a busy-wait of 0 to 2,000 us in Python,
then a loop of numpy matmuls (OpenBLAS threads) with a gather after each,
against the matmuls alone: what polling takes from a caller's own threads.

With ``--baseline DIR`` (a directory holding another ``loaderx`` package,
e.g. a worktree of an earlier commit with its library built) every round
runs both packages in fresh processes, alternately, and the table shows
both with their ratio (baseline / this one: above 1 means this one is
faster).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GAPS_US = (0, 10, 20, 40, 80, 160, 500, 2000)
MATMUL_SIZES = (128, 256, 512)


def measure(path: str, batches: int) -> dict:
    """One round in this process: {"gap <us>": gather us, "matmul <n>": extra us per step}."""
    import numpy as np

    import loaderx

    rng = np.random.default_rng(1)
    out = np.empty((256, 12288), np.uint8)
    figures = {}
    with loaderx.DenseStore(path) as store:
        idxs = [np.sort(rng.choice(len(store), 256, replace=False)) for _ in range(batches)]
        for idx in idxs[:50]:  # warm the mapping and the pool
            store.gather(idx, out=out)
        for gap in GAPS_US:
            times = []
            for idx in idxs:
                until = time.perf_counter() + gap * 1e-6
                while time.perf_counter() < until:
                    pass
                t0 = time.perf_counter_ns()
                store.gather(idx, out=out)
                times.append(time.perf_counter_ns() - t0)
            figures[f"gather after {gap} us"] = statistics.median(times) / 1e3
        for n in MATMUL_SIZES:
            a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
            t0 = time.perf_counter()
            for _ in idxs:
                a @ a
            alone = (time.perf_counter() - t0) / len(idxs)
            t0 = time.perf_counter()
            for idx in idxs:
                a @ a
                store.gather(idx, out=out)
            both = (time.perf_counter() - t0) / len(idxs)
            figures[f"matmul {n} + gather"] = both * 1e6
            figures[f"matmul {n} alone"] = alone * 1e6
    return figures


def child(package_dir: str, path: str, batches: int) -> dict:
    env = dict(os.environ, PYTHONPATH=package_dir)
    code = (f"import sys, json; sys.path.insert(0, {str(ROOT / 'scripts')!r}); "
            f"import probe_pool_gap as p; print(json.dumps(p.measure({path!r}, {batches})))")
    done = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", help="a directory holding another loaderx package")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=300)
    args = ap.parse_args()
    import numpy as np

    import loaderx

    packages = {"this": str(ROOT)}
    if args.baseline:
        packages = {"baseline": str(Path(args.baseline).resolve()), **packages}
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "gap")
        rows = np.random.default_rng(0).integers(0, 255, size=(20000, 12288), dtype=np.uint8)
        loaderx.from_numpy(path, rows, codec="raw")
        runs: dict[str, list[dict]] = {name: [] for name in packages}
        for _ in range(args.rounds):
            for name, where in packages.items():
                runs[name].append(child(where, path, args.batches))
    keys = list(runs["this"][0])
    med = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in runs.items()}
    head = f"{'median over ' + str(args.rounds) + ' rounds (us)':34s}" + "".join(f"{n:>12s}" for n in packages)
    print(head + ("       ratio" if args.baseline else ""))
    for k in keys:
        line = f"{k:34s}" + "".join(f"{med[n][k]:12.1f}" for n in packages)
        if args.baseline:
            line += f"{med['baseline'][k] / med['this'][k]:12.2f}"
        print(line)


if __name__ == "__main__":
    main()
