"""An endless, step-based, resumable batch loader over loaderx stores.

``DataLoader(streams, batch_size, ...)`` reads batches from *streams* — a dict
of name -> store (``DenseStore``, ``RaggedStore``, ``Zrecord``, a ``ShardSet``
of them, or any object with ``gather()`` and a ``kind``) that share one index
space, or a `loaderx.Mixture` of several such sources mixed by weight — and
hands them to the caller in step order.

One native pipeline
    Library threads (``src/Loader.zig``) compute every step's indices once
    (the sampler of one source, or the mixture's weighted draw), gather every
    store and ShardSet stream — dense records straight into the batch arrays,
    ragged and byte records into one buffer per step, decoded without a copy
    — and prefetch up to ``prefetch + workers`` steps ahead, with no Python
    and no GIL in between. A loader of stores without a ``transform`` has no
    Python thread at all. Python threads (``loaderx-worker-N``) run only a
    ``transform`` and streams that are plain Python objects, on the ring's
    indices. Threads, not processes: no pickling, no IPC, no ``/dev/shm``;
    the default thread count is the number of cores this process may run on
    (``os.sched_getaffinity``).

Order and determinism
    The batch at step ``s`` is a pure function of ``(seed, s)`` (and the
    configuration): the same whatever the thread count, ``prefetch`` or
    timing. Steps cover a global stream of record positions: step ``s``
    holds positions ``[p_s, p_s + world * batch_size)``, and rank ``r`` of
    ``shard=(r, world)`` its slice ``[r * B, (r + 1) * B)``. In CYCLIC mode
    (the default) no batch ever repeats a record: each cycle is a fresh
    permutation of the records that serves ``length // (world *
    batch_size)`` whole global batches and drops the rest (a different rest
    each cycle), and each source of a mixture takes a step's records from
    one cycle of its own (see `loaderx.Mixture`). A global batch that cannot
    avoid a repeat (larger than the records, or than a mixture source's
    share of one step) is refused; IID and SEQUENTIAL take any. The loader
    is endless unless ``stop_after`` is given; ``len()`` is not defined.

Output
    Dense streams give ``(batch_size, *item_shape)`` arrays; ragged streams a
    list of arrays (``ragged="packed"``: ``(values, row_splits)``); byte
    streams a list of bytes; a mixture adds ``batch["source"]`` (int16, ids
    of ``loader.sources``). The ``transform`` (collate) runs on the worker
    threads and may return anything.

Checkpoints and elastic resume
    ``state_dict()`` is a small, versioned dict of plain values (it pickles
    and round-trips through JSON; built by ``loaderx._state``)::

        {"version": 3, "seed": 0, "mode": "CYCLIC", "step": 1234, "position": 315904,
         "batch_size": 256, "shard": [rank, world], "lengths": {"x": 50000},
         "sources": None, "cursors": None, "fingerprints": {"x": None}}

    ``step`` is the next *undelivered* step (batches prefetched but not yet
    returned are not counted) and ``position`` the global record position of
    its first record; in one-source CYCLIC mode that is ``cycle * length +
    offset``: the cycle the next batch comes from and where in it. A CYCLIC
    mixture adds each source's ``cursors`` (``[cycle, offset, steps_left]``),
    and ``fingerprints`` holds each stream's ``fingerprint`` (the record set
    it reads; None without one). ``load_state_dict()`` checks the fields that
    define the record sequence (seed, mode, stream lengths and fingerprints,
    mixture sources and weights; a mismatch is a ``ValueError`` naming the
    field and both values), throws away whatever was prefetched, and
    continues at that position in O(1): with the same global batch (world *
    batch_size) on any number of ranks, the union over ranks of every later
    step equals the uninterrupted run's. With another global batch, SEQUENTIAL
    continues the exact global record sequence, IID continues with fresh
    draws (it draws by position), and CYCLIC continues inside the same cycle
    from the same offset, serves as many whole new batches as the rest of the
    cycle holds, drops the remainder and goes on with whole cycles, so no
    record repeats within the cycle (each mixture source likewise within its
    own cycle). States of versions 1 and 2, written before CYCLIC dropped the
    cycle's rest, are refused with the reason. The ``rank`` a state was saved
    on does not matter: every rank's state holds the same global position.

Epochs for people who count them
    ``steps_per_epoch`` is one CYCLIC cycle of a one-source loader: ``length
    // (world * batch_size)`` steps, exactly (the cycle's rest is dropped);
    ``epoch_of(step)`` the cycle a step's batch comes from. ``stop_after=N``
    ends iteration when ``step`` reaches ``N`` (an absolute step, so a
    resumed loader stops at the same place).

Errors
    An exception raised by a gather or by ``transform`` while building step
    ``k`` is raised by the ``next()`` that would have returned step ``k``, as
    the original exception object (with a note naming the thread and step on
    Python 3.11+). After that the loader is stopped, and every later
    ``next()`` raises ``RuntimeError`` chained to it. A store closed under a
    running loader fails its next step with ``ClosedError``. A
    ``StopIteration`` from a transform or stream arrives as a
    ``RuntimeError`` (it would otherwise end a ``for`` loop silently).

Closing
    ``close()`` (also on leaving a ``with`` block, and as a fallback when the
    loader is garbage collected or the interpreter exits) stops and joins
    every thread. It is idempotent and may be called from any thread: a
    ``next()`` blocked in another thread then raises ``LoaderClosedError`` at
    once (a ``ClosedError`` and a ``RuntimeError``); so does any later ``next()``.

Thread safety
    ``next()``, ``state_dict()`` and ``load_state_dict()`` are meant for one
    consumer thread; concurrent ``next()`` callers take turns (each step
    goes to one of them). ``close()`` may come from any thread at any time.
    A ``next()`` cut short by an exception (a KeyboardInterrupt) delivers
    nothing: the next call returns that step. Calling ``next()`` or
    ``load_state_dict()`` from the loader's own transform is a RuntimeError.

Framework hand-off (zero-copy)
    Dense streams arrive as C-contiguous numpy arrays: ``torch.from_numpy``,
    ``np.from_dlpack``, ``jax.device_put`` take them without a copy (see
    ``loaderx.torch`` and ``loaderx.jax``).

Recycled output buffers (``out=``)
    ``out={name: [buf0, buf1, ...]}`` for dense streams gathers straight into
    preallocated memory (e.g. pinned host memory). Each buffer must be a
    writable C-contiguous array of the stream's dtype with shape
    ``(batch_size, *item_shape)``; the buffers must not overlap, and there
    must be at least ``prefetch + workers + 1`` of them. Step ``s`` is
    gathered into ``bufs[s % len(bufs)]`` and the delivered array *is* that
    buffer; it stays valid until the consumer has taken ``len(bufs) -
    prefetch - workers`` further batches. ``load_state_dict()`` invalidates
    every batch delivered before it.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from loaderx import _abi, _state
from loaderx._engine import Engine
from loaderx._pipeline import Plan
from loaderx.errors import LoaderClosedError
from loaderx.mixture import Mixture
from loaderx.zsampler import Sampler

__all__ = ["DataLoader"]

#: Version of the dict written by ``DataLoader.state_dict()``.
STATE_VERSION = _state.STATE_VERSION

_STORE_KINDS = ("dense", "ragged", "bytes")

#: Bounds of the native prefetch ring (``src/Loader.zig``): threads, steps in
#: flight (prefetch + workers) and columns.
_WORKERS_MAX = _abi.LOADER_THREADS_MAX
_WINDOW_MAX = _abi.LOADER_WINDOW_MAX
_COLUMNS_MAX = _abi.LOADER_COLUMNS_MAX


def _default_worker_count() -> int:
    """The number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no affinity mask.
        return os.cpu_count() or 1


_is_int = _state.is_int


def _check_int(name: str, value: Any, minimum: int) -> int:
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def _check_streams(streams: Any) -> Dict[str, Any]:
    """Check the streams mapping: non-empty, string names, stores of one length."""
    if not isinstance(streams, Mapping):
        raise TypeError(
            f"streams must be a dict of name -> store, got {type(streams).__name__}"
        )
    if not streams:
        raise ValueError("streams is empty: give at least one name -> store")
    for name, store in streams.items():
        if not isinstance(name, str):
            raise TypeError(f"stream names must be str, got {name!r}")
        kind = getattr(store, "kind", None)
        if not callable(getattr(store, "gather", None)) or kind not in _STORE_KINDS:
            raise TypeError(
                f"stream {name!r} is not a loaderx store (needs gather() and a kind in "
                f"{_STORE_KINDS}): got {type(store).__name__}"
            )
    lengths = {name: len(store) for name, store in streams.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"streams must all have the same length, got {lengths}")
    for name, length in lengths.items():
        if length == 0:
            raise ValueError(f"stream {name!r} is empty (len 0): nothing to load"
                             f"{empty_note(streams[name])}")
    return dict(streams)


def empty_note(stream: Any) -> str:
    """Why an empty stream is empty, when it is a `loaderx.select` subset."""
    selection = getattr(stream, "selection", None)
    describe = getattr(selection, "describe", None)
    return f" (the subset selects {describe()})" if callable(describe) else ""


def _check_out(
    out: Any, streams: Mapping[str, Any], batch_size: int, buffer_count_min: int
) -> Dict[str, List[np.ndarray]]:
    """Check the recycled output buffers against the dense streams they fill
    (`streams`: name -> a stream of that column)."""
    if out is None:
        return {}
    if not isinstance(out, Mapping):
        raise TypeError(f"out must be a dict of name -> list of arrays, got {type(out).__name__}")
    checked: Dict[str, List[np.ndarray]] = {}
    for name, buffers in out.items():
        if name not in streams:
            raise ValueError(f"out names stream {name!r}, which is not one of {list(streams)}")
        store = streams[name]
        if store.kind != "dense":
            raise ValueError(
                f"out[{name!r}]: output buffers are only for dense streams, "
                f"stream {name!r} is {store.kind}"
            )
        if isinstance(buffers, np.ndarray) or not isinstance(buffers, Sequence):
            raise TypeError(f"out[{name!r}] must be a list of arrays, got {type(buffers).__name__}")
        if len(buffers) < buffer_count_min:
            raise ValueError(
                f"out[{name!r}] has {len(buffers)} buffers; it needs at least "
                f"prefetch + workers + 1 = {buffer_count_min}"
            )
        shape = (batch_size,) + tuple(store.item_shape)
        dtype = np.dtype(store.dtype)
        for position, buffer in enumerate(buffers):
            _check_buffer(f"out[{name!r}][{position}]", buffer, shape, dtype)
        for position, buffer in enumerate(buffers):
            for other in buffers[position + 1:]:
                if np.shares_memory(buffer, other):
                    raise ValueError(f"out[{name!r}]: buffers must not share memory")
        checked[name] = list(buffers)
    return checked


def _check_buffer(label: str, buffer: Any, shape: Tuple[int, ...], dtype: np.dtype) -> None:
    if not isinstance(buffer, np.ndarray):
        raise TypeError(f"{label} must be a numpy array, got {type(buffer).__name__}")
    if buffer.dtype != dtype or buffer.shape != shape:
        raise ValueError(
            f"{label} is {buffer.dtype}{list(buffer.shape)}, the stream needs {dtype}{list(shape)}"
        )
    if not buffer.flags.c_contiguous or not buffer.flags.writeable:
        raise ValueError(f"{label} must be C-contiguous and writable")




class DataLoader:
    """An endless iterator of batches (see the module docs).

    Args:
        streams: name -> stream (all of the same non-zero length, gathered at
            the same indices), or a `loaderx.Mixture` of such sources.
        batch_size: records per batch on this rank (the global batch is
            ``batch_size * world``).
        mode: sampling order, a ``Sampler.Mode`` or its name.
        seed: sampler seed.
        transform: called on the worker threads with each batch dict; its
            return value is what ``next()`` yields.
        workers: threads, 1..256; default: the cores this process may use.
        prefetch: >= 1; the loader works at most ``prefetch + workers`` steps
            (at most 65536) ahead of the next undelivered one.
        shard: ``(rank, world)`` for multi-process training, or ``None``.
        step: the first step to deliver, as if the loader had run from step 0
            (O(1): nothing is replayed).
        out: recycled output buffers for dense streams (see the module docs).
        ragged: ``"list"`` (a list of arrays per batch) or ``"packed"``
            (``(values, row_splits)``) for ragged streams.
        stop_after: end iteration when ``step`` reaches this step; None: endless.
    """

    def __init__(
        self,
        streams: Any,
        batch_size: int = 256,
        *,
        mode: Any = Sampler.Mode.CYCLIC,
        seed: int = 0,
        transform: Optional[Callable[[Dict[str, Any]], Any]] = None,
        workers: Optional[int] = None,
        prefetch: int = 4,
        shard: Optional[Sequence[int]] = None,
        step: int = 0,
        out: Optional[Mapping[str, Sequence[np.ndarray]]] = None,
        ragged: str = "list",
        stop_after: Optional[int] = None,
    ) -> None:
        self._engine: Optional[Engine] = None
        self._failure: Optional[Tuple[int, BaseException]] = None
        if not isinstance(streams, Mixture):
            streams = _check_streams(streams)
        prefetch = _check_int("prefetch", prefetch, 1)
        workers = _default_worker_count() if workers is None else _check_int("workers", workers, 1)
        if workers > _WORKERS_MAX:
            raise ValueError(f"workers must be <= {_WORKERS_MAX}, got {workers}")
        if prefetch + workers > _WINDOW_MAX:
            raise ValueError(f"prefetch + workers must be <= {_WINDOW_MAX}, "
                             f"got {prefetch} + {workers}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable or None, got {transform!r}")
        if ragged not in ("list", "packed"):
            raise ValueError(f"ragged must be 'list' or 'packed', got {ragged!r}")
        if stop_after is not None:
            stop_after = _check_int("stop_after", stop_after, 0)
        _state.check_step("step", step)
        plan = Plan(streams, 0)
        if len(plan.columns) > _COLUMNS_MAX:
            raise ValueError(f"at most {_COLUMNS_MAX} streams, got {len(plan.columns)}")
        # The sampler checks batch_size, mode, seed, step and shard (and says
        # which value is wrong); the loader keeps its normalised values. A
        # mixture's sources are checked one by one (the Track).
        length = plan.lengths[0] if len(plan.lengths) == 1 else min(sum(plan.lengths), 2**63)
        sampler = Sampler(length, batch_size, mode, seed, step=step, shard=shard)
        plan = Plan(streams, sampler.seed)
        self._track = _state.Track(plan, sampler)
        base = self._track.start(sampler.step)
        self._plan = plan
        self._sampler = sampler
        self._prefetch, self._workers, self._stop_after = prefetch, workers, stop_after
        window = prefetch + workers
        first = {c.name: c.streams[0] for c in plan.columns}
        out_checked = _check_out(out, first, sampler.batch_size, window + 1)
        rank, world = sampler.shard
        cores = _default_worker_count()
        self._engine = Engine(
            plan, batch_size=sampler.batch_size, rank=rank, world=world, seed=sampler.seed,
            mode=int(sampler.mode), transform=transform, out=out_checked, workers=workers,
            window=window, base=base, packed=ragged == "packed",
            # With a thread per core, each gather runs on its own thread alone.
            lanes=1 if workers >= cores else 0)
        self._finalizer = weakref.finalize(self, Engine.shutdown, self._engine)

    # -- iteration ------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        engine = self._usable_engine()
        if self._stop_after is not None and engine.step_deliver >= self._stop_after:
            raise StopIteration
        step, batch, error = engine.take()
        if error is not None:
            self._failure = (step, error)
            self._finalizer()
            if isinstance(error, StopIteration):
                # Raised as is, it would end the caller's for loop as if the
                # data had run out (the reason for PEP 479).
                raise RuntimeError(f"the transform or a stream raised StopIteration building "
                                   f"step {step}; a DataLoader is endless (use stop_after= "
                                   "to end it)") from error
            raise error
        return batch

    def __len__(self) -> int:
        raise TypeError("DataLoader is endless and has no len(); count steps instead")

    def __bool__(self) -> bool:
        return True

    @property
    def step(self) -> int:
        """The step of the next batch ``next()`` will return."""
        return self._require_engine().step_deliver

    @property
    def position(self) -> int:
        """The global position of the next batch's first record (one-source
        CYCLIC: ``cycle * length + offset``, see the module docs)."""
        engine = self._require_engine()
        return engine.position_of(engine.step_deliver)

    @property
    def batch_size(self) -> int:
        """Records per batch on this rank."""
        return self._sampler.batch_size

    @property
    def shard(self) -> Tuple[int, int]:
        """``(rank, world)``; ``(0, 1)`` when not sharded."""
        return self._sampler.shard

    @property
    def workers(self) -> int:
        return self._workers

    @property
    def prefetch(self) -> int:
        return self._prefetch

    @property
    def sources(self) -> Optional[Dict[int, str]]:
        """A mixture's source ids (``batch["source"]``) -> names; None otherwise."""
        if self._plan.mixture is None:
            return None
        return dict(enumerate(self._plan.source_names))

    @property
    def steps_per_epoch(self) -> int:
        """Steps of one CYCLIC cycle through a one-source loader's records:
        ``length // (world * batch_size)``, exactly (each cycle serves that many
        whole batches and drops the rest of its records). In SEQUENTIAL and IID
        mode, a pass over the records is ``length / global batch`` steps; this
        is its whole part."""
        if self._plan.mixture is not None:
            raise TypeError("a Mixture has no single epoch: each source cycles on its own")
        return self._plan.lengths[0] // self._sampler.global_batch_size

    def epoch_of(self, step: int) -> int:
        """The CYCLIC cycle (epoch) `step`'s batch comes from (SEQUENTIAL, IID:
        the pass over the records its first record is in). Steps before this
        loader's start or last restore are counted as if this configuration
        had run from step 0."""
        _ = self.steps_per_epoch
        step = _check_int("step", step, 0)
        engine = self._require_engine()
        base = engine.base if step >= engine.base.step else self._track.start(0)
        return base.position_of(step) // self._plan.lengths[0]

    # -- checkpoints --------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """A small versioned dict from which ``load_state_dict`` resumes exactly
        (see the module docs and ``loaderx._state``)."""
        engine = self._require_engine()
        return _state.state_dict(self._plan, self._sampler, engine.base_at(engine.step_deliver))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at the state's position, discarding every prefetched batch.
        Raises ``ValueError`` (``TypeError`` for a wrongly typed field) when
        the state does not describe this loader's record sequence."""
        base = _state.load_state(state, self._plan, self._sampler, self._track)
        self._usable_engine().reset(base)

    # -- lifetime -----------------------------------------------------------------

    def close(self) -> None:
        """Stop and join the worker threads. Idempotent; any thread may call it."""
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer()

    @property
    def closed(self) -> bool:
        finalizer = getattr(self, "_finalizer", None)
        return finalizer is None or not finalizer.alive

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __del__(self) -> None:
        # The weakref finalizer also runs at interpreter exit; this makes the
        # garbage-collection path explicit and does nothing after close().
        self.close()

    def __reduce__(self):
        raise TypeError("a DataLoader cannot be pickled: its threads and prefetched batches "
                        "belong to this process. Build one DataLoader per process (stores and "
                        "ShardSets pickle as references, so pass those, or a function that builds "
                        "the loader)")

    def __repr__(self) -> str:
        if self._engine is None:
            return "DataLoader(<not constructed>)"
        streams = ", ".join(f"{c.name}: {c.kind}" for c in self._plan.columns)
        if self._failure is not None:
            state = f"failed at step {self._failure[0]}"
        elif self.closed:
            state = "closed"
        else:
            state = "open"
        sampler = self._sampler
        mixture = f", sources={self._plan.source_names}" if self._plan.mixture is not None else ""
        return (f"DataLoader({{{streams}}}{mixture}, batch_size={sampler.batch_size}, "
                f"mode={sampler.mode.name}, seed={sampler.seed}, shard={sampler.shard}, "
                f"workers={self._workers}, prefetch={self._prefetch}, step={self.step}, {state})")

    # -- helpers ------------------------------------------------------------------

    def _require_engine(self) -> Engine:
        engine = self._engine
        assert engine is not None, "DataLoader.__init__ did not finish"
        return engine

    def _usable_engine(self) -> Engine:
        engine = self._require_engine()
        if self._failure is not None:
            step, error = self._failure
            raise RuntimeError(f"DataLoader stopped after an error at step {step}: "
                               f"{type(error).__name__}: {error}") from error
        if self.closed:
            raise LoaderClosedError("DataLoader is closed")
        return engine
