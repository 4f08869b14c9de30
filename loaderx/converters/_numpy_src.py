"""NumPy sources: a ``.npy`` file (one column, named after the file), an
``.npz`` archive (one column per array) or a dict of arrays; rows are the
arrays' first axis. Files are read in bounded chunks: ``.npy`` and stored
``.npz`` members through a memory map whose pages are dropped once copied,
compressed ``.npz`` members by streaming decompression.
"""

from __future__ import annotations

import contextlib
import os
import tokenize
import zipfile
import zlib
from typing import IO, Iterator

import numpy as np

from .._checks import drop_source_rows
from ._columns import ColumnSpec, ConvertError
from ._source import (
    Batch,
    Options,
    Source,
    ramped,
    row_tasks,
    rows_per_batch,
    select_columns,
    user_warning,
)

__all__ = ["NumpySource", "npy_header"]


class _Member:
    """One array of an ``.npz``: its header, and rows read on demand."""

    def __init__(self, path: str, name: str):
        self.path, self.name = path, name
        with _reading(f"{path}: array {name[:-4]!r}"):
            with zipfile.ZipFile(path) as zf:
                info = zf.getinfo(name)
                with zf.open(info) as f:
                    shape, fortran, dtype = _read_header(f)
                    self.header_bytes = f.tell()
        self.shape, self.fortran, self.dtype = shape, fortran, dtype
        _check_size(f"{path}: array {name[:-4]!r}", info.file_size - self.header_bytes, shape,
                    dtype)
        self.stored = info.compress_type == zipfile.ZIP_STORED
        self._open_file: IO[bytes] | None = None
        self._open_pos = 0

    def read(self, start: int, stop: int) -> np.ndarray:
        with _reading(f"{self.path}: array {self.name[:-4]!r}"):
            return self._read(start, stop)

    def _read(self, start: int, stop: int) -> np.ndarray:
        row = self.dtype.itemsize * int(np.prod(self.shape[1:], dtype=np.int64))
        if self._open_file is None or self._open_pos > start:
            self.close()
            self._zip = zipfile.ZipFile(self.path)
            self._open_file = self._zip.open(self.name)
            self._open_file.seek(self.header_bytes)
            self._open_pos = 0
        f = self._open_file
        if self._open_pos != start:
            f.seek(self.header_bytes + start * row)
        data = f.read((stop - start) * row)
        self._open_pos = stop
        if len(data) != (stop - start) * row:
            raise ValueError(f"rows {start}..{stop} end early: the archive is truncated")
        return np.frombuffer(data, dtype=self.dtype).reshape(
            (stop - start,) + tuple(self.shape[1:])
        )

    def close(self) -> None:
        if self._open_file is not None:
            self._open_file.close()
            self._zip.close()
            self._open_file = None


#: What reading a damaged .npy/.npz raises: NumPy parses the header with
#: `ast` and `tokenize`, zipfile checks CRCs, zlib inflates.
_DAMAGE_ERRORS = (
    ValueError,
    EOFError,
    SyntaxError,
    TypeError,
    OverflowError,
    OSError,
    tokenize.TokenError,
    zipfile.BadZipFile,
    zlib.error,
)


@contextlib.contextmanager
def _reading(where: str, what: str = ".npy array"):
    """Damage found while reading `where` as a ConvertError naming it."""
    try:
        yield
    except ConvertError:
        raise
    except _DAMAGE_ERRORS as e:
        raise ConvertError(f"{where}: not a readable {what} ({e})") from None


def _check_size(where: str, available: int, shape: tuple, dtype: np.dtype) -> None:
    if dtype.hasobject:
        return  # refused by the source with the column's name; never read
    need = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if available < need:
        raise ConvertError(
            f"{where}: the header says {dtype}{list(shape)} ({need:,} bytes) but only "
            f"{max(available, 0):,} bytes follow it: the file is truncated"
        )


def _read_header(f):
    """(shape, fortran_order, dtype) of the .npy header at `f`; never unpickles.
    A negative dimension is refused here, for .npy files and .npz members
    alike (NumPy's header parser lets it through)."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        header = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        header = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"unsupported .npy format version {version}")
    if any(d < 0 for d in header[0]):
        raise ValueError(f"negative dimensions are not allowed (the header says {header[0]})")
    return header


class _Rows:
    """Rows of one column: an array (maybe memory-mapped) or an .npz member,
    optionally a 1-D array cut into rows of `row_length`."""

    def __init__(self, array=None, member: _Member | None = None, row_length: int | None = None):
        self.array, self.member, self.row_length = array, member, row_length
        src = array if array is not None else member
        assert src is not None  # an array or an .npz member
        shape, self.dtype = tuple(src.shape), np.dtype(src.dtype)
        if row_length:
            if len(shape) != 1:
                raise ConvertError(f"row_length applies to 1-D arrays; this one has shape {shape}")
            shape = (shape[0] // row_length, row_length)
        self.shape = shape

    def read(self, start: int, stop: int) -> np.ndarray:
        scale = self.row_length or 1
        if self.member is not None:
            out = self.member.read(start * scale, stop * scale)
        else:
            out = np.array(self.array[start * scale : stop * scale])
            drop_source_rows(self.array, start * scale, stop * scale)
        return out.reshape((stop - start,) + self.shape[1:])


def _array_columns(arrays: dict, length: int | None) -> dict:
    cols = {}
    for name, a in arrays.items():
        if not isinstance(a, np.ndarray):
            raise ConvertError(f"column {name!r} is a {type(a).__name__}, not a numpy array")
        if str(name) in cols:
            raise ConvertError(f"two arrays are named {str(name)!r} (as column names)")
        cols[str(name)] = _Rows(array=a, row_length=length if a.ndim == 1 else None)
    return cols


def _npz_columns(path: str, length: int | None) -> dict:
    with _reading(path, ".npz archive"):
        with zipfile.ZipFile(path) as zf:
            members = [n for n in zf.namelist() if n.endswith(".npy")]
    cols = {}
    for m in members:
        member = _Member(path, m)
        if member.fortran and len(member.shape) > 1:
            raise ConvertError(
                f"{path}: array {m[:-4]!r} is in Fortran order; save it "
                "with np.ascontiguousarray first"
            )
        cols[m[:-4]] = _Rows(member=member, row_length=length if len(member.shape) == 1 else None)
    return cols


def npy_header(path: str) -> tuple[tuple, np.dtype]:
    """(shape, dtype) of the .npy file `path`, checked to hold all its data;
    a ConvertError naming the file if it is damaged or holds Python objects."""
    with _reading(path):
        with open(path, "rb") as f:
            shape, _, dtype = _read_header(f)
            offset = f.tell()
    if dtype.hasobject:
        raise ConvertError(
            f"{path}: the array holds Python objects (dtype {dtype}), which cannot be stored "
            "(and loaderx never unpickles them); save it as a numeric array"
        )
    _check_size(path, os.path.getsize(path) - offset, shape, dtype)
    return shape, dtype


def _npy_columns(path: str, length: int | None) -> dict:
    npy_header(path)
    with _reading(path):
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    name = os.path.splitext(os.path.basename(path))[0]
    return {name: _Rows(array=a, row_length=length if a.ndim == 1 else None)}


class NumpySource(Source):
    kind = "numpy"
    _open_cols = None  # per process, never pickled

    def __init__(self, source, options: Options):
        super().__init__(options)
        self.path = None if isinstance(source, dict) else os.fspath(source)
        self.arrays = source if isinstance(source, dict) else None
        self._open_cols = None
        cols = self._columns()
        names = select_columns(list(cols), options, self.where)
        self.names = names
        lengths = {n: cols[n].shape[0] if cols[n].shape else None for n in names}
        for n in names:
            if cols[n].dtype.hasobject:
                raise ConvertError(
                    f"{self.where}: column {n!r} holds Python objects (dtype "
                    f"{cols[n].dtype}), which cannot be stored; skip it with "
                    f"{options.flags.skip(n)}"
                )
            if lengths[n] is None:
                raise ConvertError(
                    f"{self.where}: column {n!r} is a 0-d array; rows are the first axis"
                )
        if len(set(lengths.values())) > 1:
            raise ConvertError(
                f"{self.where}: the arrays have different lengths along axis 0: {lengths}"
            )
        rows = next(iter(lengths.values()))
        assert rows is not None  # 0-d columns were refused above
        self.rows: int = rows

    @property
    def where(self) -> str:
        return self.path or "the arrays"

    def _columns(self) -> dict:
        if self._open_cols is not None:
            return self._open_cols
        length = self.options.row_length
        if self.arrays is not None:
            cols = _array_columns(self.arrays, length)
        else:
            assert self.path is not None  # a source is a dict of arrays or a path
            if self.path.endswith(".npz"):
                cols = _npz_columns(self.path, length)
            else:
                cols = _npy_columns(self.path, length)
        self._warn_tail(cols)
        self._open_cols = cols
        return cols

    def _warn_tail(self, cols: dict) -> None:
        for name, c in cols.items():
            if (
                c.row_length
                and (c.array if c.array is not None else c.member).shape[0] % c.row_length
            ):
                total = (c.array if c.array is not None else c.member).shape[0]
                user_warning(
                    f"column {name!r}: {total % c.row_length} trailing values do not fill a "
                    f"row of {c.row_length} and are left out"
                )

    def specs(self) -> list[ColumnSpec]:
        cols = self._columns()
        return [ColumnSpec(n, "dense", cols[n].dtype, tuple(cols[n].shape[1:])) for n in self.names]

    def row_count(self) -> int:
        return self.rows

    def tasks(self, workers: int) -> list:
        return row_tasks(self.rows, workers)

    def read(self, task, specs, batch_bytes: int) -> Iterator[Batch]:
        start, stop = task
        cols = self._columns()
        row_bytes = sum(s.record_bytes() for s in specs)
        step = rows_per_batch(row_bytes, batch_bytes)
        try:
            for a, b in ramped(start, stop, step):
                yield Batch(
                    b - a,
                    {s.name: cols[s.name].read(a, b) for s in specs},
                    b - a,
                    nbytes=(b - a) * row_bytes,
                )
        finally:
            for c in cols.values():
                if c.member is not None:
                    c.member.close()

    def describe(self, file_rows: list | None = None) -> dict:
        d = {"type": "numpy", "path": os.path.abspath(self.path) if self.path else None}
        if self.options.row_length:
            d["row_length"] = self.options.row_length
        return d
