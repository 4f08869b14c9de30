"""An endless, step-based, resumable batch loader over loaderx stores.

``DataLoader(streams, batch_size, ...)`` reads batches from *streams* — a dict
of name -> stream that share one index space, or a `loaderx.Mixture` of
several such sources mixed by weight — and hands them to the caller in step
order. A stream is a store (``DenseStore``, ``RaggedStore``, ``Zrecord``), a
``ShardSet`` of them, ``TokenWindows``, a `loaderx.select` view, a plain
numpy array (its rows, read in memory, never written), or any object of the
`loaderx.Stream` protocol (``gather()`` and a ``kind``; see
``loaderx.streams`` for the optional ``native_parts``, ``native_windows``,
``prefetch`` and ``fingerprint``).

One step machine
    The native ring (``src/Loader.zig``) computes every step's indices once
    (one source's sampler, or a mixture's weighted draw) and builds every
    native stream's batch on library threads, up to ``prefetch + workers``
    steps ahead, with no Python and no GIL in between; ``next()`` is one
    native wait that hands a built step over, and one dict build. Python
    threads exist only to map a ``transform`` and Python-object streams over
    the ring's finished steps in order (``loaderx-worker-N``), and to call
    streams' ``prefetch`` hooks ahead of the ring (``loaderx-prefetch``, in
    runs of steps once half the window is free; a stream with
    ``prefetch_warm``, as loaderx's remote stores have, costs one call a run
    while the run is cached), within ``prefetch_bytes`` bytes of steps not
    yet delivered when given (a step's bytes: each hooked stream's
    ``prefetch_size(indices)``, else its record size times records; a step
    larger than the budget is prefetched alone). Threads, not processes: no
    pickling, no IPC, no ``/dev/shm``;
    the default thread count is the cores this process may run on.

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
    Dense streams give ``(batch_size, *item_shape)`` C-contiguous arrays
    (``torch.from_numpy``, ``np.from_dlpack``, ``jax.device_put`` take them
    without a copy); ragged streams a list of arrays (``packed=True``:
    ``(values, row_splits)``); byte streams a list of bytes; a mixture adds
    ``batch["source"]`` (int16, ids of ``loader.sources``). The
    ``transform`` (collate) runs on the worker threads and may return
    anything. ``out={name: [buf0, buf1, ...]}`` gathers a dense stream into
    preallocated memory (e.g. pinned host memory): writable C-contiguous
    arrays of the stream's dtype and shape ``(batch_size, *item_shape)``
    that do not overlap, at least ``prefetch + workers + 1`` of them; step
    ``s`` is gathered into ``bufs[s % len(bufs)]``, which stays valid until
    ``len(bufs) - prefetch - workers`` further batches were taken (a
    ``load_state_dict()`` invalidates every batch delivered before it).

Checkpoints and elastic resume
    ``state_dict()`` is a small, versioned dict of plain values (it pickles
    and round-trips through JSON; ``loaderx._state`` describes it in full)::

        {"version": 3, "seed": 0, "mode": "CYCLIC", "step": 1234, "position": 315904,
         "batch_size": 256, "shard": [rank, world], "lengths": {"x": 50000},
         "sources": None, "cursors": None, "fingerprints": {"x": None}}

    ``step`` is the next *undelivered* step and ``position`` the global
    position of its first record (one-source CYCLIC: ``cycle * length +
    offset``); a CYCLIC mixture adds each source's ``cursors``, and
    ``fingerprints`` each stream's ``fingerprint`` (the record set it reads).
    ``load_state_dict()`` checks every field that defines the record
    sequence (a mismatch is a ``ValueError`` naming the field and both
    values), drops whatever was prefetched and continues in O(1): with the
    same global batch on any number of ranks, the union over ranks of every
    later step equals the uninterrupted run's. With another global batch,
    SEQUENTIAL continues the record sequence, IID draws afresh, and CYCLIC
    finishes the cycle it stopped in with whole new batches and goes on with
    whole cycles (no record repeats within a cycle). States of versions 1
    and 2 (before CYCLIC dropped each cycle's rest) are refused with the
    reason. Every rank's state holds the same global position.

Epochs for people who count them
    ``steps_per_epoch`` is one CYCLIC cycle of a one-source loader: ``length
    // (world * batch_size)`` steps, exactly (the cycle's rest is dropped);
    ``epoch_of(step)`` the cycle a step's batch comes from. ``stop_after=N``
    ends iteration when ``step`` reaches ``N`` (an absolute step, so a
    resumed loader stops at the same place).

Errors
    An exception raised by a gather, a stream's ``prefetch`` hook or the
    ``transform`` while building step ``k`` is raised by the ``next()`` that
    would have returned step ``k``, as the original exception object (with a
    note naming the thread and step on Python 3.11+). After that the loader
    is stopped, and every later ``next()`` raises ``RuntimeError`` chained
    to it. A store closed under a running loader fails its next step with
    ``ClosedError``. A ``StopIteration`` from a transform or stream arrives
    as a ``RuntimeError`` (it would otherwise end a ``for`` loop silently).

Closing and threads
    ``close()`` (also on leaving a ``with`` block, and as a fallback when the
    loader is garbage collected or the interpreter exits) stops and joins
    every thread; only then is the memory of the steps in flight freed (a
    batch is the caller's from the moment ``next()`` returns it). It is
    idempotent and may come from any thread at any time: a ``next()``
    blocked in another thread then raises ``LoaderClosedError`` (a
    ``ClosedError`` and a ``RuntimeError``), as does any later ``next()``.
    ``next()``, ``state_dict()`` and ``load_state_dict()`` are meant for one
    consumer thread; concurrent ``next()`` callers take turns (each step
    goes to one of them). A ``next()`` cut short by an exception (a
    KeyboardInterrupt) delivers nothing: the next call returns that step.
    Calling ``next()`` or ``load_state_dict()`` from the loader's own
    transform is a RuntimeError.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Sequence, Tuple

import numpy as np

from loaderx import _state
from loaderx._loader import build_ring, check_int, check_options, legacy_arguments, plan_of
from loaderx._sampler177 import Sampler177, remap177
from loaderx._ring import Ring
from loaderx._store import deprecated
from loaderx.errors import LoaderClosedError
from loaderx.zsampler import Sampler

__all__ = ["DataLoader"]

#: Version of the dict written by ``DataLoader.state_dict()``.
STATE_VERSION = _state.STATE_VERSION
#: The defaults of the keywords the original's positional order can also give.
_DEFAULTS: Dict[str, Any] = {"mode": Sampler.Mode.CYCLIC, "seed": None, "transform": None,
                             "workers": None, "prefetch": 4, "num_workers": None,
                             "prefetch_size": None}


class DataLoader:
    """An endless iterator of batches (see the module docs).

    Args:
        streams: name -> stream (all of the same non-zero length, gathered at
            the same indices), or a `loaderx.Mixture` of such sources.
        batch_size: records per batch on this rank (the global batch is
            ``batch_size * world``).
        mode: sampling order, a ``Sampler.Mode`` or its name.
        transform: called on the worker threads with each batch dict; its
            return value is what ``next()`` yields.
        workers: threads, 1..256; default: the cores this process may use.
        prefetch: >= 1; the loader works at most ``prefetch + workers`` steps
            (at most 65536) ahead of the next undelivered one.
        prefetch_bytes: bytes the streams' ``prefetch`` hooks may hold ahead
            of the consumer (steps prefetched, not yet delivered); None: only
            the step window bounds them (see the module docs).
        seed: sampler seed (None: 0; 42, the original's, with ``sampler="1.7.7"``).
        shard: ``(rank, world)`` for multi-process training, or ``None``.
        step: the first step to deliver, as if the loader had run from step 0
            (O(1): nothing is replayed).
        out: recycled output buffers for dense streams (see the module docs).
        packed: False: a ragged stream's batch is a list of arrays (a bytes
            stream's a list of bytes); True: ``(values, row_splits)``, as
            ``store.gather(indices, packed=True)`` gives it.
        ragged: deprecated; ``ragged="packed"`` is ``packed=True``.
        stop_after: end iteration when ``step`` reaches this step; None: endless.
        sampler: None (loaderx's sampler) or ``"1.7.7"``: the original loaderx
            1.7.7's index sequence for ``mode`` and ``seed``, exactly, so a run
            started there continues here (``loaderx._sampler177``; one source,
            no ``shard``).

    The original loaderx's spellings work too: ``num_workers=`` (``workers``),
    ``prefetch_size=`` (``prefetch``), and its positional order
    ``DataLoader(streams, num_workers, batch_size, prefetch_size, mode, seed,
    transform)`` when two or more arguments follow `streams` (one is
    ``batch_size``, as above).
    """

    def __init__(
        self,
        streams: Any,
        batch_size: int = 256,
        *legacy: Any,
        mode: Any = Sampler.Mode.CYCLIC,
        seed: Optional[int] = None,
        transform: Optional[Callable[[Dict[str, Any]], Any]] = None,
        workers: Optional[int] = None,
        prefetch: int = 4,
        prefetch_bytes: Optional[int] = None,
        shard: Optional[Sequence[int]] = None,
        step: int = 0,
        out: Optional[Mapping[str, Sequence[np.ndarray]]] = None,
        packed: bool = False,
        stop_after: Optional[int] = None,
        ragged: Optional[str] = None,
        sampler: Optional[str] = None,
        num_workers: Optional[int] = None,
        prefetch_size: Optional[int] = None,
        image: Optional[Mapping[str, Any]] = None,
    ) -> None:
        args = legacy_arguments(batch_size, legacy, {
            "mode": mode, "seed": seed, "transform": transform, "workers": workers,
            "prefetch": prefetch, "num_workers": num_workers, "prefetch_size": prefetch_size},
            _DEFAULTS)
        batch_size, mode, seed = args["batch_size"], args["mode"], args["seed"]
        transform, workers, prefetch = args["transform"], args["workers"], args["prefetch"]
        self._compat: Optional[Sampler177] = None
        if sampler is not None:
            if shard is not None:
                raise ValueError("sampler='1.7.7' is one process's sequence (the original "
                                 "had no shard=)")
            streams, self._compat = remap177(sampler, streams, batch_size, mode, seed)
            mode, seed = Sampler.Mode.SEQUENTIAL, self._compat.seed
        seed = 0 if seed is None else seed
        if type(packed) is not bool:
            raise TypeError(f"packed must be True or False, got {packed!r}")
        if ragged is None:
            ragged = "packed" if packed else "list"
        else:
            deprecated(f"DataLoader(ragged={ragged!r})", f"DataLoader(packed={ragged == 'packed'})")
            if packed and ragged != "packed":
                raise ValueError(f"packed=True and ragged={ragged!r} disagree; pass packed only")
        self._ring: Optional[Ring] = None
        self._failure: Optional[Tuple[int, BaseException]] = None
        self._options = check_options(workers, prefetch, prefetch_bytes, stop_after, transform,
                                      ragged)
        self._plan, self._sampler, self._track = plan_of(streams, batch_size, mode, seed, step,
                                                         shard, image)
        self._ring = build_ring(self._plan, self._sampler, self._options,
                                base=self._track.start(self._sampler.step), transform=transform,
                                out=out, ragged=ragged)
        self._finalizer = weakref.finalize(self, Ring.shutdown, self._ring)

    # -- iteration ------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        ring = self._usable_ring()
        stop_after = self._options.stop_after
        if stop_after is not None and ring.next_step >= stop_after:
            raise StopIteration
        if ring.deliver >= ring.last and ring.next_step >= ring.last:
            # The state after this step would be one load_state_dict refuses.
            raise OverflowError(f"the loader is at step {ring.last}: the state after it would "
                                f"be past what a state_dict records (step <= {_state.STEP_MAX}, "
                                "global position <= 2**63), so it takes no more steps; start "
                                "again from step 0 (or with another seed)")
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

    def stats(self) -> Dict[str, int]:
        """What the loader did besides batches: ``images_skipped``, the image
        records replaced by another of their batch (``Decode(on_error="skip")``)
        in the steps built so far."""
        ring = self._require_ring()
        with ring.lock:
            return {"images_skipped": ring.images_skipped}

    def __bool__(self) -> bool:
        return True

    @property
    def step(self) -> int:
        """The step of the next batch ``next()`` will return."""
        return self._require_ring().next_step

    @property
    def position(self) -> int:
        """The global position of the next batch's first record (one-source
        CYCLIC: ``cycle * length + offset``, see the module docs)."""
        ring = self._require_ring()
        return ring.position_of(ring.next_step)

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
        return self._options.workers

    @property
    def prefetch(self) -> int:
        return self._options.prefetch

    @property
    def prefetch_bytes(self) -> Optional[int]:
        return self._options.prefetch_bytes

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
        if self._compat is not None:  # 1.7.7's cycle (or pass) over the records
            return self._compat.steps_per_cycle if self._compat.mode == 2 \
                else self._compat.length // self._compat.batch_size
        return self._plan.lengths[0] // self._sampler.global_batch_size

    def epoch_of(self, step: int) -> int:
        """The CYCLIC cycle (epoch) `step`'s batch comes from (SEQUENTIAL, IID:
        the pass over the records its first record is in). Steps before this
        loader's start or last restore are counted as if this configuration
        had run from step 0."""
        per_epoch = self.steps_per_epoch
        step = check_int("step", step, 0)
        if self._compat is not None:
            return step // max(1, per_epoch)
        ring = self._require_ring()
        base = ring.base if step >= ring.base.step else self._track.start(0)
        return base.position_of(step) // self._plan.lengths[0]

    # -- checkpoints --------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """A small versioned dict from which ``load_state_dict`` resumes exactly
        (see the module docs and ``loaderx._state``)."""
        ring = self._require_ring()
        return _state.state_dict(self._plan, self._sampler, ring.base_at(ring.next_step))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at the state's position, discarding every prefetched batch.
        Raises ``ValueError`` (``TypeError`` for a wrongly typed field) when
        the state does not describe this loader's record sequence."""
        base = _state.load_state(state, self._plan, self._sampler, self._track)
        self._usable_ring().reset(base)

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
                f"workers={self.workers}, prefetch={self.prefetch}, step={self.step}, {state})")

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

