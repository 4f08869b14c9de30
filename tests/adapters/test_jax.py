"""loaderx.jax on the CPU backend: global jax.Arrays from loaderx batches.

JAX reads XLA_FLAGS at its first import, so the checks run in child processes
(tests/_jax_checks.py) and this process never imports jax:

* one process with 4 CPU devices: shapes, dtypes, values equal to the numpy
  batches, the requested shardings (1-D and 2-D meshes, one sharding per
  stream), held batches unchanged while the loader runs on, transform trees,
  and the errors;
* two JAX processes joined by ``jax.distributed`` on loopback (2 devices
  each): each process's loader has ``shard=process_shard()`` and the global
  array equals the batch one process gets with the global batch size.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from _helpers import ROOT, TESTS
from _jax_checks import BATCH_SIZE, STEPS, build_stores, numpy_batches

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None,
    reason="jax is not installed (pip install 'loaderx[jax]')",
)

CHECKS = os.path.join(TESTS, "_jax_checks.py")
TIMEOUT_S = 180


def _has(module):
    return importlib.util.find_spec(module) is not None


def child_env(device_count):
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={device_count}"
    env["JAX_PLATFORMS"] = "cpu"
    # The loaderx this test imports, also in the child.
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def test_one_process_on_four_cpu_devices(tmp_path):
    result = subprocess.run(
        [sys.executable, CHECKS, "single", str(tmp_path)],
        env=child_env(4), capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    done = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("ok ")]
    assert done == [
        "check_data_parallel",
        "check_two_axis_and_per_stream_shardings",
        "check_held_batches_keep_their_values",
        "check_transform_trees",
        "check_errors",
    ], result.stdout


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_jax_processes_build_the_single_process_global_batch(tmp_path):
    root = tmp_path / "stores"
    root.mkdir()
    build_stores(str(root))
    port = free_port()
    outs = [tmp_path / f"rank{index}.npz" for index in range(2)]
    children = [
        subprocess.Popen(
            [sys.executable, CHECKS, "rank", str(index), str(port), str(root), str(outs[index])],
            env=child_env(2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for index in range(2)
    ]
    logs = []
    try:
        for child in children:
            logs.append(child.communicate(timeout=TIMEOUT_S)[0])
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.communicate()
    assert [child.returncode for child in children] == [0, 0], "\n".join(logs)

    expected = numpy_batches(str(root), STEPS, batch_size=2 * BATCH_SIZE)
    half = BATCH_SIZE // 2
    for index, out in enumerate(outs):
        report = np.load(out)
        # Every process sees the whole global array, and it is the batch of
        # one process with the global batch size: rank 0's rows, then rank 1's.
        for step in range(STEPS):
            np.testing.assert_array_equal(report["global_x"][step], expected[step]["x"])
        # This process's two devices hold its own rows of the global array.
        own = [index * BATCH_SIZE, index * BATCH_SIZE + half]
        assert report["row_starts"].tolist() == [own] * STEPS


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


# In a child process with 4 CPU devices: bfloat16 leaves were refused although
# JAX has the type; a big-endian store's batches and a float128 leaf raised JAX's
# bare "Dtype >i4 is not a valid JAX array type" naming no leaf; a batch whose
# rows do not split over the devices raised JAX's IndivisibleError naming no leaf.
@pytest.mark.skipif(not (_has("jax") and _has("ml_dtypes")),
                    reason="jax is not installed (pip install 'loaderx[jax]')")
def test_jax_dtypes_byte_order_and_indivisible_batches(tmp_path):
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join([ROOT, TESTS] + [p for p in [env.get("PYTHONPATH")] if p])
    result = subprocess.run([sys.executable, "-c", JAX_CHILD, str(tmp_path)], env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0 and result.stdout.split() == ["ok"], result.stderr[-3000:]
