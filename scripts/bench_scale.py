"""The scale layer: how loaderx's costs grow with the work (issue 16).

Three sweeps, every run a fresh process (this file, `child` mode), rounds
interleaved, figures the median over rounds:

  * store size, 10^a .. 10^b records of three kinds: fixed-width raw DenseStore
    of 8 B (int64) and of 1 KiB (uint8 x 1024) records, and a raw RaggedStore of
    int32 records of 8..64 values. Per size: open time, time to the first
    random batch of 256, gather throughput over random batches, and the RSS
    after 1000 random batches (anonymous and file-backed apart: the file-backed
    part is the page cache of the store pages those batches touched), then a
    steady pass of new random batches (the first pass also pays for mapping
    the store's pages into the fresh process; both are printed). Targets: open
    <= 10 ms and first batch <= 50 ms at the largest size; steady throughput
    within 20% of the 10^6 figure at every size that fits the page cache;
    anonymous RSS independent of the size (within 16 MiB).
  * batch size 1 .. 4096 on the 1 KiB store: per-batch overhead, and from which
    batch the native lanes pay off (gather with threads=1 vs every lane);
  * threads 1 .. all cores: gather(out=, threads=n) of batches of 4096 and the
    DataLoader with workers=n; efficiency = rate(n) / (n x rate(1)).

Stores bigger than half the free disk or half the available memory (the page
cache) are not built; the table says which and why. Stores are built once into
--cache (default bench-out/scale, git-ignored) and reused; --size tiny builds
small ones into the run's temporary directory. Record values are a function of
the index, so every batch is validated exactly without a copy of the data.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from bench_harness import (
    table_line,
    child_reason,
    MIB,
    Row,
    Section,
    Target,
    ValidationError,
    check_array,
    disk_usage_bytes,
    paired_ratio,
    run_child_json,
    short_error,
)

BATCH = 256
RSS_BATCHES = 1000
WINDOW_SEQ_LEN = 2048
BATCH_SIZES = (1, 4, 16, 64, 256, 1024, 4096)
THREAD_BATCH = 4096
K1, K2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)
BUILD_CHUNK = 1 << 16
MARKER = "bench-scale.json"
# Disk per record beyond its payload, at most (index entry, checksum): sizes are capped with it.
INDEX_BYTES_MAX = 16
STORE_VERSION = 1  # bump when the content formulas change, so cached stores are rebuilt

# kind -> (label, logical bytes per record (ragged: mean), store class)
KINDS = {
    "dense8": ("DenseStore raw 8 B (int64)", 8, "dense"),
    "dense1k": ("DenseStore raw 1 KiB (uint8 x 1024)", 1024, "dense"),
    "ragged": ("RaggedStore raw int32 x 8..64", 36 * 4 + 16, "ragged"),
}


# ============================================================================ record contents


def dense_records(kind: str, indices: np.ndarray) -> np.ndarray:
    """Record i as a function of i: a mixed int64 for dense8, 128 mixed words for dense1k."""
    ids = indices.astype(np.uint64)
    if kind == "dense8":
        return (ids * K1).view(np.int64)
    words = ids[:, None] * K1 + np.arange(128, dtype=np.uint64)[None, :] * K2
    return words.view(np.uint8).reshape(len(indices), 1024)


def ragged_lengths(indices: np.ndarray) -> np.ndarray:
    return 8 + (indices.astype(np.int64) * 7919) % 57


def ragged_packed(indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, row_splits) of records `indices`: record i holds i, i + 1, ... (int32)."""
    lengths = ragged_lengths(indices)
    splits = np.zeros(len(indices) + 1, dtype=np.int64)
    np.cumsum(lengths, out=splits[1:])
    offsets = np.arange(splits[-1], dtype=np.int64) - np.repeat(splits[:-1], lengths)
    values = (np.repeat(indices.astype(np.int64), lengths) + offsets).astype(np.int32)
    return values, splits


# ============================================================================ building


def _build_store(kind: str, count: int, path: Path) -> None:
    from loaderx.zrecord import DenseStore, RaggedStore

    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    store_path = str(path / "store")
    if KINDS[kind][2] == "dense":
        dtype, shape = (np.int64, ()) if kind == "dense8" else (np.uint8, (1024,))
        store = DenseStore(store_path, dtype, shape, codec="raw")
    else:
        store = RaggedStore(store_path, np.int32, codec="raw")
    with store:
        chunk = BUILD_CHUNK * (16 if kind == "dense8" else 1)
        for first in range(0, count, chunk):
            indices = np.arange(first, min(count, first + chunk), dtype=np.int64)
            if KINDS[kind][2] == "dense":
                store.append(dense_records(kind, indices))
            else:
                values, splits = ragged_packed(indices)
                store.append(np.split(values, splits[1:-1]))
    (path / MARKER).write_text(json.dumps({"kind": kind, "count": count, "version": STORE_VERSION}))


def _opens(kind: str, count: int, path: Path) -> bool:
    """The cached store is complete, of this content version, and opens with this loaderx."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker != {"kind": kind, "count": count, "version": STORE_VERSION}:
        return False
    try:
        from loaderx.dataset import open_store

        with open_store(str(path / "store")) as store:
            return len(store) == count
    except Exception:  # a format change or damage: rebuild it
        return False


def _free_bytes(path: Path) -> int:
    path.mkdir(parents=True, exist_ok=True)
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _skip_reason(bytes_needed: int, cached: bool, root: Path, max_bytes: int | None) -> str | None:
    gib = float(1 << 30)
    if max_bytes is not None and bytes_needed > max_bytes:
        return f"{bytes_needed / gib:.1f} GiB > --scale-max-gib {max_bytes / gib:g}"
    memory = _mem_available()
    if bytes_needed > memory // 2:
        return (
            f"{bytes_needed / gib:.1f} GiB > half the available memory ({memory / gib:.1f} GiB):"
            " it would not stay in the page cache"
        )
    free = _free_bytes(root)
    if not cached and bytes_needed > free // 2:
        return f"{bytes_needed / gib:.1f} GiB > half the free disk ({free / gib:.1f} GiB)"
    return None


def _warm(path: Path) -> None:
    """Reads every file once, so throughput measures a page-cache resident store."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb", buffering=0) as f:
                while f.read(16 << 20):
                    pass


def prepare_stores(ctx) -> tuple[dict, list[str]]:
    """(kind, count) -> store directory for every size that is built; and the skipped sizes."""
    tiny = max(b for _a, b in ctx.size.scale_exponents.values()) <= 4
    root = (ctx.workdir if tiny or ctx.cache is None else ctx.cache) / "scale"
    stores, skipped = {}, []
    for kind, (low, high) in ctx.size.scale_exponents.items():
        for exponent in range(low, high + 1):
            count = 10**exponent
            path = root / f"{kind}-1e{exponent}"
            cached = _opens(kind, count, path)
            needed = (
                disk_usage_bytes(path) if cached else count * (KINDS[kind][1] + INDEX_BYTES_MAX)
            )
            reason = _skip_reason(needed, cached, root, ctx.scale_max_bytes)
            if reason:
                skipped.append(f"{KINDS[kind][0]} at 10^{exponent} records: skipped, {reason}")
                continue
            if not cached:
                start = time.perf_counter()
                try:
                    _build_store(kind, count, path)
                except Exception as exc:  # reported as a skipped size; the others still run
                    skipped.append(
                        f"{KINDS[kind][0]} at 10^{exponent}: build failed: {short_error(exc)}"
                    )
                    shutil.rmtree(path, ignore_errors=True)
                    continue
                ctx.log(f"scale: built {kind} 10^{exponent} in {time.perf_counter() - start:.1f} s")
            _warm(path)
            stores[(kind, count)] = path
    return stores, skipped


# ============================================================================ child side


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def _open(kind: str, path: str):
    from loaderx.zrecord import DenseStore, RaggedStore

    return (DenseStore if KINDS[kind][2] == "dense" else RaggedStore)(str(Path(path) / "store"))


def _fetch(store, kind: str, indices: np.ndarray):
    return store[indices] if KINDS[kind][2] == "dense" else store.gather(indices, packed=True)


class _NumpyView:
    """The same records through numpy: a raw fixed-width store's data file holds
    them back to back from offset 0, so a memory map of it is the array a .npy
    user would fancy-index (the baseline of the throughput column)."""

    def __init__(self, kind: str, path: str):
        dtype, shape = (np.int64, ()) if kind == "dense8" else (np.uint8, (1024,))
        flat = np.memmap(Path(path) / "store" / "data", dtype=dtype, mode="r")
        self.array = np.asarray(flat).reshape((-1,) + shape)

    def __getitem__(self, indices: np.ndarray) -> np.ndarray:
        return self.array[indices]


def _validate(kind: str, got, indices: np.ndarray, what: str) -> None:
    if KINDS[kind][2] == "dense":
        check_array(got, dense_records(kind, indices), what)
        return
    values, splits = ragged_packed(indices)
    if not isinstance(got, tuple) or len(got) != 2:
        raise ValidationError(f"{what}: want (values, row_splits), got {type(got).__name__}")
    check_array(got[1], splits, f"{what} row_splits")
    check_array(got[0], values, f"{what} values")


def _payload_bytes(kind: str, plan: list) -> int:
    if KINDS[kind][2] == "dense":
        return sum(len(p) for p in plan) * KINDS[kind][1]
    return int(sum(ragged_lengths(p).sum() for p in plan)) * 4


def _timed_pass(store, kind: str, plan: list) -> dict:
    """Seconds, payload bytes, and faults and context switches per batch of one pass."""
    import bench_loader

    faults, switches = bench_loader.tree_counters()
    start = time.perf_counter()
    for indices in plan:
        _fetch(store, kind, indices)
    seconds = time.perf_counter() - start
    faults_end, switches_end = bench_loader.tree_counters()
    return {
        "seconds": seconds,
        "batches": len(plan),
        "bytes": _payload_bytes(kind, plan),
        "faults_per_batch": (faults_end - faults) / len(plan),
        "switches_per_batch": (switches_end - switches) / len(plan),
    }


def size_child(cfg: dict) -> dict:
    """Open, first batch, a first pass of random batches (its page mappings fresh), RSS after
    RSS_BATCHES random batches, then a steady pass of new random batches."""
    import loaderx.zrecord  # noqa: F401 - loading the library is import time, not open time

    kind, count, timed = cfg["kind"], cfg["count"], cfg["batches"]
    rng = np.random.default_rng(cfg["seed"])
    plan = [rng.integers(0, count, BATCH) for _ in range(max(cfg["rss_batches"], timed + 3))]
    steady_plan = [rng.integers(0, count, BATCH) for _ in range(timed)]
    numpy_plan = [rng.integers(0, count, BATCH) for _ in range(timed)]
    start = time.perf_counter()
    store = _open(kind, cfg["path"])
    open_s = time.perf_counter() - start
    first = _fetch(store, kind, plan[0])
    first_s = time.perf_counter() - start - open_s
    _validate(kind, first, plan[0], "first batch")
    for k in (1, 2):
        _validate(kind, _fetch(store, kind, plan[k]), plan[k], f"batch {k}")
    first_pass = _timed_pass(store, kind, plan[3 : 3 + timed])
    for indices in plan[3 + timed :]:
        _fetch(store, kind, indices)
    rss = {f: _status_kib(f + ":") * 1024 for f in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}
    steady = _timed_pass(store, kind, steady_plan)
    _validate(kind, _fetch(store, kind, steady_plan[-1]), steady_plan[-1], "last batch")
    windows_s = _windows_construction(store) if kind == "ragged" else None
    store.close()
    numpy_steady = None
    if KINDS[kind][2] == "dense":
        view = _NumpyView(kind, cfg["path"])
        _validate(kind, view[numpy_plan[0]], numpy_plan[0], "numpy baseline")
        numpy_steady = _timed_pass(view, kind, numpy_plan)
    return {
        "numpy_steady": numpy_steady,
        "windows_s": windows_s,
        "status": "ok",
        "open_s": open_s,
        "first_s": first_s,
        "first_pass": first_pass,
        "steady": steady,
        "rss": rss,
        "rss_after_batches": len(plan),
    }


def _windows_construction(store) -> float:
    """Seconds to construct TokenWindows over the store's documents: the index
    of prefix sums is built and cached in the store's directory the first time,
    memory-mapped after that."""
    from loaderx import TokenWindows

    start = time.perf_counter()
    windows = TokenWindows(store, seq_len=WINDOW_SEQ_LEN)
    seconds = time.perf_counter() - start
    expected = int(ragged_lengths(np.arange(len(store))).sum())
    if windows.total_tokens != expected:
        raise ValidationError(f"TokenWindows counts {windows.total_tokens} tokens, not {expected}")
    return seconds


def _time_calls(call, budget_s: float) -> float:
    """Seconds per call: calls repeat until `budget_s` is spent (at least 3)."""
    count, start = 0, time.perf_counter()
    while count < 3 or time.perf_counter() - start < budget_s:
        call()
        count += 1
    return (time.perf_counter() - start) / count


def batch_child(cfg: dict) -> dict:
    """Seconds per batch for each batch size and variant, one list entry per round."""
    store = _open("dense1k", cfg["path"])
    rng = np.random.default_rng(cfg["seed"])
    variants = {
        "store[idx] (all lanes)": lambda idx, out: store[idx],
        "gather(out=, threads=1)": lambda idx, out: store.gather(idx, out=out, threads=1),
        "gather(out=) (all lanes)": lambda idx, out: store.gather(idx, out=out),
    }
    figures = {name: {str(b): [] for b in BATCH_SIZES} for name in variants}
    for round_index in range(cfg["rounds"]):
        for size in BATCH_SIZES:
            idx = rng.integers(0, cfg["count"], size)
            out = np.empty((size, 1024), dtype=np.uint8)
            names = list(variants)
            names = names[round_index % 3 :] + names[: round_index % 3]
            for name in names:
                _validate("dense1k", variants[name](idx, out), idx, f"{name} batch {size}")
                figures[name][str(size)].append(
                    _time_calls(lambda: variants[name](idx, out), cfg["budget_s"])
                )
    store.close()
    return {"status": "ok", "figures": figures}


def _record_ids(rows: np.ndarray) -> np.ndarray:
    """Recovers i from a dense1k record (word 0 is i * K1 mod 2^64; K1 is odd, so invertible)."""
    inverse = np.uint64(pow(int(K1), -1, 1 << 64))
    return (rows[:, :8].copy().view(np.uint64)[:, 0] * inverse).astype(np.int64)


def _loader_rate(store, workers: int, count: int, budget_s: float) -> float:
    from loaderx.dataloader import DataLoader

    with DataLoader({"x": store}, batch_size=BATCH, seed=0, workers=workers) as loader:
        rows = next(loader)["x"]
        ids = _record_ids(rows)
        if ids.min() < 0 or ids.max() >= count:
            raise ValidationError(f"DataLoader workers={workers}: records are not of this store")
        check_array(rows, dense_records("dense1k", ids), f"DataLoader workers={workers}")
        return 1.0 / _time_calls(lambda: next(loader), budget_s)


def threads_child(cfg: dict) -> dict:
    """Per thread count, per round: gather records/s (batch THREAD_BATCH) and loader batches/s."""
    store = _open("dense1k", cfg["path"])
    rng = np.random.default_rng(cfg["seed"])
    idx = rng.integers(0, cfg["count"], THREAD_BATCH)
    out = np.empty((THREAD_BATCH, 1024), dtype=np.uint8)
    gather = {str(n): [] for n in cfg["threads"]}
    loader = {str(n): [] for n in cfg["threads"]}
    for round_index in range(cfg["rounds"]):
        order = (
            cfg["threads"][round_index % len(cfg["threads"]) :]
            + cfg["threads"][: round_index % len(cfg["threads"])]
        )
        for n in order:
            store.gather(idx, out=out, threads=n)
            _validate("dense1k", out, idx, f"gather threads={n}")
            gather[str(n)].append(
                THREAD_BATCH
                / _time_calls(lambda: store.gather(idx, out=out, threads=n), cfg["budget_s"])
            )
            loader[str(n)].append(_loader_rate(store, n, cfg["count"], cfg["budget_s"]))
    store.close()
    return {"status": "ok", "gather_records_s": gather, "loader_batches_s": loader}


CHILDREN = {"size": size_child, "batch": batch_child, "threads": threads_child}


def child_main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    try:
        result = CHILDREN[cfg["mode"]](cfg)
    except ValidationError as exc:
        result = {"status": "INVALID", "reason": str(exc)[:300]}
    except Exception as exc:  # reported as a "failed" row by the parent
        result = {"status": "failed", "reason": child_reason(exc)}
    print(json.dumps(result))
    return 0


# ============================================================================ parent side


def _run(cfg: dict) -> dict:
    argv = [sys.executable, str(Path(__file__).resolve()), "child", json.dumps(cfg)]
    return run_child_json(argv, timeout_s=1800)


def _size_rows(ctx, stores: dict) -> dict:
    """(kind, count) -> Row, measured over interleaved rounds of fresh processes."""
    rows = {}
    for kind, count in stores:
        row = Row(f"{KINDS[kind][0]} 10^{len(str(count)) - 1}", "loaderx", "raw")
        row.extra = {
            "kind": kind,
            "count": count,
            "open_ms": [],
            "first_ms": [],
            "rss": [],
            "faults": [],
            "switches": [],
            "first_pass_mibs": [],
            "steady_faults": [],
            "windows_ms": [],
            "numpy_mibs": [],
        }
        rows[(kind, count)] = row
        if kind == "ragged":
            # Round 0 then builds TokenWindows' index file (windows.idx; earlier
            # releases: windows-*.idx); later rounds read it.
            for cached in (Path(stores[(kind, count)]) / "store").glob("windows*.idx"):
                cached.unlink()
    rss_batches = RSS_BATCHES if ctx.size.scale_batches >= RSS_BATCHES else ctx.size.scale_batches
    for round_index in range(ctx.repeat):
        order = list(rows)
        shift = round_index % len(order)
        for key in order[shift:] + order[:shift]:
            row = rows[key]
            if not row.ok:
                continue
            cfg = {
                "mode": "size",
                "kind": key[0],
                "count": key[1],
                "path": str(stores[key]),
                "seed": ctx.seed + round_index,
                "batches": ctx.size.scale_batches,
                "rss_batches": rss_batches,
            }
            _record_size(row, _run(cfg))
        ctx.log(f"scale: size round {round_index + 1} done")
    return rows


def _record_size(row: Row, result: dict) -> None:
    """Row figures are the steady pass; the first pass (fresh mappings) goes to `extra`."""
    if result["status"] != "ok":
        row.status = f"{result['status']}: {result['reason']}"
        return
    steady, first = result["steady"], result["first_pass"]
    row.records_s.append(steady["batches"] * BATCH / steady["seconds"])
    row.gather_mibs.append(steady["bytes"] / MIB / steady["seconds"])
    row.batches_timed = steady["batches"]
    e = row.extra
    e["first_pass_mibs"].append(first["bytes"] / MIB / first["seconds"])
    e["open_ms"].append(result["open_s"] * 1e3)
    e["first_ms"].append(result["first_s"] * 1e3)
    e["rss"].append(result["rss"])
    e["rss_after_batches"] = result["rss_after_batches"]
    e["faults"].append(first["faults_per_batch"])
    e["switches"].append(first["switches_per_batch"])
    e["steady_faults"].append(steady["faults_per_batch"])
    numpy_steady = result.get("numpy_steady")
    if numpy_steady is not None:
        e["numpy_mibs"].append(numpy_steady["bytes"] / MIB / numpy_steady["seconds"])
    if result.get("windows_s") is not None:
        e["windows_ms"].append(result["windows_s"] * 1e3)


def _reference(rows: dict, kind: str):
    """The 10^6 row of a kind, or the largest below it when 10^6 is not measured."""
    counts = sorted(c for k, c in rows if k == kind and rows[(k, c)].ok)
    below = [c for c in counts if c <= 10**6]
    return rows[(kind, below[-1])] if below else None


def _median(values: list) -> float:
    return float(np.median(values)) if values else float("nan")


SIZE_COLUMNS = (
    ("records", 8),
    ("store MiB", 10),
    ("open ms", 8),
    ("first ms", 9),
    ("1st MiB/s", 10),
    ("steady MiB/s", 12),
    ("records/s", 10),
    ("vs ref", 7),
    ("numpy MiB/s", 11),
    ("RssAnon MiB", 11),
    ("RssFile MiB", 11),
    ("faults/b", 9),
    ("ctxsw/b", 8),
)


def _size_cells(row: Row, ref: Row | None, store_mib: float) -> list:
    e = row.extra
    versus = paired_ratio(row, [ref]) if ref is not None else None
    return [
        (e["count"], ".0e"),
        (store_mib, ".1f"),
        (_median(e["open_ms"]), ".2f"),
        (_median(e["first_ms"]), ".2f"),
        (_median(e["first_pass_mibs"]), ".1f"),
        (row.median("gather_mibs"), ".1f"),
        (row.median("records_s"), ".3g"),
        ("-" if versus is None else f"{versus:.2f}x", ""),
        ("-" if not e["numpy_mibs"] else f"{_median(e['numpy_mibs']):.1f}", ""),
        (max(r["RssAnon"] for r in e["rss"]) / MIB, ".1f"),
        (max(r["RssFile"] for r in e["rss"]) / MIB, ".1f"),
        (_median(e["faults"]), ".1f"),
        (_median(e["switches"]), ".1f"),
    ]


def _size_table(kind: str, rows: dict, stores: dict) -> list[str]:
    ref = _reference(rows, kind)
    head = table_line([(title, f">{width}") for title, width in SIZE_COLUMNS])
    after = max([r.extra.get("rss_after_batches", 0) for r in rows.values()] + [0])
    ref_label = ref.name.rsplit(" ", 1)[1] if ref else "-"
    lines = [
        f"  {KINDS[kind][0]} (ref = {ref_label} records; RSS after {after} random batches)",
        head,
        "  " + "-" * (len(head) - 2),
    ]
    for (k, count), row in sorted(rows.items(), key=lambda item: item[0][1]):
        if k != kind:
            continue
        if not row.ok:
            lines.append(f"  {count:>8.0e} {row.status}")
            continue
        cells = _size_cells(row, ref, disk_usage_bytes(stores[(k, count)]) / MIB)
        widths = [width for _title, width in SIZE_COLUMNS]
        lines.append(
            table_line([(format(v, spec), f">{w}") for (v, spec), w in zip(cells, widths)])
        )
    lines.extend(_windows_lines(kind, rows))
    return lines


def _windows_lines(kind: str, rows: dict) -> list[str]:
    """TokenWindows construction over the ragged stores: the first (index built and
    cached, round 0) and the cached ones (median of the later rounds)."""
    built = [(c, r.extra["windows_ms"]) for (k, c), r in sorted(rows.items())
             if k == kind and r.ok and r.extra["windows_ms"]]
    if not built:
        return []
    lines = [f"  TokenWindows(store, seq_len={WINDOW_SEQ_LEN}) over these documents, each in a"
             " fresh process: first (builds and caches the index) / cached"]
    for count, ms in built:
        cached = f"{_median(ms[1:]):.1f} ms" if len(ms) > 1 else "-"
        lines.append(f"  {count:>8.0e} documents: first {ms[0]:.1f} ms, cached {cached}")
    return lines


def _size_targets(kind: str, rows: dict) -> list[Target]:
    mine = {c: r for (k, c), r in rows.items() if k == kind and r.ok}
    label = KINDS[kind][0]
    if not mine:
        return [Target(f"scale {label}: no size ran", "-", [], 1.0).settle(None, "no size ran")]
    top = max(mine)
    top_row, exponent = mine[top], len(str(top)) - 1
    open_ms, first_ms = _median(top_row.extra["open_ms"]), _median(top_row.extra["first_ms"])
    targets = [
        Target(
            f"scale {label}: open at 10^{exponent} records, {open_ms:.2f} ms (limit 10 ms / open)",
            top_row.name,
            [],
            1.0,
        ).settle(10.0 / max(open_ms, 1e-6)),
        Target(
            f"scale {label}: first batch at 10^{exponent}, {first_ms:.2f} ms (limit 50 ms / first)",
            top_row.name,
            [],
            1.0,
        ).settle(50.0 / max(first_ms, 1e-6)),
    ]
    ref = _reference(rows, kind)
    ref_label = ref.name.rsplit(" ", 1)[1] if ref else "-"
    ratios = {
        c: paired_ratio(r, [ref]) for c, r in mine.items() if ref is not None and r is not ref
    }
    ratios = {c: v for c, v in ratios.items() if v is not None}
    worst = min(ratios, key=ratios.get) if ratios else None
    where = f"worst at 10^{len(str(worst)) - 1}" if worst else "one size only"
    targets.append(
        Target(
            f"scale {label}: gather throughput vs {ref_label} at every size ({where})",
            top_row.name,
            [],
            0.8,
        ).settle(ratios[worst] if worst else None, "one size only")
    )
    numpy_ref = ref.extra["numpy_mibs"] if ref is not None else []
    if worst and numpy_ref and mine[worst].extra["numpy_mibs"]:
        drop = _median(mine[worst].extra["numpy_mibs"]) / _median(numpy_ref)
        targets.append(
            Target(
                f"  (context) numpy memmap of the same file, 10^{len(str(worst)) - 1} vs"
                f" {ref_label}",
                top_row.name,
                [],
                0.8,
                spec=False,
            ).settle(drop)
        )
    cached_ms = top_row.extra["windows_ms"][1:]
    if cached_ms:
        ms = _median(cached_ms)
        targets.append(
            Target(
                f"scale {label}: TokenWindows cached construction at 10^{exponent} documents,"
                f" {ms:.1f} ms (limit 1000 ms / cached)",
                top_row.name,
                [],
                1.0,
            ).settle(1000.0 / max(ms, 1e-6))
        )
    anon = {c: max(x["RssAnon"] for x in r.extra["rss"]) for c, r in mine.items()}
    spread = (min(anon.values()) + (16 << 20)) / max(anon.values())
    targets.append(
        Target(
            f"scale {label}: RssAnon independent of size ((smallest + 16 MiB) / largest)",
            top_row.name,
            [],
            1.0,
        ).settle(spread)
    )
    return targets


def _batch_section(ctx, path: Path, count: int) -> Section:
    budget = min(0.2, ctx.size.budget_s)
    result = _run(
        {
            "mode": "batch",
            "path": str(path),
            "count": count,
            "seed": ctx.seed,
            "rounds": ctx.repeat,
            "budget_s": budget,
        }
    )
    title = (
        f"scale: batch size {BATCH_SIZES[0]} .. {BATCH_SIZES[-1]}, 1 KiB records,"
        f" 10^{len(str(count)) - 1} records"
    )
    if result["status"] != "ok":
        row = Row(
            "batch-size sweep", "loaderx", "raw", status=f"{result['status']}: {result['reason']}"
        )
        return Section("scale-batch", title, [f"== {title} ==", f"  {row.status}"], [row], [])
    figures = result["figures"]
    rows, names = [], list(figures)
    head = (
        f"  {'batch':>6} "
        + " ".join(f"{n + ' us':>26}" for n in names)
        + f" {'records/s best':>15} {'lanes pay':>10}"
    )
    lines = [
        f"== {title} ==",
        "  us: microseconds per batch (median of rounds);"
        " lanes pay: threads=1 time / all-lane time",
        head,
        "  " + "-" * (len(head) - 2),
    ]
    for size in BATCH_SIZES:
        us = [_median(figures[n][str(size)]) * 1e6 for n in names]
        pay = us[1] / us[2]
        lines.append(
            f"  {size:>6} "
            + " ".join(f"{u:>26.2f}" for u in us)
            + f" {size / min(us) * 1e6:>15.3g} {pay:>9.2f}x"
        )
    for name in names:
        row = Row(name, "loaderx", "raw")
        row.extra = {"us_per_batch": {b: [s * 1e6 for s in v] for b, v in figures[name].items()}}
        row.records_s = [BATCH_SIZES[-1] / _median(figures[name][str(BATCH_SIZES[-1])])]
        row.gather_mibs = [row.records_s[0] * 1024 / MIB]
        rows.append(row)
    return Section("scale-batch", title, lines, rows, [])


def _threads_section(ctx, path: Path, count: int) -> Section:
    threads = list(range(1, ctx.threads + 1))
    budget = min(0.3, max(0.02, ctx.size.budget_s))
    result = _run(
        {
            "mode": "threads",
            "path": str(path),
            "count": count,
            "seed": ctx.seed,
            "rounds": ctx.repeat,
            "budget_s": budget,
            "threads": threads,
        }
    )
    title = (
        f"scale: threads 1 .. {ctx.threads}, gather(out=) of {THREAD_BATCH} x 1 KiB"
        f" and DataLoader batch {BATCH}"
    )
    if result["status"] != "ok":
        row = Row(
            "thread sweep", "loaderx", "raw", status=f"{result['status']}: {result['reason']}"
        )
        return Section("scale-threads", title, [f"== {title} ==", f"  {row.status}"], [row], [])
    gather = {int(n): _median(v) for n, v in result["gather_records_s"].items()}
    loader = {int(n): _median(v) for n, v in result["loader_batches_s"].items()}
    head = table_line(
        [("threads", ">7"), ("gather MiB/s", ">12"), ("efficiency", ">10")]
        + [("loader batches/s", ">16"), ("efficiency", ">10")]
    )
    lines = [
        f"== {title} ==",
        "  efficiency: rate(n) / (n x rate(1))",
        head,
        "  " + "-" * (len(head) - 2),
    ]
    for n in threads:
        lines.append(
            f"  {n:>7} {gather[n] * 1024 / MIB:>12.1f} {gather[n] / (n * gather[1]):>10.2f}"
            f" {loader[n]:>16.1f} {loader[n] / (n * loader[1]):>10.2f}"
        )
    rows = []
    for name, rates in (
        ("gather(out=) threads=n", result["gather_records_s"]),
        ("DataLoader workers=n", result["loader_batches_s"]),
    ):
        row = Row(name, "loaderx", "raw")
        row.extra = {"per_threads": rates}
        row.records_s = [
            _median(rates[str(threads[-1])]) * (1 if name.startswith("gather") else BATCH)
        ]
        row.gather_mibs = [row.records_s[0] * 1024 / MIB]
        rows.append(row)
    return Section("scale-threads", title, lines, rows, [])


def run_scale(ctx) -> list[Section]:
    stores, skipped = prepare_stores(ctx)
    rows = _size_rows(ctx, stores) if stores else {}
    lines = [
        "  1st MiB/s: the first random batches after open (fresh page mappings; faults/b and"
        " ctxsw/b are of this pass); steady MiB/s: new random batches after the RSS reading"
        " (the row's figure, and the one the throughput target uses)"
    ]
    targets = []
    for kind in KINDS:
        if any(k == kind for k, _c in rows):
            lines.extend(_size_table(kind, rows, stores))
            targets.extend(_size_targets(kind, rows))
    lines.extend(f"  {line}" for line in skipped)
    lines.append("  targets (issue 16; a figure over its limit reads as limit / figure):")
    lines.extend(t.line() for t in targets)
    title = (
        f"scale: store size, open / first batch / random gather of {BATCH} / RSS,"
        f" each run a fresh process, {ctx.repeat} rounds"
    )
    sections = [
        Section("scale-size", title, [f"== {title} =="] + lines, list(rows.values()), targets)
    ]
    dense1k = sorted(c for k, c in stores if k == "dense1k")
    if dense1k:
        count = max([c for c in dense1k if c <= 10**6] or dense1k[:1])
        sections.append(_batch_section(ctx, stores[("dense1k", count)], count))
        sections.append(_threads_section(ctx, stores[("dense1k", count)], count))
    return sections


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        sys.exit(child_main(sys.argv[2:]))
    sys.exit("usage: bench_scale.py child CONFIG_JSON (started by scripts/bench.py)")
