"""loaderx.torch: batches as tensors, rank and world, torch worker processes,
checkpoints through torchdata's StatefulDataLoader, recycled (pinnable)
output buffers, and two ranks meeting through torch.distributed (gloo).

Record i of the dense store is ``[i, 3i + 1]`` and record i of the ragged
store is ``arange(i % 5 + 1) + i``, so every batch shows which records it
holds. Expected batches come from plain loaderx DataLoaders.
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import multiprocessing
import os
import pickle
import socket
import sys
import traceback
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
stateful_dataloader = pytest.importorskip("torchdata.stateful_dataloader")

import loaderx  # noqa: E402
import loaderx.torch as lxtorch  # noqa: E402
from loaderx import DataLoader, DenseStore, RaggedStore  # noqa: E402

StatefulDataLoader = stateful_dataloader.StatefulDataLoader

LENGTH = 240
BATCH_SIZE = 8
SEED = 7
PROCESS_TIMEOUT_S = 120


def _has(module):
    return importlib.util.find_spec(module) is not None


def dense_records(length=LENGTH):
    index = np.arange(length, dtype=np.int64)
    return np.stack([index, 3 * index + 1], axis=1)


def ragged_records(length=LENGTH):
    return [np.arange(i % 5 + 1, dtype=np.int32) + i for i in range(length)]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Paths of a dense and a ragged store of LENGTH records."""
    root = tmp_path_factory.mktemp("torch-stores")
    with DenseStore(str(root / "x"), np.int64, (2,)) as dense:
        dense.append(dense_records())
    with RaggedStore(str(root / "r"), np.int32) as ragged:
        ragged.append(ragged_records())
    return str(root / "x"), str(root / "r")


def make_loader(x_path, r_path, rank, world, **kwargs):
    """A module-level recipe, so torch worker processes can unpickle it."""
    streams = {"x": DenseStore(x_path)}
    if r_path is not None:
        streams["r"] = RaggedStore(r_path)
    kwargs.setdefault("workers", 1)
    return DataLoader(streams, BATCH_SIZE, seed=SEED, shard=(rank, world), mode="cyclic", **kwargs)


def expected_batches(x_path, r_path, count, shard=(0, 1), step=0):
    """The numpy batches a plain loaderx DataLoader gives."""
    with make_loader(x_path, r_path, *shard, step=step) as loader:
        return [next(loader) for _ in range(count)]


def assert_batch_equal(got, expected):
    assert isinstance(got["x"], torch.Tensor)
    np.testing.assert_array_equal(got["x"].numpy(), expected["x"])
    if "r" in expected:
        assert isinstance(got["r"], list) and len(got["r"]) == len(expected["r"])
        for tensor, array in zip(got["r"], expected["r"]):
            assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.int32
            np.testing.assert_array_equal(tensor.numpy(), array)


def take(iterator, count):
    return [next(iterator) for _ in range(count)]


# -- module and conversion -------------------------------------------------------------


def test_import_torch_inside_adapter_is_the_real_torch():
    assert lxtorch.torch is sys.modules["torch"]
    assert callable(lxtorch.torch.from_numpy)
    assert "loaderx" not in os.path.dirname(lxtorch.torch.__file__)
    assert issubclass(lxtorch.IterableDataset, torch.utils.data.IterableDataset)


def test_to_torch_shares_memory_with_numeric_arrays():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = lxtorch.to_torch(array)
    assert tensor.data_ptr() == array.ctypes.data
    array[0, 0] = 42.0
    assert tensor[0, 0].item() == 42.0
    for dtype in (np.bool_, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
                  np.float16, np.float64, np.complex64):
        values = np.zeros(3, dtype=dtype)
        assert lxtorch.to_torch(values).data_ptr() == values.ctypes.data, dtype


def test_to_torch_copies_what_torch_cannot_share():
    readonly = np.arange(4, dtype=np.int32)
    readonly.flags.writeable = False
    swapped = np.arange(4, dtype=">i4")
    reversed_ = np.arange(4, dtype=np.int64)[::-1]
    for array in (readonly, swapped, reversed_):
        tensor = lxtorch.to_torch(array)
        assert isinstance(tensor, torch.Tensor)
        np.testing.assert_array_equal(tensor.numpy(), array)
        assert tensor.data_ptr() != array.ctypes.data
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "non-writable array" warning from torch
        lxtorch.to_torch(readonly)


def test_to_torch_keeps_structure_and_passes_other_values():
    Pair = collections.namedtuple("Pair", "a b")
    strings = np.array(["a", "b"])
    records = np.zeros(2, dtype=[("f", np.int32)])
    objects = np.array([b"x", None], dtype=object)
    tensor = torch.ones(2)
    batch = {
        "dense": np.ones((2, 2), dtype=np.uint8),
        "ragged": [np.arange(2), np.arange(3)],
        "pair": Pair(np.zeros(1), b"raw"),
        "tuple": (np.zeros(1, dtype=np.int8), "text", 3, None),
        "other": (strings, records, objects, tensor),
    }
    out = lxtorch.to_torch(batch)
    assert set(out) == set(batch)
    assert out["dense"].dtype == torch.uint8 and out["dense"].shape == (2, 2)
    assert [t.tolist() for t in out["ragged"]] == [[0, 1], [0, 1, 2]]
    assert isinstance(out["pair"], Pair) and out["pair"].b == b"raw"
    assert isinstance(out["pair"].a, torch.Tensor)
    assert out["tuple"][0].dtype == torch.int8 and out["tuple"][1:] == ("text", 3, None)
    assert out["other"][0] is strings and out["other"][1] is records
    assert out["other"][2] is objects and out["other"][3] is tensor


# An ``ml_dtypes`` array (a bfloat16 store's batches, the float8 types) passed
# through ``to_torch`` as a numpy array instead of becoming a tensor of torch's
# matching dtype.
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


# -- iteration ---------------------------------------------------------------------------


def test_dataset_yields_the_loader_batches_as_tensors(stores):
    x_path, r_path = stores
    dataset = lxtorch.IterableDataset(functools.partial(make_loader, x_path, r_path))
    assert dataset.shard == (0, 1)
    got = take(iter(torch.utils.data.DataLoader(dataset, batch_size=None)), 6)
    for batch, expected in zip(got, expected_batches(x_path, r_path, 6)):
        assert_batch_equal(batch, expected)
    dataset.close()


def test_held_tensors_keep_their_values(stores):
    """The tensors share the loader's output arrays, which the loader reuses
    only once nothing refers to them: batches held while it runs on stay put."""
    x_path, _ = stores
    dataset = lxtorch.IterableDataset(functools.partial(make_loader, x_path, None, prefetch=1))
    held = take(iter(dataset), 30)
    dataset.close()
    for batch, expected in zip(held, expected_batches(x_path, None, 30)):
        assert_batch_equal(batch, expected)


def test_transform_output_is_converted(stores):
    x_path, _ = stores

    def pairs(batch):
        return batch["x"][:, 0], batch["x"][:, 1].astype(np.float32), "meta"

    dataset = lxtorch.IterableDataset(functools.partial(make_loader, x_path, None, transform=pairs))
    index, value, meta = next(iter(dataset))
    assert index.dtype == torch.int64 and value.dtype == torch.float32 and meta == "meta"
    np.testing.assert_array_equal(value.numpy(), 3 * index.numpy() + 1)
    dataset.close()


def test_convert_none_keeps_numpy(stores):
    x_path, _ = stores
    dataset = lxtorch.IterableDataset(functools.partial(make_loader, x_path, None), convert=None)
    batch = next(iter(dataset))
    assert isinstance(batch["x"], np.ndarray)
    np.testing.assert_array_equal(batch["x"], expected_batches(x_path, None, 1)[0]["x"])
    dataset.close()


def test_explicit_rank_and_world_shard_the_loader(stores):
    x_path, _ = stores
    dataset = lxtorch.IterableDataset(functools.partial(make_loader, x_path, None), rank=1, world=3)
    got = take(iter(dataset), 4)
    for batch, expected in zip(got, expected_batches(x_path, None, 4, shard=(1, 3))):
        assert_batch_equal(batch, expected)
    assert dataset.state_dict()["loader"]["shard"] == [1, 3]
    dataset.close()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"rank": 0}, ValueError, "together"),
        ({"rank": 2, "world": 2}, ValueError, r"rank must be in \[0, world\)"),
        ({"rank": -1, "world": 2}, ValueError, "rank must be"),
        ({"rank": True, "world": 2}, TypeError, "rank must be an int"),
        ({"rank": 0, "world": 1.0}, TypeError, "world must be an int"),
        ({"convert": 3}, TypeError, "convert must be callable"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        lxtorch.IterableDataset(lambda rank, world: None, **kwargs)
    with pytest.raises(TypeError, match="make_loader must be callable"):
        lxtorch.IterableDataset("not callable")


def test_make_loader_must_return_a_loader_of_the_right_shard(stores):
    x_path, _ = stores
    with pytest.raises(TypeError, match=r"make_loader\(0, 1\) must return a loaderx DataLoader"):
        iter(lxtorch.IterableDataset(lambda rank, world: [1, 2]))
    ignores_shard = lxtorch.IterableDataset(
        lambda rank, world: make_loader(x_path, None, 0, 1), rank=1, world=2
    )
    with pytest.raises(ValueError, match=r"shard \(0, 1\): build it with shard=\(rank, world\)"):
        iter(ignores_shard)


# -- checkpoints -------------------------------------------------------------------------


def test_state_dict_round_trip_without_torch_dataloader(stores):
    x_path, r_path = stores
    recipe = functools.partial(make_loader, x_path, r_path)
    dataset = lxtorch.IterableDataset(recipe)
    assert dataset.state_dict() == {"version": 1, "loader": None}
    iterator = iter(dataset)
    take(iterator, 5)
    state = pickle.loads(pickle.dumps(dataset.state_dict()))
    assert state["loader"]["step"] == 5
    after = take(iterator, 4)
    dataset.close()

    fresh = lxtorch.IterableDataset(recipe)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state  # pending until the loader is built
    resumed = take(iter(fresh), 4)
    for got, expected in zip(resumed, after):
        assert torch.equal(got["x"], expected["x"])
        assert all(torch.equal(a, b) for a, b in zip(got["r"], expected["r"]))
    # Loading into a running loader rewinds it in place.
    fresh.load_state_dict(state)
    assert torch.equal(next(iter(fresh))["x"], after[0]["x"])
    fresh.close()


@pytest.mark.parametrize(
    "state, error, match",
    [
        ([], TypeError, "state must be a dict"),
        ({"version": 2, "loader": None}, ValueError, "unsupported loaderx.torch state version 2"),
        ({"version": 1}, ValueError, "exactly the keys"),
        ({"version": 1, "loader": None, "x": 1}, ValueError, "exactly the keys"),
        ({"version": 1, "loader": 5}, TypeError, r"state\['loader'\] must be a dict"),
    ],
)
def test_bad_states_are_refused(state, error, match):
    dataset = lxtorch.IterableDataset(lambda rank, world: None)
    with pytest.raises(error, match=match):
        dataset.load_state_dict(state)


def test_stateful_dataloader_resumes_exactly(stores):
    x_path, r_path = stores
    recipe = functools.partial(make_loader, x_path, r_path, prefetch=3)
    first = StatefulDataLoader(lxtorch.IterableDataset(recipe), batch_size=None)
    iterator = iter(first)
    before = take(iterator, 7)
    checkpoint = pickle.loads(pickle.dumps(first.state_dict()))
    # The dataset's own state, not a count of batches to replay.
    assert checkpoint["dataset_state"]["loader"]["step"] == 7
    after = take(iterator, 6)
    first.dataset.close()

    second = StatefulDataLoader(lxtorch.IterableDataset(recipe), batch_size=None)
    second.load_state_dict(checkpoint)
    resumed = take(iter(second), 6)
    second.dataset.close()
    expected = expected_batches(x_path, r_path, 13)
    for got, want in zip(before + resumed, expected):
        assert_batch_equal(got, want)
    for got, want in zip(after, expected[7:]):
        assert_batch_equal(got, want)


def test_state_from_another_world_size_resumes_elastically(stores):
    """A state saved on one rank resumes on two: the two ranks' next batches
    are the next global batch of the record sequence (state version 2 keeps
    the global position; version 1 refused another world size)."""
    x_path, _ = stores
    recipe = functools.partial(make_loader, x_path, None)
    dataset = lxtorch.IterableDataset(recipe)
    take(iter(dataset), 2)
    state = dataset.state_dict()
    following = [b["x"] for b in take(iter(dataset), 2)]  # two more batches of one rank
    dataset.close()
    halves = []
    for rank in range(2):
        other = lxtorch.IterableDataset(recipe, rank=rank, world=2)
        other.load_state_dict(state)
        halves.append(take(iter(other), 1)[0]["x"])
        other.close()
    # One global step of two ranks covers the single rank's next two steps.
    assert torch.equal(torch.cat(halves), torch.cat(following))


# -- torch worker processes --------------------------------------------------------------


def worker_order(x_path, r_path, count, workers):
    """torch's in-order delivery: batch k*N + w is worker w's k-th batch, and
    worker w's loader has shard (w, N)."""
    per_worker = [
        expected_batches(x_path, r_path, count // workers + 1, shard=(w, workers))
        for w in range(workers)
    ]
    return [per_worker[position % workers][position // workers] for position in range(count)]


def test_worker_processes_build_their_own_loaders_and_resume(stores):
    x_path, r_path = stores
    recipe = functools.partial(make_loader, x_path, r_path)
    dataset = lxtorch.IterableDataset(recipe)
    take(iter(dataset), 1)  # a loader in the parent must not leak into the workers

    def loader():
        return StatefulDataLoader(
            dataset, batch_size=None, num_workers=2, multiprocessing_context="fork"
        )

    first = loader()
    iterator = iter(first)
    before = take(iterator, 5)
    checkpoint = first.state_dict()
    # Each worker checkpoints its own loader: worker 0 gave 3 batches, worker 1 gave 2.
    snapshots = checkpoint["_snapshot"]["_worker_snapshots"]
    loader_states = [snapshots[f"worker_{w}"]["dataset_state"]["loader"] for w in range(2)]
    assert [(s["shard"], s["step"]) for s in loader_states] == [([0, 2], 3), ([1, 2], 2)]
    after = take(iterator, 6)
    del iterator, first
    second = loader()
    second.load_state_dict(checkpoint)
    resumed = take(iter(second), 6)
    del second
    dataset.close()
    expected = worker_order(x_path, r_path, 11, 2)
    for got, want in zip(before + after, expected):
        assert_batch_equal(got, want)
    for got, want in zip(resumed, after):
        assert torch.equal(got["x"], want["x"])


def test_spawned_worker_unpickles_the_recipe(stores):
    x_path, _ = stores
    dataset = lxtorch.IterableDataset(functools.partial(make_loader, x_path, None), rank=1, world=2)
    take(iter(dataset), 3)
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy.state_dict() == {"version": 1, "loader": None}
    dataset.close()
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=1, multiprocessing_context="spawn"
    )
    got = take(iter(loader), 3)
    # One worker: shard (1 * 1 + 0, 2 * 1), the dataset's own shard.
    for batch, expected in zip(got, expected_batches(x_path, None, 3, shard=(1, 2))):
        assert_batch_equal(batch, expected)


# -- recycled output buffers (pinned memory on CUDA) -------------------------------------


def buffer_loader(x_path, buffers, rank, world):
    out = {"x": [b.numpy() for b in buffers]}
    return make_loader(x_path, None, rank, world, prefetch=1, out=out)


def test_out_buffers_are_tensor_views_end_to_end(stores):
    x_path, _ = stores
    buffers = [torch.empty((BATCH_SIZE, 2), dtype=torch.int64) for _ in range(4)]
    addresses = [b.data_ptr() for b in buffers]
    dataset = lxtorch.IterableDataset(functools.partial(buffer_loader, x_path, buffers))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU-only torch: "pin_memory ... no accelerator"
        loader = torch.utils.data.DataLoader(dataset, batch_size=None, pin_memory=True)
        iterator = iter(loader)
        expected = expected_batches(x_path, None, 8)
        for step, want in enumerate(expected):
            batch = next(iterator)
            assert batch["x"].data_ptr() == addresses[step % len(buffers)]
            np.testing.assert_array_equal(batch["x"].numpy(), want["x"])
    dataset.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
def test_pinned_buffers_copy_to_cuda_without_blocking(stores):  # pragma: no cover
    x_path, _ = stores
    buffers = [torch.empty((BATCH_SIZE, 2), dtype=torch.int64).pin_memory() for _ in range(4)]
    dataset = lxtorch.IterableDataset(functools.partial(buffer_loader, x_path, buffers))
    iterator = iter(dataset)
    for want in expected_batches(x_path, None, 5):
        batch = next(iterator)
        assert batch["x"].is_pinned()
        on_device = batch["x"].to("cuda", non_blocking=True)
        torch.cuda.current_stream().synchronize()
        np.testing.assert_array_equal(on_device.cpu().numpy(), want["x"])
    dataset.close()


# -- pickling ------------------------------------------------------------------------------


def test_dataloader_refuses_to_pickle(stores):
    x_path, _ = stores
    with make_loader(x_path, None, 0, 1) as loader, pytest.raises(TypeError):
        pickle.dumps(loader)


def test_dataloader_pickle_error_says_build_one_per_process(stores):
    x_path, _ = stores
    with make_loader(x_path, None, 0, 1) as loader, pytest.raises(TypeError, match="per process"):
        pickle.dumps(loader)


# -- two ranks through torch.distributed (gloo on loopback) -----------------------------

STEPS = 12
CHECKPOINT_STEP = 5


def gloo_rank(rank, world, port, x_path, out_dir):
    """One rank: batches through the adapter, a StatefulDataLoader resume, and
    the error for a dataset built before init_process_group."""
    import torch.distributed as dist

    recipe = functools.partial(make_loader, x_path, None)
    too_early = lxtorch.IterableDataset(recipe)
    address = f"tcp://127.0.0.1:{port}"
    dist.init_process_group("gloo", init_method=address, rank=rank, world_size=world)
    try:
        try:
            iter(too_early)
            early_error = ""
        except RuntimeError as exc:
            early_error = str(exc)
        dataset = lxtorch.IterableDataset(recipe)
        loader = StatefulDataLoader(dataset, batch_size=None)
        iterator = iter(loader)
        batches = []
        for step in range(STEPS):
            if step == CHECKPOINT_STEP:
                state = loader.state_dict()
            batches.append(next(iterator)["x"].numpy().copy())
        dataset.close()
        again = StatefulDataLoader(lxtorch.IterableDataset(recipe), batch_size=None)
        again.load_state_dict(state)
        resumed = [b["x"].numpy().copy() for b in take(iter(again), STEPS - CHECKPOINT_STEP)]
        again.dataset.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    np.savez(
        os.path.join(out_dir, f"rank{rank}.npz"),
        batches=np.stack(batches), resumed=np.stack(resumed),
        shard=np.array(dataset.shard), early_error=np.array(early_error),
    )


def gloo_main(rank, world, port, x_path, out_dir):
    try:
        gloo_rank(rank, world, port, x_path, out_dir)
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.error"), "w") as handle:
            handle.write(traceback.format_exc())
        raise


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(world, *args):
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=gloo_main, args=(rank, world) + args) for rank in range(world)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(PROCESS_TIMEOUT_S)
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join()
    return [process.exitcode for process in processes]


def test_two_ranks_through_gloo_split_every_global_batch(stores, tmp_path):
    x_path, _ = stores
    world = 2
    codes = run_ranks(world, free_port(), x_path, str(tmp_path))
    errors = [path.read_text() for path in sorted(tmp_path.glob("*.error"))]
    assert codes == [0] * world and not errors, (codes, errors)
    reports = [np.load(tmp_path / f"rank{rank}.npz") for rank in range(world)]
    with DataLoader({"x": DenseStore(x_path)}, BATCH_SIZE * world, seed=SEED, mode="cyclic") as one:
        global_batches = [next(one)["x"] for _ in range(STEPS)]
    for rank, report in enumerate(reports):
        assert report["shard"].tolist() == [rank, world]
        assert "build the dataset after init_process_group" in str(report["early_error"])
        np.testing.assert_array_equal(report["resumed"], report["batches"][CHECKPOINT_STEP:])
    for step in range(STEPS):
        shards = [report["batches"][step] for report in reports]
        first, second = (set(shard[:, 0].tolist()) for shard in shards)
        assert len(first) == len(second) == BATCH_SIZE and not first & second, step
        np.testing.assert_array_equal(np.concatenate(shards), global_batches[step])
