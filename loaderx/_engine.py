"""The threads of one DataLoader: the native ring (`_pipeline.Ring`), which
computes every step's indices and builds every native column, and — only
where Python has work (Python-only streams, a transform) — Python worker
threads named ``loaderx-worker-N`` that take the ring's step, add the rest
and run the transform. Batches leave in step order, whatever the timing.

Workers hold a reference to the engine, never to the ``DataLoader``, so a
loader nobody references any more can be garbage collected (and its
finalizer can stop the threads).

Invariants, under ``lock``:
  * ``step_deliver <= step_claim <= step_deliver + window`` unless draining;
  * ``step_submit <= step_deliver + window``: the ring holds the submitted
    steps not yet taken back, their buffers in ``submitted``;
  * ``ready`` only holds steps in ``[step_deliver, step_claim)``;
  * ``in_flight`` counts claimed steps that Python workers build right now.
"""
from __future__ import annotations

import os
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import _buffers, _pipeline
from ._pipeline import Plan, Ring
from .errors import LoaderClosedError

#: How long ``close()`` waits for a worker that is inside a gather or transform.
JOIN_TIMEOUT_S = 10.0

# Engines of this process. A forked child inherits their memory but not
# their threads: it must never wait for, stop or free them (the native ring
# would join threads that do not exist there), so at fork the child marks
# them inherited and keeps their rings referenced for good.
_LIVE: "weakref.WeakSet[Engine]" = weakref.WeakSet()
_INHERITED: List[Any] = []
# The engine whose worker this thread is (a transform must not wait for its own engine).
_WORKER = threading.local()


def _after_fork_in_child() -> None:
    for engine in list(_LIVE):
        engine.inherited = True
        _INHERITED.append(engine.ring)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class StepBuffers:
    """What the ring writes for one step: the dense columns' arrays, the
    variable columns' sizes, and the step's indices and sources."""

    __slots__ = ("dense", "sizes", "dests", "indices", "sources")

    def __init__(self, dense: Dict[str, np.ndarray], sizes: Dict[str, np.ndarray],
                 dests: List[np.ndarray], indices: Optional[np.ndarray],
                 sources: Optional[np.ndarray]):
        self.dense = dense
        self.sizes = sizes
        self.dests = dests
        self.indices = indices
        self.sources = sources


class Engine:
    def __init__(self, plan: Plan, *, batch_size: int, rank: int, world: int, seed: int,
                 mode: int, transform: Optional[Callable[[Dict[str, Any]], Any]],
                 out: Dict[str, List[np.ndarray]], workers: int, window: int, base: Any,
                 packed: bool, lanes: int) -> None:
        self.plan = plan
        self.transform = transform
        self.out = out
        self.batch_size = batch_size
        self.ring_args = dict(batch_size=batch_size, rank=rank, world=world, seed=seed, mode=mode,
                              window=window, threads=workers, lanes=lanes)
        self.packed = packed
        self.python_work = bool(plan.python) or transform is not None
        # Indices for Python columns, and for naming records in the errors of
        # variable columns.
        self.want_indices = bool(plan.python) or any(c.kind != "dense" for c in plan.native)
        self.want_sources = plan.mixture is not None
        self.gather_kwargs = {"threads": lanes} if lanes else {}
        self.worker_count = workers
        self.window = window

        # One consumer at a time in take() and reset(): a step is taken
        # whole, and a take interrupted part-way (``torn``) is undone first.
        self.consumer = threading.Lock()
        self.torn = False
        self.lock = threading.Lock()
        # The consumer (and a draining reset) waits for finished batches on
        # ``waiter`` (see take_built); workers wait for room in the window.
        self.waiter: Optional[Any] = None
        self.room_changed = threading.Condition(self.lock)
        # Where the steps from base.step start (a loaderx._state.Base).
        self.base = base
        step = base.step
        self.step_claim = step
        self.step_deliver = step
        self.step_submit = step
        self.submitted: Dict[int, StepBuffers] = {}
        self.ready: Dict[int, Tuple[Any, Optional[BaseException]]] = {}
        self.in_flight = 0
        self.generation = 0
        self.draining = False
        self.closed = False
        self.started = False
        self.ring: Optional[Ring] = None
        self.threads: List[threading.Thread] = []
        self.inherited = False
        _LIVE.add(self)

    # -- consumer side ----------------------------------------------------------

    def start(self) -> None:
        """Start the ring and the worker threads (once). Caller holds ``lock``."""
        if self.started:
            return
        # Started only once the ring exists: a ring that fails to open (a
        # store closed before the first batch) raises again at the next try.
        self.ring = Ring(self.plan, base=self.base.at(self.step_submit), **self.ring_args)
        self.started = True
        if not self.python_work:
            return
        for worker_index in range(self.worker_count):
            thread = threading.Thread(target=_worker_main, args=(self, worker_index),
                                      name=f"loaderx-worker-{worker_index}", daemon=True)
            self.threads.append(thread)
            thread.start()

    def take(self) -> Tuple[int, Any, Optional[BaseException]]:
        """Wait for the next undelivered step and remove it from the buffer.
        One consumer at a time: concurrent callers take turns."""
        if self.inherited:
            raise RuntimeError("this DataLoader was built in another process (before a fork): "
                               "build one DataLoader per process")
        self.refuse_own_worker("next()")
        with self.consumer:
            if self.torn:
                # The last take stopped part-way (KeyboardInterrupt, a closed
                # loader): the step it held may be half taken. Going back to
                # the next undelivered step rebuilds it exactly.
                self.reset_locked(self.base_at(self.step_deliver))
            self.torn = True
            taken = self.take_locked()
            self.torn = False
            return taken

    def take_built(self, step: int) -> Tuple[int, Any, Optional[BaseException]]:
        """Step `step` from the workers, once built."""
        self.wait_for(lambda: step in self.ready, "DataLoader was closed while next() was waiting")
        with self.lock:  # (one consumer: nobody else pops the step meanwhile)
            if self.closed:
                raise LoaderClosedError("DataLoader is closed")
            batch, error = self.ready.pop(step)
            if error is None:
                self.step_deliver = step + 1
                self.room_changed.notify()  # one more step fits into the window
            return step, batch, error

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
                waiter = self.new_waiter()
            waiter.acquire()  # until finish() or shutdown() releases it

    def new_waiter(self) -> Any:
        """A locked lock that the next `wake_waiter` releases. Caller holds
        ``lock``. One slot: only the consumer waits (it holds ``consumer``),
        and a worker's finish() or shutdown() releases it from any thread."""
        waiter = threading.Lock()
        waiter.acquire()
        self.waiter = waiter
        return waiter

    def wake_waiter(self) -> None:
        """Caller holds ``lock``."""
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter.release()

    def take_locked(self) -> Tuple[int, Any, Optional[BaseException]]:
        """``take()`` for the caller that holds ``consumer``."""
        with self.lock:
            if self.closed:
                raise LoaderClosedError("DataLoader is closed")
            self.start()
            step = self.step_deliver
            if not self.python_work:
                # The consumer feeds the ring itself, up to the window.
                self.submit_until(step + self.window)
                bufs = self.submitted.pop(step)
                ring = self.ring
        if self.python_work:
            return self.take_built(step)
        assert ring is not None
        error, variable = ring.wait(step)
        batch = None
        if error is None:
            try:
                batch = self.native_batch(bufs, variable)
            except Exception as exc:  # a record that does not decode fails its step
                error = exc
        with self.lock:
            if self.closed:
                raise LoaderClosedError("DataLoader was closed while next() was waiting")
            if error is None:
                self.step_deliver = step + 1
        return step, batch, error

    def base_at(self, step: int) -> Any:
        """Where `step` (at or after the base's) starts: its Base."""
        return self.base.at(step)

    def position_of(self, step: int) -> int:
        """The global position of the first record of `step`."""
        return self.base.position_of(step)

    def reset(self, base: Any) -> None:
        """Drop everything prefetched and continue at `base` (its step, its
        first record's global position, and any cursors). Waits for the
        batches being built first, so none can still write into an output
        array the pool may hand out again."""
        self.refuse_own_worker("load_state_dict()")
        with self.consumer:
            self.reset_locked(base)

    def refuse_own_worker(self, call: str) -> None:
        """A worker thread of this engine must not wait for its own steps."""
        if getattr(_WORKER, "engine", None) is self:
            raise RuntimeError(
                f"{call} called from this DataLoader's own transform (or stream) on "
                f"{threading.current_thread().name}: it would wait for itself forever")

    def reset_locked(self, base: Any) -> None:
        """``reset()`` for the caller that holds ``consumer``. Interrupted
        part-way, it leaves the engine ``torn``: the next take resets again."""
        self.torn = True
        with self.lock:
            if self.closed:
                raise LoaderClosedError("DataLoader is closed")
            self.generation += 1
            self.ready.clear()
            self.draining = True
        self.wait_for(lambda: self.in_flight == 0, "DataLoader was closed during load_state_dict()")
        with self.lock:
            if self.closed:
                raise LoaderClosedError("DataLoader was closed during load_state_dict()")
            self.draining = False
            if self.ring is not None:
                self.ring.reset(base)
            self.submitted.clear()
            self.base = base
            self.step_submit = self.step_claim = self.step_deliver = base.step
            self.room_changed.notify_all()
        self.torn = False

    def shutdown(self) -> None:
        """Stop and join every thread. Idempotent; safe from any thread. In a
        forked child it only lets go (the threads are the parent's)."""
        if self.inherited:
            self.closed = True
            return
        with self.lock:
            self.closed = True
            self.ready.clear()
            self.wake_waiter()
            self.room_changed.notify_all()
            threads = list(self.threads)
            ring = self.ring
        # Outside the lock: a consumer blocked in the ring's wait returns now.
        if ring is not None:
            ring.close()
        current = threading.current_thread()
        alive = []
        for thread in threads:
            if thread is current:
                continue
            thread.join(JOIN_TIMEOUT_S)
            if thread.is_alive():
                alive.append(thread.name)
        if alive:
            warnings.warn(f"DataLoader.close(): {alive} still running a gather or transform after "
                          f"{JOIN_TIMEOUT_S:g} s; they will exit when it returns", RuntimeWarning,
                          stacklevel=3)

    # -- steps and their buffers (caller holds ``lock``) ------------------------

    def submit_until(self, stop: int) -> None:
        """Submit steps ``[step_submit, stop)`` to the ring with their buffers."""
        ring = self.ring
        assert ring is not None
        while self.step_submit < stop:
            step = self.step_submit
            bufs = self.step_buffers(step)
            ring.submit(step, bufs.dests, bufs.indices, bufs.sources)
            self.submitted[step] = bufs
            self.step_submit = step + 1

    def step_buffers(self, step: int) -> StepBuffers:
        n = self.batch_size
        dense, sizes, dests = {}, {}, []
        for col in self.plan.native:
            if col.kind == "dense":
                dense[col.name] = self.output_array(col, step)
                dests.append(dense[col.name])
            else:
                sizes[col.name] = np.empty(2 * n, np.uint64)
                dests.append(sizes[col.name])
        indices = np.empty(n, np.uint64) if self.want_indices else None
        sources = np.empty(n, np.uint16) if self.want_sources else None
        return StepBuffers(dense, sizes, dests, indices, sources)

    def output_array(self, col: _pipeline.Column, step: int) -> np.ndarray:
        """Where dense column `col` of ``step`` is gathered: the caller's
        ``out=`` buffer, or an array from the library's buffer pool
        (loaderx._buffers) whose block goes back to the pool once the ring
        and the consumer have both dropped it: no mmap and no page faults per
        batch in steady state, whatever the consumer keeps."""
        buffers = self.out.get(col.name)
        if buffers is not None:
            return buffers[step % len(buffers)]
        return _buffers.empty((self.batch_size,) + col.dense_shape, col.dtype)

    # -- assembling a batch ------------------------------------------------------

    def native_batch(self, bufs: StepBuffers,
                     variable: List[Optional[np.ndarray]]) -> Dict[str, Any]:
        """The batch dict of the native columns (in column order), plus
        ``source`` for a mixture. Variable columns are decoded here."""
        batch: Dict[str, Any] = {}
        for col, buf in zip(self.plan.native, variable):
            if col.kind == "dense":
                batch[col.name] = bufs.dense[col.name]
            else:
                assert buf is not None  # the ring hands every variable column a buffer
                assert bufs.indices is not None  # want_indices: variable columns need them
                batch[col.name] = _pipeline.decode_variable(col, buf, bufs.sizes[col.name],
                                                            bufs.indices, self.packed)
        if bufs.sources is not None:
            batch["source"] = bufs.sources.astype(np.int16)
        return batch

    def build(self, step: int, bufs: StepBuffers) -> Any:
        """A Python worker's step: the ring's columns, the Python columns at
        the ring's indices, in column order, then the transform."""
        assert self.ring is not None
        error, variable = self.ring.wait(step)
        if error is not None:
            raise error
        native = self.native_batch(bufs, variable)
        batch: Dict[str, Any] = {}
        for col in self.plan.columns:
            if col.native:
                batch[col.name] = native[col.name]
                continue
            out = None
            if col.kind == "dense":
                with self.lock:
                    out = self.output_array(col, step)
            assert bufs.indices is not None  # want_indices: Python columns need them
            batch[col.name] = _pipeline.python_column(col, bufs.indices, bufs.sources, out,
                                                      self.gather_kwargs, self.packed)
        if "source" in native:
            batch["source"] = native["source"]
        if self.transform is not None:
            return self.transform(batch)
        return batch

    # -- worker side ---------------------------------------------------------------

    def claim(self) -> Optional[Tuple[int, int, StepBuffers]]:
        """Wait for a step inside the window; ``None`` once closed. Claiming a
        step also submits it to the ring, so steps are submitted in order."""
        with self.lock:
            while not self.closed:
                if not self.draining and self.step_claim < self.step_deliver + self.window:
                    step = self.step_claim
                    self.step_claim = step + 1
                    self.in_flight += 1
                    self.submit_until(step + 1)
                    return step, self.generation, self.submitted.pop(step)
                self.room_changed.wait()
            return None

    def finish(self, step: int, generation: int, batch: Any,
               error: Optional[BaseException]) -> None:
        with self.lock:
            self.in_flight -= 1
            # A result from before a reset (or after close) is stale: drop it.
            if generation == self.generation and not self.closed:
                self.ready[step] = (batch, error)
            # Wake the consumer only for the step it waits on, and a draining
            # reset for every batch that leaves the builders.
            if step == self.step_deliver or self.draining:
                self.wake_waiter()


def _worker_main(engine: Engine, worker_index: int) -> None:
    _WORKER.engine = engine
    while True:
        claimed = engine.claim()
        if claimed is None:
            return
        step, generation, bufs = claimed
        batch: Any = None
        error: Optional[BaseException] = None
        try:
            batch = engine.build(step, bufs)
        except BaseException as exc:  # noqa: B036 - handed to the consumer, never dropped.
            error = exc
            if hasattr(exc, "add_note"):
                exc.add_note(f"(loaderx: raised in loaderx-worker-{worker_index} "
                             f"building step {step})")
        engine.finish(step, generation, batch, error)
        # Drop our references before waiting for the next claim, so the
        # memory bound counts only batches in the buffer or with the consumer.
        del batch, error, bufs
