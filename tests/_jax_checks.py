"""Checks of loaderx.jax, run by tests/adapters/test_jax.py in child processes.

JAX reads ``XLA_FLAGS`` (``--xla_force_host_platform_device_count``) once, at
its first import, so these checks cannot run inside the pytest process: the
parent starts ``python tests/_jax_checks.py MODE ...`` with the flag set and
reads the exit code and output.

    single STORE_DIR              every one-process check on 4 CPU devices;
                                  prints "ok NAME" per check
    rank INDEX PORT STORE_DIR OUT one of two JAX processes (2 CPU devices each)
                                  joined by jax.distributed on loopback; saves
                                  the global batches it sees to OUT

Record i of the ``x`` store is ``[i, i + 0.25, i + 0.5, i + 0.75]`` (float32),
of ``y`` is ``7 * i`` (int64), of ``r`` is ``arange(i % 3 + 1)`` (ragged).
"""

from __future__ import annotations

import os
import sys

import numpy as np

LENGTH = 192
BATCH_SIZE = 16
SEED = 3
STEPS = 6


def build_stores(root: str) -> None:
    from loaderx import DenseStore, RaggedStore

    index = np.arange(LENGTH)
    with DenseStore(os.path.join(root, "x"), np.float32, (4,)) as x:
        x.append(index[:, None].astype(np.float32) + np.float32([0, 0.25, 0.5, 0.75]))
    with DenseStore(os.path.join(root, "y"), np.int64, ()) as y:
        y.append(7 * index)
    with RaggedStore(os.path.join(root, "r"), np.int32) as r:
        r.append([np.arange(i % 3 + 1, dtype=np.int32) for i in range(LENGTH)])


def make_loader(root, names=("x", "y"), batch_size=BATCH_SIZE, shard=None, **kwargs):
    from loaderx import DataLoader, open_store

    streams = {name: open_store(os.path.join(root, name)) for name in names}
    return DataLoader(streams, batch_size, seed=SEED, mode="iid", shard=shard, workers=1, **kwargs)


def numpy_batches(root, count, **kwargs):
    with make_loader(root, **kwargs) as loader:
        return [{key: value.copy() for key, value in next(loader).items()} for _ in range(count)]


def mesh(shape, names):
    import jax

    return jax.sharding.Mesh(np.array(jax.devices()).reshape(shape), names)


def sharding(mesh_, *spec):
    import jax

    return jax.sharding.NamedSharding(mesh_, jax.sharding.PartitionSpec(*spec))


def shard_layout(array):
    """{device id: (start of the shard along every axis, shard shape)}."""
    layout = {}
    for shard in array.addressable_shards:
        starts = tuple(s.start or 0 for s in shard.index)
        layout[shard.device.id] = (starts, shard.data.shape)
    return layout


# -- one process, four devices -------------------------------------------------------


def check_data_parallel(root):
    import jax
    import loaderx.jax as lxjax

    assert jax.device_count() == 4 and jax.process_count() == 1, jax.devices()
    data = sharding(mesh((4,), ("data",)), "data")
    expected = numpy_batches(root, STEPS)
    assert lxjax.jax is sys.modules["jax"] and "loaderx" not in os.path.dirname(jax.__file__)
    with make_loader(root, shard=lxjax.process_shard()) as loader:
        batches = lxjax.global_batches(loader, data)
        got = [next(batches) for _ in range(STEPS)]
    for batch, want in zip(got, expected):
        assert set(batch) == {"x", "y"}
        for name in ("x", "y"):
            array = batch[name]
            assert isinstance(array, jax.Array) and array.sharding == data
            # JAX's rule without jax_enable_x64: int64 arrives as int32.
            assert array.shape == want[name].shape
            assert array.dtype == jax.dtypes.canonicalize_dtype(want[name].dtype)
            assert array.dtype == (np.int32 if name == "y" else np.float32)
            np.testing.assert_array_equal(np.asarray(array), want[name])
            rows = BATCH_SIZE // 4
            for shard in array.addressable_shards:
                start = shard.index[0].start or 0
                assert shard.data.shape == (rows,) + want[name].shape[1:], name
                np.testing.assert_array_equal(np.asarray(shard.data), want[name][start:start + rows])


def check_two_axis_and_per_stream_shardings(root):
    import loaderx.jax as lxjax

    grid = mesh((2, 2), ("data", "model"))
    tiled = sharding(grid, "data", "model")
    replicated = sharding(grid)
    expected = numpy_batches(root, 3)
    with make_loader(root) as loader:
        batches = lxjax.global_batches(loader, {"x": tiled, "y": replicated})
        got = [next(batches) for _ in range(3)]
    for batch, want in zip(got, expected):
        assert batch["x"].sharding == tiled and batch["y"].sharding == replicated
        assert {shape for _, shape in shard_layout(batch["x"]).values()} == {(BATCH_SIZE // 2, 2)}
        assert {shape for _, shape in shard_layout(batch["y"]).values()} == {(BATCH_SIZE,)}
        np.testing.assert_array_equal(np.asarray(batch["x"]), want["x"])
        np.testing.assert_array_equal(np.asarray(batch["y"]), want["y"])


def check_held_batches_keep_their_values(root):
    """On CPU a jax.Array may share the loader's output memory: batches held
    while the loader runs on must not change."""
    import loaderx.jax as lxjax

    data = sharding(mesh((4,), ("data",)), "data")
    count = 20
    with make_loader(root, prefetch=2) as loader:
        batches = lxjax.global_batches(loader, data)
        held = [next(batches) for _ in range(count)]
    for batch, want in zip(held, numpy_batches(root, count)):
        np.testing.assert_array_equal(np.asarray(batch["x"]), want["x"])


def check_transform_trees(root):
    import loaderx.jax as lxjax

    def features(batch):
        return (batch["x"] * 2, [batch["y"], batch["y"] + 1])

    data = sharding(mesh((4,), ("data",)), "data")
    expected = numpy_batches(root, 2)
    with make_loader(root, transform=features) as loader:
        batches = lxjax.global_batches(loader, data)
        for want in expected:
            doubled, (y, y1) = next(batches)
            np.testing.assert_array_equal(np.asarray(doubled), want["x"] * 2)
            np.testing.assert_array_equal(np.asarray(y1), want["y"] + 1)
            assert y.sharding == data


def expect_error(error, words, call):
    try:
        call()
    except error as exc:
        assert all(word in str(exc) for word in words), (words, str(exc))
        return
    raise AssertionError(f"no {error.__name__} containing {words}")


def check_errors(root):
    import loaderx.jax as lxjax

    data = sharding(mesh((4,), ("data",)), "data")
    with make_loader(root, names=("x", "r")) as loader:
        expect_error(TypeError, ["batch['r'] is a list", "pad or pack"],
                     lambda: next(lxjax.global_batches(loader, data)))
    with make_loader(root, shard=(0, 2)) as loader:
        expect_error(ValueError, ["shard (0, 2)", "process 0 of 1", "process_shard()"],
                     lambda: next(lxjax.global_batches(loader, data)))
    batch = numpy_batches(root, 1)[0]
    expect_error(TypeError, ["sharding must be a jax.sharding.Sharding"],
                 lambda: lxjax.global_batch(batch, "data"))
    expect_error(ValueError, ["does not match the batch"],
                 lambda: lxjax.global_batch(batch, {"x": data, "z": data}))
    expect_error(TypeError, ["batch[1] is a str"],
                 lambda: lxjax.global_batch((batch["x"], "tag"), data))
    expect_error(TypeError, ["batch['s']", "<U1", "numeric"],
                 lambda: lxjax.global_batch({"s": np.array(["a"] * 16)}, data))


def run_single(root):
    build_stores(root)
    for check in (check_data_parallel, check_two_axis_and_per_stream_shardings,
                  check_held_batches_keep_their_values, check_transform_trees, check_errors):
        check(root)
        print("ok", check.__name__, flush=True)


# -- two processes, two devices each ---------------------------------------------------


def run_rank(index, port, root, out):
    import jax
    from jax.experimental import multihost_utils

    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=index)
    try:
        import loaderx.jax as lxjax

        assert lxjax.process_shard() == (index, 2)
        assert jax.device_count() == 4 and jax.local_device_count() == 2
        data = sharding(mesh((4,), ("data",)), "data")
        seen, layouts = [], []
        with make_loader(root, shard=lxjax.process_shard()) as loader:
            batches = lxjax.global_batches(loader, data)
            for _ in range(STEPS):
                batch = next(batches)
                assert batch["x"].shape == (2 * BATCH_SIZE, 4), batch["x"].shape
                layouts.append(sorted(s[0][0] for s in shard_layout(batch["x"]).values()))
                seen.append(multihost_utils.process_allgather(batch["x"], tiled=True))
        np.savez(out, global_x=np.stack(seen), row_starts=np.array(layouts))
    finally:
        jax.distributed.shutdown()


def main(argv):
    if argv[0] == "single":
        run_single(argv[1])
    elif argv[0] == "rank":
        run_rank(int(argv[1]), int(argv[2]), argv[3], argv[4])
    elif argv[0] == "build":
        build_stores(argv[1])
    else:
        raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
