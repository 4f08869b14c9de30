"""An endless, step-based, resumable batch loader over loaderx stores.

``DataLoader(streams, batch_size, ...)`` reads batches from *streams* — a dict
of name -> stream that share one index space, or a `loaderx.Mixture` of
several such sources mixed by weight — and hands them to the caller in step
order. A stream is a store (``DenseStore``, ``RaggedStore``, ``Zrecord``), a
``ShardSet`` of them, ``TokenWindows``, a plain numpy array (its rows, read
in memory, never written), or any object of the `loaderx.Stream` protocol
(``gather()`` and a ``kind``; see ``loaderx.streams`` for the optional
``native_parts``, ``native_windows`` and ``prefetch`` capabilities).

One step machine
    The native ring (``src/Loader.zig``) computes every step's indices once
    (one source's sampler, or a mixture's weighted draw) and builds every
    native stream's batch on library threads, up to ``prefetch + workers``
    steps ahead, with no Python and no GIL in between; ``next()`` is one
    native wait that hands a built step over, and one dict build. Python
    threads exist only to map a ``transform`` and Python-object streams over
    the ring's finished steps in order (``loaderx-worker-N``), and to call
    streams' ``prefetch`` hooks ahead of the ring (``loaderx-prefetch``).
    Threads, not processes: no pickling, no IPC, no ``/dev/shm``; the
    default thread count is the cores this process may run on
    (``sched_getaffinity``, as the library counts them).

Order and determinism
    The batch at step ``s`` is a pure function of ``(seed, s)`` (and the
    configuration): the same whatever the thread count, ``prefetch`` or
    timing. Steps cover a global stream of record positions: step ``s``
    holds positions ``[p_s, p_s + world * batch_size)``, and rank ``r`` of
    ``shard=(r, world)`` its slice ``[r * B, (r + 1) * B)``. The loader is
    endless unless ``stop_after`` is given; ``len()`` is not defined.

Output
    Dense streams give ``(batch_size, *item_shape)`` arrays; ragged streams a
    list of arrays (``ragged="packed"``: ``(values, row_splits)``); byte
    streams a list of bytes; a mixture adds ``batch["source"]`` (int16, ids
    of ``loader.sources``). The ``transform`` (collate) runs on the worker
    threads and may return anything.

Checkpoints and elastic resume
    ``state_dict()`` is a small, versioned dict of plain values (it pickles
    and round-trips through JSON)::

        {"version": 2, "seed": 0, "mode": "CYCLIC", "step": 1234, "position": 315904,
         "batch_size": 256, "shard": [rank, world], "lengths": {"x": 50000}, "sources": None}

    ``step`` is the next *undelivered* step (batches prefetched but not yet
    returned are not counted) and ``position`` the global record position of
    its first record. ``load_state_dict()`` checks the fields that define the
    record sequence (seed, mode, stream lengths, mixture sources and weights;
    a mismatch is a ``ValueError`` naming the field and both values), throws
    away whatever was prefetched, and continues at that position in O(1):
    with the same global batch (world * batch_size) on any number of ranks,
    the union over ranks of every later step equals the uninterrupted run's;
    with another global batch, CYCLIC and SEQUENTIAL continue the exact
    global record sequence (IID continues with fresh draws, as it draws by
    position). Version-1 states (step-based) are read too. The ``rank`` a
    state was saved on does not matter: every rank's state holds the same
    global position.

Epochs for people who count them
    ``steps_per_epoch`` is one CYCLIC cycle of a one-source loader (length /
    global batch, rounded up); ``epoch_of(step)`` the cycle a step starts in.
    ``stop_after=N`` ends iteration when ``step`` reaches ``N`` (an absolute
    step, so a resumed loader stops at the same place).

Errors
    An exception raised by a gather, a stream's ``prefetch`` hook or the
    ``transform`` while building step ``k`` is raised by the ``next()`` that
    would have returned step ``k``, as the original exception object (with a
    note naming the thread and step on Python 3.11+). After that the loader
    is stopped, and every later ``next()`` raises ``RuntimeError`` chained
    to it. A store closed under a running loader fails its next step with
    ``ClosedError``. A ``StopIteration`` from a transform or stream arrives
    as a ``RuntimeError`` (it would otherwise end a ``for`` loop silently).

Closing
    ``close()`` (also on leaving a ``with`` block, and as a fallback when the
    loader is garbage collected or the interpreter exits) stops and joins
    every thread; only then is the memory of the steps still in flight freed
    (a batch is the caller's from the moment ``next()`` returns it, and a
    step's memory is never freed while a library thread may write it). It
    is idempotent and may be called from any thread: a ``next()`` blocked in
    another thread then raises ``LoaderClosedError`` at once (a
    ``ClosedError`` and a ``RuntimeError``); so does any later ``next()``.

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

import numbers
import weakref
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple

import numpy as np

from loaderx import streams as _streams
from loaderx._loader import build_ring, check_options
from loaderx._pipeline import Plan
from loaderx._ring import Ring
from loaderx.errors import LoaderClosedError
from loaderx.mixture import Mixture
from loaderx.zsampler import Sampler

__all__ = ["DataLoader"]

#: Version of the dict written by ``DataLoader.state_dict()``.
STATE_VERSION = 2

_STATE_KEYS = {
    1: ("version", "seed", "mode", "step", "batch_size", "shard", "lengths"),
    2: ("version", "seed", "mode", "step", "position", "batch_size", "shard", "lengths", "sources"),
}

#: Steps are int64 (JSON- and checkpoint-friendly), with room for the window.
_STEP_MAX = 2**63 - 2**20
#: Global record positions (``step * batch_size * world`` from step 0) stay
#: below this, so every later position, and every state_dict(), fits 64 bits.
_POSITION_MAX = 2**63


def _is_int(value: Any) -> bool:
    """True for Python and numpy integers, but not for ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _check_int(name: str, value: Any, minimum: int) -> int:
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


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
        step: the first step to deliver (its first record at global position
            ``step * batch_size * world``).
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
        self._ring: Optional[Ring] = None
        self._failure: Optional[Tuple[int, BaseException]] = None
        if not isinstance(streams, Mixture):
            streams = _streams.check_streams(streams)
        workers, prefetch = check_options(workers, prefetch, transform, ragged, _check_int)
        if stop_after is not None:
            stop_after = _check_int("stop_after", stop_after, 0)
        _check_step("step", step)
        # The sampler checks batch_size, mode, seed, step and shard (and says
        # which value is wrong); the loader keeps its normalised values.
        sampler = Sampler(Plan(streams, 0).lengths[0], batch_size, mode, seed, step=step,
                          shard=shard)
        position = sampler.step * sampler.global_batch_size
        if position > _POSITION_MAX:
            raise ValueError(
                f"step * batch_size * world (the first record's global position) must be "
                f"<= 2**63, got {sampler.step} * {sampler.batch_size} * {sampler.shard[1]}")
        self._plan = Plan(streams, sampler.seed)
        self._sampler = sampler
        self._prefetch, self._workers, self._stop_after = prefetch, workers, stop_after
        self._ring = build_ring(self._plan, sampler, position=position, workers=workers,
                                prefetch=prefetch, transform=transform, out=out, ragged=ragged)
        self._finalizer = weakref.finalize(self, Ring.shutdown, self._ring)

    # -- iteration ------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        ring = self._usable_ring()
        if self._stop_after is not None and ring.deliver >= self._stop_after:
            raise StopIteration
        step, batch, error = ring.take()
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
        return self._require_ring().deliver

    @property
    def position(self) -> int:
        """The global position of the next batch's first record."""
        ring = self._require_ring()
        return ring.position_of(ring.deliver)

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
        """Steps of one CYCLIC cycle through a one-source loader's records
        (length / global batch, rounded up)."""
        if self._plan.mixture is not None:
            raise TypeError("a Mixture has no single epoch: each source cycles on its own")
        return -(-self._plan.lengths[0] // self._sampler.global_batch_size)

    def epoch_of(self, step: int) -> int:
        """The CYCLIC cycle (epoch) that `step`'s first record belongs to."""
        _ = self.steps_per_epoch
        step = _check_int("step", step, 0)
        return self._require_ring().position_of(step) // self._plan.lengths[0]

    # -- checkpoints --------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """A small versioned dict from which ``load_state_dict`` resumes exactly."""
        rank, world = self._sampler.shard
        return {
            "version": STATE_VERSION,
            "seed": self._sampler.seed,
            "mode": self._sampler.mode.name,
            "step": self.step,
            "position": self.position,
            "batch_size": self._sampler.batch_size,
            "shard": [rank, world],
            "lengths": self._lengths_state(),
            "sources": self._sources_state(),
        }

    def _lengths_state(self) -> Dict[str, Any]:
        plan = self._plan
        if plan.mixture is None:
            return {c.name: plan.lengths[0] for c in plan.columns}
        return {name: {c.name: n for c in plan.columns}
                for name, n in zip(plan.source_names, plan.lengths)}

    def _sources_state(self) -> Optional[Dict[str, Any]]:
        plan = self._plan
        if plan.mixture is None:
            return None
        return {"names": list(plan.source_names), "weights": list(plan.weights)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at the state's position, discarding every prefetched batch.
        Raises ``ValueError`` (``TypeError`` for a wrongly typed field) when
        the state does not describe this loader's record sequence."""
        step, position = self._check_state(state)
        self._usable_ring().reset(step, position)

    def _check_state(self, state: Any) -> Tuple[int, int]:
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        version = state.get("version")
        if not _is_int(version) or version not in _STATE_KEYS:
            raise ValueError(f"unsupported DataLoader state version {version!r}; "
                             f"this loaderx reads versions {sorted(_STATE_KEYS)}")
        keys = _STATE_KEYS[version]
        missing = [key for key in keys if key not in state]
        if missing:
            raise ValueError(f"DataLoader state is missing {missing}")
        unknown = sorted(str(key) for key in state if key not in keys)
        if unknown:
            raise ValueError(f"DataLoader state has unknown keys {unknown}")
        _check_state_types(state)
        step = int(state["step"])
        _check_step("state step", step)
        shard = state["shard"]
        if version == 1:
            position = _check_position(step * int(state["batch_size"]) * int(shard[1]))
        else:
            position = _check_position(state["position"])
        _check_equal("mode", state["mode"], self._sampler.mode.name)
        _check_equal("seed", state["seed"], self._sampler.seed)
        self._check_lengths(state["lengths"])
        if version == 2:
            _check_equal("sources", state["sources"], self._sources_state())
        return step, position

    def _check_lengths(self, lengths: Mapping[str, Any]) -> None:
        own = self._lengths_state()
        if sorted(lengths) != sorted(own):
            raise ValueError(f"state streams {sorted(lengths)} differ from "
                             f"this loader's {sorted(own)}")
        for name, length in own.items():
            _check_equal(f"lengths[{name!r}]", lengths[name], length)

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
        if self._ring is None:
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

    def _require_ring(self) -> Ring:
        ring = self._ring
        assert ring is not None, "DataLoader.__init__ did not finish"
        return ring

    def _usable_ring(self) -> Ring:
        ring = self._require_ring()
        if self._failure is not None:
            step, error = self._failure
            raise RuntimeError(f"DataLoader stopped after an error at step {step}: "
                               f"{type(error).__name__}: {error}") from error
        if self.closed:
            raise LoaderClosedError("DataLoader is closed")
        return ring


def _check_state_types(state: Mapping[str, Any]) -> None:
    step = state["step"]
    if not _is_int(step) or step < 0:
        raise TypeError(f"state step must be an int >= 0, got {step!r}")
    for key in ("seed", "batch_size"):
        if not _is_int(state[key]):
            raise TypeError(f"state {key} must be an int, got {state[key]!r}")
    if state["batch_size"] < 1:
        raise ValueError(f"state batch_size must be >= 1, got {state['batch_size']!r}")
    if not isinstance(state["mode"], str):
        raise TypeError(f"state mode must be a str, got {state['mode']!r}")
    shard = state["shard"]
    if (isinstance(shard, (str, bytes)) or not isinstance(shard, Sequence) or len(shard) != 2
            or not all(_is_int(value) for value in shard) or not 0 <= shard[0] < shard[1]):
        raise TypeError(f"state shard must be [rank, world], got {shard!r}")
    lengths = state["lengths"]
    if not isinstance(lengths, Mapping) or not all(isinstance(name, str) for name in lengths):
        raise TypeError(f"state lengths must be a dict of str -> int, got {lengths!r}")


def _check_position(position: Any) -> int:
    if not _is_int(position) or position < 0:
        raise TypeError(f"state position must be an int >= 0, got {position!r}")
    if position > _POSITION_MAX:
        raise ValueError(f"state position must be <= 2**63, got {position}")
    return int(position)


def _check_step(field: str, step: Any) -> None:
    """The upper bound of a step (the sampler refuses negative ones)."""
    if _is_int(step) and step > _STEP_MAX:
        raise ValueError(f"{field} must be in [0, {_STEP_MAX}], got {step}")


def _check_equal(field: str, state_value: Any, own_value: Any) -> None:
    if state_value != own_value:
        raise ValueError(f"state {field} is {state_value!r} but this loader has {own_value!r}")
