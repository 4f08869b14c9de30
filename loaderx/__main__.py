"""Command line: ``python -m loaderx {info,convert,verify,compact,bench,demo}``."""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np


def _progress(label: str):
    """A progress callback that draws on a TTY and stays silent otherwise."""
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        pct = 100.0 * done / max(total, 1)
        sys.stderr.write(f"\r{label}: {done}/{total} ({pct:5.1f}%)")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return show


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def cmd_info(args) -> int:
    from .dataset import open_store
    with open_store(args.path) as s:
        st = s.stats()
        print(f"path:        {s.path}")
        print(f"kind:        {s.kind}")
        print(f"dtype:       {s.dtype}")
        print(f"item_shape:  {s.item_shape}")
        print(f"codec:       {s.codec} (level {s.level})")
        print(f"records:     {st['records']}")
        print(f"stored:      {_fmt_bytes(st['chunk_bytes'])} ({_fmt_bytes(st['reclaimable'])} reclaimable)")
        if s.kind == "dense":
            logical = st["records"] * s.record_bytes
            ratio = logical / st["live_bytes"] if st["live_bytes"] else float("nan")
            print(f"logical:     {_fmt_bytes(logical)}")
            print(f"ratio:       {ratio:.2f}x")
    return 0


def cmd_convert(args) -> int:
    from .dataset import from_numpy
    arr = np.load(args.src, mmap_mode="r")
    t0 = time.perf_counter()
    dict_bytes = None
    if args.codec == "zstd_dict":
        from .zrecord import train_dict
        dict_bytes = train_dict(arr, tier="balanced")
    with from_numpy(args.dst, arr, codec=args.codec, dict_bytes=dict_bytes,
                    progress=_progress("convert")) as s:
        st = s.stats()
        dt = time.perf_counter() - t0
        print(f"converted {len(s)} records of {arr.dtype}{list(arr.shape[1:])} in {dt:.2f} s "
              f"({arr.nbytes / dt / 2**20:.0f} MiB/s): {_fmt_bytes(arr.nbytes)} -> {_fmt_bytes(st['chunk_bytes'])} "
              f"(ratio {arr.nbytes / max(st['chunk_bytes'], 1):.2f}x)")
    return 0


def cmd_verify(args) -> int:
    from .dataset import open_store
    t0 = time.perf_counter()
    with open_store(args.path) as s:
        s.verify()
        print(f"ok: {len(s)} records verified in {time.perf_counter() - t0:.2f} s")
    return 0


def cmd_compact(args) -> int:
    from .dataset import open_store
    with open_store(args.path) as s:
        before = s.stats()
        t0 = time.perf_counter()
        s.compact()
        after = s.stats()
        print(f"compacted in {time.perf_counter() - t0:.2f} s: {_fmt_bytes(before['chunk_bytes'])} -> "
              f"{_fmt_bytes(after['chunk_bytes'])} (reclaimed {_fmt_bytes(before['chunk_bytes'] - after['chunk_bytes'])})")
    return 0


def cmd_bench(args) -> int:
    """Quick local figures: dense random gather vs a memory-mapped .npy."""
    from .zrecord import DenseStore
    rng = np.random.default_rng(0)
    rows, shape = 20000, (3072,)
    base = np.cumsum(rng.integers(-3, 4, size=(rows,) + shape, dtype=np.int16), axis=1, dtype=np.int16)
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
            print(f"  loaderx {c:<14}: {mib / t:8.0f} MiB/s  ({t_np / t:.2f}x mmap, stored {ratio:.2f} of raw)")
            s.close()
    print("full suite with contenders: python scripts/bench.py all (needs pip install -e '.[bench]')")
    return 0


def cmd_demo(args) -> int:
    from . import _demo
    return _demo.run(args.rest)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="loaderx", description="loaderx record stores and data loader")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info", help="identity, length, codec, sizes, compression ratio")
    p.add_argument("path")
    p.set_defaults(fn=cmd_info)
    p = sub.add_parser("convert", help="convert a .npy file into a DenseStore")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--codec", default="zstd", choices=["raw", "zstd", "zstd_dict"])
    p.set_defaults(fn=cmd_convert)
    p = sub.add_parser("verify", help="check every record")
    p.add_argument("path")
    p.set_defaults(fn=cmd_verify)
    p = sub.add_parser("compact", help="reclaim deleted bytes")
    p.add_argument("path")
    p.set_defaults(fn=cmd_compact)
    p = sub.add_parser("bench", help="quick local figures")
    p.set_defaults(fn=cmd_bench)
    p = sub.add_parser("demo", help="build a small store and run the loader (options: demo --help)")
    p.set_defaults(fn=cmd_demo)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["demo"]:
        # The demo parses its own options (--records, --steps, ...).
        args = argparse.Namespace(cmd="demo", fn=cmd_demo, rest=argv[1:])
    else:
        args = ap.parse_args(argv)
    from .errors import ZrecordError
    try:
        return args.fn(args)
    except (ZrecordError, OSError, ValueError, TypeError) as e:
        print(f"loaderx {args.cmd}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
