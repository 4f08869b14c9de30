"""Typed dataset columns: text, categoricals and nulls, on top of the stores
that hold them, and the scalar columns' values as arrays for predicates.

A converted dataset keeps what the source said about a column in its
manifest (``loaderx.json``), additively to the store's own identity:

* ``"text": true`` — a Zrecord of UTF-8 strings, read back as ``str``;
* ``"categories": [...]`` — a DenseStore of int8/16/32 codes into these
  names (-1 for a null), the layout of pandas categoricals and Arrow
  dictionaries; ``"labels"`` (an image folder's classes, a Hugging Face
  ``ClassLabel``; ``"class_names"`` before) names the values of an integer
  label column the same way (`loaderx.labels` reads both);
* ``"valid": "<name>.valid"`` — the column had nulls: ``<name>.valid`` is a
  bool DenseStore column, False where the source held a null (the mask
  column says ``"valid_of": "<name>"``);
* ``"timezone": "Europe/Paris"`` — zone-aware timestamps: the values are
  the UTC instants (numpy's datetime64 holds no zone), written in that zone.

`open_dataset` wraps such columns in a `Column`: it reads like the store
(``len``, ``col[i]``, ``gather``), says what it holds (``.text``,
``.categories``, ``.valid``, ``.timezone``) and gives ``str`` for text and ``None`` for a
null in list outputs. A dense column's mask is also a column of the dataset
(``ds["age.valid"]``), so a loader over the dataset yields it alongside the
values; a list column's nulls are ``None`` items instead.

`scalar_chunks` gives a scalar column's values as numpy arrays without
reading them: a raw DenseStore with ``item_shape=()`` keeps its records as
one contiguous array in its ``data`` file (record ``i`` at ``i * itemsize``),
so a read-only memory map of that file *is* the column. Predicates
(`loaderx.select`) scan these maps; per-batch gathers stay native store
gathers. The map is a snapshot of the records committed when it was made
(records are immutable until a ``delete`` or ``compact``, which datasets
never do behind a reader's back).
"""
from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence

import numpy as np

from . import _records
from ._store import normalize_indices
from .errors import CorruptStoreError

__all__ = ["Column", "scalar_chunks", "is_scalar", "column_parts"]

_LIST_KINDS = ("ragged", "bytes")


class Column:
    """A dataset column whose type says more than its store's (see the
    module docs). `stream`: the store or ShardSet of the values; `valid`: the
    mask's store or ShardSet (None: no nulls); `categories`: names of the
    codes (a categorical) or of the integer labels (``labels=True``);
    `timezone`: the zone of timestamps stored as UTC instants."""

    def __init__(self, stream: Any, *, name: str = "", text: bool = False,
                 categories: Optional[Sequence] = None, labels: bool = False,
                 valid: Any = None, timezone: Optional[str] = None):
        self._stream = stream
        self._name = name
        self._text = bool(text)
        self._categories = tuple(categories) if categories is not None else None
        self._labels = bool(labels)
        self._valid = valid
        self._timezone = timezone

    # -- what it holds
    @property
    def stream(self) -> Any:
        """The store or ShardSet holding the values (codes, UTF-8 bytes)."""
        return self._stream

    @property
    def name(self) -> str:
        return self._name

    @property
    def text(self) -> bool:
        """True for a string column: records read back as ``str``."""
        return self._text

    @property
    def categories(self) -> Optional[tuple]:
        """The names of a categorical's codes (code ``k`` is
        ``categories[k]``, -1 a null), or of an integer label column's
        values (Hugging Face ``ClassLabel``); None for other columns."""
        return self._categories

    @property
    def categorical(self) -> bool:
        """Codes of a categorical (pandas, Arrow dictionary): predicates
        compare the names. An integer label column with names is not one."""
        return self._categories is not None and not self._labels

    @property
    def valid(self) -> Any:
        """The validity mask (a bool store or ShardSet, False: null), or None."""
        return self._valid

    @property
    def timezone(self) -> Optional[str]:
        """The zone of a zone-aware timestamp column (``"Europe/Paris"``), or
        None. Its records are UTC instants: numpy's datetime64 holds no zone
        (``pandas.to_datetime(col[:], utc=True).tz_convert(col.timezone)``
        gives the times in it)."""
        return self._timezone

    @property
    def kind(self) -> str:
        return self._stream.kind

    @property
    def dtype(self) -> np.dtype:
        return self._stream.dtype

    @property
    def item_shape(self) -> Any:
        return self._stream.item_shape

    def __len__(self) -> int:
        return len(self._stream)

    # -- reads
    def gather(self, indices, out: Optional[np.ndarray] = None, *, packed: bool = False,
               threads: int = 0) -> Any:
        """Records `indices`: what the store gives for dense columns (codes
        of a categorical, values of a nullable column: see ``.valid``); a
        list for the others, ``str`` items for text, None for a null.
        ``packed=True`` gives the stored values packed, as the store does
        (``(values, row_splits)``: UTF-8 bytes for text; nulls are where
        ``.valid`` is False)."""
        if self.kind == "dense" or packed:
            return self._stream.gather(indices, out=out, packed=packed, threads=threads)
        if out is not None:
            raise TypeError(f"out= applies to dense columns; {self._name!r} holds {self.kind} "
                            "records")
        idx, _ = normalize_indices(indices, len(self._stream))
        records = self._stream.gather(idx, threads=threads)
        if self._text:
            records = [bytes(r).decode("utf-8", "replace") for r in records]
        if self._valid is not None and len(idx):
            for i in np.flatnonzero(~self._valid.gather(idx)).tolist():
                records[i] = None
        return records

    def __getitem__(self, key):
        idx, scalar = normalize_indices(key, len(self))
        got = self.gather(idx)
        return got[0] if scalar else got

    def names_of(self, codes) -> np.ndarray:
        """The category names of `codes` (a categorical's values), as a
        numpy string array (None where a code is -1)."""
        if self._categories is None:
            raise TypeError(f"column {self._name!r} has no categories")
        table = np.array(list(self._categories) + [None], dtype=object)
        codes = np.asarray(codes)
        count = len(self._categories)
        if codes.dtype.kind not in "iu":
            raise TypeError(f"names_of takes integer codes, not {codes.dtype}")
        if codes.size and (int(codes.min()) < -1 or int(codes.max()) >= count):
            bad = int(codes.min()) if int(codes.min()) < -1 else int(codes.max())
            raise ValueError(f"column {self._name!r}: the code {bad} names none of its "
                             f"{count} categories")
        return table[np.where(codes < 0, count, codes)]

    # -- the native read protocol: only where nothing is left to decode
    def _native(self) -> bool:
        return self.kind == "dense" or not (self._text or self._valid is not None)

    def __getattr__(self, attr: str) -> Any:
        # Everything else (path, codec, shards, stats, verify, ...) is the
        # store's. The read protocols are the store's only where this column
        # adds nothing to decode: a native read of text would give bytes.
        if attr.startswith("__") or attr in ("native_parts", "native_windows"):
            stream = self.__dict__.get("_stream")
            if stream is not None and attr == "native_parts" and self._native():
                return getattr(stream, attr)
            raise AttributeError(attr)
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self._stream, attr)

    def close(self) -> None:
        self._stream.close()
        if self._valid is not None:
            self._valid.close()

    def __enter__(self) -> "Column":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        # A reference: the stores pickle as references themselves.
        return (_rebuild, (self._stream, self._name, self._text, self._categories, self._labels,
                           self._valid, self._timezone))

    def __repr__(self) -> str:
        what = []
        if self._text:
            what.append("text")
        if self._categories is not None:
            shown = ", ".join(map(repr, self._categories[:5]))
            more = ", ..." if len(self._categories) > 5 else ""
            what.append(f"{'labels' if self._labels else 'categories'}=[{shown}{more}]")
        if self._valid is not None:
            what.append("nullable")
        if self._timezone is not None:
            what.append(f"timezone={self._timezone!r}")
        return f"Column({self._name!r}, {', '.join(what)}, {self._stream!r})"


def _rebuild(stream, name, text, categories, labels, valid, timezone=None) -> Column:
    return Column(stream, name=name, text=text, categories=categories, labels=labels,
                  valid=valid, timezone=timezone)


def wrap_columns(opened: dict, manifest_columns: dict) -> dict:
    """`open_dataset`'s columns with their manifest types applied: typed
    columns wrapped in a `Column`; a list column's mask folded into it (its
    nulls read as None), a dense column's mask kept as its own column."""
    out = {}
    for name, stream in opened.items():
        entry = manifest_columns.get(name, {})
        owner = entry.get("valid_of")
        if owner is not None and owner in opened and opened[owner].kind in _LIST_KINDS:
            continue  # read through its column
        mask = opened.get(entry.get("valid", ""), None)
        cats = entry.get("categories")
        names = entry.get("labels", entry.get("class_names"))  # integer labels' names
        labels = cats is None and names is not None
        if labels:
            cats = names
        zone = _zone_of(name, entry, stream)
        if entry.get("text") or cats is not None or mask is not None or zone is not None:
            stream = Column(stream, name=name, text=bool(entry.get("text")), categories=cats,
                            labels=labels, valid=mask, timezone=zone)
        out[name] = stream
    return out


def _zone_of(name: str, entry: dict, stream: Any) -> Optional[str]:
    """A column's ``"timezone"``, checked: a zone's name, on timestamps."""
    zone = entry.get("timezone")
    if zone is None:
        return None
    if not isinstance(zone, str) or not zone or np.dtype(stream.dtype).kind != "M":
        raise CorruptStoreError(f"the manifest's column {name!r} has a malformed 'timezone': "
                                f"{str(zone)[:80]!r} on {stream.dtype} records")
    return zone


# ----------------------------------------------------------------- values as arrays

def column_parts(stream: Any) -> List[Any]:
    """The stores of a store or ShardSet (or a Column's values), in index order."""
    stream = stream.stream if isinstance(stream, Column) else stream
    shards = getattr(stream, "shards", None)
    return list(shards) if shards is not None else [stream]


def is_scalar(stream: Any) -> bool:
    """A column of one value per record: dense ``item_shape=()`` or text."""
    if isinstance(stream, Column) and stream.text:
        return True
    return getattr(stream, "kind", None) == "dense" and tuple(stream.item_shape or ()) == ()


def scalar_chunks(stream: Any) -> List[np.ndarray]:
    """A dense column's values, one read-only array per store: a memory map
    of a raw store's records (no copy, nothing read until used), or one
    native gather of every record for a compressed store."""
    chunks = []
    for store in column_parts(stream):
        n = len(store)
        mapped = store.as_array() if hasattr(store, "as_array") else None
        if mapped is None:
            mapped = store.gather(np.arange(n, dtype=np.int64)) if n else \
                np.zeros((0,) + tuple(store.item_shape), store.dtype)
            mapped.flags.writeable = False
        chunks.append(mapped)
    return chunks


def text_chunks(stream: Any) -> List[tuple]:
    """A text or byte column's records as ``(bytes buffer, int64 offsets)``
    per store (Arrow's string layout), each from one native read."""
    out = []
    for store in column_parts(stream):
        n = len(store)
        idx = np.arange(n, dtype=np.uint64)
        if n and getattr(store, "is_remote", False):
            out.append(_remote_texts(store, n))
            continue
        if n:
            buf, raw, _ = _records.read_variable(store._parts, 1, idx, 0, store.path)
        else:
            buf, raw = np.zeros(0, np.uint8), np.zeros(0, np.uint64)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(raw, out=offsets[1:])
        out.append((buf, offsets))
    return out


#: A remote text column is read through the cache in gathers of this many
#: records (every record fetched and checked before it is read).
TEXT_CHUNK_RECORDS = 1 << 16


def _remote_texts(store: Any, n: int) -> tuple:
    """A remote store's records as ``(bytes, offsets)``: packed gathers
    through the cache, a chunk at a time (its replica holds holes where
    nothing was fetched, which a direct read would take for empty strings)."""
    bufs, sizes = [], []
    for start in range(0, n, TEXT_CHUNK_RECORDS):
        values, splits = store.gather(np.arange(start, min(n, start + TEXT_CHUNK_RECORDS)),
                                      packed=True)
        bufs.append(np.asarray(values, np.uint8).reshape(-1))
        sizes.append(np.diff(splits))
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.concatenate(sizes), out=offsets[1:])
    return np.concatenate(bufs) if len(bufs) > 1 else bufs[0], offsets


def store_path_of(stream: Any) -> Optional[str]:
    """The dataset directory a column was opened from (``DEST/col/part-N``), if any."""
    parts = column_parts(stream)
    path = getattr(parts[0], "path", None) if parts else None
    if not path:
        return None
    root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    return root if os.path.isfile(os.path.join(root, "loaderx.json")) else None
