"""Timing, validation and reporting machinery shared by every bench layer.

The protocol (SPEC §9) lives here, in one place:

1. Every backend writes its store from the same in-memory source data; write
   rounds are interleaved across backends and each write ends with an fsync of
   every file it made, so "write MiB/s" always means "durable".
2. Before any timing, every backend is validated on exactly the planned batches
   it will be timed on: exact dtype, shape, order and values against the numpy
   source. A mismatch marks the row INVALID and makes the whole run fail.
3. Timing runs `repeat` rounds; each round runs every backend once, round-robin
   with a start that rotates per round, so no backend always runs first.
   Figures are medians over rounds; ratios are medians of per-round ratios,
   so a noisy neighbour on a shared machine hits both sides of a ratio alike.

A backend that cannot run here is a row that says "missing: <reason>" (import
or install) or "failed: <error>" (it raised), never a silently dropped row.
"""
from __future__ import annotations

import dataclasses
import gc
import json
import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

MIB = float(1 << 20)


class Unavailable(Exception):
    """Raised by a backend that cannot run here; `status` is "missing" or "failed"."""

    def __init__(self, status: str, reason: str):
        assert status in ("missing", "failed")
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


class ValidationError(AssertionError):
    """A backend returned something other than the source data."""


def short_error(exc: BaseException, limit: int = 110) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def child_reason(exc: BaseException, prefix: str = "") -> str:
    """A child's one-line reason: the last lines of the error (a wrapped traceback ends there)."""
    parts = [part.strip() for part in f"{prefix}{type(exc).__name__}: {exc}".splitlines() if part.strip()]
    text = " | ".join(parts[-2:]) if len(parts) > 1 else (parts[0] if parts else type(exc).__name__)
    return text if len(text) <= 200 else "..." + text[-197:]


def import_or_missing(module: str):
    """Imports `module` or raises Unavailable("missing", ...)."""
    import importlib

    try:
        return importlib.import_module(module)
    except Exception as exc:  # an optional contender: any import failure means "missing"
        raise Unavailable("missing", short_error(exc)) from exc


# ----------------------------------------------------------------------------- child processes

SCRIPTS = Path(__file__).resolve().parent
# Children never reach a hub: Hugging Face and torch hub lookups are switched off.
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run_child_json(argv: list[str], timeout_s: float, env: dict | None = None) -> dict:
    """Runs a bench child (any interpreter) and returns the last JSON line it printed.

    The child sees the checkout root and scripts/ on PYTHONPATH. A child that
    prints no JSON line is a "failed" result carrying the tail of its stderr.
    """
    environment = dict(os.environ)
    environment.update(env or {})
    extra = [str(SCRIPTS.parent), str(SCRIPTS)] + ([environment["PYTHONPATH"]] if environment.get("PYTHONPATH") else [])
    environment["PYTHONPATH"] = os.pathsep.join(extra)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=environment, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {timeout_s:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": "failed", "reason": f"exit {done.returncode}: {tail[:160]}"}
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------- validation


def check_array(got: Any, want: np.ndarray, what: str) -> None:
    if not isinstance(got, np.ndarray):
        raise ValidationError(f"{what}: got {type(got).__name__}, want numpy.ndarray")
    if got.dtype != want.dtype:
        raise ValidationError(f"{what}: dtype {got.dtype}, want {want.dtype}")
    if got.shape != want.shape:
        raise ValidationError(f"{what}: shape {got.shape}, want {want.shape}")
    if not np.array_equal(got, want):
        bad = np.flatnonzero((np.asarray(got) != want).reshape(len(want), -1).any(axis=1)) if want.ndim else []
        raise ValidationError(f"{what}: values differ (first bad rows {list(bad[:5])})")


def check_list(got: Any, want: Sequence[np.ndarray], what: str) -> None:
    if not isinstance(got, list):
        raise ValidationError(f"{what}: got {type(got).__name__}, want list")
    if len(got) != len(want):
        raise ValidationError(f"{what}: {len(got)} records, want {len(want)}")
    for position, (g, w) in enumerate(zip(got, want)):
        check_array(g, w, f"{what}[{position}]")


def check_packed(got: Any, want_records: Sequence[np.ndarray], what: str) -> None:
    if not (isinstance(got, tuple) and len(got) == 2):
        raise ValidationError(f"{what}: want a (values, row_splits) tuple, got {type(got).__name__}")
    values, splits = got
    lengths = np.array([len(r) for r in want_records], dtype=np.int64)
    want_splits = np.zeros(len(want_records) + 1, dtype=np.int64)
    np.cumsum(lengths, out=want_splits[1:])
    check_array(splits, want_splits, f"{what} row_splits")
    check_array(values, np.concatenate(want_records), f"{what} values")


# ----------------------------------------------------------------------------- backends


class Backend:
    """One row of a table: a store (or a physical limit) measured the same way as every other.

    Subclasses override `write` (build the store under a fresh directory),
    `open` (open it for reading), `fetch` (one planned batch, timed) and
    `close`. A backend with `store_owner` set reads the store another backend
    wrote (list and packed reads of one RaggedStore), so it writes nothing.
    """

    name = "?"
    group = "contender"  # "baseline" | "loaderx" | "contender" | "limit"
    codec = "raw"
    note = ""
    store_owner: "Backend | None" = None
    writes = True

    def prepare(self) -> None:
        """Import what the backend needs; raise Unavailable("missing", ...) if absent."""

    def write(self, directory: Path) -> None:
        raise NotImplementedError

    def open(self, directory: Path) -> None:
        raise NotImplementedError

    def fetch(self, indices: np.ndarray) -> Any:
        raise NotImplementedError

    def validate(self, output: Any, indices: np.ndarray) -> None:
        """Raise ValidationError unless `output` is exactly what `indices` select."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def timed_pass(self, plan: Sequence[np.ndarray], plan_bytes: Sequence[int], chunk: int) -> tuple[float, int, int, list[float]]:
        """Runs the plan once: (seconds, logical bytes, records, per-batch latencies)."""
        latencies: list[float] = []
        clock = time.perf_counter
        start = clock()
        for first in range(0, len(plan), chunk):
            t0 = clock()
            for indices in plan[first : first + chunk]:
                output = self.fetch(indices)
                del output
            latencies.append((clock() - t0) / len(plan[first : first + chunk]))
        seconds = clock() - start
        records = sum(len(indices) for indices in plan)
        return seconds, sum(plan_bytes), records, latencies


@dataclasses.dataclass
class Row:
    name: str
    group: str
    codec: str
    note: str = ""
    status: str = "ok"
    write_mibs: list = dataclasses.field(default_factory=list)
    gather_mibs: list = dataclasses.field(default_factory=list)
    records_s: list = dataclasses.field(default_factory=list)
    latencies_s: list = dataclasses.field(default_factory=list)
    disk_bytes: int | None = None
    logical_bytes: int | None = None
    batches_timed: int = 0
    extra: dict = dataclasses.field(default_factory=dict)  # per-layer figures (faults, RSS, open ms, ...)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def median(self, metric: str) -> float | None:
        values = getattr(self, metric)
        return statistics.median(values) if values else None

    def p95_ms(self) -> float | None:
        if not self.latencies_s:
            return None
        return float(np.percentile(np.asarray(self.latencies_s), 95)) * 1e3

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "group": self.group,
            "codec": self.codec,
            "note": self.note,
            "status": self.status,
            "write_mib_s": self.median("write_mibs"),
            "gather_mib_s": self.median("gather_mibs"),
            "records_s": self.median("records_s"),
            "p95_batch_ms": self.p95_ms(),
            "disk_bytes": self.disk_bytes,
            "logical_bytes": self.logical_bytes,
            "batches_timed": self.batches_timed,
            "write_runs_mib_s": self.write_mibs,
            "gather_runs_mib_s": self.gather_mibs,
            "extra": self.extra,
        }


@dataclasses.dataclass
class Plan:
    """The planned batches of one workload and their logical payload sizes."""

    batches: list
    batch_bytes: list
    logical_bytes: int  # of the whole source data set (what write MiB/s divides)


@dataclasses.dataclass
class Options:
    workdir: Path
    repeat: int
    write_repeat: int
    budget_s: float  # per backend per round; slow backends run fewer planned batches
    min_batches: int = 1
    chunk: int = 1  # batches per latency sample (sampler calls are too short to time one by one)
    # A full garbage collection before every write and timed pass, so no row pays
    # for another's garbage (off at --size tiny: in the smoke test's process, which
    # has torch and jax imported, each took 0.1 s, and tiny timings prove nothing).
    collect: bool = True


def rotated(items: list, shift: int) -> list:
    if not items:
        return items
    shift %= len(items)
    return items[shift:] + items[:shift]


def disk_usage_bytes(path: Path) -> int:
    """Bytes allocated on disk (st_blocks), so sparse files count what they really hold."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def fsync_tree(path: Path) -> None:
    """Makes every file under `path` durable, so every write figure includes durability."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _mark(row: Row, backend: Backend, exc: BaseException) -> None:
    if isinstance(exc, Unavailable):
        row.status = f"{exc.status}: {exc.reason}"
    elif isinstance(exc, ValidationError):
        row.status = f"INVALID: {exc}"
    else:
        row.status = f"failed: {short_error(exc)}"
    try:
        backend.close()
    except Exception:  # the row already says why it failed; a second error adds nothing
        pass


class Measurement:
    """Runs the whole protocol for one workload and returns its rows in backend order."""

    def __init__(self, key: str, backends: list[Backend], plan: Plan, options: Options, log: Callable[[str], None]):
        self.key = key
        self.backends = backends
        self.plan = plan
        self.options = options
        self.log = log
        self.rows = {id(b): Row(b.name, b.group, b.codec, b.note, logical_bytes=plan.logical_bytes) for b in backends}
        self.dirs: dict[int, Path] = {}
        self.batch_counts: dict[int, int] = {}

    def row(self, backend: Backend) -> Row:
        return self.rows[id(backend)]

    def live(self) -> list[Backend]:
        return [b for b in self.backends if self.row(b).ok]

    def run(self) -> list[Row]:
        for backend in self.backends:
            try:
                backend.prepare()
            except Exception as exc:  # reported as a row, never dropped
                _mark(self.row(backend), backend, exc)
        self._write_rounds()
        self._open_and_validate()
        start = time.perf_counter()
        self._timing_rounds()
        self.log(f"{self.key}: {self.options.repeat} timing rounds {time.perf_counter() - start:.2f} s")
        for backend in self.live():
            backend.close()
        # Stores are not needed once measured; dropping them keeps a full run's disk use to one workload.
        shutil.rmtree(self.options.workdir / self.key, ignore_errors=True)
        for backend in self.backends:
            row = self.row(backend)
            # The row text keeps notes a backend learned while writing (dictionary training time).
            row.note = backend.note
        return [self.row(b) for b in self.backends]

    def _store_dir(self, backend: Backend, round_index: int) -> Path:
        slug = "".join(ch if ch.isalnum() else "_" for ch in backend.name).strip("_")
        return self.options.workdir / self.key / f"{slug}.{round_index}"

    def _write_rounds(self) -> None:
        writers = [b for b in self.live() if b.writes and b.store_owner is None]
        for round_index in range(self.options.write_repeat):
            for backend in rotated(writers, round_index):
                if self.row(backend).ok:
                    self._write_once(backend, round_index)
        for backend in writers:
            if self.row(backend).ok:
                self.row(backend).disk_bytes = disk_usage_bytes(self.dirs[id(backend)])

    def _write_once(self, backend: Backend, round_index: int) -> None:
        row = self.row(backend)
        directory = self._store_dir(backend, round_index)
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        if self.options.collect:
            gc.collect()
        # Start every writer from a quiet file system: the previous writer's deleted
        # store (freed blocks, discards) is otherwise paid by whoever syncs next.
        if hasattr(os, "sync"):
            os.sync()
        try:
            start = time.perf_counter()
            backend.write(directory)
            fsync_tree(directory)
            seconds = time.perf_counter() - start
        except Exception as exc:  # reported as a row
            _mark(row, backend, exc)
            return
        row.write_mibs.append(self.plan.logical_bytes / MIB / seconds)
        self.log(f"{self.key}: {backend.name}: write {seconds:.2f} s")
        previous = self.dirs.get(id(backend))
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        self.dirs[id(backend)] = directory

    def _open_and_validate(self) -> None:
        for backend in self.live():
            owner = backend.store_owner
            if owner is not None and not self.row(owner).ok:
                self.row(backend).status = f"failed: its store ({owner.name}) failed"
                continue
            directory = self.dirs.get(id(owner if owner is not None else backend))
            try:
                start = time.perf_counter()
                backend.open(directory)
                self.batch_counts[id(backend)] = self._validate(backend)
                self.log(
                    f"{self.key}: {backend.name}: open + validate {self.batch_counts[id(backend)]} batches"
                    f" {time.perf_counter() - start:.2f} s"
                )
            except Exception as exc:  # reported as a row
                _mark(self.row(backend), backend, exc)

    def _validate(self, backend: Backend) -> int:
        """Validates the batches the backend will be timed on; returns how many that is.

        The second batch's time sets how many planned batches fit the per-round
        budget (the first pays for cold page faults), so slow contenders still
        finish while fast ones run long enough to time well.
        """
        batches = self.plan.batches
        seconds = []
        for position in range(min(2, len(batches))):
            start = time.perf_counter()
            output = backend.fetch(batches[position])
            seconds.append(time.perf_counter() - start)
            backend.validate(output, batches[position])
            del output
        estimate = max(seconds[-1], 1e-7)
        count = int(self.options.budget_s / estimate)
        count = max(self.options.min_batches, min(len(batches), count))
        count = min(count, len(batches))
        for position in range(len(seconds), count):
            output = backend.fetch(batches[position])
            backend.validate(output, batches[position])
            del output
        return count

    def _timing_rounds(self) -> None:
        for round_index in range(self.options.repeat):
            for backend in rotated(self.live(), round_index):
                row = self.row(backend)
                if not row.ok:
                    continue
                count = self.batch_counts[id(backend)]
                if self.options.collect:
                    gc.collect()
                try:
                    seconds, payload, records, latencies = backend.timed_pass(
                        self.plan.batches[:count], self.plan.batch_bytes[:count], self.options.chunk
                    )
                except Exception as exc:  # reported as a row
                    _mark(row, backend, exc)
                    continue
                row.gather_mibs.append(payload / MIB / seconds)
                row.records_s.append(records / seconds)
                row.latencies_s.extend(latencies)
                row.batches_timed = count


# ----------------------------------------------------------------------------- ratios and targets


def paired_ratio(row: Row | None, baselines: Sequence[Row | None], metric: str = "gather_mibs", scale: float = 1.0) -> float | None:
    """Median over rounds of row / (scale x best baseline in the same round)."""
    candidates = [b for b in baselines if b is not None and b.ok and getattr(b, metric)]
    if row is None or not row.ok or not getattr(row, metric) or not candidates:
        return None
    mine = getattr(row, metric)
    rounds = min([len(mine)] + [len(getattr(b, metric)) for b in candidates])
    ratios = []
    for r in range(rounds):
        best = max(getattr(b, metric)[r] for b in candidates)
        ratios.append(mine[r] / (scale * best))
    return statistics.median(ratios)


@dataclasses.dataclass
class Target:
    """One SPEC §9 line: `row` must reach `threshold` x the best of `baselines`."""

    label: str
    row: str
    baselines: list
    threshold: float
    metric: str = "gather_mibs"
    scale: float = 1.0
    ratio: float | None = None
    status: str = "n/a"
    # False for a line printed for context (against a measured limit): not a SPEC §9 target.
    spec: bool = True

    def evaluate(self, rows: dict[str, Row]) -> "Target":
        mine = rows.get(self.row)
        bases = [rows.get(name) for name in self.baselines]
        self.ratio = paired_ratio(mine, bases, self.metric, self.scale)
        if self.ratio is None:
            missing = [n for n, r in zip([self.row] + self.baselines, [mine] + bases) if r is None or not r.ok]
            self.status = "n/a (" + ", ".join(missing) + " unavailable)"
        else:
            self.status = "met" if self.ratio >= self.threshold else "NOT MET"
            if not self.spec:
                self.status = "context: " + ("reached" if self.ratio >= self.threshold else "below")
        return self

    def settle(self, ratio: float | None, why_missing: str = "") -> "Target":
        """For targets that are not a paired ratio of two rows (the memory bound)."""
        self.ratio = ratio
        if ratio is None:
            self.status = f"n/a ({why_missing})"
        elif self.spec:
            self.status = "met" if ratio >= self.threshold else "NOT MET"
        else:
            self.status = "context: " + ("reached" if ratio >= self.threshold else "below")
        return self

    def line(self) -> str:
        ratio = "   -  " if self.ratio is None else f"{self.ratio:6.2f}x"
        bar = "target" if self.spec else "compare"
        return f"  {self.label:<76} {ratio}  ({bar} >= {self.threshold:g}x)  {self.status}"

    def to_json(self) -> dict:
        return {"label": self.label, "ratio": self.ratio, "threshold": self.threshold, "status": self.status, "spec": self.spec}


# ----------------------------------------------------------------------------- tables


@dataclasses.dataclass
class Section:
    """One printed table: a workload's rows and its target lines."""

    key: str
    title: str
    lines: list
    rows: list
    targets: list

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "title": self.title,
            "rows": [r.to_json() for r in self.rows],
            "targets": [t.to_json() for t in self.targets],
        }


def table_line(cells: list) -> str:
    """One indented table line: cells are (value, format spec) pairs joined by spaces."""
    return "  " + " ".join(format(value, spec) for value, spec in cells)


def fmt(value: float | None, spec: str = ".1f", empty: str = "-") -> str:
    return empty if value is None else format(value, spec)


def fmt_count(value: float | None) -> str:
    if value is None:
        return "-"
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            return f"{value / limit:.2f}{suffix}"
    return f"{value:.0f}"


def store_table(rows: list[Row], reference: Row | None) -> list[str]:
    """The fixed-width table of one store workload; `reference` is the "vs" column's base."""
    name_width = max([len(r.name) for r in rows] + [24])
    head = (
        f"  {'backend':<{name_width}} {'write MiB/s':>11} {'gather MiB/s':>12} {'records/s':>10}"
        f" {'p95 ms':>8} {'disk MiB':>9} {'ratio':>6} {'vs base':>8}"
    )
    legend = (
        "  gather MiB/s: logical payload; p95 ms: per batch; ratio: logical / on-disk bytes;"
        f" vs base: gather MiB/s relative to '{reference.name if reference else '-'}' (median of per-round ratios)"
    )
    lines = [legend, head, "  " + "-" * (len(head) - 2)]
    for row in rows:
        if not row.ok:
            lines.append(f"  {row.name:<{name_width}} {row.status}")
            continue
        ratio = None
        if row.disk_bytes and row.logical_bytes:
            ratio = row.logical_bytes / row.disk_bytes
        versus = paired_ratio(row, [reference]) if reference is not None else None
        disk = None if row.disk_bytes is None else row.disk_bytes / MIB
        lines.append(
            f"  {row.name:<{name_width}} {fmt(row.median('write_mibs')):>11} {fmt(row.median('gather_mibs')):>12}"
            f" {fmt_count(row.median('records_s')):>10} {fmt(row.p95_ms(), '.3f'):>8} {fmt(disk):>9}"
            f" {fmt(ratio, '.2f'):>6} {fmt(versus, '.2f') + 'x' if versus is not None else '-':>8}"
        )
        if row.note:
            lines.append(f"  {'':<{name_width}}   ({row.note})")
    return lines
