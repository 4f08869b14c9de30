"""Why 200 B gathers compared worse with numpy in fresh processes than in one long-lived process.

    python scripts/probe_small_records.py [--records N] [--seconds S] [--rounds R] [--baseline DIR]

Runs 256 x 200 B random gathers, loaderx `ds[idx]` against a memory-mapped
.npy fancy index, in two settings and two index plans:

  * "fresh": each (backend, plan) in its own process, timed for S seconds after
    its first batch (what scripts/bench_fresh.py does);
  * "one process": both backends in one process, alternating in windows of
    S / 4 seconds (what the dense layer does);
  * plan "64": the run cycles through 64 planned batches (16k records, ~3 MiB,
    which stay in the CPU caches; bench_fresh's plan);
  * plan "4096": it cycles through 4096 (the whole store, as the dense layer's
    plan does), so most records miss the caches.

Every figure is CPU time of the process per batch (time.process_time: on a
shared machine it moves much less than wall time) next to the wall time, and
the ratio is numpy's time over loaderx's. With --baseline DIR the loaderx rows
also run the loaderx package in DIR (before and after). The finding on the
2-vCPU Xeon (issue 27): the setting (fresh or long-lived) changed nothing; the
plan did. numpy's per-record cost rises when the records miss the caches,
loaderx's lanes prefetch, so the cache-resident plan is where a call's fixed
cost decides the ratio.
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

import numpy as np

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
BATCH = 256
PLANS = (64, 4096)


def _plan(count: int, planned: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, count, BATCH, dtype=np.int64) for _ in range(planned)]


def _readers(data: Path, which: tuple) -> dict:
    readers = {}
    if "npy" in which:
        array = np.asarray(np.load(data / "x.npy", mmap_mode="r"))
        readers["npy"] = lambda idx: array[idx]
    if "loaderx" in which:
        from loaderx.zrecord import DenseStore

        store = DenseStore(str(data / "raw"))
        readers["loaderx"] = lambda idx: store[idx]
    return readers


def _window(read, plan: list, seconds: float) -> tuple[float, float]:
    """(CPU us per batch, wall us per batch) over `seconds` of batches."""
    count, wall, cpu = 0, time.perf_counter(), time.process_time()
    while count < 8 or time.perf_counter() - wall < seconds:
        read(plan[count % len(plan)])
        count += 1
    return (time.process_time() - cpu) / count * 1e6, (time.perf_counter() - wall) / count * 1e6


def child(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    plan = _plan(cfg["count"], cfg["planned"])
    readers = _readers(Path(cfg["data"]), tuple(cfg["which"]))
    out: dict = {name: [] for name in readers}
    for read in readers.values():
        read(plan[0])  # the first batch maps the store's pages: not timed
    rounds = 1 if len(readers) == 1 else 4
    for _ in range(rounds):
        for name, read in readers.items():
            out[name].append(_window(read, plan, cfg["seconds"] / rounds))
    print(json.dumps(out))
    return 0


def _run(data: Path, count: int, planned: int, which: tuple, seconds: float,
         root: Path | None) -> dict:
    cfg = {"data": str(data), "count": count, "planned": planned, "which": list(which),
           "seconds": seconds}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root or ROOT), str(SCRIPTS)])
    done = subprocess.run([sys.executable, __file__, "child", json.dumps(cfg)], env=env,
                          capture_output=True, text=True, timeout=300 + 10 * seconds)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr else "child failed")
    return json.loads(done.stdout.strip().splitlines()[-1])


def build(directory: Path, count: int) -> None:
    import bench_data
    from loaderx.zrecord import DenseStore

    source = bench_data.chunked_dense(np.random.default_rng(7), count, np.int16, (100,))
    np.save(directory / "x.npy", source)
    with DenseStore(str(directory / "raw"), np.int16, (100,), codec="raw") as store:
        store.append(source)


def run(records: int, seconds: float, rounds: int, baseline: Path | None,
        directory: Path) -> list[dict]:
    """Rows {setting, plan, package, npy_cpu_us, loaderx_cpu_us, ratio_cpu, ratio_wall}."""
    build(directory, records)
    packages = [("current", None)] + ([("baseline", baseline)] if baseline else [])
    results: dict = {}
    for _ in range(rounds):
        for planned in PLANS:
            for label, root in packages:
                fresh_npy = _run(directory, records, planned, ("npy",), seconds, root)["npy"][0]
                fresh_lx = _run(directory, records, planned, ("loaderx",), seconds, root)["loaderx"][0]
                both = _run(directory, records, planned, ("npy", "loaderx"), seconds, root)
                for setting, npy, lx in (("fresh", [fresh_npy], [fresh_lx]),
                                         ("one process", both["npy"], both["loaderx"])):
                    slot = results.setdefault((setting, planned, label), {"npy": [], "lx": []})
                    slot["npy"].extend(npy)
                    slot["lx"].extend(lx)
    rows = []
    for (setting, planned, label), got in results.items():
        npy_cpu = statistics.median(c for c, _ in got["npy"])
        lx_cpu = statistics.median(c for c, _ in got["lx"])
        npy_wall = statistics.median(w for _, w in got["npy"])
        lx_wall = statistics.median(w for _, w in got["lx"])
        rows.append({"setting": setting, "plan": planned, "package": label,
                     "npy_cpu_us": npy_cpu, "loaderx_cpu_us": lx_cpu,
                     "npy_wall_us": npy_wall, "loaderx_wall_us": lx_wall,
                     "ratio_cpu": npy_cpu / lx_cpu, "ratio_wall": npy_wall / lx_wall})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=167_772, help="200 B records (32 MiB)")
    parser.add_argument("--seconds", type=float, default=1.5, help="per fresh run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="also run the loaderx package in this directory")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="loaderx-small-") as tmp:
        rows = run(args.records, args.seconds, args.rounds, args.baseline, Path(tmp))
    print(f"load average {os.getloadavg()[0]:.2f}; CPU us per batch of {BATCH} x 200 B"
          " (wall in brackets); ratio: numpy's time over loaderx's")
    print(f"  {'setting':<12} {'plan':>5} {'package':<9} {'npy':>14} {'loaderx':>14}"
          f" {'ratio cpu':>9} {'ratio wall':>10}")
    for r in rows:
        print(f"  {r['setting']:<12} {r['plan']:>5} {r['package']:<9}"
              f" {r['npy_cpu_us']:>6.2f} ({r['npy_wall_us']:>5.1f})"
              f" {r['loaderx_cpu_us']:>6.2f} ({r['loaderx_wall_us']:>5.1f})"
              f" {r['ratio_cpu']:>8.2f}x {r['ratio_wall']:>9.2f}x")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        sys.exit(child(sys.argv[2:]))
    sys.exit(main())
