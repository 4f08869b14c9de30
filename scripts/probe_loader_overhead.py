"""What the DataLoader's threads cost per batch, apart from copying.

    python scripts/probe_loader_overhead.py [--batches N]

A diagnostic for the loader row of bench.py, not a contender table. It builds
two raw dense streams (8-byte records, so copying is negligible, and an int64
label) and measures, per batch, the wall time and the process CPU time of:

  * plain loop: the sampler and one gather per stream on the calling thread;
  * loader, workers=1 and workers=2: the same batches through DataLoader.

The difference between the loader and the plain loop is the price of handing
batches between threads: the native prefetch ring's threads build the steps,
and next() waits for each (futex wake-ups, context switches, one GIL release
per batch). Before the ring, Python worker threads built the batches and this
cost 55-145 us of CPU per batch against ~40 us with it. The voluntary / involuntary context switches per batch come from
/proc (Linux only; shown as "-" elsewhere).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from loaderx.dataloader import DataLoader  # noqa: E402
from loaderx.zrecord import DenseStore  # noqa: E402
from loaderx.zsampler import Sampler  # noqa: E402

BATCH_SIZE = 256
LENGTH = 16384
RECORD_BYTES = 8


def _context_switches() -> tuple[int, int] | None:
    try:
        voluntary = involuntary = 0
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        voluntary += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        involuntary += int(line.split()[1])
        return voluntary, involuntary
    except OSError:
        return None


def _measure(name: str, next_batch, batches: int) -> dict:
    seen = np.zeros(LENGTH, dtype=bool)
    for _ in range(20):  # warm-up: threads started, output arrays recycled
        next_batch()
    switches = _context_switches()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        batch = next_batch()
        seen[batch["y"]] = True  # the consumer touches every batch
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    after = _context_switches()
    row = {"name": name, "wall_us": wall / batches * 1e6, "cpu_us": cpu / batches * 1e6}
    if switches and after:
        row["voluntary"] = (after[0] - switches[0]) / batches
        row["involuntary"] = (after[1] - switches[1]) / batches
    return row


def run(batches: int, record_bytes: int, directory: Path) -> list[dict]:
    x = np.random.default_rng(0).integers(0, 256, (LENGTH, record_bytes), dtype=np.uint8)
    with DenseStore(directory / "x", np.uint8, (record_bytes,), codec="raw") as store:
        store.append(x)
    with DenseStore(directory / "y", np.int64, (), codec="raw") as store:
        store.append(np.arange(LENGTH, dtype=np.int64))
    streams = {"x": DenseStore(directory / "x"), "y": DenseStore(directory / "y")}
    rows = []
    try:
        sampler = Sampler(LENGTH, BATCH_SIZE, Sampler.Mode.CYCLIC, 0)
        step = iter(range(1 << 62))

        def plain():
            indices = sampler.at(next(step))
            return {name: store.gather(indices) for name, store in streams.items()}

        rows.append(_measure("plain loop (one thread)", plain, batches))
        for workers in (1, 2):
            with DataLoader(streams, BATCH_SIZE, seed=0, workers=workers, prefetch=4) as loader:
                rows.append(_measure(f"DataLoader workers={workers}", lambda: next(loader), batches))
    finally:
        for store in streams.values():
            store.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=3000)
    args = parser.parse_args(argv)
    if args.batches < 1:
        parser.error("--batches must be >= 1")
    with tempfile.TemporaryDirectory(prefix="loaderx-probe-") as tmp:
        rows = run(args.batches, RECORD_BYTES, Path(tmp))
    print(f"batch {BATCH_SIZE}, x: {RECORD_BYTES} B records + y: int64 labels, {args.batches} batches")
    print(f"  {'':<26} {'wall us/batch':>14} {'cpu us/batch':>13} {'ctx sw vol/invol':>17}")
    for row in rows:
        switches = f"{row['voluntary']:.2f} / {row['involuntary']:.2f}" if "voluntary" in row else "-"
        print(f"  {row['name']:<26} {row['wall_us']:>14.1f} {row['cpu_us']:>13.1f} {switches:>17}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
