"""Where a warm remote batch spends the time a local one does not.

    python scripts/probe_remote_warm.py [--records 20000] [--rounds 5] [--codecs zstd,raw]

A diagnostic for the remote layer's warm row (issue 26): a DenseStore of
12 KiB records, with the default codec (zstd) and raw (the best case),
served by a Range-honouring HTTP server on loopback (tests/_servers.py),
its cache filled with 20 random batches of 256; then,
in alternating rounds against the same store opened locally:

* ``ds.gather(idx)`` of those batches (what bench_remote's warm row times),
  with the remote bookkeeping (``Binding.begin``/``end``: the cache's lock,
  region stamps, checked-record bits) timed on its own, and the same
  gathers of the cache's replica opened as a plain local store (the same
  file without the bookkeeping: the local copy is another file, which the
  page cache may hold differently);
* a DataLoader (2 workers) over a `select` view of the cached records, with
  the hooks the loader's prefetch thread calls for a remote stream before
  the native ring may read a step timed on their own: ``prefetch_warm``
  once per run of cached steps, ``prefetch`` per step otherwise.

Prints medians and remote/local ratios. The server is not in the timed
path (every record is in the cache).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import loaderx  # noqa: E402
from loaderx import remote  # noqa: E402

REC = 12 << 10
BATCH = 256


@contextlib.contextmanager
def _timed(methods: list, into: dict):
    """Times every call of `methods` ((class, name) pairs) into `into`,
    restoring the originals on the way out (the smoke test runs this probe
    inside the test process)."""
    originals = [(cls, name, cls.__dict__[name]) for cls, name in methods]

    def wrap(cls, name, original):
        def timed(*args, **kwargs):
            t0 = time.perf_counter_ns()
            try:
                return original(*args, **kwargs)
            finally:
                into[f"{cls.__name__}.{name}"].append(time.perf_counter_ns() - t0)
        return timed
    try:
        for cls, name, original in originals:
            setattr(cls, name, wrap(cls, name, original))
        yield
    finally:
        for cls, name, original in originals:
            setattr(cls, name, original)


def _rounds(rounds: int, steps: int, col, local, replica, batches: list, cached: np.ndarray,
            gather: dict, loader: dict) -> None:
    """Alternating rounds: the batches' gathers, then a DataLoader over a
    view of the cached records, from the cache and from the local copy; and
    the gathers of the cache's replica opened as a local store."""
    for r in range(rounds):
        for key, store in (("remote", col), ("local", local), ("replica", replica)):
            for b in batches:
                t0 = time.perf_counter_ns()
                store.gather(b)
                gather[key].append(time.perf_counter_ns() - t0)
            if key == "replica":
                continue
            view = loaderx.select({"x": store}, cached)["x"]
            with loaderx.DataLoader({"x": view}, BATCH, seed=r, workers=2) as it:
                for _ in range(10):
                    next(it)
                t0 = time.perf_counter()
                for _ in range(steps):
                    next(it)
                loader[key].append(steps / (time.perf_counter() - t0))


def run(records: int, rounds: int, steps: int, tmp: Path, codec: str = "zstd") -> dict:
    """{figure: value}: us per gather and steps/s, remote and local, with
    ratios, for a store of `codec` (zstd: the default; raw: the best case).
    Values of 4 bits a byte, so zstd has something to do (about 2x)."""
    import _servers

    rows = np.random.default_rng(0).integers(0, 16, size=(records, REC), dtype=np.uint8)
    loaderx.from_numpy(str(tmp / "ds" / "x"), rows, codec=codec).close()
    server, base = _servers.range_server(str(tmp))
    times: dict = collections.defaultdict(list)
    try:
        col = loaderx.open_store(f"{base}/ds/x", cache_dir=str(tmp / "cache"))
        local = loaderx.DenseStore(str(tmp / "ds" / "x"))
        rng = np.random.default_rng(1)
        batches = [np.sort(rng.choice(records, BATCH, replace=False)) for _ in range(20)]
        for b in batches:
            assert np.array_equal(col.gather(b), rows[b])
            local.gather(b)
        cached = np.unique(np.concatenate(batches))
        # The same cached bytes read as a plain local store: the remote path
        # without its bookkeeping, from the same file.
        replica = loaderx.DenseStore(col._remote.local_dir)
        gather: dict = {"remote": [], "local": [], "replica": []}
        loader: dict = {"remote": [], "local": []}
        methods = [(remote.Binding, "begin"), (remote.Binding, "end"), (remote.Binding, "pin_warm"),
                   (loaderx.subset.View, "prefetch"), (loaderx.subset.View, "prefetch_warm")]
        with _timed(methods, times):
            _rounds(rounds, steps, col, local, replica, batches, cached, gather, loader)
        replica.close()
        col.close()
        local.close()
    finally:
        server.shutdown()
    out = {
        "gather remote (us)": statistics.median(gather["remote"]) / 1e3,
        "gather local (us)": statistics.median(gather["local"]) / 1e3,
        "gather replica as a local store (us)": statistics.median(gather["replica"]) / 1e3,
        "loader remote (steps/s)": statistics.median(loader["remote"]),
        "loader local (steps/s)": statistics.median(loader["local"]),
    }
    out["gather remote/local (speed)"] = out["gather local (us)"] / out["gather remote (us)"]
    # The bookkeeping alone: the same file, with and without it.
    out["gather remote/replica (speed)"] = (out["gather replica as a local store (us)"]
                                            / out["gather remote (us)"])
    out["loader remote/local (speed)"] = (out["loader remote (steps/s)"]
                                          / out["loader local (steps/s)"])
    for name, values in times.items():
        out[f"{name} (us, median)"] = statistics.median(values) / 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--codecs", default="zstd,raw",
                    help="store codecs, comma-separated (zstd: the default; raw: the best case)")
    args = ap.parse_args()
    for codec in args.codecs.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            figures = run(args.records, args.rounds, args.steps, Path(tmp), codec)
        print(f"== codec {codec}")
        for name, value in figures.items():
            print(f"{name:40s} {value:10.2f}")


if __name__ == "__main__":
    main()
