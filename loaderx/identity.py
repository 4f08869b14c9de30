"""The type identity a typed store keeps inside itself: its kind (``bytes``,
``dense``, ``ragged``), dtype and item shape. Written at create, read and
checked in full at every open.

The library is the one author of the stored bytes: a versioned native struct
(``Identity`` in src/format.zig) that it writes at create and checks at every
open (kind, flags, shape bounds, text sizes and alphabet, agreement with the
store's layout), reached through ``lx_open`` and ``lx_identity``. This module
is the Python side of it: a numpy dtype becomes the text the struct carries
(numpy's array-protocol description written as a Python literal, the text a
.npy header holds) and comes back from it. Stores of format 2 kept their
identity as msgpack, written here; `decode_msgpack` still reads those.

A store file can come from anywhere, so nothing read here is trusted: an
identity that names an object dtype (whose records would be read as raw
pointers), an unknown kind, a shape no array can have, or that is not
readable at all raises `CorruptStoreError` naming what is wrong.
"""
from __future__ import annotations

import ast
import math
from typing import Any

import msgpack
import numpy as np

from . import _abi
from ._checks import is_int
from .errors import CorruptStoreError

#: The msgpack identity's version (format-2 stores).
IDENTITY_VERSION = 1
KINDS = tuple(_abi.STORE_KINDS)
KIND_NAMES = {v: k for k, v in _abi.STORE_KINDS.items()}
ENCODINGS = {v: k for k, v in _abi.IDENTITY_ENCODINGS.items()}
#: Most dimensions a record (or a dense item) may have.
NDIM_MAX = _abi.IDENTITY_NDIM_MAX
#: Largest element count times item size numpy can address.
_SIZE_MAX = 2**63 - 1
_BY_NAME = _abi.IDENTITY_FLAG_DTYPE_BY_NAME


def check_dtype(dtype: Any) -> np.dtype:
    """A dtype a store can hold: no Python objects anywhere inside it."""
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise TypeError(f"dtype {dt} holds Python objects, which cannot be stored; "
                        "use a fixed-size dtype")
    if dt.subdtype is not None:
        raise TypeError(f"dtype {dt} is a subarray type; store its base {dt.subdtype[0]} with the "
                        f"extra dimensions {dt.subdtype[1]} in the record shape instead")
    if dt.itemsize == 0:  # np.dtype(str) is <U0: every value would be stored as ""
        raise TypeError(f"dtype {dt} has no width (itemsize 0): every value would be stored "
                        "empty; give one, as 'U16' or 'S16' (or store text in a Zrecord)")
    return dt


def check_shape(shape: Any, itemsize: int, what: str) -> tuple:
    """`shape` as a tuple of ints numpy can represent; ValueError otherwise."""
    dims = tuple(shape)
    if len(dims) > NDIM_MAX:
        raise ValueError(f"{what} has {len(dims)} dimensions; at most {NDIM_MAX} are supported")
    for d in dims:
        if not is_int(d):
            raise ValueError(f"{what} {dims} holds a non-integer dimension")
        if not 0 <= int(d) <= _SIZE_MAX:
            raise ValueError(f"{what} {dims} has a dimension out of range")
    if math.prod(max(int(d), 1) for d in dims) * max(itemsize, 1) > _SIZE_MAX:
        raise ValueError(f"{what} {dims} is too large for any array")
    return tuple(int(d) for d in dims)


class Identity:
    """A checked identity: `kind`, and `dtype`/`item_shape` where they apply."""

    def __init__(self, kind: str, dtype: np.dtype | None, item_shape: tuple | None):
        self.kind = kind
        self.dtype = dtype
        self.item_shape = item_shape


def encode(kind: str, dtype: np.dtype | None = None, item_shape: tuple | None = None) -> Identity:
    """The identity a create asks for (its dtype and shape already checked)."""
    return Identity(kind, dtype, None if item_shape is None else tuple(item_shape))


def describe(dtype: np.dtype) -> tuple[bytes, bytes, int]:
    """(description, name, flags) of `dtype` as the native identity stores
    them: numpy's description as a printable-ASCII Python literal, the
    dtype's name, and `dtype_by_name` when only the name gives the dtype
    back (a type a package registers, such as ml_dtypes' bfloat16)."""
    descr = np.lib.format.dtype_to_descr(dtype)
    text = ascii(descr).encode("ascii")
    name = dtype.name.encode("ascii", "replace")
    try:
        same = np.lib.format.descr_to_dtype(descr) == dtype
    except Exception:  # numpy raises many types for a description it cannot build
        same = False
    named = None if same else _dtype_named(dtype.name)
    flags = _BY_NAME if named is not None and named == dtype else 0
    return text, name, flags


def from_native(kind: int, flags: int, itemsize: int, shape: tuple, descr: bytes, name: bytes,
                path: str) -> Identity:
    """The identity the library read and checked (lx_identity): its dtype
    built from the description (or, `dtype_by_name`, from the name)."""
    kind_name = KIND_NAMES[kind]
    if kind_name == "bytes":
        return Identity(kind_name, None, None)
    try:
        parsed = ast.literal_eval(descr.decode("ascii"))
    except Exception as e:  # a hostile literal: SyntaxError, ValueError, RecursionError, ...
        raise _corrupt(path, f"its dtype description is not a literal ({type(e).__name__})") \
            from None
    dt = _native_dtype(parsed, name.decode("ascii"), flags, itemsize, path)
    if dt.itemsize != itemsize:
        raise _corrupt(path, f"its dtype {dt} is {dt.itemsize} bytes, the identity says {itemsize}")
    if kind_name == "ragged":
        return Identity(kind_name, dt, None)
    return Identity(kind_name, dt, tuple(int(d) for d in shape))


def _native_dtype(descr: Any, name: str, flags: int, itemsize: int, path: str) -> np.dtype:
    if flags & _BY_NAME:
        named = _dtype_named(name)
        if named is not None:
            if named.itemsize != itemsize or (isinstance(descr, str) and named.str != descr):
                raise _corrupt(path, f"its dtype name {name!r} names {named}, "
                                     f"not the dtype it describes ({descr!r})")
            return _checked(named, path)
        # The package that names it is missing: its bytes, as raw bytes.
        try:
            dt = np.lib.format.descr_to_dtype(_descr_fields(descr, tuple))
        except Exception:  # '<f1' and the like: numpy has no such type
            dt = np.dtype(f"V{itemsize}")
        return _checked(dt if dt.itemsize == itemsize else np.dtype(f"V{itemsize}"), path)
    try:
        dt = np.lib.format.descr_to_dtype(_descr_fields(descr, tuple))
    except Exception as e:  # numpy raises many types for a hostile descr
        raise _corrupt(path, f"its dtype cannot be built ({type(e).__name__}: {e})") from None
    return _checked(dt, path)


def _descr_fields(d: Any, field_type: type, depth: int = 0) -> Any:
    """numpy's description from its stored form: a type string, or a list
    of (name, description[, shape]) fields, each a `field_type` (a literal's
    tuple; msgpack stores tuples as lists), nested at most NDIM_MAX deep."""
    if depth > NDIM_MAX:
        raise ValueError("dtype nests too deeply")
    if isinstance(d, str):
        return d
    if not isinstance(d, list):
        raise TypeError(f"dtype field list is a {type(d).__name__}")
    fields = []
    for f in d:
        if not isinstance(f, field_type) or not isinstance(f, (list, tuple)) \
                or not 2 <= len(f) <= 3:
            raise TypeError("dtype field is malformed")
        name, fmt = f[0], _descr_fields(f[1], field_type, depth + 1)
        fields.append((name, fmt, tuple(f[2])) if len(f) > 2 else (name, fmt))
    return fields


def _checked(dt: np.dtype, path: str) -> np.dtype:
    if dt.hasobject:
        raise _corrupt(path, f"its dtype {dt} holds Python objects")
    if dt.subdtype is not None:
        raise _corrupt(path, f"its dtype {dt} is a subarray type")
    return dt


def _dtype_named(name: Any) -> np.dtype | None:
    """The dtype numpy knows by `name` (after ml_dtypes registers its types,
    when it is installed), or None."""
    if not isinstance(name, str) or not name:
        return None
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        pass
    try:
        return np.dtype(name)
    except Exception:  # a hostile name: TypeError, SyntaxError, ValueError, ...
        return None


# ----------------------------------------------------------------- format 2: msgpack


def decode_msgpack(raw: bytes, path: str) -> Identity:
    """The checked identity a format-2 store keeps as msgpack `raw`."""
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
    dtype = _msgpack_dtype(ident.get("dtype"), path)
    if kind == "ragged":
        return Identity(kind, dtype, None)
    shape = ident.get("item_shape")
    if not isinstance(shape, list):
        raise _corrupt(path, f"its item_shape is {shape!r}, not a list")
    try:
        return Identity(kind, dtype, check_shape(shape, dtype.itemsize, "item_shape"))
    except ValueError as e:
        raise _corrupt(path, str(e)) from None


def _msgpack_dtype(d: Any, path: str) -> np.dtype:
    if not isinstance(d, dict) or "descr" not in d:
        raise _corrupt(path, "its dtype is missing")
    try:
        dt = np.lib.format.descr_to_dtype(_descr_fields(d["descr"], list))
    except Exception as e:  # numpy raises many types for a hostile descr
        named = _named_dtype(d.get("name"), d["descr"])
        if named is None:
            raise _corrupt(path, f"its dtype cannot be built ({type(e).__name__}: {e})") from None
        dt = named
    _checked(dt, path)
    name = d.get("name", "")
    if dt.kind == "V" and dt.names is None and isinstance(name, str) and name \
            and not name.startswith("void"):
        dt = _registered_dtype(name, dt)
    return dt


def _named_dtype(name: Any, descr: Any) -> np.dtype | None:
    """A registered scalar type whose descr numpy cannot parse back (ml_dtypes'
    float8_e5m2 saves as '<f1'), by its saved name, if it has that descr."""
    if not isinstance(descr, str):
        return None
    dt = _dtype_named(name)
    return dt if dt is not None and dt.str == descr and not dt.hasobject else None


def _registered_dtype(name: str, fallback: np.dtype) -> np.dtype:
    """A custom scalar type (bfloat16 & co) registered by ml_dtypes, if present
    and of the same size; else the raw void type."""
    dt = _dtype_named(name)
    if dt is None:
        return fallback
    return dt if dt.itemsize == fallback.itemsize and not dt.hasobject else fallback


def _corrupt(path: str, why: str) -> CorruptStoreError:
    return CorruptStoreError(f"{path}: the stored type identity is invalid: {why}", path=path)
