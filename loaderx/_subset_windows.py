"""Token windows over a selected set of documents: ``TokenWindows(view,
seq_len)`` where `view` is a `loaderx.select` view of a ragged token column.

The token stream is the selected documents concatenated in source order,
with the optional separator between two of them, exactly as `TokenWindows`
defines it for a whole store; window ``i`` covers tokens ``[i * seq_len, i *
seq_len + seq_len + 1)``. The index is the prefix sums of the selected
documents' lengths, taken from the whole store's cached index (O(selected)
after that). A gather finds each window's documents with a binary search,
reads all of them in one gather of the base column, and copies the
overlaps into the batch. It is read by Python (on the loader's worker
threads): the native window gather reads a store's documents by their own
ordinals, not through a selection.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from ._checks import check_out, is_int
from ._store import normalize_indices
from ._token_index import index_of

__all__ = ["SubsetWindows"]


class SubsetWindows:
    """`TokenWindows` of the documents a view selects (see the module docs)."""

    kind = "dense"

    def __init__(self, view: Any, seq_len: int, *, separator: Optional[int] = None):
        base = view.base
        if getattr(base, "kind", None) != "ragged":
            raise TypeError(f"TokenWindows reads documents of a ragged token column; this view "
                            f"holds {getattr(base, 'kind', '?')} records")
        dtype = np.dtype(base.dtype)
        if dtype.kind not in "iu" or dtype.itemsize not in (1, 2, 4, 8):
            raise TypeError(f"token documents must hold integers, not {dtype}")
        if not is_int(seq_len) or seq_len < 1:
            raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
        if separator is not None and not np.can_cast(np.min_scalar_type(separator), dtype):
            raise ValueError(f"separator must be a token id of {dtype}, got {separator!r}")
        if len(view) == 0:
            raise ValueError(f"TokenWindows needs at least one document; {view!r} is empty")
        self._view = view
        self._seq_len = int(seq_len)
        self._separator = None if separator is None else int(separator)
        self._dtype = dtype
        whole = np.asarray(index_of(base, dtype.itemsize, None), dtype=np.int64)
        self._lengths = np.diff(whole)[view.rows]
        gap = 1 if separator is not None else 0
        starts = np.zeros(len(view) + 1, np.int64)
        np.cumsum(self._lengths + gap, out=starts[1:])
        starts[-1] -= gap  # no separator after the last document
        self._starts = starts
        total = int(starts[-1])
        self._len = (total - 1) // self._seq_len if total else 0
        self.segments = _Segments(self)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def item_shape(self) -> Tuple[int]:
        return (self._seq_len + 1,)

    @property
    def seq_len(self) -> int:
        return self._seq_len

    @property
    def separator(self) -> Optional[int]:
        return self._separator

    @property
    def total_tokens(self) -> int:
        return int(self._starts[-1])

    @property
    def fingerprint(self) -> str:
        return f"token windows of {self._seq_len} over the {self._view.fingerprint}"

    @property
    def fingerprint_aliases(self) -> Tuple[str, ...]:
        return tuple(f"token windows of {self._seq_len} over the {alias}"
                     for alias in self._view.fingerprint_aliases)

    def __len__(self) -> int:
        return self._len

    def gather(self, indices, out: Optional[np.ndarray] = None, *, threads: int = 0) -> np.ndarray:
        idx = normalize_indices(indices, self._len)[0].astype(np.int64)
        return self._fill(idx, out, None)[0]

    def _fill(self, idx: np.ndarray, tokens: Optional[np.ndarray],
              segments: Optional[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
        width = self._seq_len + 1
        if tokens is None:
            tokens = np.empty((len(idx), width), self._dtype)
        if segments is None:
            segments = np.empty((len(idx), width), np.int32)
        check_out(tokens, (len(idx), width), self._dtype, holds="the windows hold")
        check_out(segments, (len(idx), width), np.dtype(np.int32), holds="segments are")
        if not len(idx):
            return tokens, segments
        starts = self._starts
        first = np.searchsorted(starts, idx * self._seq_len, side="right") - 1
        last = np.searchsorted(starts, idx * self._seq_len + width - 1, side="right") - 1
        last = np.minimum(last, len(self._lengths) - 1)
        docs = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first, last)]))
        values, splits = self._view.gather(docs, packed=True)
        where = {int(d): k for k, d in enumerate(docs.tolist())}
        for row, (w, a, b) in enumerate(zip(idx.tolist(), first.tolist(), last.tolist())):
            lo = w * self._seq_len
            hi = lo + width
            for ordinal, d in enumerate(range(a, b + 1)):
                k = where[d]
                doc = values[splits[k]:splits[k + 1]]
                s = int(starts[d])
                x, y = max(lo, s), min(hi, s + len(doc))
                if y > x:
                    tokens[row, x - lo:y - lo] = doc[x - s:y - s]
                    segments[row, x - lo:y - lo] = ordinal
                sep = s + len(doc)
                if self._separator is not None and d + 1 < len(self._lengths) and lo <= sep < hi:
                    tokens[row, sep - lo] = self._separator
                    segments[row, sep - lo] = ordinal
        return tokens, segments

    def __getitem__(self, key):
        scalar = is_int(key)
        got = self.gather([key] if scalar else key)
        return got[0] if scalar else got

    def __reduce__(self):
        return (_rebuild, (self._view, self._seq_len, self._separator))

    def __repr__(self) -> str:
        return (f"TokenWindows({self._view!r}, seq_len={self._seq_len}, len={self._len}, "
                "read by Python)")


def _rebuild(view: Any, seq_len: int, separator: Optional[int]) -> SubsetWindows:
    return SubsetWindows(view, seq_len, separator=separator)


class _Segments:
    """The document ordinals of the windows (int32), as `TokenWindows.segments`."""

    kind = "dense"
    dtype = np.dtype(np.int32)

    def __init__(self, windows: SubsetWindows):
        self._windows = windows

    @property
    def item_shape(self) -> Tuple[int]:
        return self._windows.item_shape

    @property
    def fingerprint(self) -> str:
        return f"segments of the {self._windows.fingerprint}"

    @property
    def fingerprint_aliases(self) -> Tuple[str, ...]:
        return tuple(f"segments of the {alias}" for alias in self._windows.fingerprint_aliases)

    def __len__(self) -> int:
        return len(self._windows)

    def gather(self, indices, out: Optional[np.ndarray] = None, *, threads: int = 0) -> np.ndarray:
        idx = normalize_indices(indices, len(self._windows))[0].astype(np.int64)
        return self._windows._fill(idx, None, out)[1]

    def __getitem__(self, key):
        scalar = is_int(key)
        got = self.gather([key] if scalar else key)
        return got[0] if scalar else got
