"""The remote bench's cold rows on their own: obstore's get_ranges of a
round's records (their stored ranges) against loaderx reading the same
batches from a fresh cache: as by default (the index comes whole once its
GETs so far would be worth it: a small one with the first batch, one over
16 MiB in the background), with the background fetch once the data
outweighs the index 4x only (as at 3930a1e, but in rounds of concurrent
requests since 2026-12-04), without either (each batch's index blocks only,
as before 6f72b20), and with the whole index fetched before the round (only
the records' own GETs timed).

    python scripts/probe_remote_cold.py [--size small] [--codec zstd]
        [--rounds 5] [--batches 20] [--ahead 4]

Starts SeaweedFS on the data a `python scripts/bench.py remote` run keeps in
bench-out/remote (building and uploading the dataset when it is missing).
Where the server's data outgrows memory its pages are dropped before every
reader, as the bench does. Prints MiB/s of payload per round and the median
ratios to get_ranges.
"""
import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]
import bench_remote as br  # noqa: E402

import loaderx  # noqa: E402
from loaderx import _cachedir  # noqa: E402

READERS = ("get_ranges", "loaderx", "loaderx, index after 4x its bytes in data",
           "loaderx, batch index blocks only", "loaderx, index fetched first")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=("small", "default"), default="default")
    ap.add_argument("--codec", choices=("raw", "zstd"), default="raw")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--ahead", type=int, default=0,
                    help="prefetch this many steps ahead (the bench's prefetch row: 4)")
    args = ap.parse_args()
    remote = ROOT / "bench-out" / "remote"
    data = remote / f"weed-data-{br.UPLOAD_PART >> 20}m"
    server = br.Server("weed", data, print)
    work = Path(tempfile.mkdtemp(prefix="probe-remote-cold-"))
    n = br.SIZES[args.size][0]
    name = f"{'dsz' if args.codec == 'zstd' else 'ds'}-{n}"
    url = f"s3://{br.BUCKET}/{name}"
    make = br.zrecords if args.codec == "zstd" else br.records
    rates: dict = {k: [] for k in READERS}
    policy = dict(_cachedir.CACHE_POLICY)
    try:
        br._build_local(remote / name, n, codec=args.codec)
        br._upload(remote / name, url, server.options)
        cold = br._outgrows_memory(data)

        def drop() -> None:
            if cold:
                br._drop_server_pages(data)
        if not cold:
            br._warm_server(server.options, [name], print)
        rng = np.random.default_rng(11)
        for r in range(args.rounds):
            batches = [rng.choice(n, br.BATCH, replace=False) for _ in range(args.batches)]
            where = (br.stored_ranges(url, server.options, batches, work / "ranges")
                     if args.codec == "zstd" else None)
            payload = args.batches * br.BATCH * br.REC / (1 << 20)
            for k in range(len(READERS)):  # the readers' order turns every round
                key = READERS[(k + r) % len(READERS)]
                drop()
                if key == "get_ranges":
                    t = time.perf_counter()
                    br._get_ranges(url, server.options, batches, where)
                    rates[key].append(payload / (time.perf_counter() - t))
                    continue
                fresh = work / "cache"
                shutil.rmtree(fresh, ignore_errors=True)
                # The policy a cache takes at its open (src/Cache.zig, Policy).
                if key == "loaderx, batch index blocks only":
                    _cachedir.CACHE_POLICY["whole_index_after"] = 1 << 62
                if key in ("loaderx, batch index blocks only",
                           "loaderx, index after 4x its bytes in data"):
                    _cachedir.CACHE_POLICY["index_request_bytes"] = 0  # (never whole with a batch)
                try:
                    col = loaderx.open_dataset(url, cache_dir=str(fresh),
                                               storage_options=server.options)["x"]
                    if key == "loaderx, index fetched first":
                        col._remote.all_index()
                        drop()
                    t = time.perf_counter()
                    if args.ahead:
                        got = br._stand_in_loop(col, batches, args.ahead)[-1]
                    else:
                        for b in batches:
                            got = col.gather(b)
                    rates[key].append(payload / (time.perf_counter() - t))
                finally:
                    _cachedir.CACHE_POLICY.update(policy)
                assert np.array_equal(got, make(batches[-1]))
                col.close()
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in rates.items())
                  + " MiB/s", flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    base = rates["get_ranges"]
    for key in READERS[1:]:
        ratios = [a / b for a, b in zip(rates[key], base)]
        print(f"{key} / get_ranges: median {statistics.median(ratios):.2f}x "
              f"({', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    main()
