"""Column types: which store a source column becomes, and how a batch of
source values turns into what that store's ``append`` takes.

The mapping (the table in the README):

======================================  ==========================================
source column                           store
======================================  ==========================================
scalar numbers, bools, timestamps       DenseStore, ``item_shape=()`` (raw: a
                                        contiguous value array, see docs/select.md)
categoricals (Arrow dictionaries of     DenseStore of int8/16/32 codes, the
strings or integers)                    category names in the manifest
fixed-size lists, tensors, fixed-size   DenseStore, ``item_shape`` = the fixed shape
images
lists whose rows all have one length    DenseStore, ``item_shape=(n, *fixed trailing)``
other variable-length lists, sequences  RaggedStore (records ``(n, *fixed trailing)``)
strings (UTF-8)                         Zrecord, marked ``"text"`` (read back as str)
binary, encoded files                   Zrecord
======================================  ==========================================

Equal-length lists and probed images are *provisional* dense columns: the
source decides "dense" from its first rows (`ColumnSpec.provisional`), and
when a later batch does not fit that shape it hands over ragged records
instead; the writer then moves what it wrote into a RaggedStore and goes on
(``_run.write_task``), so the decision never needs a second pass over the
source and is never wrong.

Anything else (structs, maps, decimals, nested variable lists) is refused
with a `ConvertError` that names the column and the flag that skips it.

A zone-aware timestamp (Arrow ``timestamp[ns, tz=Europe/Paris]``, a pandas
``datetime64[ns, Europe/Paris]`` column) keeps its zone: the values are the
UTC instants Arrow holds, and the manifest names the zone (``"timezone"``),
which the dataset's column reports (`loaderx.columns.Column.timezone`).

Nulls never stop a conversion. A null float scalar becomes NaN (and a null
timestamp NaT in the values). Any other null row is stored as a filler value
(0, False, "", an empty list; NaT for timestamps) and the column gets a
validity mask: a ``bool`` DenseStore column ``<name>.valid`` (False where the
source had a null) that the dataset reads alongside. Nulls *inside* lists
become NaN (floats), NaT (timestamps) or 0, with a warning. ``fill_null=``
replaces nulls by a value instead (no mask).
"""

from __future__ import annotations

import io
import shlex
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import ConvertError, MissingDependencyError

__all__ = [
    "ColumnSpec",
    "ConvertError",
    "MissingDependencyError",
    "Flags",
    "Nullable",
    "Packed",
    "code_dtype",
    "mask_spec",
    "arrow_spec",
    "arrow_to_batch",
    "decode_image",
    "fixed_list_spec",
    "list_lengths",
    "image_target_mode",
    "normal_mode",
    "PER_IMAGE",
    "require",
]


def require(module: str, extra: str, what: str):
    """Import an optional dependency or say which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(
            f"{what} needs the Python package {module.split('.')[0]!r}: "
            f"pip install 'loaderx[{extra}]'"
        ) from None


@dataclass(frozen=True)
class Flags:
    """How to name an option in a message: as a CLI flag or a Python keyword."""

    cli: bool = False

    def skip(self, column: str) -> str:
        # Shell-quoted: a column name may hold spaces or quotes.
        return f"--skip-columns {shlex.quote(column)}" if self.cli else f"skip_columns=[{column!r}]"

    def opt(self, name: str, value: str = "") -> str:
        if self.cli:
            return f"--{name.replace('_', '-')}" + (f" {shlex.quote(value)}" if value else "")
        return f"{name}={value or 'True'}"

    def fill(self, column: str, value: str = "VALUE") -> str:
        """How to ask for `column`'s nulls to become `value`."""
        if self.cli:
            return f"--fill-null {shlex.quote(f'{column}={value}')}"
        return f"fill_null={{{column!r}: {value}}}"


@dataclass(frozen=True)
class Packed:
    """A batch of variable-size records as one flat buffer and its offsets
    (Arrow's layout): record i is ``values[splits[i]:splits[i + 1]]``. The
    stores append it with ``append_packed``, with no Python object per record."""

    values: Any
    splits: np.ndarray

    def __len__(self) -> int:
        return len(self.splits) - 1


@dataclass(frozen=True)
class Nullable:
    """A batch of a column that has nulls: `values` (what the store appends,
    nulls replaced by a filler) and `valid`, one bool per row (False: null)."""

    values: Any
    valid: np.ndarray

    def __len__(self) -> int:
        return len(self.valid)


@dataclass(frozen=True)
class ColumnSpec:
    """What one column becomes. `item_shape`: a dense record's shape; for a
    ragged column the trailing dims every record shares (``()`` for 1-D
    records) or None when records have any shape. `decode` tells the source
    how to turn raw values into records (``"image"``, ``"int"``, ``"npy"``).
    `provisional`: a dense column decided from the first rows, which becomes
    ragged (`as_ragged`) if a later row has another shape. `codec`: this
    column's codec whatever the conversion's (None: the conversion's)."""

    name: str
    kind: str
    dtype: np.dtype
    item_shape: tuple | None = None
    decode: str = ""
    codec: str | None = None
    extra: dict = field(default_factory=dict, compare=False)
    provisional: bool = field(default=False, compare=False)
    #: ``fill_null`` for this column: nulls become this value (no mask).
    fill: Any = field(default=None, compare=False)
    #: The manifest's ``content`` of this column's mask (a conversion of
    #: loaderx data copies the source mask's; see `mask_spec`).
    mask_content: Any = field(default=None, compare=False)

    def as_ragged(self) -> "ColumnSpec":
        """The RaggedStore column a provisional dense one falls back to: a
        list column keeps its fixed trailing dimensions, images and arrays
        keep any shape."""
        assert self.kind == "dense" and self.provisional
        trailing = None if self.decode in ("image", "npy") else tuple(self.dense_shape[1:])
        extra = dict(self.extra)
        if "image_mode" in extra:  # later images keep their own modes (see decode_image)
            extra["image_mode"] = PER_IMAGE
        return replace(self, kind="ragged", item_shape=trailing, provisional=False, extra=extra)

    @property
    def dense_shape(self) -> tuple:
        """`item_shape` of a dense column, which always has one."""
        assert self.item_shape is not None
        return self.item_shape

    def record_bytes(self) -> int:
        if self.kind == "dense":
            return int(self.dtype.itemsize * int(np.prod(self.dense_shape, dtype=np.int64)))
        return 0

    def describe(self) -> str:
        if self.kind == "dense":
            return f"DenseStore {self.dtype}{list(self.dense_shape)}"
        if self.kind == "ragged":
            return f"RaggedStore {self.dtype}"
        return "Zrecord"


# ----------------------------------------------------------------- Arrow types


def _leaf_dtype(pa, t) -> np.dtype | None:
    """The numpy dtype of an Arrow leaf type, or None."""
    if pa.types.is_boolean(t):
        return np.dtype(np.bool_)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.dtype(t.to_pandas_dtype())
    if pa.types.is_timestamp(t):
        return np.dtype(f"datetime64[{t.unit}]")
    if pa.types.is_duration(t):
        return np.dtype(f"timedelta64[{t.unit}]")
    return None


def _zone(pa, t) -> dict:
    """A zone-aware timestamp type's zone, for the manifest: its values are
    stored as they are in Arrow, UTC instants (numpy's datetime64 has no
    zone), and the column says in which zone they were written."""
    if pa.types.is_timestamp(t) and t.tz:
        return {"timezone": str(t.tz)}
    return {}


def _is_list(pa, t) -> bool:
    return (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


def _is_bytes(pa, t) -> bool:
    return any(
        f(t)
        for f in (
            pa.types.is_binary,
            pa.types.is_large_binary,
            pa.types.is_string,
            pa.types.is_large_string,
            pa.types.is_fixed_size_binary,
            pa.types.is_binary_view,
            pa.types.is_string_view,
        )
    )


def _fixed_chain(pa, t) -> tuple[tuple, Any]:
    """Dims of nested fixed-size lists and the type inside them."""
    dims = []
    while pa.types.is_fixed_size_list(t):
        dims.append(t.list_size)
        t = t.value_type
    return tuple(dims), t


def _extension_shape(t) -> tuple | None:
    """The fixed record shape of a tensor extension type (Arrow's
    fixed_shape_tensor, Ray's tensor type, Hugging Face ArrayND), if any."""
    shape = getattr(t, "shape", None)
    if shape is None:
        return None
    perm = getattr(t, "permutation", None)
    if perm is not None and list(perm) != sorted(perm):
        return None
    return tuple(None if d is None else int(d) for d in shape)


def _extension_value_type(pa, t):
    for attr in ("value_type", "scalar_type"):
        v = getattr(t, attr, None)
        if v is not None:
            return v if isinstance(v, pa.DataType) else pa.from_numpy_dtype(np.dtype(v))
    return None


def arrow_spec(pa, name: str, t, flags: Flags) -> ColumnSpec:
    """The ColumnSpec of an Arrow column type, or a ConvertError naming the skip flag."""
    if pa.types.is_dictionary(t):
        return arrow_spec(pa, name, t.value_type, flags)
    if isinstance(t, pa.ExtensionType):
        return _extension_spec(pa, name, t, flags)
    leaf = _leaf_dtype(pa, t)
    if leaf is not None:
        return ColumnSpec(name, "dense", leaf, (), extra=_zone(pa, t))
    if _is_bytes(pa, t):
        text = "string" in str(t)
        return ColumnSpec(
            name,
            "bytes",
            np.dtype(np.uint8),
            None,
            decode="utf8" if text else "",
            extra={"text": True} if text else {},
        )
    dims, inner = _fixed_chain(pa, t)
    inner_leaf = _leaf_dtype(pa, inner)
    if dims and inner_leaf is not None:
        return ColumnSpec(name, "dense", inner_leaf, dims, extra=_zone(pa, inner))
    if _is_list(pa, t):
        tdims, tinner = _fixed_chain(pa, t.value_type)
        tinner_leaf = _leaf_dtype(pa, tinner)
        if tinner_leaf is not None:
            return ColumnSpec(name, "ragged", tinner_leaf, tdims, extra=_zone(pa, tinner))
    raise unmappable(name, f"Arrow type {t}", flags)


def _extension_spec(pa, name: str, t, flags: Flags) -> ColumnSpec:
    ext = getattr(t, "extension_name", "")
    value = _extension_value_type(pa, t)
    leaf = _leaf_dtype(pa, value) if value is not None else None
    if leaf is not None and "variable_shaped" in ext:
        return ColumnSpec(name, "ragged", leaf, None, decode="ray-variable")
    shape = _extension_shape(t)
    if leaf is not None and shape is not None:
        if all(d is not None for d in shape):
            return ColumnSpec(name, "dense", leaf, shape, decode="tensor")
        if shape[0] is None and all(d is not None for d in shape[1:]):
            return ColumnSpec(name, "ragged", leaf, shape[1:], decode="tensor")
    try:
        return arrow_spec(pa, name, t.storage_type, flags)
    except ConvertError:
        raise unmappable(name, f"Arrow extension type {ext or t}", flags) from None


def unmappable(name: str, what: str, flags: Flags) -> ConvertError:
    return ConvertError(
        f"column {name!r} ({what}) has no loaderx store type (numbers, fixed or variable-length "
        f"lists of numbers, tensors, strings and binary are supported); skip it with "
        f"{flags.skip(name)}"
    )


# ----------------------------------------------------------------- Arrow values


def _whole_rows(i: int) -> int:
    return i


def _fill_slots(pa, arr):
    """`arr` (a level of lists inside a row) with its null lists replaced by
    empty ones (fixed-size: of fillers), so its offsets and flattened values
    agree: ``flatten()`` skips what a null slot covers, ``offsets`` do not."""
    if not arr.null_count:
        return arr
    import pyarrow.compute as pc

    return pc.fill_null(arr, pa.scalar(_zero(pa, arr.type, True), arr.type))


def _leaf_numpy(arr, spec: ColumnSpec, row0: int, flags: Flags, locate) -> np.ndarray:
    if arr.null_count:
        arr = _fill_leaf_nulls(arr, spec, row0, flags, locate)
    values = arr.to_numpy(zero_copy_only=False)
    return values if values.dtype == spec.dtype else values.astype(spec.dtype)


def _fill_leaf_nulls(arr, spec: ColumnSpec, row0: int, flags: Flags, locate):
    """Null values inside lists: NaN for floats and NaT for timestamps (what
    ``to_numpy`` makes of them), else `spec.fill` or 0, with a warning."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if spec.dtype.kind in "fmM" and spec.fill is None:
        return arr
    if spec.fill is None:
        first = locate(int(np.flatnonzero(~arr.is_valid().to_numpy(zero_copy_only=False))[0]))
        warnings.warn(
            f"column {spec.name!r}: {arr.null_count} null values inside lists (the first in "
            f"row {row0 + first}) are stored as 0; {flags.fill(spec.name)} chooses the value",
            stacklevel=2,
        )
    try:
        return pc.fill_null(arr, pa.scalar(spec.fill if spec.fill is not None else 0, arr.type))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
        raise ConvertError(f"column {spec.name!r}: fill_null value {spec.fill!r}: {e}") from None


def _list_level(pa, arr, spec: ColumnSpec, row0: int, flags: Flags, locate=_whole_rows):
    """(offsets relative to the flattened values, flattened values) of a list array."""
    arr = _fill_slots(pa, arr)
    if pa.types.is_list_view(arr.type) or pa.types.is_large_list_view(arr.type):
        arr = arr.cast(pa.large_list(arr.type.value_type))
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    return offsets - offsets[0], arr.flatten()


def _in_fixed_lists(size: int, locate):
    """`locate` for the flattened values of lists of `size` values each."""
    return lambda i: locate(i // size)


def _in_lists(offsets: np.ndarray, locate):
    """`locate` for the flattened values of lists with `offsets`."""
    return lambda i: locate(int(np.searchsorted(offsets, i, side="right")) - 1)


def _dense_values(
    pa, arr, spec: ColumnSpec, row0: int, flags: Flags, locate=_whole_rows
) -> np.ndarray:
    """Every leaf value of a batch of fixed-shape records, checked to fill the shape."""
    count = len(arr)
    per_row = int(np.prod(spec.dense_shape, dtype=np.int64))
    while not (_leaf_dtype(pa, arr.type) is not None):
        if pa.types.is_fixed_size_list(arr.type):
            arr = _fill_slots(pa, arr)
            size = arr.type.list_size
            locate = _in_fixed_lists(size, locate)
            arr = arr.flatten()
        elif _is_list(pa, arr.type):
            offsets, arr = _list_level(pa, arr, spec, row0, flags, locate)
            locate = _in_lists(offsets, locate)
            if len(offsets) > 1 and len(set(np.diff(offsets).tolist())) > 1:
                raise ConvertError(
                    f"column {spec.name!r}: rows {row0}..{row0 + count - 1} hold "
                    f"tensors of different shapes, not {spec.item_shape}"
                )
        else:
            raise ConvertError(f"column {spec.name!r}: unexpected Arrow type {arr.type}")
    values = _leaf_numpy(arr, spec, row0, flags, locate)
    if values.size != count * per_row:
        raise ConvertError(
            f"column {spec.name!r}: rows {row0}..{row0 + count - 1} do not all have "
            f"the shape {spec.item_shape}"
        )
    return values.reshape((count,) + tuple(spec.dense_shape))


def list_lengths(pa, arr) -> np.ndarray | None:
    """The length of every row of a (variable-size) list array, or None for
    another type. Null rows count as length 0."""
    if not _is_list(pa, arr.type):
        return None
    if pa.types.is_list_view(arr.type) or pa.types.is_large_list_view(arr.type):
        return np.asarray(arr.value_lengths().fill_null(0), dtype=np.int64)
    return np.diff(np.asarray(arr.offsets, dtype=np.int64))


def _fixed_length(pa, arr, length: int) -> bool:
    """Whether every row of the list array `arr` holds `length` values."""
    lengths = list_lengths(pa, arr)
    return lengths is None or bool((lengths == length).all())


def fixed_list_spec(spec: ColumnSpec, lengths: np.ndarray) -> ColumnSpec:
    """A ragged list column whose probed rows (`lengths`) all have one
    non-zero length, as a provisional dense column of that length."""
    if spec.kind != "ragged" or spec.decode or spec.item_shape is None or not len(lengths):
        return spec
    first = int(lengths[0])
    if first == 0 or not (lengths == first).all():
        return spec
    return replace(spec, kind="dense", item_shape=(first, *spec.item_shape), provisional=True)


def _ragged_records(pa, arr, spec: ColumnSpec, row0: int, flags: Flags) -> list | Packed:
    if spec.decode == "ray-variable":
        return [np.asarray(x) for x in arr.to_numpy(zero_copy_only=False)]
    offsets, values = _list_level(pa, arr, spec, row0, flags)
    inner = ColumnSpec(
        spec.name, "dense", spec.dtype, tuple(spec.item_shape or ()), fill=spec.fill
    )
    flat = _dense_values(pa, values, inner, row0, flags, _in_lists(offsets, _whole_rows))
    return Packed(flat, offsets)


def _byte_records(pa, arr, spec: ColumnSpec, row0: int, flags: Flags) -> Packed:
    if not (pa.types.is_large_binary(arr.type) or pa.types.is_binary(arr.type)):
        arr = arr.cast(pa.large_binary())
    buffers = arr.buffers()
    width = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offsets = np.frombuffer(buffers[1], dtype=width)[
        arr.offset : arr.offset + len(arr) + 1
    ].astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else b""
    return Packed(data[offsets[0] : offsets[-1]], offsets - offsets[0])


def arrow_to_batch(pa, arr, spec: ColumnSpec, row0: int, flags: Flags):
    """A batch of one column (an Arrow array) as what the column's store
    appends; a `Nullable` when rows of it are null (see the module docs)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if spec.decode == "categorical":
        return _categorical_codes(pa, arr, spec)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if isinstance(arr.type, pa.ExtensionType) and spec.decode != "ray-variable":
        arr = arr.storage
    valid = None
    if arr.null_count and spec.decode != "ray-variable":
        valid, arr = _fill_rows(pa, arr, spec)
    values: Any
    if spec.kind == "dense":
        if spec.provisional and not _fixed_length(pa, arr, spec.dense_shape[0]):
            values = _ragged_records(pa, arr, spec.as_ragged(), row0, flags)
        else:
            values = _dense_values(pa, arr, spec, row0, flags)
    elif spec.kind == "ragged":
        values = _ragged_records(pa, arr, spec, row0, flags)
    else:
        values = _byte_records(pa, arr, spec, row0, flags)
    return values if valid is None else Nullable(values, valid)


def _fill_rows(pa, arr, spec: ColumnSpec):
    """(validity or None, `arr` with its null rows filled). Float scalars
    become NaN and need no mask; `spec.fill` replaces nulls without a mask."""
    import pyarrow.compute as pc

    float_scalar = pa.types.is_floating(arr.type) and spec.fill is None
    valid = None if float_scalar or spec.fill is not None else (
        arr.is_valid().to_numpy(zero_copy_only=False)
    )
    try:
        filler = _row_filler(pa, arr.type, spec.fill, spec)
        return valid, pc.fill_null(arr, filler)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError,
            ValueError, OverflowError) as e:
        what = f"fill_null value {spec.fill!r}" if spec.fill is not None else "a filler"
        raise ConvertError(
            f"column {spec.name!r} ({arr.type}): cannot replace its nulls with {what} ({e})"
        ) from None


def _row_filler(pa, t, fill, spec: ColumnSpec):
    """The Arrow scalar that takes a null row's place: for a dense column of
    equal-length lists, a list of that length (an empty one would make the
    column ragged)."""
    listed = _is_list(pa, t) or pa.types.is_fixed_size_list(t)
    if fill is not None and not listed:
        if isinstance(fill, pa.Scalar):
            return fill.cast(t)  # (a safe cast: it refuses to lose anything)
        scalar = pa.scalar(fill, t)
        # Arrow truncates a float into an integer type without a word
        # (1.5 -> 1); a float column rounds, which is what a float is for.
        if not pa.types.is_floating(t) and scalar.as_py() != fill:
            raise ValueError(f"it would be stored as {scalar.as_py()!r}")
        return scalar
    if spec.kind == "dense" and _is_list(pa, t):
        return pa.scalar(_zeros(pa, t, tuple(spec.dense_shape)), t)
    return pa.scalar(_zero(pa, t), t)


def _zeros(pa, t, shape: tuple):
    """Nested Python lists of `shape` of the filler of `t`'s leaf type."""
    while _is_list(pa, t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    leaf = _zero(pa, t, True)
    out: Any = leaf
    for n in reversed(shape):
        out = [out] * n
    return out


def _zero(pa, t, nested: bool = False):
    """A Python value of Arrow type `t` for a null row: 0, False, "", an
    empty list, a list of such; NaN for floats, NaT for timestamps (inside
    a fixed-size list: 0, which Arrow can build)."""
    if pa.types.is_floating(t):
        return float("nan")
    if pa.types.is_timestamp(t) or pa.types.is_duration(t):
        return 0 if nested else int(np.iinfo(np.int64).min)  # numpy's NaT
    if pa.types.is_boolean(t):
        return False
    if pa.types.is_integer(t):
        return 0
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return ""
    if _is_bytes(pa, t):
        return b"\0" * t.byte_width if pa.types.is_fixed_size_binary(t) else b""
    if pa.types.is_fixed_size_list(t):
        return [_zero(pa, t.value_type, True)] * t.list_size
    if _is_list(pa, t):
        return []
    raise TypeError(f"no filler value for {t}")


# ----------------------------------------------------------------- categoricals


def code_dtype(count: int) -> np.dtype:
    """The narrowest signed code type for `count` categories (-1: null)."""
    for dt in (np.int8, np.int16, np.int32):
        if count <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise ConvertError(f"{count:,} categories are more than an int32 code holds")


def is_categorical(pa, t) -> bool:
    """An Arrow dictionary of strings or integers: stored as codes + names."""
    return pa.types.is_dictionary(t) and (
        pa.types.is_string(t.value_type)
        or pa.types.is_large_string(t.value_type)
        or pa.types.is_integer(t.value_type)
    )


def categorical_spec(name: str, categories: list) -> ColumnSpec:
    return ColumnSpec(
        name,
        "dense",
        code_dtype(len(categories)),
        (),
        decode="categorical",
        extra={"categories": list(categories)},
    )


def add_categories(pa, arr, found: dict) -> None:
    """Adds the categories of a dictionary array (or chunks) to `found`, in order."""
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    for chunk in chunks:
        for value in chunk.dictionary.to_pylist():
            if value is not None:
                found.setdefault(value, len(found))


def _categorical_codes(pa, arr, spec: ColumnSpec):
    """A dictionary array's values as codes into the column's categories
    (every batch's own dictionary mapped to the one the column keeps)."""
    import pyarrow.compute as pc

    categories = spec.extra["categories"]
    if not pa.types.is_dictionary(arr.type):
        raise ConvertError(f"column {spec.name!r}: expected categories, got Arrow type {arr.type}")
    value_set = pa.array(categories, type=arr.type.value_type)
    where = pc.index_in(arr.dictionary, value_set=value_set)
    if where.null_count:
        missing = arr.dictionary.filter(where.is_null()).to_pylist()[:5]
        raise ConvertError(
            f"column {spec.name!r}: categories {missing} were not seen when the column's "
            "categories were collected"
        )
    codes = where.take(arr.indices)
    valid = None
    if codes.null_count:
        valid = codes.is_valid().to_numpy(zero_copy_only=False)
        codes = pc.fill_null(codes, -1)
    values = codes.to_numpy(zero_copy_only=False).astype(spec.dtype)
    if spec.fill is not None and valid is not None:
        fill = spec.fill
        if fill not in categories:
            raise ConvertError(
                f"column {spec.name!r}: fill_null value {fill!r} is not one of its "
                f"categories {categories[:10]}"
            )
        values[~valid] = categories.index(fill)
        valid = None
    return values if valid is None else Nullable(values, valid)


def mask_name(name: str) -> str:
    return f"{name}.valid"


def mask_spec(spec: ColumnSpec) -> ColumnSpec:
    """The validity mask column of `spec`: one bool per row."""
    extra: dict = {"valid_of": spec.name}
    if spec.mask_content is not None:
        extra["content"] = spec.mask_content
    return ColumnSpec(mask_name(spec.name), "dense", np.dtype(np.bool_), (), extra=extra)


def with_extra(spec: ColumnSpec, **extra) -> ColumnSpec:
    return replace(spec, extra={**spec.extra, **extra})


# ----------------------------------------------------------------- images

_SINGLE_BAND = {
    "I;16": np.uint16,
    "I;16B": np.uint16,
    "I;16L": np.uint16,
    "I": np.int32,
    "F": np.float32,
}
#: The four 8-bit modes a column stores, by band count.
_BANDS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}
#: A ragged image column whose records keep each image's own mode.
PER_IMAGE = "per-image"


def normal_mode(mode: str, info: dict) -> str:
    """The mode an image is stored in: one of L, LA, RGB, RGBA without loss
    (1-bit as L, a palette as RGB, or RGBA when it has transparency, CMYK and
    other colour spaces as RGB), or its own mode when it has more than 8 bits
    per value."""
    if mode in _BANDS or mode in _SINGLE_BAND:
        return mode
    if mode == "1":
        return "L"
    if mode == "La":
        return "LA"
    if mode in ("PA", "RGBa") or (mode == "P" and "transparency" in info):
        return "RGBA"
    return "RGB"


def _join(modes: set) -> str:
    """The smallest 8-bit mode that holds images of every mode in `modes`."""
    colour = bool(modes & {"RGB", "RGBA"})
    alpha = bool(modes & {"LA", "RGBA"})
    return ("RGBA" if alpha else "RGB") if colour else ("LA" if alpha else "L")


def holds(column_mode: str, mode: str) -> bool:
    """Whether a column of `column_mode` stores an image of `mode` losslessly."""
    if column_mode == PER_IMAGE:
        return mode not in _SINGLE_BAND
    if mode in _SINGLE_BAND or column_mode in _SINGLE_BAND:
        return mode == column_mode
    return _join({column_mode, mode}) == column_mode


def image_target_mode(
    modes: set, name: str = "", flags: Flags = Flags(), ragged: bool = False
) -> str:
    """The mode of a column whose images have the (normal) `modes`: theirs
    when they share one; else, in a ragged column, each image's own
    (`PER_IMAGE`), and in a dense one the smallest mode that holds them all
    (L and RGB images: RGB). Images of more than 8 bits per value (16-bit,
    32-bit, float) never share a column with another mode: converting them
    would clip their values."""
    if len(modes) == 1:
        return next(iter(modes))
    deep = sorted(modes & set(_SINGLE_BAND))
    if deep:
        raise ConvertError(
            f"column {name!r}: the images have the Pillow modes {sorted(modes)}; converting "
            f"the {deep} images (more than 8 bits per value) to one mode would lose values. "
            f"Convert them to one mode first, or keep the encoded files with "
            f"{flags.opt('keep_encoded')}"
        )
    return PER_IMAGE if ragged else _join(modes)


def image_dtype(mode: str) -> np.dtype:
    return np.dtype(_SINGLE_BAND.get(mode, np.uint8))


def image_shape(size: tuple, mode: str) -> tuple:
    width, height = size
    bands = _BANDS.get(mode, 1)
    return (height, width) if bands == 1 else (height, width, bands)


def decode_image(data, mode: str, where: str, own_if_wider: bool = False) -> np.ndarray:
    """Decode encoded image bytes into an array of `mode` (Pillow), or of the
    image's own normal mode in a `PER_IMAGE` column. An image that `mode`
    cannot hold is refused, or with `own_if_wider` returned in its own mode
    (a provisional dense column then becomes ragged)."""
    image_mod = require("PIL.Image", "convert", "decoding images")
    try:
        with image_mod.open(io.BytesIO(data)) as im:
            own = normal_mode(im.mode, im.info)
            if holds(mode, own):
                target = own if mode == PER_IMAGE else mode
            elif own_if_wider and own not in _SINGLE_BAND and mode not in _SINGLE_BAND:
                target = own
            else:
                held = "8-bit" if mode == PER_IMAGE else repr(mode)
                raise ConvertError(
                    f"{where}: the image has the Pillow mode {im.mode!r} but the column "
                    f"holds {held} images (decided from the first ones); converting "
                    "would lose values: convert the images to one mode first"
                )
            if im.mode != target:
                im = im.convert(target)
            return np.asarray(im, dtype=image_dtype(target))
    except ConvertError:
        raise
    except image_errors(image_mod) as e:
        raise ConvertError(f"{where}: cannot decode the image ({e})") from None


def image_errors(image_mod) -> tuple:
    """What Pillow raises for a damaged, unknown or oversized image (a
    decompression bomb: more pixels than ``PIL.Image.MAX_IMAGE_PIXELS``)."""
    return (OSError, ValueError, SyntaxError, image_mod.DecompressionBombError)
