"""An endless, step-based, resumable batch loader over loaderx stores.

``DataLoader`` reads batches from one or more stores (*streams*) that share an
index space, all gathered at the same indices, and hands them to the caller in
step order. It owns the threads that do the work and nothing else: the indices
come from one :class:`loaderx.zsampler.Sampler`, the bytes from the stores'
native ``gather``.

Threads, not processes
    No pickling, no IPC, no ``/dev/shm``, one copy of every open store. The
    default thread count is the number of cores this process may run on
    (``os.sched_getaffinity``), not ``os.cpu_count()``.

    ``DenseStore`` streams are built by a native prefetch ring
    (``src/Loader.zig``): library threads compute each step's indices and
    gather every dense stream into that step's output arrays, with no Python
    and no GIL between the two, and ``next()`` waits for its step once, with
    the GIL released. Every other stream (ragged and byte stores, or any other
    object with a ``gather`` and a ``kind``) and the ``transform`` run on
    Python threads named ``loaderx-worker-N``, which take the ring's arrays
    for their step and add the rest; the stores release the GIL inside their
    native ``gather``, so those threads also gather in parallel. A
    ``transform`` holds the GIL for whatever Python it runs, like any thread.
    Without such streams and without a transform there are no Python worker
    threads at all (measured: the loader's own cost fell from 55-145 us to
    ~40 us of CPU per batch, ``scripts/probe_loader_overhead.py``).

    The ring keeps the stores it reads open: a store closed by its owner
    while the loader runs is never unmapped under the threads; the first step
    built afterwards fails with ``ClosedError`` instead.

Order and determinism
    The batch at step ``s`` is ``{name: stores[name].gather(sampler.at(s))}``,
    passed through ``transform`` if one is given, and ``next()`` returns the
    batches strictly in step order. Worker threads claim step numbers, finished
    batches wait in a bounded reorder buffer, and the consumer takes step ``s``
    when it is ready, so the content of step ``s`` is the same whatever the
    thread count, ``prefetch`` or timing. The loader is endless: iteration never
    stops and ``len()`` is not defined; count steps instead.

Bounded memory
    The loader never works more than ``prefetch + workers`` steps ahead of the
    next undelivered one, so at most ``prefetch + workers`` batches are alive
    inside it (finished and waiting, or being built), plus the ones the caller
    still holds. Threads start at the first ``next()``, so a loader that is
    restored before it is iterated does no wasted work.

Checkpoints
    ``state_dict()`` is a small, versioned dict of plain Python values (it
    pickles, and it round-trips through JSON)::

        {"version": 1, "seed": 0, "mode": "CYCLIC", "step": 1234,
         "batch_size": 256, "shard": [rank, world], "lengths": {"x": 50000}}

    ``step`` is the step of the next *undelivered* batch: batches prefetched
    but not yet returned by ``next()`` are not counted, so a checkpoint taken
    with batches in flight is exact. ``load_state_dict()`` checks every field
    against this loader (a different batch size, mode, seed, shard or stream
    length is refused with a ``ValueError`` naming the field and both values),
    throws away whatever was prefetched, and resumes at exactly that step in
    O(1): the sampler is a pure function of ``(seed, step)``, nothing is
    replayed. A state from a different world size is refused: the global batch
    would change, so no exact continuation exists. ``DataLoader(..., step=s)``
    starts at step ``s`` directly.

Errors
    An exception raised by a gather or by ``transform`` while building step
    ``k`` is raised by the ``next()`` call that would have returned step ``k``,
    as the original exception object: its traceback runs through the worker
    frame where it happened (and, on Python 3.11+, a note names the thread and
    the step). After that the loader is stopped, and every later ``next()``
    raises ``RuntimeError`` chained to the original error.

Closing
    ``close()`` (also on leaving a ``with`` block, and as a fallback when the
    loader is garbage collected or the interpreter exits) stops and joins every
    worker thread. It is idempotent and may be called from any thread: a
    ``next()`` blocked in another thread then raises ``RuntimeError`` at once. A
    worker in the middle of a gather or transform finishes that one call
    first, since Python cannot interrupt it.

Thread safety
    ``next()``, ``state_dict()`` and ``load_state_dict()`` are meant for one
    consumer thread; ``close()`` may come from any thread at any time.

Framework hand-off (zero-copy)
    Dense streams arrive as C-contiguous numpy arrays, which frameworks take
    without a copy: ``torch.from_numpy(batch["x"])``,
    ``np.from_dlpack(batch["x"])``, ``jax.dlpack.from_dlpack(batch["x"])`` (or
    ``jax.device_put`` to copy straight to an accelerator). Ragged streams
    arrive as lists of arrays, byte stores as lists of ``bytes``; a
    ``transform`` can pad or pack them on the worker threads.

Recycled output buffers (``out=``)
    To gather straight into preallocated memory (for example pinned host
    memory that a framework copies to the device asynchronously), pass
    ``out={name: [buf0, buf1, ...]}`` for dense streams. Each buffer must be a
    writable C-contiguous array of the store's dtype with shape
    ``(batch_size, *item_shape)``; the buffers must not overlap, and there must
    be at least ``prefetch + workers + 1`` of them. Step ``s`` is gathered into
    ``bufs[s % len(bufs)]`` and the delivered array *is* that buffer. The
    contract: a delivered batch stays valid until the consumer has taken
    ``len(bufs) - prefetch - workers`` further batches (with the minimum list
    length: until the next ``next()`` returns). ``load_state_dict()``
    invalidates every batch delivered before it.
"""

from __future__ import annotations

import collections
import numbers
import os
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from loaderx import _lib
from loaderx._lib import ffi, lib
from loaderx._store import Store as _Store
from loaderx.dense import DenseStore
from loaderx.zsampler import Sampler

# Reference counts prove an output array is free only where they are exact
# (not on free-threaded builds, whose counts are biased and deferred).
_REFCOUNT_EXACT = getattr(sys, "_is_gil_enabled", lambda: True)()

__all__ = ["DataLoader"]

#: Version of the dict written by ``DataLoader.state_dict()``.
STATE_VERSION = 1

_STATE_KEYS = ("version", "seed", "mode", "step", "batch_size", "shard", "lengths")
_STORE_KINDS = ("dense", "ragged", "bytes")

#: Bounds of the native prefetch ring (``src/Loader.zig``): threads, steps in
#: flight (prefetch + workers) and DenseStore streams.
_WORKERS_MAX = _lib._abi.LOADER_THREADS_MAX
_WINDOW_MAX = _lib._abi.LOADER_WINDOW_MAX
_RING_STREAMS_MAX = _lib._abi.LOADER_STREAMS_MAX

#: How long ``close()`` waits for a worker that is inside a gather or transform.
_JOIN_TIMEOUT_S = 10.0


def _default_worker_count() -> int:
    """The number of cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no affinity mask.
        return os.cpu_count() or 1


def _is_int(value: Any) -> bool:
    """True for Python and numpy integers, but not for ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


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
            raise ValueError(f"stream {name!r} is empty (len 0): nothing to load")
    return dict(streams)


def _check_out(
    out: Any, streams: Mapping[str, Any], batch_size: int, buffer_count_min: int
) -> Dict[str, List[np.ndarray]]:
    """Check the recycled output buffers against the dense streams they fill."""
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


class _Ring:
    """The native prefetch ring (``src/Loader.zig``) for a loader's
    ``DenseStore`` streams: library threads compute each step's indices and
    gather every one of these streams into buffers submitted here, with no
    Python (and no GIL) between a step's submission and its finished arrays.

    Steps are submitted in order with one buffer per stream; ``wait(step)``
    releases the GIL until the step is built. The native side retains the
    stores, so closing one while the ring runs fails the next step with
    ``ClosedError`` rather than unmapping memory under the threads.
    """

    def __init__(self, stores: Sequence[Any], sampler: Sampler, window: int, threads: int,
                 lanes: int, step: int) -> None:
        self.stores = list(stores)
        count = len(self.stores)
        handles = ffi.new("lx_store *[]", [store._h() for store in self.stores])
        sizes = ffi.new("uint64_t[]", [store.record_bytes for store in self.stores])
        rank, world = sampler.shard
        out = ffi.new("lx_loader **")
        _lib.check(lib.lx_loader_open(
            handles, sizes, count, sampler.length, sampler.batch_size, int(sampler.mode), sampler.seed,
            rank, world, step, window, threads, lanes, out), None, "DataLoader")
        self.handle = ffi.gc(out[0], lib.lx_loader_free)
        self._dests = ffi.new("uint8_t *[]", count)
        self._failed = ffi.new("uint32_t *")
        # Threads inside lx_loader_wait: close() frees the ring (and lets go
        # of the stores) only once none is left.
        self._users = 0
        self._users_changed = threading.Condition(threading.Lock())
        self._closed = False

    def submit(self, step: int, arrays: Sequence[np.ndarray]) -> None:
        """Caller holds the engine's lock and has checked it is not closed."""
        dests = self._dests
        for position, array in enumerate(arrays):
            dests[position] = ffi.cast("uint8_t *", array.__array_interface__["data"][0])
        _lib.check(lib.lx_loader_submit(self.handle, step, dests), None, "DataLoader")

    def wait(self, step: int) -> Optional[BaseException]:
        """Blocks (GIL released) until ``step`` is built; its error, if any."""
        with self._users_changed:
            if self._closed:
                return RuntimeError("DataLoader is closed")
            self._users += 1
        try:
            rc = lib.lx_loader_wait(self.handle, step, self._failed)
            if rc == _lib.LX_OK:
                return None
            failed = self._failed[0]
            store = self.stores[failed] if failed < len(self.stores) else None
            error = _lib.error_for(rc, getattr(store, "path", None), "gather")
        finally:
            with self._users_changed:
                self._users -= 1
                self._users_changed.notify_all()
        if hasattr(error, "add_note"):
            error.add_note(f"(loaderx: raised by the native prefetch ring building step {step})")
        return error

    def reset(self, step: int) -> None:
        """Caller holds the engine's lock and has checked it is not closed."""
        lib.lx_loader_reset(self.handle, step)

    def close(self) -> None:
        """Stop the threads, wait for every waiter to leave, free the ring."""
        with self._users_changed:
            if self._closed:
                return
            self._closed = True
        lib.lx_loader_stop(self.handle)  # wakes every waiter with "closed"
        with self._users_changed:
            while self._users:
                self._users_changed.wait()
        ffi.release(self.handle)


class _Engine:
    """The shared state of one loader's threads.

    Two stages build a batch. ``DenseStore`` streams go through the native
    prefetch ring (:class:`_Ring`). Every other stream (ragged, bytes, or any
    other object with the store interface) and the ``transform`` run on Python
    worker threads, which take the ring's arrays for their step and add the
    rest. Without such streams and without a transform there are no Python
    worker threads at all: the consumer submits steps to the ring and waits
    for the one it delivers.

    Workers hold a reference to the engine, never to the ``DataLoader``, so a
    loader nobody references any more can be garbage collected (and its
    finalizer can stop the threads).

    Invariants, under ``lock``:
      * ``step_deliver <= step_claim <= step_deliver + window`` unless draining;
      * with a ring, ``step_submit <= step_deliver + window``: the ring holds
        the submitted steps not yet taken back, their arrays in ``ring_arrays``;
      * ``ready`` only holds steps in ``[step_deliver, step_claim)``;
      * ``in_flight`` counts claimed steps that Python workers build right now.
    """

    def __init__(
        self,
        streams: Dict[str, Any],
        sampler: Sampler,
        transform: Optional[Callable[[Dict[str, Any]], Any]],
        out: Dict[str, List[np.ndarray]],
        worker_count: int,
        window: int,
        step: int,
    ) -> None:
        self.streams = streams
        self.sampler = sampler
        self.transform = transform
        self.out = out
        self.ring_names = [name for name, store in streams.items() if isinstance(store, DenseStore)]
        self.python_names = [name for name in streams if name not in self.ring_names]
        # Python workers run only where Python has work: other streams or a transform.
        self.staged = bool(self.python_names) or transform is not None
        self.ring: Optional[_Ring] = None
        self.ring_arrays: Dict[int, List[np.ndarray]] = {}
        # Dense output arrays kept for reuse once the consumer drops them.
        self.recycle: Dict[str, Any] = {}
        # Enough to cover every batch that can be alive at once (the window,
        # plus the one the consumer holds), so a free one is found in steady state.
        self.recycle_max = window + 2
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        # With a thread per core, each gather runs on its own thread alone
        # rather than fanning out and oversubscribing the cores.
        self.single_lane = worker_count >= cores
        self.gather_kwargs = {"threads": 1} if self.single_lane else {}
        self.worker_count = worker_count
        self.window = window

        self.lock = threading.Lock()
        # Consumers (and a draining load_state_dict) wait for finished batches;
        # workers wait for room in the window. Two conditions on one lock keep
        # each wake-up aimed at a thread that can act on it.
        self.ready_changed = threading.Condition(self.lock)
        self.room_changed = threading.Condition(self.lock)

        self.step_claim = step
        self.step_deliver = step
        self.step_submit = step
        self.ready: Dict[int, Tuple[Any, Optional[BaseException]]] = {}
        self.in_flight = 0
        self.generation = 0
        self.draining = False
        self.closed = False
        self.started = False
        self.threads: List[threading.Thread] = []

    # -- consumer side ----------------------------------------------------------

    def start(self) -> None:
        """Start the ring and the worker threads (once). Caller holds ``lock``."""
        if self.started:
            return
        self.started = True
        if self.ring_names:
            self.ring = _Ring(
                [self.streams[name] for name in self.ring_names],
                self.sampler,
                self.window,
                self.worker_count,
                1 if self.single_lane else 0,
                self.step_submit,
            )
        if not self.staged:
            return
        for worker_index in range(self.worker_count):
            thread = threading.Thread(
                target=_worker_main,
                args=(self, worker_index),
                name=f"loaderx-worker-{worker_index}",
                daemon=True,
            )
            self.threads.append(thread)
            thread.start()

    def take(self) -> Tuple[int, Any, Optional[BaseException]]:
        """Wait for the next undelivered step and remove it from the buffer."""
        with self.lock:
            if self.closed:
                raise RuntimeError("DataLoader is closed")
            self.start()
            step = self.step_deliver
            if not self.staged:
                # The consumer feeds the ring itself: everything up to the window.
                self.submit_until(step + self.window)
                arrays = self.ring_arrays.pop(step)
            else:
                while step not in self.ready:
                    self.ready_changed.wait()
                    if self.closed:
                        raise RuntimeError("DataLoader was closed while next() was waiting")
                batch, error = self.ready.pop(step)
                if error is None:
                    self.step_deliver = step + 1
                    # One more step fits into the window now.
                    self.room_changed.notify()
                return step, batch, error
        assert self.ring is not None
        error = self.ring.wait(step)
        with self.lock:
            if self.closed:
                raise RuntimeError("DataLoader was closed while next() was waiting")
            if error is not None:
                return step, None, error
            self.step_deliver = step + 1
        return step, dict(zip(self.ring_names, arrays)), None

    def reset(self, step: int) -> None:
        """Drop everything prefetched and continue at ``step``.

        Waits for the batches being built to finish so that none of them can
        still be writing into a recycled output buffer, or be counted against
        the memory bound, once the new steps are claimed.
        """
        with self.lock:
            if self.closed:
                raise RuntimeError("DataLoader is closed")
            self.generation += 1
            self.ready.clear()
            self.draining = True
            while self.in_flight > 0 and not self.closed:
                self.ready_changed.wait()
            self.draining = False
            if self.ring is not None:
                self.ring.reset(step)
            self.ring_arrays.clear()
            self.step_submit = step
            self.step_claim = step
            self.step_deliver = step
            self.room_changed.notify_all()

    def shutdown(self) -> None:
        """Stop and join every thread. Idempotent; safe from any thread."""
        with self.lock:
            self.closed = True
            self.ready.clear()
            self.ready_changed.notify_all()
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
            thread.join(_JOIN_TIMEOUT_S)
            if thread.is_alive():
                alive.append(thread.name)
        if alive:
            warnings.warn(
                f"DataLoader.close(): {alive} still running a gather or transform after "
                f"{_JOIN_TIMEOUT_S:g} s; they will exit when it returns",
                RuntimeWarning,
                stacklevel=3,
            )

    # -- output arrays (caller holds ``lock``) -----------------------------------

    def submit_until(self, stop: int) -> None:
        """Submit steps ``[step_submit, stop)`` to the ring with their output arrays."""
        if self.ring is None:
            return
        while self.step_submit < stop:
            step = self.step_submit
            arrays = [self.output_array(name, step) for name in self.ring_names]
            self.ring.submit(step, arrays)
            self.ring_arrays[step] = arrays
            self.step_submit = step + 1

    def output_array(self, name: str, step: int) -> np.ndarray:
        """Where stream ``name`` of ``step`` is gathered: the caller's ``out=``
        buffer, a recycled array nobody holds, or a fresh one."""
        buffers = self.out.get(name)
        if buffers is not None:
            return buffers[step % len(buffers)]
        arr = self.recycled(name)
        if arr is None:
            store = self.streams[name]
            arr = np.empty((self.sampler.batch_size,) + tuple(store.item_shape), dtype=store.dtype)
        self.keep_for_recycling(name, arr)
        return arr

    def recycled(self, name: str) -> Optional[Any]:
        """A previously delivered output array of stream `name` that nobody
        holds any more (only this pool references it), or None.

        Fresh multi-MiB batch arrays cost page faults on every batch (the
        allocator hands freed ones back to the OS); reusing arrays the consumer
        has dropped avoids that. The reference count proves an array is free:
        a caller's variable, a view, a torch tensor from torch.from_numpy, all
        hold a reference. Off on free-threaded Python, where counts are not exact.
        """
        if not _REFCOUNT_EXACT:
            return None
        pool = self.recycle.setdefault(name, collections.deque())
        for _ in range(len(pool)):
            arr = pool.popleft()
            # References: the local name `arr` and getrefcount's argument.
            if sys.getrefcount(arr) <= 2:
                return arr
            pool.append(arr)
        return None

    def keep_for_recycling(self, name: str, arr: Any) -> None:
        pool = self.recycle.setdefault(name, collections.deque())
        pool.append(arr)
        while len(pool) > self.recycle_max:
            pool.popleft()

    # -- worker side --------------------------------------------------------------

    def claim(self) -> Optional[Tuple[int, int, List[np.ndarray]]]:
        """Wait for a step inside the window; ``None`` once the loader is closed.

        Claiming a step also submits it to the ring, so ring steps are
        submitted in step order."""
        with self.lock:
            while not self.closed:
                if not self.draining and self.step_claim < self.step_deliver + self.window:
                    step = self.step_claim
                    self.step_claim = step + 1
                    self.in_flight += 1
                    self.submit_until(step + 1)
                    return step, self.generation, self.ring_arrays.pop(step, [])
                self.room_changed.wait()
            return None

    def finish(self, step: int, generation: int, batch: Any, error: Optional[BaseException]) -> None:
        with self.lock:
            self.in_flight -= 1
            # A result from before a reset (or after close) is stale: drop it.
            if generation == self.generation and not self.closed:
                self.ready[step] = (batch, error)
            # Wake the consumer only for the step it waits on (a batch that
            # finishes ahead of an earlier one cannot be delivered yet), and a
            # draining reset for every batch that leaves the builders.
            if step == self.step_deliver or self.draining:
                self.ready_changed.notify_all()

    def build(self, step: int, ring_arrays: List[np.ndarray]) -> Any:
        """The ring's arrays of ``step`` plus every other stream, then transform."""
        if self.ring is not None:
            error = self.ring.wait(step)
            if error is not None:
                raise error
        from_ring = dict(zip(self.ring_names, ring_arrays))
        # Sampler.at() is pure and documented safe to call from any thread.
        indices = self.sampler.at(step) if self.python_names else None
        batch: Dict[str, Any] = {}
        for name, store in self.streams.items():
            if name in from_ring:
                batch[name] = from_ring[name]
                continue
            kw = self.gather_kwargs if isinstance(store, _Store) else {}
            if store.kind == "dense":
                # The same output arrays as the ring's: out= buffer, recycled or fresh.
                with self.lock:
                    out = self.output_array(name, step)
                batch[name] = store.gather(indices, out=out, **kw)
            else:
                batch[name] = store.gather(indices, **kw)
        if self.transform is not None:
            return self.transform(batch)
        return batch


def _worker_main(engine: _Engine, worker_index: int) -> None:
    while True:
        claimed = engine.claim()
        if claimed is None:
            return
        step, generation, ring_arrays = claimed
        batch: Any = None
        error: Optional[BaseException] = None
        try:
            batch = engine.build(step, ring_arrays)
        except BaseException as exc:  # noqa: B036 - handed to the consumer, never dropped.
            error = exc
            if hasattr(exc, "add_note"):
                exc.add_note(f"(loaderx: raised in loaderx-worker-{worker_index} building step {step})")
        engine.finish(step, generation, batch, error)
        # Drop our references before waiting for the next claim, so the
        # memory bound counts only batches in the buffer or with the consumer.
        del batch, error, ring_arrays


class DataLoader:
    """An endless iterator of batches gathered from equal-length stores.

    Args:
        streams: name -> store (``DenseStore``, ``RaggedStore`` or ``Zrecord``),
            all of the same non-zero length; every stream is gathered at the same
            indices and the batch is ``{name: gathered}``.
        batch_size: records per batch on this rank (the global batch is
            ``batch_size * world``).
        mode: sampling order, a ``Sampler.Mode`` or its name.
        seed: sampler seed.
        transform: called on the worker threads with each batch dict; its
            return value is what ``next()`` yields.
        workers: threads, 1..256; default: the cores this process may use.
            The ring runs this many library threads; Python worker threads
            (as many) start only for non-DenseStore streams or a transform.
        prefetch: >= 1; the loader works at most ``prefetch + workers`` steps
            (at most 65536) ahead of the next undelivered one (finished or
            being built).
        shard: ``(rank, world)`` for multi-process training, or ``None``.
        step: the first step to deliver.
        out: recycled output buffers for dense streams (see the module docs).
    """

    def __init__(
        self,
        streams: Mapping[str, Any],
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
    ) -> None:
        self._engine: Optional[_Engine] = None
        self._failure: Optional[Tuple[int, BaseException]] = None
        streams = _check_streams(streams)
        prefetch = _check_int("prefetch", prefetch, 1)
        workers = _default_worker_count() if workers is None else _check_int("workers", workers, 1)
        if workers > _WORKERS_MAX:
            raise ValueError(f"workers must be <= {_WORKERS_MAX}, got {workers}")
        if prefetch + workers > _WINDOW_MAX:
            raise ValueError(f"prefetch + workers must be <= {_WINDOW_MAX}, got {prefetch} + {workers}")
        dense_count = sum(isinstance(store, DenseStore) for store in streams.values())
        if dense_count > _RING_STREAMS_MAX:
            raise ValueError(f"at most {_RING_STREAMS_MAX} DenseStore streams, got {dense_count}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable or None, got {transform!r}")
        self._lengths = {name: len(store) for name, store in streams.items()}
        self._kinds = {name: store.kind for name, store in streams.items()}
        length = next(iter(self._lengths.values()))
        # The sampler checks batch_size, mode, seed, step and shard (and says
        # which value is wrong); the loader keeps its normalised values.
        _check_step("step", step)
        sampler = Sampler(length, batch_size, mode, seed, step=step, shard=shard)
        self._sampler = sampler
        self._prefetch = prefetch
        self._workers = workers
        window = prefetch + workers
        out_checked = _check_out(out, streams, sampler.batch_size, window + 1)
        self._engine = _Engine(streams, sampler, transform, out_checked, workers, window, sampler.step)
        self._finalizer = weakref.finalize(self, _Engine.shutdown, self._engine)

    # -- iteration ------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        engine = self._usable_engine()
        step, batch, error = engine.take()
        if error is not None:
            self._failure = (step, error)
            self._finalizer()
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
    def batch_size(self) -> int:
        """Records per batch on this rank."""
        return self._sampler.batch_size

    @property
    def shard(self) -> Tuple[int, int]:
        """``(rank, world)``; ``(0, 1)`` when not sharded."""
        return self._sampler.shard

    @property
    def workers(self) -> int:
        """The number of worker threads."""
        return self._workers

    @property
    def prefetch(self) -> int:
        """The ``prefetch`` this loader was built with."""
        return self._prefetch

    # -- checkpoints --------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """A small versioned dict from which ``load_state_dict`` resumes exactly."""
        rank, world = self._sampler.shard
        return {
            "version": STATE_VERSION,
            "seed": self._sampler.seed,
            "mode": self._sampler.mode.name,
            "step": self.step,
            "batch_size": self._sampler.batch_size,
            "shard": [rank, world],
            "lengths": dict(self._lengths),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state["step"]``, discarding every prefetched batch.

        Raises ``ValueError`` (or ``TypeError`` for a wrongly typed field) when
        the state is not a version-1 state of a loader configured like this
        one.
        """
        step = self._check_state(state)
        engine = self._usable_engine()
        engine.reset(step)

    def _check_state(self, state: Any) -> int:
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        version = state.get("version")
        if not _is_int(version) or version != STATE_VERSION:
            raise ValueError(
                f"unsupported DataLoader state version {version!r}; this loaderx reads "
                f"version {STATE_VERSION}"
            )
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"DataLoader state is missing {missing}")
        unknown = sorted(str(key) for key in state if key not in _STATE_KEYS)
        if unknown:
            raise ValueError(f"DataLoader state has unknown keys {unknown}")

        step = state["step"]
        if not _is_int(step) or step < 0:
            raise TypeError(f"state step must be an int >= 0, got {step!r}")
        _check_step("state step", step)
        for key in ("seed", "batch_size"):
            if not _is_int(state[key]):
                raise TypeError(f"state {key} must be an int, got {state[key]!r}")
        if not isinstance(state["mode"], str):
            raise TypeError(f"state mode must be a str, got {state['mode']!r}")
        shard = state["shard"]
        if (
            isinstance(shard, (str, bytes))
            or not isinstance(shard, Sequence)
            or len(shard) != 2
            or not all(_is_int(value) for value in shard)
        ):
            raise TypeError(f"state shard must be [rank, world], got {shard!r}")
        lengths = state["lengths"]
        if not isinstance(lengths, Mapping) or not all(
            isinstance(name, str) and _is_int(length) for name, length in lengths.items()
        ):
            raise TypeError(f"state lengths must be a dict of str -> int, got {lengths!r}")

        sampler = self._sampler
        _check_equal("batch_size", state["batch_size"], sampler.batch_size)
        _check_equal("mode", state["mode"], sampler.mode.name)
        _check_equal("seed", state["seed"], sampler.seed)
        state_rank, state_world = int(shard[0]), int(shard[1])
        rank, world = sampler.shard
        if state_world != world:
            raise ValueError(
                f"state shard world size is {state_world} but this loader has world size "
                f"{world}: resuming onto a different number of ranks is not supported "
                f"(the global batch would change); restore with the same world size"
            )
        _check_equal("shard rank", state_rank, rank)
        if sorted(lengths) != sorted(self._lengths):
            raise ValueError(
                f"state streams {sorted(lengths)} differ from this loader's "
                f"{sorted(self._lengths)}"
            )
        for name, length in self._lengths.items():
            _check_equal(f"lengths[{name!r}]", lengths[name], length)
        return int(step)

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

    def __repr__(self) -> str:
        if self._engine is None:
            return "DataLoader(<not constructed>)"
        streams = ", ".join(f"{name}: {kind}" for name, kind in self._kinds.items())
        if self._failure is not None:
            state = f"failed at step {self._failure[0]}"
        elif self.closed:
            state = "closed"
        else:
            state = "open"
        sampler = self._sampler
        return (
            f"DataLoader({{{streams}}}, length={sampler.length}, batch_size={sampler.batch_size}, "
            f"mode={sampler.mode.name}, seed={sampler.seed}, shard={sampler.shard}, "
            f"workers={self._workers}, prefetch={self._prefetch}, step={self.step}, {state})"
        )

    # -- helpers ------------------------------------------------------------------

    def _require_engine(self) -> _Engine:
        engine = self._engine
        assert engine is not None, "DataLoader.__init__ did not finish"
        return engine

    def _usable_engine(self) -> _Engine:
        engine = self._require_engine()
        if self._failure is not None:
            step, error = self._failure
            raise RuntimeError(
                f"DataLoader stopped after an error at step {step}: "
                f"{type(error).__name__}: {error}"
            ) from error
        if self.closed:
            raise RuntimeError("DataLoader is closed")
        return engine


#: Steps are int64 (JSON- and checkpoint-friendly), with room for the window.
_STEP_MAX = 2**63 - 2**20


def _check_step(field: str, step: Any) -> None:
    """The upper bound of a step (the sampler refuses negative ones)."""
    if _is_int(step) and step > _STEP_MAX:
        raise ValueError(f"{field} must be in [0, {_STEP_MAX}], got {step}")


def _check_equal(field: str, state_value: Any, own_value: Any) -> None:
    if state_value != own_value:
        raise ValueError(
            f"state {field} is {state_value!r} but this loader has {own_value!r}"
        )
