"""The loader layer: loaderx DataLoader end to end vs torch DataLoader and grain.

Every configuration runs in its own fresh subprocess (this file, `child` mode),
so its peak RSS is its own: VmHWM of the process, and for configurations with
worker processes also the largest sampled sum of VmRSS over the process tree
(read from /proc; shared pages count once per process there). Rounds run the
configurations round-robin, so ratios compare runs made side by side.

Data: X = uint8 (64, 64, 3) image-like records (12 KiB) and Y = int64 labels
with Y[i] = 7 i + 3, so every delivered batch names the records it holds; the
parent validates the first batches of every child against the numpy source
(dtype, shape, order, and a hash of the pixel bytes).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

import bench_data
from bench_harness import MIB, Row, Section, Target, ValidationError, disk_usage_bytes, fmt, paired_ratio, short_error

ITEM_SHAPE = (64, 64, 3)
RECORD_BYTES = int(np.prod(ITEM_SHAPE))
BATCH_SIZE = 256
PREFETCH = 4
CHECKED_BATCHES = 2
PAGE_BYTES = 4096


def label_of(indices: np.ndarray) -> np.ndarray:
    return indices.astype(np.int64) * 7 + 3


def index_of(labels: np.ndarray) -> np.ndarray:
    return (labels - 3) // 7


# ============================================================================ child side


def _proc_kib(path: str, field: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:  # the process ended between listing and reading
        return 0
    return 0


def _descendants(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    found, frontier = [], [root]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found.extend(children)
        frontier.extend(children)
    return found


class TreeRss:
    """Samples the RSS of this process and all its descendants every 50 ms; keeps the peak."""

    def __init__(self):
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(0.05):
            total = sum(_proc_kib(f"/proc/{pid}/status", "VmRSS:") for pid in [me] + _descendants(me))
            self.peak_kib = max(self.peak_kib, total)

    def __enter__(self) -> "TreeRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _loaderx_source(cfg: dict):
    """The default DataLoader; with backend "loaderx_out", one that gathers into a ring of
    recycled output buffers (its documented `out=` option) instead of fresh arrays."""
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import DenseStore

    data = Path(cfg["data"])
    streams = {"x": DenseStore(str(data / "lx_x")), "y": DenseStore(str(data / "lx_y"))}
    out = None
    if cfg["backend"] == "loaderx_out":
        # The loader needs at least prefetch + workers + 1 buffers; workers default to the usable cores.
        count = PREFETCH + len(os.sched_getaffinity(0)) + 2
        out = {
            "x": [np.empty((BATCH_SIZE, *ITEM_SHAPE), dtype=np.uint8) for _ in range(count)],
            "y": [np.empty((BATCH_SIZE,), dtype=np.int64) for _ in range(count)],
        }
    loader = DataLoader(streams, batch_size=BATCH_SIZE, seed=0, prefetch=PREFETCH, out=out)
    iterator = iter(loader)

    def close() -> None:
        loader.close()
        for store in streams.values():
            store.close()

    return lambda: next(iterator), close


class _TorchBatches:
    """A map-style Dataset whose items are whole batches: `dataset[list_of_indices]`
    is one numpy fancy index per stream on memory-mapped .npy files (opened lazily,
    so every worker process maps the files itself)."""

    def __init__(self, data: str, length: int):
        self.data = data
        self.length = length
        self.x = self.y = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, indices):
        import torch

        if self.x is None:
            self.x = np.asarray(np.load(os.path.join(self.data, "x.npy"), mmap_mode="r"))
            self.y = np.asarray(np.load(os.path.join(self.data, "y.npy"), mmap_mode="r"))
        positions = np.asarray(indices, dtype=np.int64)
        return {"x": torch.from_numpy(self.x[positions]), "y": torch.from_numpy(self.y[positions])}


def _torch_source(cfg: dict):
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    length = cfg["length"]
    total = (cfg["batches"] + cfg["warmup"] + 4) * BATCH_SIZE
    generator = torch.Generator().manual_seed(0)
    sampler = BatchSampler(RandomSampler(range(length), num_samples=total, generator=generator), BATCH_SIZE, drop_last=True)
    workers = cfg["workers"]
    loader = DataLoader(
        _TorchBatches(cfg["data"], length),
        batch_size=None,  # the sampler yields whole batches; no per-sample collate
        sampler=sampler,
        num_workers=workers,
        prefetch_factor=PREFETCH // 2 if workers else None,
    )
    iterator = iter(loader)
    return (lambda: next(iterator)), (lambda: None)


class _GrainParse:
    """One ArrayRecord record (12288 pixel bytes + one little-endian int64 label) -> dict."""

    def __call__(self, record: bytes) -> dict:
        x = np.frombuffer(record, np.uint8, count=RECORD_BYTES).reshape(ITEM_SHAPE)
        y = np.frombuffer(record, np.int64, count=1, offset=RECORD_BYTES)[0]
        return {"x": x, "y": y}


def _grain_source(cfg: dict):
    import grain

    source = grain.sources.ArrayRecordDataSource([str(Path(cfg["data"]) / "data.array_record")])
    dataset = grain.MapDataset.source(source).shuffle(seed=0).repeat().map(_GrainParse()).batch(BATCH_SIZE, drop_remainder=True)
    iterable = dataset.to_iter_dataset(grain.ReadOptions(num_threads=16, prefetch_buffer_size=500))
    if cfg["workers"]:
        iterable = iterable.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg["workers"]))
    iterator = iter(iterable)
    return (lambda: next(iterator)), (lambda: None)


SOURCES = {"loaderx": _loaderx_source, "loaderx_out": _loaderx_source, "torch": _torch_source, "grain": _grain_source}
MODULES = {"loaderx": "loaderx.dataloader", "loaderx_out": "loaderx.dataloader", "torch": "torch", "grain": "grain"}


def _as_numpy(batch) -> tuple[np.ndarray, np.ndarray]:
    x, y = batch["x"], batch["y"]
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        x, y = x.numpy(), y.numpy()
    return np.asarray(x), np.asarray(y)


def _describe(x: np.ndarray, y: np.ndarray) -> dict:
    return {
        "x_dtype": str(x.dtype),
        "x_shape": list(x.shape),
        "y_dtype": str(y.dtype),
        "y_shape": list(y.shape),
        "y": y.tolist(),
        "x_hash": hashlib.blake2b(np.ascontiguousarray(x).data, digest_size=16).hexdigest(),
    }


def _measure(cfg: dict, rss: TreeRss | None) -> dict:
    seen = np.zeros(cfg["length"], dtype=bool)
    checks = []

    def observe(batch, check: bool) -> None:
        x, y = _as_numpy(batch)
        if check:
            checks.append(_describe(x, y))
        seen[np.clip(index_of(y), 0, len(seen) - 1)] = True

    start = time.perf_counter()
    get, close = SOURCES[cfg["backend"]](cfg)
    observe(get(), True)
    first_s = time.perf_counter() - start
    for _ in range(cfg["warmup"] - 1):
        observe(get(), len(checks) < CHECKED_BATCHES)
    count, start = 0, time.perf_counter()
    while count < cfg["batches"] and (count < 3 or time.perf_counter() - start < cfg["seconds"]):
        observe(get(), False)
        count += 1
    seconds = time.perf_counter() - start
    close()
    touched = np.flatnonzero(seen)
    return {
        "status": "ok",
        "batches": count,
        "seconds": seconds,
        "first_batch_s": first_s,
        "vmhwm_bytes": _proc_kib("/proc/self/status", "VmHWM:") * 1024,
        "tree_peak_bytes": (rss.peak_kib * 1024) if rss else 0,
        "touched_records": int(len(touched)),
        "touched_label_pages": int(len(np.unique(touched * 8 // PAGE_BYTES))),
        "checks": checks,
    }


def child_main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    try:
        __import__(MODULES[cfg["backend"]])
    except Exception as exc:  # an optional contender: any import failure means "missing"
        print(json.dumps({"status": "missing", "reason": f"{type(exc).__name__}: {exc}"[:200]}))
        return 0
    try:
        if cfg["workers"]:
            with TreeRss() as rss:
                result = _measure(cfg, rss)
        else:
            result = _measure(cfg, None)
    except Exception as exc:  # reported as a "failed" row by the parent
        result = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"[:200]}
    print(json.dumps(result))
    sys.stdout.flush()
    # grain and torch worker pools can linger at interpreter exit; the result is out already.
    os._exit(0)


# ============================================================================ parent side

def _prepare(ctx, directory: Path, log) -> dict:
    """Writes the loader data set once: .npy files, loaderx stores and an ArrayRecord file."""
    directory.mkdir(parents=True, exist_ok=True)
    length = ctx.size.loader_records
    rng = np.random.default_rng(ctx.seed + 3)
    x = bench_data.chunked_dense(rng, length, np.uint8, ITEM_SHAPE)
    y = label_of(np.arange(length))
    np.save(directory / "x.npy", x)
    np.save(directory / "y.npy", y)
    problems = {}
    try:
        from loaderx.zrecord import DenseStore

        with DenseStore(str(directory / "lx_x"), np.uint8, ITEM_SHAPE, codec="raw") as store:
            store.append(x)
        with DenseStore(str(directory / "lx_y"), np.int64, (), codec="raw") as store:
            store.append(y)
    except ImportError as exc:
        problems["loaderx"] = f"missing: {short_error(exc)}"
    except Exception as exc:  # the loaderx row then says why
        problems["loaderx"] = f"failed: store build: {short_error(exc)}"
    try:
        from array_record.python.array_record_module import ArrayRecordWriter

        writer = ArrayRecordWriter(str(directory / "data.array_record"), "group_size:1,uncompressed")
        for i in range(length):
            writer.write(x[i].tobytes() + y[i : i + 1].tobytes())
        writer.close()
    except Exception as exc:  # grain reads ArrayRecord; without it grain cannot run
        problems["grain"] = f"missing: array-record ({short_error(exc)})"
    log(f"loader: data set of {length} records written to {directory}")
    store_bytes = {name: disk_usage_bytes(directory / name) if (directory / name).exists() else 0 for name in ("lx_x", "lx_y")}
    return {"x": x, "problems": problems, "store_bytes": store_bytes}


def _run_child(cfg: dict, timeout_s: float) -> dict:
    scripts = str(Path(__file__).resolve().parent)
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, scripts] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    try:
        done = subprocess.run(
            [sys.executable, __file__, "child", json.dumps(cfg)], capture_output=True, text=True, env=env, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {timeout_s:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": "failed", "reason": f"exit {done.returncode}: {tail[:160]}"}
    return json.loads(lines[-1])


def _validate(result: dict, x: np.ndarray, name: str) -> None:
    if len(result["checks"]) < 1:
        raise ValidationError(f"{name}: no batch was checked")
    for number, check in enumerate(result["checks"]):
        what = f"{name} batch {number}"
        if check["x_dtype"] != "uint8" or check["x_shape"] != [BATCH_SIZE, *ITEM_SHAPE]:
            raise ValidationError(f"{what}: x is {check['x_dtype']} {check['x_shape']}")
        if check["y_dtype"] != "int64" or check["y_shape"] != [BATCH_SIZE]:
            raise ValidationError(f"{what}: y is {check['y_dtype']} {check['y_shape']}")
        labels = np.asarray(check["y"], dtype=np.int64)
        indices = index_of(labels)
        if not np.array_equal(label_of(indices), labels) or indices.min() < 0 or indices.max() >= len(x):
            raise ValidationError(f"{what}: labels are not labels of this data set")
        if hashlib.blake2b(np.ascontiguousarray(x[indices]).data, digest_size=16).hexdigest() != check["x_hash"]:
            raise ValidationError(f"{what}: x does not match the source rows its labels name")


def _configs(ctx) -> list[tuple[str, int | None]]:
    return (
        [("loaderx", None), ("loaderx_out", None)]
        + [("torch", w) for w in ctx.size.loader_torch_workers]
        + [("grain", w) for w in ctx.size.loader_grain_workers]
    )


def _row_name(backend: str, workers: int | None) -> str:
    if backend == "loaderx":
        return "loaderx DataLoader (threads)"
    if backend == "loaderx_out":
        return "loaderx DataLoader (threads, out= ring)"
    if backend == "torch":
        return f"torch DataLoader workers={workers}"
    return f"grain threads=16 mp_workers={workers}"


def run_loader(ctx, log):
    directory = ctx.workdir / "loader"
    prepared = _prepare(ctx, directory, log)
    rows = {cfg: Row(_row_name(*cfg), "loaderx" if cfg[0].startswith("loaderx") else cfg[0], "raw") for cfg in _configs(ctx)}
    extra = {cfg: {"first_s": [], "rss": [], "bound": None} for cfg in rows}
    for cfg in rows:
        problem = prepared["problems"].get(cfg[0].split("_")[0])
        if problem:
            rows[cfg].status = problem
    for round_index in range(_rounds(ctx)):
        order = list(rows)
        shift = round_index % len(order)
        for cfg in order[shift:] + order[:shift]:
            if rows[cfg].ok:
                _one_run(ctx, cfg, rows[cfg], extra[cfg], directory, prepared, log)
    return [_loader_section(ctx, rows, extra)]


def _rounds(ctx) -> int:
    return min(ctx.repeat, ctx.size.loader_repeat_max)


def _memory_bound(result: dict, store_bytes: dict) -> int:
    """SPEC §9: store bytes touched + prefetch x batch bytes + 64 MiB.

    Touched bytes count whole pages (a 12 KiB record spans up to 4), capped by
    each store's size on disk once nearly every record has been read."""
    touched_x = min(result["touched_records"] * (RECORD_BYTES + PAGE_BYTES), store_bytes["lx_x"])
    touched_y = min(result["touched_label_pages"] * PAGE_BYTES, store_bytes["lx_y"])
    return touched_x + touched_y + PREFETCH * BATCH_SIZE * (RECORD_BYTES + 8) + (64 << 20)


def _one_run(ctx, cfg, row: Row, extra: dict, directory: Path, prepared: dict, log) -> None:
    backend, workers = cfg
    child = {
        "backend": backend,
        "workers": workers,
        "data": str(directory),
        "length": ctx.size.loader_records,
        "batches": ctx.size.loader_batches,
        "warmup": max(ctx.size.loader_warmup, CHECKED_BATCHES),
        "seconds": ctx.size.loader_seconds,
    }
    result = _run_child(child, timeout_s=120 + 10 * ctx.size.loader_seconds)
    if result["status"] != "ok":
        row.status = f"{result['status']}: {result['reason']}"
        return
    try:
        _validate(result, prepared["x"], row.name)
    except ValidationError as exc:
        row.status = f"INVALID: {exc}"
        return
    per_s = result["batches"] / result["seconds"]
    row.records_s.append(per_s * BATCH_SIZE)
    row.gather_mibs.append(per_s * BATCH_SIZE * (RECORD_BYTES + 8) / MIB)
    row.batches_timed = result["batches"]
    extra["first_s"].append(result["first_batch_s"])
    extra["rss"].append(max(result["vmhwm_bytes"], result["tree_peak_bytes"]))
    if backend.startswith("loaderx"):
        extra["bound"] = max(extra["bound"] or 0, _memory_bound(result, prepared["store_bytes"]))
    log(f"loader: {row.name}: {per_s:.1f} batches/s")


def _loader_section(ctx, rows: dict, extra: dict) -> Section:
    torch_rows = [r for cfg, r in rows.items() if cfg[0] == "torch"]
    grain_rows = [r for cfg, r in rows.items() if cfg[0] == "grain"]
    lx_cfg = ("loaderx", None)
    lx = rows[lx_cfg]
    width = max(len(r.name) for r in rows.values())
    head = (
        f"  {'loader':<{width}} {'batches/s':>10} {'MiB/s':>8} {'first batch s':>13} {'peak RSS MiB':>12}"
        f" {'vs torch best':>13} {'vs grain best':>13}"
    )
    lines = [head, "  " + "-" * (len(head) - 2)]
    for cfg, row in rows.items():
        if not row.ok:
            lines.append(f"  {row.name:<{width}} {row.status}")
            continue
        e = extra[cfg]
        vt, vg = paired_ratio(row, torch_rows, "records_s"), paired_ratio(row, grain_rows, "records_s")
        lines.append(
            f"  {row.name:<{width}} {row.median('records_s') / BATCH_SIZE:>10.1f} {row.median('gather_mibs'):>8.1f}"
            f" {np.median(e['first_s']):>13.3f} {max(e['rss']) / MIB:>12.1f}"
            f" {fmt(vt, '.2f') + 'x' if vt else '-':>13} {fmt(vg, '.2f') + 'x' if vg else '-':>13}"
        )
    targets = [
        Target("loader end to end vs torch DataLoader (best worker count)", lx.name, [r.name for r in torch_rows], 2.0, metric="records_s"),
        Target("loader end to end vs grain (best configuration)", lx.name, [r.name for r in grain_rows], 10.0, metric="records_s"),
    ]
    named = {r.name: r for r in rows.values()}
    for target in targets:
        target.evaluate(named)
    memory = Target("loader peak RSS within touched + prefetch x batch + 64 MiB (bound / peak)", lx.name, [], 1.0)
    if lx.ok and extra[lx_cfg]["rss"]:
        peak, bound = max(extra[lx_cfg]["rss"]), extra[lx_cfg]["bound"]
        memory.settle(bound / peak)
        lines.append(
            f"  loaderx peak RSS {peak / MIB:.1f} MiB (VmHWM), bound {bound / MIB:.1f} MiB = store pages touched"
            f" (capped at store size) + {PREFETCH} x batch + 64 MiB"
        )
    else:
        memory.settle(None, "loaderx unavailable")
    targets.append(memory)
    lines.append("  SPEC §9 targets (median of per-round ratios):")
    lines.extend(t.line() for t in targets)
    title = (
        f"loader end to end: x uint8 {ITEM_SHAPE} (12 KiB) + y int64, {ctx.size.loader_records} records, batch {BATCH_SIZE},"
        f" up to {ctx.size.loader_batches} batches or {ctx.size.loader_seconds:g} s per run, each run a fresh process, {_rounds(ctx)} rounds"
    )
    lines.insert(0, f"== {title} ==")
    all_rows = list(rows.values())
    return Section("loader", title, lines, all_rows, targets)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        sys.exit(child_main(sys.argv[2:]))
    sys.exit("usage: bench_loader.py child CONFIG_JSON (started by scripts/bench.py)")
