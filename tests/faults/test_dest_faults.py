"""Dataset directories under faults: a conversion killed (SIGKILL) before each
of its file-system steps in turn, and a power loss simulated at each of them.

The steps are seen from outside loaderx (tests/_fsrecord.py patches the
os-level calls), so the tests judge what any implementation does, not a
list of steps it declares. What must hold, for `mode="overwrite"`,
`"append"` and `"create"`:

* killed at any step: the dataset opens and holds the old data or the new,
  whole; the next conversion to it cleans up what the killed one left and
  never removes the only complete copy;
* power lost at any step (only what was fsynced survives, plus per directory
  a random prefix of later name changes): the same, and once `convert`
  returned, the new data survives.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import sys
import traceback

import numpy as np
import pytest
from _fsrecord import Steps, Tree

import loaderx

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="kills and the step recorder need Linux"
)


def data(value: int, rows: int = 5) -> dict:
    return {
        "x": np.arange(rows * 3, dtype=np.int64).reshape(rows, 3) + 1000 * value,
        "y": np.full(rows, value, np.int32),
    }


def rows_of(d: dict) -> list:
    return [(x.tolist(), int(y)) for x, y in zip(d["x"], d["y"])]


def read(path) -> list:
    """The dataset's rows as (x, y) pairs."""
    cols = loaderx.open_dataset(path)
    try:
        xs = cols["x"][np.arange(len(cols["x"]))]
        ys = cols["y"][np.arange(len(cols["y"]))]
        assert len(xs) == len(ys)
        return [(x.tolist(), int(y)) for x, y in zip(xs, ys)]
    finally:
        for c in cols.values():
            c.close()


def convert(source, dest, mode: str) -> None:
    for col in loaderx.convert(source, dest, mode=mode, progress=False).values():
        col.close()


def states(mode: str) -> tuple[list, list]:
    """(old, new) rows of the dataset around the conversion under test."""
    old = rows_of(data(1)) if mode != "create" else None
    new = rows_of(data(2))
    if mode == "append":
        new = old + new
    return old, new


def prepare(parent, mode: str) -> str:
    os.makedirs(parent)
    dest = os.path.join(parent, "out")
    if mode != "create":
        convert(data(1), dest, "create")
    return dest


def named_entries(path) -> set:
    """The top-level names of a dataset directory its manifest uses."""
    import json

    with open(os.path.join(path, "loaderx.json")) as f:
        m = json.load(f)
    return {s["path"].split("/")[0] for c in m["columns"].values() for s in c["shards"]}


def check_recovery(dest: str, mode: str, got: list | None) -> None:
    """The next conversion to `dest` sees the same dataset, cleans up after
    the dead one, and adds to it."""
    extra = rows_of(data(7, rows=2))
    if got is None:  # a create that never finished: the next create works
        convert(data(7, rows=2), dest, "create")
        assert read(dest) == extra
    else:
        convert(data(7, rows=2), dest, "append")
        assert read(dest) == got + extra
    assert set(os.listdir(dest)) == named_entries(dest) | {"loaderx.json"}
    parent = os.path.dirname(dest)
    # A staging directory with no owner file may be a live converter's that
    # has not locked it yet: kept for a minute (the sweep's rule).
    debris = [n for n in os.listdir(parent) if n != "out" and not (
        n.startswith(".out.loaderx-partial-")
        and not os.path.exists(os.path.join(parent, n, ".loaderx-owner")))]
    assert debris == [], "the next conversion left or kept debris"


def run_killed(dest: str, mode: str, kill_at: int) -> bool:
    """Runs the conversion in a forked child that SIGKILLs itself before its
    `kill_at`-th step; True when it was killed (False: it finished first)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            count = 0

            def before(event):
                nonlocal count
                count += 1
                if count == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)

            with Steps(before=before):
                convert(data(2), dest, mode)
            code = 0
        except BaseException:  # noqa: BLE001 - reported by the exit code
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.waitstatus_to_exitcode(status) == 0, "the conversion failed on its own"
    return False


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
@pytest.mark.parametrize("mode", ["overwrite", "append", "create"])
def test_a_conversion_killed_at_any_step_leaves_old_or_new(tmp_path, mode):
    """Before the fix a kill between the overwrite's two renames left no
    dataset (StoreNotFoundError), and the next conversion swept away both
    copies (the old one aside, the new one in staging)."""
    old, new = states(mode)
    base = prepare(str(tmp_path / "base"), mode)
    step = 0
    while True:
        step += 1
        parent = str(tmp_path / f"k{step}")
        shutil.copytree(os.path.dirname(base), parent, symlinks=True)
        dest = os.path.join(parent, "out")
        killed = run_killed(dest, mode, step)
        got = None if mode == "create" and not os.path.exists(dest) else read(dest)
        assert got in (old, new) or (got is None and mode == "create"), f"killed at step {step}"
        if not killed:
            assert got == new
        check_recovery(dest, mode, got)
        shutil.rmtree(parent)
        if not killed:
            break
    assert step > 5, "the recorder saw too few steps"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["overwrite", "append", "create"])
def test_a_power_loss_at_any_step_keeps_old_or_new(tmp_path, mode):
    """Before the fix nothing fsynced a dataset's directories: after a power
    loss the new manifest could name parts whose names were lost, or a
    finished conversion could be gone."""
    old, new = states(mode)
    parent = str(tmp_path / "p")
    dest = prepare(parent, mode)
    tree = Tree(parent)
    with Steps(before=tree.before, after=tree.after):
        convert(data(2), dest, mode)
    tree.finish()
    rng = random.Random(21)
    for cut in range(len(tree.log) + 1):
        at = tree.at(cut)
        for variant in range(3):  # only what was fsynced, then two random keeps
            target = str(tmp_path / f"loss{cut}-{variant}")
            at.lose_power(target, rng, keep=variant > 0)
            lost = os.path.join(target, "out")
            gone = mode == "create" and not os.path.exists(os.path.join(lost, "loaderx.json"))
            got = None if gone else read(lost)
            where = f"power lost after step {cut}/{len(tree.log)} ({variant})"
            assert got in (old, new) or got is None, where
            if cut == len(tree.log):
                assert got == new, f"{where}: convert returned, yet its data is gone"
            if variant == 0:
                if gone:
                    shutil.rmtree(lost, ignore_errors=True)
                check_recovery(lost, mode, got)
            shutil.rmtree(target)
    assert len(tree.log) > 5, "the recorder saw too few steps"
