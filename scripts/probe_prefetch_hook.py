"""What a per-step Python ``prefetch`` hook costs the DataLoader on warm data.

    python scripts/probe_prefetch_hook.py [--rounds 5] [--steps 2000]

A diagnostic behind one decision (loaderx/streams.py, "prefetch"): local
stores say ``is_remote`` False, so the loader does not call their
``prefetch`` once per step on its prefetch thread; the native ring reads
them itself. This builds a DenseStore of 200 B records (200,000 rows)
(raw, then with the default codec, zstd), then times ``next()`` of a 2-worker
DataLoader, batch 256, in interleaved
rounds, once over the store and once over the same store flagged remote
(so the loader calls its ``prefetch`` per step, as it did for every local
store before), and prints steps per second (medians) and their ratio.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from loaderx import DataLoader, DenseStore  # noqa: E402


class Hooked(DenseStore):
    """The same store, read natively by the ring, but saying it is remote:
    the loader calls its ``prefetch`` (local readahead) for every step on
    its prefetch thread and builds a step only after it returned, as it did
    for every local store before."""

    is_remote = True  # type: ignore[assignment]


def steps_per_second(stream, seed: int, steps: int) -> float:
    with DataLoader({"x": stream}, 256, seed=seed, workers=2) as loader:
        for _ in range(50):
            next(loader)
        started = time.perf_counter()
        for _ in range(steps):
            next(loader)
        return steps / (time.perf_counter() - started)


def run(rounds: int, steps: int, records: int, tmp: Path, codec: str = "raw") -> tuple:
    """Median steps/s over the store, and over the same store flagged remote."""
    # Feature-like values on a 0.01 grid rather than uniform random bits (at
    # 200 B a record, per-record zstd barely shrinks either: the row shows
    # what the default codec costs, not what it saves).
    rows = np.round(np.random.default_rng(0).normal(0, 1, (records, 50)), 2).astype(np.float32)
    path = tmp / codec
    with DenseStore(path, np.float32, (50,), codec=codec) as ds:
        ds.append(rows)
    with DenseStore(path) as store, Hooked(path) as flagged:
        plain, hooked = [], []
        for r in range(rounds):
            plain.append(steps_per_second(store, r, steps))
            hooked.append(steps_per_second(flagged, r, steps))
    return float(np.median(plain)), float(np.median(hooked))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    # raw: the cheapest batches, where a per-step cost shows most; zstd: the
    # default codec, what users get.
    for codec in ("raw", "zstd"):
        with tempfile.TemporaryDirectory() as tmp:
            p, h = run(args.rounds, args.steps, 200_000, Path(tmp), codec)
        print(f"{codec:4s} store (no hook)       {p:10,.0f} steps/s")
        print(f"{codec:4s} store + prefetch hook {h:10,.0f} steps/s")
        print(f"{codec:4s} ratio no hook / hook  {p / h:10.2f}x")


if __name__ == "__main__":
    main()
