"""File-tree sources: an image folder (``class_name/*.jpg|png``, labels from
the folder names, decoded with Pillow) and WebDataset ``.tar`` shards
(members grouped by key, one column per extension).
"""

from __future__ import annotations

import io
import os
import tarfile
import zlib
from typing import Any, Iterator

import numpy as np

from ._columns import ColumnSpec, ConvertError
from ._source import Batch, ImageColumn, Options, Source, image_header, row_tasks, select_columns

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
    """``root/<class>/<image>``: columns ``image`` and ``label`` (int64, the
    class's position in sorted order); rows sorted by class, then file name.
    Images directly under `root` (no class folders) give only ``image``."""

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
                specs.append(ImageColumn.spec("image", headers, self.options))
            if "label" in self.names:
                specs.append(
                    ColumnSpec(
                        "label",
                        "dense",
                        np.dtype(np.int64),
                        (),
                        extra={"class_names": self.classes},
                    )
                )
            self._open_specs = specs
        return self._open_specs

    def row_count(self) -> int:
        return len(self.files)

    def tasks(self, workers: int) -> list:
        return row_tasks(len(self.files), workers)

    def read(self, task, specs, batch_bytes: int) -> Iterator[Batch]:
        start, stop = task
        for a in range(start, stop, _BATCH_RECORDS):
            b = min(a + _BATCH_RECORDS, stop)
            cols = {}
            for spec in specs:
                if spec.name == "label":
                    cols["label"] = self.labels[a:b]
                    continue
                paths = [os.path.join(self.root, f) for f in self.files[a:b]]
                encoded = []
                for p in paths:
                    with open(p, "rb") as fh:
                        encoded.append(fh.read())
                cols["image"] = ImageColumn.records(spec, encoded, paths, self.options.flags)
            yield Batch(b - a, cols, b - a)

    def describe(self) -> dict:
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


def _samples(path: str) -> Iterator[tuple[str, dict]]:
    """(key, {extension: bytes}) for consecutive members sharing a key."""
    key = ""  # set before the sample gets its first member
    sample: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r|*", tarinfo=_TarInfo) as tf:
            for member in _members(tf, path):
                if not member.isfile():
                    continue
                k, ext = _split_key(member.name)
                if k != key and sample:
                    yield key, sample
                    sample = {}
                key = k
                if ext in sample:
                    raise ConvertError(
                        f"{path}: sample {k!r} has two members with extension {ext!r}"
                    )
                data = tf.extractfile(member)
                assert data is not None  # a regular file (checked above)
                sample[ext] = data.read()
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise ConvertError(f"{path}: not a readable tar file ({e})") from None
    if sample:
        yield key, sample


class WebDatasetSource(Source):
    """WebDataset shards: one row per sample, one column per extension.
    ``cls``-style extensions become int64 scalars, images are decoded (or
    kept encoded), ``.npy`` members become arrays, the rest stays bytes.
    Tasks are groups of whole tar files; progress counts tar bytes."""

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
        for key, sample in _samples(files[0]):
            probe.append((key, sample))
            if len(probe) >= _PROBE_SAMPLES:
                break
        if not probe:
            raise ConvertError(f"{files[0]}: no samples")
        self.exts = list(probe[0][1])
        self.names = select_columns(self.exts, options, files[0])
        self._open_probe = probe
        self._open_specs = None

    def specs(self) -> list[ColumnSpec]:
        if self._open_specs is None:
            self._open_specs = [self._spec(ext) for ext in self.names]
        return self._open_specs

    def _spec(self, ext: str) -> ColumnSpec:
        probe = self._open_probe
        assert probe is not None  # specs are decided in the process that built the source
        values = [s[ext] for _, s in probe if ext in s]
        where = [f"{self.files[0]}:{k}.{ext}" for k, s in probe if ext in s]
        if ext in _INT_EXTENSIONS:
            return ColumnSpec(ext, "dense", np.dtype(np.int64), (), decode="int")
        if ("." + ext.rsplit(".", 1)[-1]) in IMAGE_EXTENSIONS:
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
                return ColumnSpec(ext, "dense", dtypes.pop(), shapes.pop(), decode="npy")
            if len(dtypes) == 1:
                return ColumnSpec(ext, "ragged", dtypes.pop(), None, decode="npy")
        return ColumnSpec(ext, "bytes", np.dtype(np.uint8), None)

    def row_count(self) -> None:
        return None

    def progress_total(self) -> float:
        return float(sum(os.path.getsize(f) for f in self.files))

    def tasks(self, workers: int) -> list:
        groups = row_tasks(len(self.files), workers)
        return [self.files[a:b] for a, b in groups]

    def read(self, task, specs, batch_bytes: int) -> Iterator[Batch]:
        for path in task:
            cols: dict[str, list] = {s.name: [] for s in specs}
            rows, size = 0, 0
            for key, sample in _samples(path):
                self._add(path, key, sample, specs, cols)
                rows += 1
                size += sum(len(v) for v in sample.values())
                if rows >= _BATCH_RECORDS or size >= batch_bytes:
                    yield Batch(rows, self._finish(cols, specs), 0)
                    rows, cols, size = 0, {s.name: [] for s in specs}, 0
            yield Batch(rows, self._finish(cols, specs), os.path.getsize(path))

    def _add(self, path, key, sample, specs, cols) -> None:
        extra = sorted(set(sample) - set(self.exts))
        if extra:
            raise ConvertError(
                f"{path}: sample {key!r} has extensions {extra} that the first sample "
                f"does not have; skip them with {self.options.flags.skip(extra[0])}"
            )
        for spec in specs:
            if spec.name not in sample:
                raise ConvertError(
                    f"{path}: sample {key!r} has no {spec.name!r} member; every sample "
                    f"needs one, or skip the column with {self.options.flags.skip(spec.name)}"
                )
            cols[spec.name].append((sample[spec.name], f"{path}:{key}.{spec.name}"))

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
            arrays = [_load_npy(v, w) for v, w in zip(values, where)]
            if spec.kind == "ragged":
                for a, w in zip(arrays, where):
                    if a.dtype != spec.dtype:
                        raise ConvertError(
                            f"{w}: array has dtype {a.dtype} but the column holds {spec.dtype} "
                            "(decided from the first samples); keep the bytes with "
                            f"{self.options.flags.opt('keep_encoded')}"
                        )
                return arrays
            for a, w in zip(arrays, where):
                if a.shape != spec.item_shape or a.dtype != spec.dtype:
                    raise ConvertError(
                        f"{w}: array is {a.dtype}{list(a.shape)} but the column holds "
                        f"{spec.dtype}{list(spec.dense_shape)} (decided from the first "
                        f"samples); keep the bytes with {self.options.flags.opt('keep_encoded')}"
                    )
            return np.stack(arrays) if arrays else np.zeros((0,) + spec.dense_shape, spec.dtype)
        return values

    def describe(self) -> dict:
        base = os.path.dirname(self.files[0])
        return {
            "type": "webdataset",
            "path": base,
            "files": (
                [os.path.relpath(f, base) for f in self.files]
                if len(self.files) <= 64
                else len(self.files)
            ),
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
