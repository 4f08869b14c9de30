"""Helpers shared by the Python test modules."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import numpy as np

#: The folder of the shared test modules (tests/), and the repository root.
TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def assert_same(got, expected) -> None:
    """Byte-exact equality with the same dtype and shape (works for structured
    dtypes, bools and -0.0 alike)."""
    got = np.asarray(got)
    expected = np.asarray(expected)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    if got.tobytes() != expected.tobytes():
        np.testing.assert_array_equal(got, expected)
        raise AssertionError(f"bytes differ:\n{got!r}\n!=\n{expected!r}")


def swap_last_order(n: int, positions) -> list[int]:
    """The original loaderx delete rule, one record at a time, written
    independently of the engine: in descending order, each deleted position
    receives the current last record, then the last position goes. Returns
    the new order as old positions."""
    order = list(range(n))
    for d in sorted(set(int(p) for p in positions), reverse=True):
        order[d] = order[-1]
        order.pop()
    return order


def expected_moves(order: list[int]) -> list[list[int]]:
    """The (from, to) pairs `delete` reports for a new `order`: every record
    now at a position other than its old one, ascending by `to`."""
    return [[old, new] for new, old in enumerate(order) if old != new]


def assert_generated_current(step: str, printed: str, committed: str, tmp_path) -> None:
    """`zig build <step>` writes generated file `printed` under a fresh
    prefix; the committed file (path from the repository root) must be the
    same text, else it is stale (regenerate it with the step without -print)."""
    cmd = [sys.executable, "-m", "ziglang", "build", step, "--prefix", str(tmp_path)]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    fresh = (tmp_path / printed).read_text()
    with open(os.path.join(ROOT, committed)) as f:
        assert fresh == f.read(), f"{committed} is stale: run `python -m ziglang build " \
            f"{step.removesuffix('-print')}`"


def c_abi_exports() -> list[str]:
    """The `pub export fn lx_*` names of the C ABI, as its sources declare
    them: src/capi.zig (the root) and its area files, src/capi/*.zig."""
    paths = [os.path.join(ROOT, "src", "capi.zig")]
    paths += sorted(glob.glob(os.path.join(ROOT, "src", "capi", "*.zig")))
    names = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            names += re.findall(r"^pub export fn (lx_\w+)\(", f.read(), re.M)
    return names


def loader_threads():
    """The threads loaderx's loaders run (``loaderx-worker-N``,
    ``loaderx-prefetch``, ...): a closed DataLoader leaves none. The
    process-wide network threads of remote stores (``loaderx-net*``) stay,
    like an HTTP client's pool, and are not counted."""
    import threading

    return [t for t in threading.enumerate()
            if t.name.startswith("loaderx-") and not t.name.startswith("loaderx-net")]


#: How long `within` waits before it calls a call a hang.
WAIT_S = 10.0


def within(fn, seconds=WAIT_S):
    """fn() on a daemon thread: its result, or its exception re-raised; fails
    (instead of hanging the suite) when it does not return in time."""
    import threading

    outcome: dict = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: B036 - re-raised on the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{fn} did not return within {seconds} s (a hang)"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def counting_store(tmp_path, count: int = 200):
    """Yields a dense store whose record i is i (int64), `count` records, and
    closes it afterwards (the body of the loader tests' `store` fixtures)."""
    from loaderx import DenseStore

    with DenseStore(tmp_path / "x", np.int64, ()) as ds:
        ds.append(np.arange(count, dtype=np.int64))
        yield ds


def run_cli(*args, cwd=None, env=None, timeout: float = 300):
    """``python -m loaderx ARGS`` as a user runs it: a fresh process with the
    repository on PYTHONPATH (`env` adds to the environment); returns the
    CompletedProcess, its output as text (the conftest's `cli` fixture)."""
    full = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    return subprocess.run([sys.executable, "-m", "loaderx", *map(str, args)],
                          capture_output=True, text=True, env=full, cwd=cwd, timeout=timeout)


def convert_quiet(src, dest, **kw):
    """`loaderx.convert` without its progress bar (what the converter tests
    call: the bar is tested on its own)."""
    import loaderx

    return loaderx.convert(src, dest, progress="off", **kw)


# ---------------------------------------------------------------- every public path-taking callable

#: Parameters that name a place to read or write.
PATH_PARAMS = ("path", "paths", "shards", "dataset", "source", "dest", "src", "dst", "store",
               "sources", "streams")


#: The public modules whose path-taking callables the walk finds by themselves.
PUBLIC_MODULES = ("loaderx", "loaderx.dataset", "loaderx.zrecord", "loaderx.legacy",
                  "loaderx.subset", "loaderx.converters", "loaderx.shardset", "loaderx.tokens",
                  "loaderx.mixture", "loaderx.dataloader", "loaderx.utils", "loaderx.converter",
                  "loaderx.ray")


def path_callables() -> set:
    """``{(callable, parameter)}`` of every public callable (a class: its
    constructor, ``create`` and ``open``) with a parameter in PATH_PARAMS."""
    import importlib
    import inspect

    found = set()
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if isinstance(obj, type) and issubclass(obj, BaseException) or not callable(obj):
                continue
            targets = [(obj, obj)]
            if isinstance(obj, type):
                targets = [(obj, obj.__init__)] + [(getattr(obj, m), getattr(obj, m))
                                                   for m in ("create", "open") if m in vars(obj)]
            for key, fn in targets:
                try:
                    params = inspect.signature(fn).parameters
                except (TypeError, ValueError):
                    continue
                found |= {(callable_name(key), p) for p in params if p in PATH_PARAMS}
    return found


def callable_name(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"
