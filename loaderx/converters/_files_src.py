"""File-tree sources: an image folder (``class_name/*.jpg|png``, labels from
the folder names, decoded with Pillow) and WebDataset ``.tar`` shards
(members grouped by key, one column per extension, except that every image
extension of a sample goes to one image column). Both keep a ``key``
column of where each row came from unless ``keys=False``.
"""

from __future__ import annotations

import io
import os
import tarfile
import zlib
from typing import Any, Iterator

import numpy as np

from ._columns import ColumnSpec, ConvertError
from ._source import (
    KEY_COLUMN,
    Batch,
    ImageColumn,
    Options,
    Source,
    file_entries,
    image_header,
    key_spec,
    ramp,
    ramped,
    row_tasks,
    select_columns,
)

__all__ = ["ImageFolderSource", "WebDatasetSource", "IMAGE_EXTENSIONS", "tar_files"]

IMAGE_EXTENSIONS = (
    ".jpg",
    ".jpeg",
    ".png",
    ".bmp",
    ".gif",
    ".webp",
    ".tif",
    ".tiff",
    ".ppm",
    ".pgm",
)
_INT_EXTENSIONS = ("cls", "cls2", "index", "inx", "id", "label")
_PROBE_SAMPLES = 64
_BATCH_RECORDS = 1024


class ImageFolderSource(Source):
    """``root/<class>/<image>``: columns ``image``, ``label`` (int64, the
    class's position in sorted order; the class names are the column's
    ``labels``) and ``key`` (the file's path under `root`); rows sorted by
    class, then file name. Images directly under `root` (no class folders)
    give no ``label``. Every image's header is read first, so the layout and
    mode fit every image (see `ImageColumn`)."""

    kind = "image-folder"
    _open_specs = None  # per process, never pickled

    def __init__(self, root: str, options: Options):
        super().__init__(options)
        self.root = os.path.abspath(root)
        self.classes = sorted(
            d
            for d in os.listdir(root)
            if os.path.isdir(os.path.join(root, d)) and not d.startswith(".")
        )
        files, labels = [], []
        groups = [(i, os.path.join(root, c)) for i, c in enumerate(self.classes)] or [(-1, root)]
        for label, folder in groups:
            for dirpath, dirs, names in os.walk(folder):
                dirs.sort()
                for name in sorted(names):
                    if name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith("."):
                        files.append(os.path.relpath(os.path.join(dirpath, name), root))
                        labels.append(label)
        if not files:
            raise ConvertError(
                f"{root}: no images ({', '.join(IMAGE_EXTENSIONS)}) found in " "class_name/ folders"
            )
        self.files = files
        self.labels = np.asarray(labels, dtype=np.int64)
        available = ["image", "label"] if self.classes else ["image"]
        available += [KEY_COLUMN] if options.keys else []
        self.names = select_columns(available, options, root)
        self._open_specs = None

    def specs(self) -> list[ColumnSpec]:
        if self._open_specs is None:
            specs = []
            if "image" in self.names:
                headers = (
                    []
                    if self.options.keep_encoded
                    else [
                        image_header(os.path.join(self.root, f), os.path.join(self.root, f))
                        for f in self.files
                    ]
                )
                specs.append(ImageColumn.spec("image", headers, self.options, complete=True))
            if "label" in self.names:
                specs.append(
                    ColumnSpec(
                        "label", "dense", np.dtype(np.int64), (), extra={"labels": self.classes}
                    )
                )
            if KEY_COLUMN in self.names:
                specs.append(key_spec())
            self._open_specs = [s for n in self.names for s in specs if s.name == n]
        return self._open_specs

    def row_count(self) -> int:
        return len(self.files)

    def tasks(self, workers: int) -> list:
        return row_tasks(len(self.files), workers)

    def read(self, task, specs, batch_bytes: int) -> Iterator[Batch]:
        start, stop = task
        for a, b in ramped(start, stop, _BATCH_RECORDS):
            cols: dict = {}
            nbytes = 0
            for spec in specs:
                if spec.name == "label":
                    cols["label"] = self.labels[a:b]
                elif spec.name == KEY_COLUMN:
                    cols[KEY_COLUMN] = [f.replace(os.sep, "/").encode() for f in self.files[a:b]]
                else:
                    paths = [os.path.join(self.root, f) for f in self.files[a:b]]
                    encoded = []
                    for p in paths:
                        with open(p, "rb") as fh:
                            encoded.append(fh.read())
                    nbytes = sum(len(e) for e in encoded)
                    cols["image"] = ImageColumn.records(spec, encoded, paths, self.options.flags)
            yield Batch(b - a, cols, b - a, nbytes=nbytes)

    def describe(self, file_rows: list | None = None) -> dict:
        d: dict[str, Any] = {"type": "image-folder", "path": self.root}
        if self.classes:
            d["classes"] = self.classes
        return d


def tar_files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [os.path.abspath(path)]
    names = sorted(f for f in os.listdir(path) if f.endswith((".tar", ".tar.gz", ".tgz")))
    return [os.path.abspath(os.path.join(path, f)) for f in names]


def _split_key(member: str) -> tuple[str, str]:
    """WebDataset naming: the key is the path up to the first dot of the file name."""
    folder, base = os.path.split(member)
    stem, dot, ext = base.partition(".")
    return os.path.join(folder, stem), ext.lower() if dot else ""


class _TarInfo(tarfile.TarInfo):
    """Records on its TarFile why the header read that ended the archive
    failed: `tarfile` ends the iteration silently on a truncated or damaged
    header, which only the end-of-archive marker (a zero block) tells apart
    from a complete archive."""

    @classmethod
    def fromtarfile(cls, tf):
        try:
            info = super().fromtarfile(tf)
        except tarfile.HeaderError as e:
            tf.loaderx_end = e
            raise
        tf.loaderx_end = None
        return info


def _members(tf: tarfile.TarFile, path: str) -> Iterator[tarfile.TarInfo]:
    """The members of an archive read as a stream, then a check that it
    ended with its end-of-archive marker rather than at a damaged or
    truncated header."""
    count = 0
    while True:
        member = tf.next()
        if member is None:
            break
        # A stream reader needs no member list (TarFile keeps one, undeclared
        # in the stubs): clearing it keeps memory flat on a shard of many members.
        tf.members.clear()  # type: ignore[attr-defined]
        count += 1
        yield member
    end = getattr(tf, "loaderx_end", None)
    # EOFHeaderError (an all-zero block: the marker) is in every CPython 3 but not the stubs.
    if not isinstance(end, tarfile.EOFHeaderError):  # type: ignore[attr-defined]
        why = f"({end})" if end is not None else "(no end-of-archive marker)"
        raise ConvertError(
            f"{path}: the archive ends after {count} members without its end-of-archive "
            f"marker {why}: the file is truncated or damaged"
        )


def _samples(path: str) -> Iterator[tuple[str, dict, int]]:
    """(key, {extension: bytes}, bytes of the file read so far) for
    consecutive members sharing a key."""
    key = ""  # set before the sample gets its first member
    sample: dict[str, bytes] = {}
    try:
        # The file is opened here so that its position tells how far the
        # (maybe compressed) archive has been read, for the progress.
        with open(path, "rb") as raw, tarfile.open(
            fileobj=raw, mode="r|*", tarinfo=_TarInfo
        ) as tf:
            for member in _members(tf, path):
                if not member.isfile():
                    continue
                k, ext = _split_key(member.name)
                if k != key and sample:
                    yield key, sample, raw.tell()
                    sample = {}
                key = k
                if ext in sample:
                    raise ConvertError(
                        f"{path}: sample {k!r} has two members with extension {ext!r}"
                    )
                data = tf.extractfile(member)
                assert data is not None  # a regular file (checked above)
                sample[ext] = data.read()
            if sample:
                yield key, sample, raw.tell()
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise ConvertError(f"{path}: not a readable tar file ({e})") from None


def _is_image(ext: str) -> bool:
    """An extension that names an image (``jpg``, ``seg.png``)."""
    return "." + ext.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS


class WebDatasetSource(Source):
    """WebDataset shards: one row per sample, one column per extension,
    except that a sample's image (``jpg``, ``jpeg``, ``png``, ``webp``, ...:
    any one-part image extension) goes to the one column `image_column`
    whatever its format, as webdataset's decoders read ``jpg;png``; a
    many-part extension such as ``seg.png`` keeps its own column. ``cls``-
    style extensions become int64 scalars, images are decoded (or kept
    encoded), ``.npy`` members become arrays, the rest stays bytes, and
    ``key`` holds each sample's ``__key__``. Tasks are groups of whole tar
    files; progress counts tar bytes."""

    kind = "webdataset"
    _open_specs = None  # per process, never pickled
    _open_probe: list[tuple[str, dict]] | None = None  # per process, never pickled
    unit = "B"

    def __init__(self, files: list[str], options: Options):
        super().__init__(options)
        if not files:
            raise ConvertError("no WebDataset .tar files to convert")
        self.files = files
        probe = []
        for key, sample, _ in _samples(files[0]):
            probe.append((key, self._by_column(files[0], key, sample)))
            if len(probe) >= _PROBE_SAMPLES:
                break
        if not probe:
            raise ConvertError(f"{files[0]}: no samples")
        self.exts = list(probe[0][1])
        if options.keys and KEY_COLUMN in self.exts:
            raise ConvertError(
                f"{files[0]}: the samples have a {KEY_COLUMN!r} member, the name of the column "
                "of sample keys; leave the keys out with "
                + ("--no-keys" if options.flags.cli else "keys=False")
            )
        available = self.exts + ([KEY_COLUMN] if options.keys else [])
        self.names = select_columns(available, options, files[0])
        self._open_probe = probe
        self._open_specs = None

    def _by_column(self, path: str, key: str, sample: dict) -> dict:
        """A sample's members by column, as ``{column: (extension, bytes)}``:
        the one-part image extensions under `image_column` (one image per
        sample), the rest by extension."""
        image_column = self.options.image_column
        if image_column is None:
            return {ext: (ext, data) for ext, data in sample.items()}
        images = [e for e in sample if "." not in e and _is_image(e)]
        if len(images) > 1:
            raise ConvertError(
                f"{path}: sample {key!r} has {len(images)} images ({', '.join(images)}) for "
                f"the one column {image_column!r}; keep one column per extension with "
                + ("--image-per-extension" if self.options.flags.cli else "image_column=None")
            )
        out = {}
        for ext, data in sample.items():
            column = image_column if ext in images else ext
            if column in out or (ext == image_column and ext not in images):
                raise ConvertError(
                    f"{path}: sample {key!r} has a {image_column!r} member next to its image "
                    f"({images[0]}), which goes to the column {image_column!r}; name that "
                    "column otherwise with "
                    + ("--image-column NAME" if self.options.flags.cli else "image_column=...")
                )
            out[column] = (ext, data)
        return out

    def specs(self) -> list[ColumnSpec]:
        if self._open_specs is None:
            self._open_specs = [self._spec(ext) for ext in self.names]
        return self._open_specs

    def _spec(self, ext: str) -> ColumnSpec:
        if ext == KEY_COLUMN:
            return key_spec()
        probe = self._open_probe
        assert probe is not None  # specs are decided in the process that built the source
        values = [s[ext][1] for _, s in probe if ext in s]
        where = [f"{self.files[0]}:{k}.{s[ext][0]}" for k, s in probe if ext in s]
        if ext in _INT_EXTENSIONS:
            return ColumnSpec(ext, "dense", np.dtype(np.int64), (), decode="int")
        if ext == self.options.image_column or _is_image(ext):
            headers = (
                []
                if self.options.keep_encoded
                else [image_header(v, w) for v, w in zip(values, where)]
            )
            return ImageColumn.spec(ext, headers, self.options)
        if ext.endswith("npy") and not self.options.keep_encoded:
            arrays = [_load_npy(v, w) for v, w in zip(values, where)]
            shapes = {a.shape for a in arrays}
            dtypes = {a.dtype for a in arrays}
            if len(dtypes) == 1 and len(shapes) == 1:
                shape = shapes.pop()
                return ColumnSpec(
                    ext, "dense", dtypes.pop(), shape, decode="npy", provisional=len(shape) > 0
                )
            if len(dtypes) == 1:
                return ColumnSpec(ext, "ragged", dtypes.pop(), None, decode="npy")
        return ColumnSpec(ext, "bytes", np.dtype(np.uint8), None)

    def row_count(self) -> None:
        return None

    def progress_total(self) -> float:
        return float(sum(os.path.getsize(f) for f in self.files))

    def tasks(self, workers: int) -> list:
        return row_tasks(len(self.files), workers)

    def read(self, task, specs, batch_bytes: int) -> Iterator[Batch]:
        records_max, bytes_max = ramp(_BATCH_RECORDS), ramp(batch_bytes)
        for position in range(*task):
            path = self.files[position]
            cols: dict[str, list] = {s.name: [] for s in specs}
            rows, size, reported = 0, 0, 0
            limits = (next(records_max), next(bytes_max))
            for key, sample, read in _samples(path):
                self._add(path, key, self._by_column(path, key, sample), specs, cols)
                rows += 1
                size += sum(len(data) for data in sample.values())
                if rows >= limits[0] or size >= limits[1]:
                    yield Batch(rows, self._finish(cols, specs), read - reported, read - reported,
                                file=position)
                    rows, cols, size, reported = 0, {s.name: [] for s in specs}, 0, read
                    limits = (next(records_max), next(bytes_max))
            end = os.path.getsize(path)
            yield Batch(rows, self._finish(cols, specs), end - reported, end - reported,
                        file=position)

    def _add(self, path, key, sample, specs, cols) -> None:
        extra = sorted(set(sample) - set(self.exts))
        if extra:
            raise ConvertError(
                f"{path}: sample {key!r} has extensions {extra} that the first sample "
                f"does not have; skip them with {self.options.flags.skip(extra[0])}"
            )
        for spec in specs:
            if spec.name == KEY_COLUMN:
                cols[KEY_COLUMN].append((key.encode("utf-8", "surrogateescape"), ""))
                continue
            if spec.name not in sample:
                raise ConvertError(
                    f"{path}: sample {key!r} has no {spec.name!r} member; every sample "
                    f"needs one, or skip the column with {self.options.flags.skip(spec.name)}"
                )
            ext, data = sample[spec.name]
            cols[spec.name].append((data, f"{path}:{key}.{ext}"))

    def _finish(self, cols: dict, specs: list[ColumnSpec]) -> dict:
        out = {}
        for spec in specs:
            values = [v for v, _ in cols[spec.name]]
            where = [w for _, w in cols[spec.name]]
            out[spec.name] = self._column(spec, values, where)
        return out

    def _column(self, spec: ColumnSpec, values: list, where: list):
        if spec.decode == "int":
            return np.array([_int_member(v, w) for v, w in zip(values, where)], dtype=np.int64)
        if spec.decode in ("image", "encoded-image"):
            return ImageColumn.records(spec, values, where, self.options.flags)
        if spec.decode == "npy":
            return self._arrays(spec, values, where)
        return values

    def _arrays(self, spec: ColumnSpec, values: list, where: list):
        """``.npy`` members as the column's records: a batch of another shape
        in a provisional dense column comes back as a list (ragged records)."""
        arrays = [_load_npy(v, w) for v, w in zip(values, where)]
        for a, w in zip(arrays, where):
            if a.dtype != spec.dtype:
                raise ConvertError(
                    f"{w}: array has dtype {a.dtype} but the column holds {spec.dtype} "
                    "(decided from the first samples); keep the bytes with "
                    f"{self.options.flags.opt('keep_encoded')}"
                )
        if spec.kind == "ragged":
            return arrays
        if any(a.shape != spec.item_shape for a in arrays):
            if spec.provisional:
                return arrays
            bad = next(w for a, w in zip(arrays, where) if a.shape != spec.item_shape)
            raise ConvertError(
                f"{bad}: array does not have the shape {spec.dense_shape} of the column; keep "
                f"the bytes with {self.options.flags.opt('keep_encoded')}"
            )
        return np.stack(arrays) if arrays else np.zeros((0,) + spec.dense_shape, spec.dtype)

    def describe(self, file_rows: list | None = None) -> dict:
        base = os.path.dirname(self.files[0])
        return {
            "type": "webdataset",
            "path": base,
            "files": file_entries(self.files, base, file_rows),
        }


def _int_member(data: bytes, where: str) -> int:
    try:
        value = int(data.decode().strip())
    except (UnicodeDecodeError, ValueError):
        value = None
    if value is None or not -(1 << 63) <= value < (1 << 63):
        raise ConvertError(f"{where}: holds {data[:40]!r}, not an integer of int64")
    return value


def _load_npy(data: bytes, where: str) -> np.ndarray:
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError) as e:
        raise ConvertError(f"{where}: not a readable .npy ({e})") from None
