"""The cold layer: random batches from stores larger than the page cache left to them.

Training sets are usually bigger than memory, so random batches come from the
disk. Two workloads, each a data set of `Size.cold` records: 12 KiB image-like
uint8 records and 200 B int16 rows (10^7 of them at the default size, which
also makes the "first batch" column the time to first batch on a 10^7-record
data set). Every record carries its own index in its first 8 bytes, so every
delivered batch names the records it holds; the parent checks the first two
batches of every run against the .npy source (ids and a hash of the bytes).

Each run is a fresh child process (this file, `child` mode) that
  * starts in a memory cgroup whose limit is `Size.cold["cgroup_mib"]`: the
    page cache the run may fill is at most that limit minus its own memory,
    and every data set is at least twice the limit (cgroup v1 or v2, as root;
    elsewhere the run is uncapped and the table says so);
  * finds its data cold: before every run the parent drops every file of the
    data set from the page cache (posix_fadvise(DONTNEED); nothing has them
    mapped then);
  * reads batches of distinct records (a permutation: no record twice in a
    run) for `Size.cold["seconds"]`, or until it has read a quarter of the
    data set, after its first batch.
Rows: numpy memmap fancy index; loaderx DenseStore raw `ds[idx]`; the same
with the next two batches' reads queued by `prefetch(idx, wait=False)` on a
thread (how a loader prefetches); the DataLoader; for 12 KiB also the zstd store; Lance `take()`
into numpy (a fixed_size_list column, which pylance stores raw, and for
12 KiB a zstd `binary` column). Limits: `fio` random direct reads of the
loaderx data file, on the same file system, at queue depth 32 (4 KiB,
12 KiB: the same bytes as a 12 KiB record, 16 KiB) and depth 1 (16 KiB),
run in the same rounds.

The data sets are built once into --cache (bench-out/cold, git-ignored) and
reused; --size tiny builds small ones into the run's directory, with no
cgroup and no fio (a smoke test: it proves the rows run and validate).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

import bench_data
from bench_harness import (
    MIB,
    Row,
    Section,
    Target,
    Unavailable,
    child_reason,
    fmt,
    paired_ratio,
    run_child_json,
    short_error,
)

# (label, dtype, item shape)
WORKLOADS = (
    ("12 KiB", np.uint8, (64, 64, 3)),
    ("200 B", np.int16, (100,)),
)
MARKER = "bench-cold.json"
DATA_VERSION = 1  # bump when the record contents change: cached data sets are rebuilt
CHECKED = 2
AHEAD = 2  # batches the prefetch thread runs ahead
BUILD_RECORDS = 1 << 18
CGROUP_NAME = "loaderx-bench-cold"

# backend -> (row name, workloads it runs on)
BACKENDS = {
    "npy": ("npy memmap fancy index", ("12 KiB", "200 B")),
    "lx": ("loaderx raw ds[idx]", ("12 KiB", "200 B")),
    "lx_ahead": (f"loaderx raw ds[idx], prefetch(wait=False) {AHEAD} batches ahead on a thread",
                 ("12 KiB", "200 B")),
    "lx_loader": ("loaderx DataLoader (raw)", ("12 KiB", "200 B")),
    "lx_zstd": ("loaderx zstd ds[idx]", ("12 KiB",)),
    "lance": ("Lance take() raw (fixed_size_list) -> numpy", ("12 KiB", "200 B")),
    "lance_zstd": ("Lance take() zstd (binary) -> numpy", ("12 KiB",)),
}
# (block size, queue depth, workloads)
FIO_JOBS = (
    ("4k", 32, ("12 KiB", "200 B")),
    ("12k", 32, ("12 KiB",)),
    ("16k", 32, ("12 KiB",)),
    ("16k", 1, ("12 KiB",)),
)


def fio_row(bs: str, depth: int) -> str:
    return f"fio {bs} random direct reads, queue depth {depth} (limit)"


# ============================================================================ records


def ids_of(batch: np.ndarray) -> np.ndarray:
    """The index each record carries in its first 8 bytes."""
    rows = np.ascontiguousarray(batch).reshape(len(batch), -1).view(np.uint8)
    return rows[:, :8].copy().view("<u8").ravel()


def _digest(batch: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(batch).data, digest_size=16).hexdigest()


def _plan(seed: int, count: int, batch: int) -> np.ndarray:
    """Distinct records in random order, as (batches, batch) int64: no record twice."""
    usable = count - count % batch
    order = np.random.default_rng(seed).permutation(count)[:usable]
    return order.reshape(-1, batch).astype(np.int64)


# ============================================================================ child side


def _reader(cfg: dict, plan: np.ndarray):
    """(fetch(k) -> batch k as numpy, close) for the child's backend."""
    backend, data = cfg["backend"], Path(cfg["data"])
    dtype, shape = np.dtype(cfg["dtype"]), tuple(cfg["shape"])
    if backend == "npy":
        array = np.asarray(np.load(data / "x.npy", mmap_mode="r"))
        return (lambda k: array[plan[k]]), (lambda: None)
    if backend.startswith("lance"):
        import lance

        dataset = lance.dataset(str(data / ("lance_zstd" if backend == "lance_zstd" else "lance")))

        from bench_backends import lance_dense

        def take(k):
            table = dataset.take(plan[k], columns=["x"])
            return lance_dense(table.column("x"), dtype, shape, len(plan[k]))

        return take, (lambda: None)
    from loaderx.zrecord import DenseStore

    store = DenseStore(str(data / ("zstd" if backend == "lx_zstd" else "raw")))
    if backend == "lx_loader":
        from loaderx.dataloader import DataLoader

        loader = DataLoader({"x": store}, batch_size=len(plan[0]), seed=cfg["seed"])
        it = iter(loader)

        def close_loader():
            loader.close()
            store.close()

        return (lambda k: next(it)["x"]), close_loader
    if backend == "lx_ahead":
        return _ahead(store, plan)
    return (lambda k: store[plan[k]]), store.close


def _ahead(store, plan: np.ndarray):
    """ds[idx] with a thread that queues the reads of the next AHEAD batches
    (prefetch without waiting: the device's queue stays full across batches)."""
    slots = threading.Semaphore(AHEAD)
    stop = threading.Event()

    def run():
        for k in range(1, len(plan)):
            slots.acquire()
            if stop.is_set():
                return
            store.prefetch(plan[k], wait=False)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def fetch(k):
        batch = store[plan[k]]
        slots.release()
        return batch

    def close():
        stop.set()
        slots.release()
        thread.join()
        store.close()

    return fetch, close


def _majflt() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def _measure(cfg: dict) -> dict:
    plan = _plan(cfg["seed"], cfg["count"], cfg["batch"])
    limit = max(CHECKED + 1, min(len(plan), len(plan) // 4))
    fetch, close = _reader(cfg, plan)
    batch = fetch(0)
    first_s = time.time() - cfg["spawned"]
    checks = []
    for k in range(CHECKED):
        batch = batch if k == 0 else fetch(k)
        checks.append({"ids": ids_of(batch).tolist(), "digest": _digest(batch),
                       "shape": list(batch.shape), "dtype": str(batch.dtype)})
    faults, cpu = _majflt(), time.process_time()
    count, start = 0, time.perf_counter()
    while CHECKED + count < limit and (count < 2 or time.perf_counter() - start < cfg["seconds"]):
        fetch(CHECKED + count)
        count += 1
    seconds = time.perf_counter() - start
    result = {
        "status": "ok", "batches": count, "seconds": seconds, "first_s": first_s,
        "majflt_per_batch": (_majflt() - faults) / count,
        "cpu_per_batch_ms": (time.process_time() - cpu) / count * 1e3,
        "checks": checks,
    }
    close()
    return result


def child_main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    try:
        result = _measure(cfg)
    except ImportError as exc:
        result = {"status": "missing", "reason": child_reason(exc)}
    except Exception as exc:  # reported as a "failed" row by the parent
        result = {"status": "failed", "reason": child_reason(exc)}
    print(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # the loader's and Lance's threads need no orderly shutdown here


# ============================================================================ parent side: data


def _records(rng, first: int, n: int, dtype, shape) -> np.ndarray:
    rows = bench_data.dense_records(rng, n, dtype, shape)
    ids = np.arange(first, first + n, dtype="<u8")
    rows.reshape(n, -1).view(np.uint8)[:, :8] = ids.view(np.uint8).reshape(n, 8)
    return rows


def _lance_schema(pa, dtype, shape, zstd: bool):
    if zstd:
        return pa.schema([pa.field("x", pa.binary(),
                                   metadata={"lance-encoding:compression": "zstd"})])
    width = int(np.prod(shape))
    return pa.schema([pa.field("x", pa.list_(pa.from_numpy_dtype(np.dtype(dtype)), width))])


def _lance_batch(pa, rows: np.ndarray, schema, zstd: bool):
    n = len(rows)
    if zstd:
        flat = rows.reshape(n, -1).view(np.uint8)
        offsets = np.arange(n + 1, dtype=np.int32) * flat.shape[1]
        array = pa.BinaryArray.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                              pa.py_buffer(np.ascontiguousarray(flat))])
    else:
        values = pa.array(np.ascontiguousarray(rows).reshape(-1))
        array = pa.FixedSizeListArray.from_arrays(values, int(np.prod(rows.shape[1:])))
    return pa.RecordBatch.from_arrays([array], schema=schema)


def _build(directory: Path, label: str, dtype, shape, count: int, seed: int, log) -> dict:
    """Writes the data set: x.npy, loaderx raw (and zstd for 12 KiB), Lance raw
    (and zstd); backends that cannot be built say why."""
    from loaderx.zrecord import DenseStore

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    zstd = label == "12 KiB"
    start = time.perf_counter()
    x = np.lib.format.open_memmap(directory / "x.npy", mode="w+", dtype=dtype, shape=(count, *shape))
    stores = [DenseStore(str(directory / "raw"), dtype, shape, codec="raw")]
    if zstd:
        stores.append(DenseStore(str(directory / "zstd"), dtype, shape, codec="zstd"))
    rng = np.random.default_rng(seed)
    for first in range(0, count, BUILD_RECORDS):
        rows = _records(rng, first, min(BUILD_RECORDS, count - first), dtype, shape)
        x[first:first + len(rows)] = rows
        for store in stores:
            store.append(rows)
    x.flush()
    del x
    for store in stores:
        store.close()
    problems = {}
    try:
        import lance
        import pyarrow as pa
    except ImportError as exc:
        problems["lance"] = problems["lance_zstd"] = f"missing: {short_error(exc)}"
    else:
        source = np.load(directory / "x.npy", mmap_mode="r")
        for name, compressed in (("lance", False), ("lance_zstd", True)):
            if compressed and not zstd:
                continue
            schema = _lance_schema(pa, dtype, shape, compressed)
            batches = (_lance_batch(pa, np.asarray(source[a:a + BUILD_RECORDS]), schema, compressed)
                       for a in range(0, count, BUILD_RECORDS))
            try:
                lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches),
                                    str(directory / name))
            except Exception as exc:  # the row then says why
                problems[name] = f"failed: Lance write: {short_error(exc)}"
    log(f"cold {label}: {count} records written in {time.perf_counter() - start:.1f} s")
    return problems


def _prepare(ctx, label: str, dtype, shape) -> dict:
    count = ctx.size.cold[label]
    tiny = ctx.size.cold["cgroup_mib"] == 0
    root = (ctx.workdir if tiny or ctx.cache is None else ctx.cache) / "cold"
    directory = root / f"{''.join(ch for ch in label if ch.isalnum())}-{count}"
    want = {"version": DATA_VERSION, "count": count, "dtype": np.dtype(dtype).str,
            "shape": list(shape)}
    marker = directory / MARKER
    try:
        done = json.loads(marker.read_text())
    except (OSError, ValueError):
        done = None
    if done is None or {k: done.get(k) for k in want} != want:
        record = int(np.prod(shape)) * np.dtype(dtype).itemsize
        need = count * record * 5
        root.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(root).free
        if need > free // 2:
            raise Unavailable("missing", f"the {label} data set needs ~{need / 2**30:.1f} GiB,"
                                         f" {free / 2**30:.1f} GiB free")
        problems = _build(directory, label, dtype, shape, count, ctx.seed + 27, ctx.log)
        marker.write_text(json.dumps({**want, "problems": problems}))
        done = json.loads(marker.read_text())
    return {"dir": directory, "count": count, "dtype": dtype, "shape": shape,
            "record_bytes": int(np.prod(shape)) * np.dtype(dtype).itemsize,
            "problems": done.get("problems", {}),
            "source": np.load(directory / "x.npy", mmap_mode="r")}


def drop_cached(directory: Path) -> None:
    """Every file of a data set out of the page cache (nothing may have it mapped)."""
    if not hasattr(os, "posix_fadvise"):
        return
    for base, _dirs, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(base, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


# ============================================================================ parent side: limits


class MemoryCap:
    """A memory cgroup the children run in (v1 or v2): the page cache they may
    fill is its limit less their own memory. `why` says why there is none."""

    def __init__(self, limit_mib: int):
        self.path: Path | None = None
        self.version = 0
        self.limit = limit_mib << 20
        self.why = ""
        if limit_mib <= 0:
            self.why = "no cgroup at this size"
            return
        v1 = Path("/sys/fs/cgroup/memory")
        v2 = Path("/sys/fs/cgroup")
        try:
            if (v1 / "memory.limit_in_bytes").exists():
                self.path, self.version = v1 / CGROUP_NAME, 1
                self.path.mkdir(exist_ok=True)
                (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
            elif "memory" in (v2 / "cgroup.controllers").read_text().split():
                self.path, self.version = v2 / CGROUP_NAME, 2
                self.path.mkdir(exist_ok=True)
                (self.path / "memory.max").write_text(str(self.limit))
            else:
                self.why = "no memory cgroup controller"
        except OSError as exc:
            self.path = None
            self.why = f"cannot make a memory cgroup ({exc.strerror}; needs root)"

    def enter(self) -> None:
        """In the child, before exec: move it into the cgroup."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def reset_peak(self) -> None:
        if self.path is None:
            return
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            (self.path / name).write_text("0")
        except OSError:  # an older v2 kernel cannot reset memory.peak
            pass

    def peak_mib(self) -> float | None:
        if self.path is None:
            return None
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int((self.path / name).read_text()) / MIB
        except (OSError, ValueError):
            return None

    def describe(self) -> str:
        if self.path is None:
            return f"uncapped: {self.why}"
        return f"memory cgroup v{self.version} {self.path}, limit {self.limit >> 20} MiB"


def run_fio(path: Path, bs: str, depth: int, seconds: float) -> dict:
    """`fio` random direct reads of `path`: {"mib_s", "iops"}; Unavailable when it cannot run."""
    if shutil.which("fio") is None:
        raise Unavailable("missing", "fio is not installed (Debian package fio)")
    last = ""
    for engine in ("io_uring", "libaio", "psync"):
        argv = ["fio", "--name=cold", f"--filename={path}", "--readonly", "--rw=randread",
                f"--bs={bs}", f"--iodepth={depth}", f"--ioengine={engine}", "--direct=1",
                f"--runtime={seconds}", "--time_based", "--output-format=json"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120 + 4 * seconds)
        if done.returncode == 0:
            read = json.loads(done.stdout[done.stdout.index("{"):])["jobs"][0]["read"]
            return {"mib_s": read["bw_bytes"] / MIB, "iops": read["iops"], "engine": engine}
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    raise Unavailable("failed", f"fio: {last[:160]}")


# ============================================================================ parent side: runs


def _one_run(ctx, backend: str, prepared: dict, row: Row, cap: MemoryCap, round_index: int) -> None:
    cold = ctx.size.cold
    cfg = {
        "backend": backend, "data": str(prepared["dir"]), "seed": ctx.seed + round_index,
        "count": prepared["count"], "batch": cold["batch"], "seconds": cold["seconds"],
        "dtype": np.dtype(prepared["dtype"]).str, "shape": list(prepared["shape"]),
    }
    drop_cached(prepared["dir"])
    cap.reset_peak()
    cfg["spawned"] = time.time()
    argv = [sys.executable, str(Path(__file__).resolve()), "child", json.dumps(cfg)]
    result = _run_capped(argv, cap, 300 + 20 * cold["seconds"])
    if result["status"] != "ok":
        row.status = f"{result['status']}: {result['reason']}"
        return
    problem = _check(result, prepared, cfg, backend)
    if problem:
        row.status = f"INVALID: {problem}"
        return
    per_s = result["batches"] / result["seconds"]
    row.records_s.append(per_s * cfg["batch"])
    row.gather_mibs.append(per_s * cfg["batch"] * prepared["record_bytes"] / MIB)
    row.batches_timed = result["batches"]
    for key, value in (("first_s", result["first_s"]), ("majflt", result["majflt_per_batch"]),
                       ("cpu_ms", result["cpu_per_batch_ms"]), ("peak_mib", cap.peak_mib())):
        row.extra.setdefault(key, []).append(value)


def _run_capped(argv: list, cap: MemoryCap, timeout_s: float) -> dict:
    if cap.path is None:
        return run_child_json(argv, timeout_s)
    # run_child_json, with the child moved into the cgroup before it execs.
    environment = dict(os.environ)
    scripts = Path(__file__).resolve().parent
    extra = [str(scripts.parent), str(scripts)] + ([environment["PYTHONPATH"]]
                                                  if environment.get("PYTHONPATH") else [])
    environment["PYTHONPATH"] = os.pathsep.join(extra)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=environment,
                              timeout=timeout_s, preexec_fn=cap.enter)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {timeout_s:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        killed = " (killed: the cgroup's limit?)" if done.returncode < 0 else ""
        return {"status": "failed", "reason": f"exit {done.returncode}{killed}: {tail[:160]}"}
    return json.loads(lines[-1])


def _check(result: dict, prepared: dict, cfg: dict, backend: str) -> str:
    source, plan = prepared["source"], _plan(cfg["seed"], cfg["count"], cfg["batch"])
    want_shape = [cfg["batch"], *prepared["shape"]]
    for k, check in enumerate(result["checks"]):
        if check["shape"] != want_shape or np.dtype(check["dtype"]) != np.dtype(prepared["dtype"]):
            return f"batch {k} is {check['dtype']} {check['shape']}, want {want_shape}"
        ids = np.asarray(check["ids"], dtype=np.int64)
        if backend != "lx_loader" and not np.array_equal(ids, plan[k]):
            return f"batch {k} holds other records than planned"
        if ids.min() < 0 or ids.max() >= cfg["count"]:
            return f"batch {k} holds ids outside the data set"
        if _digest(np.asarray(source[ids])) != check["digest"]:
            return f"batch {k}: bytes differ from the source records"
    return ""


def _fio_run(ctx, prepared: dict, job: tuple, row: Row) -> None:
    bs, depth = job
    try:
        got = run_fio(prepared["dir"] / "raw" / "data", bs, depth, ctx.size.cold["fio_seconds"])
    except Unavailable as exc:
        row.status = str(exc)
        return
    except (OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
        row.status = f"failed: {short_error(exc)}"
        return
    row.gather_mibs.append(got["mib_s"])
    row.records_s.append(got["iops"])
    row.note = f"ioengine {got['engine']}"


def run_cold(ctx) -> list[Section]:
    cold = ctx.size.cold
    cap = MemoryCap(cold["cgroup_mib"])
    workloads = []
    for label, dtype, shape in WORKLOADS:
        rows: dict = {}
        try:
            prepared = _prepare(ctx, label, dtype, shape)
        except Unavailable as exc:
            ctx.log(f"cold {label}: {exc}")
            prepared = None
        for backend, (name, where) in BACKENDS.items():
            if label in where:
                rows[backend] = Row(f"{label} {name}", "baseline" if backend == "npy" else
                                    ("loaderx" if backend.startswith("lx") else "contender"), "raw")
                if prepared is None:
                    rows[backend].status = "missing: data set not built (disk)"
                elif prepared["problems"].get(backend):
                    rows[backend].status = prepared["problems"][backend]
        for bs, depth, where in FIO_JOBS:
            if label in where:
                rows[(bs, depth)] = Row(f"{label} {fio_row(bs, depth)}", "limit", "-")
                if not cold["fio_seconds"]:
                    rows[(bs, depth)].status = "missing: fio is not run at this size"
        workloads.append((label, prepared, rows))
    rounds = min(ctx.repeat, ctx.size.loader_repeat_max)
    for round_index in range(rounds):
        for label, prepared, rows in workloads:
            order = list(rows)
            shift = round_index % len(order)
            for key in order[shift:] + order[:shift]:
                if not rows[key].ok:
                    continue
                if isinstance(key, tuple):
                    _fio_run(ctx, prepared, key, rows[key])
                else:
                    _one_run(ctx, key, prepared, rows[key], cap, round_index)
        ctx.log(f"cold: round {round_index + 1} of {rounds} done")
    return [_section(ctx, label, prepared, rows, cap, rounds) for label, prepared, rows in workloads]


# ============================================================================ parent side: report


def _first_ratio(row: Row, base: Row) -> float | None:
    """base's time to first batch over row's (median of per-round ratios)."""
    mine, theirs = row.extra.get("first_s"), base.extra.get("first_s")
    if not row.ok or not base.ok or not mine or not theirs:
        return None
    return float(np.median([b / a for a, b in zip(mine, theirs) if a > 0]))


def _targets(label: str, rows: dict) -> list[Target]:
    named = {r.name: r for r in rows.values()}

    def name(key) -> str:
        return rows[key].name if key in rows else f"{label} ?"

    lx, npy, lance = name("lx"), name("npy"), name("lance")
    targets = []
    if label == "12 KiB":
        targets.append(Target("cold raw 12 KiB gather vs fio 12 KiB reads at depth 32"
                              " (the same bytes)", lx, [name(("12k", 32))], 0.7))
        contexts = (
            ("cold raw 12 KiB gather vs fio 16 KiB reads at depth 32", lx, ("16k", 32), 0.7),
            ("cold raw 12 KiB gather vs fio 16 KiB reads at depth 1", lx, ("16k", 1), 1.0),
            ("cold raw 12 KiB, prefetch thread, vs fio 12 KiB reads at depth 32",
             name("lx_ahead"), ("12k", 32), 0.7),
            ("cold raw 12 KiB DataLoader vs fio 12 KiB reads at depth 32",
             name("lx_loader"), ("12k", 32), 0.7),
        )
        for text, row, key, level in contexts:
            targets.append(Target(f"  (context) {text}", row, [name(key)], level, spec=False))
    else:
        targets.append(Target("  (context) cold raw 200 B records/s vs fio 4 KiB reads/s at"
                              " depth 32 (a page per record)", lx, [name(("4k", 32))], 0.7,
                              metric="records_s", spec=False))
    targets.append(Target(f"cold raw {label} gather vs cold numpy memmap", lx, [npy], 2.0))
    targets.append(Target(f"cold raw {label} gather vs cold Lance take()", lx, [lance], 2.0))
    if "lx_zstd" in rows:
        targets.append(Target(f"  (context) cold zstd {label} gather vs cold Lance take() zstd",
                              name("lx_zstd"), [name("lance_zstd")], 2.0, spec=False))
    for target in targets:
        target.evaluate(named)
    for key, who in (("npy", "numpy memmap"), ("lance", "Lance")):
        if key in rows and "lx" in rows:
            t = Target(f"  (context) time to first batch (process start, cold): loaderx vs {who}",
                       lx, [rows[key].name], 1.0, spec=False)
            targets.append(t.settle(_first_ratio(rows["lx"], rows[key]), "a row did not run"))
    return targets


def _section(ctx, label: str, prepared: dict | None, rows: dict, cap: MemoryCap,
             rounds: int) -> Section:
    width = max(len(r.name) for r in rows.values())
    head = (f"  {'row':<{width}} {'MiB/s':>8} {'records/s':>10} {'first s':>8} {'majflt/b':>9}"
            f" {'cpu ms/b':>9} {'peak MiB':>9}")
    lines = ["  first s: process start to first batch (imports included); majflt/b: major page"
             " faults per batch; cpu ms/b: CPU time of all threads per batch; peak MiB: the"
             " cgroup's peak (memory + page cache); limit rows: MiB/s and reads/s",
             head, "  " + "-" * (len(head) - 2)]
    for row in rows.values():
        if not row.ok:
            lines.append(f"  {row.name:<{width}} {row.status}")
            continue
        e = row.extra

        def med(key, spec):
            values = [v for v in e.get(key, []) if v is not None]
            return fmt(float(np.median(values)) if values else None, spec)

        lines.append(f"  {row.name:<{width}} {row.median('gather_mibs'):>8.1f}"
                     f" {row.median('records_s'):>10.0f} {med('first_s', '.3f'):>8}"
                     f" {med('majflt', '.1f'):>9} {med('cpu_ms', '.2f'):>9} {med('peak_mib', '.0f'):>9}"
                     + (f"  ({row.note})" if row.note else ""))
    targets = _targets(label, rows)
    lines.append("  targets (median of per-round ratios; issue 27):")
    lines.extend(t.line() for t in targets)
    size = "" if prepared is None else (
        f"{prepared['count']} records, {prepared['count'] * prepared['record_bytes'] / 2**30:.2f} GiB, ")
    title = (f"cold random batches, {label} records: {size}batch {ctx.size.cold['batch']},"
             f" data dropped from the page cache before every run, {cap.describe()},"
             f" {rounds} rounds")
    lines.insert(0, f"== {title} ==")
    return Section(f"cold-{label.replace(' ', '')}", title, lines, list(rows.values()), targets)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        sys.exit(child_main(sys.argv[2:]))
    sys.exit("usage: bench_cold.py child CONFIG_JSON (started by scripts/bench.py)")
