"""The Python stage of a DataLoader whose batches need Python (a transform,
or streams that are Python objects): ``workers`` threads named
``loaderx-worker-N`` map that work over the native ring's steps, in step
order. A worker claims the next step of the window, takes it from the ring
(one native wait, the GIL released; the ring computed its indices and built
its native columns), gathers the Python columns at those indices, runs the
transform and leaves the result for the consumer, who takes results in step
order. The ring is gated: a claim releases its step to the ring (unless a
prefetcher does), so at most ``window`` steps are in the ring and the stage
together.

Workers hold the ring, never the ``DataLoader``, so a loader nobody
references any more can be garbage collected (and its finalizer can stop
them).

Invariants, under ``lock``:
  * ``ring.deliver <= claim <= ring.deliver + window`` unless draining;
  * ``ready`` only holds steps in ``[ring.deliver, claim)``;
  * ``in_flight`` counts claimed steps that workers build right now.
"""
from __future__ import annotations

import inspect
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import _buffers, _pipeline
from ._ring import _OWN, Kick, Ring
from .errors import LoaderClosedError


class Workers:
    def __init__(self, ring: Ring, *, transform: Optional[Callable[[Dict[str, Any]], Any]],
                 workers: int, gather_kwargs: Dict[str, Any]) -> None:
        self.ring = ring
        self.plan = ring.plan
        self.transform = transform
        self.rng_transform = takes_rng(transform)
        if self.rng_transform and any(c.name == "position" for c in self.plan.columns):
            raise ValueError("a transform(batch, rng) gets the records' global positions as "
                             "batch['position'], but a stream is named 'position'; rename it")
        self.worker_count = workers
        self.gather_kwargs = gather_kwargs
        self.lock = threading.Lock()
        # Wakes workers waiting for room in the window (see _ring.Kick: the
        # consumer wakes them, and nothing an interrupt cuts short there can
        # leave a lock held or a waiter released twice).
        self.room_changed = Kick()
        # The consumer (and a draining reset) waits on ``waiter`` (see wait_for).
        self.waiter: Optional[Any] = None
        self.claim = ring.deliver
        self.ready: Dict[int, Tuple[Any, Optional[BaseException]]] = {}
        self.in_flight = 0
        self.draining = False
        self.closed = False
        self.threads: List[threading.Thread] = []

    # -- the consumer (holds ring.consumer) ---------------------------------------------

    def next_locked(self) -> Tuple[int, Any, Optional[BaseException]]:
        """The next undelivered step, once a worker built it."""
        self.ring.ensure_open()  # raises to the caller: the next take tries again
        self.start()
        step = self.ring.deliver
        self.wait_for(lambda: step in self.ready, "DataLoader was closed while next() was waiting")
        with self.lock:  # (one consumer: nobody else pops the step meanwhile)
            if self.closed:
                raise LoaderClosedError("DataLoader is closed")
            batch, error = self.ready.pop(step)
            if error is None:
                self.ring.handed = (step, batch, error)  # (see Ring.handed)
                self.ring.delivered(step + 1)
                self.room_changed.wake()  # one more step fits into the window
        return step, batch, error

    def start(self) -> None:
        """Start the workers (once). A start cut short by an interrupt is
        finished by the next call, which starts the workers never launched
        (never one twice: an interrupted ``Thread.start()`` has usually
        spawned its thread already)."""
        with self.lock:
            if self.closed or len(self.threads) == self.worker_count:
                return
            while len(self.threads) < self.worker_count:
                worker_index = len(self.threads)
                thread = threading.Thread(target=_worker_main, args=(self, worker_index),
                                          name=f"loaderx-worker-{worker_index}", daemon=True)
                self.threads.append(thread)
                thread.start()

    def wait_for(self, condition: Callable[[], bool], closed_message: str) -> None:
        """Until `condition()` (called holding ``lock``) holds; LoaderClosedError
        on close. Waits with ``lock`` released: not in ``Condition.wait``, whose
        taking back of the lock a KeyboardInterrupt can cut short, so that the
        caller's ``with`` then releases the lock from under a worker. Here an
        interrupt lands while no lock is held, or in a ``with`` that has not
        taken it yet."""
        while True:
            with self.lock:
                if self.closed:
                    raise LoaderClosedError(closed_message)
                if condition():
                    return
                waiter = threading.Lock()
                waiter.acquire()
                # One slot: only the consumer waits (it holds ring.consumer).
                self.waiter = waiter
            waiter.acquire()  # until finish() or close() releases it

    def wake_waiter(self) -> None:
        """Caller holds ``lock``."""
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter.release()

    def drain(self, closed_message: str) -> None:
        """A reset begins: no more claims, nothing built so far is delivered,
        and the steps being built leave the workers first."""
        with self.lock:
            self.ready.clear()
            self.draining = True
        self.wait_for(lambda: self.in_flight == 0, closed_message)

    def resume(self, step: int) -> None:
        """The reset is done: continue claiming at `step`."""
        with self.lock:
            self.ready.clear()
            self.draining = False
            self.claim = step
            self.room_changed.wake(self.worker_count)

    def close(self) -> List[threading.Thread]:
        with self.lock:
            self.closed = True
            self.ready.clear()
            self.wake_waiter()
            self.room_changed.wake(self.worker_count)
            return list(self.threads)

    # -- the workers ------------------------------------------------------------------

    def claim_step(self) -> Optional[Tuple[int, int]]:
        """Wait for a step inside the window: ``(step, generation)``; None once
        closed. Claiming a step releases it to the ring (when no prefetcher
        does), so steps are released in order."""
        ring = self.ring
        while True:
            with self.lock:
                if self.closed:
                    return None
                if not self.draining and self.claim < ring.deliver + ring.window:
                    step, generation = self.claim, ring.generation
                    if ring.prefetcher is None:
                        ring.submit(step, generation)
                    self.claim = step + 1
                    self.in_flight += 1
                    return step, generation
            self.room_changed.sleep()

    def build(self, step: int, generation: int) -> Any:
        """A step's batch: the ring's columns, the Python columns at the ring's
        indices, in column order, then the transform."""
        native, indices, sources = self.ring.build(step, generation)
        batch: Dict[str, Any] = {}
        for col in self.plan.columns:
            if col.native:
                batch[col.name] = native[col.name]
                continue
            out = None
            if col.kind == "dense":
                out = self.output_array(col, step)
            assert indices is not None  # want_indices: Python columns need them
            batch[col.name] = _pipeline.python_column(
                col, indices, sources, out, self.gather_kwargs, self.ring.packed,
                image_key=(self.plan.image_seed, step, self.first_slot))
        if "source" in native:
            batch["source"] = native["source"]
        if self.transform is None:
            return batch
        if not self.rng_transform:
            return self.transform(batch)
        b = self.ring.batch_size
        first = self.ring.position_of(step) + self.first_slot
        batch["position"] = np.arange(first, first + b, dtype=np.int64)
        rng = np.random.default_rng([self.plan.image_seed, step, self.first_slot])
        with_rng: Any = self.transform
        return with_rng(batch, rng)

    @property
    def first_slot(self) -> int:
        """This rank's first record in the step's global batch."""
        return int(self.ring.config["rank"]) * self.ring.batch_size

    def output_array(self, col: _pipeline.Column, step: int) -> np.ndarray:
        """Where a Python dense column of `step` goes: the caller's ``out=``
        buffer, or pooled memory."""
        buffers = self.ring.out.get(col.name)
        if buffers is not None:
            return buffers[step % len(buffers)]
        return _buffers.empty((self.ring.batch_size,) + col.dense_shape, col.dtype)

    def finish(self, step: int, generation: int, batch: Any,
               error: Optional[BaseException]) -> None:
        with self.lock:
            self.in_flight -= 1
            # A result from before a reset (or after close) is stale: drop it.
            if generation == self.ring.generation and not self.draining and not self.closed:
                self.ready[step] = (batch, error)
            # Wake the consumer only for the step it waits on, and a draining
            # reset for every batch that leaves the workers.
            if step == self.ring.deliver or self.draining:
                self.wake_waiter()


def _worker_main(workers: Workers, worker_index: int) -> None:
    _OWN.ring = workers.ring
    while True:
        try:
            claimed = workers.claim_step()
        except LoaderClosedError:
            return
        if claimed is None:
            return
        step, generation = claimed
        batch: Any = None
        error: Optional[BaseException] = None
        try:
            batch = workers.build(step, generation)
        except BaseException as exc:  # noqa: B036 - handed to the consumer, never dropped.
            error = exc
            if hasattr(exc, "add_note"):
                exc.add_note(f"(loaderx: raised in loaderx-worker-{worker_index} "
                             f"building step {step})")
        workers.finish(step, generation, batch, error)
        # Drop our references before waiting for the next claim, so the
        # memory bound counts only batches in the buffer or with the consumer.
        del batch, error


def takes_rng(transform: Any) -> bool:
    """Whether `transform` takes a second required positional argument (the
    step's ``numpy.random.Generator``)."""
    if transform is None:
        return False
    try:
        params = inspect.signature(transform).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]
    return len(required) == 2
