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
import shutil
from pathlib import Path

from bench_harness import Row, Unavailable, run_child_json
from bench_s3 import BUCKET, UPLOAD_PART, upload

# The child: one interpreter of a peer's venv. argv[1]: a JSON job, which
# either writes the peer's copy of the dataset ("write") or times one round
# of batches from a fresh cache.
CHILD = r"""
import json, os, shutil, sys, time
import numpy as np

REC = 12 << 10


def records(idx):
    i = np.asarray(idx, dtype=np.uint64)[:, None]
    j = np.arange(REC, dtype=np.uint64)[None, :]
    return ((j * np.uint64(2654435761) + i * np.uint64(40503)) >> np.uint64(13)).astype(np.uint8)


def row(i):  # LitData's optimize() item: top level, its workers import this file
    return {"x": records([i])[0].tobytes()}


def check(got, idx):
    got = np.stack([np.frombuffer(g, np.uint8) for g in got])
    if not np.array_equal(got, records(idx)):
        print(json.dumps({"status": "failed", "reason": "INVALID: records differ"}))
        raise SystemExit(0)


def main():
    job = json.loads(sys.argv[1])
    os.environ.update(job["env"])
    n, peer, url, opts = job["n"], job["peer"], job["url"], job["options"]
    batches = [np.asarray(b) for b in job.get("batches", [])]
    cache = job.get("cache")
    so = {"endpoint": opts["endpoint"], "allow_http": "true", "region": "us-east-1",
          "aws_access_key_id": opts["access_key_id"],
          "aws_secret_access_key": opts["secret_access_key"]}
    out, t = None, 0.0
    if peer == "streaming":
        from streaming import MDSWriter, StreamingDataset
        if job["write"]:
            with MDSWriter(out=(job["local"], url), columns={"x": "bytes"},
                           size_limit=1 << 26) as w:
                for start in range(0, n, 4096):
                    for r in records(np.arange(start, min(n, start + 4096))):
                        w.write({"x": r.tobytes()})
        else:
            ds = StreamingDataset(remote=url, local=cache, shuffle=False, batch_size=256)
            t = time.perf_counter()
            out = [[ds[int(i)]["x"] for i in b] for b in batches]
    elif peer == "litdata":
        import litdata
        if job["write"]:
            litdata.optimize(fn=row, inputs=list(range(n)), output_dir=job["local"],
                             chunk_bytes="64MB", num_workers=1)
        else:
            ds = litdata.StreamingDataset(url, cache_dir=cache, max_cache_size="100GB",
                                          storage_options={"endpoint_url": opts["endpoint"]})
            t = time.perf_counter()
            out = [[ds[int(i)]["x"] for i in b] for b in batches]
    elif peer == "lance":
        import lance
        import pyarrow as pa
        if job["write"]:
            schema = pa.schema([("x", pa.binary())])

            def chunks():
                for start in range(0, n, 4096):
                    rows = records(np.arange(start, min(n, start + 4096)))
                    yield pa.record_batch([pa.array([r.tobytes() for r in rows], pa.binary())],
                                          schema=schema)
            lance.write_dataset(pa.RecordBatchReader.from_batches(schema, chunks()), url,
                                storage_options=so, mode="overwrite")
        else:
            ds = lance.dataset(url, storage_options=so)
            t = time.perf_counter()
            out = [ds.take(b.tolist(), columns=["x"]).column("x").to_pylist() for b in batches]
    if job["write"]:
        print(json.dumps({"status": "ok"}))
        return
    seconds = time.perf_counter() - t
    for got, b in zip(out, batches):
        check(got, b)
    print(json.dumps({"status": "ok", "seconds": seconds}))


if __name__ == "__main__":
    main()
"""
PEERS = (
    # (row name, venv, peer key)
    ("mosaicml-streaming StreamingDataset[i] (cold)", "streaming", "streaming"),
    ("litdata StreamingDataset[i] (cold)", "litdata", "litdata"),
    ("lance take() (cold)", "lance", "lance"),
)


class Peers:
    """The peers of one run: their rows, their copies of the data, their rounds."""

    def __init__(self, ctx, server, cache: Path, n: int, per_round: int):
        self.ctx, self.server, self.cache, self.n = ctx, server, cache, n
        self.payload = per_round * 256 * (12 << 10) / (1 << 20)
        self.rows: list = []
        self.live: list = []  # (row, python, peer)
        for name, venv, peer in PEERS:
            row = Row(name, "peer", "-")
            self.rows.append(row)
            try:
                if ctx.venvs is None:
                    raise Unavailable("missing", "no private venvs")
                self.live.append((row, ctx.venvs.python(venv), peer))
            except Unavailable as exc:
                row.status = str(exc)

    def _run(self, python: str, job: dict, timeout_s: float) -> dict:
        """The child as a script file: a peer that spawns workers (LitData's
        optimize) re-imports its __main__, which `-c` code cannot be."""
        script = self.ctx.workdir / "bench_remote_peer_child.py"
        if not script.exists():
            script.write_text(CHILD)
        return run_child_json([python, str(script), json.dumps(job)], timeout_s)

    def _job(self, peer: str, **kw) -> dict:
        # Lance's writer starts its multipart uploads at this part size (the
        # parts set the server's cost per GET: see bench_s3.UPLOAD_PART).
        job = {"peer": peer, "n": self.n, "rec": 12 << 10, "url": f"s3://{BUCKET}/{peer}-{self.n}",
               "local": str(self.cache / f"{peer}-{self.n}"), "options": self.server.options,
               "env": dict(self.server.env, S3_ENDPOINT_URL=self.server.endpoint,
                           LANCE_INITIAL_UPLOAD_SIZE=str(UPLOAD_PART)),
               "write": False}
        job.update(kw)
        return job

    def prefixes(self) -> list:
        return [f"{peer}-{self.n}" for row, _, peer in self.live if row.ok]

    def prepare(self) -> None:
        """Writes each peer's copy once (kept in the bucket and the cache)."""
        from loaderx import remote

        cfg = remote.Config(storage_options=self.server.options)
        for row, python, peer in self.live:
            local = self.cache / f"{peer}-{self.n}"
            if remote._occupied(f"s3://{BUCKET}/{peer}-{self.n}", cfg):
                continue  # written by an earlier run (the server keeps its data)
            shutil.rmtree(local, ignore_errors=True)
            self.ctx.log(f"remote: writing the {peer} copy")
            done = self._run(python, self._job(peer, write=True), 7200)
            if done.get("status") != "ok":
                row.status = f"failed: {done.get('reason', 'no result')}"
                continue
            if peer == "litdata":  # optimize() wrote locally: upload its chunks
                upload(local, f"s3://{BUCKET}/{peer}-{self.n}", self.server.options)
                shutil.rmtree(local, ignore_errors=True)  # read from the bucket only

    def round(self, batches: list, before=None) -> None:
        """One timed round of every peer, each from a fresh cache (after
        `before()`, when given: the server's pages dropped)."""
        for row, python, peer in self.live:
            if not row.ok:
                continue
            if before is not None:
                before()
            cache = self.ctx.workdir / f"{peer}-cache"
            shutil.rmtree(cache, ignore_errors=True)
            job = self._job(peer, batches=[b.tolist() for b in batches], cache=str(cache))
            result = self._run(python, job, 3600)
            shutil.rmtree(cache, ignore_errors=True)
            if result.get("status") != "ok":
                row.status = f"failed: {result.get('reason', 'no result')}"
                continue
            row.gather_mibs.append(self.payload / result["seconds"])
            row.batches_timed += len(batches)
