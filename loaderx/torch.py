"""PyTorch hand-off: ``pip install 'loaderx[torch]'``.

``IterableDataset(make_loader)`` is a ``torch.utils.data.IterableDataset``
that yields the batches of a loaderx ``DataLoader`` as tensors::

    def make_loader(rank, world):
        return DataLoader({"x": DenseStore(path)}, 256, seed=0, shard=(rank, world))

    ds = loaderx.torch.IterableDataset(make_loader)
    dl = torchdata.stateful_dataloader.StatefulDataLoader(ds, batch_size=None)

``batch_size=None`` because loaderx already batches: torch must not collate
batches of batches. The loader is endless; count steps.

Rank and world
    ``make_loader(rank, world)`` must build a ``DataLoader`` with
    ``shard=(rank, world)`` (checked: a loader with another shard is refused).
    The dataset's own ``(rank, world)`` is ``rank=``/``world=`` when given,
    else ``torch.distributed``'s rank and world size when it is initialized
    when the dataset is built, else ``(0, 1)``. Build the dataset after
    ``init_process_group``: iterating a dataset built before it raises.

Worker processes (``num_workers``)
    loaderx works on threads inside the process that iterates it, so
    ``num_workers=0`` is the recommended setting: the batches reach the
    training loop without a copy or a pickle. With ``num_workers=N > 0``
    every torch worker process builds its own loader by calling
    ``make_loader(rank * N + worker_id, world * N)`` (the dataset is pickled
    or forked into the worker without its loader; stores pickle as read-only
    references), and torch delivers the workers' batches in turn. The records
    per batch stay ``batch_size``; the order differs from ``num_workers=0``,
    and torch then copies every batch through shared memory. Give each loader
    fewer threads (``workers=``) so the processes do not oversubscribe the
    cores. A loaderx ``DataLoader`` itself never crosses a process boundary.

Checkpoints
    ``state_dict()`` is ``{"version": 1, "loader": <DataLoader.state_dict()>}``
    (``loader`` is ``None`` before the first batch and without a state to
    resume from); ``load_state_dict()`` resumes the loader at exactly that
    step, in O(1). torchdata's ``StatefulDataLoader(ds, batch_size=None)``
    calls both (in each worker process, with ``num_workers > 0``), so its
    ``state_dict()``/``load_state_dict()`` resume exactly. With a plain
    ``torch.utils.data.DataLoader``, call ``ds.state_dict()`` yourself
    (``num_workers=0`` only: the dataset in the main process has no loader
    when workers build them). Restore with the same ``num_workers`` and world
    size: the loader refuses a state from another shard. A state is exact for
    the batches the caller has taken; a framework that fetches ahead of the
    step it trains (Lightning fetches one batch ahead) should rather restart
    the loader at its own step count, ``DataLoader(..., step=s)``, as
    docs/torch.md shows for Lightning.

Conversion (``to_torch``)
    A batch is converted recursively: a numeric or bool numpy array becomes a
    tensor that shares its memory (``torch.from_numpy``, zero-copy), except a
    read-only array, a non-native byte order or a negative stride, which are
    copied first; an ``ml_dtypes`` array torch has a type for (``bfloat16``
    as a bfloat16 store yields, the ``float8`` types) becomes a tensor of
    that torch dtype, sharing memory the same way; dicts, lists and tuples
    (named tuples too) keep their shape with converted items, so a ragged
    stream (a list of arrays) becomes a list of tensors; tensors, bytes,
    strings, numbers, ``None``, numpy arrays of strings, objects or records
    and any other object pass through unchanged.
    Pass ``convert=`` to replace it (``convert=None`` yields numpy batches).

Pinned memory and CUDA
    Copying to a GPU asynchronously needs page-locked (pinned) host memory.
    Give the loader pinned buffers to gather into, as ``out=`` numpy views of
    pinned tensors, so no extra copy is made::

        bufs = [torch.empty((256, 3, 32, 32), dtype=torch.uint8).pin_memory()
                for _ in range(prefetch + workers + 2)]
        DataLoader(..., out={"x": [b.numpy() for b in bufs]})
        ...
        x = batch["x"].to("cuda", non_blocking=True)

    The tensor the dataset yields shares the buffer's memory, and CUDA asks the
    allocator about the address, so it counts as pinned (``is_pinned()``) and
    ``non_blocking`` copies are asynchronous; ``pin_memory=True`` in the torch
    DataLoader then finds it pinned and does not copy it again. Mind the
    ``out=`` contract (``loaderx.dataloader``): a buffer is rewritten
    ``len(bufs) - prefetch - workers`` batches later, so keep enough buffers
    for the copies still in flight (or ``torch.cuda.current_stream()
    .synchronize()`` before taking further batches).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Tuple

import numpy as np

try:
    import torch
    import torch.utils.data
except ImportError as exc:  # pragma: no cover - exercised only without torch.
    raise ImportError(
        "loaderx.torch needs PyTorch: pip install 'loaderx[torch]'"
    ) from exc

from loaderx.dataloader import DataLoader

__all__ = ["IterableDataset", "to_torch", "distributed_shard"]

#: Version of the dict ``IterableDataset.state_dict()`` returns.
STATE_VERSION = 1

#: Loaders a forked process inherited from its parent. Their threads did not
#: survive the fork, so closing one here could wait forever for a thread that
#: was inside a wait at fork time. Keeping them referenced means they are
#: never closed or collected in this process (a torch worker leaves through
#: ``os._exit``, which runs no finalizer).
_INHERITED_LOADERS: list = []

# Numpy kinds torch.from_numpy takes: bool, signed, unsigned, float, complex.
_NUMERIC_KINDS = "biufc"

# ml_dtypes' types (numpy void types to numpy) that torch has, by dtype name.
_CUSTOM_DTYPES = {
    name: getattr(torch, name)
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
}
# Same-size integer types to view such an array as before torch.from_numpy.
_CARRIERS = {1: np.uint8, 2: np.int16}


def to_torch(batch: Any) -> Any:
    """``batch`` with its numeric numpy arrays as tensors (see the module docs)."""
    if isinstance(batch, np.ndarray):
        return _array_to_tensor(batch)
    if isinstance(batch, dict):
        return {key: to_torch(value) for key, value in batch.items()}
    if isinstance(batch, list):
        return [to_torch(value) for value in batch]
    if isinstance(batch, tuple):
        items = [to_torch(value) for value in batch]
        if hasattr(batch, "_fields"):  # a named tuple
            return type(batch)(*items)
        return tuple(items)
    return batch


def _custom_dtype(dtype: np.dtype) -> Any:
    """The torch dtype of an ml_dtypes array (bfloat16 & co), else None."""
    if dtype.names is not None:  # ml_dtypes' kinds vary ("V", "f"): go by name
        return None
    custom = _CUSTOM_DTYPES.get(dtype.name)
    if custom is None or custom.itemsize != dtype.itemsize:
        return None
    return custom


def _array_to_tensor(array: np.ndarray) -> Any:
    custom = _custom_dtype(array.dtype)
    if array.dtype.kind not in _NUMERIC_KINDS and custom is None:
        return array
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if not array.flags.writeable or any(stride < 0 for stride in array.strides):
        # A tensor is always writable; torch refuses negative strides.
        array = np.array(array, copy=True, order="C")
    if custom is not None:
        # torch.from_numpy knows no ml_dtypes type: share the bits, then reinterpret.
        return torch.from_numpy(array.view(_CARRIERS[array.dtype.itemsize])).view(custom)
    return torch.from_numpy(array)


def distributed_shard() -> Tuple[int, int]:
    """``(rank, world)`` from ``torch.distributed``, or ``(0, 1)`` when it is
    not initialized."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return 0, 1


def _check_shard(rank: Any, world: Any) -> Optional[Tuple[int, int]]:
    if rank is None and world is None:
        return None
    if rank is None or world is None:
        raise ValueError(f"give rank and world together, got rank={rank!r}, world={world!r}")
    for name, value in (("rank", rank), ("world", world)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, world), got rank={rank}, world={world}")
    return int(rank), int(world)


class IterableDataset(torch.utils.data.IterableDataset):
    """The batches of a loaderx ``DataLoader`` as tensors (see the module docs).

    Args:
        make_loader: ``make_loader(rank, world) -> DataLoader``, called in the
            process that iterates (once per process); the loader must have
            ``shard=(rank, world)``. With torch worker processes it must pickle
            (a module-level function or a ``functools.partial`` of one).
        rank, world: this process's shard; default from ``torch.distributed``.
        convert: applied to every batch; default ``to_torch``; ``None`` keeps
            numpy batches.
    """

    def __init__(
        self,
        make_loader: Callable[[int, int], DataLoader],
        *,
        rank: Optional[int] = None,
        world: Optional[int] = None,
        convert: Optional[Callable[[Any], Any]] = to_torch,
    ) -> None:
        super().__init__()
        if not callable(make_loader):
            raise TypeError(f"make_loader must be callable, got {make_loader!r}")
        if convert is not None and not callable(convert):
            raise TypeError(f"convert must be callable or None, got {convert!r}")
        given = _check_shard(rank, world)
        self._make_loader = make_loader
        self._convert = convert
        self._shard_given = given is not None
        self._shard = given if given is not None else distributed_shard()
        self._pending: Optional[dict] = None
        self._loader: Optional[DataLoader] = None
        self._loader_pid: Optional[int] = None

    @property
    def shard(self) -> Tuple[int, int]:
        """``(rank, world)`` of this process (before splitting among torch workers)."""
        return self._shard

    # -- iteration ------------------------------------------------------------------

    def __iter__(self):
        loader = self._own_loader()
        if loader is None:
            loader = self._build_loader()
        if self._pending is not None:
            loader.load_state_dict(self._pending)
            self._pending = None
        return self._batches(loader)

    def _batches(self, loader: DataLoader):
        convert = self._convert
        while True:
            batch = next(loader)
            yield batch if convert is None else convert(batch)

    def _loader_shard(self) -> Tuple[int, int]:
        """The shard of this process's loader: split again among torch workers."""
        rank, world = self._shard
        info = torch.utils.data.get_worker_info()
        if info is None:
            self._check_distributed()
            return rank, world
        return rank * info.num_workers + info.id, world * info.num_workers

    def _check_distributed(self) -> None:
        if self._shard_given:
            return
        current = distributed_shard()
        if current != self._shard:
            raise RuntimeError(
                f"this IterableDataset was built with (rank, world) = {self._shard} but "
                f"torch.distributed now says {current}: build the dataset after "
                "init_process_group, or pass rank= and world="
            )

    def _build_loader(self) -> DataLoader:
        if self._loader is not None and self._loader_pid != os.getpid():
            _INHERITED_LOADERS.append(self._loader)
            self._loader = None
        rank, world = self._loader_shard()
        loader = self._make_loader(rank, world)
        if not isinstance(loader, DataLoader):
            raise TypeError(
                f"make_loader({rank}, {world}) must return a loaderx DataLoader, "
                f"got {type(loader).__name__}"
            )
        if tuple(loader.shard) != (rank, world):
            loader.close()
            raise ValueError(
                f"make_loader({rank}, {world}) returned a loader with shard "
                f"{tuple(loader.shard)}: build it with shard=(rank, world)"
            )
        self._loader = loader
        self._loader_pid = os.getpid()
        return loader

    def _own_loader(self) -> Optional[DataLoader]:
        """The loader this process built, if any. A forked torch worker inherits
        its parent's loader object but not its threads: it never uses it."""
        if self._loader is not None and self._loader_pid == os.getpid():
            return self._loader
        return None

    # -- checkpoints ----------------------------------------------------------------

    def state_dict(self) -> dict:
        """``{"version": 1, "loader": DataLoader state or None}``."""
        loader = self._own_loader()
        state = loader.state_dict() if loader is not None else self._pending
        return {"version": STATE_VERSION, "loader": state}

    def load_state_dict(self, state: Any) -> None:
        """Resume at the step in ``state`` (applied to the running loader, or
        when the next iteration builds one)."""
        loader_state = _check_state(state)
        loader = self._own_loader()
        if loader is None:
            self._pending = loader_state
        elif loader_state is None:
            # Back to the start: the next iteration builds a fresh loader.
            self.close()
            self._pending = None
        else:
            loader.load_state_dict(loader_state)
            self._pending = None

    # -- lifetime -------------------------------------------------------------------

    def close(self) -> None:
        """Close the loader this process built (the next iteration builds a new one)."""
        loader = self._own_loader()
        if loader is None and self._loader is not None:
            _INHERITED_LOADERS.append(self._loader)
        self._loader = None
        self._loader_pid = None
        if loader is not None:
            loader.close()

    def __getstate__(self) -> dict:
        # Worker processes and spawn get the recipe, never a running loader.
        state = self.__dict__.copy()
        state["_loader"] = None
        state["_loader_pid"] = None
        return state

    def __repr__(self) -> str:
        rank, world = self._shard
        return f"loaderx.torch.IterableDataset(rank={rank}, world={world})"


def _check_state(state: Any) -> Optional[dict]:
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    version = state.get("version")
    if version != STATE_VERSION:
        raise ValueError(
            f"unsupported loaderx.torch state version {version!r}; this loaderx reads "
            f"version {STATE_VERSION}"
        )
    unknown = sorted(str(key) for key in state if key not in ("version", "loader"))
    if "loader" not in state or unknown:
        raise ValueError(
            f"loaderx.torch state needs exactly the keys ['loader', 'version'], got {sorted(state)}"
        )
    loader_state = state["loader"]
    if loader_state is not None and not isinstance(loader_state, dict):
        raise TypeError(
            f"state['loader'] must be a dict or None, got {type(loader_state).__name__}"
        )
    return loader_state
