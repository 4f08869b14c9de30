"""Real servers on loopback for the remote-dataset tests: moto's S3
(``ThreadedMotoServer``), a ``Range``-honouring HTTP file server, and a
fault-injecting HTTP proxy that also counts what crosses it."""
from __future__ import annotations

import copy
import email.utils
import hashlib
import http.client
import http.server
import os
import re
import socket
import socketserver
import struct
import threading
import time
import urllib.parse
from typing import Callable, Optional

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class _Threaded(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        """A client that went away, or the upstream server stopped at the end
        of the run under a proxied request, is not a test failure (the client
        sees it); the default prints a traceback to stderr."""
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


def start(server) -> str:
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host, port = server.server_address[:2]
    return f"http://{host}:{port}"


class RangeFiles(http.server.BaseHTTPRequestHandler):
    """GET/HEAD of files under ``server.root`` with ``Range:``, ``ETag``
    and ``If-Match`` (as static file servers and CDNs do). The ETag is the
    file's size and mtime, unless ``server.fixed_etag`` is set."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _file(self) -> Optional[str]:
        # (GCS's client sends the object's name percent-encoded: a/b as a%2Fb)
        name = urllib.parse.unquote(self.path.split("?")[0]).lstrip("/")
        path = os.path.normpath(os.path.join(self.server.root, name))
        if not path.startswith(os.path.normpath(self.server.root)) or not os.path.isfile(path):
            return None
        return path

    def _etag(self, path: str) -> str:
        if getattr(self.server, "fixed_etag", None):
            return self.server.fixed_etag
        st = os.stat(path)
        return '"' + hashlib.md5(f"{st.st_size}-{st.st_mtime_ns}".encode()).hexdigest() + '"'

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        path = self._file()
        if path is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        etag = self._etag(path)
        want = self.headers.get("If-Match")
        if want is not None and want.strip() not in ("*", etag):
            self.send_response(412)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        size = os.path.getsize(path)
        lo, hi, status = 0, size, 200
        rng = self.headers.get("Range")
        if rng:
            m = _RANGE.match(rng.strip())
            if m and (m.group(1) or m.group(2)):
                if m.group(1):
                    lo = int(m.group(1))
                    hi = min(size, int(m.group(2)) + 1) if m.group(2) else size
                else:
                    lo, hi = max(0, size - int(m.group(2))), size
                status = 206
                if lo >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
        self.send_response(status)
        self.send_header("Content-Length", str(hi - lo))
        self.send_header("ETag", etag)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Last-Modified", email.utils.formatdate(os.path.getmtime(path),
                                                                 usegmt=True))
        if status == 206:
            self.send_header("Content-Range", f"bytes {lo}-{hi - 1}/{size}")
        self.end_headers()
        if body:
            with open(path, "rb") as f:
                f.seek(lo)
                self.wfile.write(f.read(hi - lo))


def range_server(root: str, fixed_etag: Optional[str] = None):
    """A Range-honouring HTTP server of the files under `root` on loopback;
    returns (server, base URL)."""
    server = _Threaded(("127.0.0.1", 0), RangeFiles)
    server.root = root
    server.fixed_etag = fixed_etag
    return server, start(server)


class Faults:
    """What the proxy does to the next responses, and what it has seen."""

    def __init__(self):
        self.lock = threading.Lock()
        self.plan: list = []  # [kind, count, match]
        self.requests: list = []  # (method, path, range header, body bytes sent)
        self.delay = 0.0
        self.slow_started = threading.Event()  # a "slow" response began
        self.release = threading.Event()  # ends every "hang"

    def add(self, kind: str, count: int = 1, match: Optional[Callable] = None) -> None:
        """`kind`, for the next `count` matching requests:

        * ``503`` (SlowDown), ``500``, ``403`` (AccessDenied): that answer;
        * ``slow``: a ``self.delay`` pause first;
        * ``reset``: the headers and half the body, then a TCP reset;
        * ``cut``: the headers and half the body, then a clean close (the
          body ends short of its Content-Length);
        * ``short``: a well-formed answer with half the bytes asked for (a
          206 whose Content-Range and Content-Length say so);
        * ``noetag``: the answer without its ETag header;
        * ``bighead`` / ``smallhead``: a HEAD that claims the object is a
          petabyte / half its size;
        * ``longlen``: a Content-Length 100 bytes past the body, whose
          connection then closes;
        * ``hang``: the request is read and never answered (until
          ``self.release`` is set or 120 s pass).
        """
        with self.lock:
            self.plan.append([kind, count, match])

    def take(self, method: str, path: str) -> Optional[str]:
        with self.lock:
            for item in self.plan:
                kind, count, match = item
                if count > 0 and (match is None or match(method, path)):
                    item[1] -= 1
                    return kind
        return None

    def body_bytes(self, match: Optional[Callable] = None) -> int:
        with self.lock:
            return sum(n for m, p, r, n in self.requests if match is None or match(m, p))

    def count(self, match: Optional[Callable] = None) -> int:
        with self.lock:
            return sum(1 for m, p, r, n in self.requests if match is None or match(m, p))

    def reset_counts(self) -> None:
        with self.lock:
            self.requests.clear()


class _Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _forward(self) -> None:
        faults: Faults = self.server.faults
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        kind = faults.take(self.command, self.path)
        if kind in ("503", "500", "403"):
            self._error(int(kind))
            return
        if kind == "hang":
            faults.release.wait(120)
            self.close_connection = True
            return
        if kind == "slow":
            faults.slow_started.set()
            time.sleep(faults.delay)
        conn = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        try:
            conn.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in (
            "transfer-encoding", "connection", "content-length", "date", "server")]
        if kind == "noetag":
            headers = [(k, v) for k, v in headers if k.lower() != "etag"]
        status, data, declared = self._shaped(kind, resp, headers, data)
        sent = 0 if self.command == "HEAD" else len(data) // 2 if kind in ("reset", "cut") \
            else len(data)
        # Counted before the client can have the response: a test that
        # resets the counts once its reads are done must not see them late.
        with faults.lock:
            faults.requests.append((self.command, self.path, self.headers.get("Range"), sent))
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", declared)
        self.end_headers()
        if sent:
            self.wfile.write(data[:sent])
            self.wfile.flush()
        if kind in ("reset", "cut", "longlen") and self.command != "HEAD":
            if kind == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True

    def _shaped(self, kind, resp, headers: list, data: bytes) -> tuple:
        """(status, body, declared Content-Length) of the answer to send;
        `headers` is edited in place (a short answer's Content-Range)."""
        status = resp.status
        real = resp.getheader("Content-Length") if self.command == "HEAD" else None
        declared = real if real is not None else str(len(data))
        if kind == "bighead" and self.command == "HEAD":
            declared = str(1 << 50)
        elif kind == "smallhead" and self.command == "HEAD":
            declared = str(int(declared) // 2)
        elif kind == "longlen" and self.command != "HEAD":
            declared = str(len(data) + 100)
        elif kind == "short" and self.command != "HEAD" and len(data) > 1:
            data = data[:len(data) // 2]
            declared = str(len(data))
            for i, (k, v) in enumerate(headers):
                m = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", v) if k.lower() == \
                    "content-range" else None
                if m:
                    lo = int(m.group(1))
                    headers[i] = (k, f"bytes {lo}-{lo + len(data) - 1}/{m.group(3)}")
        return status, data, declared

    def _error(self, code: int) -> None:
        text = {503: ("SlowDown", "Please reduce your request rate."),
                500: ("InternalError", "We encountered an internal error."),
                403: ("AccessDenied", "Access Denied")}[code]
        payload = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{text[0]}</Code>'
                   f"<Message>{text[1]}</Message></Error>").encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


def fault_proxy(upstream: str):
    """An HTTP proxy on loopback in front of `upstream` (``http://host:port``);
    returns (server, base URL, Faults)."""
    host, port = upstream.split("://", 1)[1].split(":")
    server = _Threaded(("127.0.0.1", 0), _Proxy)
    server.upstream = (host, int(port))
    server.faults = Faults()
    return server, start(server), server.faults


class MotoS3:
    """moto's S3 server on loopback, a bucket, and the settings to reach it."""

    def __init__(self, bucket: str = "loaderx-test"):
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.bucket = bucket
        self.env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint,
                    "AWS_ALLOW_HTTP": "true"}
        self.client().create_bucket(Bucket=bucket)

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def options(self, endpoint: Optional[str] = None) -> dict:
        """storage_options reaching this server (or a proxy in front of it)."""
        return {"endpoint": endpoint or self.endpoint, "access_key_id": "testing",
                "secret_access_key": "testing", "region": "us-east-1", "allow_http": "true"}

    def upload_dir(self, local: str, prefix: str) -> str:
        """Uploads every file under `local` as `aws s3 sync` would; returns the URL."""
        c = self.client()
        for dirpath, _, files in os.walk(local):
            for name in files:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, local).replace(os.sep, "/")
                c.upload_file(path, self.bucket, f"{prefix}/{rel}")
        return f"s3://{self.bucket}/{prefix}"

    def fresh_bucket(self, bucket: str) -> "MotoS3":
        """This server with bucket `bucket` made anew (empty, no policy): a
        view that shares the server, for tests that need a bucket of their
        own on the session's server. Stop the server, not the view."""
        c = self.client()
        if any(b["Name"] == bucket for b in c.list_buckets().get("Buckets", [])):
            for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                for item in page.get("Contents", []):
                    c.delete_object(Bucket=bucket, Key=item["Key"])
            c.delete_bucket(Bucket=bucket)
        c.create_bucket(Bucket=bucket)
        view = copy.copy(self)
        view.bucket = bucket
        return view

    def stop(self) -> None:
        self.server.stop()
