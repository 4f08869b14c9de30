"""Conversion speed: Parquet into a loaderx dataset directory.

    python scripts/bench_convert.py [--size-mib 1024] [--repeat 3] [--workers 2] [--json out.json]
    python scripts/bench_convert.py --size-mib 4096 --repeat 1 --memory-only

Builds one Parquet file of about `--size-mib` MiB of logical data (token
sequences, a fixed-size uint8 "image", a label and a short text per row,
compressible like real data, several row groups), then times, interleaved
round by round, each in a fresh process:

* ``loaderx 1 worker``  : ``loaderx.convert(src, dst, workers=1)`` (zstd level 3);
* ``loaderx N workers`` : the same with ``workers=N``;
* ``pyarrow zstd``      : ``pq.write_table(pq.read_table(src), dst, compression="zstd")``,
  the same job for Parquet: read the source, write it compressed;
* ``loaderx 1 worker, 1 core``: the 1-worker run confined to one core
  (``sched_setaffinity`` before the library starts), for core scaling.

Every conversion is checked before it counts: the dataset's rows and a sample
of values must equal the source. Reports medians of the rounds, medians of
per-round ratios, and each run's peak RSS (the largest of the converting
process and its worker processes). Targets (issue 15, on 2 cores and
1 GiB): N=2 workers >= 1.6x one worker; one worker >= 0.5x pyarrow zstd; peak
RSS < 512 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

MIB = float(1 << 20)
IMAGE_BYTES = 3072
ROW_GROUP_ROWS = 16384

_CHILD = r"""
import json, sys, time
kind, src, dst, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
import os
if sys.argv[5] == "pin":  # one core, before the library counts its lanes
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
import numpy as np
import pyarrow.parquet as pq
import loaderx
import resource
def cpu_seconds():
    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF,
               resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime"))
cpu0 = cpu_seconds()
t0 = time.perf_counter()
if kind == "loaderx":
    loaderx.convert(src, dst, workers=workers, progress=False)
else:
    pq.write_table(pq.read_table(src), dst, compression="zstd")
elapsed = time.perf_counter() - t0
# VmHWM: this process's own peak (ru_maxrss would include the parent's at fork);
# worker processes (exec'd from this small process) count through RUSAGE_CHILDREN.
with open("/proc/self/status") as f:
    peak = int(f.read().split("VmHWM:")[1].split()[0]) * 1024
peak = max(peak, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
# CPU seconds of the conversion: this process after its imports, and its workers.
print(json.dumps({"elapsed": elapsed, "peak_rss": peak, "cpu_s": cpu_seconds() - cpu0}))
"""


def machine() -> dict:
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                model,
            )
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    import pyarrow

    return {
        "cpu": model,
        "cores": cores,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pyarrow": pyarrow.__version__,
    }


def build_parquet(path: str, size_mib: float, seed: int = 0) -> dict:
    """Write the source file; returns its row count and logical bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    target = int(size_mib * MIB)
    rows = logical = 0
    schema = pa.schema(
        [
            ("tokens", pa.list_(pa.int32())),
            ("image", pa.list_(pa.uint8(), IMAGE_BYTES)),
            ("label", pa.int64()),
            ("text", pa.string()),
        ]
    )
    with pq.ParquetWriter(path, schema) as writer:
        # Row groups of ROW_GROUP_ROWS rows; a small source (a smoke test) gets
        # groups of about a quarter of its rows, so it stays small.
        n = int(min(ROW_GROUP_ROWS, max(64, target / 4 / (IMAGE_BYTES + 800))))
        while logical < target:
            lengths = np.clip(rng.lognormal(5.0, 0.6, n), 8, 1024).astype(np.int64)
            tokens = np.minimum(rng.zipf(1.3, int(lengths.sum())), 32000).astype(np.int32)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            coarse = rng.integers(0, 255, (n, IMAGE_BYTES // 16), dtype=np.uint8)
            image = np.repeat(coarse, 16, axis=1) + rng.integers(
                0, 3, (n, IMAGE_BYTES), dtype=np.uint8
            )
            text = [f"sample {rows + i} of class {i % 10}" for i in range(n)]
            table = pa.table(
                {
                    "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens)),
                    "image": pa.FixedSizeListArray.from_arrays(
                        pa.array(image.ravel()), IMAGE_BYTES
                    ),
                    "label": pa.array(np.arange(rows, rows + n, dtype=np.int64) % 1000),
                    "text": pa.array(text),
                },
                schema=schema,
            )
            writer.write_table(table)
            rows += n
            logical += tokens.nbytes + image.nbytes + 8 * n + sum(len(t) for t in text)
    return {"rows": rows, "logical_bytes": logical, "file_bytes": os.path.getsize(path)}


def validate(src: str, dst: str, rows: int) -> None:
    """The converted dataset holds the source's rows and values (a sample)."""
    import pyarrow.parquet as pq

    import loaderx

    ds = loaderx.open_dataset(dst)
    try:
        if len(ds["label"]) != rows:
            raise AssertionError(f"{dst}: {len(ds['label'])} rows, the source has {rows}")
        table = pq.ParquetFile(src).read_row_group(0)
        idx = np.random.default_rng(1).integers(0, table.num_rows, 64)
        for i in idx.tolist():
            if (
                ds["label"][i] != table["label"][i].as_py()
                or ds["tokens"][i].tolist() != table["tokens"][i].as_py()
                or ds["text"][i] != table["text"][i].as_py()  # strings read back as str
                or ds["image"][i].tobytes() != bytes(table["image"][i].as_py())
            ):
                raise AssertionError(f"{dst}: row {i} differs from the source")
    finally:
        for col in ds.values():
            col.close()


def run_child(kind: str, src: str, dst: str, workers: int, pin: bool = False) -> dict:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, src, dst, str(workers), "pin" if pin else "all"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if out.returncode:
        raise RuntimeError(f"{kind} run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench(args) -> dict:
    work = args.workdir or tempfile.mkdtemp(prefix="bench-convert-")
    os.makedirs(work, exist_ok=True)
    src = os.path.join(work, "source.parquet")
    info = build_parquet(src, args.size_mib)
    plans = [
        ("loaderx 1 worker", "loaderx", 1, False),
        (f"loaderx {args.workers} workers", "loaderx", args.workers, False),
        ("pyarrow zstd", "pyarrow", 1, False),
        ("loaderx 1 worker, 1 core", "loaderx", 1, True),
    ][: 1 if args.memory_only else 4]
    runs: dict = {plan[0]: [] for plan in plans}
    for r in range(args.repeat):
        order = plans[r % len(plans) :] + plans[: r % len(plans)]  # rotate who goes first
        for name, kind, workers, pin in order:
            dst = os.path.join(
                work, f"out-{kind}-{workers}" + (".parquet" if kind == "pyarrow" else "")
            )
            shutil.rmtree(dst, ignore_errors=True) if os.path.isdir(dst) else None
            if os.path.isfile(dst):
                os.remove(dst)
            result = run_child(kind, src, dst, workers, pin)
            if kind == "loaderx":
                validate(src, dst, info["rows"])
            result["stored_bytes"] = _size(dst)
            runs[name].append(result)
    return {
        "machine": machine(),
        "source": info,
        "runs": runs,
        "workers": args.workers,
        "work": work,
    }


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def report(result: dict) -> dict:
    m, info, runs, w = result["machine"], result["source"], result["runs"], result["workers"]
    print(
        f"machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, numpy {m['numpy']}, "
        f"pyarrow {m['pyarrow']}"
    )
    print(
        f"source: {info['rows']:,} rows, {info['logical_bytes'] / MIB:.0f} MiB logical, "
        f"{info['file_bytes'] / MIB:.0f} MiB Parquet (snappy)"
    )
    summary = {}
    for name, rs in runs.items():
        t = statistics.median(r["elapsed"] for r in rs)
        peak = max(r["peak_rss"] for r in rs)
        busy = statistics.median(r["cpu_s"] / r["elapsed"] for r in rs)
        summary[name] = {
            "cores_busy": busy,
            "seconds": t,
            "mib_s": info["logical_bytes"] / MIB / t,
            "peak_rss_mib": peak / MIB,
            "stored_mib": rs[-1]["stored_bytes"] / MIB,
        }
        print(
            f"  {name:<20} {t:7.2f} s  {summary[name]['mib_s']:7.0f} MiB/s  peak RSS "
            f"{peak / MIB:5.0f} MiB  stored {summary[name]['stored_mib']:7.1f} MiB  "
            f"cores busy {busy:4.2f}"
        )
    one = runs["loaderx 1 worker"]
    rss = max(r["peak_rss"] for r in one) / MIB
    if len(runs) == 1:  # --memory-only
        print(f"  peak RSS, 1 worker         : {rss:.0f} MiB (target < 512 MiB for a 4 GB input)")
        return summary
    many, pa = runs[f"loaderx {w} workers"], runs["pyarrow zstd"]
    par = statistics.median(a["elapsed"] / b["elapsed"] for a, b in zip(one, many))
    vs = statistics.median(b["elapsed"] / a["elapsed"] for a, b in zip(one, pa))
    print(f"ratios (median of {len(one)} interleaved rounds):")
    print(
        f"  {w} workers / 1 worker      : {par:.2f}x  "
        "(target >= 1.6x with 2 workers on 2 cores, 1 GiB)"
    )
    pinned = runs["loaderx 1 worker, 1 core"]
    cores = statistics.median(a["elapsed"] / b["elapsed"] for a, b in zip(pinned, many))
    print(f"  1 worker / pyarrow zstd    : {vs:.2f}x  (target >= 0.5x)")
    print(
        f"  {w} workers / 1 worker on 1 core: {cores:.2f}x  (core scaling: the same "
        f"conversion on {min(w, m['cores'])} cores and on one)"
    )
    print(f"  peak RSS, 1 worker         : {rss:.0f} MiB (target < 512 MiB for a 4 GB input)")
    print("  (cores busy: CPU seconds of the conversion and its workers / its wall seconds;"
          " a 1-worker run that keeps every core busy leaves N workers nothing to gain)")
    summary["ratios"] = {
        "workers_vs_one": par,
        "one_vs_pyarrow_zstd": vs,
        "workers_vs_one_core": cores,
    }
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--size-mib", type=float, default=64.0, help="logical MiB of the source (default 64)"
    )
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument(
        "--workers", type=int, default=2, help="workers of the parallel run (default 2)"
    )
    ap.add_argument(
        "--workdir", default=None, help="where the files go (default: a temporary directory)"
    )
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument(
        "--memory-only", action="store_true",
        help="only the 1-worker conversion, for its peak RSS (e.g. --size-mib 4096)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    result = bench(args)
    summary = report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**result, "summary": summary}, f, indent=2)
    if not args.keep and args.workdir is None:
        shutil.rmtree(result["work"], ignore_errors=True)
    print(f"(bench took {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
