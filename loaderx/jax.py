"""JAX hand-off: ``pip install 'loaderx[jax]'``.

``global_batches(loader, sharding)`` yields every batch of a loaderx
``DataLoader`` as ``jax.Array`` objects laid out by ``sharding``, built with
``jax.make_array_from_process_local_data``::

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    loader = DataLoader({"x": DenseStore(path)}, 64, seed=0, shard=loaderx.jax.process_shard())
    for batch in loaderx.jax.global_batches(loader, sharding):
        state = train_step(state, batch["x"])

One process or many
    Every JAX process runs its own loader over the same store (a local copy
    or a shared file system) with ``shard=loaderx.jax.process_shard()``, that
    is ``(jax.process_index(), jax.process_count())``, and a batch size of
    the *per-process* batch; ``global_batches`` refuses a loader with another
    shard. Each process hands its part to
    ``make_array_from_process_local_data``, so the global batch is
    ``batch_size * jax.process_count()`` rows. With a mesh whose data axis
    lists the devices in process order (``jax.devices()`` does), process
    ``p``'s rows are rows ``[p * batch_size, (p + 1) * batch_size)`` of the
    global array, which then equals the batch one process gets with the
    global batch size. Multi-process runs start with
    ``jax.distributed.initialize(...)`` before the loader is built, as any
    multi-process JAX program; the CPU backend runs it too (tested with two
    processes on one machine).

Shardings
    ``sharding`` is one ``jax.sharding.Sharding`` for every array of the
    batch, or a tree of shardings shaped like the batch (or a prefix of it),
    e.g. ``{"x": data_sharding, "y": replicated}``. The batch may be the
    loader's dict or whatever a ``transform`` returns (dicts, lists, tuples);
    its leaves must be numeric numpy arrays: bool, integers, floats up to 64
    bits, complex, and the ``ml_dtypes`` types JAX has (``bfloat16``, the
    ``float8`` types, ``int4``); a non-native byte order is copied to the
    native one first. JAX's dtype rule applies: unless
    ``jax_enable_x64`` is on, 64-bit arrays become 32-bit ones (store labels
    and indices as int32 to avoid the conversion). Ragged and byte streams arrive as
    lists of records: pad or pack them in a ``transform`` first (a list value
    in the batch dict is refused with that advice). Every leaf's leading
    (batch) dimension must split evenly over the devices its sharding
    divides it across: with the data-parallel sharding, ``batch_size`` a
    multiple of ``jax.local_device_count()``; an array that does not fit its
    sharding is refused naming the leaf.

Memory
    On the CPU backend a ``jax.Array`` may share memory with the numpy batch
    it was built from (no copy). The loader reuses an output array's memory
    only when nothing refers to it any more, and the ``jax.Array`` refers to
    it, so that is safe. Do not combine ``global_batches`` with ``out=`` buffers: the
    loader rewrites those on a fixed schedule, under a ``jax.Array`` that may
    share them or (on accelerators) whose host-to-device copy may still run.
    The loader itself stays the caller's: close it when done.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, List, Mapping, Tuple

import numpy as np

try:
    import jax
    from jax.sharding import Sharding
except ImportError as exc:  # pragma: no cover - exercised only without jax.
    raise ImportError("loaderx.jax needs JAX: pip install 'loaderx[jax]'") from exc

__all__ = ["global_batches", "global_batch", "process_shard"]

# Largest item size JAX takes per numpy kind: bool, signed, unsigned, float,
# complex (float128 and complex256 are numpy's, not JAX's).
_MAX_ITEMSIZE = {"b": 1, "i": 8, "u": 8, "f": 8, "c": 16}


def process_shard() -> Tuple[int, int]:
    """``(jax.process_index(), jax.process_count())``: the ``shard=`` of this
    process's loader."""
    return int(jax.process_index()), int(jax.process_count())


def global_batches(loader: Iterable[Any], sharding: Any) -> Iterator[Any]:
    """Every batch of ``loader`` as ``jax.Array`` objects (see the module docs).

    ``loader`` is a loaderx ``DataLoader`` (its shard must be
    ``process_shard()``) or any iterable of batches. Endless when the loader is.
    """
    _check_sharding_arg(sharding)
    shard = getattr(loader, "shard", None)
    if shard is not None and tuple(shard) != process_shard():
        index, count = process_shard()
        raise ValueError(
            f"the loader has shard {tuple(shard)} but this is JAX process {index} of "
            f"{count}: build it with shard=loaderx.jax.process_shard()"
        )
    for batch in loader:
        yield global_batch(batch, sharding)


def global_batch(batch: Any, sharding: Any) -> Any:
    """One process-local batch as global ``jax.Array`` objects, same tree shape."""
    _check_sharding_arg(sharding)
    if isinstance(batch, Mapping):
        for name, value in batch.items():
            if isinstance(value, list):
                raise TypeError(
                    f"batch[{name!r}] is a list (a ragged or byte stream): pad or pack it "
                    "into an array in a transform before global_batches"
                )
    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(batch)
    leaves = [_jax_leaf(path, leaf) for path, leaf in paths_leaves]
    shardings = _leaf_shardings(batch, sharding, len(paths_leaves))
    arrays = [
        _global_array(path, leaf, leaf_sharding)
        for (path, _), leaf, leaf_sharding in zip(paths_leaves, leaves, shardings)
    ]
    return jax.tree_util.tree_unflatten(treedef, arrays)


def _global_array(path: Any, leaf: np.ndarray, leaf_sharding: Any) -> Any:
    try:
        return jax.make_array_from_process_local_data(leaf_sharding, leaf)
    except ValueError as exc:  # IndivisibleError and other layout mismatches
        raise ValueError(
            f"batch{jax.tree_util.keystr(path)} of shape {leaf.shape} does not fit its "
            f"sharding {leaf_sharding} (each process's rows must split evenly over the "
            f"devices the sharding divides them across; make batch_size a multiple of "
            f"that count): {exc}"
        ) from exc


def _is_sharding(value: Any) -> bool:
    return isinstance(value, Sharding)


def _check_sharding_arg(sharding: Any) -> None:
    leaves = jax.tree_util.tree_leaves(sharding, is_leaf=_is_sharding)
    if not leaves or not all(_is_sharding(leaf) for leaf in leaves):
        raise TypeError(
            "sharding must be a jax.sharding.Sharding or a tree (dict, list, tuple) of "
            f"them, got {sharding!r}"
        )


def _jax_dtype(dtype: np.dtype) -> bool:
    """Whether JAX makes arrays of ``dtype`` (any byte order)."""
    if dtype.kind in _MAX_ITEMSIZE:
        return dtype.itemsize <= _MAX_ITEMSIZE[dtype.kind]
    # bfloat16, float8_*, int4 & co (ml_dtypes) are numpy void types to numpy.
    return dtype.kind == "V" and dtype.names is None and bool(
        jax.dtypes.issubdtype(dtype, np.number)
    )


def _jax_leaf(path: Any, leaf: Any) -> np.ndarray:
    """``leaf`` checked, in native byte order (JAX refuses any other)."""
    where = f"batch{jax.tree_util.keystr(path)}"
    if not isinstance(leaf, np.ndarray):
        raise TypeError(
            f"{where} is a {type(leaf).__name__}; global_batches takes numpy arrays "
            "(convert or drop it in the loader's transform)"
        )
    if not _jax_dtype(leaf.dtype) or leaf.ndim == 0:
        raise TypeError(
            f"{where} is a {leaf.dtype} array of shape {leaf.shape}; global_batches takes "
            "numeric arrays of a dtype JAX has, with a batch dimension"
        )
    if not leaf.dtype.isnative:
        leaf = leaf.astype(leaf.dtype.newbyteorder("="))
    return leaf


def _leaf_shardings(batch: Any, sharding: Any, leaf_count: int) -> List[Any]:
    """One sharding per leaf of ``batch``, in flattening order."""
    if _is_sharding(sharding):
        return [sharding] * leaf_count
    sharding_leaves, sharding_def = jax.tree_util.tree_flatten(sharding, is_leaf=_is_sharding)
    try:
        subtrees = sharding_def.flatten_up_to(batch)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"the sharding tree {sharding_def} does not match the batch "
            f"{jax.tree_util.tree_structure(batch)}: {exc}"
        ) from None
    shardings: List[Any] = []
    for leaf_sharding, subtree in zip(sharding_leaves, subtrees):
        shardings.extend([leaf_sharding] * len(jax.tree_util.tree_leaves(subtree)))
    return shardings
