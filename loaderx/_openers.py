"""Where a path leads: a local path opens in place; a URL (``s3://``,
``gs://``, ``az://``, ``https://``...) opens through the opener of remote
locations, which `loaderx.remote` registers here when loaderx is imported.

This module sits below every store and dataset module and imports none of
them: the core (stores, shard sets, datasets, select, the converters) asks
`remote` for what a URL needs, and never imports `loaderx.remote`, which
builds on the core (a remote store is a local store over the cache's
replica). One registry, one opener: every URL scheme loaderx reads is object
storage (`loaderx._objstore` knows which schemes those are).
"""
from __future__ import annotations

from typing import Any, Callable, ContextManager, Optional, Protocol, Sequence

from ._objstore import is_url
from .errors import MissingRemoteDependencyError

__all__ = ["Remote", "register", "remote", "bind_all", "is_url"]


class Remote(Protocol):
    """What the core asks of the opener of remote locations."""

    def bind(self, url: str) -> Any:
        """The replica binding the store at `url` reads through (`local_dir`,
        `begin`, `end`, ...): one made up front by `opening`, else a new one."""

    def opening(self, bound: Any) -> ContextManager[None]:
        """A context in which stores opened at these URLs use these bindings
        (a binding, or ``{url: binding}``) instead of binding again."""

    def settings(self, cache_dir: Any, cache_limit: Any,
                 storage_options: Any) -> ContextManager[Any]:
        """A context in which URL opens use these settings (None: the
        enclosing ones, else the defaults); yields them (picklable)."""

    def resume(self, settings: Any) -> ContextManager[Any]:
        """`settings` (what `settings` yielded, maybe in another process) in force."""

    def concurrently(self, fn: Callable, items: Sequence) -> list:
        """``[fn(x) for x in items]`` on the network threads."""

    def manifest_text(self, url: str) -> bytes:
        """The bytes of the dataset manifest under `url`."""

    def exists(self, url: str) -> bool:
        """Whether an object lives at `url`."""

    def write_store(self, url: str, mode: str, build: Callable[[str], Any]) -> None:
        """`build(local_dir)` writes a store locally; it is then uploaded to `url`."""

    def write_dataset(self, url: str, mode: str, build: Callable[[str], dict],
                      cli: bool) -> dict:
        """`build(local_dir)` converts a dataset locally and returns its
        manifest; it is then uploaded and published at `url` per `mode`."""


_REMOTE: Optional[Remote] = None


def register(opener: Remote) -> None:
    """Makes `opener` the one that opens URLs (loaderx.remote, at import)."""
    global _REMOTE
    _REMOTE = opener


def remote(url: str) -> Remote:
    """The opener of the URL `url`."""
    if _REMOTE is None:
        raise MissingRemoteDependencyError(
            f"{url}: URLs are read through loaderx.remote, which is not loaded (import "
            "loaderx.remote; pip install 'loaderx[remote]' for object storage)")
    return _REMOTE


def bind_all(urls: Sequence[str]) -> dict:
    """``{url: binding}`` of the stores at `urls`, bound concurrently (each
    is a few requests), for `Remote.opening`."""
    opener = remote(urls[0])
    return dict(zip([u.rstrip("/") for u in urls], opener.concurrently(opener.bind, urls)))
