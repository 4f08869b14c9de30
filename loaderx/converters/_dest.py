"""Dataset directories on disk: where shard stores are staged, how a
conversion is committed, and the manifest it commits.

Layout (manifest version 2)::

    DEST/loaderx.json                     the manifest: names the generation
    DEST/gen-000002/<column>/part-NNNNN/  one store per shard
    DEST/gen-000002/<split>/              (a DatasetDict: one dataset per split)

Every path the manifest names lies under its generation directory, and a
reader opens exactly what one manifest names. Nothing a reader trusts
changes until one atomic rename at the end:

* ``create`` builds the whole directory next to DEST (a hidden sibling on
  the same file system) and renames it into place.
* ``overwrite`` builds a new generation inside DEST, renames it to its final
  name, then replaces ``loaderx.json`` (one rename: readers see the old
  dataset or the new one, whole; DEST itself never moves, so it is never
  missing). The old generation is then retired: renamed away once no reader
  is opening it (see `loaderx._locks`) and deleted. A single store at DEST
  is overwritten the same way; its files are removed after the switch.
* ``append`` stages new parts inside DEST, renames them next to the old
  parts, then replaces the manifest. A crash before that leaves parts no
  manifest names, which readers ignore.

Durability: every directory whose names changed is fsynced before the step
that depends on it (the new generation's directories before it is renamed
in, DEST after the rename and after the manifest replace, a new parent
chain as it is made), so after a power loss DEST holds the old dataset or
the new one, and the new one once `convert` returned.

Locks and sweeps (the locks are `loaderx._locks`'): an ``append`` or
``overwrite`` holds DEST's writer lock from ``begin()`` to ``commit()`` /
``abort()``, re-reads the manifest under it, and sweeps DEST's inside: dead
staging directories, generations and trash no manifest names (each retired
under the readers' lock rule), what an interrupted overwrite replaced (its
``.loaderx-retired-*.json`` list), half-written manifests, and parts a killed
append moved in but never named. Every conversion also sweeps DEST's
siblings: staging directories and Ray task directories no live process owns,
and old copies an overwrite of an earlier loaderx moved aside once DEST is
back. Sweeps and removals never follow a symlink (a symlink is removed as a
link) and stay inside the directory they clean; a dataset whose parts are
reached through a symlink is refused.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import stat
import uuid

from .. import _locks
from .._writer import check_destination, is_store_file, refuse_foreign, refuse_written
from .._manifest import (
    GENERATION_RE,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MANIFEST_VERSION,
    check_inside,
    read_manifest,
)
from ..errors import CorruptStoreError, DestinationExistsError, IdentityError
from ._columns import ColumnSpec, ConvertError, Flags

__all__ = ["Destination", "safe_name", "spec_entry", "write_json", "sweep_siblings"]

#: Inside DEST: an append's or overwrite's staging, a generation being
#: deleted, and the list of what an overwrite replaced.
_PARTIAL, _TRASH, _RETIRED = ".loaderx-partial-", ".loaderx-trash-", ".loaderx-retired-"
#: Siblings of DEST (after ``.<name>.``): a create's staging, a Ray write's
#: task outputs, and an old copy moved aside by an earlier loaderx's overwrite.
_SIBLING = re.compile(r"loaderx-(partial|ray|old)-.*")


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


# ----------------------------------------------------------------- file-system steps


def sync_dir(path: str) -> None:
    """Makes the names in directory `path` durable (a no-op on Windows,
    which has no directory fsync)."""
    if os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: str, obj: dict) -> None:
    """Writes `obj` to `path` atomically, its content durable (the caller
    syncs the directory to make the name durable)."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _makedirs(path: str) -> None:
    """`os.makedirs` that makes each new level durable in its parent."""
    parent = os.path.dirname(path)
    if os.path.isdir(path) or parent == path:
        return
    _makedirs(parent)
    try:
        os.mkdir(path)
    except FileExistsError:
        return
    sync_dir(parent)


def _remove(path: str) -> None:
    """Removes `path`: a directory tree without following any symlink in it,
    a symlink as a link (its target untouched), anything else as a file.
    Best effort: what cannot be removed stays for a later sweep."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path, ignore_errors=True)  # never follows links (fd-based on POSIX)
        return
    try:
        os.unlink(path)
    except OSError:
        pass


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


# ----------------------------------------------------------------- sweeps


def sweep_siblings(dest: str) -> list[str]:
    """Removes what killed writers to `dest` left next to it: staging and Ray
    task directories no live process owns, and directories an earlier
    loaderx's overwrite moved aside, once `dest` exists again (while it is
    missing they may be all there is of it). Returns the paths removed."""
    parent, base = os.path.split(dest)
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    prefix = f".{base}."
    for name in names:
        m = _SIBLING.fullmatch(name[len(prefix):]) if name.startswith(prefix) else None
        if m is None:
            continue
        path = os.path.join(parent, name)
        if os.path.islink(path):
            dead = True  # never a directory of ours: removed as a link
        elif m.group(1) == "old":
            dead = os.path.isdir(dest)
        else:
            dead = _locks.abandoned(path)
        if dead:
            _remove(path)
            removed.append(path)
    return removed


def _named(manifest: dict | None) -> set:
    """The top-level entries of DEST that `manifest` uses."""
    if manifest is None:
        return set()
    if "generation" in manifest and manifest.get("version", 1) >= 2:
        return {manifest["generation"]}
    paths = list(manifest.get("splits", {}).values()) + [
        s["path"] for c in manifest.get("columns", {}).values() for s in c["shards"]
    ]
    return {p.split("/")[0] for p in paths}


def _ours(name: str, named: set) -> bool:
    """Whether an overwrite may replace the entry `name` of DEST: the
    manifest, a generation, what the manifest names (`named`, `_named`'s),
    or a store's files (a single store at DEST). Hidden entries are
    loaderx's staging and trash, which the sweeps own (an overwrite leaves
    them)."""
    return name == MANIFEST_NAME or bool(GENERATION_RE.fullmatch(name)) \
        or name in named or is_store_file(name)


def _retire(dest: str, name: str) -> bool:
    """Deletes the entry `name` of DEST that no manifest names any more; a
    generation only once no reader is opening it. False when it stays."""
    path = os.path.join(dest, name)
    if GENERATION_RE.fullmatch(name) and _is_dir(path):
        trash = os.path.join(dest, f"{_TRASH}{uuid.uuid4().hex[:12]}")
        if not _locks.retire(path, trash):
            return False
        path = trash
    _remove(path)
    return True


def _collect(dest: str, retired: str, manifest: dict) -> None:
    """Removes what the overwrite listed in `retired` replaced (unless the
    manifest names it again), then the list."""
    try:
        with open(retired, encoding="utf-8") as f:
            names = json.load(f)["remove"]
    except (OSError, ValueError, KeyError, TypeError):
        names = []  # half written: its overwrite never switched the manifest
    keep = _named(manifest) | {MANIFEST_NAME}
    done = True
    for name in names:
        if isinstance(name, str) and "/" not in name and name not in keep \
                and name not in (".", "..") and not name.startswith("."):
            done = _retire(dest, name) and done
    if done:
        _remove(retired)


def _sweep_inside(dest: str, manifest: dict | None) -> None:
    """Removes the debris of killed writers inside `dest`. Called under the
    dataset's writer lock, so nothing here belongs to a live writer. Without
    a readable manifest (`manifest` None) no generation is removed: any of
    them may hold the only copy of the data."""
    named = _named(manifest)
    for name in sorted(os.listdir(dest)):
        path = os.path.join(dest, name)
        if name.startswith(_RETIRED) and name.endswith(".json"):
            if manifest is not None:
                _collect(dest, path, manifest)
        elif name.startswith((_PARTIAL, _TRASH, _RETIRED, MANIFEST_NAME + ".tmp-")):
            _remove(path)
        elif manifest is not None and GENERATION_RE.fullmatch(name) and name not in named:
            if os.path.islink(path):
                _remove(path)
            else:
                _retire(dest, name)


def _sweep_orphan_parts(dest: str, manifest: dict) -> None:
    """Parts in the column directories that the manifest does not name: an
    append killed between moving its parts in and writing the manifest."""
    for name, col in manifest["columns"].items():
        shards = [sh["path"] for sh in col["shards"]]
        folder = os.path.dirname(shards[0])
        if not folder:
            continue
        where = check_inside(dest, folder, f"column {name!r}")
        named = {os.path.basename(p) for p in shards}
        for part in os.listdir(where):
            if re.fullmatch(r"part-\d+", part) and part not in named:
                _remove(os.path.join(where, part))


def _is_loaderx(path: str) -> bool:
    return os.path.isfile(os.path.join(path, MANIFEST_NAME)) or os.path.isfile(
        os.path.join(path, "meta")
    )


def _next_generation(dest: str | None, manifest: dict | None) -> str:
    """A generation name after every one DEST has or names."""
    names = os.listdir(dest) if dest else []
    if manifest is not None and manifest.get("generation"):
        names.append(manifest["generation"])
    numbers = [int(n[4:]) for n in names if GENERATION_RE.fullmatch(n)]
    return f"gen-{max(numbers, default=0) + 1:06d}"


def _add_all_valid_mask(dest: str, manifest: dict, mask: ColumnSpec, folder: str) -> None:
    """An append brought the first nulls of a column: the rows already in
    the dataset get one all-valid mask store, and the manifest the mask
    column (right after its column)."""
    from ._run import write_all_valid

    owner = mask.extra["valid_of"]
    col_dir = check_inside(dest, folder, f"column {mask.name!r}")
    if os.path.lexists(col_dir):  # left by a killed append: no manifest names it
        _remove(col_dir)
    write_all_valid(os.path.join(col_dir, "part-00000"), manifest["rows"])
    sync_dir(col_dir)
    sync_dir(os.path.dirname(col_dir))
    entry = spec_entry(mask, "raw")
    entry["shards"] = [{"path": f"{folder}/part-00000", "rows": manifest["rows"]}]
    columns = {}
    for name, col in manifest["columns"].items():
        columns[name] = col
        if name == owner:
            col["valid"] = mask.name
            columns[mask.name] = entry
    manifest["columns"] = columns


# ----------------------------------------------------------------- the destination


class Destination:
    """One conversion's destination. ``begin(specs)`` (or ``begin_splits()``)
    → the staging directory; ``part_path(column, k)``; ``commit(...)`` (or
    ``commit_splits(dirs)``) or ``abort()``."""

    def __init__(self, dest, mode: str, flags: Flags):
        self.dest = os.path.abspath(os.fspath(dest))
        self.flags = flags
        self.existing: dict | None = None
        exists = check_destination(self.dest, mode, ours=_is_loaderx,
                                   what="loaderx dataset or store", cli=flags.cli)
        if exists and mode == "append":
            self.existing = read_manifest(self.dest)
            if "splits" in self.existing:
                raise ConvertError(f"{self.dest} holds splits; append to one split's directory")
        self.mode = mode if exists else "create"
        self.staging: str | None = None
        self.generation: str | None = None
        self._owner: int | None = None
        self._dest_lock: int | None = None
        self.column_dirs: dict = {}

    def begin(self, specs: list[ColumnSpec]) -> str:
        """Make the staging directory and choose each column's directory; on
        an error nothing is left made or locked."""
        try:
            self._begin()
            if self.mode == "append":
                self._check_append(specs)
            else:
                os.mkdir(os.path.join(self._staging_dir(), self._generation()))
                taken: set = set()
                self.column_dirs = {
                    s.name: f"{self.generation}/{safe_name(s.name, taken)}" for s in specs
                }
            for folder in self.column_dirs.values():
                os.makedirs(os.path.join(self._staging_dir(), folder))
            return self._staging_dir()
        except BaseException:
            self.abort()
            raise

    def begin_splits(self) -> str:
        """For a DatasetDict: make the staging directory; returns the
        directory that takes one dataset directory per split."""
        if self.mode == "append":
            raise ConvertError("append to one split at a time: convert a Dataset into DEST/<split>")
        try:
            self._begin()
            root = os.path.join(self._staging_dir(), self._generation())
            os.mkdir(root)
            return root
        except BaseException:
            self.abort()
            raise

    def _begin(self) -> None:
        _makedirs(os.path.dirname(self.dest))
        sweep_siblings(self.dest)
        tag = uuid.uuid4().hex[:12]
        current = None
        if self.mode in ("append", "overwrite"):
            self._dest_lock = _locks.lock_dataset(self.dest)
            if self.mode == "append" or os.path.isfile(os.path.join(self.dest, MANIFEST_NAME)):
                current = self._current_manifest()  # again: under the lock now
            if self.mode == "overwrite":
                named = _named(current)
                refuse_foreign(self.dest, sorted(
                    n for n in os.listdir(self.dest)
                    if not n.startswith(".") and not _ours(n, named)), "loaderx dataset")
                refuse_written(self.dest)  # (a single store at DEST)
            _sweep_inside(self.dest, current)
            self.staging = os.path.join(self.dest, f"{_PARTIAL}{tag}")
        else:
            parent, base = os.path.split(self.dest)
            self.staging = os.path.join(parent, f".{base}.loaderx-partial-{tag}")
        self.existing = current
        if self.mode == "append":
            _sweep_orphan_parts(self.dest, self._existing_manifest())
            self.generation = self._existing_manifest().get("generation")
        else:
            self.generation = _next_generation(
                self.dest if self.mode == "overwrite" else None, current)
        os.mkdir(self.staging)
        self._owner = _locks.own(self.staging)

    def _current_manifest(self) -> dict | None:
        """DEST's manifest, checked never to reach its parts through a link.
        An overwrite replaces a damaged one (None) as it replaces the rest."""
        try:
            current = read_manifest(self.dest)
        except CorruptStoreError:
            if self.mode == "append":
                raise
            return None
        for rel in _named(current):
            check_inside(self.dest, rel, "the dataset")  # never write through a link
        return current

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

    def _generation(self) -> str:
        assert self.generation is not None  # chosen by begin() (create, overwrite)
        return self.generation

    def _existing_manifest(self) -> dict:
        assert self.existing is not None  # read by __init__ and begin() in mode "append"
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
        # A new mask column's directory sits next to the others (inside the
        # dataset's generation; at the top of a version 1 dataset).
        generation = self._existing_manifest().get("generation")
        prefix = f"{generation}/" if generation else ""
        taken = {os.path.basename(os.path.dirname(c["shards"][0]["path"])).lower()
                 for c in cols.values()}
        for s in specs:
            if s.extra.get("valid_of") and s.name not in cols:
                self.column_dirs[s.name] = prefix + safe_name(s.name, taken)
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
            return self._commit_append(specs, codecs, part_rows, source)
        columns = {}
        for s in specs:
            entry = spec_entry(s, codecs[s.name])
            entry["shards"] = [
                {"path": f"{self.column_dirs[s.name]}/part-{k:05d}", "rows": n}
                for k, n in enumerate(part_rows)
            ]
            columns[s.name] = entry
        manifest = self._manifest(columns, sum(part_rows), source)
        # A column begun but not committed (a validity mask no row needed)
        # leaves no directory behind.
        for name, folder in self.column_dirs.items():
            path = os.path.join(self._staging_dir(), folder)
            if name not in columns and os.path.lexists(path):
                _remove(path)
        self._publish(manifest, [self.column_dirs[name] for name in columns])
        return manifest

    def commit_splits(self, dirs: dict) -> dict:
        """Publish the split datasets made under ``begin_splits()``'s
        directory (`dirs`: split name -> its directory name there)."""
        gen = self._generation()
        manifest = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "generation": gen,
            "splits": {name: f"{gen}/{d}" for name, d in dirs.items()},
        }
        self._publish(manifest, [])
        return manifest

    def _manifest(self, columns: dict, rows: int, source: dict, created: str | None = None) -> dict:
        from .. import __version__

        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        manifest = {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "rows": rows,
            "columns": columns,
            "source": source,
            "created_by": f"loaderx {__version__}",
            "created": created or now,
            "updated": now,
        }
        if self.generation is not None:
            manifest["generation"] = self.generation
        else:  # an append to a version 1 dataset keeps its layout
            manifest["version"] = 1
        return manifest

    def _publish(self, manifest: dict, folders: list[str]) -> None:
        """Makes the staged generation durable, then the one rename that
        publishes it: the staging directory to DEST (create), or the new
        manifest over the old (overwrite)."""
        staging, gen = self._staging_dir(), self._generation()
        for folder in folders:
            sync_dir(os.path.join(staging, folder))
        sync_dir(os.path.join(staging, gen))
        os.unlink(os.path.join(staging, _locks.OWNER))  # not part of the dataset
        if self.mode == "create":
            write_json(os.path.join(staging, MANIFEST_NAME), manifest)
            sync_dir(staging)
            self._rename_into_place(staging)
            sync_dir(os.path.dirname(self.dest))
        else:
            self._switch(manifest)
        self.staging = None
        self._release()

    def _rename_into_place(self, staging: str) -> None:
        if os.path.lexists(self.dest) and not (_is_dir(self.dest) and not os.listdir(self.dest)):
            raise DestinationExistsError(
                f"{self.dest} appeared while this conversion ran; nothing was replaced",
                path=self.dest)
        try:
            os.rename(staging, self.dest)  # replaces an empty directory too
        except OSError as e:
            if os.path.lexists(self.dest):
                raise DestinationExistsError(
                    f"{self.dest} appeared while this conversion ran; nothing was replaced",
                    path=self.dest) from e
            raise

    def _switch(self, manifest: dict) -> None:
        """Overwrite: the new generation renamed into DEST, the list of what
        it replaces written, the manifest replaced (the switch), then the
        replaced entries removed."""
        staging, gen, dest = self._staging_dir(), self._generation(), self.dest
        os.rename(os.path.join(staging, gen), os.path.join(dest, gen))
        sync_dir(dest)
        # What the old dataset was goes: its generation or version 1
        # columns, or the files of a store (begin() refused anything else).
        named = _named(self.existing)
        old = sorted(n for n in os.listdir(dest) if n not in (gen, MANIFEST_NAME)
                     and not n.startswith((".", MANIFEST_NAME + ".tmp-")) and _ours(n, named))
        retired = os.path.join(dest, f"{_RETIRED}{uuid.uuid4().hex[:12]}.json")
        write_json(retired, {"remove": old})
        write_json(os.path.join(dest, MANIFEST_NAME), manifest)
        sync_dir(dest)  # the switch is durable before anything it replaced is removed
        _remove(staging)
        _collect(dest, retired, manifest)

    def _commit_append(self, specs, codecs: dict, part_rows: list[int], source: dict) -> dict:
        manifest = self._existing_manifest()
        for s in specs:
            if s.name not in manifest["columns"]:  # a mask an append brought
                _add_all_valid_mask(self.dest, manifest, s, self.column_dirs[s.name])
            column = manifest["columns"][s.name]
            if s.extra.get("categories") is not None:  # appended data may add categories
                column["categories"] = s.extra["categories"]
            col_dir = check_inside(self.dest, self.column_dirs[s.name], f"column {s.name!r}")
            taken = [
                int(m.group(1))
                for m in (re.fullmatch(r"part-(\d+)", n) for n in os.listdir(col_dir))
                if m
            ]
            first = max(taken, default=-1) + 1
            for k, n in enumerate(part_rows):
                name = f"part-{first + k:05d}"
                os.rename(self.part_path(s.name, k), os.path.join(col_dir, name))
                entry = {"path": f"{self.column_dirs[s.name]}/{name}", "rows": n}
                if codecs[s.name] != column.get("codec"):
                    entry["codec"] = codecs[s.name]
                column["shards"].append(entry)
            sync_dir(col_dir)
        sources = manifest.get("appended", [])
        manifest = self._manifest(
            manifest["columns"],
            manifest["rows"] + sum(part_rows),
            manifest.get("source", {}),
            manifest.get("created"),
        )
        manifest["appended"] = sources + [source]
        write_json(os.path.join(self.dest, MANIFEST_NAME), manifest)
        sync_dir(self.dest)
        _remove(self._staging_dir())
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
            _remove(self.staging)
            self.staging = None
        self._release()
