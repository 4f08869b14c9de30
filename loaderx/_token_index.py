"""The token index of a store: the prefix sums of its documents' token
counts, from which window ``i``'s documents are found by binary search.
Shared by `TokenWindows` (a whole store or ShardSet) and the windows of a
`loaderx.select` view (`_subset_windows`), which takes the whole store's
index and keeps the selected documents' lengths."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ._lib import check, ffi, lib

__all__ = ["index_of", "store_index"]


def index_of(store: Any, itemsize: int, separator: Optional[int]) -> np.ndarray:
    """The prefix sums of `store`'s documents (a ShardSet's: its shards' put
    together, a separator between shards too)."""
    shards = getattr(store, "shards", None)
    if shards is None:
        return store_index(store, itemsize, separator)
    pieces, offset = [], 0
    nonempty = [s for s in shards if len(s)]
    for k, shard in enumerate(nonempty):
        p = store_index(shard, itemsize, separator if shard.kind == "ragged" else None)
        pieces.append(p[:-1] + offset)
        offset += int(p[-1]) + (1 if separator is not None and k + 1 < len(nonempty) else 0)
    pieces.append(np.array([offset], np.uint64))
    return np.ascontiguousarray(np.concatenate(pieces), dtype=np.uint64)


def store_index(store: Any, itemsize: int, separator: Optional[int]) -> np.ndarray:
    """One store's prefix sums, natively: from its windows.idx where that is
    valid (copied in, checked), the record table for the rest."""
    docs = len(store) if store.kind == "ragged" else 1  # a store of token ids: one document
    if getattr(store, "is_remote", False):
        store._remote.all_index()  # every document's size, in the cache's replica
    prefix = np.empty(docs + 1, np.uint64)
    check(lib.lx_windows_index(store._h(), itemsize, separator is not None,
                               ffi.cast("uint64_t *", prefix.ctypes.data), docs),
          store.path, "token window index")
    return prefix
