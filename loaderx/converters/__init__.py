"""Bring your data: convert NumPy, Parquet/Arrow, Hugging Face datasets, image
folders and WebDataset shards into a loaderx dataset directory.

``loaderx.convert(source, dest, ...)`` (CLI: ``loaderx convert SRC DST``)
writes one store per column (a `ShardSet` of shard stores with
``workers=N``) plus a ``loaderx.json`` manifest, and returns
``loaderx.open_dataset(dest)``: ``{column: store or ShardSet}``, ready for
``DataLoader``.

Sources: a ``.npy`` / ``.npz`` file or a dict of arrays; Parquet, Arrow IPC
and Feather files or directories; a ``datasets.Dataset`` / ``DatasetDict`` or
a ``save_to_disk`` directory; an image folder (``class_name/*.jpg|png``);
WebDataset ``.tar`` shards (a file or a directory of them). How columns map
to stores is in ``loaderx.converters._columns`` (and the README).

Conversion streams in batches of about `batch_bytes`, so memory stays bounded
whatever the input size. ``mode="create"`` refuses an existing destination;
``"append"`` adds shards to an existing dataset directory; ``"overwrite"``
replaces a loaderx dataset or store. Optional dependencies are imported only
when needed: ``pip install 'loaderx[convert]'`` brings pyarrow and Pillow.
"""

from __future__ import annotations

import os
import shutil
import uuid
import warnings
from typing import Any

from .. import _objstore
from ..dataset import MANIFEST_NAME, open_dataset
from ..errors import DictionaryError, StoreNotFoundError
from ._columns import ColumnSpec, ConvertError, Flags, MissingDependencyError
from ._dest import Destination, safe_name, swap_into, write_json
from ._progress import make_progress
from ._run import StoreOptions, run_tasks, sample_records
from ._source import Options, Source

__all__ = [
    "convert",
    "convert_to_directory",
    "ConvertError",
    "MissingDependencyError",
    "open_source",
]

_TINY_RECORD_BYTES = 64
_DICT_SAMPLE_BYTES = 16 << 20
_CODECS = ("raw", "zstd")


def convert(
    source: Any,
    dest,
    *,
    codec: str = "zstd",
    level: int | None = 3,
    dict: bool = False,
    columns: list | None = None,
    workers: int | None = None,
    mode: str = "create",
    skip_columns: list | None = None,
    keep_encoded: bool = False,
    row_length: int | None = None,
    allow_tiny_records: bool = False,
    batch_bytes: int = 16 << 20,
    progress=None,
) -> dict:
    """Convert `source` into the dataset directory `dest`; returns
    ``open_dataset(dest)`` (``{split: {...}}`` for a DatasetDict).

    Args:
        codec: ``"zstd"`` or ``"raw"`` for every column; dense columns whose
            records are under 64 bytes are always stored raw (compressing them
            cannot pay, and a raw dense store needs only 4 bytes of index per record).
        level: zstd level. dict: train one zstd dictionary per column on a
            sample of its first records (``zstd_dict``), for small records.
        columns / skip_columns: names to convert / to leave out.
        workers: processes; each writes one shard store per column.
        mode: ``"create"``, ``"append"`` or ``"overwrite"``.
        keep_encoded: keep images (and WebDataset ``.npy``) as encoded bytes.
        row_length: cut 1-D NumPy arrays into rows of this many values (tokens).
        allow_tiny_records: accept rows under 64 bytes (one record per value).
        batch_bytes: about this many bytes are read and written at a time.
        progress: None (a bar on a terminal), True, False, "bar", "log", "off".
    """
    convert_to_directory(
        source,
        dest,
        codec=codec,
        level=level,
        dict=dict,
        columns=columns,
        workers=workers,
        mode=mode,
        skip_columns=skip_columns,
        keep_encoded=keep_encoded,
        row_length=row_length,
        allow_tiny_records=allow_tiny_records,
        batch_bytes=batch_bytes,
        progress=progress,
    )
    return open_dataset(dest)


def convert_to_directory(
    source: Any,
    dest,
    *,
    codec: str = "zstd",
    level: int | None = 3,
    dict: bool = False,
    columns=None,
    workers=None,
    mode: str = "create",
    skip_columns=None,
    keep_encoded: bool = False,
    row_length=None,
    allow_tiny_records: bool = False,
    batch_bytes: int = 16 << 20,
    progress=None,
    cli: bool = False,
) -> dict:
    """`convert` without opening the result: returns the manifest written."""
    if _objstore.is_url(dest):  # built locally, uploaded, then published (loaderx.remote)
        from ..remote import write_dataset_to

        return write_dataset_to(dest, mode, lambda local: convert_to_directory(
            source, local, codec=codec, level=level, dict=dict, columns=columns, workers=workers,
            mode="create", skip_columns=skip_columns, keep_encoded=keep_encoded,
            row_length=row_length, allow_tiny_records=allow_tiny_records,
            batch_bytes=batch_bytes, progress=progress, cli=cli), cli=cli)
    flags = Flags(cli=cli)
    if codec not in _CODECS:
        raise ConvertError(
            f"codec must be one of {_CODECS} (add dict=True for zstd_dict), got {codec!r}"
        )
    for label, names in (("columns", columns), ("skip_columns", skip_columns)):
        if isinstance(names, (str, bytes)):
            raise TypeError(f"{label} must be a list of column names, not the string {names!r}")
    if level is not None and (not isinstance(level, int) or isinstance(level, bool) or not level):
        # zstd reads 0 as "the default"; a store records the level it used,
        # so 0 is refused rather than stored as 3 behind the caller's back.
        raise ValueError(f"level must be a non-zero int zstd level or None (3), got {level!r}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers must be a positive int or None, got {workers!r}")
    if row_length is not None and (not isinstance(row_length, int) or row_length < 1):
        raise ValueError(f"row_length must be a positive int, got {row_length!r}")
    if not isinstance(batch_bytes, int) or batch_bytes < 1:
        raise ValueError(f"batch_bytes must be a positive int, got {batch_bytes!r}")
    options = Options(
        columns=list(columns) if columns is not None else None,
        skip_columns=list(skip_columns or []),
        keep_encoded=keep_encoded,
        row_length=row_length,
        flags=flags,
    )
    job = {
        "codec": codec,
        "level": level,
        "dict": dict,
        "workers": workers or 1,
        "allow_tiny": allow_tiny_records,
        "batch_bytes": batch_bytes,
        "progress": progress,
    }
    splits = _splits(source)
    if splits is not None:
        return _convert_splits(splits, dest, mode, options, job)
    return _convert_one(open_source(source, options), dest, mode, options, job)


# ----------------------------------------------------------------- sources


def _is_hf(obj: Any, name: str) -> bool:
    return type(obj).__module__.split(".")[0] == "datasets" and any(
        c.__name__ == name for c in type(obj).__mro__
    )


def _splits(source: Any) -> list | None:
    """[(split, source)] for a DatasetDict object or directory, else None."""
    if _is_hf(source, "DatasetDict"):
        return list(source.items())
    if isinstance(source, (str, os.PathLike)):
        p = os.fspath(source)
        marker = os.path.join(p, "dataset_dict.json")
        if os.path.isfile(marker):
            names = _json_file(marker).get("splits")
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ConvertError(f"{marker}: 'splits' is not a list of split names")
            return [(n, os.path.join(p, n)) for n in names]
    return None


def _json_file(path: str) -> dict:
    """A JSON object file of a Hugging Face directory, or a ConvertError naming it."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ConvertError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ConvertError(f"{path}: not a JSON object")
    return obj


def open_source(source: Any, options: Options) -> Source:
    """The Source for a path or an in-memory object."""
    from ._arrow_src import ArrowSource, HFDatasetSource, arrow_files
    from ._files_src import ImageFolderSource, WebDatasetSource, tar_files
    from ._numpy_src import NumpySource

    if _is_hf(source, "Dataset"):
        return HFDatasetSource(source, options)
    if isinstance(source, dict):
        return NumpySource(source, options)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"cannot convert a {type(source).__name__}: give a path, a dict of numpy "
            "arrays or a datasets.Dataset"
        )
    p = os.fspath(source)
    if not os.path.exists(p):
        raise StoreNotFoundError(f"{p}: no such file or directory", path=p)
    low = p.lower()
    if os.path.isfile(p):
        if low.endswith((".npy", ".npz")):
            return NumpySource(p, options)
        if low.endswith((".tar", ".tar.gz", ".tgz")):
            return WebDatasetSource([os.path.abspath(p)], options)
        if low.endswith((".parquet", ".pq", ".parq", ".arrow", ".feather", ".ipc", ".arrows")):
            return ArrowSource([p], options)
        raise ConvertError(
            f"{p}: unknown file type; loaderx converts .npy, .npz, .parquet, .arrow, "
            ".feather, .tar (WebDataset) files and directories of them or of images"
        )
    return _open_directory(
        p, options, ArrowSource, arrow_files, ImageFolderSource, WebDatasetSource, tar_files
    )


def _open_directory(
    p, options, ArrowSource, arrow_files, ImageFolderSource, WebDatasetSource, tar_files
) -> Source:
    state = os.path.join(p, "state.json")
    if os.path.isfile(state) and os.path.isfile(os.path.join(p, "dataset_info.json")):
        entries = _json_file(state).get("_data_files", [])
        entries = entries if isinstance(entries, list) else [None]
        names = [d.get("filename") if isinstance(d, dict) else None for d in entries]
        files = [os.path.join(p, n) for n in names if isinstance(n, str)]
        if len(files) != len(names):
            raise ConvertError(f"{state}: '_data_files' is not a list of {{'filename': ...}}")
        return ArrowSource(files, options, {"type": "huggingface", "path": os.path.abspath(p)})
    if tar_files(p):
        return WebDatasetSource(tar_files(p), options)
    files = arrow_files(p)
    if files:
        return ArrowSource(files, options)
    return ImageFolderSource(p, options)


# ----------------------------------------------------------------- one dataset


def _check_tiny(source: Source, specs: list[ColumnSpec], options: Options, allow: bool) -> None:
    if allow or not all(s.kind == "dense" and s.item_shape == () for s in specs):
        return
    row = sum(s.dtype.itemsize for s in specs)
    if row >= _TINY_RECORD_BYTES:
        return
    rows = source.row_count()
    f = options.flags
    count = f"{rows:,} records" if rows is not None else "one record per value"
    raise ConvertError(
        f"every row of this source is {row} B "
        f"({', '.join(f'{s.name}: {s.dtype}' for s in specs)}), so "
        f"each value would become its own record: {count} that cost more index than data. "
        f"If these are tokens, store rows of L tokens with {f.opt('row_length', 'L')} (e.g. 2048), "
        "or documents as a RaggedStore (loaderx.from_iterator); to keep one record per value "
        f"anyway, pass {f.opt('allow_tiny_records')}"
    )


def column_codecs(specs: list[ColumnSpec], codec: str) -> dict:
    """Each column's codec: `codec`, except raw for dense records under 64 bytes."""
    return {
        s.name: (
            "raw"
            if codec == "raw" or (s.kind == "dense" and s.record_bytes() < _TINY_RECORD_BYTES)
            else codec
        )
        for s in specs
    }


def _train_dicts(source: Source, task, specs: list[ColumnSpec], codecs: dict) -> dict:
    from ..zrecord import train_dict

    wanted = [s for s in specs if codecs[s.name] != "raw"]
    if not wanted:
        return {}
    samples = sample_records(source, task, wanted, _DICT_SAMPLE_BYTES)
    dicts = {}
    for s in wanted:
        try:
            dicts[s.name] = train_dict(samples[s.name], tier="balanced")
            codecs[s.name] = "zstd_dict"
        except DictionaryError as e:
            warnings.warn(f"column {s.name!r}: no dictionary ({e}); using plain zstd", stacklevel=4)
    return dicts


def _convert_one(source: Source, dest, mode: str, options: Options, job: dict) -> dict:
    specs = source.specs()
    _check_tiny(source, specs, options, job["allow_tiny"])
    tasks = source.tasks(job["workers"])
    codecs = column_codecs(specs, job["codec"])
    dicts = _train_dicts(source, tasks[0], specs, codecs) if job["dict"] else {}
    target = Destination(dest, mode, options.flags)
    target.begin(specs)
    try:
        paths = [{s.name: target.part_path(s.name, k) for s in specs} for k in range(len(tasks))]
        opts = StoreOptions(codecs, job["level"], dicts, job["batch_bytes"])
        with make_progress(job["progress"], source.progress_total(), "convert", source.unit) as bar:
            rows = run_tasks(source, tasks, specs, paths, opts, bar)
        rows = _drop_empty_parts(target, specs, rows, keep_one=target.mode != "append")
        return target.commit(specs, codecs, rows, source.describe())
    except BaseException:
        target.abort()
        raise


def _drop_empty_parts(target: Destination, specs, rows: list[int], keep_one: bool) -> list[int]:
    """Remove parts with no rows and number the rest consecutively."""
    keep = [k for k, n in enumerate(rows) if n > 0] or ([0] if keep_one else [])
    for k in range(len(rows)):
        if k not in keep:
            for s in specs:
                shutil.rmtree(target.part_path(s.name, k), ignore_errors=True)
    for j, k in enumerate(keep):
        if j != k:
            for s in specs:
                os.rename(target.part_path(s.name, k), target.part_path(s.name, j))
    return [rows[k] for k in keep]


def _convert_splits(splits: list, dest, mode: str, options: Options, job: dict) -> dict:
    """A DatasetDict: one dataset directory per split under `dest`, and a
    manifest naming them."""
    if mode == "append":
        raise ConvertError("append to one split at a time: convert a Dataset into DEST/<split>")
    parent, base = os.path.split(os.path.abspath(os.fspath(dest)))
    Destination(dest, mode, options.flags)  # checks the destination per mode
    taken: set = set()
    # A split's name is data, not a path: "../x" must not write outside `dest`.
    dirs = {str(n): safe_name(str(n), taken) for n, _ in splits}
    staging = os.path.join(parent, f".{base}.loaderx-partial-{uuid.uuid4().hex[:12]}")
    os.makedirs(staging)
    try:
        for name, split in splits:
            _convert_one(
                open_source(split, options),
                os.path.join(staging, dirs[str(name)]),
                "create",
                options,
                job,
            )
        from ..dataset import MANIFEST_FORMAT, MANIFEST_VERSION

        manifest = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "splits": dirs,
        }
        write_json(os.path.join(staging, MANIFEST_NAME), manifest)
        swap_into(staging, os.path.abspath(os.fspath(dest)))
        return manifest
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
