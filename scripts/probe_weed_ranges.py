"""How many small ranged GETs/s the remote layer's SeaweedFS serves, per configuration.

    python scripts/probe_weed_ranges.py [--config NAME ...] [--mib 1024] [--seconds 2]

Starts the bench's S3 server (bench_remote.Server) with one configuration at a
time, uploads one object of random bytes with the bench's own upload
(bench_remote._upload: obstore's multipart put, in the configuration's part
size), then measures through obstore:

  * 12 KiB ranged GETs at random aligned offsets, 1, 8 and 64 in flight
    (requests/s over --seconds each), every reply checked against the bytes
    uploaded;
  * 64 MiB ranged GETs (MB/s), as the peers' whole-shard downloads are, 1
    and 4 in flight;
  * the server's CPU per request (/proc/<pid>/stat of the weed process
    group), the chunks the filer holds for the object, and the server's
    resident memory after the upload and at the end.

Each configuration gets a fresh data directory. Rates are wall-clock on
whatever machine runs it, the probe's client sharing its cores: compare
configurations within one run, and read the server's CPU per request, which
load from other processes moves much less.

What it found (SeaweedFS 4.48, `weed mini`, 2 vCPUs, load average 1.2-3
from other jobs). Nothing reads whole chunks: the volume server alone
serves a 12 KiB range of a 4 MiB chunk in 0.09 ms of CPU (6,800/s), the
filer's HTTP API one of a 64 MiB object in 0.17 ms but of a 1 GiB one (410
chunks) in 0.74 ms. The cost is the entry
lookup: every S3 GET fetches the object's entry from the filer (gRPC), which
gunzips and decodes its whole chunk list (CPU profile of the server, -debug:
leveldb2 FindEntry, gunzip and protobuf decoding take most of it), and the
gateway decodes it again. So a GET costs ~0.4 ms plus ~2 us per chunk of the
object: 1.3-1.9 ms on a 1 GiB object in obstore's 5 MiB parts (409 chunks),
0.5 ms on a 64 MiB object. CPU-bound on two cores next to the client, that
is the ~1,150 GETs/s ceiling whatever the concurrency (200-350/s with other
jobs running, on the bench's 1.2 GB object of ~470 chunks).

Configurations (12 KiB GETs at 8 / 64 in flight, server ms of CPU a GET;
64 MiB GETs at 1 / 4 in flight), one quiet-ish run:
  before            409 chunks  1161 / 1140 GETs/s  1.29 / 1.38 ms  435 / 513 MB/s
  bench-5mib-parts  205 chunks  1408 / 1379         1.03 / 1.12     411 / 484
  bench              16 chunks  2147 / 2722         0.54 / 0.42     419 / 539
  bench-s3cache      16 chunks  2266 / 2876         0.52 / 0.41     413 / 527
  server             16 chunks  2198 / 2655         0.53 / 0.44     428 / 552
(-filer.maxMB=8 or 16 with 5 or 16 MiB parts fell in between, by their
chunk counts). The chunk cache (-s3.cacheCapacityMB) and `weed server` with
its components named instead of `weed mini` change nothing; `weed server`
and 64 MiB parts without -s3.concurrentUploadLimitMB and GOMEMLIMIT hold
4-5 GB after the upload. The volume server's -readMode (for volumes on other
servers) and -index (the needle map: a lookup in memory here) act on the
0.09 ms part and were not tried. bench_remote.UPLOAD_PART says what the bench
took.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SCRIPTS = Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))

import bench_remote  # noqa: E402

SMALL = 12 << 10
BIG = 64 << 20
KEY = "probe/data"


# The flags this probe led to (bench_remote.weed_mini_args); "before" drops them.
NEW_FLAGS = ("-filer.maxMB=64", "-s3.concurrentUploadLimitMB=256", "-webdav=false",
             "-master.telemetry=false")


def _mini(*extra, base=True):
    """bench_remote's `weed mini` (before this probe's flags unless `base`) plus `extra`."""
    def command(weed, data_dir, ports):
        args = bench_remote.weed_mini_args(weed, data_dir, ports)
        if not base:
            args = [a for a in args if a not in NEW_FLAGS]
        return args + list(extra)
    return command


def _server(*extra):
    """`weed server` with its components named explicitly (master, volume,
    filer, S3; no WebDAV, admin or worker)."""
    def command(weed, data_dir, ports):
        return [weed, "server", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-master.telemetry=false", f"-master.port={ports['master']}",
                f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}", "-filer",
                "-s3", f"-s3.port={ports['s3']}", "-s3.port.iceberg=0",
                "-master.volumeSizeLimitMB=1024"] + list(extra)
    return command


BENCH_PART = bench_remote.UPLOAD_PART >> 20
# name: (command, environment of the server, upload part size in MiB)
CONFIGS = {
    # bench_remote's server before this probe: weed mini's defaults, obstore's 5 MiB parts
    "before": (_mini(base=False), {}, 5),
    # bench_remote's server now (its Server as it stands), its 64 MiB parts
    "bench": (None, bench_remote.WEED_ENV, BENCH_PART),
    # the variants tried on the way
    "maxmb8": (_mini("-filer.maxMB=8", base=False), {}, 5),
    "maxmb16-16mib": (_mini("-filer.maxMB=16", base=False), {}, 16),
    "maxmb64-64mib-unlimited": (_mini("-filer.maxMB=64", base=False), {}, 64),
    "bench-5mib-parts": (None, bench_remote.WEED_ENV, 5),
    "bench-s3cache": (_mini("-s3.cacheCapacityMB=1024"), bench_remote.WEED_ENV, BENCH_PART),
    "server": (_server("-filer.maxMB=64"), {}, BENCH_PART),
}


def _proc_cpu(pgid: int) -> float:
    """CPU seconds (user + system) of every process in group `pgid`."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5 (pgrp), after state and ppid
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _store(server):
    from obstore.store import from_url

    opts = dict(server.options)
    opts.pop("allow_http")
    return from_url(f"s3://{bench_remote.BUCKET}", config=opts,
                    client_options={"allow_http": True, "timeout": "120s"})


def _chunks(server) -> int:
    """How many chunks the filer holds for the object (its entry's chunk list)."""
    import urllib.request

    port = next(a.split("=", 1)[1] for a in server.proc.args if a.startswith("-filer.port="))
    url = f"http://127.0.0.1:{port}/buckets/{bench_remote.BUCKET}/{KEY}?metadata=true"
    with urllib.request.urlopen(url, timeout=30) as r:
        return len(json.load(r).get("chunks") or [])


async def _small(store, data: np.ndarray, inflight: int, seconds: float, seed: int) -> dict:
    import obstore

    rng = np.random.default_rng(seed)
    slots = len(data) // SMALL
    done = [0]
    lat: list = []
    deadline = time.perf_counter() + seconds

    async def worker():
        while time.perf_counter() < deadline:
            start = int(rng.integers(slots)) * SMALL
            t = time.perf_counter()
            got = await obstore.get_range_async(store, KEY, start=start, length=SMALL)
            lat.append(time.perf_counter() - t)
            if bytes(got) != data[start:start + SMALL].tobytes():
                raise AssertionError(f"range at {start} differs")
            done[0] += 1
    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    wall = time.perf_counter() - t
    lat.sort()
    return {"req_s": done[0] / wall, "p50_ms": lat[len(lat) // 2] * 1e3,
            "p99_ms": lat[int(len(lat) * 0.99)] * 1e3, "requests": done[0]}


async def _big(store, data: np.ndarray, inflight: int, count: int) -> dict:
    import obstore

    size = min(BIG, len(data))
    starts = [(k * size) % (len(data) - size + 1) for k in range(count)]
    sem = asyncio.Semaphore(inflight)

    async def one(start):
        async with sem:
            got = await obstore.get_range_async(store, KEY, start=start, length=size)
            if bytes(got) != data[start:start + size].tobytes():
                raise AssertionError(f"large range at {start} differs")
    t = time.perf_counter()
    await asyncio.gather(*(one(s) for s in starts))
    return {"mb_s": count * size / 1e6 / (time.perf_counter() - t), "mib": size >> 20}


@functools.lru_cache(maxsize=1)
def _data(mib: int) -> np.ndarray:
    """The object's bytes: 64 MiB of random bytes, each copy shifted by its
    index (nothing compresses them, and a reply from the wrong offset differs)."""
    block = min(mib, 64) << 20
    base = np.frombuffer(np.random.default_rng(1).bytes(block), np.uint8)
    data = np.tile(base, -(-(mib << 20) // block)).reshape(-1, block)
    data += np.arange(len(data), dtype=np.uint8)[:, None]
    return data.reshape(-1)[:mib << 20]


def probe(name: str, mib: int, seconds: float, workdir: Path, log, part_mib=None,
          big_count: int = 6) -> dict:
    """One configuration's figures (a dict; see _line)."""
    data = _data(mib)
    source = workdir / f"{name}-source"
    source.mkdir(parents=True)
    data.tofile(source / KEY.rsplit("/", 1)[1])
    command, env, default_part = CONFIGS[name]
    part_mib = part_mib or default_part
    server = bench_remote.Server("weed", workdir / name, log, command=command, env=env)
    out: dict = {"config": name, "command": " ".join(server.proc.args[1:]), "part_mib": part_mib}
    try:
        pgid = os.getpgid(server.proc.pid)
        store = _store(server)
        t = time.perf_counter()
        bench_remote._upload(source, f"s3://{bench_remote.BUCKET}/{KEY.rsplit('/', 1)[0]}",
                             server.options, part=part_mib << 20)
        out["upload_s"] = round(time.perf_counter() - t, 2)
        (source / KEY.rsplit("/", 1)[1]).unlink()
        out["chunks"] = _chunks(server)
        out["rss_after_upload_mib"] = round(_rss_mib(server.proc.pid))
        cpu0 = _proc_cpu(pgid)
        for inflight in (1, 8, 64):
            c = _proc_cpu(pgid)
            p = time.process_time()
            r = asyncio.run(_small(store, data, inflight, seconds, inflight))
            r["server_cpu_ms_per_req"] = (_proc_cpu(pgid) - c) / r["requests"] * 1e3
            r["client_cpu_ms_per_req"] = (time.process_time() - p) / r["requests"] * 1e3
            out[f"small_{inflight}"] = r
        for inflight in (1, 4):
            c = _proc_cpu(pgid)
            r = asyncio.run(_big(store, data, inflight, big_count))
            gb = big_count * min(BIG, len(data)) / 1e9
            r["server_cpu_s_per_gb"] = (_proc_cpu(pgid) - c) / gb
            out[f"big_{inflight}"] = r
        out["server_cpu_s"] = round(_proc_cpu(pgid) - cpu0, 1)
        out["server_rss_mib"] = round(_rss_mib(server.proc.pid))
    finally:
        server.stop()
    return out


def _line(r: dict) -> str:
    small = "  ".join(f"{k}: {s['req_s']:5.0f}/s (p50 {s['p50_ms']:.1f} ms, server "
                      f"{s['server_cpu_ms_per_req']:.2f} ms CPU)"
                      for k, s in ((k, r[f"small_{k}"]) for k in (1, 8, 64)))
    big = "  ".join(f"{k}: {r[f'big_{k}']['mb_s']:4.0f} MB/s" for k in (1, 4))
    return (f"{r['config']}: {r['chunks']} chunks ({r['part_mib']} MiB parts, upload "
            f"{r['upload_s']} s), server RSS {r['rss_after_upload_mib']} MiB after the upload, "
            f"{r['server_rss_mib']} MiB at the end\n  12 KiB GETs, in flight {small}\n"
            f"  {r['big_1']['mib']} MiB GETs, in flight {big}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", nargs="*", default=["before", "bench"], choices=list(CONFIGS))
    ap.add_argument("--mib", type=int, default=1024, help="size of the object (MiB)")
    ap.add_argument("--seconds", type=float, default=2.0, help="per small-GET measurement")
    ap.add_argument("--part-mib", type=int, default=None,
                    help="multipart part size of the upload in MiB (default: the configuration's)")
    ap.add_argument("--workdir", help="where the servers' data go (default: the system's temp)")
    ap.add_argument("--json", help="append every result as a JSON line to this file")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="probe-weed-", dir=args.workdir) as tmp:
        for name in args.config:
            r = probe(name, args.mib, args.seconds, Path(tmp),
                      lambda m: print(m, file=sys.stderr), args.part_mib)
            print(_line(r), flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
