"""Column types: which store a source column becomes, and how a batch of
source values turns into what that store's ``append`` takes.

The mapping (the table in the README):

======================================  ==========================================
source column                           store
======================================  ==========================================
scalar numbers, bools, timestamps       DenseStore, ``item_shape=()``
fixed-size lists, tensors, fixed-size   DenseStore, ``item_shape`` = the fixed shape
images
lists whose rows all have one length    DenseStore, ``item_shape=(n, *fixed trailing)``
other variable-length lists, sequences  RaggedStore (records ``(n, *fixed trailing)``)
binary, strings (UTF-8), encoded files  Zrecord
======================================  ==========================================

Equal-length lists and probed images are *provisional* dense columns: the
source decides "dense" from its first rows (`ColumnSpec.provisional`), and
when a later batch does not fit that shape it hands over ragged records
instead; the writer then moves what it wrote into a RaggedStore and goes on
(``_run.write_task``), so the decision never needs a second pass over the
source and is never wrong.

Anything else (structs, maps, decimals, nested variable lists, nulls) is
refused with a `ConvertError` that names the column and the flag that skips it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import ZrecordError

__all__ = [
    "ColumnSpec",
    "ConvertError",
    "MissingDependencyError",
    "Flags",
    "Packed",
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


class ConvertError(ZrecordError, ValueError):
    """A source that cannot be converted as asked; the message says why and what to do."""


class MissingDependencyError(ZrecordError, ImportError):
    """An optional dependency of a converter is not installed."""


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
        return f"--skip-columns {column}" if self.cli else f"skip_columns=[{column!r}]"

    def opt(self, name: str, value: str = "") -> str:
        if self.cli:
            return f"--{name.replace('_', '-')}" + (f" {value}" if value else "")
        return f"{name}={value or 'True'}"


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
        return ColumnSpec(name, "dense", leaf, ())
    if _is_bytes(pa, t):
        return ColumnSpec(
            name, "bytes", np.dtype(np.uint8), None, decode="utf8" if "string" in str(t) else ""
        )
    dims, inner = _fixed_chain(pa, t)
    inner_leaf = _leaf_dtype(pa, inner)
    if dims and inner_leaf is not None:
        return ColumnSpec(name, "dense", inner_leaf, dims)
    if _is_list(pa, t):
        tdims, tinner = _fixed_chain(pa, t.value_type)
        tinner_leaf = _leaf_dtype(pa, tinner)
        if tinner_leaf is not None:
            return ColumnSpec(name, "ragged", tinner_leaf, tdims)
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


def _check_nulls(arr, name: str, row0: int, flags: Flags, locate=_whole_rows) -> None:
    """Refuse nulls; `locate` maps an index of `arr` (a flattened level of a
    nested column) to the row of the batch that holds it."""
    if arr.null_count:
        first = locate(int(np.flatnonzero(~arr.is_valid().to_numpy(zero_copy_only=False))[0]))
        raise ConvertError(
            f"column {name!r} has a null value (row {row0 + first}); loaderx stores have no "
            f"nulls: fill them before converting (pyarrow.compute.fill_null) or skip the column "
            f"with {flags.skip(name)}"
        )


def _leaf_numpy(arr, spec: ColumnSpec, row0: int, flags: Flags, locate) -> np.ndarray:
    _check_nulls(arr, spec.name, row0, flags, locate)
    values = arr.to_numpy(zero_copy_only=False)
    return values if values.dtype == spec.dtype else values.astype(spec.dtype)


def _list_level(pa, arr, spec: ColumnSpec, row0: int, flags: Flags, locate=_whole_rows):
    """(offsets relative to the flattened values, flattened values) of a list array."""
    _check_nulls(arr, spec.name, row0, flags, locate)
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
            _check_nulls(arr, spec.name, row0, flags, locate)
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
    inner = ColumnSpec(spec.name, "dense", spec.dtype, tuple(spec.item_shape or ()))
    flat = _dense_values(pa, values, inner, row0, flags, _in_lists(offsets, _whole_rows))
    return Packed(flat, offsets)


def _byte_records(pa, arr, spec: ColumnSpec, row0: int, flags: Flags) -> Packed:
    _check_nulls(arr, spec.name, row0, flags)
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
    """A batch of one column (an Arrow array) as what the column's store appends."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if isinstance(arr.type, pa.ExtensionType) and spec.decode != "ray-variable":
        arr = arr.storage
    if spec.kind == "dense":
        if spec.provisional and not _fixed_length(pa, arr, spec.dense_shape[0]):
            return _ragged_records(pa, arr, spec.as_ragged(), row0, flags)
        return _dense_values(pa, arr, spec, row0, flags)
    if spec.kind == "ragged":
        return _ragged_records(pa, arr, spec, row0, flags)
    return _byte_records(pa, arr, spec, row0, flags)


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
