"""Dataset directories as conversions write them (`loaderx/converters/_dest.py`)
and as other processes read them meanwhile: an overwrite is atomic for
readers, sweeps and removals stay inside the dataset and never follow a
symlink, and the debris of killed writers (staging directories, Ray task
directories) is swept by the next conversion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from _helpers import ROOT, convert_quiet

import loaderx
from loaderx.errors import ZrecordError

needs_flock = pytest.mark.skipif(sys.platform == "win32", reason="flock is POSIX")


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))


def _manifest(path) -> dict:
    with open(os.path.join(path, "loaderx.json")) as f:
        return json.load(f)


def _column_dir(path, column: str) -> str:
    """The directory holding a column's parts (from the manifest)."""
    first = _manifest(path)["columns"][column]["shards"][0]["path"]
    return os.path.join(path, os.path.dirname(first))


# ----------------------------------------------------------------- overwrite vs readers

_WRITER = """
import os, sys, time
import numpy as np
import loaderx
dest, flags, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
while not all(os.path.exists(os.path.join(flags, f"ready-{k}")) for k in range(2)):
    time.sleep(0.01)  # both readers are reading
for g in range(2, count + 2):
    cols = loaderx.convert({"x": np.full((40, 4), g, np.int64), "y": np.full(40, g, np.int64)},
                           dest, mode="overwrite", progress=False)
    for c in cols.values():
        c.close()
open(os.path.join(flags, "done"), "w").close()
"""

_READER = """
import collections, json, os, sys
import numpy as np
import loaderx
dest, flags, me = sys.argv[1], sys.argv[2], sys.argv[3]
counts = collections.Counter()
while not os.path.exists(os.path.join(flags, "done")):
    try:
        cols = loaderx.open_dataset(dest)
    except Exception as e:
        counts[f"error {type(e).__name__}: {str(e)[:120]}"] += 1
        continue
    try:
        x, y = cols["x"][np.arange(40)], cols["y"][np.arange(40)]
        values = set(np.unique(x).tolist()) | set(np.unique(y).tolist())
        counts["ok" if len(values) == 1 else "mixed"] += 1
    except Exception as e:
        counts[f"error while reading {type(e).__name__}: {str(e)[:120]}"] += 1
    finally:
        for c in cols.values():
            c.close()
    open(os.path.join(flags, f"ready-{me}"), "w").close()
print(json.dumps(counts))
"""


@pytest.mark.slow
@needs_flock
def test_readers_see_the_old_dataset_or_the_new_one_during_overwrites(tmp_path):
    """Before the fix, readers opening a dataset while another process
    overwrote it got columns from two generations (no error), a missing
    dataset (StoreNotFoundError between the swap's two renames), raw
    FileNotFoundErrors and CorruptStoreErrors saying the dataset had changed."""
    dest, flags = str(tmp_path / "ds"), str(tmp_path / "flags")
    os.mkdir(flags)
    first = {"x": np.full((40, 4), 1, np.int64), "y": np.full(40, 1, np.int64)}
    for c in loaderx.convert(first, dest, progress=False).values():
        c.close()
    overwrites = 60
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, dest, flags, str(overwrites)],
                              env=_env())
    readers = [subprocess.Popen([sys.executable, "-c", _READER, dest, flags, str(k)],
                                stdout=subprocess.PIPE, text=True, env=_env())
               for k in range(2)]
    assert writer.wait(timeout=600) == 0
    counts: dict = {}
    for r in readers:
        for k, v in json.loads(r.communicate(timeout=600)[0]).items():
            counts[k] = counts.get(k, 0) + v
    print(f"\n{overwrites} overwrites; opens by outcome: {counts}")
    assert all(r.returncode == 0 for r in readers)
    assert set(counts) == {"ok"}, counts
    assert counts["ok"] >= overwrites, "the readers hardly overlapped the overwrites"
    np.testing.assert_array_equal(loaderx.open_dataset(dest)["y"][[0]], [overwrites + 1])


# ----------------------------------------------------------------- symlinks


@needs_flock
def test_an_append_never_deletes_through_a_symlinked_column_directory(tmp_path):
    """Before the fix the sweep for parts a killed append left behind
    followed a column directory that was a symlink and deleted `part-00007`
    in a directory outside the dataset."""
    dest = tmp_path / "ds"
    loaderx.convert({"x": np.arange(6).reshape(3, 2)}, dest, progress=False)["x"].close()
    column = _column_dir(dest, "x")
    outside = tmp_path / "elsewhere"
    os.rename(column, outside)  # the parts now live outside, reached through a link
    os.symlink(outside, column)
    (outside / "part-00007").mkdir()
    (outside / "part-00007" / "precious").write_text("keep me")
    with pytest.raises(ZrecordError, match="symlink"):
        loaderx.convert({"x": np.arange(4).reshape(2, 2)}, dest, mode="append", progress=False)
    assert (outside / "part-00007" / "precious").read_text() == "keep me"
    assert sorted(os.listdir(outside)) == ["part-00000", "part-00007"]


@needs_flock
def test_sweeps_never_follow_symlinks_out_of_the_dataset(tmp_path):
    """Debris names planted as symlinks (a staging directory, an old
    generation, a Ray task directory) are removed as links; their targets
    are never entered."""
    dest = tmp_path / "ds"
    loaderx.convert({"x": np.arange(6).reshape(3, 2)}, dest, progress=False)["x"].close()
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "part-00000").mkdir()
    (victim / "data").write_text("keep me")
    planted = [dest / ".loaderx-partial-abc", dest / "gen-000099", dest / ".loaderx-trash-abc",
               tmp_path / ".ds.loaderx-partial-abc", tmp_path / ".ds.loaderx-ray-abc"]
    for link in planted:
        os.symlink(victim, link)
    loaderx.convert({"x": np.arange(4).reshape(2, 2)}, dest, mode="append", progress=False)
    loaderx.convert({"x": np.arange(4).reshape(2, 2)}, dest, mode="overwrite", progress=False)
    assert sorted(os.listdir(victim)) == ["data", "part-00000"]
    assert (victim / "data").read_text() == "keep me"
    np.testing.assert_array_equal(loaderx.open_dataset(dest)["x"][[1]], [[2, 3]])


# ----------------------------------------------------------------- debris of killed writers


@needs_flock
def test_ray_task_directories_of_a_killed_driver_are_swept(tmp_path):
    """Before the fix the `.{name}.loaderx-ray-*` directories of a Ray write
    whose driver was killed were never removed. They follow the staging
    rule: removed once no live process owns them."""
    dest = tmp_path / "ds"
    dead = tmp_path / ".ds.loaderx-ray-dead"
    (dead / "000001-abc" / "c0").mkdir(parents=True)
    (dead / "000001-abc" / "c0" / "data").write_bytes(b"x" * 100)
    os.utime(dead, (time.time() - 3600, time.time() - 3600))  # no owner file, and old
    loaderx.convert({"x": np.arange(4).reshape(2, 2)}, dest, progress=False)["x"].close()
    assert not dead.exists()

    from loaderx._locks import own

    killed = tmp_path / ".ds.loaderx-ray-killed"
    subprocess.run([sys.executable, "-c",
                    "import os, sys\n"
                    "from loaderx._locks import own\n"
                    "os.makedirs(sys.argv[1]); own(sys.argv[1])\n"
                    "os._exit(9)\n", str(killed)], env=_env(), check=False)
    assert killed.is_dir()
    live = tmp_path / ".ds.loaderx-ray-live"
    live.mkdir()
    owner = own(str(live))  # a Ray write still running in this process
    try:
        loaderx.convert({"x": np.arange(4).reshape(2, 2)}, dest, mode="overwrite",
                        progress=False)["x"].close()
        assert not killed.exists()
        assert live.is_dir()
    finally:
        os.close(owner)


def test_a_killed_conversion_s_leftovers_are_swept_by_the_next_one(tmp_path):
    """A convert killed outright left its staging directory (a full copy of
    the data) behind, and each retry left another. The next conversion to the
    same destination removes staging directories no live process owns, keeps
    those a live one does, and removes an interrupted overwrite's old copy
    only once the destination is back."""
    import subprocess
    import sys
    import time

    from loaderx.converters._dest import Destination

    np.save(tmp_path / "x.npy", np.arange(12).reshape(4, 3))
    child = (
        "import os, sys\n"
        "from loaderx.converters import _dest, _columns\n"
        "d = _dest.Destination(sys.argv[1], 'create', _columns.Flags())\n"
        "d.begin([])\n"
        "open(os.path.join(d.staging, 'data'), 'w').write('x' * 1000)\n"
        "os._exit(9)  # killed: no abort, no cleanup\n"
    )
    for _ in range(2):  # the second run already sweeps the first one's
        subprocess.run([sys.executable, "-c", child, str(tmp_path / "out")], check=False)
    killed = [n for n in os.listdir(tmp_path) if "loaderx-partial" in n]
    assert len(killed) == 1
    convert_quiet(tmp_path / "x.npy", tmp_path / "other")  # another destination: touches nothing
    assert (tmp_path / killed[0]).is_dir()
    fresh = tmp_path / ".out.loaderx-partial-fresh"  # unowned, just made: kept
    stale = tmp_path / ".out.loaderx-partial-stale"  # unowned, old: removed
    fresh.mkdir()
    stale.mkdir()
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    old = tmp_path / ".out.loaderx-old-abc"  # an overwrite's old copy
    old.mkdir()
    live = Destination(tmp_path / "out", "create", loaderx.converters._columns.Flags())
    live.begin([])  # a conversion still running in this process; it swept already
    assert not (tmp_path / killed[0]).exists() and not stale.exists()
    convert_quiet(tmp_path / "x.npy", tmp_path / "out")
    left = sorted(n for n in os.listdir(tmp_path) if n.startswith(".out."))
    assert left == sorted([os.path.basename(live.staging), fresh.name, old.name])
    # (out was missing: the old copy may be all there is of it, so it stayed)
    convert_quiet(tmp_path / "x.npy", tmp_path / "out", mode="overwrite")
    assert not old.exists()
    live.abort()
    assert loaderx.open_dataset(tmp_path / "out")["x"][[3]].tolist() == [[9, 10, 11]]


def test_conversions_into_one_dataset_never_lose_each_other_s_rows(tmp_path):
    """Two appends at once each wrote a manifest without the other's parts
    (the later one silently dropped the earlier one's rows), and a create
    finishing after another create of the same path replaced it. An append or
    overwrite now holds the dataset's lock (a second one gets LockedError), a
    create never replaces what appeared meanwhile, and parts a killed append
    moved in without a manifest entry are removed by the next append."""
    from loaderx.converters._columns import Flags
    from loaderx._locks import lock_dataset
    from loaderx.converters._dest import Destination
    from loaderx.dataset import DestinationExistsError
    from loaderx.errors import LockedError

    x = np.arange(12).reshape(4, 3)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    convert_quiet(tmp_path / "x.npy", out)
    held = lock_dataset(str(out))  # an append or overwrite still running
    for mode in ("append", "overwrite"):
        with pytest.raises(LockedError, match="another conversion is writing to this dataset"):
            convert_quiet(tmp_path / "x.npy", out, mode=mode)
    os.close(held)
    orphan = out / "gen-000001" / "x" / "part-00007"  # an append killed before its manifest
    orphan.mkdir()
    (orphan / "data").write_bytes(b"x" * 100)
    convert_quiet(tmp_path / "x.npy", out, mode="append")
    assert not orphan.exists()
    assert sorted(os.listdir(out / "gen-000001" / "x")) == ["part-00000", "part-00001"]
    assert loaderx.open_dataset(out)["x"][np.arange(8)].tolist() == x.tolist() * 2
    late = Destination(tmp_path / "new", "create", Flags())
    late.begin([])  # a create that started before the one below finished
    convert_quiet(tmp_path / "x.npy", tmp_path / "new")
    with pytest.raises(DestinationExistsError, match="appeared while this conversion ran"):
        late.commit([], {}, [], {})
    late.abort()
    assert loaderx.open_dataset(tmp_path / "new")["x"][np.arange(4)].tolist() == x.tolist()


# ----------------------------------------------------------------- layouts an overwrite replaces


def _v1_dataset(dest, values) -> None:
    """A dataset in the version 1 layout (parts straight under the directory)."""
    from loaderx import DenseStore

    with DenseStore(os.path.join(dest, "x", "part-00000"), np.int64, (2,)) as s:
        s.append(values)
    manifest = {"format": "loaderx-dataset", "version": 1, "rows": len(values),
                "columns": {"x": {"kind": "dense", "dtype": "int64", "item_shape": [2],
                                  "codec": "zstd",
                                  "shards": [{"path": "x/part-00000", "rows": len(values)}]}}}
    with open(os.path.join(dest, "loaderx.json"), "w") as f:
        json.dump(manifest, f)


@needs_flock
def test_appends_keep_a_version_1_layout_and_overwrites_replace_any_layout(tmp_path):
    from loaderx import DenseStore

    new = np.arange(6).reshape(3, 2)
    v1 = tmp_path / "v1"
    _v1_dataset(v1, np.full((2, 2), 9))
    loaderx.convert({"x": new}, v1, mode="append", progress=False)["x"].close()
    m = _manifest(v1)
    assert m["version"] == 1 and [s["path"] for s in m["columns"]["x"]["shards"]] == [
        "x/part-00000", "x/part-00001"]
    assert loaderx.open_dataset(v1)["x"][np.arange(5)].tolist() == [[9, 9]] * 2 + new.tolist()
    loaderx.convert({"x": new}, v1, mode="overwrite", progress=False)["x"].close()
    store = tmp_path / "store"
    with DenseStore(store, np.int64, (2,)) as s:
        s.append(np.zeros((4, 2), np.int64))
    loaderx.convert({"x": new}, store, mode="overwrite", progress=False)["x"].close()
    damaged = tmp_path / "damaged"
    loaderx.convert({"x": np.zeros((2, 2))}, damaged, progress=False)["x"].close()
    (damaged / "loaderx.json").write_text("{not json")
    loaderx.convert({"x": new}, damaged, mode="overwrite", progress=False)["x"].close()
    for dest in (v1, store, damaged):
        assert sorted(os.listdir(dest)) == [_manifest(dest)["generation"], "loaderx.json"], dest
        assert loaderx.open_dataset(dest)["x"][np.arange(3)].tolist() == new.tolist()


@needs_flock
def test_an_overwrite_leaves_a_generation_readers_are_opening_to_the_next_sweep(tmp_path):
    """A generation is removed only once no reader holds its lock; one that
    readers were opening stays until the next conversion, and never breaks
    the switch."""
    from loaderx import _locks

    dest = tmp_path / "ds"
    loaderx.convert({"x": np.zeros((2, 2))}, dest, progress=False)["x"].close()
    old = _manifest(dest)["generation"]
    with _locks.reading(str(dest / old)) as held:  # a reader opening the old generation
        assert held
        loaderx.convert({"x": np.ones((2, 2))}, dest, mode="overwrite", progress=False)["x"].close()
        assert (dest / old).is_dir()
        np.testing.assert_array_equal(loaderx.open_dataset(dest)["x"][[0]], [[1, 1]])
    loaderx.convert({"x": np.ones((1, 2))}, dest, mode="append", progress=False)["x"].close()
    assert sorted(os.listdir(dest)) == [_manifest(dest)["generation"], "loaderx.json"]
