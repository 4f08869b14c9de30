"""Dataset directories on disk: where shard stores are staged, how a
conversion is committed, and the manifest it commits.

Layout: ``DEST/loaderx.json`` plus ``DEST/<column>/part-NNNNN/`` (one store
per shard). Nothing a reader trusts changes until the end:

* ``create`` / ``overwrite`` build the whole directory next to DEST (a hidden
  sibling, same file system) and rename it into place; ``overwrite`` moves
  the old directory aside first and deletes it after.
* ``append`` stages new parts inside DEST, renames them next to the old
  parts, then replaces the manifest atomically. A crash before that leaves
  parts no manifest names, which readers ignore.

So a failed or interrupted conversion never leaves a half-written shard in
a manifest, and `abort()` removes the staging directory.

An ``append`` or ``overwrite`` holds an exclusive ``flock`` on DEST from
``begin()`` to ``commit()``/``abort()`` (a second one raises ``LockedError``:
two appends at once would each write a manifest without the other's parts),
re-reads the manifest under it, and removes parts a killed append moved in
but never named. A ``create`` never replaces a DEST that appeared meanwhile.

A staging directory holds ``.loaderx-owner``, locked (``flock``) by the
converting process while it lives. A process killed outright (SIGKILL, power
loss) cannot clean up, so the next conversion to the same destination removes
staging directories whose owner lock is free (or, with no owner file, that
are over a minute old) and old directories an interrupted ``overwrite`` left
aside once DEST is back in place.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import time
import uuid

try:
    import fcntl
except ImportError:  # no flock (Windows): staging is neither locked nor swept
    fcntl = None  # type: ignore[assignment]

from ..dataset import (
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    DestinationExistsError,
    read_manifest,
)
from ..errors import IdentityError, LockedError
from ._columns import ColumnSpec, ConvertError, Flags

__all__ = ["Destination", "safe_name", "spec_entry", "swap_into", "write_json"]


def safe_name(name: str, taken: set) -> str:
    """A directory name for a column: its name with unsafe characters replaced."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "column"
    candidate, k = base, 1
    while candidate.lower() in taken or candidate == MANIFEST_NAME:
        candidate, k = f"{base}-{k}", k + 1
    taken.add(candidate.lower())
    return candidate


def spec_entry(spec: ColumnSpec, codec: str) -> dict:
    entry = {
        "kind": spec.kind,
        "dtype": str(spec.dtype),
        "item_shape": list(spec.dense_shape) if spec.kind == "dense" else None,
        "codec": codec,
    }
    entry.update(spec.extra)
    return entry


def write_json(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def swap_into(staging: str, dest: str, replace: bool = True) -> None:
    """Rename the finished `staging` directory to `dest`, moving an old
    non-empty `dest` aside first and deleting it after; with `replace` false,
    a non-empty `dest` (made while this conversion ran) is an error instead."""
    old = None
    if os.path.lexists(dest) and os.listdir(dest):
        if not replace:
            raise DestinationExistsError(
                f"{dest} appeared while this conversion ran; nothing was replaced", path=dest
            )
        parent, base = os.path.split(dest)
        old = os.path.join(parent, f".{base}.loaderx-old-{uuid.uuid4().hex[:12]}")
        os.rename(dest, old)
    os.rename(staging, dest)  # replaces an empty directory too
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


_OWNER = ".loaderx-owner"
#: A staging directory with no owner file is left alone for this long: its
#: converter may be between making it and locking its owner file.
_UNOWNED_STALE_S = 60.0


def _try_lock(path: str, flags: int, mode: int = 0o600) -> int | None:
    """`path` opened with `flags` and exclusively ``flock``ed without waiting:
    the descriptor, which holds the lock until closed; None when another open
    file holds it. Only where flock exists (``fcntl`` is not None)."""
    assert fcntl is not None
    fd = os.open(path, flags | os.O_CLOEXEC, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_owner(staging: str) -> int | None:
    """Creates and locks `staging`'s owner file (None where flock does not exist)."""
    if fcntl is None:
        return None
    return _try_lock(os.path.join(staging, _OWNER), os.O_RDWR | os.O_CREAT)


def _abandoned(path: str) -> bool:
    """No live process owns the staging directory `path`."""
    if fcntl is None:
        return False
    try:
        fd = _try_lock(os.path.join(path, _OWNER), os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        try:
            return time.time() - os.lstat(path).st_mtime > _UNOWNED_STALE_S
        except OSError:
            return False
    except OSError:
        return False
    if fd is None:
        return False
    os.close(fd)
    return True


def _lock_dataset(path: str) -> int | None:
    """An exclusive lock on the dataset directory `path` for one append or
    overwrite (None where flock does not exist): two at once would each
    write a manifest without the other's parts."""
    if fcntl is None:
        return None
    fd = _try_lock(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    if fd is None:
        raise LockedError(
            f"{path}: another conversion is writing to this dataset; run it after that one",
            path=path,
        )
    return fd


def _sweep_orphan_parts(dest: str, manifest: dict) -> None:
    """Parts in `dest`'s column directories that its manifest does not name:
    an append killed between moving its parts in and writing the manifest.
    (Called under the dataset lock, so no live append is mid-way.)"""
    for col in manifest["columns"].values():
        shards = [sh["path"] for sh in col.get("shards", [])]
        folder = os.path.dirname(shards[0]) if shards else ""
        named = {os.path.basename(p) for p in shards}
        where = os.path.join(dest, folder)
        if not folder or not os.path.isdir(where):
            continue
        for name in os.listdir(where):
            path = os.path.join(where, name)
            if re.fullmatch(r"part-\d+", name) and name not in named and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)


def sweep_stale(parent: str, prefix: str, dest: str) -> list[str]:
    """Removes what killed conversions to `dest` left in `parent`: staging
    directories ``<prefix>loaderx-partial-*`` no live process owns, and
    ``<prefix>loaderx-old-*`` directories once `dest` exists again (an
    interrupted overwrite's old data; while `dest` is missing they are kept).
    Returns the paths removed."""
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(parent, name)
        if not os.path.isdir(path) or os.path.islink(path):
            continue
        partial = name.startswith(prefix + "loaderx-partial-") and _abandoned(path)
        old = name.startswith(prefix + "loaderx-old-") and os.path.isdir(dest)
        if partial or old:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _is_loaderx(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MANIFEST_NAME)) or os.path.isfile(
        os.path.join(path, "meta")
    )


def _add_all_valid_mask(dest: str, manifest: dict, mask: ColumnSpec, folder: str) -> None:
    """An append brought the first nulls of a column: the rows already in
    the dataset get one all-valid mask store, and the manifest the mask
    column (right after its column)."""
    from ._run import write_all_valid

    owner = mask.extra["valid_of"]
    write_all_valid(os.path.join(dest, folder, "part-00000"), manifest["rows"])
    entry = spec_entry(mask, "raw")
    entry["shards"] = [{"path": f"{folder}/part-00000", "rows": manifest["rows"]}]
    columns = {}
    for name, col in manifest["columns"].items():
        columns[name] = col
        if name == owner:
            col["valid"] = mask.name
            columns[mask.name] = entry
    manifest["columns"] = columns


class Destination:
    """One conversion's destination. ``begin()`` → staging directory;
    ``part_path(column, k)``; ``commit(...)`` or ``abort()``."""

    def __init__(self, dest, mode: str, flags: Flags):
        if mode not in ("create", "append", "overwrite"):
            raise ValueError(f"mode must be 'create', 'append' or 'overwrite', got {mode!r}")
        self.dest = os.path.abspath(os.fspath(dest))
        self.flags = flags
        self.existing: dict | None = None
        exists = os.path.lexists(self.dest) and not (
            os.path.isdir(self.dest) and not os.listdir(self.dest)
        )
        if exists and mode == "create":
            hint = "--append or --overwrite" if flags.cli else 'mode="append" or mode="overwrite"'
            raise DestinationExistsError(f"{self.dest} already exists; pass {hint}", path=self.dest)
        if (
            exists
            and mode == "overwrite"
            and not (os.path.isdir(self.dest) and _is_loaderx(self.dest))
        ):
            raise DestinationExistsError(
                f"{self.dest} exists and is not a loaderx dataset or store; "
                "refusing to overwrite it (remove it yourself)",
                path=self.dest,
            )
        if exists and mode == "append":
            self.existing = read_manifest(self.dest)
            if "splits" in self.existing:
                raise ConvertError(f"{self.dest} holds splits; append to one split's directory")
        self.mode = mode if exists else "create"
        self.staging: str | None = None
        self._owner: int | None = None
        self._dest_lock: int | None = None
        self.column_dirs: dict = {}

    def begin(self, specs: list[ColumnSpec]) -> str:
        """Make the staging directory and choose each column's directory; on
        an error nothing is left made or locked."""
        try:
            return self._begin(specs)
        except BaseException:
            self.abort()
            raise

    def _begin(self, specs: list[ColumnSpec]) -> str:
        parent, base = os.path.split(self.dest)
        os.makedirs(parent, exist_ok=True)
        tag = uuid.uuid4().hex[:12]
        if self.mode in ("append", "overwrite"):
            self._dest_lock = _lock_dataset(self.dest)
        if self.mode == "append":
            self.existing = read_manifest(self.dest)  # again: under the lock now
            self._check_append(specs)
            sweep_stale(self.dest, ".", self.dest)
            _sweep_orphan_parts(self.dest, self.existing)
            self.staging = os.path.join(self.dest, f".loaderx-partial-{tag}")
        else:
            sweep_stale(parent, f".{base}.", self.dest)
            self.staging = os.path.join(parent, f".{base}.loaderx-partial-{tag}")
            taken: set = set()
            self.column_dirs = {s.name: safe_name(s.name, taken) for s in specs}
        os.makedirs(self.staging)
        self._owner = _lock_owner(self.staging)
        return self.staging

    def _release(self) -> None:
        """Drops the owner lock (its file goes with the staging directory) and
        the dataset lock."""
        for fd in (self._owner, self._dest_lock):
            if fd is not None:
                os.close(fd)
        self._owner = self._dest_lock = None

    def _staging_dir(self) -> str:
        assert self.staging is not None  # made by begin()
        return self.staging

    def _existing_manifest(self) -> dict:
        assert self.existing is not None  # read by __init__ in mode "append"
        return self.existing

    def _check_append(self, specs: list[ColumnSpec]) -> None:
        cols = self._existing_manifest()["columns"]
        # Validity masks come and go with nulls: only the value columns must match.
        names = [s.name for s in specs if not s.extra.get("valid_of")]
        have_names = [n for n, c in cols.items() if not c.get("valid_of")]
        if names != have_names:
            raise ConvertError(
                f"{self.dest}: appending columns {names} to a dataset "
                f"with columns {have_names}; they must be the same"
            )
        taken = {os.path.dirname(c["shards"][0]["path"]).lower() for c in cols.values()}
        for s in specs:
            if s.extra.get("valid_of") and s.name not in cols:
                self.column_dirs[s.name] = safe_name(s.name, taken)
                continue
            have = cols[s.name]
            cats = s.extra.get("categories")
            if cats is not None and cats[: len(have.get("categories", []))] != have.get(
                "categories"
            ):
                raise IdentityError(
                    f"{self.dest}: column {s.name!r} holds the categories "
                    f"{have.get('categories')}, the new data's start with {cats[:10]}",
                    path=self.dest,
                )
            mine = spec_entry(s, have.get("codec", ""))
            for key in ("kind", "dtype", "item_shape"):
                if have.get(key) != mine[key]:
                    raise IdentityError(
                        f"{self.dest}: column {s.name!r} holds {key}={have.get(key)}, "
                        f"the new data has {key}={mine[key]}",
                        path=self.dest,
                    )
            self.column_dirs[s.name] = os.path.dirname(have["shards"][0]["path"]) or s.name

    def part_path(self, column: str, k: int) -> str:
        return os.path.join(self._staging_dir(), self.column_dirs[column], f"part-{k:05d}")

    def commit(
        self, specs: list[ColumnSpec], codecs: dict, part_rows: list[int], source: dict
    ) -> dict:
        """Publish the parts `0..len(part_rows)` of every column; returns the manifest."""
        if self.mode == "append":
            return self._commit_append(specs, part_rows, source)
        columns = {}
        for s in specs:
            entry = spec_entry(s, codecs[s.name])
            entry["shards"] = [
                {"path": f"{self.column_dirs[s.name]}/part-{k:05d}", "rows": n}
                for k, n in enumerate(part_rows)
            ]
            columns[s.name] = entry
        manifest = self._manifest(columns, sum(part_rows), source)
        write_json(os.path.join(self._staging_dir(), MANIFEST_NAME), manifest)
        os.unlink(os.path.join(self._staging_dir(), _OWNER))  # not part of the dataset
        self._swap_in()
        self._release()
        return manifest

    def _manifest(self, columns: dict, rows: int, source: dict, created: str | None = None) -> dict:
        from .. import __version__

        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        return {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "rows": rows,
            "columns": columns,
            "source": source,
            "created_by": f"loaderx {__version__}",
            "created": created or now,
            "updated": now,
        }

    def _swap_in(self) -> None:
        swap_into(self._staging_dir(), self.dest, replace=self.mode == "overwrite")
        self.staging = None

    def _commit_append(self, specs, part_rows: list[int], source: dict) -> dict:
        manifest = self._existing_manifest()
        for s in specs:
            if s.name not in manifest["columns"]:
                _add_all_valid_mask(self.dest, manifest, s, self.column_dirs[s.name])
            if s.extra.get("categories") is not None:  # appended data may add categories
                manifest["columns"][s.name]["categories"] = s.extra["categories"]
            col_dir = os.path.join(self.dest, self.column_dirs[s.name])
            os.makedirs(col_dir, exist_ok=True)
            taken = [
                int(m.group(1))
                for m in (re.fullmatch(r"part-(\d+)", n) for n in os.listdir(col_dir))
                if m
            ]
            first = max(taken, default=-1) + 1
            for k, n in enumerate(part_rows):
                name = f"part-{first + k:05d}"
                os.rename(self.part_path(s.name, k), os.path.join(col_dir, name))
                manifest["columns"][s.name]["shards"].append(
                    {"path": f"{self.column_dirs[s.name]}/{name}", "rows": n}
                )
        sources = manifest.get("appended", [])
        manifest = self._manifest(
            manifest["columns"],
            manifest["rows"] + sum(part_rows),
            manifest.get("source", {}),
            manifest.get("created"),
        )
        manifest["appended"] = sources + [source]
        write_json(os.path.join(self.dest, MANIFEST_NAME), manifest)
        shutil.rmtree(self._staging_dir(), ignore_errors=True)
        self.staging = None
        self._release()
        return manifest

    def existing_masks(self) -> set:
        """The value columns of an appended-to dataset that have a validity mask."""
        if self.mode != "append":
            return set()
        cols = self._existing_manifest()["columns"]
        return {c["valid_of"] for c in cols.values() if c.get("valid_of")}

    def abort(self) -> None:
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None
        self._release()
