"""The interface every converter source implements, and what they share.

A source is small and picklable (paths and options, never open handles), so
``workers=N`` can ship it to N processes. It names its columns
(`ColumnSpec`s), splits itself into disjoint *tasks* (row ranges, or groups of
files), and reads one task as bounded batches of ready-to-append values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from ._columns import ColumnSpec, ConvertError, Flags, decode_image, image_shape, image_target_mode

__all__ = ["Batch", "Options", "Source", "row_tasks", "select_columns", "ImageColumn",
           "image_shape"]


@dataclass
class Options:
    """Converter options that sources see."""

    columns: list | None = None
    skip_columns: list = field(default_factory=list)
    keep_encoded: bool = False
    row_length: int | None = None
    flags: Flags = field(default_factory=Flags)
    fill_null: dict = field(default_factory=dict)


@dataclass
class Batch:
    """`rows` records of every column; `progress` units of work done."""

    rows: int
    columns: dict
    progress: float


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

    def describe(self) -> dict:
        raise NotImplementedError

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


class ImageColumn:
    """Decides and applies an image column's layout: DenseStore when every
    image of the sample has one size and mode, RaggedStore otherwise, Zrecord
    of the encoded bytes with ``keep_encoded``."""

    @staticmethod
    def spec(name: str, headers: list[tuple[tuple, str]], options: Options) -> ColumnSpec:
        if options.keep_encoded:
            return ColumnSpec(name, "bytes", np.dtype(np.uint8), None, decode="encoded-image")
        if not headers:
            raise ConvertError(f"column {name!r}: no images to look at")
        mode = image_target_mode({m for _, m in headers}, name, options.flags)
        from ._columns import image_dtype

        shapes = {image_shape(size, mode) for size, _ in headers}
        extra = {"image_mode": mode}
        if len(shapes) == 1:
            return ColumnSpec(
                name, "dense", image_dtype(mode), shapes.pop(), decode="image", extra=extra
            )
        return ColumnSpec(name, "ragged", image_dtype(mode), None, decode="image", extra=extra)

    @staticmethod
    def records(spec: ColumnSpec, encoded: list, where: list[str], flags: Flags):
        """Encoded images as what the column's store appends."""
        if spec.kind == "bytes":
            return encoded
        mode = spec.extra["image_mode"]
        arrays = [decode_image(data, mode, w) for data, w in zip(encoded, where)]
        if spec.kind == "ragged":
            return arrays
        for a, w in zip(arrays, where):
            if a.shape != spec.item_shape:
                raise ConvertError(
                    f"{w}: image has shape {a.shape} but the column {spec.name!r} holds "
                    f"{spec.item_shape} images (decided from the first ones); keep the encoded "
                    f"files with {flags.opt('keep_encoded')}, or resize the images first"
                )
        if not arrays:
            return np.zeros((0,) + spec.dense_shape, spec.dtype)
        return np.stack(arrays)


def image_header(data, where: str) -> tuple[tuple, str]:
    """(size, mode) of encoded image bytes, reading only the header."""
    import io

    from ._columns import image_errors, require

    image_mod = require("PIL.Image", "convert", "reading images")
    try:
        with image_mod.open(io.BytesIO(data) if not isinstance(data, str) else data) as im:
            return im.size, im.mode
    except image_errors(image_mod) as e:
        raise ConvertError(f"{where}: not a readable image ({e})") from None
