"""Stores written by the original loaderx in its 0.9 layout (the package this
one succeeds under the same name): recognised by ``convert`` and the CLI, read
once, and converted into a dataset. loaderx never reads or writes this layout
otherwise. (Its 1.7 layout, ``store.zr`` and ``N.loc``/``N.chunk`` files, is
``_original177_src``'s, and read in place too: ``loaderx._original``.)

The layout, as the original documents it (every integer little-endian):

* ``meta.zr``: a 16-byte header (magic ``b"ZREC"``, version u16, tail_chunk
  u16, tail_offset u32, length u32), then ``length`` 16-byte entries, one per
  record: offset u32, phys_length u32, logic_length u32, chunk_id u16, codec u8
  (0 raw, 1 zstd, 2 zstd with the dictionary), reserved u8;
* ``0.zr``, ``1.zr``, ...: chunk files; record i is the ``phys_length`` bytes
  at ``offset`` of chunk ``chunk_id``, ``logic_length`` bytes once decoded;
* ``dict.zr``: the zstd dictionary of codec-2 records;
* ``schema.msgpack`` (typed stores only): the kind (``"dense"``/``"ragged"``),
  the dtype and the row shape.

What each becomes: no schema, a `Zrecord` of the records' bytes; ``dense``, a
`DenseStore` of ``dtype[shape]`` (every record must be exactly that size);
``ragged``, a `RaggedStore` whose record i has shape ``(n_i, *shape)`` with
``n_i = logic_length / (itemsize * prod(shape))``: the schema's row shape gives
the trailing dims and logic_length the number of rows (``shape`` empty: 1-D
records). Where ``schema.msgpack`` cannot be read, ``dtype=`` and
``item_shape=`` say what the records are (``item_shape`` given: dense; only
``dtype``: ragged 1-D records); given, they replace the schema.

Entries after the header's ``length`` (written after the original's last
commit) are not records and are ignored. Every file is opened only if it is a
regular file (a FIFO or device is refused by name, never waited on). Every entry is checked before
anything is written (its codec, its chunk file, its byte range, its size
against the schema), and every frame while it is decoded; damage raises
`CorruptStoreError` naming the file and the entry. A store that used a trained
dictionary keeps it: the converted column is ``zstd_dict`` with the same
dictionary (at level 19 unless ``level=`` says otherwise).
"""

from __future__ import annotations

import mmap
import os
from typing import Any, Iterator

import numpy as np

from .._checks import KINDS
from .._lib import error_for, ffi, lib
from .._original import is_original, map_regular, open_regular, read_regular
from .._store import byte_ptr, u64_ptr
from ..errors import CorruptStoreError, DictionaryError
from ._columns import ColumnSpec, ConvertError, Packed
from ._source import Batch, Options, Source, row_tasks, rows_per_batch

__all__ = ["OriginalSource", "is_original_store", "original_summary", "META_NAME"]

META_NAME = "meta.zr"
DICT_NAME = "dict.zr"
SCHEMA_NAME = "schema.msgpack"
MAGIC = b"ZREC"
HEADER = np.dtype(
    [("magic", "S4"), ("version", "<u2"), ("tail_chunk", "<u2"), ("tail_offset", "<u4"),
     ("length", "<u4")]
)
ENTRY = np.dtype(
    [("offset", "<u4"), ("phys_length", "<u4"), ("logic_length", "<u4"), ("chunk_id", "<u2"),
     ("codec", "u1"), ("reserved", "u1")]
)
CODECS = ("raw", "zstd", "zstd_dict")
#: Entries checked at a time (bounds the temporaries of the checks).
_CHECK_BLOCK = 1 << 20
#: The most bytes read of schema.msgpack and dict.zr (more is damage, not a store).
_SCHEMA_MAX = 1 << 20
_DICT_MAX = 1 << 31
#: zstd's dictionary magic number: a trained dictionary, which a loaderx store can keep.
_ZSTD_DICT_MAGIC = b"\x37\xa4\x30\xec"


def is_original_store(path: str) -> bool:
    """True for a directory holding the original loaderx's ``meta.zr`` (its
    0.9 layout, or its 1.7 layout: ``loaderx._original.is_store177``)."""
    return is_original(path)


def chunk_name(chunk_id: int) -> str:
    return f"{chunk_id}.zr"


def _corrupt(path: str, name: str, text: str) -> CorruptStoreError:
    return CorruptStoreError(
        f"{os.path.join(path, name)}: {text} (a damaged store written by the original loaderx)",
        path=path,
    )


class _Layout:
    """The parsed ``meta.zr`` of one store: header fields and the entries
    (a read-only view of the memory-mapped file, never copied whole)."""

    def __init__(self, path: str):
        self.path = path
        self._open_map, size = map_regular(path, META_NAME)
        if size < HEADER.itemsize:
            raise _corrupt(path, META_NAME, f"{size} bytes, shorter than its 16-byte header")
        head = np.frombuffer(self._open_map, HEADER, count=1)[0]
        if bytes(head["magic"]) != MAGIC:
            raise _corrupt(path, META_NAME, f"bad magic {bytes(head['magic'])[:4]!r}, "
                                            f"expected {MAGIC!r}")
        self.version = int(head["version"])
        self.tail_chunk = int(head["tail_chunk"])
        self.tail_offset = int(head["tail_offset"])
        self.length = int(head["length"])
        complete = (size - HEADER.itemsize) // ENTRY.itemsize
        if complete < self.length:
            raise _corrupt(
                path, META_NAME,
                f"the header counts {self.length:,} records but the file holds only "
                f"{complete:,} complete entries: it is truncated at entry {complete:,}",
            )
        self.entries = np.frombuffer(self._open_map, ENTRY, count=self.length,
                                     offset=HEADER.itemsize)

    def close(self) -> None:
        self.entries = self.entries[:0].copy()
        try:
            self._open_map.close()
        except BufferError:  # a view still exported (a caller holds entries); unmapped by GC
            pass


def _read_schema(path: str) -> tuple[dict | None, str | None]:
    """(schema, None), (None, None) without a schema file, or (None, why) when
    ``schema.msgpack`` cannot be read."""
    import msgpack

    file = os.path.join(path, SCHEMA_NAME)
    if not os.path.lexists(file):
        return None, None
    data = read_regular(path, SCHEMA_NAME, _SCHEMA_MAX)  # a FIFO is refused, never waited on
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError) as e:
        return None, f"not readable msgpack ({type(e).__name__}: {e})"
    if not isinstance(raw, dict):
        return None, f"holds a {type(raw).__name__}, not a map"
    raw = {_text(k): _text(v) for k, v in raw.items()}
    kind = raw.get("kind", raw.get("type"))
    if kind not in KINDS:  # the original's kinds are loaderx's
        return None, f"kind is {kind!r}, not 'dense' or 'ragged'"
    if kind == "bytes":
        return {"kind": "bytes"}, None
    try:
        dtype = _dtype(raw.get("dtype"))
        shape = _shape(raw.get("shape", raw.get("row_shape", raw.get("item_shape", ()))))
    except (TypeError, ValueError) as e:
        return None, str(e)
    return {"kind": kind, "dtype": dtype, "shape": shape}, None


def _text(value: Any) -> Any:
    """msgpack bin values (a writer's choice for short strings) as str."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _dtype(value: Any) -> np.dtype:
    if not isinstance(value, (str, np.dtype, type)):
        raise TypeError(f"dtype is {value!r}, not a dtype name")
    dtype = np.dtype(value)
    if dtype.hasobject or dtype.itemsize == 0:
        raise ValueError(f"dtype {dtype} cannot be stored")
    return dtype


def _shape(value: Any) -> tuple:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in value
    ):
        raise ValueError(f"shape is {value!r}, not a list of non-negative ints")
    return tuple(int(d) for d in value)


class OriginalSource(Source):
    """One store of the original loaderx, as one column named after its directory."""

    kind = "loaderx-original"
    # Opened per process, never pickled (Source.__getstate__ leaves _open* behind).
    _open_layout: _Layout | None = None
    _open_chunks: dict[int, np.ndarray] | None = None
    _open_dict: bytes | None = None

    def __init__(self, path: str, options: Options):
        super().__init__(options)
        self.path = os.path.abspath(path)
        name = os.path.basename(self.path.rstrip(os.sep)) or "records"
        self.name = name
        if options.columns not in (None, [name]) or options.skip_columns:
            raise ConvertError(
                f"{self.path}: a store of the original loaderx is one column, {name!r}; "
                "columns= and skip_columns= do not apply"
            )
        if options.row_length:
            raise ConvertError(f"{self.path}: row_length applies to NumPy sources, not to a store "
                               "of the original loaderx")
        layout = self._layout()
        self.rows = layout.length
        self.version = layout.version
        self.schema = self._decide_schema()
        self.spec = self._make_spec()
        self.uses_dict = self._check_entries(layout)

    # -- what the records are

    def _decide_schema(self) -> dict:
        opt = self.options.flags
        schema, why = _read_schema(self.path)
        dtype, shape = self.options.dtype, self.options.item_shape
        if dtype is None and shape is None:
            if why is not None:
                raise CorruptStoreError(
                    f"{os.path.join(self.path, SCHEMA_NAME)}: {why}, so what the records are is "
                    f"unknown; say it with {opt.opt('dtype', 'DTYPE')} and "
                    f"{opt.opt('item_shape', 'SHAPE')} (a DenseStore), or "
                    f"{opt.opt('dtype', 'DTYPE')} alone (a RaggedStore of 1-D records)",
                    path=self.path,
                )
            return schema or {"kind": "bytes"}
        if dtype is None:
            raise ConvertError(f"{self.path}: item_shape= needs dtype= too")
        try:
            dtype = _dtype(dtype)
        except (TypeError, ValueError) as e:
            raise ConvertError(f"{self.path}: {e}") from None
        if shape is None:
            return {"kind": "ragged", "dtype": dtype, "shape": ()}
        try:
            shape = _shape(shape)
        except ValueError as e:
            raise ConvertError(f"{self.path}: item_{e}") from None
        return {"kind": "dense", "dtype": dtype, "shape": shape}

    def _make_spec(self) -> ColumnSpec:
        s = self.schema
        if s["kind"] == "bytes":
            return ColumnSpec(self.name, "bytes", np.dtype(np.uint8), None)
        if s["kind"] == "dense":
            return ColumnSpec(self.name, "dense", s["dtype"], s["shape"])
        return ColumnSpec(self.name, "ragged", s["dtype"], s["shape"])

    def _row_bytes(self) -> int:
        """Bytes of one dense record, or of one row of a ragged record."""
        s = self.schema
        if s["kind"] == "bytes":
            return 1
        return int(s["dtype"].itemsize * int(np.prod(s["shape"], dtype=np.int64)))

    # -- checks before anything is written

    def _check_entries(self, layout: _Layout) -> bool:
        """Checks every entry; returns whether any record uses the dictionary."""
        entries = layout.entries
        chunk_sizes: dict[int, int] = {}
        uses_dict = False
        row_bytes = self._row_bytes()
        for start in range(0, len(entries), _CHECK_BLOCK):
            block = entries[start:start + _CHECK_BLOCK]
            codec = block["codec"]
            phys = block["phys_length"].astype(np.int64)
            logic = block["logic_length"].astype(np.int64)
            self._first_bad(start, codec > 2, META_NAME,
                            lambda k: f"entry {k:,} has codec {entries[k]['codec']}, not 0 (raw), "
                                      "1 (zstd) or 2 (zstd_dict)")
            self._first_bad(start, (codec == 0) & (phys != logic), META_NAME,
                            lambda k: f"entry {k:,} is stored raw but its phys_length "
                                      f"{entries[k]['phys_length']} differs from its "
                                      f"logic_length {entries[k]['logic_length']}")
            uses_dict = uses_dict or bool((codec == 2).any())
            self._check_sizes(start, logic, row_bytes)
            ids = block["chunk_id"]
            for cid in np.unique(ids):
                cid = int(cid)
                if cid not in chunk_sizes:
                    chunk_sizes[cid] = self._chunk_size(cid, start + int(np.argmax(ids == cid)))
            ends = block["offset"].astype(np.int64) + phys
            table = np.zeros(int(ids.max()) + 1 if len(ids) else 0, np.int64)
            for cid, size in chunk_sizes.items():
                if cid < len(table):
                    table[cid] = size
            sizes = table[ids]
            self._first_bad(start, ends > sizes, None,
                            lambda k: self._past_end_text(k, chunk_sizes))
        if uses_dict and not os.path.lexists(os.path.join(self.path, DICT_NAME)):
            k = int(np.argmax(entries["codec"] == 2))
            raise _corrupt(self.path, DICT_NAME,
                           f"missing, but entry {k:,} is compressed with the dictionary")
        return uses_dict

    def _past_end_text(self, k: int, chunk_sizes: dict) -> str:
        e = self._layout().entries[k]
        name = chunk_name(int(e["chunk_id"]))
        return (f"{os.path.join(self.path, name)}: entry {k:,} (offset {int(e['offset']):,}, "
                f"phys_length {int(e['phys_length']):,}) ends past the end of the chunk file "
                f"({chunk_sizes[int(e['chunk_id'])]:,} bytes)")

    def _first_bad(self, start: int, bad: np.ndarray, name: str | None, text) -> None:
        if bad.any():
            k = start + int(np.argmax(bad))
            if name is None:
                raise CorruptStoreError(f"{text(k)} (a damaged store written by the original "
                                        "loaderx)", path=self.path)
            raise _corrupt(self.path, name, text(k))

    def _check_sizes(self, start: int, logic: np.ndarray, row_bytes: int) -> None:
        kind = self.schema["kind"]
        if kind == "bytes":
            return
        what = f"{self.schema['dtype']}{list(self.schema['shape'])}"
        if kind == "dense":
            self._first_bad(start, logic != row_bytes, META_NAME,
                            lambda k: f"entry {k:,} holds {int(logic[k - start]):,} bytes, not the "
                                      f"{row_bytes:,} of a dense {what} record")
        elif row_bytes == 0:
            self._first_bad(start, logic != 0, META_NAME,
                            lambda k: f"entry {k:,} holds bytes, but ragged {what} rows are empty")
        else:
            self._first_bad(start, logic % row_bytes != 0, META_NAME,
                            lambda k: f"entry {k:,} holds {int(logic[k - start]):,} bytes, not a "
                                      f"whole number of ragged rows of {what} ({row_bytes:,} "
                                      "bytes each)")

    def _chunk_size(self, cid: int, first_entry: int) -> int:
        file = os.path.join(self.path, chunk_name(cid))
        if not os.path.lexists(file):
            raise CorruptStoreError(
                f"{file}: missing, but entry {first_entry:,} is stored in it (a damaged store "
                "written by the original loaderx)", path=self.path)
        fd = open_regular(self.path, chunk_name(cid))  # a FIFO or device is refused by name
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    # -- opened per process

    def _layout(self) -> _Layout:
        if self._open_layout is None:
            self._open_layout = _Layout(self.path)
        return self._open_layout

    def _chunk(self, cid: int) -> np.ndarray:
        if self._open_chunks is None:
            self._open_chunks = {}
        arr: np.ndarray | None = self._open_chunks.get(cid)
        if arr is None:
            m, _ = map_regular(self.path, chunk_name(cid))
            arr = self._open_chunks[cid] = np.frombuffer(m, np.uint8)
        return arr

    def _dictionary(self) -> bytes:
        if self._open_dict is None:
            self._open_dict = read_regular(self.path, DICT_NAME, _DICT_MAX)
        return self._open_dict

    def _close(self) -> None:
        for arr in (self._open_chunks or {}).values():
            base = arr.base
            del arr
            if isinstance(base, mmap.mmap):
                try:
                    base.close()
                except BufferError:
                    pass
        self._open_chunks = None

    # -- the Source interface

    def specs(self) -> list[ColumnSpec]:
        return [self.spec]

    def row_count(self) -> int:
        return self.rows

    def tasks(self, workers: int) -> list:
        return row_tasks(self.rows, workers)

    def dictionaries(self, codecs: dict) -> dict:
        """The store's own trained dictionary for its column, when its records
        used one and the column is compressed (the codec becomes zstd_dict)."""
        if not self.uses_dict or codecs.get(self.name) != "zstd":
            return {}
        d = self._dictionary()
        if not d.startswith(_ZSTD_DICT_MAGIC):
            return {}  # a raw-content dictionary: loaderx stores need a trained one
        codecs[self.name] = "zstd_dict"
        return {self.name: d}

    def read(self, task, specs, batch_bytes: int) -> Iterator[Batch]:
        start, stop = task
        entries = self._layout().entries
        mean = float(entries["logic_length"][start:stop].mean()) if stop > start else 1.0
        step = rows_per_batch(mean, batch_bytes)
        try:
            for a in range(start, stop, step):
                b = min(a + step, stop)
                yield Batch(b - a, {self.name: self._records(a, b)}, b - a)
        finally:
            self._close()

    def read_all(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Records start..stop decoded: (their bytes end to end, their offsets)."""
        e = self._layout().entries[start:stop]
        logic = e["logic_length"].astype(np.uint64)
        out = np.empty(int(logic.sum()), np.uint8)
        splits = np.zeros(len(e) + 1, np.int64)
        np.cumsum(logic, out=splits[1:])
        ids = e["chunk_id"]
        cuts = np.flatnonzero(np.diff(ids)) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(e)]):
            lo, hi = int(lo), int(hi)
            self._decode_run(start + lo, e[lo:hi], out[splits[lo]:splits[hi]])
        return out, splits

    def _decode_run(self, first: int, e: np.ndarray, dst: np.ndarray) -> None:
        """Entries `e` (all in one chunk, the first being record `first`) into `dst`."""
        cid = int(e["chunk_id"][0])
        src = self._chunk(cid)
        offsets = np.ascontiguousarray(e["offset"], dtype=np.uint64)
        sizes = np.ascontiguousarray(e["phys_length"], dtype=np.uint64)
        logic = np.ascontiguousarray(e["logic_length"], dtype=np.uint64)
        codecs = np.ascontiguousarray(e["codec"], dtype=np.uint8)
        d = self._dictionary() if (codecs == 2).any() else b""
        bad = ffi.new("uint64_t *")
        rc = lib.lx_decode_frames(
            byte_ptr(src), len(src), u64_ptr(offsets), u64_ptr(sizes), byte_ptr(codecs), len(e),
            byte_ptr(dst, writable=True), len(dst), u64_ptr(logic), d if d else ffi.NULL, len(d),
            bad,
        )
        _release_pages(src, offsets, sizes)
        if rc == 0:
            return
        err = error_for(rc)
        if bad[0] >= len(e):
            if isinstance(err, DictionaryError):
                raise _corrupt(self.path, DICT_NAME, f"not a usable zstd dictionary ({err})")
            raise err
        k = first + int(bad[0])
        entry = e[int(bad[0])]
        raise CorruptStoreError(
            f"{os.path.join(self.path, chunk_name(cid))}: entry {k:,} "
            f"({CODECS[int(entry['codec'])]}, offset {int(entry['offset']):,}, phys_length "
            f"{int(entry['phys_length']):,}) does not decode to its {int(entry['logic_length']):,} "
            f"bytes: {err} (a damaged store written by the original loaderx)",
            path=self.path,
        )

    def _records(self, a: int, b: int):
        out, splits = self.read_all(a, b)
        kind = self.schema["kind"]
        if kind == "bytes":
            return Packed(out, splits)
        dtype, shape = self.schema["dtype"], self.schema["shape"]
        values = out.view(dtype) if len(out) else np.zeros(0, dtype)
        if kind == "dense":
            return values.reshape((b - a,) + shape)
        row = self._row_bytes()
        if row == 0:  # rows of zero bytes: the checks let only empty records through
            return Packed(np.zeros((0,) + shape, dtype), np.zeros(b - a + 1, np.int64))
        return Packed(values.reshape((-1,) + shape), splits // row)

    def describe(self, file_rows: list | None = None) -> dict:
        return {"type": "loaderx-original", "path": self.path, "format_version": self.version,
                "schema": self.schema["kind"]}


def _release_pages(src: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> None:
    """Drop the chunk pages a run read, so a big store read once does not stay resident."""
    base = src.base
    if not isinstance(base, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED") or not len(offsets):
        return
    lo = int(offsets.min()) // mmap.PAGESIZE * mmap.PAGESIZE
    hi = int((offsets + sizes).max()) // mmap.PAGESIZE * mmap.PAGESIZE
    if hi > lo:
        base.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def original_summary(path: str) -> dict:
    """What `loaderx info` says about an original store (raises
    `CorruptStoreError` for damage it finds; frames are not decoded)."""
    src = OriginalSource(path, Options())
    layout = src._layout()
    codecs = np.bincount(layout.entries["codec"], minlength=3)[:3] if src.rows else np.zeros(3)
    chunks = sorted({int(c) for c in np.unique(layout.entries["chunk_id"])}) if src.rows else []
    schema = src.schema
    out = {
        "path": src.path,
        "layout": "loaderx-original",
        "format_version": src.version,
        "records": src.rows,
        "kind": schema["kind"],
        "dtype": str(schema["dtype"]) if "dtype" in schema else None,
        "shape": list(schema["shape"]) if "shape" in schema else None,
        "becomes": src.spec.describe(),
        "chunks": len(chunks),
        "codecs": {name: int(n) for name, n in zip(CODECS, codecs) if n},
        "dictionary_bytes": os.path.getsize(os.path.join(src.path, DICT_NAME))
        if os.path.isfile(os.path.join(src.path, DICT_NAME)) else 0,
        "payload_bytes": int(layout.entries["logic_length"].sum(dtype=np.int64)),
        "stored_bytes": int(layout.entries["phys_length"].sum(dtype=np.int64)),
    }
    layout.close()
    return out
