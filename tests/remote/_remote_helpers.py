"""What the remote tests (tests/remote/) share besides fixtures: the shape of
the test dataset (conftest.py), opening it from its URL, the environment of
a child process that imports this loaderx, and numpy views of a cache's
mapped state in the layout generated from src/cache_format.zig
(tests/_lxlayout.py)."""
from __future__ import annotations

import os

import numpy as np

import loaderx

from _lxlayout import (
    CACHE_HEAD_OFFSETS,
    CACHE_PAGE,
    CACHE_STATE_SIZE,
    REPLICA_HEAD_OFFSETS,
)


REC = 3000  # bytes of a dense record
# The parts of the test dataset, below its generation directory.
RAW = "gen-000001/raw/part-00000"
ZZ = "gen-000001/zz/part-0000"
N = 400
NONE = 2**64 - 1  # a watermark with nothing behind it


def replica_state(r) -> dict:
    """A replica's mapped ``cache.state`` as numpy arrays (the layout
    src/cache_format.zig documents): head words by name, the bitmaps and ticks."""
    info = r.info()
    mm = np.memmap(os.path.join(r.dir, "cache.state"), np.uint8, "r+")
    head = mm[:CACHE_PAGE].view(np.uint64)
    words = mm[CACHE_PAGE:].view(np.uint64)
    iw, n = -(-int(info.index_blocks) // 64), int(info.regions)
    return {"head": head, "evictions": REPLICA_HEAD_OFFSETS["evictions"] // 8,
            "ibits": words[:iw], "dwords": words[iw:iw + n], "atime": words[iw + n:iw + 2 * n],
            "ptime": words[iw + 2 * n:iw + 3 * n]}


def cache_head(cache) -> np.ndarray:
    """The cache's mapped ``state`` head (u64 words; CACHE_HEAD_OFFSETS)."""
    mm = np.memmap(os.path.join(cache.root, "state"), np.uint8, "r+", shape=(CACHE_STATE_SIZE,))
    return mm[:CACHE_PAGE].view(np.uint64)


SEQ = CACHE_HEAD_OFFSETS["seq"] // 8


def opened(url, cache, s3, endpoint=None, **kw):
    return loaderx.open_dataset(url, cache_dir=str(cache), storage_options=s3.options(endpoint),
                                **kw)


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(loaderx.__file__)))]
        + [p for p in [os.environ.get("PYTHONPATH")] if p]))
