"""The dataset manifest (``loaderx.json``): its name and version, reading it
from a directory or a URL, and the checks every manifest passes before
anything opens what it names (`checked_manifest`). Below the stores and
`loaderx.remote`, which both read manifests; `loaderx.dataset` opens what a
manifest describes.
"""
from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

from . import _objstore, _openers
from ._checks import KINDS, path_arg
from ._writer import is_store_dir
from .errors import CorruptStoreError, NotAStoreError, StoreNotFoundError

__all__ = ["MANIFEST_NAME", "MANIFEST_FORMAT", "MANIFEST_VERSION", "GENERATION_RE",
           "read_manifest", "checked_manifest", "manifest_error", "check_inside",
           "col_rows"]

#: The manifest file of a dataset directory, and the version of its layout.
#: Version 2 names a generation directory (``"generation": "gen-000001"``)
#: that holds every part: the manifest's paths all start with it, and an
#: overwrite writes a new generation beside the old one, then replaces the
#: manifest in one atomic rename. Version 1 (parts straight under the
#: dataset directory) is still read.
MANIFEST_NAME = "loaderx.json"
MANIFEST_FORMAT = "loaderx-dataset"
MANIFEST_VERSION = 2
#: The name of a generation directory.
GENERATION_RE = re.compile(r"gen-[0-9]{6,}")


def manifest_error(path: str, what: str) -> CorruptStoreError:
    """A damaged manifest: what is wrong with it, naming the dataset."""
    return CorruptStoreError(f"{path}: {MANIFEST_NAME} {what}", path=path)


def read_manifest(path, *, storage_options=None) -> dict:
    """The checked manifest of the dataset directory `path` (a dict); `path`
    may be a URL (`storage_options` as in `open_dataset`)."""
    p = path_arg(path, "dataset path")
    if _objstore.is_url(p):
        opener = _openers.remote(p)
        with opener.settings(None, None, storage_options):
            return checked_manifest(p, opener.manifest_text(p))
    file = os.path.join(p, MANIFEST_NAME)
    if not os.path.isfile(file):
        if not os.path.exists(p):
            raise StoreNotFoundError(f"{p}: no such dataset directory", path=p)
        if is_store_dir(p):
            raise NotAStoreError(f"{p} is a single store, not a dataset directory; open it with "
                                 "loaderx.open_store", path=p)
        raise NotAStoreError(f"{p} is not a loaderx dataset directory (no {MANIFEST_NAME})", path=p)
    try:
        with open(file, "rb") as f:
            text = f.read()
    except FileNotFoundError:  # replaced by a rename just now
        raise StoreNotFoundError(f"{p}: {MANIFEST_NAME} disappeared while being read", path=p) \
            from None
    return checked_manifest(p, text)


def checked_manifest(p: str, text: bytes) -> dict:
    """`text` (a manifest file's bytes) parsed and checked."""
    try:
        manifest = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as e:
        raise manifest_error(p, f"is not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise manifest_error(p, f"is not a {MANIFEST_FORMAT} manifest")
    version = manifest.get("version")
    if type(version) is not int or not 1 <= version <= MANIFEST_VERSION:
        raise manifest_error(p, f"has version {version!r}; this loaderx reads up to "
                                 f"{MANIFEST_VERSION}")
    generation = manifest.get("generation") if version >= 2 else None
    if version >= 2 and not (isinstance(generation, str) and GENERATION_RE.fullmatch(generation)):
        raise manifest_error(p, f"names no generation directory (got {generation!r})")
    if "splits" in manifest:
        splits = manifest["splits"]
        if not isinstance(splits, dict) or not splits:
            raise manifest_error(p, "has an empty or malformed 'splits'")
        for name, sub in splits.items():
            if not _inside(sub, generation) or os.path.normpath(sub) == ".":
                raise manifest_error(p, f"split {name!r} names {sub!r}, which is not a "
                                         "directory inside this one"
                                      + (f" (under {generation})" if generation else ""))
        return manifest
    _check_columns(p, manifest, generation)
    return manifest


def _inside(sub: Any, generation: str | None = None) -> bool:
    """Whether a manifest's relative path stays inside the dataset directory
    (and, in a version 2 manifest, inside its generation directory)."""
    # Paths are written with "/" on every system; a backslash would be a
    # separator on Windows and a file-name character elsewhere: refused.
    if not isinstance(sub, str) or not sub or os.path.isabs(sub) or "\0" in sub or "\\" in sub:
        return False
    parts = sub.split("/")
    if ".." in parts:
        return False
    return generation is None or (parts[0] == generation and len(parts) > 1)


def _shard_entry_ok(s: Any) -> bool:
    return isinstance(s, dict) and isinstance(s.get("path"), str) \
        and type(s.get("rows")) is int and s["rows"] >= 0


def _check_columns(p: str, manifest: dict, generation: str | None) -> None:
    columns, rows = manifest.get("columns"), manifest.get("rows")
    if not isinstance(columns, dict) or not columns or type(rows) is not int:
        raise manifest_error(p, "needs 'rows' and a non-empty 'columns'")
    for name, col in columns.items():
        shards = col.get("shards") if isinstance(col, dict) else None
        if not isinstance(shards, list) or not shards or not all(map(_shard_entry_ok, shards)):
            raise manifest_error(p, f"column {name!r} has malformed 'shards'")
        total = sum(s["rows"] for s in shards)
        if total != rows:
            raise manifest_error(p, f"column {name!r} shards hold {total} rows, the dataset "
                                     f"{rows}")
        for s in shards:
            if not _inside(s["path"], generation):
                raise manifest_error(p, f"column {name!r} names a shard outside the directory"
                                         + (f" {generation}" if generation else "")
                                         + f": {s['path']!r}")
        _check_column_type(p, name, col)
        _check_typed(p, name, col, columns)


def _check_column_type(p: str, name: str, col: dict) -> None:
    """A column's kind, dtype, item_shape, codec and content are of the
    types the converters write (they are compared with each part's at open)."""
    kind, dtype, shape = col.get("kind"), col.get("dtype"), col.get("item_shape")
    if kind not in KINDS:
        raise manifest_error(p, f"column {name!r} has unknown kind {kind!r}")
    if kind != "bytes" and not isinstance(dtype, str):
        raise manifest_error(p, f"column {name!r} has no dtype")
    if kind == "dense" and not (isinstance(shape, list)
                                and all(type(d) is int and d >= 0 for d in shape)):
        raise manifest_error(p, f"column {name!r} has a malformed item_shape {shape!r}")
    codecs = [col.get("codec")] + [s["codec"] for s in col["shards"] if "codec" in s]
    if not all(isinstance(c, str) for c in codecs):
        raise manifest_error(p, f"column {name!r} has a malformed codec")
    # A conversion of loaderx data: the content id of the column it copied (Store.content_id).
    content = col.get("content")
    if content is not None and not (isinstance(content, dict) and isinstance(content.get("id"), str)
                                    and type(content.get("rows")) is int):
        raise manifest_error(p, f"column {name!r} has a malformed 'content' ({str(content)[:80]} "
                                "is not {'id': str, 'rows': int})")


#: The dtypes a categorical's codes may have (the converters write int8/16/32).
_CODE_DTYPES = ("int8", "int16", "int32", "int64")


def _check_typed(p: str, name: str, col: dict, columns: dict) -> None:
    """A column's typed fields (loaderx.columns: ``text``, ``valid``,
    ``valid_of``, ``categories``, ``labels``) are what the converters write,
    or the dataset is refused here, before anything reads it: a ``valid``
    naming a missing column would make ``IS NULL`` find no null, and a
    malformed list would fail later with an error that names nothing."""
    def bad(field: str, why: str) -> CorruptStoreError:
        return manifest_error(p, f"column {name!r} has a malformed {field!r}: {why}")

    text = col.get("text", False)
    if type(text) is not bool:
        raise bad("text", f"{text!r} is neither true nor false")
    if text and col.get("kind") != "bytes":
        raise bad("text", f"a string column holds bytes records, this one {col.get('kind')}")
    if col.get("valid") is not None:
        _check_mask(p, name, col["valid"], columns)
    owner = col.get("valid_of")
    if owner is not None and not (isinstance(owner, str) and owner in columns
                                  and columns[owner].get("valid") == name):
        raise bad("valid_of", f"{owner!r} is not a column whose mask this is")
    cats = col.get("categories")
    if cats is not None:
        if not isinstance(cats, list) or not (all(isinstance(c, str) for c in cats)
                                              or all(type(c) is int for c in cats)):
            raise bad("categories", f"{str(cats)[:80]} is not a list of strings or of integers")
        if col.get("kind") != "dense" or col.get("item_shape") != [] \
                or col.get("dtype") not in _CODE_DTYPES:
            raise bad("categories", f"a categorical holds integer codes, one per record; this "
                                    f"column holds {col.get('kind')} {col.get('dtype')} "
                                    f"{col.get('item_shape')} records")
    for field in ("labels", "class_names"):
        names = col.get(field)
        if names is not None and not (isinstance(names, list)
                                      and all(isinstance(n, str) for n in names)):
            raise bad(field, f"{str(names)[:80]} is not a list of strings")


def _check_mask(p: str, name: str, mask: Any, columns: dict) -> None:
    """Column `name`'s ``valid`` names its validity mask: another column,
    of one bool per record, that says it is `name`'s (``valid_of``)."""
    def bad(why: str) -> CorruptStoreError:
        return manifest_error(p, f"column {name!r} has a malformed 'valid': {why}")

    if not isinstance(mask, str) or mask == name:
        raise bad(f"{repr(mask)[:80]} does not name another column")
    entry = columns.get(mask)
    if not isinstance(entry, dict):
        raise bad(f"its mask column {mask!r} is not in the dataset (the columns are "
                  f"{list(columns)[:20]})")
    if entry.get("kind") != "dense" or entry.get("dtype") != "bool" \
            or entry.get("item_shape") != []:
        raise bad(f"its mask column {mask!r} holds {entry.get('kind')} {entry.get('dtype')} "
                  f"{entry.get('item_shape')} records, not one bool per record")
    if entry.get("valid_of") != name:
        raise bad(f"its mask column {mask!r} says it is the mask of "
                  f"{entry.get('valid_of')!r}")


def col_rows(col: dict) -> int:
    """The records a (checked) column entry's shards hold."""
    return sum(s["rows"] for s in col["shards"])


def check_inside(root: str, rel: str, what: str) -> str:
    """`root`/`rel` after checking that every existing component below `root`
    is a directory and none is a symlink (a part must never be reached
    through a link out of the dataset). A missing component is left for the
    open to report. Under a URL, the joined URL (`_inside` kept ``..`` out)."""
    if _objstore.is_url(root):
        return _objstore.join(root, rel)
    path = root
    for comp in rel.split("/"):
        path = os.path.join(path, comp)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return os.path.join(root, rel)
        if stat.S_ISLNK(st.st_mode):
            raise CorruptStoreError(
                f"{root}: {what}: {os.path.relpath(path, root)} is a symlink; a dataset's "
                "parts must lie inside its directory (refused, never followed)", path=path)
        if not stat.S_ISDIR(st.st_mode):
            raise CorruptStoreError(f"{root}: {what}: {os.path.relpath(path, root)} is not a "
                                    "directory", path=path)
    return path
