"""Arrow-family sources, read with ``pyarrow``: Parquet, Arrow IPC files
(Feather v2) and IPC streams, as files or directories of files, Hugging Face
``save_to_disk`` directories (IPC streams listed in ``state.json``) and
``datasets.Dataset`` objects.

Work is cut at *pieces* (Parquet row groups, IPC record batches, whole
stream files) when that keeps tasks balanced, else inside a piece. Parquet is
read through a buffered stream, IPC through plain reads, so memory holds about
one batch whatever the file size. Hugging Face feature metadata (in the Arrow
schema) refines the mapping: ``Image`` columns are decoded (or kept encoded),
``ArrayND`` become dense tensors, ``ClassLabel`` keeps its names (the
column's ``labels`` in the manifest).

A list column whose first rows all have one length starts as a dense column
of that length, and becomes ragged if a later row has another (see
`ColumnSpec.provisional`): a pandas column of 64-value arrays is a
``(B, 64)`` DenseStore, as Ray and Arrow's tensor types would read it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from typing import Any, Iterator

import numpy as np

from ._columns import (
    ColumnSpec,
    _is_list,
    ConvertError,
    Nullable,
    add_categories,
    arrow_spec,
    arrow_to_batch,
    categorical_spec,
    fixed_list_spec,
    is_categorical,
    list_lengths,
    require,
)
from ._source import (
    Batch,
    ImageColumn,
    Options,
    Source,
    file_entries,
    image_header,
    image_shape,
    ramp,
    row_tasks,
    rows_per_batch,
    select_columns,
)

__all__ = ["ArrowSource", "HFDatasetSource", "arrow_files"]

_PARQUET = (".parquet", ".pq", ".parq")
_IPC = (".arrow", ".feather", ".ipc", ".arrows")
_PROBE_ROWS = 64
#: Rows whose list lengths decide whether a list column starts dense.
_PROBE_LIST_ROWS = 1024
#: Leaf values per Parquet read batch. The Parquet reader keeps two 16-bit
#: levels (and builder space) per leaf value, about 17 bytes for a uint8 value,
#: so batches are bounded by leaf values as well as by bytes.
_PARQUET_LEAF_VALUES_MAX = 2 << 20


def _pa():
    return require("pyarrow", "convert", "reading Parquet and Arrow data")


def arrow_files(path: str) -> list[str]:
    """The Parquet/Arrow files of a file or directory path, sorted."""
    if os.path.isfile(path):
        return [path]
    found = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        found += [
            os.path.join(root, f)
            for f in sorted(files)
            if f.lower().endswith(_PARQUET + _IPC) and not f.startswith((".", "_"))
        ]
    return found


def _hf_features(schema) -> dict:
    """Hugging Face feature dicts by column, from the schema metadata."""
    meta = schema.metadata or {}
    raw = meta.get(b"huggingface")
    if not raw:
        return {}
    try:
        return json.loads(raw).get("info", {}).get("features", {}) or {}
    except (ValueError, AttributeError):
        return {}


class ArrowSource(Source):
    kind = "arrow"
    _open_specs = None  # per process, never pickled
    leaf_values_per_row = 0.0

    def __init__(self, files: list[str], options: Options, describe: dict | None = None):
        super().__init__(options)
        if not files:
            raise ConvertError("no Parquet or Arrow files to convert")
        self.files = [os.path.abspath(f) for f in files]
        self.info = describe or {"type": "parquet" if self.files[0].endswith(_PARQUET) else "arrow"}
        schema, self.pieces = self._inspect()
        self._init_columns(schema)

    # -- layout
    def _format(self, path: str) -> str:
        if path.lower().endswith(_PARQUET):
            return "parquet"
        pa = _pa()
        try:
            with pa.memory_map(path) as m:
                pa.ipc.open_file(m)
            return "ipc-file"
        except pa.ArrowInvalid:
            return "ipc-stream"

    def _inspect(self):
        pa = _pa()
        schema, pieces = None, []
        self.leaf_values_per_row = 0.0
        self.formats = [self._format(p) for p in self.files]
        for k, (path, fmt) in enumerate(zip(self.files, self.formats)):
            try:
                s, counts = self._file_layout(pa, path, fmt)
            except (pa.ArrowInvalid, OSError) as e:
                raise ConvertError(f"{path}: cannot read it as {fmt} ({e})") from None
            if schema is None:
                schema = s
            elif not s.remove_metadata().equals(schema.remove_metadata()):
                raise ConvertError(
                    f"{path} has schema\n{s.remove_metadata()}\nbut {self.files[0]} has\n"
                    f"{schema.remove_metadata()}\nevery file must share one schema"
                )
            pieces += [(k, unit, n) for unit, n in enumerate(counts)]
        return schema, pieces

    def _file_layout(self, pa, path: str, fmt: str):
        if fmt == "parquet":
            pq = require("pyarrow.parquet", "convert", "reading Parquet")
            pf = pq.ParquetFile(path)
            meta = pf.metadata
            for i in range(meta.num_row_groups):
                rg = meta.row_group(i)
                values = sum(rg.column(j).num_values for j in range(rg.num_columns))
                self.leaf_values_per_row = max(
                    self.leaf_values_per_row, values / max(rg.num_rows, 1)
                )
            return pf.schema_arrow, [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        with pa.memory_map(path) as m:
            if fmt == "ipc-file":
                r = pa.ipc.open_file(m)
                return r.schema, [r.get_batch(i).num_rows for i in range(r.num_record_batches)]
            r = pa.ipc.open_stream(m)
            # Headers only: the batch bodies stay untouched in the map.
            return r.schema, [sum(b.num_rows for b in r)]

    def _init_columns(self, schema) -> None:
        self.schema = schema
        self.hf = _hf_features(schema)
        self.names = select_columns(
            schema.names, self.options, self.files[0] if self.files else "the dataset"
        )
        self.rows = sum(n for _, _, n in self.pieces)
        self._open_specs = None

    # -- columns
    def specs(self) -> list[ColumnSpec]:
        if self._open_specs is None:
            self._open_specs = [self._spec(n) for n in self.names]
        return self._open_specs

    def _spec(self, name: str) -> ColumnSpec:
        pa = _pa()
        feature = self.hf.get(name) or {}
        ftype = feature.get("_type", "") if isinstance(feature, dict) else ""
        t = self.schema.field(name).type
        if ftype == "Image":
            return ImageColumn.spec(name, self._probe_headers(name), self.options)
        if ftype == "Audio":
            return ColumnSpec(name, "bytes", np.dtype(np.uint8), None, decode="struct-bytes")
        if ftype.startswith("Array") and "shape" in feature:
            shape = tuple(feature["shape"])
            dtype = np.dtype(feature.get("dtype", "float32"))
            if shape and shape[0] is None:
                return ColumnSpec(name, "ragged", dtype, tuple(shape[1:]), decode="tensor")
            return ColumnSpec(name, "dense", dtype, shape, decode="tensor")
        if is_categorical(pa, t):
            return categorical_spec(name, self._categories(name))
        spec = arrow_spec(pa, name, t, self.options.flags)
        spec = fixed_list_spec(spec, self._probe_lengths(name))
        if ftype == "ClassLabel" and feature.get("names"):
            return ColumnSpec(
                spec.name,
                spec.kind,
                spec.dtype,
                spec.item_shape,
                extra={"labels": [str(n) for n in feature["names"]]},
            )
        return spec

    def _categories(self, name: str) -> list:
        """Every category of a dictionary column, in order of appearance: one
        read of that column alone (each batch may carry its own dictionary;
        the store keeps codes into this one list)."""
        pa = _pa()
        found: dict = {}
        for batch in self._batches((0, self.rows), [name], 1 << 20):
            table = batch[1]
            add_categories(pa, table.column(name), found)
        return list(found)

    def _probe(self, name: str, rows: int):
        """(first row, table) of the first `rows` rows of column `name`, or None."""
        batch = next(self._batches((0, min(self.rows, rows)), [name], rows), None)
        return None if batch is None else batch[:2]

    def _probe_lengths(self, name: str) -> np.ndarray:
        """The lengths of the first rows of a list column (empty for another type)."""
        pa = _pa()
        if not _is_list(pa, self.schema.field(name).type):  # a variable-size list
            return np.zeros(0, np.int64)
        probe = self._probe(name, _PROBE_LIST_ROWS)
        if probe is None:
            return np.zeros(0, np.int64)
        column = probe[1].column(name).combine_chunks()
        lengths = list_lengths(pa, column)
        return np.zeros(0, np.int64) if lengths is None else lengths

    def _probe_headers(self, name: str) -> list:
        spec = ColumnSpec(name, "bytes", np.dtype(np.uint8), None, decode="encoded-image")
        probe = self._probe(name, _PROBE_ROWS)
        if probe is None:
            return []
        row0, table = probe
        values = self._image_bytes(table.column(name), spec, row0)
        return [image_header(v, f"column {name!r} row {row0 + i}")
                for i, v in enumerate(values) if v is not None]

    # -- reading
    def row_count(self) -> int:
        return self.rows

    def tasks(self, workers: int) -> list:
        ends = np.cumsum([n for _, _, n in self.pieces]).tolist()
        return row_tasks(self.rows, workers, ends)

    def _batches(
        self, task, names: list[str], step: int, sizes: Iterator[int] | None = None
    ) -> Iterator[tuple[int, Any, Any]]:
        """(first row, Arrow table, file position) for rows task[0]..task[1],
        of the sizes `sizes` gives (default: `step` each); a batch never spans
        two files."""
        start, stop = task
        offset = 0
        sizes = sizes if sizes is not None else itertools.repeat(step)
        for k, unit, n in self.pieces:
            lo, hi = max(start, offset), min(stop, offset + n)
            if lo < hi:
                for row0, table in self._piece_batches(k, unit, offset, lo, hi, names, step, sizes):
                    yield row0, table, k
            offset += n
            if offset >= stop:
                return

    def _piece_batches(self, k, unit, offset, lo, hi, names, step, sizes):
        pa = _pa()
        path, fmt = self.files[k], self.formats[k]
        row = offset
        with contextlib.closing(self._piece_reader(pa, path, fmt, unit, names, step)) as reader:
            yield from self._slices(pa, path, reader, row, lo, hi, names, sizes)

    @staticmethod
    def _slices(pa, path, reader, row, lo, hi, names, sizes):
        """(first row, table) of rows lo..hi of a piece's record batches, cut
        into slices of the sizes `sizes` gives."""
        while row < hi:
            try:
                rb = next(reader, None)
            except (pa.ArrowException, OSError) as e:
                # Damage past the footer (a row group's pages, a batch body).
                raise ConvertError(f"{path}: cannot read rows from {row} ({e})") from None
            if rb is None:
                return
            n = rb.num_rows
            a, b = max(lo, row), min(hi, row + n)
            if a < b:
                table = pa.Table.from_batches([rb.slice(a - row, b - a)]).select(names)
                s = 0
                while s < b - a:
                    size = next(sizes)
                    yield a + s, table.slice(s, size)
                    s += size
            row += n

    @staticmethod
    def _piece_reader(pa, path, fmt, unit, names, step):
        if fmt == "parquet":
            pq = require("pyarrow.parquet", "convert", "reading Parquet")
            pf = pq.ParquetFile(path, buffer_size=4 << 20, pre_buffer=False)
            yield from pf.iter_batches(batch_size=step, row_groups=[unit], columns=names)
            return
        with pa.OSFile(path) as f:
            if fmt == "ipc-file":
                yield pa.ipc.open_file(f).get_batch(unit)
            else:
                yield from pa.ipc.open_stream(f)

    def read(self, task, specs: list[ColumnSpec], batch_bytes: int) -> Iterator[Batch]:
        pa = _pa()
        step = rows_per_batch(self._row_bytes(specs), batch_bytes)
        if self.leaf_values_per_row:
            step = max(1, min(step, int(_PARQUET_LEAF_VALUES_MAX / self.leaf_values_per_row)))
        for row0, table, k in self._batches(task, [s.name for s in specs], step, ramp(step)):
            cols = {s.name: self._convert(pa, table.column(s.name), s, row0) for s in specs}
            yield Batch(table.num_rows, cols, table.num_rows, nbytes=table.nbytes, file=k)

    def _row_bytes(self, specs: list[ColumnSpec]) -> float:
        """Bytes per row, from the specs or the files' sizes."""
        fixed = sum(s.record_bytes() for s in specs)
        total = sum(os.path.getsize(p) for p in self.files) if self.files else 0
        return max(fixed, total / max(self.rows, 1) * 2, 1.0)

    def _convert(self, pa, column, spec: ColumnSpec, row0: int):
        if spec.decode in ("image", "encoded-image", "struct-bytes"):
            data = self._image_bytes(column, spec, row0)
            valid = np.array([b is not None for b in data], dtype=bool)
            present = [b for b in data if b is not None]
            if spec.decode == "struct-bytes":
                records = present
            else:
                where = [f"column {spec.name!r} row {row0 + i}"
                         for i in np.flatnonzero(valid).tolist()]
                records = ImageColumn.records(spec, present, where, self.options.flags)
            return records if valid.all() else _null_images(spec, records, valid)
        return arrow_to_batch(pa, column, spec, row0, self.options.flags)

    def _image_bytes(self, column, spec: ColumnSpec, row0: int) -> list:
        """Encoded bytes of a Hugging Face Image/Audio struct column (or of a
        plain binary column); a row stored by path is read from that file."""
        pa = _pa()
        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if pa.types.is_struct(arr.type):
            # A null row is a null struct, whatever its fields hold.
            rows = arr.is_valid().to_pylist()
            data = [b if ok else None for b, ok in zip(arr.field("bytes").to_pylist(), rows)]
            paths = (
                [p if ok else None for p, ok in zip(arr.field("path").to_pylist(), rows)]
                if arr.type.get_field_index("path") >= 0
                else [None] * len(arr)
            )
        else:
            data, paths = arr.to_pylist(), [None] * len(arr)
        out = []
        for i, (b, p) in enumerate(zip(data, paths)):
            if b is None and p:
                if not os.path.isfile(p):
                    raise ConvertError(
                        f"column {spec.name!r} row {row0 + i} names the file {p}, which does "
                        f"not exist; skip the column with {self.options.flags.skip(spec.name)}"
                    )
                with open(p, "rb") as f:
                    b = f.read()
            out.append(b)  # None: a null image (no bytes, no path)
        return out

    def describe(self, file_rows: list | None = None) -> dict:
        d = dict(self.info)
        d.setdefault(
            "path", self.files[0] if len(self.files) == 1 else os.path.commonpath(self.files)
        )
        base = d["path"] if os.path.isdir(d["path"]) else os.path.dirname(d["path"])
        d["files"] = file_entries(self.files, base, file_rows)
        return d


def _null_images(spec: ColumnSpec, records, valid: np.ndarray) -> Nullable:
    """A batch of images with null rows: fillers (no bytes, a black image, an
    empty array) where `valid` is False, and the mask."""
    n = len(valid)
    if isinstance(records, np.ndarray):  # a dense batch
        out = np.zeros((n,) + spec.dense_shape, spec.dtype)
        out[valid] = records
        return Nullable(out, valid)
    empty: Any = b""
    if spec.kind != "bytes":  # ragged images (or a provisional dense column's fallback)
        empty = np.zeros(image_shape((0, 0), spec.extra["image_mode"]), spec.dtype)
    filled, it = [], iter(records)
    for ok in valid.tolist():
        filled.append(next(it) if ok else empty)
    return Nullable(filled, valid)


class HFDatasetSource(ArrowSource):
    """A ``datasets.Dataset`` object: rows come from
    ``dataset.with_format("arrow")[a:b]``, which honours any index mapping
    (shuffle, select, filter)."""

    kind = "hf"

    def __init__(self, dataset, options: Options):
        Source.__init__(self, options)
        self.dataset = dataset
        self.files = []
        self.info = {
            "type": "huggingface",
            "split": str(dataset.split) if getattr(dataset, "split", None) else None,
        }
        self.pieces = [(0, 0, len(dataset))]
        self._init_columns(dataset.with_format("arrow")[0:0].schema)

    def _batches(self, task, names, step, sizes=None):
        start, stop = task
        view = self.dataset.with_format("arrow")
        a = start
        for size in sizes if sizes is not None else itertools.repeat(step):
            if a >= stop:
                return
            b = min(a + size, stop)
            yield a, view[a:b].select(names), None
            a = b

    def _row_bytes(self, specs):
        fixed = sum(s.record_bytes() for s in specs)
        return max(fixed, self.dataset.data.nbytes / max(self.rows, 1), 1.0)

    def describe(self, file_rows: list | None = None) -> dict:
        return {k: v for k, v in self.info.items() if v is not None}
