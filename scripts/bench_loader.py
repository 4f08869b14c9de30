"""The loader layer: loaderx end to end vs the loaders users pick.

Contenders: torch DataLoader and torchdata StatefulDataLoader (over memory-
mapped .npy), grain (ArrayRecord), MosaicML Streaming (MDS shards), LitData
(`optimize` output), WebDataset (tar shards), Hugging Face datasets
(`save_to_disk`, random batch access) and Lance (`take()` of random batches);
see bench_contenders. Contenders that
cannot share the bench's environment run from a private venv (bench_venvs).

Every configuration runs in its own fresh subprocess (this file, `child` mode),
so its peak RSS is its own: VmHWM of the process, and for configurations with
worker processes also the largest sampled sum of VmRSS over the process tree
(read from /proc; shared pages count once per process there). Minor page
faults and context switches of the whole process tree during the timed window
are printed per batch next to the throughput. Rounds run the configurations
round-robin, so ratios compare runs made side by side.

Data: X = uint8 (64, 64, 3) image-like records (12 KiB) and Y = int64 labels
with Y[i] = 7 i + 3, so every delivered batch names the records it holds; the
parent validates the first batches of every child against the numpy source
(dtype, shape, order, and a hash of the pixel bytes).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

import bench_data
from bench_harness import (
    child_reason,
    MIB,
    OFFLINE,
    Row,
    Section,
    Target,
    Unavailable,
    ValidationError,
    disk_usage_bytes,
    fmt,
    paired_ratio,
    run_child_json,
    short_error,
)

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


def _process_counters(pid: int) -> tuple[int, int]:
    """(minor page faults of the process, context switches summed over its threads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            minflt = int(f.read().rsplit(")", 1)[1].split()[7])
    except (OSError, IndexError, ValueError):  # the process ended between listing and reading
        return 0, 0
    switches = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tasks = []
    for task in tasks:
        switches += _proc_kib(f"/proc/{pid}/task/{task}/status", "voluntary_ctxt_switches:")
        switches += _proc_kib(f"/proc/{pid}/task/{task}/status", "nonvoluntary_ctxt_switches:")
    return minflt, switches


def tree_counters() -> tuple[int, int]:
    """Minor faults and context switches of this process and every descendant (Linux)."""
    me = os.getpid()
    totals = [_process_counters(pid) for pid in [me] + _descendants(me)]
    return sum(t[0] for t in totals), sum(t[1] for t in totals)


class TreeRss:
    """Samples the RSS of this process and all its descendants every 50 ms; keeps the peak."""

    def __init__(self):
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(0.05):
            total = sum(
                _proc_kib(f"/proc/{pid}/status", "VmRSS:") for pid in [me] + _descendants(me)
            )
            self.peak_kib = max(self.peak_kib, total)

    def __enter__(self) -> "TreeRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _loaderx_source(cfg: dict):
    """The default DataLoader; with backend "loaderx_out", one that gathers into a ring of
    recycled output buffers (its documented `out=` option) instead of fresh arrays;
    "loaderx_mix" reads a 0.7/0.3 Mixture of the data set's two halves (two stores each),
    "loaderx_ragged" reads x from a RaggedStore through the ring (packed, then reshaped)."""
    from loaderx import Mixture, RaggedStore
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import DenseStore

    data = Path(cfg["data"])
    backend = cfg["backend"]
    stores = []

    def dense(name: str):
        stores.append(DenseStore(str(data / name)))
        return stores[-1]

    out, packed = None, False
    if backend == "loaderx_mix":
        streams = Mixture(
            {half: {"x": dense(f"lx_x_{half}"), "y": dense(f"lx_y_{half}")} for half in "ab"},
            weights={"a": 0.7, "b": 0.3},
        )
    elif backend == "loaderx_ragged":
        stores.append(RaggedStore(str(data / "lx_x_ragged")))
        streams, packed = {"x": stores[-1], "y": dense("lx_y")}, True
    else:
        streams = {"x": dense("lx_x"), "y": dense("lx_y")}
    if backend == "loaderx_out":
        # The loader needs at least prefetch + workers + 1 buffers; workers default to the
        # usable cores.
        count = PREFETCH + len(os.sched_getaffinity(0)) + 2
        out = {
            "x": [np.empty((BATCH_SIZE, *ITEM_SHAPE), dtype=np.uint8) for _ in range(count)],
            "y": [np.empty((BATCH_SIZE,), dtype=np.int64) for _ in range(count)],
        }
    loader = DataLoader(streams, batch_size=BATCH_SIZE, seed=0, prefetch=PREFETCH, out=out,
                        packed=packed)
    iterator = iter(loader)

    def get():
        batch = next(iterator)
        if packed:
            values, _row_splits = batch["x"]
            batch = {"x": values.reshape(BATCH_SIZE, *ITEM_SHAPE), "y": batch["y"]}
        return batch

    def close() -> None:
        loader.close()
        for store in stores:
            store.close()

    return get, close


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
    """torch DataLoader, or with backend "torchdata" torchdata's StatefulDataLoader (the
    same constructor arguments), over _TorchBatches with a seeded random batch sampler."""
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    if cfg["backend"] == "torchdata":
        from torchdata.stateful_dataloader import StatefulDataLoader as DataLoader  # noqa: F811

    length = cfg["length"]
    total = (2 * cfg["batches"] + cfg["warmup"] + 4) * BATCH_SIZE  # warm-up may take `batches`
    generator = torch.Generator().manual_seed(0)
    sampler = BatchSampler(
        RandomSampler(range(length), num_samples=total, generator=generator),
        BATCH_SIZE,
        drop_last=True,
    )
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
    dataset = (
        grain.MapDataset.source(source)
        .shuffle(seed=0)
        .repeat()
        .map(_GrainParse())
        .batch(BATCH_SIZE, drop_remainder=True)
    )
    iterable = dataset.to_iter_dataset(grain.ReadOptions(num_threads=16, prefetch_buffer_size=500))
    if cfg["workers"]:
        # Grain's worker processes read absl flags; a program that is not an absl app
        # (this child) must mark them parsed first, as grain's docs do for notebooks.
        from absl import flags

        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()
        iterable = iterable.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg["workers"]))
    iterator = iter(iterable)
    return (lambda: next(iterator)), (lambda: None)


SOURCES = {
    "loaderx": _loaderx_source,
    "loaderx_out": _loaderx_source,
    "loaderx_mix": _loaderx_source,
    "loaderx_ragged": _loaderx_source,
    "torch": _torch_source,
    "torchdata": _torch_source,
    "grain": _grain_source,
}
MODULES = {
    "loaderx": "loaderx.dataloader",
    "loaderx_out": "loaderx.dataloader",
    "loaderx_mix": "loaderx.dataloader",
    "loaderx_ragged": "loaderx.dataloader",
    "torch": "torch",
    "torchdata": "torchdata.stateful_dataloader",
    "grain": "grain",
}


def _source(backend: str):
    """(module proving the contender imports, source function) of a backend."""
    if backend in SOURCES:
        return MODULES[backend], SOURCES[backend]
    import bench_contenders

    module, function = bench_contenders.SOURCES[backend]
    return module, getattr(bench_contenders, function)


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


def _warm_up(cfg: dict, step) -> tuple[int, float]:
    """Runs `step` (one batch) for at least cfg["warmup"] batches and cfg["warmup_s"]
    seconds, at most cfg["batches"]: every row warms up for the same time, so the
    timed window compares steady states; the warm-up's own rate is reported apart
    (a fresh process's thread start-up and first touches of its data are in it)."""
    count, start = 1, time.perf_counter()  # the first batch was taken already
    while count < cfg["warmup"] or (
        count < cfg["batches"] and time.perf_counter() - start < cfg.get("warmup_s", 0.0)
    ):
        step()
        count += 1
    return count - 1, time.perf_counter() - start


def _measure(cfg: dict, rss: TreeRss | None) -> dict:
    seen = np.zeros(cfg["length"], dtype=bool)
    checks = []

    def observe(batch, check: bool) -> None:
        x, y = _as_numpy(batch)
        if check:
            checks.append(_describe(x, y))
        seen[np.clip(index_of(y), 0, len(seen) - 1)] = True

    start = time.perf_counter()
    get, close = _source(cfg["backend"])[1](cfg)
    observe(get(), True)
    first_s = time.perf_counter() - start
    warm, warm_s = _warm_up(cfg, lambda: observe(get(), len(checks) < CHECKED_BATCHES))
    faults, switches = tree_counters()
    count, start, cpu = 0, time.perf_counter(), time.thread_time()
    while count < cfg["batches"] and (count < 3 or time.perf_counter() - start < cfg["seconds"]):
        observe(get(), False)
        count += 1
    seconds = time.perf_counter() - start
    cpu = time.thread_time() - cpu
    faults_end, switches_end = tree_counters()
    close()
    touched = np.flatnonzero(seen)
    return {
        "status": "ok",
        "batches": count,
        "seconds": seconds,
        "first_batch_s": first_s,
        "warmup_batches": warm,
        "warmup_batches_per_s": warm / warm_s if warm_s > 0 else 0.0,
        "faults_per_batch": (faults_end - faults) / count,
        "switches_per_batch": (switches_end - switches) / count,
        "main_cpu_us_per_batch": 1e6 * cpu / count,
        "vmhwm_bytes": _proc_kib("/proc/self/status", "VmHWM:") * 1024,
        "tree_peak_bytes": (rss.peak_kib * 1024) if rss else 0,
        "touched_records": int(len(touched)),
        "touched_label_pages": int(len(np.unique(touched * 8 // PAGE_BYTES))),
        "checks": checks,
    }


def child_main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    try:
        __import__(_source(cfg["backend"])[0])
    except Exception as exc:  # an optional contender: any import failure means "missing"
        print(json.dumps({"status": "missing", "reason": child_reason(exc)}))
        return 0
    try:
        if cfg["workers"]:
            with TreeRss() as rss:
                result = _measure(cfg, rss)
        else:
            result = _measure(cfg, None)
    except Exception as exc:  # reported as a "failed" row by the parent
        result = {"status": "failed", "reason": child_reason(exc)}
    print(json.dumps(result))
    sys.stdout.flush()
    # grain and torch worker pools can linger at interpreter exit; the result is out already.
    os._exit(0)


# ============================================================================ parent side


def _prepare(ctx, directory: Path, log) -> dict:
    """Writes the loader data set once: .npy files, loaderx stores, an ArrayRecord file,
    then each contender's own format (in the interpreter that contender runs in)."""
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
        half = length // 2
        for name, part in (("a", slice(0, half)), ("b", slice(half, length))):
            with DenseStore(str(directory / f"lx_x_{name}"), np.uint8, ITEM_SHAPE, codec="raw") as s:
                s.append(x[part])
            with DenseStore(str(directory / f"lx_y_{name}"), np.int64, (), codec="raw") as s:
                s.append(y[part])
        from loaderx import RaggedStore

        with RaggedStore(str(directory / "lx_x_ragged"), np.uint8, codec="raw") as store:
            store.append(list(x.reshape(length, -1)))
    except ImportError as exc:
        problems["loaderx"] = f"missing: {short_error(exc)}"
    except Exception as exc:  # the loaderx row then says why
        problems["loaderx"] = f"failed: store build: {short_error(exc)}"
    problems.update(_write_array_record(directory, x, y))
    problems.update(_build_contenders(ctx, directory, log))
    log(f"loader: data set of {length} records written to {directory}")
    store_bytes = {
        name: disk_usage_bytes(directory / name) if (directory / name).exists() else 0
        for name in ("lx_x", "lx_y")
    }
    return {"x": x, "problems": problems, "store_bytes": store_bytes}


def _write_array_record(directory: Path, x: np.ndarray, y: np.ndarray) -> dict:
    try:
        from array_record.python.array_record_module import ArrayRecordWriter

        writer = ArrayRecordWriter(
            str(directory / "data.array_record"), "group_size:1,uncompressed"
        )
        for i in range(len(x)):
            writer.write(x[i].tobytes() + y[i : i + 1].tobytes())
        writer.close()
    except Exception as exc:  # grain reads ArrayRecord; without it grain cannot run
        return {"grain": f"missing: array-record ({short_error(exc)})"}
    return {}


# backend -> private venv it runs from (bench_venvs.SPECS); others use this interpreter
VENV_OF = {"mds": "streaming", "litdata": "litdata"}
# backend -> the format it reads, written by bench_contenders.build_main
BUILDS = {"mds": "mds", "litdata": "litdata", "wds": "wds", "hf": "hf", "lance": "lance"}


def python_for(ctx, backend: str) -> str:
    """The interpreter a backend runs in; raises Unavailable if its venv cannot be had."""
    venv = VENV_OF.get(backend)
    if venv is None:
        return sys.executable
    if ctx.venvs is None:
        raise Unavailable("missing", f"private venv '{venv}' not configured")
    return ctx.venvs.python(venv)


def _build_contenders(ctx, directory: Path, log) -> dict:
    """backend -> "missing: ..." or "failed: ..." for each contender whose data was not written."""
    problems = {}
    script = str(Path(__file__).resolve().parent / "bench_contenders.py")
    for backend, kind in BUILDS.items():
        try:
            python = python_for(ctx, backend)
        except Unavailable as exc:
            problems[backend] = str(exc)
            continue
        result = run_child_json(
            [python, script, "build", kind, str(directory)], timeout_s=1800, env=OFFLINE
        )
        if result["status"] != "ok":
            problems[backend] = f"{result['status']}: {result['reason']}"
        else:
            log(f"loader: {kind} data written in {result['seconds']:.1f} s")
    return problems


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
        if (
            not np.array_equal(label_of(indices), labels)
            or indices.min() < 0
            or indices.max() >= len(x)
        ):
            raise ValidationError(f"{what}: labels are not labels of this data set")
        if (
            hashlib.blake2b(np.ascontiguousarray(x[indices]).data, digest_size=16).hexdigest()
            != check["x_hash"]
        ):
            raise ValidationError(f"{what}: x does not match the source rows its labels name")


# family -> (row name pattern, what it reads, workers attribute of Size or None)
FAMILIES = {
    "loaderx": ("loaderx DataLoader (threads)", None),
    "loaderx_out": ("loaderx DataLoader (threads, out= ring)", None),
    "loaderx_mix": ("loaderx DataLoader, Mixture of 2 sources 0.7/0.3", None),
    "loaderx_ragged": ("loaderx DataLoader, x from a RaggedStore (packed)", None),
    "loaderx_store": ("loaderx DenseStore[idx] loop (random batch)", None),
    "loaderx_copy": ("copy limit: gather(out=) loop, reused buffers, no sampler", None),
    "c_copy": ("C streaming copy: non-temporal stores, a thread per core, reused buffers", None),
    "torch": ("torch DataLoader workers={w} (npy mmap)", "loader_torch_workers"),
    "torchdata": (
        "torchdata StatefulDataLoader workers={w} (npy mmap)",
        "loader_contender_workers",
    ),
    "grain": ("grain threads=16 mp_workers={w} (ArrayRecord)", "loader_grain_workers"),
    "mds": ("mosaicml-streaming workers={w} (MDS, py1e shuffle)", "loader_contender_workers"),
    "litdata": ("litdata workers={w} (optimize, chunk shuffle)", "loader_contender_workers"),
    "wds": ("webdataset workers={w} (tar, buffer shuffle)", "loader_contender_workers"),
    "hf": ("HF datasets numpy[idx] (random batch, int64->uint8)", None),
    "lance": ("Lance take() (random batch -> numpy)", None),
}
# families the SPEC / issue 16 sets a bar against: (label, threshold)
BARS = {
    "torch": ("torch DataLoader (best worker count)", 2.0),
    "grain": ("grain (best configuration)", 10.0),
    "torchdata": ("torchdata StatefulDataLoader (best)", 3.0),
    "mds": ("MosaicML Streaming (best)", 3.0),
    "litdata": ("LitData (best)", 3.0),
    "wds": ("WebDataset (best)", 3.0),
    "hf": ("HF datasets random batch access", 3.0),
}


def _configs(ctx) -> list[tuple[str, int | None]]:
    configs = []
    for family, (_pattern, workers_attr) in FAMILIES.items():
        workers = getattr(ctx.size, workers_attr) if workers_attr else (None,)
        configs.extend((family, w) for w in workers)
    return configs


def _row_name(backend: str, workers: int | None) -> str:
    return FAMILIES[backend][0].replace("{w}", str(workers))


def run_loader(ctx, log):
    directory = ctx.workdir / "loader"
    prepared = _prepare(ctx, directory, log)
    rows = {
        cfg: Row(_row_name(*cfg), "loaderx" if cfg[0].startswith("loaderx") else cfg[0], "raw")
        for cfg in _configs(ctx)
    }
    extra = {
        cfg: {"first_s": [], "warm": [], "rss": [], "faults": [], "switches": [], "main_cpu": [],
              "bound": None}
        for cfg in rows
    }
    for cfg, row in rows.items():
        row.extra = extra[cfg]  # the same figures go to the JSON report
    for cfg in rows:
        family = "loaderx" if cfg[0].startswith("loaderx") else cfg[0]
        problem = prepared["problems"].get(cfg[0]) or prepared["problems"].get(family)
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
        "batch_size": BATCH_SIZE,
        "batches": ctx.size.loader_batches,
        "warmup": max(ctx.size.loader_warmup, CHECKED_BATCHES),
        "warmup_s": ctx.size.loader_warmup_s,
        "seconds": ctx.size.loader_seconds,
    }
    try:
        python = python_for(ctx, backend)
    except Unavailable as exc:
        row.status = str(exc)
        return
    argv = [python, str(Path(__file__).resolve()), "child", json.dumps(child)]
    result = run_child_json(argv, timeout_s=120 + 10 * ctx.size.loader_seconds, env=OFFLINE)
    if result["status"] != "ok":
        row.status = f"{result['status']}: {result['reason']}"
        return
    try:
        _validate(result, prepared["x"], row.name)
    except ValidationError as exc:
        row.status = f"INVALID: {exc}"
        return
    _record(row, extra, result, prepared if backend in ("loaderx", "loaderx_out") else None)
    log(f"loader: {row.name}: {result['batches'] / result['seconds']:.1f} batches/s")


def _record(row: Row, extra: dict, result: dict, prepared: dict | None) -> None:
    per_s = result["batches"] / result["seconds"]
    row.records_s.append(per_s * BATCH_SIZE)
    row.gather_mibs.append(per_s * BATCH_SIZE * (RECORD_BYTES + 8) / MIB)
    row.batches_timed = result["batches"]
    extra["first_s"].append(result["first_batch_s"])
    extra["warm"].append(result["warmup_batches_per_s"])
    extra["rss"].append(max(result["vmhwm_bytes"], result["tree_peak_bytes"]))
    extra["faults"].append(result["faults_per_batch"])
    extra["switches"].append(result["switches_per_batch"])
    extra["main_cpu"].append(result["main_cpu_us_per_batch"])
    if prepared is not None:
        extra["bound"] = max(extra["bound"] or 0, _memory_bound(result, prepared["store_bytes"]))


def _table(rows: dict, extra: dict, lx: Row) -> list[str]:
    width = max(len(r.name) for r in rows.values())
    head = (
        f"  {'loader':<{width}} {'batches/s':>10} {'MiB/s':>8} {'first s':>8} {'warm b/s':>9}"
        f" {'peak RSS MiB':>12}"
        f" {'faults/b':>9} {'ctxsw/b':>8} {'main us/b':>9} {'loaderx/this':>12}"
    )
    legend = (
        "  warm b/s: batches/s during the warm-up (the same time for every row, before the timed"
        " window); faults/b, ctxsw/b: minor page faults and context switches of the process tree"
        " per batch; main us/b: CPU time per batch of the thread that takes the batches (a"
        " training loop's thread; the bench's own look at each batch is in it, the same for every"
        " row);"
        f" loaderx/this: '{lx.name}' over the row (median of per-round ratios)"
    )
    lines = [legend, head, "  " + "-" * (len(head) - 2)]
    for cfg, row in rows.items():
        if not row.ok:
            lines.append(f"  {row.name:<{width}} {row.status}")
            continue
        e = extra[cfg]
        versus = paired_ratio(lx, [row], "records_s")
        lines.append(
            f"  {row.name:<{width}} {row.median('records_s') / BATCH_SIZE:>10.1f}"
            f" {row.median('gather_mibs'):>8.1f} {np.median(e['first_s']):>8.3f}"
            f" {np.median(e['warm']):>9.1f}"
            f" {max(e['rss']) / MIB:>12.1f}"
            f" {np.median(e['faults']):>9.1f} {np.median(e['switches']):>8.1f}"
            f" {np.median(e['main_cpu']):>9.1f}"
            f" {fmt(versus, '.2f') + 'x' if versus else '-':>12}"
        )
    return lines


#: The copy-limit context (before 2026-12-07 it was labelled "... the most any loader
#: could show", which the loader's two threads outrun; bench_report.py maps that label).
COPY_VS_TORCHDATA = "copy limit vs torchdata (best): a bare gather(out=) loop of the same batches"


def _targets(rows: dict, lx: Row, extra: dict, lx_cfg) -> tuple[list[Target], list[str]]:
    named = {r.name: r for r in rows.values()}
    targets = []

    def family(name: str) -> list[str]:
        return [r.name for cfg, r in rows.items() if cfg[0] == name]

    for name, (label, threshold) in BARS.items():
        targets.append(
            Target(
                f"loader end to end vs {label}", lx.name, family(name), threshold,
                metric="records_s",
            ).evaluate(named)
        )
    store = _row_name("loaderx_store", None)
    copy = _row_name("loaderx_copy", None)
    # (label, row, rows it is compared with, level): no bar of their own, they
    # name the limit a bar above is held against.
    contexts = [
        ("DenseStore[idx] loop vs HF datasets [idx], the same access", store, family("hf"), 3.0),
        (COPY_VS_TORCHDATA, copy, family("torchdata"), 3.0),
        ("C streaming copy vs torchdata (best): a plain copy of the same batches, a thread"
         " per core", _row_name("c_copy", None), family("torchdata"), 3.0),
        ("loader end to end vs the copy limit", lx.name, [copy], 0.8),
        ("loader end to end vs a plain C streaming copy", lx.name,
         family("c_copy"), 0.95),
        ("loader end to end vs Lance take() of random batches (issue 27: no bar)", lx.name,
         family("lance"), 1.0),
    ]
    for label, row, bases, level in contexts:
        targets.append(
            Target(f"  (context) {label}", row, bases, level, metric="records_s", spec=False)
            .evaluate(named)
        )
    lines = []
    memory = Target(
        "loader peak RSS within touched + prefetch x batch + 64 MiB (bound / peak)",
        lx.name,
        [],
        1.0,
    )
    if lx.ok and extra[lx_cfg]["rss"]:
        peak, bound = max(extra[lx_cfg]["rss"]), extra[lx_cfg]["bound"]
        memory.settle(bound / peak)
        lines.append(
            f"  loaderx peak RSS {peak / MIB:.1f} MiB (VmHWM), bound {bound / MIB:.1f} MiB"
            " = store pages touched"
            f" (capped at store size) + {PREFETCH} x batch + 64 MiB"
        )
    else:
        memory.settle(None, "loaderx unavailable")
    targets.append(memory)
    return targets, lines


def _loader_section(ctx, rows: dict, extra: dict) -> Section:
    lx_cfg = ("loaderx", None)
    lx = rows[lx_cfg]
    lines = _table(rows, extra, lx)
    targets, memory_lines = _targets(rows, lx, extra, lx_cfg)
    lines.extend(memory_lines)
    lines.append("  targets (median of per-round ratios; SPEC §9 and issue 16):")
    lines.extend(t.line() for t in targets)
    if ctx.venvs is not None:
        lines.extend(f"  {line}" for line in ctx.venvs.report_lines())
    title = (
        f"loader end to end: x uint8 {ITEM_SHAPE} (12 KiB) + y int64, {ctx.size.loader_records}"
        f" records, batch {BATCH_SIZE},"
        f" random order, after a warm-up of {ctx.size.loader_warmup_s:g} s up to"
        f" {ctx.size.loader_batches} batches or {ctx.size.loader_seconds:g} s per run,"
        f" each run a fresh process, {_rounds(ctx)} rounds"
    )
    lines.insert(0, f"== {title} ==")
    return Section("loader", title, lines, list(rows.values()), targets)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        sys.exit(child_main(sys.argv[2:]))
    sys.exit("usage: bench_loader.py child CONFIG_JSON (started by scripts/bench.py)")
