"""Dense gathers in fresh processes: what a training script's first seconds see.

The dense layer times every backend in one long-lived process, where whatever
ran before (a freed 64 MiB array raises glibc's mmap threshold, pages already
faulted in) changes what an allocating gather pays. Here every (workload,
backend) run is its own child process that opens the data and reads one
batch (timed together as "first ms"; imports come before the clock), then
reads random batches for a fixed time.
Each run reports throughput, minor page faults and context switches per batch
(getrusage of the whole process, all threads). Rounds run the backends
round-robin, and ratios are medians of per-round ratios against the
memory-mapped .npy fancy index measured in the same round.

With --baseline DIR the loaderx rows also run from the loaderx package in DIR
(for example an export of the previous commit with its library built), so a
change is measured before and after, side by side, in one run.

Data: image-like uint8 records (bench_data) of 12 KiB, 64 KiB and 256 KiB, and
int16 random-walk rows of 200 B; batch 256 (tiny: 32), uniform random indices.
A run cycles through 64 planned batches: at 200 B those 16k records (3 MiB)
stay in the CPU's caches, so the fixed cost of a call is what differs. The
"200 B, 4096 batches" row cycles through 4096 (the whole store, as the dense
layer's long-lived runs do), where numpy's fancy index waits on a cache miss
per row and loaderx's lanes prefetch: the two rows bracket the 200 B ratio.
The parent checks the first two batches of every child against the source
(dtype, shape and a hash of the bytes).

"cpu us/b" is the process's CPU time (all threads) per batch: on a shared
machine it moves much less than wall time, which includes the time other
tenants held the cores.
"""
from __future__ import annotations

import hashlib
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

import bench_data
from bench_harness import MIB, Row, Section, Target, fmt, paired_ratio, run_child_json

# (label, dtype, item shape, data size as a multiple of Size.dense_mib, planned batches)
SHAPES = (
    ("200 B", np.int16, (100,), 0.5, 64),
    ("200 B, 4096 batches", np.int16, (100,), 0.5, 4096),
    ("12 KiB", np.uint8, (64, 64, 3), 1.0, 64),
    ("64 KiB", np.uint8, (128, 128, 4), 1.0, 64),
    ("256 KiB", np.uint8, (256, 256, 4), 4.0, 64),
)
CHECKED_BATCHES = 2
# backend -> row name; "@" rows run from the --baseline package
BACKENDS = {
    "npy": "npy mmap fancy index",
    "raw": "loaderx raw ds[idx]",
    "raw_out": "loaderx raw gather(out=)",
    "zstd": "loaderx zstd ds[idx]",
    "raw@": "loaderx raw ds[idx] (baseline)",
    "zstd@": "loaderx zstd ds[idx] (baseline)",
}


# ============================================================================ child side


def _plan(seed: int, count: int, batch: int, planned: int) -> list[np.ndarray]:
    return bench_data.uniform_plan(np.random.default_rng(seed), count, batch, planned)


def _import(cfg: dict):
    """The DenseStore class the child's backend uses (None for npy): imported
    before the clock starts, as numpy is."""
    if cfg["backend"] == "npy":
        return None
    if cfg.get("loaderx_root"):
        sys.path.insert(0, cfg["loaderx_root"])
    from loaderx.zrecord import DenseStore

    return DenseStore


def _reader(cfg: dict, DenseStore):
    """(fetch function, loaderx module path or "") for the child's backend."""
    backend = cfg["backend"]
    data = Path(cfg["data"])
    if backend == "npy":
        array = np.asarray(np.load(data / "x.npy", mmap_mode="r"))
        return (lambda idx: array[idx]), ""
    import loaderx

    store = DenseStore(str(data / ("zstd" if backend.startswith("zstd") else "raw")))
    if backend == "raw_out":
        buffer = np.empty((cfg["batch"], *store.item_shape), dtype=store.dtype)
        return (lambda idx: store.gather(idx, out=buffer)), loaderx.__file__
    return (lambda idx: store[idx]), loaderx.__file__


def _digest(batch: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(batch).data, digest_size=16).hexdigest()


def _usage() -> tuple[int, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_nvcsw + r.ru_nivcsw


def child_main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    try:
        result = _measure(cfg)
    except Exception as exc:  # reported as a "failed" row by the parent
        result = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:200]}
    print(json.dumps(result))
    return 0


def _measure(cfg: dict) -> dict:
    plan = _plan(cfg["seed"], cfg["count"], cfg["batch"], cfg["planned"])
    planned = len(plan)
    store_class = _import(cfg)
    start = time.perf_counter()
    fetch, module = _reader(cfg, store_class)
    batch = fetch(plan[0])
    first_s = time.perf_counter() - start
    shape, dtype = list(batch.shape), str(batch.dtype)
    checks = [_digest(batch), _digest(fetch(plan[1]))]
    del batch
    faults, switches = _usage()
    count, start, cpu = 0, time.perf_counter(), time.process_time()
    while count < 4 or time.perf_counter() - start < cfg["seconds"]:
        # The batch is dropped at once, as a training step that copies it to a device would.
        fetch(plan[(count + 2) % planned])
        count += 1
    seconds = time.perf_counter() - start
    cpu_s = time.process_time() - cpu
    faults_end, switches_end = _usage()
    return {
        "status": "ok", "batches": count, "seconds": seconds, "first_s": first_s,
        "cpu_us_per_batch": cpu_s / count * 1e6,
        "faults_per_batch": (faults_end - faults) / count,
        "switches_per_batch": (switches_end - switches) / count,
        "shape": shape, "dtype": dtype, "checks": checks, "module": module,
    }


# ============================================================================ parent side


def _prepare(ctx, label: str, dtype, shape: tuple, share: float, planned: int) -> dict:
    from loaderx.zrecord import DenseStore

    record_bytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    count = max(64, int(share * ctx.size.dense_mib * (1 << 20)) // record_bytes)
    directory = ctx.workdir / "fresh" / "".join(ch for ch in label if ch.isalnum())
    directory.mkdir(parents=True, exist_ok=True)
    source = bench_data.chunked_dense(np.random.default_rng(ctx.seed + 7), count, dtype, shape)
    np.save(directory / "x.npy", source)
    for codec in ("raw", "zstd"):
        with DenseStore(str(directory / codec), source.dtype, shape, codec=codec) as store:
            store.append(source)
    return {"dir": directory, "source": source, "count": count, "record_bytes": record_bytes,
            "planned": planned}


def _expected(prepared: dict, cfg: dict) -> list[str]:
    plan = _plan(cfg["seed"], cfg["count"], cfg["batch"], cfg["planned"])
    return [_digest(prepared["source"][plan[i]]) for i in range(CHECKED_BATCHES)]


def _backends(ctx) -> list[str]:
    names = ["npy", "raw", "raw_out", "zstd"]
    return names + (["raw@", "zstd@"] if ctx.baseline is not None else [])


def _one_run(ctx, backend: str, prepared: dict, row: Row) -> None:
    cfg = {
        "backend": backend.rstrip("@"), "data": str(prepared["dir"]), "seed": ctx.seed,
        "count": prepared["count"], "batch": ctx.size.dense_batch,
        "planned": prepared["planned"], "seconds": _seconds(ctx),
        "loaderx_root": str(ctx.baseline) if backend.endswith("@") else "",
    }
    argv = [sys.executable, str(Path(__file__).resolve()), "child", json.dumps(cfg)]
    result = run_child_json(argv, timeout_s=120 + 10 * cfg["seconds"])
    if result["status"] != "ok":
        row.status = f"{result['status']}: {result['reason']}"
        return
    want_shape = [cfg["batch"], *prepared["source"].shape[1:]]
    if result["shape"] != want_shape or result["dtype"] != str(prepared["source"].dtype):
        want = f"{prepared['source'].dtype} {want_shape}"
        row.status = f"INVALID: got {result['dtype']} {result['shape']}, want {want}"
        return
    if result["checks"] != _expected(prepared, cfg):
        row.status = "INVALID: batch bytes differ from the source rows"
        return
    per_s = result["batches"] / result["seconds"]
    row.gather_mibs.append(per_s * cfg["batch"] * prepared["record_bytes"] / MIB)
    row.records_s.append(per_s * cfg["batch"])
    row.extra.setdefault("faults", []).append(result["faults_per_batch"])
    row.extra.setdefault("switches", []).append(result["switches_per_batch"])
    row.extra.setdefault("first_ms", []).append(result["first_s"] * 1e3)
    row.extra.setdefault("cpu_us", []).append(result["cpu_us_per_batch"])
    row.extra["module"] = result["module"]


def _seconds(ctx) -> float:
    return {2: 0.05, 16: 0.5}.get(ctx.size.dense_mib, 1.5)


def _rounds(ctx) -> int:
    return min(ctx.repeat, ctx.size.loader_repeat_max)


def run_fresh(ctx) -> list[Section]:
    """One section: every record size x backend, each run a fresh process."""
    workloads = []
    for label, dtype, shape, share, planned in SHAPES:
        if ctx.size.fresh_labels and label not in ctx.size.fresh_labels:
            continue
        ctx.log(f"fresh {label}: writing .npy and stores")
        prepared = _prepare(ctx, label, dtype, shape, share, planned)
        rows = {
            b: Row(f"{label} {BACKENDS[b]}", "baseline" if b == "npy" else "loaderx", "raw")
            for b in _backends(ctx)
        }
        workloads.append((label, prepared, rows))
    for round_index in range(_rounds(ctx)):
        for label, prepared, rows in workloads:
            order = list(rows)
            shift = round_index % len(order)
            for backend in order[shift:] + order[:shift]:
                if rows[backend].ok:
                    _one_run(ctx, backend, prepared, rows[backend])
        ctx.log(f"fresh: round {round_index + 1} of {_rounds(ctx)} done")
    return [_section(ctx, workloads)]


def _cpu_ratio(row: Row, npy: Row) -> float | None:
    """npy's CPU time per batch over the row's, median of per-round ratios."""
    if not npy.ok or not row.extra.get("cpu_us") or not npy.extra.get("cpu_us"):
        return None
    pairs = zip(npy.extra["cpu_us"], row.extra["cpu_us"])
    return float(np.median([theirs / mine for theirs, mine in pairs if mine > 0]))


def _section(ctx, workloads: list) -> Section:
    head = (f"  {'workload / backend':<52} {'GiB/s':>7} {'vs npy':>7} {'cpu us/b':>9}"
            f" {'cpu vs npy':>10} {'faults/b':>9} {'ctxsw/b':>8} {'first ms':>9}")
    lines = ["  faults/b, ctxsw/b: minor page faults and context switches per batch (getrusage,"
             " all threads); vs npy: median of per-round ratios; cpu us/b: CPU time of all"
             " threads per batch, cpu vs npy: npy's over the row's (median of per-round ratios)",
             head, "  " + "-" * (len(head) - 2)]
    targets, all_rows = [], []
    for label, prepared, rows in workloads:
        npy = rows["npy"]
        for backend, row in rows.items():
            all_rows.append(row)
            if not row.ok:
                lines.append(f"  {row.name:<52} {row.status}")
                continue
            versus = paired_ratio(row, [npy])
            cpu = _cpu_ratio(row, npy)
            lines.append(
                f"  {row.name:<52} {row.median('gather_mibs') / 1024:>7.2f}"
                f" {fmt(versus, '.2f'):>6}x {np.median(row.extra['cpu_us']):>9.2f}"
                f" {fmt(cpu, '.2f'):>9}x"
                f" {np.median(row.extra['faults']):>9.1f} {np.median(row.extra['switches']):>8.2f}"
                f" {np.median(row.extra['first_ms']):>9.2f}"
            )
        target = Target(f"fresh process: dense {label} raw ds[idx] vs npy mmap", rows["raw"].name,
                        [npy.name], 1.0)
        targets.append(target.evaluate({r.name: r for r in rows.values()}))
        if label.startswith("200 B"):
            # CPU time moves less than wall time on a shared machine: the same bar on it.
            context = Target(f"  (context) the same in CPU time per batch ({label})",
                             rows["raw"].name, [npy.name], 1.0, spec=False)
            targets.append(context.settle(_cpu_ratio(rows["raw"], npy) if rows["raw"].ok else None,
                                          "a row did not run"))
    if ctx.baseline is not None:
        lines.append(f"  baseline rows ran loaderx from {ctx.baseline}")
    lines.append("  targets (median of per-round ratios):")
    lines.extend(t.line() for t in targets)
    title = (f"dense gathers in fresh processes: batch {ctx.size.dense_batch}, uniform random"
             f" indices, {_seconds(ctx):g} s per run after the first batch, {_rounds(ctx)} rounds")
    lines.insert(0, f"== {title} ==")
    return Section("fresh", title, lines, all_rows, targets)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        sys.exit(child_main(sys.argv[2:]))
    sys.exit("usage: bench_fresh.py child CONFIG_JSON (started by scripts/bench.py)")
