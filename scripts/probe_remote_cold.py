"""The remote bench's cold row at the issue's size, with the server's disk
cold, on its own: obstore's get_ranges of a round's records against a
loaderx gather of the same batches from a fresh cache, and the same with
the store's whole index (its records' checksums, 4 B each) fetched before
the round, so that only the records' own GETs are timed.

    python scripts/probe_remote_cold.py [--rounds 5] [--batches 20]

Needs the server data a `python scripts/bench.py remote --size default` run
left in bench-out/remote (it starts SeaweedFS on it and drops the server's
pages from the page cache before every reader, as that run does). Prints
MiB/s of payload per round and the median ratios.
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

READERS = ("get_ranges", "loaderx", "loaderx, index fetched first")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", type=int, default=20)
    args = ap.parse_args()
    data = ROOT / "bench-out" / "remote" / f"weed-data-{br.UPLOAD_PART >> 20}m"
    server = br.Server("weed", data, print)
    work = Path(tempfile.mkdtemp(prefix="probe-remote-cold-"))
    n = br.SIZES["default"][0]
    url = f"s3://{br.BUCKET}/ds-{n}"
    rates: dict = {k: [] for k in READERS}
    try:
        rng = np.random.default_rng(11)
        for r in range(args.rounds):
            batches = [rng.choice(n, br.BATCH, replace=False) for _ in range(args.batches)]
            payload = args.batches * br.BATCH * br.REC / (1 << 20)
            for k in range(len(READERS)):  # the readers' order turns every round
                key = READERS[(k + r) % len(READERS)]
                br._drop_server_pages(data)
                if key == "get_ranges":
                    t = time.perf_counter()
                    br._get_ranges(url, server.options, batches)
                    rates[key].append(payload / (time.perf_counter() - t))
                    continue
                fresh = work / "cache"
                shutil.rmtree(fresh, ignore_errors=True)
                col = loaderx.open_dataset(url, cache_dir=str(fresh),
                                           storage_options=server.options)["x"]
                if key != "loaderx":
                    col._remote.all_index()
                    br._drop_server_pages(data)
                t = time.perf_counter()
                for b in batches:
                    got = col.gather(b)
                rates[key].append(payload / (time.perf_counter() - t))
                assert np.array_equal(got, br.records(batches[-1]))
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
