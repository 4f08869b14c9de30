"""The remote layer's peers, reading the bench dataset's records from the same
S3 server: MosaicML Streaming (StreamingDataset over MDS shards), LitData
(StreamingDataset over optimize() chunks) and Lance (``take()`` on a Lance
dataset in the bucket). Each runs from its private venv (bench_venvs) in a
child process that writes its own format once (kept in the bucket and under
the bench cache), then times random batches of the same indices loaderx
reads, from a fresh cache each round (Streaming and LitData: the same cache
limit as loaderx's run, which has none that binds). Every batch is checked
against the records' pattern before it counts.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from bench_harness import Row, Unavailable, run_child_json

# The child: one interpreter of a peer's venv. argv[1]: a JSON job.
CHILD = r'''
import json, os, shutil, sys, time
import numpy as np

job = json.loads(sys.argv[1])
REC = job["rec"]
os.environ.update(job["env"])


def records(idx):
    i = np.asarray(idx, dtype=np.uint64)[:, None]
    j = np.arange(REC, dtype=np.uint64)[None, :]
    return ((j * np.uint64(2654435761) + i * np.uint64(40503)) >> np.uint64(13)).astype(np.uint8)


def check(got, idx):
    want = records(idx)
    got = np.stack([np.frombuffer(g, np.uint8) for g in got])
    if not np.array_equal(got, want):
        raise SystemExit(json.dumps({"status": "failed", "reason": "INVALID: records differ"}))


n, peer, url = job["n"], job["peer"], job["url"]
batches = [np.asarray(b) for b in job["batches"]]
opts = job["options"]
rates = []

if peer == "streaming":
    from streaming import MDSWriter, StreamingDataset
    if job["write"]:
        with MDSWriter(out=(job["local"], url), columns={"x": "bytes"}, size_limit=1 << 26) as w:
            for start in range(0, n, 4096):
                for row in records(np.arange(start, min(n, start + 4096))):
                    w.write({"x": row.tobytes()})
    for r, cache in enumerate(job["caches"]):
        shutil.rmtree(cache, ignore_errors=True)
        ds = StreamingDataset(remote=url, local=cache, shuffle=False, batch_size=256,
                              cache_limit=job["cache_limit"])
        t = time.perf_counter()
        out = [[ds[int(i)]["x"] for i in b] for b in batches]
        rates.append(job["payload_mib"] / (time.perf_counter() - t))
        check(out[0], batches[0])
        del ds
        shutil.rmtree(cache, ignore_errors=True)
elif peer == "litdata":
    import litdata
    if job["write"]:
        litdata.optimize(fn=lambda i: {"x": records([i])[0].tobytes()}, inputs=list(range(n)),
                         output_dir=job["local"], chunk_bytes="64MB", num_workers=1)
        print(json.dumps({"status": "written"}))
        raise SystemExit(0)
    for r, cache in enumerate(job["caches"]):
        shutil.rmtree(cache, ignore_errors=True)
        ds = litdata.StreamingDataset(url, cache_dir=cache, max_cache_size=job["cache_limit_str"],
                                      storage_options={"endpoint_url": opts["endpoint"]})
        t = time.perf_counter()
        out = [[ds[int(i)]["x"] for i in b] for b in batches]
        rates.append(job["payload_mib"] / (time.perf_counter() - t))
        check(out[0], batches[0])
        del ds
        shutil.rmtree(cache, ignore_errors=True)
elif peer == "lance":
    import lance
    import pyarrow as pa
    so = {"endpoint": opts["endpoint"], "allow_http": "true", "region": "us-east-1",
          "aws_access_key_id": opts["access_key_id"],
          "aws_secret_access_key": opts["secret_access_key"]}
    if job["write"]:
        schema = pa.schema([("x", pa.binary())])

        def chunks():
            for start in range(0, n, 4096):
                rows = records(np.arange(start, min(n, start + 4096)))
                yield pa.record_batch([pa.array([r.tobytes() for r in rows], pa.binary())],
                                      schema=schema)
        lance.write_dataset(pa.RecordBatchReader.from_batches(schema, chunks()), url,
                            storage_options=so, mode="overwrite")
    for r in range(len(job["caches"])):
        ds = lance.dataset(url, storage_options=so)
        t = time.perf_counter()
        out = [ds.take(b.tolist(), columns=["x"]).column("x").to_pylist() for b in batches]
        rates.append(job["payload_mib"] / (time.perf_counter() - t))
        check(out[0], batches[0])
print(json.dumps({"status": "ok", "mib_s": rates}))
'''

PEERS = (
    # (row name, venv, peer key)
    ("mosaicml-streaming StreamingDataset[i] (cold)", "streaming", "streaming"),
    ("litdata StreamingDataset[i] (cold)", "litdata", "litdata"),
    ("lance take() (cold)", "lance", "lance"),
)


def run(ctx, server, cache: Path, n: int, per_round: int, rng) -> list:
    """One Row per peer: measured, or missing/failed with the reason."""
    rows = []
    batches = [rng.choice(n, 256, replace=False).tolist() for _ in range(per_round)]
    payload = per_round * 256 * (12 << 10) / (1 << 20)
    for name, venv, peer in PEERS:
        row = Row(name, "peer", "-")
        rows.append(row)
        try:
            python = ctx.venvs.python(venv) if ctx.venvs is not None else None
            if python is None:
                raise Unavailable("missing", "no private venvs")
        except Unavailable as exc:
            row.status = str(exc)
            continue
        local = cache / f"{peer}-{n}"
        url = f"s3://bench/{peer}-{n}"
        job = {"peer": peer, "n": n, "rec": 12 << 10, "url": url, "local": str(local),
               "batches": batches, "payload_mib": payload, "options": server.options,
               "env": dict(server.env, S3_ENDPOINT_URL=server.endpoint),
               "caches": [str(ctx.workdir / f"{peer}-cache-{r}") for r in range(ctx.repeat)],
               "cache_limit": None, "cache_limit_str": "100GB",
               "write": not (local / ".written").exists()}
        if peer == "litdata" and job["write"]:  # optimize locally, then upload the chunks
            done = run_child_json([python, "-c", CHILD, json.dumps(job)], 7200)
            if done.get("status") != "written":
                row.status = f"failed: {done.get('reason')}"
                continue
            from bench_remote import _upload
            _upload(local, url, server.options)
        if job["write"]:
            local.mkdir(parents=True, exist_ok=True)
        job["write"] = job["write"] and peer != "litdata"
        result = run_child_json([python, "-c", CHILD, json.dumps(job)], 7200)
        if result.get("status") != "ok":
            row.status = f"failed: {result.get('reason', 'no result')}"
            continue
        (local / ".written").write_text("1")
        row.gather_mibs = list(result["mib_s"])
        row.batches_timed = per_round * len(row.gather_mibs)
    return rows


if __name__ == "__main__":  # pragma: no cover - run through bench.py
    sys.exit("run through scripts/bench.py remote")
