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
WebDataset ``.tar`` shards (a file or a directory of them); a store written by
the original loaderx 0.9.x/1.7.x (``meta.zr``, see ``_original_src``). How columns map
to stores is in ``loaderx.converters._columns`` (and the README).

Provenance: tar samples and image files get a ``key`` column (the sample's
``__key__``, the file's path under the folder) unless ``keys=False``; the
manifest's ``source.files`` gives each source file its row range, and a
column's ``labels`` its label names (`loaderx.labels`).

Conversion streams in batches of about `batch_bytes`, so memory stays bounded
whatever the input size. ``mode="create"`` refuses an existing destination;
``"append"`` adds shards to an existing dataset directory; ``"overwrite"``
replaces a loaderx dataset or store. Optional dependencies are imported only
when needed: ``pip install 'loaderx[convert]'`` brings pyarrow and Pillow.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import shutil
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import _abi, _objstore, _openers
from .._checks import check_level, check_mode, path_arg
from .._writer import codec_of
from .._manifest import MANIFEST_NAME
from ..dataset import open_dataset
from ..errors import DictionaryError, IdentityError, StoreNotFoundError
from ..zrecord import train_dict
from ._columns import (
    ColumnSpec,
    ConvertError,
    Flags,
    MissingDependencyError,
    mask_name,
    mask_spec,
    with_extra,
)
from ._dest import Destination, safe_name
from ._loaderx_src import LoaderxSource, is_loaderx_data, loaderx_splits
from ._progress import make_progress
from ._run import (
    StoreOptions,
    TaskResult,
    complete_masks,
    run_tasks,
    sample_records,
    settle_columns,
)
from ._source import ImageColumn, Options, Source, user_warning

__all__ = [
    "convert",
    "convert_to_directory",
    "ConvertError",
    "MissingDependencyError",
    "open_source",
]

_TINY_RECORD_BYTES = 64
_DICT_SAMPLE_BYTES = 16 << 20


def convert(
    source: Any,
    dest,
    *,
    codec: str = "zstd",
    level: int | None = None,
    dict_size: int | None = None,
    columns: list | None = None,
    workers: int | None = None,
    mode: str = "create",
    skip_columns: list | None = None,
    keep_encoded: bool = False,
    max_side: int | None = None,
    row_length: int | None = None,
    allow_tiny_records: bool = False,
    batch_bytes: int = 16 << 20,
    progress=None,
    keys: bool = True,
    image_column: str | None = "image",
    dtype=None,
    item_shape=None,
    fill_null: dict | None = None,
    dict: bool | None = None,
) -> dict:
    """Convert `source` into the dataset directory `dest`; returns
    ``open_dataset(dest)`` (``{split: {...}}`` for a DatasetDict).

    `mode`, `codec`, `level`, `dict_size` and `progress` are the writers'
    one vocabulary (``loaderx._writer``, the same as `from_numpy`'s).

    Args:
        codec: ``"zstd"``, ``"raw"`` or ``"zstd_dict"`` for every column;
            dense columns whose records are under 64 bytes are always stored
            raw (compressing them cannot pay, and a raw dense store needs
            only 4 bytes of index per record). ``"zstd_dict"`` trains one
            zstd dictionary per column on a sample of its first records (for
            small records); a column zstd cannot train one for stays ``zstd``.
        level: zstd level (None: 3, and 19 for zstd_dict columns).
        dict_size: the most bytes of each trained dictionary (default 128 KiB).
        columns / skip_columns: names to convert / to leave out.
        workers: processes; each writes one shard store per column.
        mode: ``"create"``, ``"append"`` or ``"overwrite"``.
        keep_encoded: keep images (and WebDataset ``.npy``) as encoded bytes.
        max_side: with `keep_encoded`, an image whose longer side is above
            this many pixels is shrunk to it (aspect kept, Pillow's Lanczos)
            and encoded again once, here (a JPEG at quality 90, any other
            format as PNG); smaller images keep their bytes untouched. What a
            loader decodes then costs at most this size.
        row_length: cut 1-D NumPy arrays into rows of this many values (tokens).
        allow_tiny_records: accepted for compatibility (scalar columns need no flag).
        batch_bytes: about this many bytes are read and written at a time.
        progress: None (a bar on a terminal), True, False, "bar", "log",
            "off", or a callable ``progress(done, total)`` (in the source's
            unit: rows, or bytes of tar and image files).
        keys: keep a ``key`` column of where each row came from: a tar
            sample's ``__key__``, an image's path under the folder.
        image_column: WebDataset: the column of every sample's image, whatever
            its extension (jpg, jpeg, png, webp, ...: one image per sample, as
            webdataset's decoders read them); None for one column per extension.
        dtype / item_shape: what the records of a store written by the original
            loaderx are, where its schema.msgpack cannot be read.
        fill_null: ``{column: value}``: its nulls become `value`, with no ``<column>.valid`` mask.
        dict: deprecated; ``dict=True`` is ``codec="zstd_dict"``.
    """
    _convert(source, dest, _job(locals()))
    return open_dataset(dest)


def convert_to_directory(source: Any, dest, **options) -> dict:
    """`convert` without opening the result: returns the manifest written.
    It takes exactly `convert`'s options (checked against its signature)."""
    cli = bool(options.pop("cli", False))
    try:
        bound = _CONVERT_SIGNATURE.bind(source, dest, **options)
    except TypeError as e:
        raise TypeError(f"convert_to_directory: {e}") from None
    bound.apply_defaults()
    return _convert(source, dest, _job(bound.arguments, cli=cli))


_CONVERT_SIGNATURE = inspect.signature(convert)


def _max_side(max_side: Any, keep_encoded: bool, flags: Flags) -> int | None:
    if max_side is None:
        return None
    if isinstance(max_side, bool) or not isinstance(max_side, int) or max_side < 1:
        raise ValueError(f"max_side must be a positive int or None, got {max_side!r}")
    if not keep_encoded:
        raise ValueError(f"{flags.opt('max_side', str(max_side))} shrinks the encoded images "
                         f"{flags.opt('keep_encoded')} stores; decoded images are stored at "
                         "their size (resize them in a loaderx.image pipeline)")
    return max_side


def _job(args: Mapping, cli: bool = False) -> dict:
    """`convert`'s arguments checked, as one dict (the job every part of a
    conversion reads)."""
    job = {k: v for k, v in args.items() if k not in ("source", "dest")}
    job["codec"] = codec_of(job["codec"], job.pop("dict"), cli=cli)
    job["cli"] = cli
    return job


def _url_destination(fn):
    """`fn(source, dest, job)` that also takes a URL `dest`: the dataset is
    built in a new local directory, uploaded, then published (loaderx.remote)."""

    @functools.wraps(fn)
    def convert_anywhere(source, dest, job):
        if not _objstore.is_url(dest):
            return fn(source, dest, job)
        return _openers.remote(dest).write_dataset(
            dest, job["mode"], lambda local: fn(source, local, {**job, "mode": "create"}),
            job["cli"])
    return convert_anywhere


#: The most worker processes a conversion starts (the same bound as the
#: loader's threads).
WORKERS_MAX = _abi.LOADER_THREADS_MAX


def _refuse_overlap(source: Any, dest) -> None:
    """A local source and DEST must not contain each other: DEST inside the
    source would be read as part of it (an image folder's output, a class),
    and an overwrite of a DEST holding the source would remove it."""
    if not isinstance(source, (str, os.PathLike)) or _objstore.is_url(os.fspath(source)):
        return
    src = os.path.realpath(os.fspath(source))
    out = os.path.realpath(os.fspath(dest))
    if os.path.commonpath([src, out]) in (src, out) and (os.path.isdir(src) or src == out):
        raise ValueError(f"{dest}: the destination and the source ({source}) contain one "
                         "another; convert into a directory outside the source")


@_url_destination
def _convert(source: Any, dest, job: dict) -> dict:
    """The one conversion `convert` and `convert_to_directory` run; returns
    the manifest written."""
    if isinstance(source, (str, bytes, os.PathLike)):
        source = path_arg(source, "source")
    dest = path_arg(dest, "dest")
    flags = Flags(cli=job["cli"])
    columns, skip_columns = job["columns"], job["skip_columns"]
    level, workers, row_length = job["level"], job["workers"], job["row_length"]
    batch_bytes, image_column, fill_null = job["batch_bytes"], job["image_column"], job["fill_null"]
    for label, names in (("columns", columns), ("skip_columns", skip_columns)):
        if isinstance(names, (str, bytes)):
            raise TypeError(f"{label} must be a list of column names, not the string {names!r}")
    check_level(level)  # the stores' own check (0 refused), before anything is written
    level = None if level is None else int(level)
    if job["dict_size"] is not None and job["codec"] != "zstd_dict":
        raise ValueError("dict_size= sizes the dictionary a writer trains, which it does for "
                         "codec='zstd_dict'")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or not 1 <= workers <= WORKERS_MAX):
        raise ValueError(f"workers must be an int from 1 to {WORKERS_MAX} (a process each) or "
                         f"None, got {workers!r}")
    if row_length is not None and (not isinstance(row_length, int) or row_length < 1):
        raise ValueError(f"row_length must be a positive int, got {row_length!r}")
    if not isinstance(batch_bytes, int) or batch_bytes < 1:
        raise ValueError(f"batch_bytes must be a positive int, got {batch_bytes!r}")
    if image_column is not None and (not isinstance(image_column, str) or not image_column):
        raise ValueError(f"image_column must be a column name or None, got {image_column!r}")
    if fill_null is not None and not isinstance(fill_null, Mapping):
        raise TypeError(f"fill_null must be a dict of column -> value, got {fill_null!r}")
    check_mode(job["mode"])
    _refuse_overlap(source, dest)
    options = Options(
        columns=list(columns) if columns is not None else None,
        skip_columns=list(skip_columns or []),
        keep_encoded=job["keep_encoded"],
        max_side=_max_side(job["max_side"], job["keep_encoded"], flags),
        row_length=row_length,
        flags=flags,
        keys=bool(job["keys"]),
        image_column=image_column,
        dtype=job["dtype"],
        item_shape=job["item_shape"],
        fill_null={**(fill_null or {})},
    )
    job = {**job, "workers": workers or 1, "level": level}
    splits = _splits(source)
    if splits is not None:
        return _convert_splits(splits, dest, job["mode"], options, job)
    return _convert_one(open_source(source, options), dest, job["mode"], options, job)


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
        if _objstore.is_url(p) or os.path.isdir(p):
            splits = loaderx_splits(p)  # a loaderx dataset of splits
            if splits is not None:
                return splits
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
    from .._original import is_store177
    from ._original177_src import Original177Source
    from ._original_src import OriginalSource, is_original_store

    if isinstance(source, (str, bytes, os.PathLike)):
        source = path_arg(source, "source")
    original = isinstance(source, (str, os.PathLike)) and is_original_store(os.fspath(source))
    if (options.dtype is not None or options.item_shape is not None) and not original:
        raise ConvertError(
            f"{options.flags.opt('dtype', '...')} and {options.flags.opt('item_shape', '...')} "
            "apply to stores written by the original loaderx (a directory with meta.zr)"
        )
    if original and is_store177(os.fspath(source)):
        return Original177Source(os.fspath(source), options)
    if original:
        return OriginalSource(os.fspath(source), options)
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
    if _objstore.is_url(p) or (os.path.isdir(p) and is_loaderx_data(p)):
        return _loaderx_source(p, options)
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


def _loaderx_source(p: str, options: Options) -> Source:
    """A loaderx dataset or store, local or at a URL (what convert reads at a URL)."""
    if _objstore.is_url(p) and not is_loaderx_data(p):
        raise StoreNotFoundError(
            f"{p}: no loaderx dataset or store here (no {MANIFEST_NAME}, no meta); convert "
            "reads loaderx data at a URL: download other files first, then convert them",
            path=p)
    return LoaderxSource(p, options)


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


def column_codecs(specs: list[ColumnSpec], codec: str) -> dict:
    """Each column's codec: its own if it names one, else `codec`, except raw
    for dense records under 64 bytes."""
    return {
        s.name: (
            s.codec
            if s.codec is not None
            else "raw"
            if codec == "raw" or (s.kind == "dense" and s.record_bytes() < _TINY_RECORD_BYTES)
            else codec
        )
        for s in specs
    }


def _train_dicts(source: Source, task, specs: list[ColumnSpec], codecs: dict,
                 size: int | None) -> dict:
    wanted = [s for s in specs if codecs[s.name] != "raw"]
    if not wanted:
        return {}
    samples = sample_records(source, task, wanted, _DICT_SAMPLE_BYTES)
    dicts = {}
    for s in wanted:
        try:
            dicts[s.name] = train_dict(samples[s.name], tier="balanced", size=size)
            codecs[s.name] = "zstd_dict"
        except DictionaryError as e:
            user_warning(f"column {s.name!r}: no dictionary ({e}); using plain zstd")
    return dicts


def _convert_one(source: Source, dest, mode: str, options: Options, job: dict) -> dict:
    target = Destination(dest, mode, options.flags)
    specs = _with_fills(_like_existing(source.specs(), target.existing), options)
    if target.mode == "append":
        specs = _merge_categories(specs, target.existing or {}, target.dest)
    tasks = source.tasks(job["workers"])
    # zstd_dict columns start as zstd: each becomes zstd_dict once its dictionary is trained.
    codecs = column_codecs(specs, "zstd" if job["codec"] == "zstd_dict" else job["codec"])
    if job["codec"] == "zstd_dict":
        dicts = _train_dicts(source, tasks[0], specs, codecs, job["dict_size"])
    else:
        dicts = source.dictionaries(codecs)  # a source's own (an original loaderx store's)
    # A place for every column's validity mask; a mask is made only when its
    # column's first null arrives (see _run.write_task).
    names = {s.name for s in specs}
    masks = [mask_spec(s) for s in specs if mask_name(s.name) not in names]
    target.begin(specs + masks)
    try:
        paths = [
            {s.name: target.part_path(s.name, k) for s in specs + masks}
            for k in range(len(tasks))
        ]
        opts = StoreOptions(codecs, job["level"], dicts, job["batch_bytes"])
        with make_progress(job["progress"], source.progress_total(), "convert", source.unit) as bar:
            for note in filter(None, map(ImageColumn.note, specs)):
                bar.note(note)
            results = run_tasks(source, tasks, specs, paths, opts, bar)
            settled = settle_columns(specs, paths, opts)
            for before, after in zip(specs, settled):
                if before.kind != after.kind:
                    bar.note(_fallback_note(before))
        _check_settled_append(target, settled)
        counts = [r.rows for r in results]
        used = complete_masks(settled, paths, counts, target.existing_masks())
        settled = with_masks(settled, used)
        codecs.update({m.name: "raw" for m in used})
        rows = _drop_empty_parts(target, settled, counts, keep_one=target.mode != "append")
        first = target.existing["rows"] if target.mode == "append" and target.existing else 0
        described = source.describe(_file_rows(results, first, len(getattr(source, "files", []))))
        return target.commit(settled, codecs, rows, described)
    except BaseException:
        target.abort()
        raise


def with_masks(specs: list[ColumnSpec], masks: list[ColumnSpec]) -> list[ColumnSpec]:
    """`specs` with each used mask right after its column (which names it)."""
    by_owner = {m.extra["valid_of"]: m for m in masks}
    out = []
    for s in specs:
        mask = by_owner.get(s.name)
        out += [s] if mask is None else [with_extra(s, valid=mask.name), mask]
    return out


def _with_fills(specs: list[ColumnSpec], options: Options) -> list[ColumnSpec]:
    from dataclasses import replace

    unknown = sorted(set(options.fill_null) - {s.name for s in specs})
    if unknown:
        raise ConvertError(
            f"fill_null names {unknown}, which are not columns being converted "
            f"({[s.name for s in specs]})"
        )
    return [
        replace(s, fill=options.fill_null[s.name]) if s.name in options.fill_null else s
        for s in specs
    ]


def _merge_categories(specs: list[ColumnSpec], manifest: dict, dest: str) -> list[ColumnSpec]:
    """Appending to a categorical column: its categories are the dataset's,
    then the new data's others, so the codes already stored keep their meaning."""
    from ._columns import code_dtype

    out = []
    for s in specs:
        cats = s.extra.get("categories")
        have = (manifest.get("columns") or {}).get(s.name, {}).get("categories")
        if cats is None or have is None:
            out.append(s)
            continue
        merged = list(have) + [c for c in cats if c not in set(have)]
        if code_dtype(len(merged)) != code_dtype(len(have)):
            raise ConvertError(
                f"{dest}: column {s.name!r} would grow to {len(merged)} categories, more "
                f"than its {code_dtype(len(have))} codes hold; convert into a new dataset"
            )
        out.append(dataclasses.replace(s, dtype=code_dtype(len(have)),
                                       extra={**s.extra, "categories": merged}))
    return out


def _fallback_note(spec: ColumnSpec) -> str:
    return (
        f"column {spec.name!r}: a row has another shape than the first rows' "
        f"{spec.item_shape}, so the column is a RaggedStore"
    )


def _like_existing(specs: list[ColumnSpec], existing: dict | None) -> list[ColumnSpec]:
    """For an append: a provisional dense column goes ragged at once when
    the dataset's column is ragged (equal-length rows appended to a column
    of lists stay lists), and label codes must mean the same names."""
    if existing is None or "columns" not in existing:
        return specs
    out = []
    for s in specs:
        have = existing["columns"].get(s.name) or {}
        if s.kind == "dense" and s.provisional and have.get("kind") == "ragged":
            s = s.as_ragged()
        names, had = s.extra.get("labels"), have.get("labels", have.get("class_names"))
        if names is not None and had is not None and list(names) != list(had):
            raise ConvertError(
                f"column {s.name!r}: the dataset's labels are {had}, the new data's {names}; "
                "appended, the same code would name another label"
            )
        _check_zone(s, have)
        out.append(s)
    return out


def _check_zone(spec: ColumnSpec, have: dict) -> None:
    """Appended timestamps are in the zone of the dataset's column (or in
    none, as it is): one column, one zone to read its instants in."""
    zone, had = spec.extra.get("timezone"), have.get("timezone")
    if have and zone != had and np.dtype(spec.dtype).kind == "M":
        def say(z):
            return f"in {z}" if z else "without a zone"

        raise ConvertError(
            f"column {spec.name!r}: the dataset's timestamps are {say(had)}, the new data's "
            f"{say(zone)}; convert them to the dataset's zone first (pandas: "
            "Series.dt.tz_convert / tz_localize)"
        )


def _check_settled_append(target: Destination, settled: list[ColumnSpec]) -> None:
    """An append whose provisional column fell back to ragged cannot join a
    dataset whose column is dense."""
    if target.mode != "append" or target.existing is None:
        return
    for s in settled:
        have = target.existing["columns"].get(s.name) or {}
        if have.get("kind") == "dense" and s.kind != "dense":
            raise IdentityError(
                f"{target.dest}: column {s.name!r} holds kind=dense rows of shape "
                f"{tuple(have.get('item_shape') or ())}, but some new rows have other shapes; "
                "nothing was appended",
                path=target.dest,
            )


def _file_rows(results: list[TaskResult], first: int, count: int) -> list | None:
    """``[start, stop)`` of each of the source's `count` files in the
    dataset's row numbers (an append starts at `first`), from what the tasks
    read; None for a source that is not a list of files."""
    if not count:
        return None
    rows = [0] * count
    for r in results:
        for file, n in r.files:
            rows[file] += n
    ends = np.cumsum(rows) + first
    return [[int(end - n), int(end)] for n, end in zip(rows, ends)]


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
    """A DatasetDict: one dataset directory per split, in one generation of
    `dest`, and a manifest naming them."""
    if mode == "append":
        raise ConvertError("append to one split at a time: convert a Dataset into DEST/<split>")
    target = Destination(dest, mode, options.flags)
    taken: set = set()
    # A split's name is data, not a path: "../x" must not write outside `dest`.
    dirs = {str(n): safe_name(str(n), taken) for n, _ in splits}
    root = target.begin_splits()
    try:
        for name, split in splits:
            _convert_one(
                open_source(split, options),
                os.path.join(root, dirs[str(name)]),
                "create",
                options,
                job,
            )
        return target.commit_splits(dirs)
    except BaseException:
        target.abort()
        raise
