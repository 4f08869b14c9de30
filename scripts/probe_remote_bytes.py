"""The byte counts of the remote bench at the issue's size, on their own:
a cold gather's bytes fetched over its payload, and bench_remote._shared
(4 processes sharing one cache against one), three rounds of 40 random
batches of 256 x 12 KiB from the 10^6-record dataset.

    python scripts/probe_remote_bytes.py

Needs the server data a `python scripts/bench.py remote --size default` run
left in bench-out/remote (it starts SeaweedFS on it). Written to re-measure
those two figures after a fix to the replicas' count of bytes fetched
(git ca509f4), without the run's hour of timed rounds."""
import shutil
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]
import bench_remote as br  # noqa: E402

import loaderx  # noqa: E402


def main() -> None:
    cache = ROOT / "bench-out" / "remote"
    server = br.Server("weed", cache / f"weed-data-{br.UPLOAD_PART >> 20}m", print)
    work = Path(tempfile.mkdtemp(prefix="probe-remote-bytes-"))
    try:
        n, per_round = br.SIZES["default"][:2]
        url = f"s3://{br.BUCKET}/ds-{n}"
        rng = np.random.default_rng(0)
        for r in range(3):
            batches = [rng.choice(n, 256, replace=False) for _ in range(per_round)]
            fresh = work / "c"
            shutil.rmtree(fresh, ignore_errors=True)
            col = loaderx.open_dataset(url, cache_dir=str(fresh), storage_options=server.options)["x"]
            for b in batches:
                col.gather(b)
            rep = col._remote.replica()
            print(f"round {r}: cold gathers fetched {rep.fetched / (per_round * 256 * br.REC):.3f}x "
                  f"their payload; present {rep.present_bytes() / (per_round * 256 * br.REC):.3f}x")
            col.close()
            ctx = types.SimpleNamespace(workdir=work, log=print)
            shared = br._shared(ctx, url, server, rng, n, per_round)
            print(f"round {r}: 4 processes, one cache: {shared:.3f}x the bytes one process fetches")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
