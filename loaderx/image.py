"""Images at the speed of the cores: a native decode-and-augment stage.

A ``Pipeline`` is plain data: an ordered list of ops that turn one record
(JPEG or PNG bytes, or ``(H, W, C)`` uint8 pixels) into one fixed-size
array. Given to a loader as ``DataLoader(ds, ..., image={"image":
pipeline})``, it runs on the loader's library threads, in Zig, one fused
pass per image written straight into the batch: decode (libjpeg-turbo's
DCT scaling and region decoding: only the part of the image the crop keeps,
at the smallest scale that still holds the output's detail), crop, resize
(bilinear with antialiasing, as torchvision's ``antialias=True``), mirror
and normalise. No Python and no GIL per image; ``next()`` stays one native
wait. ``pipeline.apply(records, seed=, step=)`` runs the same code outside a
loader.

    from loaderx import image as li

    train = li.Pipeline(li.Decode(),
                        li.RandomResizedCrop(224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
                        li.RandomHorizontalFlip(0.5),
                        li.ToArray("uint8"))                    # (B, 224, 224, 3)

Ops, in any order between ``Decode`` (first) and ``ToArray`` (last):
``Resize(size)`` (an int: the shorter side, the other scaled and truncated
as torchvision does; ``(h, w)``: exactly), ``CenterCrop(size)`` (zero
padding where the image is smaller), ``RandomResizedCrop(size, scale,
ratio)`` (torchvision's parameter rule: ten tries at a box of random area
and log-uniform aspect, then a centre crop), ``RandomHorizontalFlip(p)``.
The ops compose into one box of the source image, so the image is resampled
once, however many ops there are.

Randomness is counter-based: a record's draws are a pure function of the
loader's seed, the step, the record's global position in the step (rank
``r`` of ``world`` holds positions ``r * batch_size ...``) and the op. The
augmentation of a batch does not depend on the thread count, the number of
ranks sharing the global batch, the prefetch depth or a restart, and
nothing is added to ``state_dict()``.

Decoding: the library carries libjpeg-turbo 2.1.5's decoder (portable C,
every platform) and its own PNG decoder. Where a libjpeg-turbo with SIMD is
installed (the one Pillow's wheels ship, or the system's), the library uses
it instead, once it has decoded the library's test images exactly as the
built-in decoder does; ``decoder()`` says which is in use, and
``LOADERX_LIBJPEG`` chooses (``builtin``, or a library's path).

Bad records: a record that is not a JPEG or PNG, or a damaged one, raises
``loaderx.ImageError`` naming the dataset, the column and the record; the
loader stops at that step as for any failed step. ``Decode(on_error="skip")``
instead replaces it with the next record of the same batch that decodes
(augmented with the failed record's own draws) and counts it
(``DataLoader.stats()["images_skipped"]``).
"""
from __future__ import annotations

import ctypes.util
import glob
import importlib.util
import math
import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _abi, _lib
from ._checks import is_int
from ._lib import ffi, lib

__all__ = ["Pipeline", "Decode", "Resize", "CenterCrop", "RandomResizedCrop",
           "RandomHorizontalFlip", "ToArray", "decoder", "image_input"]

OPS_MAX = _abi.IMAGE_OPS_MAX
SIDE_MAX = _abi.IMAGE_SIDE_MAX
_DTYPES = {"uint8": np.uint8, "float16": np.float16, "float32": np.float32}
Size = Union[int, Tuple[int, int]]


def _side(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not 1 <= int(value) <= SIDE_MAX:
        raise ValueError(f"{name} must be 1..{SIDE_MAX}, got {value!r}")
    return int(value)


def _size(op: str, size: Any) -> Tuple[int, int]:
    """(height, width) of an int (a square) or a pair."""
    if isinstance(size, (tuple, list)):
        if len(size) != 2:
            raise ValueError(f"{op}: size must be an int or (height, width), got {size!r}")
        return _side(f"{op} height", size[0]), _side(f"{op} width", size[1])
    s = _side(f"{op} size", size)
    return s, s


def _pair(op: str, name: str, value: Any) -> Tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: {name} must be a pair of numbers, got {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ValueError(f"{op}: {name} must be (low, high) with low <= high, got {value!r}")
    return lo, hi


@dataclass(frozen=True)
class Decode:
    """Decodes a record: JPEG or PNG bytes (greyscale, CMYK and alpha images
    come out RGB), or ``(H, W, C)`` uint8 pixels as they are. ``mode``:
    ``"RGB"`` or ``"L"`` (greyscale, ITU-R 601 luma as Pillow computes it).
    ``on_error``: ``"raise"`` or ``"skip"`` (see the module docs)."""

    mode: str = "RGB"
    on_error: str = "raise"

    def __post_init__(self) -> None:
        if self.mode not in ("RGB", "L"):
            raise ValueError(f"Decode: mode must be 'RGB' or 'L', got {self.mode!r}")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"Decode: on_error must be 'raise' or 'skip', got {self.on_error!r}")


@dataclass(frozen=True)
class Resize:
    """An int: the shorter side becomes ``size`` (the longer is scaled and
    truncated, as torchvision's ``Resize(int)``); ``(h, w)``: exactly that."""

    size: Size

    def __post_init__(self) -> None:
        if isinstance(self.size, (tuple, list)):
            object.__setattr__(self, "size", _size("Resize", self.size))
        else:
            _side("Resize size", self.size)


@dataclass(frozen=True)
class CenterCrop:
    """The middle ``size`` (an int or ``(h, w)``), padded with zeros where
    the image is smaller (torchvision's ``CenterCrop``)."""

    size: Size

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _size("CenterCrop", self.size))


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision's ``RandomResizedCrop(size, scale, ratio)``: a random box
    of ``scale`` of the image's area and aspect in ``ratio``
    (log-uniform), resized to ``size``."""

    size: Size
    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (3 / 4, 4 / 3)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _size("RandomResizedCrop", self.size))
        scale = _pair("RandomResizedCrop", "scale", self.scale)
        ratio = _pair("RandomResizedCrop", "ratio", self.ratio)
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ValueError(f"RandomResizedCrop: scale must satisfy 0 < low <= high <= 1, "
                             f"got {self.scale!r}")
        if ratio[0] <= 0:
            raise ValueError(f"RandomResizedCrop: ratio must be positive, got {self.ratio!r}")
        object.__setattr__(self, "scale", scale)
        object.__setattr__(self, "ratio", ratio)


@dataclass(frozen=True)
class RandomHorizontalFlip:
    """Mirrors left to right with probability ``p``."""

    p: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.p, bool) or not isinstance(self.p, (int, float)) \
                or not 0 <= self.p <= 1:
            raise ValueError(f"RandomHorizontalFlip: p must be a number in [0, 1], got {self.p!r}")
        object.__setattr__(self, "p", float(self.p))


@dataclass(frozen=True)
class ToArray:
    """The output: ``dtype`` ``"uint8"``, ``"float16"`` or ``"float32"``;
    ``layout`` ``"HWC"`` or ``"CHW"``. Float outputs are ``(pixel / 255 -
    mean) / std`` per channel (mean 0 and std 1 unless given); uint8 ones are
    the pixels (normalise on the accelerator)."""

    dtype: str = "uint8"
    layout: str = "HWC"
    mean: Optional[Tuple[float, ...]] = None
    std: Optional[Tuple[float, ...]] = None

    def __post_init__(self) -> None:
        try:
            dtype = np.dtype(self.dtype).name if not isinstance(self.dtype, str) else self.dtype
        except TypeError:
            dtype = None  # (not a dtype at all: refused below, naming it)
        if dtype not in _DTYPES:
            raise ValueError(f"ToArray: dtype must be one of {list(_DTYPES)}, got {self.dtype!r}")
        object.__setattr__(self, "dtype", dtype)
        if self.layout not in ("HWC", "CHW"):
            raise ValueError(f"ToArray: layout must be 'HWC' or 'CHW', got {self.layout!r}")
        for name in ("mean", "std"):
            value = getattr(self, name)
            if value is None:
                continue
            if dtype == "uint8":
                raise ValueError(f"ToArray: {name} is for float outputs; uint8 keeps the pixels "
                                 "(normalise on the accelerator, or ask for float32)")
            try:
                if isinstance(value, (str, bytes)):
                    raise TypeError
                numbers = tuple(float(v) for v in value)
            except (TypeError, ValueError):
                raise TypeError(f"ToArray: {name} must be a sequence of numbers, "
                                f"got {value!r}") from None
            if not all(math.isfinite(v) for v in numbers) or \
                    (name == "std" and not all(v > 0 for v in numbers)):
                raise ValueError(f"ToArray: {name} must be finite numbers (std > 0), "
                                 f"got {value!r}")
            object.__setattr__(self, name, numbers)


_GEOMETRY = (Resize, CenterCrop, RandomResizedCrop, RandomHorizontalFlip)


class Pipeline:
    """An image pipeline: ``Decode()``, then any number of ``Resize``,
    ``CenterCrop``, ``RandomResizedCrop`` and ``RandomHorizontalFlip``, then
    ``ToArray()`` (see the module docs). Printable, picklable, comparable."""

    def __init__(self, *ops: Any):
        if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
            ops = tuple(ops[0])
        if len(ops) < 2 or not isinstance(ops[0], Decode) or not isinstance(ops[-1], ToArray):
            raise ValueError("a Pipeline starts with Decode() and ends with ToArray(), got "
                             f"{[type(o).__name__ for o in ops]}")
        middle = ops[1:-1]
        for op in middle:
            if not isinstance(op, _GEOMETRY):
                raise TypeError(f"Pipeline: {op!r} is not an image op; between Decode and "
                                f"ToArray come {[c.__name__ for c in _GEOMETRY]}")
        if len(middle) > OPS_MAX:
            raise ValueError(f"a Pipeline takes at most {OPS_MAX} ops between Decode and "
                             f"ToArray, got {len(middle)}")
        self.ops: Tuple[Any, ...] = tuple(ops)
        self.decode: Decode = ops[0]
        self.output: ToArray = ops[-1]
        channels = self.channels
        for name in ("mean", "std"):
            value = getattr(self.output, name)
            if value is not None and len(value) != channels:
                raise ValueError(f"ToArray: {name} has {len(value)} values; Decode(mode="
                                 f"{self.decode.mode!r}) makes {channels} channel(s)")

    @property
    def channels(self) -> int:
        return 1 if self.decode.mode == "L" else 3

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(_DTYPES[self.output.dtype])

    def size(self, input_size: Optional[Tuple[int, int]] = None) -> Optional[Tuple[int, int]]:
        """The output's (height, width) for an input of `input_size`, or,
        without one, the size every input gets (None when it depends on the
        input: no crop or fixed resize after the last shorter-side Resize)."""
        size = input_size
        for op in self.ops[1:-1]:
            if isinstance(op, Resize):
                size = _resized(size, op.size)
            elif isinstance(op, (CenterCrop, RandomResizedCrop)):
                size = op.size  # type: ignore[assignment]
        return None if size is None else (int(size[0]), int(size[1]))

    def shape(self, input_size: Optional[Tuple[int, int]] = None) -> Tuple[int, ...]:
        """One record's output shape: (H, W, C) or (C, H, W)."""
        size = self.size(input_size)
        if size is None:
            raise ValueError(f"{self!r} has no fixed output size: its images keep their own "
                             "aspect; end it with a CenterCrop, a RandomResizedCrop or a "
                             "Resize((height, width))")
        h, w = size
        return (self.channels, h, w) if self.output.layout == "CHW" else (h, w, self.channels)

    def __repr__(self) -> str:
        return f"Pipeline({', '.join(repr(op) for op in self.ops)})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Pipeline) and self.ops == other.ops

    def __hash__(self) -> int:
        return hash(self.ops)

    def __reduce__(self):
        return (Pipeline, self.ops)

    def column(self, seed: int, input_shape: Optional[Sequence[int]] = None) -> Any:
        """The native description (lx_image_column_t) for records that are
        encoded images (`input_shape` None) or (H, W, C) pixels, keyed by `seed`."""
        return _column(self, seed, input_shape)

    def apply(self, records: Any, *, seed: int = 0, step: int = 0,
              position: int = 0) -> np.ndarray:
        """The pipeline on `records` (a sequence of JPEG/PNG bytes, or an
        ``(N, H, W, C)`` / ``(N, H, W)`` uint8 array of pixels) as a loader's
        step `step` makes them at global positions ``position, position + 1,
        ...``: ``(N, *shape)``. Runs on every core, the GIL released."""
        return _apply(self, records, seed, step, position)


def _resized(size: Optional[Tuple[int, int]], target: Any) -> Optional[Tuple[int, int]]:
    if isinstance(target, tuple):
        return target
    if size is None:
        return None
    h, w = size
    short, long = (w, h) if w <= h else (h, w)
    new_long = max(1, int(target * long / short))
    return (new_long, target) if w <= h else (target, new_long)


def _pixels_shape(shape: Sequence[int]) -> Tuple[int, int, int]:
    shape = tuple(int(s) for s in shape)
    if len(shape) == 2:
        return shape[0], shape[1], 1
    if len(shape) == 3 and shape[2] in (1, 3, 4):
        return shape[0], shape[1], shape[2]
    raise ValueError(f"pixel records must be (H, W) or (H, W, C) with C 1, 3 or 4; "
                     f"got item shape {shape}")


def image_input(name: str, streams: Sequence[Any]) -> Optional[Tuple[int, int, int]]:
    """What stream `name`'s records are for an image pipeline (every source
    of a mixture alike): None for encoded images (a byte store, or a ragged
    uint8 one), (H, W, C) for pixel records (a dense uint8 store of (H, W)
    or (H, W, C), C 1, 3 or 4)."""
    found: set = set()
    for stream in streams:
        kind = getattr(stream, "kind", None)
        dtype = np.dtype(getattr(stream, "dtype", np.uint8))
        if kind == "bytes" or (kind == "ragged" and dtype == np.uint8):
            found.add(None)
        elif kind == "dense" and dtype == np.uint8:
            try:
                found.add(_pixels_shape(stream.item_shape))
            except ValueError as e:
                raise ValueError(f"image[{name!r}]: {e}") from None
        else:
            shape = getattr(stream, "item_shape", "")
            raise TypeError(f"image[{name!r}]: stream {name!r} holds {kind} {dtype}{shape} "
                            "records; an image pipeline reads encoded images (a byte store, or "
                            "ragged uint8) or uint8 pixels of shape (H, W) or (H, W, C)")
    if len(found) != 1:
        raise ValueError(f"image[{name!r}]: the mixture's sources hold different kinds of "
                         f"image records: {sorted(map(str, found))}")
    return found.pop()


def _column(p: Pipeline, seed: int, input_shape: Optional[Sequence[int]]) -> Any:
    col = ffi.new("lx_image_column_t *")
    spec = col.spec
    h, w = p.size(None if input_shape is None else _pixels_shape(input_shape)[:2]) or (0, 0)
    if h == 0:
        p.shape()  # raises: no fixed output size
    spec.channels = p.channels
    spec.dtype = _abi.IMAGE_DTYPES[p.output.dtype]
    spec.layout = _abi.IMAGE_LAYOUTS[p.output.layout.lower()]
    spec.out_height, spec.out_width = h, w
    spec.on_error = _abi.IMAGE_ON_ERROR[p.decode.on_error]
    mean = p.output.mean or (0.0,) * p.channels
    std = p.output.std or (1.0,) * p.channels
    for c in range(4):
        spec.mean[c] = mean[c] if c < p.channels else 0.0
        spec.std[c] = std[c] if c < p.channels else 1.0
    middle = p.ops[1:-1]
    spec.op_count = len(middle)
    for i, op in enumerate(middle):
        _lower(op, spec.ops[i])
    _check_u64("seed", seed)
    col.seed = seed
    if input_shape is None:
        col.input = _abi.IMAGE_INPUTS["encoded"]
    else:
        col.input = _abi.IMAGE_INPUTS["pixels"]
        col.height, col.width, col.channels = _pixels_shape(input_shape)
    return col


def _lower(op: Any, out: Any) -> None:
    kinds = _abi.IMAGE_OPS
    size: Any = getattr(op, "size", None)
    if isinstance(op, Resize):
        out.kind = kinds["resize"]
        out.height, out.width = size if isinstance(size, tuple) else (size, 0)
    elif isinstance(op, CenterCrop):
        out.kind = kinds["center_crop"]
        out.height, out.width = size
    elif isinstance(op, RandomResizedCrop):
        out.kind = kinds["random_resized_crop"]
        out.height, out.width = size
        out.scale_min, out.scale_max = op.scale
        out.log_ratio_min, out.log_ratio_max = math.log(op.ratio[0]), math.log(op.ratio[1])
    else:
        out.kind = kinds["horizontal_flip"]
        out.p = op.p


def _check_u64(name: str, value: Any) -> None:
    if not is_int(value) or not 0 <= value < 1 << 64:
        raise ValueError(f"Pipeline.apply: {name} must be an int in [0, 2**64), got {value!r}")


def _apply(p: Pipeline, records: Any, seed: int, step: int, position: int) -> np.ndarray:
    for name, value in (("seed", seed), ("step", step), ("position", position)):
        _check_u64(name, value)
    choose_decoder()
    if isinstance(records, np.ndarray) and records.dtype == np.uint8 and records.ndim in (3, 4):
        data = np.ascontiguousarray(records)
        n = len(data)
        col = _column(p, seed, data.shape[1:])
        offsets = sizes = ffi.NULL
        keep: List[Any] = []
    else:
        if isinstance(records, (bytes, bytearray, memoryview, str)):
            raise TypeError("apply takes a sequence of records (a list of bytes), not one record")
        if isinstance(records, np.ndarray) and (records.dtype != np.uint8 or records.ndim > 2):
            raise TypeError(f"Pipeline.apply: pixel records are a uint8 array of (N, H, W) or "
                            f"(N, H, W, C); got {records.dtype} {records.shape}")
        blobs = []
        for i, r in enumerate(records):
            if not isinstance(r, (bytes, bytearray, memoryview, np.ndarray)):
                raise TypeError(f"Pipeline.apply: record {i} is a {type(r).__name__}, not the "
                                "bytes of an encoded image")
            blobs.append(bytes(r))
        n = len(blobs)
        lengths = np.array([len(b) for b in blobs], np.uint64)
        starts = np.zeros(n, np.uint64)
        if n:
            starts[1:] = np.cumsum(lengths)[:-1]
        data = np.frombuffer(b"".join(blobs), np.uint8)
        col = _column(p, seed, None)
        keep = [lengths, starts]
        offsets = ffi.cast("uint64_t *", starts.ctypes.data)
        sizes = ffi.cast("uint64_t *", lengths.ctypes.data)
    out = np.empty((n,) + p.shape(None if col.input == 0 else (col.height, col.width)), p.dtype)
    skipped = ffi.new("uint32_t *")
    failed = ffi.new("uint64_t *")
    source = ffi.from_buffer("uint8_t[]", data) if data.size else ffi.new("uint8_t[]", 1)
    rc = lib.lx_image_apply(col, source, data.size, offsets, sizes, n, step, position,
                            ffi.from_buffer("uint8_t[]", out, require_writable=True)
                            if out.size else ffi.new("uint8_t[]", 1), out.nbytes, skipped, failed)
    del keep
    _lib.check(rc, None, "Pipeline.apply")
    return out


# ---------------------------------------------------------------- the JPEG decoder

_CHOICE_LOCK = threading.Lock()
_CHOSEN: Dict[str, Any] = {}


def _candidates() -> List[str]:
    """libjpeg-turbo builds with SIMD this process may use, best first:
    LOADERX_LIBJPEG, Pillow's own, the system's."""
    env = os.environ.get("LOADERX_LIBJPEG", "").strip()
    if env:
        return [] if env == "builtin" else [env]
    found: List[str] = []
    spec = importlib.util.find_spec("PIL")
    if spec is not None and spec.origin:
        pil = os.path.dirname(spec.origin)
        for pattern in (os.path.join(os.path.dirname(pil), "pillow.libs", "libjpeg*.so*"),
                        os.path.join(pil, ".dylibs", "libjpeg*.dylib")):
            found += sorted(glob.glob(pattern))
    system = ctypes.util.find_library("jpeg")
    if system:
        found.append(system)
    return found


def choose_decoder() -> None:
    """Picks the JPEG decoder once per process, before the first decode."""
    if _CHOSEN:
        return
    with _CHOICE_LOCK:
        if _CHOSEN:
            return
        tried = []
        for path in _candidates():
            rc = lib.lx_image_use_jpeg(path.encode())
            if rc == _lib.LX_OK:
                break
            tried.append(ffi.string(lib.lx_last_error()).decode("utf-8", "replace"))
        _CHOSEN["tried"] = tried
        _CHOSEN["path"] = _library_path()


def _library_path() -> str:
    length = ffi.new("uint64_t *")
    lib.lx_image_jpeg_library(ffi.NULL, 0, length)
    buf = ffi.new("uint8_t[]", int(length[0]) + 1)
    lib.lx_image_jpeg_library(buf, len(buf), length)
    return ffi.string(ffi.cast("char *", buf)).decode("utf-8", "replace")


def decoder() -> Dict[str, Any]:
    """Which JPEG decoder this process uses: ``{"jpeg": "libjpeg-turbo
    (SIMD) from PATH" or "built-in libjpeg-turbo 2.1.5 (portable C)",
    "path": PATH or None, "rejected": [why each library tried was not
    taken]}`` (the choice is made at the first use)."""
    choose_decoder()
    path = _CHOSEN["path"]
    what = f"libjpeg-turbo (SIMD) from {path}" if path else \
        "built-in libjpeg-turbo 2.1.5 (portable C)"
    return {"jpeg": what, "path": path or None, "rejected": list(_CHOSEN["tried"])}
