"""Running a conversion: one task writes one shard store per column; N tasks
run in N fresh worker processes (no fork: no native thread or lock is
inherited half-way, and the caller's main module is never re-imported), and
the parent draws one progress bar from what they report. A worker's stdin
is a pipe from its parent that never carries data: when it ends (the parent
died, even by SIGKILL) the worker stops instead of converting on for nobody.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from .._lib import lib
from .._lib import usable_cores as _cores  # the cores this process may use
from .._store import stored_kind
from ..zrecord import DenseStore, RaggedStore, Zrecord
from ..errors import ZrecordError
from ._columns import ColumnSpec, ConvertError, Nullable, Packed, mask_name, mask_spec

#: Lanes (native threads) of a convert worker process, set by its parent.
_LANES_ENV = "LOADERX_CONVERT_LANES"
#: Set for a worker whose stdin is the pipe from its parent.
_PIPE_ENV = "LOADERX_CONVERT_PARENT_PIPE"

__all__ = [
    "StoreOptions",
    "TaskResult",
    "write_task",
    "run_tasks",
    "open_writer",
    "settle_columns",
    "complete_masks",
]

_POLL_S = 0.2


@dataclass
class StoreOptions:
    codecs: dict
    level: int | None
    dicts: dict
    batch_bytes: int


def open_writer(path: str, spec: ColumnSpec, opts: StoreOptions):
    codec = opts.codecs.get(spec.name, "raw")  # validity masks are raw
    kw = {
        "codec": codec,
        "level": opts.level if codec != "raw" else None,
        "dict_bytes": opts.dicts.get(spec.name),
    }
    if spec.kind == "dense":
        return DenseStore(path, spec.dtype, spec.item_shape, **kw)
    if spec.kind == "ragged":
        return RaggedStore(path, spec.dtype, **kw)
    return Zrecord(path, create=True, **kw)


@dataclass
class TaskResult:
    """What one task wrote: `rows`, and `files`, ``[file position, rows]``
    for each source file it read, in order (see `Batch.file`)."""

    rows: int
    files: list


def dense_to_ragged(path: str, spec: ColumnSpec, opts: StoreOptions):
    """Rewrites the DenseStore at `path` as the RaggedStore `spec` (the same
    records, each of the dense shape) and returns it open for appending: the
    fallback of a provisional dense column (see `ColumnSpec.provisional`).
    It costs one pass over what was written, never a second read of the source."""
    staging = path + ".ragged"
    with DenseStore(path) as dense:
        shape = tuple(dense.item_shape)
        step = max(1, opts.batch_bytes // max(dense.record_bytes, 1))
        with open_writer(staging, spec, opts) as out:
            for a in range(0, len(dense), step):
                block = dense[a : a + step]
                # Record i is rows shape[0]*i .. shape[0]*(i+1) of the flattened block.
                splits = np.arange(len(block) + 1, dtype=np.int64) * shape[0]
                out.append_packed(block.reshape((-1,) + shape[1:]), splits)
    shutil.rmtree(path)
    os.rename(staging, path)
    return RaggedStore(path)


def settle_columns(specs: list[ColumnSpec], paths: list[dict], opts: StoreOptions) -> list:
    """The specs the parts were finally written as: a provisional dense
    column that fell back to ragged in any task becomes ragged in all of
    them (the other tasks' dense parts are rewritten)."""
    settled = []
    for spec in specs:
        if spec.kind == "dense" and spec.provisional:
            kinds = [stored_kind(p[spec.name]) for p in paths]
            if "ragged" in kinds:
                ragged = spec.as_ragged()
                for p, kind in zip(paths, kinds):
                    if kind == "dense":
                        dense_to_ragged(p[spec.name], ragged, opts).close()
                spec = ragged
        settled.append(spec)
    return settled


def _append(store, spec: ColumnSpec, values, row0: int) -> None:
    if spec.kind == "dense" and isinstance(values, np.ndarray) and values.dtype != spec.dtype:
        values = values.astype(spec.dtype)
    try:
        if isinstance(values, Packed):
            store.append_packed(values.values, values.splits)
        else:
            store.append(values)
    except (ZrecordError, TypeError, ValueError) as e:
        raise ConvertError(f"column {spec.name!r}, rows from {row0}: {e}") from e


def read_ahead(batches: Iterator) -> Iterator:
    """`batches`, produced one ahead on a thread: the next batch is read and
    decoded while the stores compress this one (their append releases the
    GIL). Errors are re-raised here; closing the generator stops the thread."""
    slot: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                slot.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not put(("batch", batch)):
                    return
            put(("end", None))
        except BaseException as e:  # noqa: B036 - re-raised by the consumer
            put(("error", e))

    thread = threading.Thread(target=produce, name="loaderx-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = slot.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()
        thread.join()


def write_task(
    source,
    task,
    specs: list[ColumnSpec],
    paths: dict,
    opts: StoreOptions,
    report: Callable[[float, int, int], None],
) -> TaskResult:
    """Write `task` of `source` into one new store per column. `report(units,
    rows, bytes)` is called (on the reading thread) as each batch is read, so
    progress moves while the first batch is still being compressed. A
    column's validity mask store (at ``paths[mask_name(column)]``) is made
    when its first null arrives, with every earlier row valid."""
    stores: dict = {}
    masks: dict = {}
    writing = {s.name: s for s in specs}  # a provisional column may turn ragged
    rows = 0
    files: list = []

    def reported(batches: Iterator) -> Iterator:
        for batch in batches:
            report(batch.progress, batch.rows, batch.nbytes)
            yield batch

    try:
        for spec in specs:
            stores[spec.name] = _create(paths[spec.name], spec, opts)
        for batch in read_ahead(reported(source.read(task, specs, opts.batch_bytes))):
            for spec in specs:
                values = batch.columns[spec.name]
                valid = None
                if isinstance(values, Nullable):
                    values, valid = values.values, values.valid
                if len(values) != batch.rows:
                    raise ConvertError(
                        f"column {spec.name!r}: {len(values)} values for {batch.rows} rows"
                    )
                column = writing[spec.name]
                if column.kind == "dense" and not isinstance(values, np.ndarray):
                    # Ragged records for a provisional dense column: a row of
                    # another shape. What was written moves into a RaggedStore.
                    assert column.provisional, spec.name
                    stores[spec.name].close()
                    writing[spec.name] = column = column.as_ragged()
                    stores[spec.name] = dense_to_ragged(paths[spec.name], column, opts)
                _append(stores[spec.name], column, values, rows)
                if valid is not None or spec.name in masks:
                    _append_valid(masks, spec, paths, valid, rows, batch.rows, opts)
            rows += batch.rows
            if batch.file is not None:
                if files and files[-1][0] == batch.file:
                    files[-1][1] += batch.rows
                else:
                    files.append([batch.file, batch.rows])
    finally:
        for store in list(stores.values()) + list(masks.values()):
            store.close()
    return TaskResult(rows, files)


def _append_valid(masks: dict, spec: ColumnSpec, paths: dict, valid, row0: int, count: int,
                  opts: StoreOptions) -> None:
    """Appends a batch's validity (None: every row valid) to `spec`'s mask,
    making the mask (every row before `row0` valid) on its first null."""
    mask = masks.get(spec.name)
    if mask is None:
        path = paths.get(mask_name(spec.name))
        if path is None:  # a caller that reserved no mask path: a bug, not bad data
            raise ConvertError(f"column {spec.name!r} has nulls but no place for its mask")
        mask = masks[spec.name] = _create(path, mask_spec(spec), opts)
        if row0:
            mask.append(np.ones(row0, dtype=np.bool_))
    mask.append(np.ones(count, np.bool_) if valid is None else np.ascontiguousarray(valid, bool))


def complete_masks(specs: list[ColumnSpec], paths: list[dict], rows: list[int],
                   required=()) -> list[ColumnSpec]:
    """The mask columns of a finished conversion: a column whose nulls made
    a mask in any part (or named in `required`) gets an all-valid mask in
    every part that has none. Returns the mask specs, in column order."""
    used = []
    for spec in specs:
        name = mask_name(spec.name)
        have = [name in p and os.path.isdir(p[name]) for p in paths]
        if not any(have) and spec.name not in required:
            continue
        for p, made, n in zip(paths, have, rows):
            if not made:
                write_all_valid(p[name], n)
        used.append(mask_spec(spec))
    return used


def write_all_valid(path: str, rows: int) -> None:
    """A validity mask store at `path` of `rows` valid rows."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    spec = ColumnSpec(os.path.basename(path), "dense", np.dtype(np.bool_), ())
    with open_writer(path, spec, StoreOptions({}, None, {}, 0)) as mask:
        if rows:
            mask.append(np.ones(rows, dtype=np.bool_))


def _create(path: str, spec: ColumnSpec, opts: StoreOptions):
    """The new store of one column's shard; an error names the column, not
    the staging path the user never chose."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        return open_writer(path, spec, opts)
    except ZrecordError as e:
        text = str(e)
        text = text[len(path) + 2 :] if text.startswith(f"{path}: ") else text
        raise ConvertError(f"column {spec.name!r}: {text}") from None


def _child_env(workers: int) -> dict:
    """The environment of a worker: this one, with this loaderx importable and
    its share of the cores for the native compression lanes (N workers with a
    lane per core each would oversubscribe the cores N times)."""
    env = dict(os.environ)
    env[_LANES_ENV] = str(max(1, _cores() // workers))
    env[_PIPE_ENV] = "1"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _read_reports(k: int, stream, counters: list, results: dict) -> None:
    """Reader thread: a worker's stdout lines ``P <units> <rows> <bytes>``,
    ``F <file> <rows>`` and, last, ``R <rows>``."""
    files: list = []
    for line in stream:
        tag, *values = line.split()
        if tag == "P":
            for i, v in enumerate(values):
                counters[k][i] += float(v)
        elif tag == "F":
            files.append([int(values[0]), int(values[1])])
        elif tag == "R":
            results[k] = TaskResult(int(values[0]), files)


def run_tasks(
    source, tasks: list, specs: list[ColumnSpec], paths: list[dict], opts: StoreOptions, progress
) -> list[TaskResult]:
    """What each task wrote; in this process for one task, else one
    worker process per task (``python -m loaderx.converters._worker``: a
    fresh interpreter that never imports the caller's main module), at most
    one per usable core at a time (more would only share the cores, at one
    interpreter's memory each)."""
    if len(tasks) == 1:
        return [write_task(source, tasks[0], specs, paths[0], opts, progress.update)]
    work = tempfile.mkdtemp(prefix="loaderx-convert-")
    at_once = min(len(tasks), _cores())
    env = _child_env(at_once)
    procs: dict = {}
    readers: list = []
    counters = [[0.0, 0.0, 0.0] for _ in tasks]  # units, rows, bytes per task
    results: dict[int, TaskResult] = {}

    def start(k: int) -> None:
        job = os.path.join(work, f"task-{k}.pickle")
        with open(job, "wb") as f:
            pickle.dump((source, tasks[k], specs, paths[k], opts), f, pickle.HIGHEST_PROTOCOL)
        procs[k] = proc = subprocess.Popen(
            [sys.executable, "-m", "loaderx.converters._worker", job],
            stdin=subprocess.PIPE,  # its end tells the worker that this process is gone
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        reader = threading.Thread(
            target=_read_reports, args=(k, proc.stdout, counters, results), daemon=True
        )
        reader.start()
        readers.append(reader)

    try:
        _wait(len(tasks), at_once, start, procs, counters, progress, work)
        for reader in readers:
            reader.join()
        missing = [k for k in range(len(tasks)) if k not in results]
        if missing:
            raise ConvertError(f"convert worker {missing[0]} ended without reporting its rows")
        return [results[k] for k in range(len(tasks))]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
        shutil.rmtree(work, ignore_errors=True)


def _wait(
    count: int, at_once: int, start, procs: dict, counters: list, progress, work: str
) -> None:
    """Starts tasks 0..count-1, `at_once` running at a time, until every
    worker exits; re-raises the first worker error."""
    shown = [0.0, 0.0, 0.0]

    def show() -> None:
        done = [sum(c[i] for c in counters) for i in range(3)]
        progress.update(done[0] - shown[0], int(done[1] - shown[1]), int(done[2] - shown[2]))
        shown[:] = done

    pending = list(range(count))
    while True:
        codes = {k: p.poll() for k, p in procs.items()}
        failed = [k for k, c in codes.items() if c not in (None, 0)]
        if failed:
            _raise_worker_error(failed[0], codes[failed[0]], work)
        running = sum(c is None for c in codes.values())
        while pending and running < at_once:
            start(pending.pop(0))
            running += 1
        show()
        if not pending and running == 0:
            show()
            return
        time.sleep(_POLL_S)


def _raise_worker_error(k: int, code: int, work: str) -> None:
    path = os.path.join(work, f"task-{k}.error")
    if not os.path.exists(path):
        raise ConvertError(f"convert worker {k} died (exit code {code})")
    with open(path, "rb") as f:
        error, text = pickle.load(f)
    if isinstance(error, BaseException):
        raise error
    raise ConvertError(f"convert worker {k} failed: {text}")


class _ParentWatch:
    """Ends this worker when its stdin (a pipe from the parent that never
    carries data) ends. A parent that was killed cleans up nothing: the
    worker removes its job file, and the last worker out the parent's work
    directory. The parent's death also breaks the worker's stdout, so the
    task may fail on its own at the same moment: its error path waits for
    this thread (`wait_if_orphaned`) and writes its error file under the
    thread's lock (`write_error`), never into the directory being removed."""

    _WAIT_S = 10.0  # for the watch to see the end of stdin after a broken stdout

    def __init__(self, job: str) -> None:
        self.job = job
        self.lock = threading.Lock()  # the cleanup against an error file being written
        self.gone = False
        self.thread = threading.Thread(target=self._watch, name="loaderx-parent-watch", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        # The descriptor, not sys.stdin: a daemon thread blocked in a buffered
        # read would hold its lock through interpreter shutdown (a fatal error).
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        with self.lock:
            self.gone = True
            for path in (self.job, self.job[: -len(".pickle")] + ".error"):
                with contextlib.suppress(OSError):
                    os.unlink(path)
            with contextlib.suppress(OSError):  # not empty: another worker's job is left
                os.rmdir(os.path.dirname(self.job))
        os._exit(3)  # nobody will commit what this worker writes

    def wait_if_orphaned(self, error: BaseException) -> None:
        """When the parent looks gone (stdin at its end, or `error` is this
        worker's stdout broken by its death), gives the watch up to _WAIT_S
        to end the process; returns otherwise, and after that wait (a stdout
        broken with the parent alive): the task then reports its error."""
        if not isinstance(error, BrokenPipeError):
            try:  # stdin is readable only at its end
                if not select.select([0], [], [], 0)[0]:
                    return
            except (OSError, ValueError):  # no select on a pipe (Windows)
                return
        self.thread.join(self._WAIT_S)

    def write_error(self, path: str, payload: bytes) -> bool:
        """Writes the task's error file unless the watch is ending this
        worker (False): never into the directory it removes."""
        with self.lock:
            if self.gone:
                return False
            _write_error(path, payload)
        return True


def _write_error(path: str, payload: bytes) -> None:
    with open(path, "wb") as out:
        out.write(payload)


def worker_main(job: str) -> int:
    """Entry of a worker process: run one task, report on stdout."""
    watch = _ParentWatch(job) if os.environ.get(_PIPE_ENV) == "1" else None
    lanes = os.environ.get(_LANES_ENV)
    if lanes:
        lib.lx_set_lanes(int(lanes))
    with open(job, "rb") as f:
        source, task, specs, paths, opts = pickle.load(f)

    def report(units: float, rows: int, nbytes: int) -> None:
        print(f"P {units} {rows} {nbytes}", flush=True)

    try:
        result = write_task(source, task, specs, paths, opts, report)
        for file, rows in result.files:
            print(f"F {file} {rows}", flush=True)
        print(f"R {result.rows}", flush=True)
    except BaseException as e:  # noqa: B036 - handed to the parent, which re-raises it
        if watch is not None:
            watch.wait_if_orphaned(e)
        try:
            payload = pickle.dumps((e, f"{type(e).__name__}: {e}"))
        except Exception:  # an exception that does not pickle: send its text
            payload = pickle.dumps((None, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        path = job[: -len(".pickle")] + ".error"
        if watch is None:
            _write_error(path, payload)
        elif not watch.write_error(path, payload):
            return 3
        return 1
    return 0


def sample_records(source, task: Any, specs: list[ColumnSpec], budget: int) -> dict:
    """Up to `budget` bytes of records per column from the start of `task`
    (for dictionary training)."""
    samples: dict = {s.name: [] for s in specs}
    used: dict = {s.name: 0 for s in specs}
    for batch in source.read(task, specs, min(budget, 16 << 20)):
        for s in specs:
            for record in _records_of(batch.columns[s.name]):
                if used[s.name] < budget:
                    b = record.tobytes() if isinstance(record, np.ndarray) else bytes(record)
                    samples[s.name].append(b)
                    used[s.name] += len(b)
        if all(v >= budget for v in used.values()):
            break
    return samples


def _records_of(values) -> Iterator:
    """The records of a batch of one column, whatever its form."""
    if isinstance(values, Nullable):
        values = values.values
    if isinstance(values, Packed):
        for a, b in zip(values.splits[:-1], values.splits[1:]):
            yield values.values[a:b]
    else:
        yield from values
