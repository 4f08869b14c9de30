"""The type identity a typed store keeps inside itself (msgpack in the store's
``meta`` file): its kind (``bytes``, ``dense``, ``ragged``), dtype and item
shape. Written at create, read and checked in full at every open.

A store file can come from anywhere, so nothing read here is trusted: an
identity that names an object dtype (whose records would be read as raw
pointers), an unknown kind, a shape no array can have, or that is not
readable at all raises `CorruptStoreError` naming what is wrong.
"""
from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

from .errors import CorruptStoreError

IDENTITY_VERSION = 1
KINDS = ("bytes", "dense", "ragged")
#: Most dimensions a record (or a dense item) may have.
NDIM_MAX = 32
#: Largest element count times item size numpy can address.
_SIZE_MAX = 2**63 - 1


def check_dtype(dtype: Any) -> np.dtype:
    """A dtype a store can hold: no Python objects anywhere inside it."""
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise TypeError(f"dtype {dt} holds Python objects, which cannot be stored; "
                        "use a fixed-size dtype")
    if dt.subdtype is not None:
        raise TypeError(f"dtype {dt} is a subarray type; store its base {dt.subdtype[0]} with the "
                        f"extra dimensions {dt.subdtype[1]} in the record shape instead")
    return dt


def check_shape(shape: Any, itemsize: int, what: str) -> tuple:
    """`shape` as a tuple of ints numpy can represent; ValueError otherwise."""
    dims = tuple(shape)
    if len(dims) > NDIM_MAX:
        raise ValueError(f"{what} has {len(dims)} dimensions; at most {NDIM_MAX} are supported")
    for d in dims:
        if not isinstance(d, (int, np.integer)) or isinstance(d, (bool, np.bool_)):
            raise ValueError(f"{what} {dims} holds a non-integer dimension")
        if not 0 <= int(d) <= _SIZE_MAX:
            raise ValueError(f"{what} {dims} has a dimension out of range")
    if math.prod(max(int(d), 1) for d in dims) * max(itemsize, 1) > _SIZE_MAX:
        raise ValueError(f"{what} {dims} is too large for any array")
    return tuple(int(d) for d in dims)


def encode(kind: str, dtype: np.dtype | None = None, item_shape: tuple | None = None) -> dict:
    ident: dict = {"kind": kind, "v": IDENTITY_VERSION}
    if dtype is not None:
        ident["dtype"] = {"descr": np.lib.format.dtype_to_descr(dtype), "name": dtype.name}
    if item_shape is not None:
        ident["item_shape"] = list(item_shape)
    return ident


def pack(ident: dict) -> bytes:
    return msgpack.packb(ident, use_bin_type=True)


class Identity:
    """A checked identity: `kind`, and `dtype`/`item_shape` where they apply."""

    def __init__(self, kind: str, dtype: np.dtype | None, item_shape: tuple | None):
        self.kind = kind
        self.dtype = dtype
        self.item_shape = item_shape


def decode(raw: bytes, path: str) -> Identity:
    """The checked identity stored as `raw` (empty: a plain byte store)."""
    if not raw:
        return Identity("bytes", None, None)
    try:
        ident = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises many unrelated types on hostile input
        raise _corrupt(path, f"it is unreadable ({type(e).__name__})") from None
    if not isinstance(ident, dict):
        raise _corrupt(path, f"it is a {type(ident).__name__}, not a map")
    kind = ident.get("kind")
    if kind not in KINDS:
        raise _corrupt(path, f"it names unknown kind {kind!r}")
    version = ident.get("v", IDENTITY_VERSION)
    if not isinstance(version, int) or not 1 <= version <= IDENTITY_VERSION:
        raise _corrupt(path, f"it has version {version!r}; this loaderx reads {IDENTITY_VERSION}")
    if kind == "bytes":
        return Identity(kind, None, None)
    dtype = _decode_dtype(ident.get("dtype"), path)
    if kind == "ragged":
        return Identity(kind, dtype, None)
    shape = ident.get("item_shape")
    if not isinstance(shape, list):
        raise _corrupt(path, f"its item_shape is {shape!r}, not a list")
    try:
        return Identity(kind, dtype, check_shape(shape, dtype.itemsize, "item_shape"))
    except ValueError as e:
        raise _corrupt(path, str(e)) from None


def _decode_dtype(d: Any, path: str) -> np.dtype:
    if not isinstance(d, dict) or "descr" not in d:
        raise _corrupt(path, "its dtype is missing")
    try:
        dt = np.lib.format.descr_to_dtype(_descr_from_msgpack(d["descr"]))
    except Exception as e:  # numpy raises many types for a hostile descr
        named = _named_dtype(d.get("name"), d["descr"])
        if named is None:
            raise _corrupt(path, f"its dtype cannot be built ({type(e).__name__}: {e})") from None
        dt = named
    if dt.hasobject:
        raise _corrupt(path, f"its dtype {dt} holds Python objects")
    if dt.subdtype is not None:
        raise _corrupt(path, f"its dtype {dt} is a subarray type")
    name = d.get("name", "")
    if dt.kind == "V" and dt.names is None and isinstance(name, str) and name \
            and not name.startswith("void"):
        dt = _registered_dtype(name, dt)
    return dt


def _named_dtype(name: Any, descr: Any) -> np.dtype | None:
    """A registered scalar type whose descr numpy cannot parse back (ml_dtypes'
    float8_e5m2 saves as '<f1'), by its saved name, if it has that descr."""
    if not isinstance(name, str) or not name or not isinstance(descr, str):
        return None
    try:
        import ml_dtypes  # noqa: F401
        dt = np.dtype(name)
    except (ImportError, TypeError):
        return None
    return dt if dt.str == descr and not dt.hasobject else None


def _registered_dtype(name: str, fallback: np.dtype) -> np.dtype:
    """A custom scalar type (bfloat16 & co) registered by ml_dtypes, if present
    and of the same size; else the raw void type."""
    try:
        import ml_dtypes  # noqa: F401
        dt = np.dtype(name)
    except (ImportError, TypeError):
        return fallback
    return dt if dt.itemsize == fallback.itemsize and not dt.hasobject else fallback


def _descr_from_msgpack(d: Any, depth: int = 0) -> Any:
    """msgpack turns the tuples of a structured dtype's descr into lists; undo that."""
    if depth > NDIM_MAX:
        raise ValueError("dtype nests too deeply")
    if isinstance(d, str):
        return d
    if not isinstance(d, list):
        raise TypeError(f"dtype field list is a {type(d).__name__}")
    fields = []
    for f in d:
        if not isinstance(f, list) or not 2 <= len(f) <= 3:
            raise TypeError("dtype field is malformed")
        name, fmt = f[0], _descr_from_msgpack(f[1], depth + 1)
        fields.append((name, fmt, tuple(f[2])) if len(f) > 2 else (name, fmt))
    return fields


def _corrupt(path: str, why: str) -> CorruptStoreError:
    return CorruptStoreError(f"{path}: the stored type identity is invalid: {why}", path=path)
