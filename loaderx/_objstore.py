"""Object storage for remote datasets: URLs, the client (obstore), retries,
error mapping, and a transport that survives ``fork()``.

URLs: ``s3://bucket/key``, ``gs://bucket/key``, ``az://container/key``
(also ``azure://``, ``abfs://``, ``abfss://``), and ``https://`` or
``http://`` (read-only: any server that honours ``Range:``). Credentials and
endpoints come from each cloud's standard environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_REGION``, ``AWS_ALLOW_HTTP=true`` for a local
server, ``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_STORAGE_ACCOUNT_NAME``,
instance roles...) and from `storage_options`: obstore configuration keys
(``endpoint``, ``region``, ``access_key_id``...), plus ``client_options`` and
``retry_config`` dicts passed to obstore as they are. With ``AWS_PROFILE`` set
(and boto3 installed) S3 credentials come from that profile.

The client is obstore (Rust ``object_store``: one API for S3, GCS, Azure and
HTTP, concurrent ranged GETs with the GIL released; see docs/remote.md for
the choice). Its Tokio runtime does not survive ``fork()``: a child of a
process that used it hangs on its first request. So a process whose obstore
runtime belongs to an ancestor (a torch worker forked by a loader that
opened a remote dataset) sends its requests to a helper process of its own,
started as a fresh interpreter (``python -c ...``), which runs
the same functions and writes fetched ranges straight into the cache files;
only small messages cross the pipe.

Faults. obstore retries a request on 5xx, 429/SlowDown, connection errors
and timeouts with jittered exponential backoff (``RETRY_CONFIG``); what still
fails (a body cut off or reset mid-way, a response shorter than asked, a
retry budget spent) is retried here, ``ATTEMPTS`` times with jittered
backoff (a failed ``get_ranges`` call range by range), and named when the
attempts run out ("short response", "connection reset during the body").
Every read (HEAD, GET, a fetch's ranged GETs) ends within `read_budget_s`:
the request timeout times ATTEMPTS, for a server that never answers too.
A hard failure is never
retried and raises at once, naming the URL: `RemoteNotFoundError`
(``FileNotFoundError``: no such key or bucket), `RemotePermissionError`
(``PermissionError``: access denied, bad credentials), `RemoteChangedError`
(the object is no longer the version that was opened), and, once the
retries are spent, `RemoteIOError` (an ``OSError``: unreachable, timeouts).
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import errno
import functools
import os
import pickle
import random
import re
import struct
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np

from .errors import (
    CorruptStoreError,
    DestinationExistsError,
    InvalidArgumentError,
    LoaderxError,
    MissingRemoteDependencyError,
    RemoteChangedError,
    RemoteIOError,
    RemoteNotFoundError,
    RemotePermissionError,
)

__all__ = ["is_url", "join", "Options", "head", "get", "get_ranges_into", "put", "list_keys",
           "delete", "MissingRemoteDependencyError"]

_SCHEMES = ("s3", "gs", "az", "azure", "abfs", "abfss", "http", "https")
#: What a URL's scheme looks like (RFC 3986), two letters at least: ``C://``
#: stays a (Windows) path.
_URL_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+")
_WRITABLE = ("s3", "gs", "az", "azure", "abfs", "abfss")

#: Whole-operation retries on top of obstore's per-request ones.
ATTEMPTS = 4
#: Backoff between them: BACKOFF_S * 2**k, up to BACKOFF_MAX_S, times a random 0.5..1.
BACKOFF_S = 0.2
BACKOFF_MAX_S = 5.0
#: obstore's own per-request settings (a user's client_options/retry_config win).
CLIENT_OPTIONS = {"connect_timeout": "5s", "timeout": "60s"}
RETRY_CONFIG = {
    "max_retries": 3,
    "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=5),
                "base": 2},
    "retry_timeout": timedelta(seconds=60),
}
#: `slow_notice(url, waited_s, budget_s)` is called once for a HEAD or GET
#: still unanswered after its first request timeout (at most SLOW_NOTICE_S),
#: while it goes on trying: the CLI says so on stderr instead of waiting in
#: silence. None (the library's default): nothing is said.
slow_notice: Optional[Callable[[str, float, float], None]] = None
SLOW_NOTICE_S = 10.0
#: The largest object fetched whole (a store's meta, a manifest): a server
#: that declares more is refused instead of read into memory.
GET_MAX = 256 << 20


# ----------------------------------------------------------------- URLs

def is_url(path: Any) -> bool:
    """Whether `path` is a URL of a scheme loaderx reads (not a local path).
    A URL of another scheme (``ftp://``, ``file://``...) is refused
    (ValueError), never taken for a local path named ``ftp:``."""
    if not isinstance(path, str):
        return False
    head, sep, _ = path.partition("://")
    if not sep:
        return False
    if head.lower() in _SCHEMES:
        return True
    if _URL_LIKE.fullmatch(head):
        raise ValueError(
            f"{path}: loaderx does not read {head}:// URLs; it reads "
            + ", ".join(f"{s}://" for s in _SCHEMES) + " (write a local path without a scheme)")
    return False


def scheme(url: str) -> str:
    return url.partition("://")[0].lower()


def split(url: str) -> tuple[str, str]:
    """``(root, key)``: ``s3://bucket/a/b`` -> ``("s3://bucket", "a/b")``."""
    sch, _, rest = url.partition("://")
    netloc, _, key = rest.partition("/")
    if not netloc:
        raise InvalidArgumentError(f"{url}: a URL needs a bucket, container or host")
    return f"{sch.lower()}://{netloc}", key.strip("/")


def join(url: str, *parts: str) -> str:
    """`url` with path parts appended (``/`` separated, no ``..``)."""
    out = url.rstrip("/")
    for p in parts:
        p = p.replace("\\", "/").strip("/")
        if p and p != ".":
            out = f"{out}/{p}"
    return out


def writable(url: str) -> bool:
    return scheme(url) in _WRITABLE


# ----------------------------------------------------------------- options

_CLIENT_KEYS = ("allow_http", "allow_invalid_certificates", "connect_timeout", "timeout",
                "proxy_url", "proxy_ca_certificate", "proxy_excludes", "user_agent",
                "pool_idle_timeout", "pool_max_idle_per_host", "http1_only", "http2_only",
                "default_headers", "root_certificate")


class Options:
    """Normalized, hashable and picklable `storage_options`."""

    def __init__(self, storage_options: Optional[dict] = None):
        so = dict(storage_options or {})
        for k in so:
            if not isinstance(k, str):
                raise InvalidArgumentError(f"storage_options keys must be strings, not {k!r}")
        self.client_options = dict(so.pop("client_options", None) or {})
        self.retry_config = dict(so.pop("retry_config", None) or {})
        for k in list(so):  # HTTP client settings given at the top level
            if k.lower() in _CLIENT_KEYS:
                self.client_options.setdefault(k.lower(), so.pop(k))
        self.config = so
        self._key = repr((sorted(self.config.items()), sorted(self.client_options.items()),
                          sorted((k, repr(v)) for k, v in self.retry_config.items())))

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Options) and other._key == self._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __reduce__(self):
        so = dict(self.config)
        if self.client_options:
            so["client_options"] = self.client_options
        if self.retry_config:
            so["retry_config"] = self.retry_config
        return (Options, (so,))


# ----------------------------------------------------------------- the client

_CLIENTS: dict = {}
_CLIENTS_LOCK = threading.Lock()
#: The process whose obstore runtime this interpreter uses (set on first use).
_RUNTIME_PID: Optional[int] = None


def _obstore():
    try:
        import obstore
        import obstore.store  # noqa: F401
    except ImportError:
        raise MissingRemoteDependencyError(
            "remote datasets (s3://, gs://, az://, https://) need obstore: "
            "pip install 'loaderx[remote]'") from None
    return obstore


def _client(root: str, opts: Options):
    global _RUNTIME_PID
    key = (root, opts)
    c = _CLIENTS.get(key)
    if c is not None:
        return c
    obs = _obstore()
    with _CLIENTS_LOCK:
        c = _CLIENTS.get(key)
        if c is not None:
            return c
        _RUNTIME_PID = os.getpid()
        sch = scheme(root)
        client_options: dict = dict(CLIENT_OPTIONS)
        # Client options given at all replace those obstore reads from the
        # environment: carry its plain-http switch over.
        if sch == "http" or _env_true("AWS_ALLOW_HTTP") or _env_true("AZURE_ALLOW_HTTP") or \
                str(opts.config.get("endpoint", opts.config.get("aws_endpoint", "")))\
                .startswith("http://"):
            client_options["allow_http"] = True
        client_options.update(opts.client_options)
        retry = dict(RETRY_CONFIG)
        retry.update(opts.retry_config)
        kwargs: dict = {}
        if sch == "s3" and os.environ.get("AWS_PROFILE") and not _has_s3_keys(opts):
            kwargs["credential_provider"] = _profile_provider()
        config = dict(opts.config) if sch not in ("http", "https") else None
        try:
            c = obs.store.from_url(root, config=config or None, client_options=client_options,
                                   retry_config=retry, **{k: v for k, v in kwargs.items() if v})
        except BaseException as e:  # a bad key or value (obstore may panic on one)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise InvalidArgumentError(f"{root}: cannot make an object-store client from "
                                       f"storage_options: {_first_line(e)}") from None
        _CLIENTS[key] = c
        return c


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def _has_s3_keys(opts: Options) -> bool:
    return bool(os.environ.get("AWS_ACCESS_KEY_ID")) or any(
        k.lower() in ("access_key_id", "aws_access_key_id") for k in opts.config)


def _profile_provider():
    try:
        from obstore.auth.boto3 import Boto3CredentialProvider
        return Boto3CredentialProvider()
    except Exception:  # no boto3: obstore's own environment chain
        return None


def _forget_clients() -> None:
    _CLIENTS.clear()


# ----------------------------------------------------------------- errors

#: What an error's text holds when the client found no credentials and fell
#: back to asking a cloud machine's metadata service for them (AWS IMDS, its
#: ECS container endpoint, GCE's and Azure's managed identity): off a cloud
#: machine (or with its metadata refused) that is "no credentials".
_METADATA_MARKS = ("/latest/api/token", "/latest/meta-data/iam", "169.254.169.254",
                   "169.254.170.2", "metadata.google.internal", "computemetadata/v1",
                   "/metadata/identity/oauth2")
#: What the HTTP client says when a plain-http URL is not allowed.
_PLAIN_HTTP_MARK = "builder error"

#: Where each cloud's client finds credentials, for the error that found none.
_CREDENTIALS_HELP = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for "
          "temporary ones), or AWS_PROFILE naming a profile of ~/.aws/credentials or "
          "~/.aws/config (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE move them; profiles "
          "need boto3), or pass storage_options={'access_key_id': ..., 'secret_access_key': "
          "...}; a public bucket reads with storage_options={'skip_signature': 'true'}",
    "gs": "set GOOGLE_APPLICATION_CREDENTIALS to a service account key file, or pass "
          "storage_options={'google_service_account': PATH}",
    "az": "set AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY (or "
          "AZURE_STORAGE_SAS_KEY), or pass them in storage_options",
}
#: The switch that lets each cloud's client talk plain HTTP.
_ALLOW_HTTP = {"s3": "AWS_ALLOW_HTTP=true", "az": "AZURE_ALLOW_HTTP=true"}


def _cloud(url: str) -> str:
    sch = scheme(url)
    return "az" if sch in ("azure", "abfs", "abfss") else sch


def _setting_error(e: BaseException, url: str) -> Optional[Exception]:
    """The error of a client whose settings cannot work, naming the setting
    to change (never retried): no credentials found anywhere, or a plain-http
    endpoint the client was not allowed to use."""
    text = str(e).lower()
    cloud = _cloud(url)
    if any(mark in text for mark in _METADATA_MARKS):
        where = _CREDENTIALS_HELP.get(cloud, "pass credentials in storage_options")
        return RemotePermissionError(
            f"{url}: no credentials found (none in the environment or a profile, and no cloud "
            f"machine's metadata service gave any): {where}. The client said: "
            f"{_first_line(e)}", path=url)
    if _PLAIN_HTTP_MARK in text and "http://" in text:
        switch = _ALLOW_HTTP.get(cloud)
        how = f"set {switch} or " if switch else ""
        return RemoteIOError(
            f"{url}: the endpoint is plain http://, which the client refuses unless it is "
            f"allowed: {how}pass storage_options={{'allow_http': 'true'}} (or use https://). "
            f"The client said: {_first_line(e)}", path=url)
    return None


def _classify(e: BaseException) -> str:
    """``hard`` (never retried), ``changed``, or ``retry``."""
    name = type(e).__name__
    if isinstance(e, (FileNotFoundError, PermissionError)) or name in (
            "NotFoundError", "PermissionDeniedError", "UnauthenticatedError", "InvalidPathError",
            "NotSupportedError", "UnknownConfigurationKeyError", "AlreadyExistsError"):
        return "hard"
    text = str(e).lower()
    if _PLAIN_HTTP_MARK in text or any(mark in text for mark in _METADATA_MARKS):
        return "hard"  # settings that cannot work (see _setting_error)
    if name in ("PreconditionError", "NotModifiedError"):
        return "changed"
    return "retry"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:400] if text else type(e).__name__


def _mapped(e: BaseException, url: str, what: str) -> Exception:
    """A loaderx error naming `url` for an obstore (or OS) error."""
    name = type(e).__name__
    msg = f"{url}: {what} failed: {_first_line(e)}"
    setting = _setting_error(e, url)
    if setting is not None:
        return setting
    if isinstance(e, FileNotFoundError) or name == "NotFoundError":
        return RemoteNotFoundError(f"{url}: no such object (or bucket): {_first_line(e)}", path=url)
    if isinstance(e, PermissionError) or name in ("PermissionDeniedError", "UnauthenticatedError"):
        return RemotePermissionError(f"{url}: access denied: {_first_line(e)}", path=url)
    if name in ("PreconditionError", "NotModifiedError"):
        return RemoteChangedError(f"{url}: the object changed on the server since it was opened "
                                  "(reopen the dataset to read the new version)", path=url)
    if name == "AlreadyExistsError":
        return DestinationExistsError(f"{url}: already exists", path=url)
    if name == "NotSupportedError":
        return RemoteIOError(f"{url}: {what} is not supported by this service: {_first_line(e)}",
                             path=url)
    return RemoteIOError(msg, path=url)


def _retrying(url: str, what: str, fn: Callable[[], Any]) -> Any:
    """`fn()` retried on transient failures; hard ones raise at once."""
    for attempt in range(ATTEMPTS):
        try:
            return fn()
        except (RemoteChangedError, RemoteNotFoundError, RemotePermissionError):
            raise
        except Exception as e:
            kind = _classify(e)
            if kind != "retry" or attempt == ATTEMPTS - 1:
                raise _mapped(e, url, what) from None
        time.sleep(_backoff(attempt))
    raise AssertionError("unreachable")


def _backoff(attempt: int) -> float:
    return min(BACKOFF_MAX_S, BACKOFF_S * 2 ** attempt) * random.uniform(0.5, 1.0)


_DURATION = re.compile(r"\s*([0-9.]+)\s*(ms|msec|s|sec|secs|seconds?|m|min|mins|minutes?|h)?\s*")


def timeout_s(opts: Options) -> float:
    """The HTTP client's request timeout in seconds (``timeout`` of the
    client options, as obstore takes it: seconds, a timedelta, or text such
    as ``"3s"``, ``"500ms"``, ``"1m 30s"``); the default's when unreadable."""
    value = opts.client_options.get("timeout", CLIENT_OPTIONS["timeout"])
    if isinstance(value, timedelta):
        return max(0.001, value.total_seconds())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return max(0.001, float(value))
    text, total, at = str(value).strip().lower(), 0.0, 0
    scale = {"ms": 1e-3, "msec": 1e-3, "m": 60.0, "min": 60.0, "mins": 60.0, "h": 3600.0}
    while at < len(text):
        m = _DURATION.match(text, at)
        if m is None or m.end() == at:
            return 60.0
        unit = m.group(2) or "s"
        total += float(m.group(1)) * scale.get(unit, 60.0 if unit.startswith("minute") else 1.0)
        at = m.end()
    return max(0.001, total) if total else 60.0


def read_budget_s(opts: Options) -> float:
    """The longest a read (a HEAD, a GET, a batch's ranged GETs) takes to
    fail for a server that never answers: the request timeout times
    ATTEMPTS (docs/remote.md), however obstore's own retries go."""
    return timeout_s(opts) * ATTEMPTS


def _fault_text(e: BaseException) -> str:
    """A transient fault as people say it."""
    text = _first_line(e)
    low = text.lower()
    if "short response" in low or re.search(r"requested \d+\.\.\d+, got", low):
        return text if text.startswith("short response") else f"short response ({text})"
    if "body error" in low or "reset" in low or "connection closed" in low or \
            "incomplete" in low or "content-range" in low:
        return f"connection reset during the body ({text})"
    return text


def _gave_up(url: str, what: str, last: Optional[BaseException], opts: Options) -> Exception:
    """The error of a read whose retries (or time) ran out; ``last`` None:
    no complete answer came in time."""
    if last is None:
        budget = read_budget_s(opts)
        e = RemoteIOError(f"{url}: {what}: no complete answer within {budget:g} s ({ATTEMPTS} "
                          f"attempts of the {timeout_s(opts):g} s request timeout): the server "
                          "is unreachable or does not answer", path=url)
        setattr(e, _NO_ANSWER, True)
        return e
    if isinstance(last, RemoteIOError) or _classify(last) == "retry":
        return RemoteIOError(f"{url}: {what} failed (its attempts or its "
                             f"{read_budget_s(opts):g} s ran out): {_fault_text(last)}", path=url)
    return _mapped(last, url, what)


#: Set on the RemoteIOError of a read that got no answer in time (see
#: `_gave_up`): no HEAD follows it (it would wait as long again).
_NO_ANSWER = "loaderx_no_answer"


async def _attempted(url: str, what: str, opts: Options, end: float,
                     once: Callable[[], Any], attempts: int = ATTEMPTS) -> Any:
    """``await once()``, retried on transient faults (5xx, resets, a body
    cut short, a short response: obstore retries what fails before the
    body, this retries the rest) with jittered backoff, `attempts` times at
    most and never past `end` (``time.monotonic()``); hard failures raise
    at once, each naming `url`."""
    last: Optional[BaseException] = None
    for attempt in range(attempts):
        left = end - time.monotonic()
        if left <= 0:
            break  # (the time ran out between attempts: the last fault says why)
        try:
            return await asyncio.wait_for(once(), left)
        except LoaderxError as e:
            if not str(e).startswith("short response"):
                raise  # (changed, not found, refused, a lying size: never retried)
            last = e
        except asyncio.TimeoutError:
            last = None
            break
        except Exception as e:
            if _classify(e) != "retry":
                raise _mapped(e, url, what) from None
            last = e
        if attempt + 1 < attempts:
            await asyncio.sleep(max(0.0, min(_backoff(attempt), end - time.monotonic())))
    raise _gave_up(url, what, last, opts)


def _short(url: str, want: int, at: int, got: int) -> RemoteIOError:
    """A response with fewer (or more) bytes than asked: transient (retried)."""
    return RemoteIOError(f"short response: asked for {want} bytes at {at}, got {got}", path=url)


def _on_loop(coro: Any, url: str = "", opts: Optional[Options] = None) -> Any:
    """Runs `coro` on this process's event loop thread and waits for it (a
    read of `url` with `opts`: telling `slow_notice` when it is slow)."""
    future = asyncio.run_coroutine_threadsafe(coro, _loop())
    notice = slow_notice
    if notice is not None and opts is not None:
        after = min(SLOW_NOTICE_S, timeout_s(opts))
        done, _ = concurrent.futures.wait([future], timeout=after)
        if not done:
            notice(url, after, read_budget_s(opts))
    return future.result()


# ----------------------------------------------------------------- the operations
# Each takes (url, opts, ...) and returns plain, picklable values, so the
# helper process of a forked child runs exactly these functions.

#: The start of the version of an object its server sent no ETag for.
WEAK = "lx-weak:"


def _meta(m: Any) -> dict:
    """An object's ``{size, etag, version, weak}``. A server that sends no
    ETag gets one made of the object's size and Last-Modified (``weak``):
    what pins a version there (see remote.bind)."""
    size = int(m["size"])
    etag = m.get("e_tag")
    weak = not etag
    if weak:
        modified = m.get("last_modified")
        stamp = modified.timestamp() if hasattr(modified, "timestamp") else 0
        etag = f"{WEAK}{size}:{stamp}"
    return {"size": size, "etag": etag, "version": m.get("version"), "weak": weak}


def _check_etag(url: str, got: Optional[str], etag: Optional[str]) -> None:
    # A server that ignores If-Match still names the version it sent.
    if etag is not None and got is not None and got != etag:
        raise RemoteChangedError(f"{url}: the object changed on the server since it was opened "
                                 "(reopen the dataset to read the new version)", path=url)


def _head(url: str, opts: Options) -> dict:
    root, key = split(url)
    obs = _obstore()
    client = _client(root, opts)

    async def once() -> dict:
        return _meta(await obs.head_async(client, key))
    return _on_loop(_attempted(url, "HEAD", opts, time.monotonic() + read_budget_s(opts), once),
                    url, opts)


def _get(url: str, opts: Options, etag: Optional[str] = None,
         byte_range: Optional[tuple] = None, limit: int = GET_MAX) -> tuple[bytes, dict]:
    root, key = split(url)
    obs = _obstore()
    client = _client(root, opts)
    options: dict = {}
    if etag is not None and not etag.startswith(WEAK):
        options["if_match"] = etag
    if byte_range is not None:
        options["range"] = byte_range

    async def once() -> tuple[bytes, dict]:
        r = await obs.get_async(client, key, options=options or None)
        meta = _meta(r.meta)
        _check_etag(url, meta["etag"], etag)
        want = byte_range[1] - byte_range[0] if byte_range is not None else meta["size"]
        if byte_range is None and want > limit:
            raise CorruptStoreError(f"{url}: the server says this object is {want} bytes, more "
                                    f"than the {limit} a store's meta or a manifest takes",
                                    path=url)
        data = bytes(await r.bytes_async())
        if len(data) != want:
            raise _short(url, want, byte_range[0] if byte_range is not None else 0, len(data))
        return data, meta
    return _on_loop(_attempted(url, "GET", opts, time.monotonic() + read_budget_s(opts), once),
                    url, opts)


class _Files:
    """Write descriptors of cache files, by path (a few, reused). A
    descriptor is leased for the length of a fetch: making room closes only
    descriptors no fetch is writing through (closing one in use made another
    thread's pwrite fail with EBADF, or land in whatever file took its
    number)."""

    LIMIT = 64

    def __init__(self) -> None:
        self._fds: dict = {}  # (path, dev, inode) -> [fd, leases]
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def lease(self, path: str) -> Iterator[int]:
        st = os.stat(path)  # the file now at `path`, not one deleted since
        key = (path, st.st_dev, st.st_ino)
        with self._lock:
            entry = self._fds.get(key)
            if entry is None:
                if len(self._fds) >= self.LIMIT:
                    for k, (fd, users) in list(self._fds.items()):
                        if not users:
                            os.close(fd)
                            del self._fds[k]
                entry = self._fds[key] = [os.open(path, os.O_WRONLY
                                                  | getattr(os, "O_CLOEXEC", 0)), 0]
            entry[1] += 1
        try:
            yield entry[0]
        finally:
            with self._lock:
                entry[1] -= 1


_FILES = _Files()
_LOOP: Optional[asyncio.AbstractEventLoop] = None
_LOOP_LOCK = threading.Lock()


def _loop() -> asyncio.AbstractEventLoop:
    """One event loop thread per process for concurrent ranged GETs
    (``loaderx-net-loop``, kept for the process like remote.pool())."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="loaderx-net-loop", daemon=True).start()
            _LOOP = loop
        return _LOOP


#: How long the interpreter's exit waits for requests still in flight.
EXIT_DRAIN_S = 10.0
#: And then for obstore's runtime threads to be done handing results over.
EXIT_SETTLE_S = 0.05


def _drain_at_exit() -> None:
    """Lets the requests still in flight at interpreter exit finish, stops
    the loop, then gives obstore's runtime threads a moment to return into
    Python. A runtime thread hands a result over by calling the loop's
    call_soon_threadsafe, which writes to the loop's wake-up socket with the
    GIL released and takes it again after: the loop may already have passed
    the result on and the program ended. If the interpreter is finalising
    by then, Python ends that thread with pthread_exit, and the unwind
    through Rust frames aborts the process (SIGABRT after the program's own
    last line). Waiting here, while Python is whole, lets it return."""
    loop = _LOOP
    if loop is None or not loop.is_running():
        return

    async def drain() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=EXIT_DRAIN_S)

    with contextlib.suppress(TimeoutError, asyncio.TimeoutError, RuntimeError):
        asyncio.run_coroutine_threadsafe(drain(), loop).result(EXIT_DRAIN_S + 1)
    loop.call_soon_threadsafe(loop.stop)
    time.sleep(EXIT_SETTLE_S)


atexit.register(_drain_at_exit)


#: obstore's get_ranges reads ranges closer than this as one request (object_store's
#: coalescing), gap included; ranges in one call are kept further apart than this,
#: so nothing is fetched that the caller did not ask for.
COALESCE_GAP = 1 << 20
#: Ranges per get_ranges call, and calls in flight at once (object_store runs up
#: to 10 of a call's requests at once).
RANGES_PER_CALL = 16
CALLS_IN_FLIGHT = 16


def _calls(starts: Sequence[int], ends: Sequence[int]) -> list:
    """Request numbers in groups for one get_ranges call each: at most
    RANGES_PER_CALL, sorted, each range more than COALESCE_GAP past the one
    before it in its group (first fit)."""
    done: list = []
    open_: list = []
    for i in sorted(range(len(starts)), key=starts.__getitem__):
        for g in open_:
            if starts[i] - ends[g[-1]] > COALESCE_GAP:
                g.append(i)
                if len(g) == RANGES_PER_CALL:
                    open_.remove(g)
                    done.append(g)
                break
        else:
            open_.append([i])
    return done + open_


def _get_ranges_into(url: str, opts: Options, starts: Sequence[int], ends: Sequence[int],
                     path: str, keep: Optional[Sequence[Sequence[tuple]]] = None,
                     etag: Optional[str] = None, head_after: bool = True) -> int:
    """Fetches object bytes ``[starts[i], ends[i])``, many requests in
    flight, and writes them at the same offsets of the file `path` (only the
    sub-ranges ``keep[i]`` of request i when given: the bytes between them
    are on disk already or another fetcher's). With `etag`, the object must
    still be that version once the bytes are in (a HEAD after the GETs;
    `RemoteChangedError` says it is gone, and the caller marks nothing
    present): a store's bytes are never mixed from two versions, and a
    version replaced and put back in between is caught by the records'
    checksums. ``head_after=False`` skips that HEAD (a round trip) unless a
    GET fails: for bytes the caller checks against checksums of the version
    it opened before anyone reads them, which shows a replaced object as
    well (a store's data: its index holds the checksums). Returns the bytes
    fetched. A full disk raises the `OSError` of the write (the caller
    punches what was written).

    The GETs go out as obstore ``get_ranges`` calls of up to RANGES_PER_CALL
    ranges each (one awaitable per call: a third of the client's CPU per
    request of one ``get`` per range, which is what a client sharing its
    cores with the training step runs out of first). A call that fails
    transiently (one of its ranges reset mid-body, or short) is fetched
    again range by range, each with its own attempts; a call gives up after
    `read_budget_s` (the client's timeout times ATTEMPTS)."""
    root, key = split(url)
    starts = [int(s) for s in starts]
    ends = [int(e) for e in ends]
    if not starts:
        return 0
    fetch = _RangeFetch(url, opts, _client(root, opts), key, starts, ends, keep)
    try:
        with _FILES.lease(path) as fd:
            _on_loop(fetch.run(fd))
    except (RemoteIOError, RemoteNotFoundError) as e:
        if etag is not None and not getattr(e, _NO_ANSWER, False):
            # An object replaced by a shorter one, or deleted: say so.
            _check_etag(url, _head(url, opts)["etag"], etag)
        raise
    if etag is not None and head_after:
        _check_etag(url, _head(url, opts)["etag"], etag)
    return sum(e - s for s, e in zip(starts, ends))


class _RangeFetch:
    """The ranged GETs of one `_get_ranges_into`, on the event loop."""

    def __init__(self, url: str, opts: Options, client: Any, key: str, starts: list, ends: list,
                 keep: Optional[Sequence[Sequence[tuple]]]):
        self.url, self.opts, self.client, self.key = url, opts, client, key
        self.starts, self.ends, self.keep = starts, ends, keep
        self.obs = _obstore()

    async def run(self, fd: int) -> None:
        gate = asyncio.Semaphore(CALLS_IN_FLIGHT)
        await _all([self.call(g, gate, fd) for g in _calls(self.starts, self.ends)])

    def _checked(self, i: int, buf: Any) -> memoryview:
        view = memoryview(buf)
        want = self.ends[i] - self.starts[i]
        if len(view) != want:
            raise _short(self.url, want, self.starts[i], len(view))
        return view

    async def _one(self, i: int) -> memoryview:
        buf = await self.obs.get_range_async(self.client, self.key, start=self.starts[i],
                                             end=self.ends[i])
        return self._checked(i, buf)

    async def call(self, group: list, gate: asyncio.Semaphore, fd: int) -> None:
        s = [self.starts[i] for i in group]
        e = [self.ends[i] for i in group]
        async with gate:
            end = time.monotonic() + read_budget_s(self.opts)
            views: Optional[list] = None
            try:
                bufs = await asyncio.wait_for(self.obs.get_ranges_async(
                    self.client, self.key, starts=s, ends=e), read_budget_s(self.opts))
                views = [self._checked(i, b) for i, b in zip(group, bufs)]
            except LoaderxError as err:
                if not str(err).startswith("short response"):
                    raise
            except asyncio.TimeoutError:
                raise _gave_up(self.url, "ranged GET", None, self.opts) from None
            except Exception as err:
                if _classify(err) != "retry":
                    raise _mapped(err, self.url, "ranged GET") from None
            if views is None:  # one fault fails a whole call: range by range, in the time left
                await asyncio.sleep(_backoff(0))
                views = await _all([_attempted(self.url, "ranged GET", self.opts, end,
                                               functools.partial(self._one, i)) for i in group])
        for i, view in zip(group, views):
            for lo, hi in (self.keep[i] if self.keep is not None else
                           ((self.starts[i], self.ends[i]),)):
                _write_all(fd, view[lo - self.starts[i]:hi - self.starts[i]], lo)


async def _all(coros: list) -> list:
    """The results of `coros`, run concurrently; the first error (in order)
    is raised once every request has ended, so no request outlives the call
    that wanted it. (Cancelling them instead leaves their requests running
    in obstore's runtime, which hands each result back to Python when it
    comes: one that comes at interpreter exit aborts the process. Each
    request is bounded by its own deadline, see `_attempted`.)"""
    tasks = [asyncio.ensure_future(c) for c in coros]
    await asyncio.wait(tasks)
    for t in tasks:
        if not t.cancelled():
            t.exception()  # (retrieved: a second failure is not logged as "never retrieved")
    return [t.result() for t in tasks]


def _write_all(fd: int, view: memoryview, offset: int) -> None:
    """Writes all of `view` at `offset` of `fd` (a short write, as a file
    system that fills up gives, is continued, and one that writes nothing
    is ENOSPC): a block is never marked present with a tail missing."""
    while len(view):
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]
        offset += n


#: Multipart uploads: parts of at least PART_MIN bytes (obstore's default of
#: 5 MiB would stop a file at 48.8 GiB on S3, which takes at most PARTS_MAX
#: parts; and some servers price every later GET of an object by its part
#: count, see scripts/bench_remote.py), and at most PARTS_MAX parts, with
#: at most UPLOAD_BUFFER bytes of parts in flight.
PART_MIN = 16 << 20
PARTS_MAX = 10_000
UPLOAD_BUFFER = 256 << 20


def part_plan(nbytes: int, part_min: int = PART_MIN) -> tuple[int, int]:
    """(part size, parts in flight) of a multipart upload of `nbytes`: whole
    MiB, at least `part_min`, at most PARTS_MAX - 1 parts (one spare), at
    most UPLOAD_BUFFER bytes in flight, at least 2 parts at a time."""
    per = -(-max(0, nbytes) // (PARTS_MAX - 1))
    part = max(part_min, -(-per // (1 << 20)) << 20)
    return part, max(2, min(12, UPLOAD_BUFFER // part))


def _put(url: str, opts: Options, source: Any, mode: Any = None,
         part_min: int = PART_MIN) -> dict:
    """Uploads `source` (bytes, or a local file path) to `url`. `mode`:
    None (overwrite), ``"create"`` (fails if it exists) or ``{"e_tag": E}``
    (only if the object is still version E). Parts: `part_plan`."""
    root, key = split(url)
    obs = _obstore()
    inline = isinstance(source, (bytes, bytearray, memoryview))
    part, in_flight = part_plan(len(source) if inline else os.path.getsize(source), part_min)

    def once():
        src = source if inline else _path_obj(source)
        r = obs.put(_client(root, opts), key, src, mode=mode, chunk_size=part,
                    max_concurrency=in_flight)
        return {"etag": r.get("e_tag"), "version": r.get("version")}
    return _retrying(url, "PUT", once)


def _path_obj(p: str):
    from pathlib import Path
    return Path(p)


def _list_keys(url: str, opts: Options, limit: Optional[int] = None) -> list:
    """Keys under the prefix `url` (relative to it) with their sizes; the
    first `limit` only when given."""
    root, key = split(url)
    obs = _obstore()
    prefix = key + "/" if key else ""

    def once():
        out: list = []
        for batch in obs.list(_client(root, opts), prefix or None, chunk_size=limit or 1000):
            for m in batch:
                out.append((m["path"][len(prefix):], int(m["size"])))
            if limit is not None and len(out) >= limit:
                return out[:limit]
        return out
    return _retrying(url, "LIST", once)


def _delete(url: str, opts: Options) -> None:
    root, key = split(url)
    obs = _obstore()
    _retrying(url, "DELETE", lambda: obs.delete(_client(root, opts), key))


_OPS: dict = {"head": _head, "get": _get, "get_ranges_into": _get_ranges_into, "put": _put,
        "list_keys": _list_keys, "delete": _delete}


# ----------------------------------------------------------------- transport

class _Helper:
    """A helper process (a fresh interpreter running `_serve`) that runs the
    operations for a process whose obstore runtime is an ancestor's."""

    def __init__(self):
        env = dict(os.environ)
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.pid = os.getpid()
        self.proc = subprocess.Popen([sys.executable, "-c",
                                      "from loaderx._objstore import _serve; _serve()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                     close_fds=True)
        self.lock = threading.Lock()

    def call(self, op: str, args: tuple) -> Any:
        with self.lock:
            if self.proc.poll() is not None:
                raise RemoteIOError(f"the loaderx object-store helper process exited "
                                    f"({self.proc.returncode})")
            _send(self.proc.stdin, (op, args))
            got = _recv(self.proc.stdout)
        if got is None:
            raise RemoteIOError("the loaderx object-store helper process died")
        status, value = got
        if status == "err":
            raise value
        return value


def _send(f: Any, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def _recv(f: Any) -> Any:
    head = f.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    return pickle.loads(f.read(n))


_HELPER: Optional[_Helper] = None
_HELPER_LOCK = threading.Lock()


def _call(op: str, *args: Any) -> Any:
    """Runs operation `op` here, or in this process's helper when the
    obstore runtime here is a forked copy of an ancestor's."""
    global _HELPER
    if _RUNTIME_PID is None or _RUNTIME_PID == os.getpid():
        return _OPS[op](*args)
    with _HELPER_LOCK:
        if _HELPER is None or _HELPER.pid != os.getpid():
            _HELPER = _Helper()
        helper = _HELPER
    return helper.call(op, args)


def _after_fork_in_child() -> None:
    global _HELPER, _LOOP, _CLIENTS_LOCK, _LOOP_LOCK, _HELPER_LOCK, _FILES
    # The parent's helper, loop thread and locks are not ours; the clients
    # belong to a runtime that does not exist here (never used again).
    _HELPER = None
    _LOOP = None
    _CLIENTS_LOCK = threading.Lock()
    _LOOP_LOCK = threading.Lock()
    _HELPER_LOCK = threading.Lock()
    _FILES = _Files()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def head(url: str, opts: Options) -> dict:
    """``{size, etag, version}`` of the object at `url`."""
    return _call("head", url, opts)


def get(url: str, opts: Options, etag: Optional[str] = None,
        byte_range: Optional[tuple] = None) -> tuple[bytes, dict]:
    """The object's bytes (or ``byte_range`` of them) and its metadata;
    `RemoteChangedError` when `etag` is given and no longer matches."""
    return _call("get", url, opts, etag, byte_range)


def get_ranges_into(url: str, opts: Options, starts: Sequence[int], ends: Sequence[int],
                    path: str, keep: Optional[Sequence[Sequence[tuple]]] = None,
                    etag: Optional[str] = None, head_after: bool = True) -> int:
    """Bytes ``[starts[i], ends[i])`` of the object written at the same
    offsets of the local file `path` (see `_get_ranges_into`)."""
    return _call("get_ranges_into", url, opts, list(starts), list(ends), path,
                 None if keep is None else [list(k) for k in keep], etag, head_after)


def put(url: str, opts: Options, source: Any, mode: Any = None,
        part_min: int = PART_MIN) -> dict:
    return _call("put", url, opts, source, mode, part_min)


def list_keys(url: str, opts: Options, limit: Optional[int] = None) -> list:
    return _call("list_keys", url, opts, limit)


def delete(url: str, opts: Options) -> None:
    _call("delete", url, opts)


def delete_many(urls: Iterable[str], opts: Options) -> None:
    for u in urls:
        try:
            delete(u, opts)
        except RemoteNotFoundError:
            pass


def _serve() -> None:
    """The helper process: runs operations from stdin until it closes."""
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write to the reply pipe
    while True:
        msg = _recv(inp)
        if msg is None:
            return
        op, args = msg
        try:
            reply = ("ok", _OPS[op](*args))
        except BaseException as e:  # sent back and raised in the caller
            try:
                pickle.dumps(e)
                reply = ("err", e)
            except Exception:
                reply = ("err", RemoteIOError(f"{type(e).__name__}: {e}"))
        _send(out, reply)


