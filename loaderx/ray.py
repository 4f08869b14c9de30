"""Ray Data integration, for ingestion past one machine: ``pip install 'loaderx[ray]'``.

``write_dataset(ray_dataset, dest, ...)`` writes a loaderx dataset directory
from a ``ray.data.Dataset``: every Ray write task writes one shard store per
column, in parallel across the cluster, and the driver commits one manifest
when all of them have finished. `dest` must be a path every node sees (the
local disk of a one-machine cluster, or a shared file system), or a URL
(``s3://``, ``gs://``, ``az://``): then the dataset is written under the
driver's remote cache directory (which the tasks must see, as above),
uploaded, and published by its manifest (loaderx.remote).

A failed task leaves no half-shard in the manifest: tasks write into a
hidden staging directory, a task that fails removes what it wrote, and the
driver moves only the shards of finished tasks into the dataset before it
writes the manifest (``mode="create"``, ``"append"`` or ``"overwrite"``, as
`loaderx.convert`). Columns map to stores from their Arrow types as in
`loaderx.convert`; the row order is the order of Ray's write tasks (set
``DataContext.execution_options.preserve_order`` for the input order).
Every block must have the same columns of the same types: a block unlike
the others is refused naming the column (cast it in ``map_batches``), never
cast to the first block's type.

``read_dataset(dest)`` gives a ``ray.data.Dataset`` back: dense columns as
tensors, ragged columns as variable-shaped tensors, byte columns as binary.
"""

from __future__ import annotations

import functools
import os
import shutil
import uuid
from typing import Any, Iterable, Iterator

import numpy as np

from . import _locks, _objstore, _openers
from .converters import ConvertError, column_codecs
from .converters import with_masks
from .converters._columns import ColumnSpec, Flags, arrow_spec, arrow_to_batch, mask_name, require
from .converters._dest import Destination
from .converters._run import StoreOptions, complete_masks, write_task
from .converters._source import Batch, Options, Source, select_columns
from .dataset import open_dataset, read_manifest

__all__ = ["write_dataset", "read_dataset"]

_BATCH_ROWS = 1024
_BATCH_BYTES = 16 << 20


def _ray():
    return require("ray", "ray", "loaderx.ray")


class _BlocksSource(Source):
    """The Arrow blocks of one write task as a converter source."""

    kind = "ray"

    def __init__(self, tables: Iterator, options: Options, task: int = 0):
        super().__init__(options)
        self.tables = tables
        self.task = task

    def read(self, task, specs: list[ColumnSpec], batch_bytes: int) -> Iterator[Batch]:
        import pyarrow as pa

        row = 0
        for table in self.tables:
            self._check_block(pa, table, specs)
            fixed = sum(s.record_bytes() for s in specs) or max(
                table.nbytes / max(table.num_rows, 1), 1
            )
            step = int(max(1, min(_BATCH_ROWS * 64, batch_bytes // fixed)))
            for batch in table.to_batches(max_chunksize=step):
                cols = {
                    s.name: arrow_to_batch(pa, batch.column(s.name), s, row, self.options.flags)
                    for s in specs
                }
                row += batch.num_rows
                yield Batch(batch.num_rows, cols, batch.num_rows)


    def _check_block(self, pa, table, specs: list[ColumnSpec]) -> None:
        """Every block of the task must map to the first block's columns:
        a block of another type would be cast to it (2**40 into an int32
        column, 0.5 into an int column) without a word."""
        names = select_columns(table.schema.names, self.options, "the Ray dataset")
        if names != [s.name for s in specs]:
            raise ConvertError(
                f"a block of Ray write task {self.task} has the columns {names}, the "
                f"task's first block {[s.name for s in specs]}: give every block the same "
                "columns"
            )
        for s in specs:
            arrow_type = table.schema.field(s.name).type
            found = arrow_spec(pa, s.name, arrow_type, self.options.flags)
            if found != s:
                raise ConvertError(
                    f"column {s.name!r}: a block of Ray write task {self.task} has Arrow "
                    f"type {arrow_type} ({found.kind} {found.dtype}, item_shape "
                    f"{found.item_shape}), the task's first block {s.kind} {s.dtype}, "
                    f"item_shape {s.item_shape}: give every block the same schema (cast "
                    "the column in map_batches)"
                )


def _peek(blocks: Iterable) -> tuple[Any, Iterator]:
    """(first non-empty Arrow table or None, iterator over all non-empty tables)."""
    from ray.data.block import BlockAccessor

    tables = (BlockAccessor.for_block(b).to_arrow() for b in blocks)
    tables = (t for t in tables if t.num_rows)
    first = next(tables, None)
    if first is None:
        return None, iter(())

    def chain():
        yield first
        yield from tables

    return first, chain()


def _write_blocks(sink, blocks, ctx) -> dict:
    """One write task: its blocks as one shard store per column under the
    sink's task directory (removed again if the task fails)."""
    first, tables = _peek(blocks)
    if first is None:
        return {"task": ctx.task_idx, "rows": 0}
    import pyarrow as pa

    names = select_columns(first.schema.names, sink.options, "the Ray dataset")
    specs = [
        arrow_spec(pa, n, first.schema.field(n).type, sink.options.flags) for n in names
    ]
    out = os.path.join(sink.tasks_dir, f"{ctx.task_idx:06d}-{uuid.uuid4().hex[:8]}")
    paths = {s.name: os.path.join(out, f"c{k}") for k, s in enumerate(specs)}
    # Where a column's validity mask goes if nulls arrive (made on the first one).
    paths.update({mask_name(s.name): os.path.join(out, f"c{k}.valid") for k, s in enumerate(specs)})
    opts = StoreOptions(column_codecs(specs, sink.codec), sink.level, {}, _BATCH_BYTES)
    try:
        rows = write_task(
            _BlocksSource(tables, sink.options, ctx.task_idx), None, specs, paths, opts,
            lambda units, rows, nbytes: None,
        ).rows
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return {"task": ctx.task_idx, "rows": rows, "specs": specs, "paths": paths}


def _commit_tasks(sink, returns: list) -> dict:
    """The driver's commit: every task's shards moved into the destination,
    then one manifest; the destination is aborted on any failure."""
    done = sorted((r for r in returns if r["rows"]), key=lambda r: r["task"])
    if not done:
        raise ConvertError("the Ray dataset has no rows; nothing to write")
    specs = done[0]["specs"]
    for r in done[1:]:
        if r["specs"] != specs:
            raise ConvertError(
                f"Ray write tasks {done[0]['task']} and {r['task']} saw different "
                f"column types: {specs} and {r['specs']}"
            )
    # A column with nulls in any task gets a mask in every task.
    masks = complete_masks(specs, [r["paths"] for r in done], [r["rows"] for r in done])
    specs = with_masks(specs, masks)
    sink.target.begin(specs)
    try:
        for k, r in enumerate(done):
            for s in specs:
                target = sink.target.part_path(s.name, k)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.rename(r["paths"][s.name], target)
        source = {"type": "ray", "tasks": len(done)}
        codecs = column_codecs(specs, sink.codec)
        codecs.update({m.name: "raw" for m in masks})
        return sink.target.commit(specs, codecs, [r["rows"] for r in done], source)
    except BaseException:
        sink.target.abort()
        raise


#: The task directories this process (a Ray driver) owns: path -> the
#: descriptor of its owner lock (see loaderx._locks).
_TASK_DIRS: dict = {}


def _make_tasks_dir(dest: str) -> str:
    """The hidden sibling of `dest` where the write tasks put their shards,
    owned (locked) by this driver: if the driver is killed, the next
    conversion to `dest` finds the lock free and removes it."""
    parent, name = os.path.split(dest)
    os.makedirs(parent, exist_ok=True)
    path = os.path.join(parent, f".{name}.loaderx-ray-{uuid.uuid4().hex[:12]}")
    os.mkdir(path)
    _TASK_DIRS[path] = _locks.own(path)
    return path


def _drop_tasks_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    fd = _TASK_DIRS.pop(path, None)
    if fd is not None:
        os.close(fd)


def _make_datasink(base):
    class LoaderxDatasink(base):
        """Writes each task's blocks as one shard store per column; the
        driver commits them with one manifest (see the module docs)."""

        def __init__(self, dest, mode: str, codec: str, level, options: Options):
            self.target = Destination(dest, mode, options.flags)
            self.tasks_dir = _make_tasks_dir(self.target.dest)
            self.codec, self.level, self.options = codec, level, options
            self.manifest: dict | None = None

        def get_name(self) -> str:
            return "loaderx"

        def write(self, blocks, ctx) -> dict:
            return _write_blocks(self, blocks, ctx)

        def on_write_complete(self, write_result) -> None:
            try:
                self.manifest = self._commit(write_result.write_returns)
            finally:
                _drop_tasks_dir(self.tasks_dir)

        def _commit(self, returns: list) -> dict:
            return _commit_tasks(self, returns)

        def on_write_failed(self, error: Exception) -> None:
            _drop_tasks_dir(self.tasks_dir)
            self.target.abort()

    return LoaderxDatasink


@functools.lru_cache(maxsize=1)
def _datasink_class():
    from ray.data import Datasink

    return _make_datasink(Datasink)


def write_dataset(
    ray_dataset,
    dest,
    *,
    codec: str = "zstd",
    level: int | None = 3,
    mode: str = "create",
    columns: list | None = None,
    skip_columns: list | None = None,
    storage_options: dict | None = None,
) -> dict:
    """Write `ray_dataset` into the dataset directory `dest`; returns the
    manifest written. Each Ray write task writes one shard per column. A URL
    `dest` is reached with `storage_options` (else the environment)."""
    _ray()
    ray_data = require("ray.data", "ray", "loaderx.ray")
    if not isinstance(ray_dataset, ray_data.Dataset):
        raise TypeError(
            f"write_dataset takes a ray.data.Dataset, got {type(ray_dataset).__name__} "
            "(ray.data.from_numpy, from_pandas, from_arrow, ... make one)"
        )
    if codec not in ("raw", "zstd"):
        raise ConvertError(f"codec must be 'raw' or 'zstd', got {codec!r}")
    options = Options(
        columns=list(columns) if columns is not None else None,
        skip_columns=list(skip_columns or []),
        flags=Flags(),
    )
    if _objstore.is_url(dest):  # built locally (the cache's uploads), uploaded, published
        opener = _openers.remote(dest)
        with opener.settings(None, None, storage_options):
            return opener.write_dataset(dest, mode, lambda local: write_dataset(
                ray_dataset, local, codec=codec, level=level, columns=columns,
                skip_columns=skip_columns), False)
    sink = _datasink_class()(dest, mode, codec, level, options)
    try:
        ray_dataset.write_datasink(sink)
    finally:
        _drop_tasks_dir(sink.tasks_dir)
    if sink.manifest is None:
        raise ConvertError(f"{dest}: the Ray write finished without committing a manifest")
    return sink.manifest


def _read_rows(dest: str, columns, batch: dict) -> dict:
    """One batch of `read_dataset`: the rows named by ``batch["id"]``."""
    opened = open_dataset(dest, columns)
    try:
        idx = np.asarray(batch["id"], dtype=np.int64)
        out = {}
        for name, col in opened.items():
            if col.kind == "dense":
                out[name] = _zoned(col, col.gather(idx))
                continue
            records = col.gather(idx)
            values = np.empty(len(records), dtype=object)
            for i, r in enumerate(records):
                values[i] = r
            out[name] = values
        return out
    finally:
        for col in opened.values():
            col.close()


def _zoned(col, values: np.ndarray):
    """A zone-aware timestamp column's values as Arrow holds them
    (``timestamp[ns, tz=...]``), which Ray keeps; others as they are."""
    zone = getattr(col, "timezone", None)
    if zone is None or values.ndim != 1:
        return values
    import pyarrow as pa

    unit = np.datetime_data(values.dtype)[0]
    return pa.array(values, type=pa.timestamp(unit, tz=zone))


def _check_read_columns(path: str, manifest: dict, columns) -> list | None:
    """`columns` as a list, checked here in the driver: a Ray task would
    raise only when the dataset runs, wrapped in Ray's task error."""
    if columns is None:
        return None
    if isinstance(columns, (str, bytes)):
        raise TypeError(f"columns must be a list of column names, got {columns!r}")
    names = list(columns)
    for name in names:
        if name not in manifest["columns"]:
            known = list(manifest["columns"])
            raise KeyError(f"{path}: no column {name!r}; the dataset has {known}")
    return names


def read_dataset(
    dest,
    *,
    columns: list | None = None,
    batch_rows: int = _BATCH_ROWS,
    override_num_blocks: int | None = None,
):
    """A ``ray.data.Dataset`` of the dataset directory `dest` (every row, the
    manifest's column order; `columns` picks a subset)."""
    ray = _ray()
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise ValueError(f"batch_rows must be a positive int, got {batch_rows!r}")
    path = dest if _objstore.is_url(dest) else os.path.abspath(os.fspath(dest))
    manifest = read_manifest(path)
    if "splits" in manifest:
        raise ConvertError(
            f"{path} holds splits {list(manifest['splits'])}; read one split's directory"
        )
    columns = _check_read_columns(path, manifest, columns)
    ds = ray.data.range(manifest["rows"], override_num_blocks=override_num_blocks)
    return ds.map_batches(
        functools.partial(_read_rows, path, columns), batch_format="numpy", batch_size=batch_rows
    )
