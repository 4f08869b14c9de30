"""Findings of an audit of the framework adapters, each pinned by a test that
failed before its fix:

* loaderx.torch: an ``ml_dtypes`` array (a bfloat16 store's batches, the
  float8 types) passed through ``to_torch`` as a numpy array instead of
  becoming a tensor of torch's matching dtype;
* loaderx.jax (in a child process with 4 CPU devices, as tests/test_jax.py):
  bfloat16 leaves were refused although JAX has the type; a big-endian
  store's batches and a float128 leaf raised JAX's bare "Dtype >i4 is not a
  valid JAX array type" naming no leaf; a batch whose rows do not split over
  the devices raised JAX's IndivisibleError naming no leaf;
* loaderx.ray: ``read_dataset`` with an unknown column or ``batch_rows=0``
  gave a Dataset that failed only when it ran, inside a Ray task (no Ray is
  started here: the checks now run in the driver first); ``write_dataset``
  of something that is not a Ray dataset raised a bare AttributeError; a
  write task whose later blocks had another Arrow type than its first block
  cast them silently (2**40 became 0 in an int32 column, 0.5 became 0) and
  dropped a column only later blocks had;
* ``loaderx demo``: ``--seed -1`` stopped with numpy's bare "expected
  non-negative integer", ``--workers 0`` only after building the stores.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import loaderx
from loaderx import DataLoader, DenseStore

REPO = os.path.dirname(os.path.dirname(os.path.abspath(loaderx.__file__)))


def _has(module):
    return importlib.util.find_spec(module) is not None


# -- torch ------------------------------------------------------------------------------


@pytest.mark.skipif(not (_has("torch") and _has("ml_dtypes")),
                    reason="needs torch and ml_dtypes (pip install 'loaderx[torch,jax]')")
def test_to_torch_converts_ml_dtypes_arrays_to_torch_dtypes(tmp_path):
    import ml_dtypes
    import torch

    import loaderx.torch as lxtorch

    values = np.array([0, 1.5, -2, 0.25, 3, -0.5], np.float32)
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        array = values.astype(getattr(ml_dtypes, name))
        tensor = lxtorch.to_torch(array)
        assert isinstance(tensor, torch.Tensor) and tensor.dtype == getattr(torch, name), name
        assert tensor.data_ptr() == array.ctypes.data  # zero-copy, as numeric arrays
        assert tensor.float().tolist() == values.tolist()
        flipped = lxtorch.to_torch(array.reshape(2, 3)[::-1, ::2])  # copied, then converted
        assert flipped.float().tolist() == values.reshape(2, 3)[::-1, ::2].tolist()

    # End to end: a bfloat16 store read through the IterableDataset.
    records = (np.arange(24, dtype=np.float32).reshape(12, 2) / 4).astype(ml_dtypes.bfloat16)
    loaderx.from_numpy(str(tmp_path / "bf"), records).close()

    def make_loader(rank, world):
        return DataLoader({"x": DenseStore(str(tmp_path / "bf"))}, 4, seed=0,
                          shard=(rank, world), mode="sequential", workers=1)

    dataset = lxtorch.IterableDataset(make_loader)
    try:
        batch = next(iter(dataset))
    finally:
        dataset.close()
    assert batch["x"].dtype == torch.bfloat16
    assert batch["x"].float().tolist() == records[:4].astype(np.float32).tolist()


# -- jax --------------------------------------------------------------------------------

JAX_CHILD = r"""
import sys
import ml_dtypes
import numpy as np
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import loaderx
import loaderx.jax as lxjax
from _jax_checks import expect_error as refused

root = sys.argv[1]
rows = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
assert len(jax.devices()) == 4

def first_batch(name, array, batch_size=8):
    loaderx.from_numpy(f"{root}/{name}", array).close()
    store = loaderx.open_store(f"{root}/{name}")
    with loaderx.DataLoader({"x": store}, batch_size, mode="sequential", workers=1) as loader:
        return next(lxjax.global_batches(loader, rows))["x"]


bf = (np.arange(16, dtype=np.float32) / 8).astype(ml_dtypes.bfloat16)
x = first_batch("bf", bf)
assert x.dtype == jax.numpy.bfloat16 and x.sharding == rows
assert np.asarray(x).astype(np.float32).tolist() == (np.arange(8) / 8).tolist()

big = np.arange(16, dtype=">i4") * 3
x = first_batch("big", big)
assert x.dtype == np.int32 and np.asarray(x).tolist() == list(range(0, 24, 3))

refused(TypeError, ["batch['x']", "float128"],
        lambda: lxjax.global_batch({"x": np.zeros(8, np.longdouble)}, rows))
refused(ValueError, ["batch['x']", "(6, 2)", "batch_size"],
        lambda: lxjax.global_batch({"x": np.zeros((6, 2), np.float32)}, rows))
print("ok")
"""


@pytest.mark.skipif(not (_has("jax") and _has("ml_dtypes")),
                    reason="jax is not installed (pip install 'loaderx[jax]')")
def test_jax_dtypes_byte_order_and_indivisible_batches(tmp_path):
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    env["JAX_PLATFORMS"] = "cpu"
    tests = os.path.join(REPO, "tests")  # for _jax_checks
    env["PYTHONPATH"] = os.pathsep.join([REPO, tests] + [p for p in [env.get("PYTHONPATH")] if p])
    result = subprocess.run([sys.executable, "-c", JAX_CHILD, str(tmp_path)], env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0 and result.stdout.split() == ["ok"], result.stderr[-3000:]


# -- ray --------------------------------------------------------------------------------


@pytest.mark.skipif(not (_has("ray") and _has("pyarrow")),
                    reason="Ray is not installed (pip install 'loaderx[ray]')")
def test_ray_arguments_are_checked_in_the_driver(tmp_path):
    import loaderx.ray as lxray

    loaderx.convert({"x": np.zeros((10, 4), np.float32), "y": np.zeros((10, 4), np.int32)},
                    str(tmp_path / "ds"))
    with pytest.raises(KeyError, match=r"no column 'z'; the dataset has \['x', 'y'\]"):
        lxray.read_dataset(tmp_path / "ds", columns=["x", "z"])
    with pytest.raises(TypeError, match="columns must be a list"):
        lxray.read_dataset(tmp_path / "ds", columns="x")
    with pytest.raises(ValueError, match="batch_rows must be a positive int, got 0"):
        lxray.read_dataset(tmp_path / "ds", batch_rows=0)
    with pytest.raises(TypeError, match="takes a ray.data.Dataset, got ndarray"):
        lxray.write_dataset(np.arange(3), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not (_has("ray") and _has("pyarrow")),
                    reason="Ray is not installed (pip install 'loaderx[ray]')")
def test_ray_write_task_refuses_blocks_unlike_its_first():
    import pyarrow as pa

    from loaderx.converters import ConvertError
    from loaderx.converters._columns import Flags, arrow_spec
    from loaderx.converters._source import Options
    from loaderx.ray import _BlocksSource

    options = Options(columns=None, skip_columns=[], flags=Flags())
    first = pa.table({"v": pa.array(np.arange(3, dtype=np.int32))})
    specs = [arrow_spec(pa, "v", first.schema.field("v").type, options.flags)]
    later = {
        "int64": (pa.table({"v": pa.array([2**40, 1, 2], pa.int64())}), "Arrow type int64"),
        "double": (pa.table({"v": pa.array([0.5, 1.5, 2.5])}), "Arrow type double"),
        "extra": (pa.table({"v": first["v"], "w": pa.array([1, 2, 3])}), "['v', 'w']"),
    }
    for name, (table, words) in later.items():
        source = _BlocksSource(iter([first, table]), options, 5)
        with pytest.raises(ConvertError, match="Ray write task 5") as info:
            list(source.read(None, specs, 1 << 20))
        assert words in str(info.value), name
    same = _BlocksSource(iter([first, first]), options, 5).read(None, specs, 1 << 20)
    assert [b.columns["v"].tolist() for b in same] == [[0, 1, 2], [0, 1, 2]]


# -- demo -------------------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--seed", "-1"], "--seed must be >= 0, got -1"),
    (["--workers", "0"], "--workers must be >= 1, got 0"),
])
def test_demo_refuses_bad_seed_and_workers_before_building(args, words, capsys):
    from loaderx import _demo

    with pytest.raises(SystemExit) as exit_info:
        _demo.run(["--records", "50", "--steps", "1", *args])
    captured = capsys.readouterr()
    assert exit_info.value.code == 2 and words in captured.err
    assert "built" not in captured.out  # refused before writing any store
