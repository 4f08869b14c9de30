"""The interface every converter source implements, and what they share.

A source is small and picklable (paths and options, never open handles), so
``workers=N`` can ship it to N processes. It names its columns
(`ColumnSpec`s), splits itself into disjoint *tasks* (row ranges, or groups of
files), and reads one task as bounded batches of ready-to-append values.
"""

from __future__ import annotations

import io
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple

import numpy as np

from ._columns import (
    PER_IMAGE,
    ColumnSpec,
    ConvertError,
    Flags,
    decode_image,
    image_dtype,
    image_shape,
    image_target_mode,
    normal_mode,
)

__all__ = [
    "Batch",
    "Options",
    "Source",
    "row_tasks",
    "select_columns",
    "ImageColumn",
    "ImageHeader",
    "image_shape",
    "KEY_COLUMN",
    "key_spec",
    "file_entries",
    "ramp",
    "ramped",
    "user_warning",
]

#: The provenance column of tar samples (their ``__key__``) and image files
#: (their path under the folder), kept unless ``keys=False``.
KEY_COLUMN = "key"


@dataclass
class Options:
    """Converter options that sources see."""

    columns: list | None = None
    skip_columns: list = field(default_factory=list)
    keep_encoded: bool = False
    #: With keep_encoded: images larger than this (longer side) are shrunk and
    #: encoded again once (see `shrink_encoded`).
    max_side: int | None = None
    row_length: int | None = None
    flags: Flags = field(default_factory=Flags)
    fill_null: dict = field(default_factory=dict)
    keys: bool = True
    image_column: str | None = "image"
    #: What the records of a store of the original loaderx are, where its
    #: schema.msgpack cannot be read (see _original_src).
    dtype: Any = None
    item_shape: Any = None


@dataclass
class Batch:
    """`rows` records of every column; `progress` units of work done;
    `nbytes` source bytes read for them (shown with the progress); `file`:
    the position in the source's file list of the file the rows come from
    (None for a source that is not a list of files). A batch never spans two
    files, so the manifest can give each file its row range."""

    rows: int
    columns: dict
    progress: float
    nbytes: int = 0
    file: int | None = None


class Source:
    """Base class. Subclasses set `kind` and implement the methods below."""

    kind = ""
    unit = "rows"

    def __init__(self, options: Options):
        self.options = options

    def specs(self) -> list[ColumnSpec]:
        raise NotImplementedError

    def row_count(self) -> int | None:
        raise NotImplementedError

    def progress_total(self) -> float | None:
        return self.row_count()

    def tasks(self, workers: int) -> list:
        raise NotImplementedError

    def read(self, task: Any, specs: list[ColumnSpec], batch_bytes: int) -> Iterator[Batch]:
        raise NotImplementedError

    def describe(self, file_rows: list | None = None) -> dict:
        """The manifest's ``source``; `file_rows`: ``[start, stop)`` in the
        dataset of the rows read from each file of the source's ``files``
        list, in order (counted from `Batch.file`), or None."""
        raise NotImplementedError

    def dictionaries(self, codecs: dict) -> dict:
        """Dictionaries the source brings for its columns (``{column: bytes}``),
        setting those columns' codec to zstd_dict; most sources have none."""
        return {}

    def __getstate__(self) -> dict:
        # Open handles stay behind: each process opens its own.
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_open")}


def select_columns(available: list[str], options: Options, where: str) -> list[str]:
    """The columns to convert, in source order, after `columns` / `skip_columns`."""
    for label, names in (
        ("the source has the columns", available),
        ("columns names", options.columns or []),
    ):
        twice = sorted({str(n) for n in names if names.count(n) > 1})
        if twice:
            raise ConvertError(f"{where}: {label} {twice} more than once")
    for label, names in (
        ("columns", options.columns or []),
        ("skip_columns", options.skip_columns),
    ):
        unknown = [n for n in names if n not in available]
        if unknown:
            raise ConvertError(
                f"{where}: {label} names {unknown}, which the source does not have; "
                f"its columns are {available}"
            )
    chosen = [n for n in available if options.columns is None or n in options.columns]
    if options.columns is not None:
        chosen = [n for n in options.columns if n in chosen]
    chosen = [n for n in chosen if n not in options.skip_columns]
    if not chosen:
        raise ConvertError(f"{where}: no columns left to convert (the source has {available})")
    return chosen


def row_tasks(
    rows: int, workers: int, boundaries: list[int] | None = None
) -> list[tuple[int, int]]:
    """Split ``0..rows`` into at most `workers` contiguous ranges of about
    equal size, moving each cut to a natural boundary (a row group, a record
    batch) when one lies within a tenth of a range of it."""
    workers = max(1, min(workers, rows)) if rows else 1
    ideal = [rows * k // workers for k in range(workers + 1)]
    cuts = [0]
    bounds = np.asarray(sorted(set(boundaries or [])), dtype=np.int64)
    slack = rows / workers / 10
    for c in ideal[1:-1]:
        if len(bounds):
            near = int(bounds[np.argmin(np.abs(bounds - c))])
            c = near if abs(near - c) <= slack else c
        if c > cuts[-1]:
            cuts.append(c)
    cuts.append(rows)
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a] or [(0, 0)]


def rows_per_batch(row_bytes: float, batch_bytes: int) -> int:
    return int(max(1, min(1 << 20, batch_bytes // max(row_bytes, 1.0))))


#: The first batch of a task is this fraction of a full one; each next doubles.
_RAMP = 16


def ramp(step: int) -> Iterator[int]:
    """Batch sizes (endless) that start at ``step // 16`` and double up to
    `step`: the first batch of a conversion is read, reported and written
    quickly, so its progress moves from the start instead of after a whole
    batch of `batch_bytes`."""
    size = max(1, step // _RAMP)
    while True:
        yield size
        size = min(step, size * 2)


def ramped(start: int, stop: int, step: int) -> Iterator[tuple[int, int]]:
    """``(a, b)`` ranges covering start..stop, sized by `ramp`."""
    a = start
    for size in ramp(step):
        if a >= stop:
            return
        yield a, min(a + size, stop)
        a += size


def file_entries(paths: list[str], base: str, file_rows: list | None) -> list:
    """The manifest's ``source.files``: each file's path (relative to `base`)
    and its ``[start, stop)`` rows in the dataset."""
    if file_rows is None:
        return [{"path": os.path.relpath(p, base)} for p in paths]
    return [{"path": os.path.relpath(p, base), "rows": r} for p, r in zip(paths, file_rows)]


def user_warning(text: str) -> None:
    """A warning attributed to the caller's line, not to loaderx's (the CLI
    prints it as one line naming the input)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    level = 2  # stacklevel 2 is the frame that called this one
    frame: Any = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        level, frame = level + 1, frame.f_back
    warnings.warn(text, stacklevel=level)


def key_spec() -> ColumnSpec:
    """The key column: short UTF-8 strings, stored raw (per-record zstd
    cannot shrink a few dozen bytes)."""
    return ColumnSpec(
        KEY_COLUMN, "bytes", np.dtype(np.uint8), None, decode="utf8", codec="raw",
        extra={"role": "key"},
    )


class ImageHeader(NamedTuple):
    """What an image's header says: (width, height), its normal mode (see
    `normal_mode`) and the encoded size in bytes."""

    size: tuple
    mode: str
    nbytes: int


class ImageColumn:
    """Decides and applies an image column's layout: DenseStore when every
    image looked at has one size (in the smallest mode that holds them
    all), RaggedStore otherwise (each image in its own mode), Zrecord of the
    encoded bytes with ``keep_encoded``. `complete`: the headers are those
    of every image (an image folder); else of the first ones, and the dense
    layout is provisional (see `ColumnSpec.provisional`)."""

    @staticmethod
    def spec(
        name: str, headers: list[ImageHeader], options: Options, complete: bool = False
    ) -> ColumnSpec:
        if options.keep_encoded:
            shrink = {"max_side": options.max_side} if options.max_side else {}
            return ColumnSpec(name, "bytes", np.dtype(np.uint8), None, decode="encoded-image",
                              extra=shrink)
        if not headers:
            raise ConvertError(f"column {name!r}: no images to look at")
        modes = {h.mode for h in headers}
        sizes = {h.size for h in headers}
        mode = image_target_mode(modes, name, options.flags, ragged=len(sizes) > 1)
        if not complete and len(sizes) > 1 and image_dtype(mode) == np.uint8:
            # Only the first images were looked at: later ones may have other
            # modes, which a ragged column keeps as they are.
            mode = PER_IMAGE
        counts: dict = {}
        for h in headers:
            counts[h.mode] = counts.get(h.mode, 0) + 1
        extra: dict[str, Any] = {"image_mode": mode, "image_modes": dict(sorted(counts.items()))}
        if not complete:
            extra["images_probed"] = len(headers)
        _suggest_encoded(name, headers, mode, options.flags)
        if len(sizes) == 1:
            return ColumnSpec(
                name, "dense", image_dtype(mode), image_shape(sizes.pop(), mode), decode="image",
                extra=extra, provisional=not complete,
            )
        return ColumnSpec(name, "ragged", image_dtype(mode), None, decode="image", extra=extra)

    @staticmethod
    def records(spec: ColumnSpec, encoded: list, where: list[str], flags: Flags):
        """Encoded images as what the column's store appends: a provisional
        dense column gets a list (ragged records) for a batch with an image
        that does not fit its shape or mode."""
        if spec.kind == "bytes":
            side = spec.extra.get("max_side") if spec.extra else None
            if side:
                return [shrink_encoded(data, side, w) for data, w in zip(encoded, where)]
            return encoded
        mode = spec.extra["image_mode"]
        arrays = [
            decode_image(data, mode, w, own_if_wider=spec.provisional)
            for data, w in zip(encoded, where)
        ]
        if spec.kind == "ragged":
            return arrays
        for a, w in zip(arrays, where):
            if a.shape != spec.item_shape:
                if spec.provisional:
                    return arrays
                raise ConvertError(
                    f"{w}: image has shape {a.shape} but the column {spec.name!r} holds "
                    f"{spec.item_shape} images; keep the encoded "
                    f"files with {flags.opt('keep_encoded')}, or resize the images first"
                )
        if not arrays:
            return np.zeros((0,) + spec.dense_shape, spec.dtype)
        return np.stack(arrays)

    @staticmethod
    def note(spec: ColumnSpec) -> str | None:
        """What was chosen for an image column, in words (None for others)."""
        mode = spec.extra.get("image_mode")
        if spec.decode != "image" or mode is None:
            return None
        counts = ", ".join(f"{m} {n:,}" for m, n in spec.extra.get("image_modes", {}).items())
        probed = spec.extra.get("images_probed")
        seen = f"the first {probed:,} images: {counts}" if probed else f"images: {counts}"
        if spec.kind == "dense":
            return f"column {spec.name!r}: {spec.describe()}, stored as {mode} ({seen})"
        if mode == PER_IMAGE:
            return (
                f"column {spec.name!r}: images of several sizes, RaggedStore, each in its "
                f"own mode: (h, w) for L, (h, w, 2|3|4) for LA, RGB, RGBA ({seen})"
            )
        return f"column {spec.name!r}: images of several sizes, RaggedStore, all {mode}"


def _suggest_encoded(name: str, headers: list[ImageHeader], mode: str, flags: Flags) -> None:
    """Warns when the decoded images take more than twice their files."""
    encoded = sum(h.nbytes for h in headers)
    decoded = 0
    for h in headers:
        m = h.mode if mode == PER_IMAGE else mode
        decoded += int(np.prod(image_shape(h.size, m))) * image_dtype(m).itemsize
    if encoded and decoded > 2 * encoded:
        what = "the images" if len(headers) > 1 else "the image"
        user_warning(
            f"column {name!r}: decoded, {what} looked at take {decoded / encoded:.1f}x "
            f"their encoded size ({_mib(decoded)} against {_mib(encoded)} of files); "
            f"{flags.opt('keep_encoded')} stores the files as they are (decode them in "
            "your transform)"
        )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def image_header(data, where: str) -> ImageHeader:
    """The header of encoded image bytes or an image file (a path)."""
    import io

    from ._columns import image_errors, require

    image_mod = require("PIL.Image", "convert", "reading images")
    try:
        with image_mod.open(io.BytesIO(data) if not isinstance(data, str) else data) as im:
            nbytes = os.path.getsize(data) if isinstance(data, str) else len(data)
            return ImageHeader(im.size, normal_mode(im.mode, im.info), nbytes)
    except image_errors(image_mod) as e:
        raise ConvertError(f"{where}: not a readable image ({e})") from None


def shrink_encoded(data: bytes, max_side: int, where: str) -> bytes:
    """An encoded image with its longer side at most `max_side` pixels: the
    bytes as they are when it already is, else shrunk (aspect kept, Pillow's
    Lanczos) and encoded again: a JPEG as a JPEG at quality 90, anything
    else as PNG (lossless)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
            if max(w, h) <= max_side:
                return data
            scale = max_side / max(w, h)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            jpeg = im.format == "JPEG"
            small = im.convert("RGB" if jpeg and im.mode not in ("L", "RGB") else im.mode)
            small = small.resize(size, Image.Resampling.LANCZOS)
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise ConvertError(f"{where}: cannot read the image to shrink it (max_side): {e}") \
            from None
    out = io.BytesIO()
    if jpeg:
        small.save(out, "JPEG", quality=90)
    else:
        small.save(out, "PNG")
    return out.getvalue()

