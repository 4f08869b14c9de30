"""Before/after of loaderx's own hot paths, two trees interleaved in one run.

    python scripts/bench_ab.py --before /path/to/old/tree [--rounds 5] [--only loader ...]

Each workload runs in a fresh process (this file, ``--child``) importing
loaderx from one tree (PYTHONPATH), the two trees taking turns, the order
flipped every round (A B, B A, ...), so a drift in the machine's speed
hits both alike. Per workload it prints each tree's median MiB/s of
payload and the median of the per-round ratios after/before (the
"no regression" check of a change; bench.py's layers compare loaderx with
the other libraries). The data is written once by the tree under test
(both trees read the same format), into --workdir.

Workloads (random batches of 256 records of 12 KiB, 20,000 records):
  dense-raw      DenseStore gather, raw codec
  dense-zstd     DenseStore gather, the default codec (zstd)
  loader         DataLoader over the raw store, 2 workers (the fastest
                 configuration: the loader's own copy is all it does)
  loader-zstd    the same over the default codec's store (what users get)
  loader-ragged  the same records as one-dimensional ragged records (a raw
                 RaggedStore), batches packed: the per-step decoding of
                 variable-size records
  remote-warm    DataLoader over the same store on a moto S3 server, every
                 record in the node-local cache (read once before timing)
  remote-cold    DataLoader over a store of 2,000 such records on moto with
                 a fresh cache: every step fetched (moto is an in-process
                 Python server whose ranged GETs cost in the object's size,
                 hence the small store; mostly the server's speed: a check
                 that nothing got slower, not a figure of the network path)
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RECORDS, REC, BATCH = 20_000, 12 << 10, 256
SMALL = 2_000
WORKLOADS = ("dense-raw", "dense-zstd", "loader", "loader-zstd", "loader-ragged", "remote-warm",
             "remote-cold")
TIMED_S = 1.5


def _data(workdir: str) -> None:
    """The raw, zstd and ragged stores (record i: a pattern of i), once."""
    import numpy as np

    import loaderx

    for name, codec, n in (("raw", "raw", RECORDS), ("zstd", "zstd", RECORDS),
                           ("small", "raw", SMALL), ("ragged", "raw", RECORDS)):
        path = os.path.join(workdir, name)
        if os.path.exists(path):
            continue
        rows = (np.arange(n, dtype=np.uint64)[:, None] * 7
                + np.arange(REC, dtype=np.uint64)[None, :] // 64).astype(np.uint8)
        if name == "ragged":
            with loaderx.RaggedStore.create(path + ".tmp", np.uint8, codec=codec) as store:
                store.append(list(rows))
        else:
            loaderx.from_numpy(path + ".tmp", rows, codec=codec).close()
        os.rename(path + ".tmp", path)


def _batches(n: int):
    import numpy as np

    rng = np.random.default_rng(0)
    return [rng.integers(0, RECORDS, BATCH) for _ in range(n)]


def _rate(step, payload: int) -> float:
    """MiB/s of `step()` calls (each `payload` bytes) over TIMED_S, after 5."""
    for _ in range(5):
        step()
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < TIMED_S:
        step()
        n += 1
    return n * payload / (time.perf_counter() - t) / 2**20


def _gather(workdir: str, codec: str) -> float:
    import loaderx

    batches = _batches(64)
    with loaderx.open_store(os.path.join(workdir, codec)) as store:
        k = [0]

        def step():
            store.gather(batches[k[0] % len(batches)])
            k[0] += 1
        return _rate(step, BATCH * REC)


def _loader_rate(store, steps: int = 0, packed: bool = False) -> float:
    import loaderx

    with loaderx.DataLoader({"x": store}, BATCH, seed=1, workers=2, packed=packed) as loader:
        if steps:  # a fixed count (cold: each step a fetch)
            t = time.perf_counter()
            for _ in range(steps):
                next(loader)
            return steps * BATCH * REC / (time.perf_counter() - t) / 2**20
        return _rate(lambda: next(loader), BATCH * REC)


def _remote(workdir: str, warm: bool) -> float:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from _servers import MotoS3

    import loaderx

    server = MotoS3()
    try:
        url = server.upload_dir(os.path.join(workdir, "raw" if warm else "small"), "ab/x")
        with tempfile.TemporaryDirectory() as cache:
            store = loaderx.open_store(url, cache_dir=cache, storage_options=server.options())
            try:
                if warm:
                    store._remote.verify_all()  # every record cached and checked
                    return _loader_rate(store)
                return _loader_rate(store, steps=6)
            finally:
                store.close()
    finally:
        server.stop()


def child(workload: str, workdir: str) -> None:
    if workload in ("dense-raw", "dense-zstd"):
        rate = _gather(workdir, workload.split("-")[1])
    elif workload in ("loader", "loader-zstd", "loader-ragged"):
        import loaderx

        name = {"loader": "raw", "loader-zstd": "zstd", "loader-ragged": "ragged"}[workload]
        with loaderx.open_store(os.path.join(workdir, name)) as store:
            rate = _loader_rate(store, packed=workload == "loader-ragged")
    else:
        rate = _remote(workdir, warm=workload == "remote-warm")
    print(json.dumps({"mib_s": rate}))


def run(tree: str, workload: str, workdir: str) -> float:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, __file__, "--child", workload, "--workdir", workdir],
                         env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"{workload} under {tree} failed:\n{out.stderr[-2000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["mib_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", help="the other tree (its loaderx/ and built library)")
    ap.add_argument("--after", default=ROOT, help="the tree under test (default: this one)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "loaderx-bench-ab"))
    ap.add_argument("--child", choices=WORKLOADS)
    ap.add_argument("--only", nargs="+", choices=WORKLOADS, default=list(WORKLOADS),
                    help="run only these workloads")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    if args.child:
        child(args.child, args.workdir)
        return
    if not args.before:
        ap.error("--before TREE is required")
    sys.path.insert(0, args.after)
    _data(args.workdir)
    trees = {"after": os.path.abspath(args.after), "before": os.path.abspath(args.before)}
    workloads = [w for w in WORKLOADS if w in args.only]
    rates: dict = {w: {"after": [], "before": []} for w in workloads}
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for w in workloads:
            for side in order:
                rates[w][side].append(run(trees[side], w, args.workdir))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"after: {trees['after']}\nbefore: {trees['before']}\n"
          f"{args.rounds} rounds, each tree's runs interleaved (MiB/s of payload, medians)")
    print(f"{'workload':<14}{'before':>10}{'after':>10}{'after/before':>14}")
    for w in workloads:
        a, b = rates[w]["after"], rates[w]["before"]
        ratio = statistics.median(x / y for x, y in zip(a, b))
        print(f"{w:<14}{statistics.median(b):>10.0f}{statistics.median(a):>10.0f}"
              f"{ratio:>13.2f}x")


if __name__ == "__main__":
    main()
