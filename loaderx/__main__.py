"""Command line: ``loaderx {info,convert,select,verify,compact,train-dict,cache,bench,demo}``
(also ``python -m loaderx``), and ``loaderx --version``.

Paths may be URLs (``s3://``, ``gs://``, ``az://``, ``https://``; settings from
the environment, ``LOADERX_CACHE_DIR`` and ``LOADERX_CACHE_LIMIT`` for the cache):
``info`` and ``verify`` read through the cache, ``convert`` writes to one.

Long commands show a progress bar with rate and ETA on a terminal and plain
periodic log lines otherwise; ``--quiet`` silences both. Warnings are one line
on stderr naming the input. Exit codes: 0 ok, 1 a loaderx error (one line on
stderr, no traceback), 2 a usage error, 130 when interrupted, 141 (as if
killed by SIGPIPE, silently) when stdout is a pipe closed early
(``loaderx info --json X | head``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
import warnings
from typing import Any, Iterator

import numpy as np

from . import _objstore, _openers
from ._manifest import MANIFEST_NAME
from ._writer import is_store_dir
from .errors import InvalidArgumentError

_TINY_RECORD_BYTES = 64
_PAYLOAD_SAMPLE = 1024


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _progress_mode(args) -> str:
    if getattr(args, "quiet", False):
        return "off"
    return "bar" if sys.stderr.isatty() else "log"


def _say(args, text: str) -> None:
    if not getattr(args, "quiet", False):
        print(text)


# ----------------------------------------------------------------- info


def _file_size(path: str, name: str) -> int | None:
    try:
        return os.stat(os.path.join(path, name)).st_size
    except OSError:
        return None


def _payload(store, records: int, live: int) -> tuple[int, bool]:
    """Uncompressed record bytes, and whether it is an estimate (compressed
    ragged/byte stores: the mean of up to 1024 evenly spread records)."""
    if store.kind == "dense":
        return records * store.record_bytes, False
    if store.codec == "raw" or records == 0:
        return live, False
    idx = np.unique(np.linspace(0, records - 1, min(records, _PAYLOAD_SAMPLE)).astype(np.int64))
    sample = store.gather(idx)
    size = sum(len(r) if isinstance(r, (bytes, bytearray)) else r.nbytes for r in sample)
    return int(round(size / len(idx) * records)), True


def store_report(store) -> dict:
    """Everything `info` says about one store, as plain values."""
    st = store.stats()
    records = st["records"]
    per_record = 4 if (store.kind == "dense" and store.codec == "raw") else 32
    local = getattr(store, "_native_path", store.path)  # a remote store's cached replica
    index = _file_size(local, "index") if not getattr(store, "is_remote", False) else None
    index = records * per_record if index is None else index
    meta = _file_size(local, "meta") or 0
    payload, estimated = _payload(store, records, st["live_bytes"])
    dictionary = store.dictionary()
    report = {
        "path": store.path,
        "kind": store.kind,
        "dtype": str(store.dtype),
        "item_shape": list(store.item_shape) if store.item_shape is not None else None,
        "format_version": store.format_version,
        "codec": store.codec,
        "level": store.level,
        "dictionary_bytes": len(dictionary) if dictionary else 0,
        "records": records,
        "payload_bytes": payload,
        "payload_estimated": estimated,
        "data_bytes": st["chunk_bytes"],
        "reclaimable_bytes": st["reclaimable"],
        "index_bytes": index,
        "meta_bytes": meta,
        "stored_bytes": st["chunk_bytes"] + index + meta,
        "overhead_pct": 100.0 * (index + meta) / payload if payload else None,
        "ratio": payload / st["live_bytes"] if st["live_bytes"] else None,
    }
    report["warnings"] = _warnings(report)
    return report


def _warnings(r: dict) -> list[str]:
    if not r["records"] or (r["kind"] == "dense" and r["item_shape"] == []):
        return []  # a scalar column (labels, metadata): one value per record is its form
    mean = r["payload_bytes"] / r["records"]
    if mean >= _TINY_RECORD_BYTES:
        return []
    return [
        f"records are tiny ({mean:.1f} B on average, under {_TINY_RECORD_BYTES} B): the index "
        f"costs {r['index_bytes'] / r['records']:.0f} B per record. Reshape the data into rows "
        "(e.g. loaderx convert --row-length 2048 for a token array) or store whole documents "
        "in a RaggedStore"
    ]


def _print_store(r: dict, indent: str = "") -> None:
    shape = f"{r['dtype']}{r['item_shape']}" if r["kind"] == "dense" else r["dtype"]
    dict_text = _fmt_bytes(r["dictionary_bytes"]) if r["dictionary_bytes"] else "none"
    approx = "~" if r["payload_estimated"] else ""
    overhead = f"{r['overhead_pct']:.1f}%" if r["overhead_pct"] is not None else "n/a"
    ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "n/a"
    lines = [
        ("kind", f"{r['kind']} ({shape})"),
        ("format", f"loaderx store format {r['format_version']}"),
        (
            "codec",
            f"{r['codec']}"
            + (f" (level {r['level']})" if r["codec"] != "raw" else "")
            + f", dictionary: {dict_text}",
        ),
        ("records", f"{r['records']:,}"),
        (
            "payload",
            f"{approx}{_fmt_bytes(r['payload_bytes'])}" + (" (estimated)" if approx else ""),
        ),
        (
            "stored",
            f"{_fmt_bytes(r['stored_bytes'])} = data {_fmt_bytes(r['data_bytes'])} "
            f"({_fmt_bytes(r['reclaimable_bytes'])} reclaimable) + index "
            f"{_fmt_bytes(r['index_bytes'])} + meta {_fmt_bytes(r['meta_bytes'])}",
        ),
        ("overhead", f"{overhead} of the payload (index and meta)"),
        ("ratio", f"{ratio} (payload / stored data)"),
    ]
    for key, value in lines:
        print(f"{indent}{key + ':':<10} {value}")
    for w in r["warnings"]:
        print(f"{indent}warning:   {w}")


def _is_dataset(path: str) -> bool:
    """A dataset directory (a manifest), local or at a URL."""
    if _objstore.is_url(path):
        return _openers.remote(path).exists(_objstore.join(path, "loaderx.json"))
    return os.path.isfile(os.path.join(path, "loaderx.json"))


def _abs(path: str) -> str:
    return path if _objstore.is_url(path) else os.path.abspath(path)


def _join(path: str, sub: str) -> str:
    return _objstore.join(path, sub) if _objstore.is_url(path) else os.path.join(path, sub)


def _dataset_report(path: str) -> dict:
    from .dataset import open_dataset, read_manifest

    manifest = read_manifest(path)
    if "splits" in manifest:
        return {
            "path": _abs(path),
            "splits": {
                s: _dataset_report(_join(path, sub)) for s, sub in manifest["splits"].items()
            },
        }
    opened = open_dataset(path)
    try:
        columns = {}
        for name, col in opened.items():
            stores = col.stream if hasattr(col, "text") else col  # a typed Column's store
            shards = stores.shards if hasattr(stores, "shards") else (stores,)
            reports = [store_report(s) for s in shards]
            total = _sum_reports(reports)
            total["shards"] = len(shards)
            total.update(_column_facts(path, name, manifest["columns"][name]))
            columns[name] = total
        scalars = _scalar_columns(opened)
    finally:
        for col in opened.values():
            col.close()
    return {
        "path": _abs(path),
        "manifest_version": manifest["version"],
        "rows": manifest["rows"],
        "source": manifest.get("source"),
        "columns": columns,
        "scalar_columns": scalars,
    }


def _scalar_columns(opened: dict) -> dict:
    """The columns a `loaderx select` predicate can name, with their SQL types."""
    from .subset import column_info

    out = {}
    for name, col in opened.items():
        info = column_info(name, col)
        if not info.type:
            continue
        entry: dict = {"type": info.type, "dtype": str(info.dtype), "nullable": info.nullable}
        zone = getattr(col, "timezone", None)
        if zone is not None:  # numpy's datetime64[ns] holds UTC; pandas names it so
            entry["timezone"] = zone
            entry["dtype"] = f"{str(info.dtype)[:-1]}, {zone}]"
        if info.categories is not None:
            entry["categories"] = list(info.categories)
        if info.labels is not None:
            entry["labels"] = list(info.labels)
        out[name] = entry
    return out


def _scalar_text(name: str, c: dict) -> str:
    if "categories" in c:
        cats = c["categories"]
        shown = ", ".join(map(str, cats[:5])) + (", ..." if len(cats) > 5 else "")
        what = f"categorical {c['type']} ({len(cats)}: {shown})"
    elif c["type"] == "string":
        what = "string"
    else:
        what = c["dtype"]
        if "labels" in c:
            what += f" (labels: {', '.join(map(str, c['labels'][:5]))}" \
                + (", ...)" if len(c["labels"]) > 5 else ")")
    return f"{name} {what}" + (", nullable" if c["nullable"] else "")


def _column_facts(path: str, name: str, entry: dict) -> dict:
    """What the manifest says of a column beyond its stores: label names,
    the images' mode, a role (``key``)."""
    from .dataset import labels

    facts: dict = {}
    names = labels(path, name)
    if names is not None:
        facts["labels"] = names
    for key in ("image_mode", "image_modes", "role", "timezone"):
        if key in entry:
            facts[key] = entry[key]
    return facts


def _source_files(source: dict) -> list[dict]:
    """The manifest's source files as ``{"path", "rows"}`` (rows may be
    missing: manifests before loaderx 0.2 listed names only, or a count)."""
    files = source.get("files")
    if not isinstance(files, list):
        return []
    out = []
    for f in files:
        if isinstance(f, str):
            out.append({"path": f})
        elif isinstance(f, dict) and isinstance(f.get("path"), str):
            out.append(f)
    return out


_FILES_SHOWN = 20
_LABELS_SHOWN = 10


def _print_source(src: dict, indent: str) -> None:
    print(f"{indent}source:    {src.get('type', '?')} {src.get('path') or ''}".rstrip())
    files = _source_files(src)
    for f in files[:_FILES_SHOWN]:
        rows = f.get("rows")
        span = f"rows {rows[0]:,}:{rows[1]:,}" if isinstance(rows, list) and len(rows) == 2 else ""
        print(f"{indent}  {f['path']}  {span}".rstrip())
    if len(files) > _FILES_SHOWN:
        print(f"{indent}  ... {len(files) - _FILES_SHOWN:,} more files (--json lists them all)")


def _print_facts(col: dict, indent: str) -> None:
    if "labels" in col:
        names = col["labels"]
        shown = ", ".join(names[:_LABELS_SHOWN]) + (", ..." if len(names) > _LABELS_SHOWN else "")
        print(f"{indent}{'labels:':<10} {shown} ({len(names):,} names; loaderx.labels(ds, name))")
    if "image_mode" in col:
        seen = ", ".join(f"{m} {n:,}" for m, n in (col.get("image_modes") or {}).items())
        print(f"{indent}{'images:':<10} {col['image_mode']}" + (f" (seen: {seen})" if seen else ""))
    if col.get("role") == "key":
        print(f"{indent}{'role:':<10} key (where each row came from)")
    if "timezone" in col:
        print(f"{indent}{'timezone:':<10} {col['timezone']} (the records are UTC instants)")


def _sum_reports(reports: list[dict]) -> dict:
    r = dict(reports[0])
    r["path"] = os.path.dirname(reports[0]["path"]) if len(reports) > 1 else reports[0]["path"]
    for key in (
        "records",
        "payload_bytes",
        "data_bytes",
        "reclaimable_bytes",
        "index_bytes",
        "meta_bytes",
        "stored_bytes",
    ):
        r[key] = sum(x[key] for x in reports)
    r["payload_estimated"] = any(x["payload_estimated"] for x in reports)
    live = r["data_bytes"] - r["reclaimable_bytes"]
    r["overhead_pct"] = (
        100.0 * (r["index_bytes"] + r["meta_bytes"]) / r["payload_bytes"]
        if r["payload_bytes"]
        else None
    )
    r["ratio"] = r["payload_bytes"] / live if live else None
    r["warnings"] = _warnings(r)
    return r


def _print_dataset(report: dict, indent: str = "") -> None:
    if "splits" in report:
        print(f"{indent}dataset:   {report['path']} ({len(report['splits'])} splits)")
        for split, sub in report["splits"].items():
            print(f"{indent}split {split!r}:")
            _print_dataset(sub, indent + "  ")
        return
    src = report.get("source") or {}
    print(f"{indent}dataset:   {report['path']}")
    print(f"{indent}format:    loaderx dataset manifest version {report['manifest_version']}")
    print(f"{indent}rows:      {report['rows']:,}")
    _print_source(src, indent)
    scalars = report.get("scalar_columns") or {}
    if scalars:
        print(f"{indent}scalar columns (loaderx select predicates name these):")
        for name, c in scalars.items():
            print(f"{indent}  {_scalar_text(name, c)}")
    for name, col in report["columns"].items():
        print(f"{indent}column {name!r}: {col['shards']} shard{'s' if col['shards'] != 1 else ''}")
        _print_facts(col, indent + "  ")
        _print_store(col, indent + "  ")


def _original_info(args) -> int:
    """`info` on a store written by the original loaderx: what it is and the
    command that converts it (a 1.7 store is also read in place, read-only)."""
    from ._original import is_store177
    from .converters._original177_src import summary177
    from .converters._original_src import original_summary

    in_place = is_store177(args.path)
    r = summary177(args.path) if in_place else original_summary(args.path)
    r["convert"] = f"loaderx convert {args.path} DEST"
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    shape = f"{r['dtype']}{r['shape'] if r['shape'] is not None else ''}" if r["dtype"] \
        else "bytes"
    codecs = ", ".join(f"{n:,} {c}" for c, n in r["codecs"].items()) or "none"
    layout = ("a store of the original loaderx 1.7, format version "
              f"{r['format_version']}; loaderx reads it in place (read-only: "
              "loaderx.open_store) and converts it" if in_place else
              "a store of the original loaderx 0.9, format version "
              f"{r['format_version']}; loaderx reads it only to convert it")
    for key, value in (
        ("path", r["path"]),
        ("layout", layout),
        ("kind", f"{r['kind']} ({shape}); converts to a {r['becomes']}"),
        ("records", f"{r['records']:,} in {r['chunks']} chunk file{'s' * (r['chunks'] != 1)} "
                    f"({codecs})"),
        ("payload", _fmt_bytes(r["payload_bytes"])),
        ("stored", f"{_fmt_bytes(r['stored_bytes'])}, dictionary "
                   f"{_fmt_bytes(r['dictionary_bytes']) if r['dictionary_bytes'] else 'none'}"),
        ("convert", f"{r['convert']}   (then open DEST with loaderx.open_dataset)"),
    ):
        print(f"{key + ':':<10} {value}")
    return 0


def cmd_info(args) -> int:
    from .converters._original_src import is_original_store
    from .dataset import open_store

    if not _objstore.is_url(args.path) and is_original_store(args.path):
        return _original_info(args)
    if _is_dataset(args.path):
        report = _dataset_report(args.path)
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            _print_dataset(report)
        return 0
    with open_store(args.path) as s:
        report = store_report(s)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"path:      {report['path']}")
        _print_store(report)
    return 0


# ----------------------------------------------------------------- convert


def _names(text: str | None) -> list | None:
    return [n for n in text.split(",") if n] if text else None


def cmd_convert(args) -> int:
    from .converters import convert_to_directory

    mode = "append" if args.append else "overwrite" if args.overwrite else "create"
    if args.dict and args.codec not in ("zstd", "zstd_dict"):
        raise ValueError(f"--dict is --codec zstd_dict; it contradicts --codec {args.codec}")
    fills = [col for col, _ in args.fill_null or []]
    twice = sorted({c for c in fills if fills.count(c) > 1})
    if twice:
        raise ValueError(f"--fill-null names {', '.join(twice)} more than once; give each "
                         "column one value")
    t0 = time.perf_counter()
    manifest = convert_to_directory(
        args.src,
        args.dst,
        codec="zstd_dict" if args.dict else args.codec,
        level=args.level,
        columns=_names(args.columns),
        skip_columns=_names(args.skip_columns),
        workers=args.workers,
        mode=mode,
        keep_encoded=args.keep_encoded,
        max_side=args.max_side,
        row_length=args.row_length,
        allow_tiny_records=args.allow_tiny_records,
        batch_bytes=int(args.batch_mib * (1 << 20)),
        progress=_progress_mode(args),
        keys=not args.no_keys,
        image_column=None if args.image_per_extension else args.image_column,
        cli=True,
        fill_null=dict(args.fill_null or []),
        dtype=args.dtype,
        item_shape=args.item_shape,
    )
    elapsed = time.perf_counter() - t0
    if "splits" in manifest:
        _say(args, f"converted {len(manifest['splits'])} splits into {args.dst} in {elapsed:.1f} s")
        return 0
    cols = ", ".join(
        f"{n} ({c['kind']} {c['dtype']}{c['item_shape'] if c['kind'] == 'dense' else ''}, "
        + (f"images {c['image_mode']}, " if "image_mode" in c else "")
        + f"{c['codec']}, {len(c['shards'])} shard{'s' if len(c['shards']) != 1 else ''})"
        for n, c in manifest["columns"].items()
    )
    _say(
        args,
        f"converted {manifest['rows']:,} rows in {elapsed:.1f} s "
        f"({manifest['rows'] / max(elapsed, 1e-9):,.0f} "
        f"rows/s) into {args.dst}: {cols}",
    )
    return 0


# ----------------------------------------------------------------- select


def cmd_select(args) -> int:
    from .subset import select

    if args.out is not None:
        _output_file(args.out, "--out")
    t0 = time.perf_counter()
    sub = select(args.dataset, args.where, engine=args.engine)
    elapsed = time.perf_counter() - t0
    view = next(iter(sub.values()))
    rows, total = view.rows, view.selection.total
    try:
        if args.out is not None:
            with open(args.out, "wb") as f:  # exactly there (np.save adds .npy to a name)
                np.save(f, rows)
        if args.count:
            print(len(rows))
            return 0
        share = f" ({100 * len(rows) / total:.2f}%)" if total else ""
        _say(args, f"selected {len(rows):,} of {total:,} records{share} in {elapsed:.2f} s "
                   f"({view.selection.engine})" + (f" -> {args.out}" if args.out else ""))
        if not args.out and len(rows):
            preview = ", ".join(map(str, rows[:10].tolist())) + (", ..." if len(rows) > 10 else "")
            _say(args, f"records: {preview} (--out FILE.npy saves them)")
    finally:
        for v in sub.values():
            v.close()
    return 0


# ----------------------------------------------------------------- verify, compact


def _stores_of(path: str) -> tuple[list, list]:
    """(stores, things to close) for a store path or a dataset directory."""
    from .converters._original_src import is_original_store
    from .dataset import open_dataset, open_store
    from .errors import NotAStoreError

    if is_original_store(path):
        raise NotAStoreError(f"{path} is a store written by the original loaderx, which loaderx "
                             f"reads (and verifies) but does not change: loaderx convert {path} "
                             "DEST makes a loaderx 3 dataset of it", path=path)

    if _is_dataset(path):
        opened = open_dataset(path)
        if opened and all(isinstance(v, dict) for v in opened.values()):
            cols = [c for split in opened.values() for c in split.values()]
        else:
            cols = list(opened.values())
        # A text or list column's mask is read through its column, not listed.
        folded = [c.valid for c in cols if getattr(c, "valid", None) is not None
                  and not any(c.valid is other for other in cols)]
        stores = [s for c in cols + folded for s in (c.shards if hasattr(c, "shards") else (c,))]
        return stores, cols
    store = open_store(path)
    return [store], [store]


def _each_store(args, label: str, action) -> tuple:
    from .converters._progress import Ticker, make_progress

    stores, owned = _stores_of(args.path)
    mode = _progress_mode(args)
    t0 = time.perf_counter()
    try:
        sizes = [s.stats()["chunk_bytes"] for s in stores]
        records = sum(len(s) for s in stores)
        before = sum(sizes)
        if len(stores) == 1:
            with Ticker(mode, label):
                action(stores[0])
        else:
            with make_progress(mode, float(before), label, "B") as bar:
                for s, size in zip(stores, sizes):
                    action(s)
                    bar.update(size)
        after = sum(s.stats()["chunk_bytes"] for s in stores)
    finally:
        for s in owned:
            s.close()
    return records, before, after, time.perf_counter() - t0, len(stores)


def _original_verify(args) -> int:
    """`verify` on a store written by the original loaderx: every entry and
    every frame decoded, then the command that converts it."""
    from .converters._original_src import OriginalSource
    from .converters._progress import make_progress
    from .converters._source import Options

    from ._original import is_store177
    from .converters._original177_src import Original177Source

    t0 = time.perf_counter()
    src: Any = (Original177Source if is_store177(args.path) else OriginalSource)(args.path,
                                                                                 Options())
    layout = "1.7" if isinstance(src, Original177Source) else "0.9"
    with make_progress(_progress_mode(args), float(src.rows), "verify", "records") as bar:
        for start in range(0, src.rows, 4096):
            stop = min(start + 4096, src.rows)
            if layout == "1.7":
                src.records(start, stop)
            else:
                src.read_all(start, stop)
            bar.update(stop - start)
    if layout == "1.7":
        src.close()
    else:
        src._close()
    _say(args, f"ok: {src.rows:,} records of a store written by the original loaderx {layout} "
               f"verified in {time.perf_counter() - t0:.2f} s; convert it with: loaderx convert "
               f"{args.path} DEST")
    return 0


def cmd_verify(args) -> int:
    from .converters._original_src import is_original_store

    if is_original_store(args.path):
        return _original_verify(args)
    records, _, _, dt, count = _each_store(args, "verify", lambda s: s.verify())
    _say(
        args,
        f"ok: {records:,} records in {count} store{'s' if count != 1 else ''} "
        f"verified in {dt:.2f} s",
    )
    return 0


def cmd_compact(args) -> int:
    _, before, after, dt, _ = _each_store(args, "compact", lambda s: s.compact())
    _say(
        args,
        f"compacted in {dt:.2f} s: {_fmt_bytes(before)} -> {_fmt_bytes(after)} "
        f"(reclaimed {_fmt_bytes(before - after)})",
    )
    return 0


# ----------------------------------------------------------------- cache


def cmd_cache(args) -> int:
    from . import _cachedir, remote

    root = args.dir if args.dir is not None else remote.Config().cache_dir
    if args.clear:
        freed = _cachedir.clear(root)
        _say(args, f"cleared {os.path.realpath(root)}: {_fmt_bytes(freed)} freed")
        return 0
    r = _cachedir.describe(root)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    users = r["processes"]
    pids = ", ".join(str(u) for u in users if u >= 0)
    who = f"{len(users)} process{'es' if len(users) > 1 else ''}" if users else "no process"
    if pids:
        who += f" (pid {pids})"
    n = len(r["replicas"])
    print(f"{r['root']}: {_fmt_bytes(r['cached_bytes'])} cached in {n} "
          f"replica{'s' if n != 1 else ''} ({_fmt_bytes(r['disk_bytes'])} on disk); "
          f"in use by {who}")
    for rep in r["replicas"]:
        if "error" in rep:
            print(f"  {rep['url'] or rep['key']}: unreadable ({rep['error']})")
            continue
        share = rep["cached_bytes"] / rep["size_bytes"] if rep["size_bytes"] else 1.0
        print(f"  {rep['url'] or rep['key']}: {_fmt_bytes(rep['cached_bytes'])} of "
              f"{_fmt_bytes(rep['size_bytes'])} ({share:.0%}), {rep['records']:,} records")
    if r["uploads_live"]:
        print(f"  conversions uploading through it: {r['uploads_live']}")
    if r["uploads_left"]:
        print(f"  left by killed conversions: {r['uploads_left']} staging "
              f"director{'ies' if r['uploads_left'] > 1 else 'y'} "
              f"({_fmt_bytes(r['uploads_left_bytes'])}; loaderx cache --clear removes them)")
    return 0


# ----------------------------------------------------------------- train-dict


def _refuse_url_output(path: str, flag: str) -> None:
    if _objstore.is_url(path):
        raise InvalidArgumentError(f"{path}: {flag} is a local file (loaderx writes no single "
                                   "files to object storage); write it here, then upload it",
                                   path=path)


def _output_file(path: str, flag: str) -> str:
    """The file `flag` names, checked before any work: a local regular file
    (or none yet), written exactly there, and never inside a loaderx store
    or dataset, whose own files it would replace."""
    _refuse_url_output(path, flag)
    if not path:
        raise InvalidArgumentError(f"{flag} needs a file name")
    full = os.path.abspath(path)
    if os.path.lexists(full) and (os.path.islink(full) or not os.path.isfile(full)):
        raise InvalidArgumentError(f"{path}: {flag} exists and is not a regular file; name a "
                                   "new file or a file to replace", path=path)
    folder = os.path.dirname(full)
    while True:
        what = "store" if is_store_dir(folder) else \
            "dataset" if os.path.isfile(os.path.join(folder, MANIFEST_NAME)) else None
        if what:
            raise InvalidArgumentError(
                f"{path}: {flag} is inside the loaderx {what} {folder}, whose files it could "
                "replace; write it elsewhere", path=path)
        parent = os.path.dirname(folder)
        if parent == folder:
            return path
        folder = parent


def _dict_source(args):
    """(training source, things to close) for a .npy, a store or a dataset column."""
    from .dataset import open_dataset, open_store

    if args.src.endswith(".npy"):
        from .converters._numpy_src import npy_header

        npy_header(args.src)  # a damaged or object-holding file is refused by name
        return np.load(args.src, mmap_mode="r", allow_pickle=False), []
    if _is_dataset(args.src):
        opened = open_dataset(args.src)
        name = args.column or next(iter(opened))
        if name not in opened:
            for c in opened.values():
                c.close()
            raise KeyError(f"{args.src}: no column {name!r}; it has {list(opened)}")
        col = opened[name]
        return (col.shards[0] if hasattr(col, "shards") else col), list(opened.values())
    store = open_store(args.src)
    return store, [store]


def cmd_train_dict(args) -> int:
    from .converters._progress import Ticker
    from .dictionary import check_dict_size
    from .zrecord import train_dict

    if args.size is not None:
        check_dict_size(args.size)  # (before the sampling starts)
    _output_file(args.output, "-o/--output")
    if os.path.isfile(args.output) and os.path.exists(args.src) \
            and os.path.samefile(args.src, args.output):
        raise InvalidArgumentError(f"{args.output}: -o/--output is the source it trains on",
                                   path=args.output)
    source, owned = _dict_source(args)
    t0 = time.perf_counter()
    try:
        with Ticker(_progress_mode(args), f"train-dict ({args.tier})"):
            data = train_dict(source, tier=args.tier, size=args.size)
    finally:
        for s in owned:
            s.close()
    with open(args.output, "wb") as f:
        f.write(data)
    _say(
        args,
        f"trained a {_fmt_bytes(len(data))} dictionary in {time.perf_counter() - t0:.1f} s: "
        f"{args.output} (use it with codec='zstd_dict', dict_bytes=open(...).read())",
    )
    return 0


# ----------------------------------------------------------------- bench, demo


def cmd_bench(args) -> int:
    """Quick local figures: dense random gather vs a memory-mapped .npy."""
    from .zrecord import DenseStore

    rng = np.random.default_rng(0)
    rows, shape = 20000, (3072,)
    base = np.cumsum(
        rng.integers(-3, 4, size=(rows,) + shape, dtype=np.int16), axis=1, dtype=np.int16
    )
    with tempfile.TemporaryDirectory() as tmp:
        np.save(f"{tmp}/x.npy", base)
        mm = np.load(f"{tmp}/x.npy", mmap_mode="r")
        stores = {c: DenseStore(f"{tmp}/{c}", base.dtype, shape, codec=c) for c in ("raw", "zstd")}
        for s in stores.values():
            s.append(base)
        batches = [rng.integers(0, rows, 256) for _ in range(50)]
        mib = 256 * base[0].nbytes / 2**20

        def timeit(fn) -> float:
            times = []
            for b in batches:
                t0 = time.perf_counter()
                fn(b)
                times.append(time.perf_counter() - t0)
            return float(np.median(times))

        t_np = timeit(lambda b: mm[b])
        print(f"records: {rows} x {base[0].nbytes} B, batch 256, median of {len(batches)}")
        print(f"  mmap .npy fancy index : {mib / t_np:8.0f} MiB/s")
        for c, s in stores.items():
            assert np.array_equal(s[batches[0]], base[batches[0]])
            t = timeit(lambda b, s=s: s[b])
            ratio = s.stats()["chunk_bytes"] / base.nbytes
            print(
                f"  loaderx {c:<14}: {mib / t:8.0f} MiB/s  ({t_np / t:.2f}x mmap, "
                f"stored {ratio:.2f} of raw)"
            )
            s.close()
    print(
        "full suite with contenders: python scripts/bench.py all (needs pip install -e '.[bench]')"
    )
    return 0


def cmd_demo(args) -> int:
    from . import _demo

    return _demo.run(args.rest)


# ----------------------------------------------------------------- parser


def _common_options() -> tuple:
    """The options several commands share: -q, and --timeout for URLs."""
    quiet = argparse.ArgumentParser(add_help=False)
    quiet.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="no progress and no summary",
    )
    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument(
        "--timeout", type=_seconds, default=None, metavar="SECONDS",
        help="a URL's request timeout (default 60); a server that never answers fails after "
        f"{_objstore.ATTEMPTS} of them",
    )
    return quiet, remote


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    quiet, remote = _common_options()
    ap = argparse.ArgumentParser(
        prog="loaderx", description="loaderx record stores, datasets and loader"
    )
    ap.add_argument("--version", action="version", version=f"loaderx {__version__}")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress and no summary")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "info", parents=[quiet, remote],
        help="records, sizes, index overhead, codec of a store or dataset"
    )
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(fn=cmd_info)
    _convert_parser(sub, [quiet, remote])
    p = sub.add_parser(
        "select", parents=[quiet, remote],
        help="the records of a dataset where a SQL predicate holds",
        description="WHERE: a SQL boolean expression over the scalar columns (loaderx info "
        "lists them), e.g. \"label = 3 AND score > 0.5\"; subqueries need DuckDB.",
    )
    p.add_argument("dataset")
    p.add_argument("where")
    p.add_argument("--count", action="store_true", help="print only the number of records")
    p.add_argument("--out", help="save the record indices (sorted int64) to this .npy file")
    p.add_argument("--engine", choices=["arrow", "duckdb"], default=None,
                   help="pyarrow.compute or DuckDB (default: pyarrow, DuckDB for SQL beyond it)")
    p.set_defaults(fn=cmd_select)
    for name, fn, text in (
        ("verify", cmd_verify, "check every record of a store or dataset"),
        ("compact", cmd_compact, "reclaim deleted bytes of a store or dataset"),
    ):
        p = sub.add_parser(name, parents=[quiet, remote] if name == "verify" else [quiet],
                           help=text)
        p.add_argument("path")
        p.set_defaults(fn=fn)
    p = sub.add_parser(
        "train-dict", parents=[quiet, remote],
        help="train a zstd dictionary from a store, .npy or dataset",
    )
    p.add_argument("src", help="a store, a .npy file or a dataset directory")
    p.add_argument("-o", "--output", required=True, help="file to write the dictionary to")
    p.add_argument("--tier", default="balanced", choices=["fast", "balanced", "max"])
    p.add_argument("--size", type=int, default=None, help="dictionary bytes (overrides the tier's)")
    p.add_argument("--column", default=None, help="dataset column (default: the first)")
    p.set_defaults(fn=cmd_train_dict)
    p = sub.add_parser(
        "cache", parents=[quiet], help="what a remote datasets' cache directory holds; --clear",
        description="DIR: a cache directory (default: $LOADERX_CACHE_DIR, else "
        "$XDG_CACHE_HOME/loaderx, else ~/.cache/loaderx). "
        "--clear removes every cached replica and what killed conversions left, and is refused "
        "while a process uses the cache.",
    )
    p.add_argument("dir", nargs="?", default=None)
    p.add_argument("--clear", action="store_true", help="empty the cache")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(fn=cmd_cache)
    p = sub.add_parser("bench", parents=[quiet], help="quick local gather figures")
    p.set_defaults(fn=cmd_bench)
    sub.add_parser("demo", help="build a small store and run the loader (options: demo --help)")
    return ap


def _fill_null(text: str) -> tuple:
    """--fill-null COL=VALUE: VALUE as a number or bool when it reads as one."""
    col, eq, value = text.partition("=")
    if not eq or not col:
        raise argparse.ArgumentTypeError(f"expected COL=VALUE, got {text!r}")
    parsed: object = value
    for cast in (int, float):
        try:
            parsed = cast(value)
            break
        except ValueError:
            continue
    if value.lower() in ("true", "false"):
        parsed = value.lower() == "true"
    return col, parsed


def _seconds(text: str) -> float:
    """--timeout: a finite number of seconds above 0."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text!r}")
    return seconds


def _batch_mib(text: str) -> float:
    """--batch-mib: a finite size of at least one byte."""
    try:
        mib = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(mib) or mib * (1 << 20) < 1:
        raise argparse.ArgumentTypeError(f"must be a finite size of at least 1 byte, got {text!r}")
    return mib


_CONVERT_TEXT = (
    "SRC: .npy/.npz, Parquet/Arrow/Feather files or directories, a Hugging Face save_to_disk "
    "directory, an image folder (class/*.jpg|png), WebDataset .tar shards, a store written by "
    "the original loaderx 0.9/1.7 (meta.zr), or a loaderx dataset or store, local or at a URL "
    "(s3://, gs://, az://, https://: a local copy of a remote dataset). DST: a new dataset "
    "directory, or a URL (s3://, gs://, az://) it is uploaded to.")


def _convert_parser(sub, parents: list) -> None:
    p = sub.add_parser(
        "convert",
        parents=parents,
        help="convert data into a loaderx dataset directory",
        description=_CONVERT_TEXT,
    )
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument(
        "--codec", default="zstd", choices=["raw", "zstd", "zstd_dict"],
        help="zstd_dict: train a zstd dictionary per column (small records)",
    )
    p.add_argument(
        "--level", type=int, default=None, help="zstd level (default 3; 19 with a dictionary)"
    )
    p.add_argument("--dict", action="store_true", help="the same as --codec zstd_dict")
    p.add_argument("--columns", help="comma-separated columns to convert (default: all)")
    p.add_argument("--skip-columns", help="comma-separated columns to leave out")
    p.add_argument(
        "--workers", type=int, default=None, help="processes, one shard each (default 1)"
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument("--append", action="store_true", help="add the rows to an existing dataset")
    group.add_argument(
        "--overwrite", action="store_true", help="replace an existing dataset or store"
    )
    _image_arguments(p)
    p.add_argument(
        "--row-length", type=_row_length, default=None,
        help="cut 1-D arrays into rows of this length"
    )
    p.add_argument("--allow-tiny-records", action="store_true",
                   help="accepted for compatibility (scalar columns need no flag)")
    p.add_argument("--fill-null", action="append", type=_fill_null, metavar="COL=VALUE",
                   help="store COL's nulls as VALUE instead of keeping a COL.valid mask "
                   "(repeatable)")
    p.add_argument(
        "--no-keys",
        action="store_true",
        help="no 'key' column (a tar sample's __key__, an image's path under the folder)",
    )
    p.add_argument(
        "--batch-mib",
        type=_batch_mib,
        default=16.0,
        help="MiB read and written at a time (default 16)",
    )
    p.add_argument("--dtype", default=None, help="an original loaderx store's record dtype "
                   "(where its schema.msgpack cannot be read)")
    p.add_argument("--item-shape", type=_shape, default=None,
                   help="with --dtype: dense records of this shape, e.g. 3,32,32 ('' for scalars)")
    p.set_defaults(fn=cmd_convert)


def _image_arguments(p) -> None:
    """convert's options for image columns."""
    p.add_argument(
        "--keep-encoded", action="store_true", help="keep images as encoded bytes (Zrecord)"
    )
    p.add_argument(
        "--max-side", type=int, default=None, metavar="PIXELS",
        help="with --keep-encoded: shrink larger images to this longer side, encoded again once",
    )
    images = p.add_mutually_exclusive_group()
    images.add_argument(
        "--image-column",
        default="image",
        metavar="NAME",
        help="WebDataset: the column of each sample's image, jpg, png, webp... (default image)",
    )
    images.add_argument(
        "--image-per-extension",
        action="store_true",
        help="WebDataset: one column per image extension instead",
    )


def _row_length(text: str) -> int:
    """--row-length: a whole number of elements, 1 to 2**40."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= n <= 1 << 40:
        raise argparse.ArgumentTypeError(f"must be 1 to 2**40 elements, got {text}")
    return n


def _shape(text: str) -> tuple:
    """--item-shape: comma-separated non-negative ints ('' for a scalar)."""
    try:
        dims = tuple(int(d) for d in text.replace(" ", "").split(",") if d)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ints: {text!r}") from None
    if any(d < 0 for d in dims):
        raise argparse.ArgumentTypeError(f"dimensions must be >= 0, got {text!r}")
    return dims


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    first = next((i for i, a in enumerate(argv) if not a.startswith("-")), len(argv))
    if argv[first:first + 1] == ["demo"] and not {"-h", "--help", "--version"} & set(argv[:first]):
        # The demo parses its own options (--records, --steps, ...), and says
        # which of the ones before it (-q) it does not take.
        args = argparse.Namespace(cmd="demo", fn=cmd_demo, rest=argv[:first] + argv[first + 1:])
    else:
        args = _parser().parse_args(argv)
    from .errors import LoaderxError

    try:
        with warnings.catch_warnings(), _remote_settings(args):
            warnings.showwarning = _warning_printer(args)
            return args.fn(args)
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        print(f"loaderx {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except (LoaderxError, OSError, ValueError, TypeError, KeyError, OverflowError) as e:
        text = " ".join(str(e.args[0] if isinstance(e, KeyError) and e.args else e).split())
        print(f"loaderx {args.cmd}: {text}", file=sys.stderr)
        return 1


@contextlib.contextmanager
def _remote_settings(args) -> Iterator[None]:
    """--timeout for the URLs the command reads, and a line on stderr when a
    server keeps a request waiting (instead of minutes of silence)."""
    from . import remote

    timeout = getattr(args, "timeout", None)
    settings = {} if timeout is None else {"storage_options": {"timeout": f"{timeout:g}s"}}

    def notice(url: str, waited: float, budget: float) -> None:
        print(f"loaderx {args.cmd}: {url}: no answer after {waited:g} s; still trying (it gives "
              f"up after {budget:g} s; --timeout SECONDS shortens that)", file=sys.stderr)
    before, _objstore.slow_notice = _objstore.slow_notice, notice
    try:
        with remote.configured(**settings):
            yield
    finally:
        _objstore.slow_notice = before


def _warning_printer(args):
    """`warnings.showwarning` for the CLI: one line naming the input, never
    the loaderx source line that raised it."""
    where = getattr(args, "src", None) or getattr(args, "path", None)

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        text = " ".join(str(message).split())
        prefix = f"{where}: " if where and not text.startswith(str(where)) else ""
        print(f"loaderx {args.cmd}: warning: {prefix}{text}", file=sys.stderr)

    return show


def _stdout_closed() -> int:
    """The reader of stdout went away (``| head``): stop quietly, as Unix
    tools killed by SIGPIPE do, with nothing left to flush at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


if __name__ == "__main__":
    sys.exit(main())
