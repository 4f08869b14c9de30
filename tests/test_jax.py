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

from _jax_checks import BATCH_SIZE, STEPS, build_stores, numpy_batches

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None,
    reason="jax is not installed (pip install 'loaderx[jax]')",
)

CHECKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_jax_checks.py")
REPO = os.path.dirname(os.path.dirname(CHECKS))
TIMEOUT_S = 180


def child_env(device_count):
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={device_count}"
    env["JAX_PLATFORMS"] = "cpu"
    # The loaderx this test imports, also in the child.
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in [env.get("PYTHONPATH")] if p])
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
