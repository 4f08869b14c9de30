"""Every file-system step a Python process takes, seen from outside the code
that takes it, and a model of what a power loss leaves of them.

`Steps` patches the os-level calls that change a name or make one durable
(mkdir, open with O_CREAT or a writing mode, rename/replace, unlink, rmdir,
fsync of a file or a directory) and the converters' store creation
(`loaderx.converters._run.open_writer`: the engine makes a store, and the
directory entries it creates, durable itself). It calls `before(event)`
before each one and `after(event)` once it succeeded. It knows nothing of how loaderx lays a dataset out, so the
same recording judges any implementation.

`Tree` replays the events over a snapshot of a directory and rebuilds it as
a power loss would leave it: file contents survive once fsynced; a
directory's entries survive as of its last fsync, plus (with `keep`) a
random prefix of its later changes, chosen independently per directory.
"""

from __future__ import annotations

import builtins
import os
import random
import stat

_WRITE_MODES = set("wxa+")


def _real(path, dir_fd=None) -> str:
    path = os.fsdecode(path)
    if dir_fd is not None and not os.path.isabs(path):
        return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    return os.path.abspath(path)


class Steps:
    """Context manager: calls `before(event)` before every step and
    `after(event)` once it succeeded (see the module docstring). Events:
    ("mkdir", p), ("create", p), ("rename", src, dst), ("unlink", p),
    ("rmdir", p), ("fsync", p, is_dir), ("store", p)."""

    def __init__(self, before=None, after=None):
        self.before = before or (lambda event: None)
        self.after = after or (lambda event: None)
        self.saved: list = []

    def _patch(self, owner, name, wrapper) -> None:
        self.saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, wrapper)

    def __enter__(self):
        from loaderx.converters import _run

        o = {n: getattr(os, n) for n in ("mkdir", "open", "rename", "replace", "unlink",
                                         "remove", "rmdir", "fsync")}
        orig_open = builtins.open
        orig_writer = _run.open_writer
        before, after = self.before, self.after

        def step(event, run):
            before(event)
            result = run()
            after(event)
            return result

        def mkdir(path, mode=0o777, *, dir_fd=None):
            return step(("mkdir", _real(path, dir_fd)),
                        lambda: o["mkdir"](path, mode, dir_fd=dir_fd))

        def os_open(path, flags, mode=0o777, *, dir_fd=None):
            p = _real(path, dir_fd)
            run = lambda: o["open"](path, flags, mode, dir_fd=dir_fd)  # noqa: E731
            if flags & os.O_CREAT and not os.path.lexists(p):
                return step(("create", p), run)
            return run()

        def py_open(file, mode="r", *args, **kw):
            run = lambda: orig_open(file, mode, *args, **kw)  # noqa: E731
            if isinstance(file, (str, bytes, os.PathLike)) and _WRITE_MODES & set(mode):
                p = _real(file)
                if not os.path.lexists(p):
                    return step(("create", p), run)
            return run()

        def renamer(which):
            def rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
                return step(("rename", _real(src, src_dir_fd), _real(dst, dst_dir_fd)),
                            lambda: o[which](src, dst, src_dir_fd=src_dir_fd,
                                             dst_dir_fd=dst_dir_fd))
            return rename

        def remover(which, kind):
            def remove(path, *, dir_fd=None):
                return step((kind, _real(path, dir_fd)), lambda: o[which](path, dir_fd=dir_fd))
            return remove

        def fsync(fd):
            fd_num = fd if isinstance(fd, int) else fd.fileno()
            p = os.readlink(f"/proc/self/fd/{fd_num}")
            return step(("fsync", p, stat.S_ISDIR(os.fstat(fd_num).st_mode)),
                        lambda: o["fsync"](fd))

        def open_writer(path, spec, opts):
            return step(("store", _real(path)), lambda: orig_writer(path, spec, opts))

        self._patch(os, "mkdir", mkdir)
        self._patch(os, "open", os_open)
        self._patch(builtins, "open", py_open)
        self._patch(os, "rename", renamer("rename"))
        self._patch(os, "replace", renamer("replace"))
        self._patch(os, "unlink", remover("unlink", "unlink"))
        self._patch(os, "remove", remover("remove", "unlink"))
        self._patch(os, "rmdir", remover("rmdir", "rmdir"))
        self._patch(os, "fsync", fsync)
        self._patch(_run, "open_writer", open_writer)
        return self

    def __exit__(self, *exc) -> None:
        while self.saved:
            owner, name, value = self.saved.pop()
            setattr(owner, name, value)


# ----------------------------------------------------------------- the model


class File:
    def __init__(self, content: bytes | None = None):
        self.content = content  # what an fsync made durable (None: nothing)


class Dir:
    def __init__(self, entries: dict | None = None, native: str | None = None):
        self.entries = dict(entries or {})  # the live names
        self.durable = dict(self.entries)  # as of the last fsync
        self.history: list[dict] = []  # the names after each later change
        self.native = native  # a store the engine writes: its files come from `stores`

    def changed(self) -> None:
        self.history.append(dict(self.entries))

    def add_durable(self, name: str, node) -> None:
        self.entries[name] = node
        self.durable[name] = node
        for names in self.history:
            names[name] = node


def _scan(path: str):
    """The tree at `path` as plain data: bytes (a file), ("symlink", target)
    or {name: ...} (a directory)."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        return {n: _scan(os.path.join(path, n)) for n in sorted(os.listdir(path))}
    if stat.S_ISLNK(st.st_mode):
        return ("symlink", os.readlink(path))
    with open(path, "rb") as f:
        return f.read()


def _build(data):
    """Durable model nodes for scanned data."""
    if isinstance(data, dict):
        return Dir({n: _build(d) for n, d in data.items()})
    return File(data)


class Tree:
    """A directory as recorded: its snapshot when recording began
    (`initial`, taken as durable), the steps that succeeded under it (`log`),
    and the contents of the stores the engine wrote (`stores`, read before a
    step moved or removed them, or by `finish`)."""

    def __init__(self, root: str, initial=None, stores: dict | None = None):
        self.root_path = os.path.abspath(root)
        self.initial = _scan(self.root_path) if initial is None else initial
        self.root = _build(self.initial)
        self.stores: dict = {} if stores is None else stores
        self.log: list = []

    def _inside(self, path: str) -> list[str] | None:
        rel = os.path.relpath(path, self.root_path)
        if rel == ".":
            return []
        return None if rel.startswith("..") else rel.split(os.sep)

    def _walk(self, parts: list[str]):
        node = self.root
        for p in parts:
            self._fill(node)
            node = node.entries[p]
        return node

    def _fill(self, node) -> None:
        """A store the engine wrote: its files, durable (read from disk the
        first time, while it still lies where it was created)."""
        if isinstance(node, Dir) and node.native is not None:
            where, node.native = node.native, None
            if where not in self.stores:
                self.stores[where] = _scan(where)
            for name, data in self.stores[where].items():
                node.add_durable(name, _build(data))

    def _fill_all(self, node) -> None:
        self._fill(node)
        if isinstance(node, Dir):
            for child in node.entries.values():
                self._fill_all(child)

    def _parts(self, event) -> list | None:
        parts = [self._inside(p) for p in event[1:] if isinstance(p, str)]
        if any(p is None or (p == [] and event[0] != "fsync") for p in parts):
            return None  # outside the recorded directory
        return parts

    def before(self, event) -> None:
        """Reads, before a step changes them, the stores the engine wrote
        that the step moves or removes."""
        parts = self._parts(event)
        if parts is None or event[0] not in ("unlink", "rmdir", "rename"):
            return
        parent = self._walk(parts[0][:-1])
        self._fill(parent)
        self._fill_all(parent.entries[parts[0][-1]])
        if event[0] == "rename":
            target = self._walk(parts[1][:-1])
            self._fill(target)
            if parts[1][-1] in target.entries:
                self._fill_all(target.entries[parts[1][-1]])

    def after(self, event) -> None:
        """Applies one step that succeeded, and logs it."""
        parts = self._parts(event)
        if parts is None:
            return
        self.log.append(event)
        kind = event[0]
        if kind == "store":
            self._store(parts[0], event[1])
        elif kind == "fsync":
            self._fsync(parts[0], event)
        else:
            self._rename(kind, parts)

    def _fsync(self, parts: list[str], event) -> None:
        node = self._walk(parts)
        if event[2]:
            self._fill(node)
            node.durable = dict(node.entries)
            node.history = []
            return
        key = ("file", event[1], len(self.log))
        if key not in self.stores:
            with open(event[1], "rb") as f:
                self.stores[key] = f.read()
        node.content = self.stores[key]

    def _rename(self, kind: str, parts: list) -> None:
        parent = self._walk(parts[0][:-1])
        self._fill(parent)
        name = parts[0][-1]
        if kind == "mkdir":
            parent.entries[name] = Dir()
        elif kind == "create":
            parent.entries[name] = File()
        elif kind in ("unlink", "rmdir"):
            del parent.entries[name]
        elif kind == "rename":
            node = parent.entries.pop(name)
            target = self._walk(parts[1][:-1])
            target.entries[parts[1][-1]] = node
            if target is not parent:
                target.changed()
        parent.changed()

    def _store(self, parts: list[str], path: str) -> None:
        node = self.root
        for p in parts[:-1]:
            self._fill(node)
            if p not in node.entries:  # the engine's mkdirs: each level fsynced in its parent
                node.add_durable(p, Dir())
            node = node.entries[p]
        node.add_durable(parts[-1], Dir(native=path))

    def finish(self) -> None:
        """Reads every store the engine wrote that is still where it was
        made (call once the recorded run is over)."""
        self._fill_all(self.root)

    def at(self, k: int) -> "Tree":
        """The tree after the first `k` logged steps (call after `finish`)."""
        t = Tree(self.root_path, self.initial, self.stores)
        for event in self.log[:k]:
            t.after(event)
        return t

    def lose_power(self, target: str, rng: random.Random, keep: bool) -> None:
        """Writes the tree as a power loss now would leave it, at `target`."""

        def write(node, path):
            if isinstance(node, File):
                data = node.content or b""
                if isinstance(data, tuple):
                    os.symlink(data[1], path)
                    return
                with open(path, "wb") as f:
                    f.write(data)
                return
            self._fill(node)
            os.mkdir(path)
            names = node.durable
            if keep and node.history:
                k = rng.randrange(len(node.history) + 1)
                names = node.history[k - 1] if k else node.durable
            for name, child in names.items():
                write(child, os.path.join(path, name))

        write(self.root, target)
