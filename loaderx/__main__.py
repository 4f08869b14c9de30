"""Command line: ``loaderx {info,convert,verify,compact,train-dict,bench,demo}``
(also ``python -m loaderx``), and ``loaderx --version``.

Paths may be URLs (``s3://``, ``gs://``, ``az://``, ``https://``; settings from
the environment, ``LOADERX_CACHE_DIR`` and ``LOADERX_CACHE_LIMIT`` for the cache):
``info`` and ``verify`` read through the cache, ``convert`` writes to one.

Long commands show a progress bar with rate and ETA on a terminal and plain
periodic log lines otherwise; ``--quiet`` silences both. Exit codes: 0 ok, 1 a
loaderx error (one line on stderr, no traceback), 2 a usage error, 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

from . import _objstore

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
    if not r["records"]:
        return []
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
        from .remote import exists

        return exists(_objstore.join(path, "loaderx.json"))
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
            shards = col.shards if hasattr(col, "shards") else (col,)
            reports = [store_report(s) for s in shards]
            total = _sum_reports(reports)
            total["shards"] = len(shards)
            columns[name] = total
    finally:
        for col in opened.values():
            col.close()
    return {
        "path": _abs(path),
        "rows": manifest["rows"],
        "source": manifest.get("source"),
        "columns": columns,
    }


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
    print(f"{indent}rows:      {report['rows']:,}")
    print(f"{indent}source:    {src.get('type', '?')} {src.get('path') or ''}".rstrip())
    for name, col in report["columns"].items():
        print(f"{indent}column {name!r}: {col['shards']} shard{'s' if col['shards'] != 1 else ''}")
        _print_store(col, indent + "  ")


def cmd_info(args) -> int:
    from .dataset import open_store

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
    t0 = time.perf_counter()
    manifest = convert_to_directory(
        args.src,
        args.dst,
        codec=args.codec,
        level=args.level,
        dict=args.dict,
        columns=_names(args.columns),
        skip_columns=_names(args.skip_columns),
        workers=args.workers,
        mode=mode,
        keep_encoded=args.keep_encoded,
        row_length=args.row_length,
        allow_tiny_records=args.allow_tiny_records,
        batch_bytes=int(args.batch_mib * (1 << 20)),
        progress=_progress_mode(args),
        cli=True,
    )
    elapsed = time.perf_counter() - t0
    if "splits" in manifest:
        _say(args, f"converted {len(manifest['splits'])} splits into {args.dst} in {elapsed:.1f} s")
        return 0
    cols = ", ".join(
        f"{n} ({c['kind']} {c['dtype']}{c['item_shape'] if c['kind'] == 'dense' else ''}, "
        f"{c['codec']}, {len(c['shards'])} shard{'s' if len(c['shards']) != 1 else ''})"
        for n, c in manifest["columns"].items()
    )
    _say(
        args,
        f"converted {manifest['rows']:,} rows in {elapsed:.1f} s "
        f"({manifest['rows'] / max(elapsed, 1e-9):,.0f} "
        f"rows/s) into {args.dst}: {cols}",
    )
    return 0


# ----------------------------------------------------------------- verify, compact


def _stores_of(path: str) -> tuple[list, list]:
    """(stores, things to close) for a store path or a dataset directory."""
    from .dataset import open_dataset, open_store

    if _is_dataset(path):
        opened = open_dataset(path)
        if opened and all(isinstance(v, dict) for v in opened.values()):
            cols = [c for split in opened.values() for c in split.values()]
        else:
            cols = list(opened.values())
        stores = [s for c in cols for s in (c.shards if hasattr(c, "shards") else (c,))]
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


def cmd_verify(args) -> int:
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


# ----------------------------------------------------------------- train-dict


def _dict_source(args):
    """(training source, things to close) for a .npy, a store or a dataset column."""
    from .dataset import open_dataset, open_store

    if args.src.endswith(".npy"):
        from .converters._numpy_src import npy_header

        npy_header(args.src)  # a damaged or object-holding file is refused by name
        return np.load(args.src, mmap_mode="r", allow_pickle=False), []
    if os.path.isfile(os.path.join(args.src, "loaderx.json")):
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
    from .zrecord import train_dict

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


def _parser() -> argparse.ArgumentParser:
    from . import __version__

    quiet = argparse.ArgumentParser(add_help=False)
    quiet.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,
        help="no progress and no summary",
    )
    ap = argparse.ArgumentParser(
        prog="loaderx", description="loaderx record stores, datasets and loader"
    )
    ap.add_argument("--version", action="version", version=f"loaderx {__version__}")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress and no summary")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "info", parents=[quiet], help="records, sizes, index overhead, codec of a store or dataset"
    )
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(fn=cmd_info)
    _convert_parser(sub, quiet)
    for name, fn, text in (
        ("verify", cmd_verify, "check every record of a store or dataset"),
        ("compact", cmd_compact, "reclaim deleted bytes of a store or dataset"),
    ):
        p = sub.add_parser(name, parents=[quiet], help=text)
        p.add_argument("path")
        p.set_defaults(fn=fn)
    p = sub.add_parser(
        "train-dict", parents=[quiet], help="train a zstd dictionary from a store, .npy or dataset"
    )
    p.add_argument("src", help="a store, a .npy file or a dataset directory")
    p.add_argument("-o", "--output", required=True, help="file to write the dictionary to")
    p.add_argument("--tier", default="balanced", choices=["fast", "balanced", "max"])
    p.add_argument("--size", type=int, default=None, help="dictionary bytes (overrides the tier's)")
    p.add_argument("--column", default=None, help="dataset column (default: the first)")
    p.set_defaults(fn=cmd_train_dict)
    p = sub.add_parser("bench", parents=[quiet], help="quick local gather figures")
    p.set_defaults(fn=cmd_bench)
    sub.add_parser("demo", help="build a small store and run the loader (options: demo --help)")
    return ap


def _batch_mib(text: str) -> float:
    """--batch-mib: a finite size of at least one byte."""
    try:
        mib = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(mib) or mib * (1 << 20) < 1:
        raise argparse.ArgumentTypeError(f"must be a finite size of at least 1 byte, got {text!r}")
    return mib


def _convert_parser(sub, quiet) -> None:
    p = sub.add_parser(
        "convert",
        parents=[quiet],
        help="convert data into a loaderx dataset directory",
        description="SRC: .npy/.npz, Parquet/Arrow/Feather files or directories, a "
        "Hugging Face save_to_disk directory, an image folder (class/*.jpg|png) or "
        "WebDataset .tar shards. DST: a new dataset directory.",
    )
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--codec", default="zstd", choices=["raw", "zstd"])
    p.add_argument("--level", type=int, default=3, help="zstd level (default 3)")
    p.add_argument(
        "--dict", action="store_true", help="train a zstd dictionary per column (small records)"
    )
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
    p.add_argument(
        "--keep-encoded", action="store_true", help="keep images as encoded bytes (Zrecord)"
    )
    p.add_argument(
        "--row-length", type=int, default=None, help="cut 1-D arrays into rows of this length"
    )
    p.add_argument("--allow-tiny-records", action="store_true", help="accept rows under 64 bytes")
    p.add_argument(
        "--batch-mib",
        type=_batch_mib,
        default=16.0,
        help="MiB read and written at a time (default 16)",
    )
    p.set_defaults(fn=cmd_convert)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["demo"]:
        # The demo parses its own options (--records, --steps, ...).
        args = argparse.Namespace(cmd="demo", fn=cmd_demo, rest=argv[1:])
    else:
        args = _parser().parse_args(argv)
    from .errors import ZrecordError

    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print(f"loaderx {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except (ZrecordError, OSError, ValueError, TypeError, KeyError) as e:
        text = " ".join(str(e.args[0] if isinstance(e, KeyError) and e.args else e).split())
        print(f"loaderx {args.cmd}: {text}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
