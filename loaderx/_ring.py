"""The DataLoader's one step machine, the native ring (``src/Loader.zig``),
as Python drives it: the consumer's ``next()`` is one native wait (the GIL
released) that hands a built step over, and one dict build.

The ring builds every step on library threads and owns each step's memory
until it hands the step over; Python keeps only the consumer's place: the
next undelivered step, the base of the last reset (a ``loaderx._state.Base``:
its step, the global position of its first record and a CYCLIC mixture's
cursors; the ring computes every later step's indices from it, and so does
``Base.at``), and whether a ``next()`` was cut short (``torn``: the next call
rebuilds that step exactly, or, when the step was already delivered and the
call was cut short after that, returns it: ``handed``). Two optional stages
hang off it:

* ``Workers`` (``_workers.py``): where a batch needs Python (a transform, or
  streams that are Python objects), worker threads map that over the ring's
  finished steps, in step order.
* ``Prefetcher`` (``_prefetch.py``): where streams have a ``prefetch`` hook, one thread
  calls it for each step ahead, in step order, and releases the step to the
  ring (a gated ring) only once it returned; a hook's exception fails that
  step at its step.

Memory: a step's buffers reach Python only through owners made before the
native wait (``_buffers.owner``), so a ``next()`` interrupted anywhere frees
them exactly once, and never while a ring thread writes them; a ring woken by
``close()`` hands nothing over.

Fork: a child inherits the memory of its parent's rings, not their threads; it
must never wait for, stop or free them, so at fork the child marks them
inherited and keeps their handles referenced for good.
"""
from __future__ import annotations

import contextlib
import os
import queue
import threading
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from . import _buffers, _lib, _pipeline
from ._lib import ffi, lib
from .errors import LoaderClosedError

#: How long ``close()`` waits for a Python thread inside a transform or hook.
JOIN_TIMEOUT_S = 10.0
#: The longest a library thread sleeps between looks at what it waits for, so
#: that a wake-up an interrupt cut short costs at most this, never a hang.
BACKSTOP_S = 0.1

_LIVE: "weakref.WeakSet[Ring]" = weakref.WeakSet()
_INHERITED: List[Any] = []
#: The ring whose worker (or prefetch) thread this is.
_OWN = threading.local()
_RC_FAILED = _lib.RESULTS["failed"]


def _after_fork_in_child() -> None:
    for ring in list(_LIVE):
        ring.inherited = True
        _INHERITED.append(ring.handle)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Kick:
    """Wakes a library thread from any thread, the consumer's included, with
    one C call (``SimpleQueue.put``): a signal handler's exception cannot cut
    it in half, which ``Condition.notify`` (Python code that releases a waiter
    and then forgets it) and ``with Condition`` (a Python ``__exit__``) allow,
    leaving a lock held for good or a waiter released twice. Waiters look at
    their state under a plain ``threading.Lock`` (whose ``with`` is C too),
    then ``sleep()``; a wake-up sent in between is not lost (it stays queued),
    and one lost to an interrupt costs ``BACKSTOP_S``."""

    def __init__(self) -> None:
        self.queue: "queue.SimpleQueue[None]" = queue.SimpleQueue()

    def wake(self, count: int = 1) -> None:
        for _ in range(count):
            self.queue.put(None)

    def sleep(self) -> None:
        try:
            self.queue.get(timeout=BACKSTOP_S)
        except queue.Empty:
            pass


class Native:
    """The native ring's handle and what it points at. Freed once: by the
    last of ``shutdown()`` and the native calls in flight when it ran, or, when
    an interrupt cut a call's count short (the count is Python code), by the
    Ring's garbage collection. Never in a forked child (the parent's)."""

    def __init__(self) -> None:
        self.handle: Any = None
        self.keep: List[Any] = []
        self.pid = os.getpid()

    def free(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None and self.pid == os.getpid():
            lib.lx_loader_free(handle)
        self.keep = []


def refuse_own_thread(ring: "Ring", call: str) -> None:
    """A thread of this loader must not wait for its own steps."""
    if getattr(_OWN, "ring", None) is ring:
        raise RuntimeError(
            f"{call} called from this DataLoader's own transform (or stream) on "
            f"{threading.current_thread().name}: it would wait for itself forever")


class _WaitArgs:
    """The out-parameters of one ``lx_loader_wait`` besides the owners: a
    ring keeps the ones its waits made and reuses them (one set per thread
    waiting at once), so a step makes no cffi allocation but its owners."""

    __slots__ = ("slots", "lengths", "failed", "skipped")

    def __init__(self, columns: int) -> None:
        self.slots = ffi.new("uint8_t **[]", max(1, columns))
        self.lengths = ffi.new("uint64_t[]", max(1, columns))
        self.failed = ffi.new("uint32_t *")
        self.skipped = ffi.new("uint32_t *")


class Ring:
    """One DataLoader's ring: opened at its first step, closed by
    ``shutdown()`` (from any thread)."""

    def __init__(self, plan: _pipeline.Plan, *, batch_size: int, rank: int, world: int,
                 seed: int, mode: int, window: int, threads: int, lanes: int, base: Any,
                 packed: bool, out: Dict[str, List[np.ndarray]]) -> None:
        self.plan = plan
        self.columns = plan.native
        self.batch_size, self.world, self.window = batch_size, world, window
        self.packed = packed
        self.out = out
        self.config = dict(batch_size=batch_size, rank=rank, world=world, seed=seed, mode=mode,
                           window=window, threads=threads, lanes=lanes)
        self.want_indices = bool(plan.python) or any(c.kind != "dense" for c in self.columns)
        self.want_sources = plan.mixture is not None
        self.variable = [c for c in self.columns if c.ring_kind == _pipeline.COLUMN_VARIABLE]
        self.base = base  # where the steps from base.step start (a _state.Base)
        self.deliver = base.step  # the next undelivered step
        self.last = base.last_step()  # the steps before it are taken (see Base.last_step)
        self.generation = 0  # resets of the native ring so far
        self.failures: Dict[int, BaseException] = {}  # steps a prefetch hook failed
        self.spare_args: List[_WaitArgs] = []  # (list.pop and append are atomic)
        self.stage: Any = None  # Workers, when batches need Python
        self.prefetcher: Any = None  # Prefetcher, when streams have a prefetch hook
        self.consumer = threading.Lock()  # one next()/load_state_dict() at a time
        self.torn = False
        # The step a take is delivering, from just before the consumer's place
        # moves past it to the take's return: a take cut short in between
        # (an interrupt in a wake-up's Python frame) leaves it to the next.
        self.handed: Optional[Tuple[int, Any, Optional[BaseException]]] = None
        self.native = Native()
        self.closed = False
        self.inherited = False
        # Guards closed, users and native.handle. A plain lock: its ``with``
        # is C code, which a signal handler's exception cannot cut short.
        self.lock = threading.Lock()
        # Native calls in flight (shutdown counts as one while it stops the
        # ring): the last to leave a closed ring frees it.
        self.users = 0
        #: Image records the ring's steps replaced (Decode on_error skip),
        #: counted as the steps are handed over (under ``lock``).
        self.images_skipped = 0
        # Not at interpreter exit: a daemon thread may still be leaving a
        # native call then, and the process's memory goes anyway.
        weakref.finalize(self, self.native.free).atexit = False
        _LIVE.add(self)

    @property
    def handle(self) -> Any:
        return self.native.handle

    # -- the consumer ----------------------------------------------------------------

    def take(self) -> Tuple[int, Any, Optional[BaseException]]:
        """The next undelivered step: ``(step, batch, error)``. One consumer at a
        time; a take cut short delivers nothing (the next rebuilds the step)."""
        if self.inherited:
            raise RuntimeError("this DataLoader was built in another process (before a fork): "
                               "build one DataLoader per process")
        refuse_own_thread(self, "next()")
        with self.consumer:
            if self.torn:
                handed = self.handed
                if handed is not None and handed[0] + 1 == self.deliver:
                    # Cut short once its step was delivered: that step, now,
                    # after the wake-ups the interrupt may have cost (cut
                    # short again there, the next take comes back here).
                    self.woke_after_delivery(self.deliver)
                    self.handed = None
                    self.torn = False
                    return handed
                self.reset_locked(self.base_at(self.deliver))
            self.torn = True
            if self.stage is not None:
                taken = self.stage.next_locked()
            else:
                taken = self.next_locked()
            self.handed = None
            self.torn = False
            return taken

    def next_locked(self) -> Tuple[int, Any, Optional[BaseException]]:
        """``take()`` without Python stages: one native wait, one dict build."""
        step = self.deliver
        self.ensure_open()  # raises to the caller: the next take tries again
        batch, error = None, None
        try:
            batch = self.build(step, self.generation)[0]
        except LoaderClosedError:
            raise
        except Exception as exc:  # the step's error, raised by the next() of its step
            error = exc
        if self.closed:
            raise LoaderClosedError("DataLoader was closed while next() was waiting")
        if error is None:
            self.handed = (step, batch, error)
            self.delivered(step + 1)
        return step, batch, error

    @property
    def next_step(self) -> int:
        """The step the next take returns: the consumer's place, or the step
        a take cut short had already delivered (``handed``)."""
        handed = self.handed
        if self.torn and handed is not None and handed[0] + 1 == self.deliver:
            return handed[0]
        return self.deliver

    def woke_after_delivery(self, step: int) -> None:
        """The wake-ups the consumer's move to `step` sends (again: waking a
        thread that has nothing to do costs it one look)."""
        self.delivered(step)
        if self.stage is not None:
            self.stage.room_changed.wake()

    def delivered(self, step: int) -> None:
        """The consumer's place moved on to `step` (the last thing a take
        does that the next one must not repeat: see ``handed``)."""
        self.deliver = step
        prefetcher = self.prefetcher
        # Only when its next run is due, or it may wait for budget: a wake-up
        # per step costs the consumer a context switch (a stale read of its
        # place only wakes it early).
        if prefetcher is not None and (prefetcher.budget is not None or prefetcher.due(step)):
            prefetcher.wake()

    def base_at(self, step: int) -> Any:
        """Where `step` (at or after the base's) starts: its Base."""
        return self.base.at(step)

    def position_of(self, step: int) -> int:
        """The global position of the first record of `step`."""
        return self.base.position_of(step)

    def reset(self, base: Any) -> None:
        """Drop everything prefetched and continue at `base` (its step, its
        first record's global position and any cursors; waits for the steps
        being built)."""
        refuse_own_thread(self, "load_state_dict()")
        with self.consumer:
            self.reset_locked(base)

    def reset_locked(self, base: Any) -> None:
        """``reset()`` for the holder of ``consumer``; cut short, it leaves the
        ring ``torn`` and the next take resets again."""
        last = base.last_step()
        self.torn = True
        self.handed = None
        closed = "DataLoader was closed during load_state_dict()"
        if self.closed:
            raise LoaderClosedError("DataLoader is closed")
        if self.stage is not None:
            # The steps the workers hold finish first (as their transforms
            # would anyway); no more are claimed until the reset is done.
            self.stage.drain(closed)
        with self.prefetch_paused():
            cursors, generation = _reset_args(base)  # (nothing is allocated inside)
            with self.entered(closed):
                if self.handle is not None:
                    _lib.check(lib.lx_loader_reset(self.handle, base.step, base.position,
                                                   cursors, generation), None, "DataLoader")
                    self.generation = int(generation[0])
            self.base = base
            self.deliver = base.step
            self.last = last
            self.failures.clear()
        if self.stage is not None:
            self.stage.resume(base.step)
        if self.closed:
            raise LoaderClosedError(closed)
        self.torn = False

    @contextlib.contextmanager
    def prefetch_paused(self) -> Iterator[None]:
        if self.prefetcher is None:
            yield
            return
        with self.prefetcher.lock:
            yield
            self.prefetcher.restart(self.deliver, self.generation)
        self.prefetcher.kick.wake()

    # -- the native ring ------------------------------------------------------------

    def ensure_open(self) -> None:
        """Open the native ring (once; the caller holds a lock that keeps two
        threads from doing it at once). A ring that fails to open (a store
        closed before the first batch) raises again at the next try."""
        if self.handle is None:
            with self.lock:  # shutdown() sees the handle, or it is not made
                if self.closed:
                    raise LoaderClosedError("DataLoader is closed")
                self.native.handle, self.native.keep = _open(self)
        if self.prefetcher is not None:
            self.prefetcher.start()  # (again after a start cut short by an interrupt)

    @contextlib.contextmanager
    def entered(self, closed_message: str) -> Iterator[None]:
        """Counts a native call in; LoaderClosedError once closed."""
        self.enter(closed_message)
        try:
            yield
        finally:
            self.leave()

    def enter(self, closed_message: str) -> None:
        with self.lock:
            if self.closed:
                raise LoaderClosedError(closed_message)
            self.users += 1

    def leave(self) -> None:
        with self.lock:
            self.users -= 1
            if self.closed and self.users == 0:
                self.native.free()

    def wait(self, step: int, generation: int) -> Tuple[int, List[Any], Any, Any, Any, Any]:
        """Blocks (GIL released) until `step` is built and takes it over: (result,
        the columns' owner slots, lengths, sizes, indices, sources). The owners
        exist before the call, so the step's buffers are freed exactly once
        however the caller is interrupted afterwards."""
        n = len(self.columns)
        owners = [_buffers.owner() for _ in range(n)]
        sizes = np.empty(2 * self.batch_size * len(self.variable), np.uint64) \
            if self.variable else None
        indices = np.empty(self.batch_size, np.uint64) if self.want_indices else None
        sources = np.empty(self.batch_size, np.uint16) if self.want_sources else None
        try:
            w = self.spare_args.pop()
        except IndexError:
            w = _WaitArgs(n)
        for c, owner in enumerate(owners):
            w.slots[c] = owner
        args = (step, generation, w.failed, w.slots, w.lengths,
                _pointer("uint64_t *", sizes), _pointer("uint64_t *", indices),
                _pointer("uint16_t *", sources), w.skipped)
        self.enter("DataLoader is closed")
        try:
            rc = lib.lx_loader_wait(self.handle, *args)
        finally:
            self.leave()
            lengths, failed, skipped = list(w.lengths), w.failed[0], w.skipped[0]
            self.spare_args.append(w)
        if rc != _lib.LX_OK:
            raise self.step_error(rc, failed, step)
        if skipped:
            with self.lock:
                self.images_skipped += int(skipped)
        return rc, owners, lengths, sizes, indices, sources

    def build(self, step: int, generation: int) -> Tuple[Dict[str, Any], Any, Any]:
        """Step `step`'s batch of native columns (in column order, plus
        ``source`` for a mixture), and its indices and sources; raises the
        step's error."""
        _, owners, lengths, sizes, indices, sources = self.wait(step, generation)
        batch: Dict[str, Any] = {}
        b, v = self.batch_size, 0
        for c, col in enumerate(self.columns):
            buffers = self.out.get(col.name)
            if buffers is not None:  # built into the caller's buffer of the step
                batch[col.name] = buffers[step % len(buffers)]
                continue
            if col.ring_kind != _pipeline.COLUMN_VARIABLE:
                batch[col.name] = _buffers.array(owners[c], lengths[c], (b,) + col.dense_shape,
                                                 col.dtype)
                continue
            raw = _buffers.view(owners[c], lengths[c])
            batch[col.name] = _pipeline.decode_variable(
                col, raw, sizes[2 * b * v:2 * b * (v + 1)], indices, self.packed)
            v += 1
        if sources is not None:
            batch["source"] = sources.astype(np.int16)
        return batch, indices, sources

    def step_error(self, rc: int, failed: int, step: int) -> BaseException:
        if self.closed:
            return LoaderClosedError("DataLoader was closed while next() was waiting")
        if rc == _RC_FAILED and failed == len(self.columns):
            error = self.failures.pop(step, None)
            if error is not None:  # the exception a prefetch hook raised
                return error
        col = self.columns[failed] if failed < len(self.columns) else None
        what = f"image column {col.name!r}" if col is not None and col.image is not None \
            else "gather"
        error = _lib.error_for(rc, col.path if col is not None else None, what)
        if hasattr(error, "add_note"):
            column = f" (stream {col.name!r})" if col is not None else ""
            error.add_note("(loaderx: raised by the native prefetch ring "
                           f"building step {step}{column})")
        return error

    def submit(self, step: int, generation: int, failure: Optional[str] = None,
               count: int = 1) -> bool:
        """Releases steps `step` .. `step + count - 1` to a gated ring (or
        fails them); False when a reset dropped them meanwhile."""
        message = ffi.new("char[]", failure.encode("utf-8", "replace")) if failure else ffi.NULL
        with self.entered("DataLoader is closed"):
            rc = lib.lx_loader_submit(self.handle, step, count, generation, message)
        del message
        if rc == _lib.RESULTS["invalid"] and (generation != self.generation or self.torn):
            # Dropped by a reset; when the reset was cut short before it told
            # Python its generation (torn), the next take resets again.
            return False
        _lib.check(rc, None, "DataLoader")
        return True

    def indices_of(self, step: int, count: int = 1) -> Tuple[np.ndarray, np.ndarray]:
        """The indices and sources the ring builds steps `step` ..
        `step + count - 1` with (a pure function of the step), without
        building them: ``(count, batch_size)`` arrays, in one native call."""
        indices = np.empty((count, self.batch_size), np.uint64)
        sources = np.empty((count, self.batch_size), np.uint16)
        out = (_pointer("uint64_t *", indices), _pointer("uint16_t *", sources))
        with self.entered("DataLoader is closed"):
            rc = lib.lx_loader_indices(self.handle, step, count, *out)
        _lib.check(rc, None, "DataLoader")
        return indices, sources

    # -- closing --------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop and join every thread, then free the ring (or leave that to
        the last native call still leaving it; never waits for one).
        Idempotent; safe from any thread. In a forked child it only lets go."""
        if self.inherited:
            self.closed = True
            return
        with self.lock:
            already, self.closed = self.closed, True
            self.users += 1  # (the handle stays valid while this stops it)
        if already:
            self.leave()
            return
        threads: List[threading.Thread] = []
        if self.stage is not None:
            threads += self.stage.close()
        if self.prefetcher is not None:
            threads += self.prefetcher.close()
        if self.handle is not None:
            # Wakes every native waiter with "closed" and joins the ring's
            # threads: from here on nothing writes the steps' memory.
            lib.lx_loader_stop(self.handle)
        _join(threads)
        self.leave()  # frees the ring unless a native call is still leaving


def _gating(ring: Ring) -> int:
    """lx_loader_config_t.gated: 2 when the ring stages its own steps (a
    Stager), 1 when Python releases them, else 0."""
    if getattr(ring.prefetcher, "staged", False):
        return 2
    return int(ring.stage is not None or ring.prefetcher is not None)


def _pointer(kind: str, array: Optional[np.ndarray]) -> Any:
    if array is None or array.size == 0:
        return ffi.NULL
    return ffi.cast(kind, array.__array_interface__["data"][0])


def _join(threads: List[threading.Thread]) -> None:
    current = threading.current_thread()
    alive = []
    for thread in threads:
        if thread is current or thread.ident is None:  # (a start cut short)
            continue
        thread.join(JOIN_TIMEOUT_S)
        if thread.is_alive():
            alive.append(thread.name)
    if alive:
        warnings.warn(f"DataLoader.close(): {alive} still running a gather, transform or "
                      f"prefetch after {JOIN_TIMEOUT_S:g} s; they will exit when it returns",
                      RuntimeWarning, stacklevel=4)


def _open(ring: Ring) -> Tuple[Any, List[Any]]:
    """The native ring of `ring`'s plan, at its base step and position, and
    everything it points at (kept until it is freed)."""
    plan, keep = ring.plan, []
    config = ffi.new("lx_loader_config_t *", dict(
        ring.config, step=ring.base.step, position=ring.base.position,
        gated=_gating(ring), budget=getattr(ring.prefetcher, "bytes", 0)))
    cursors = ring.base.cursors or [(0, 0, 0)] * len(plan.lengths)
    sources = ffi.new("lx_source_t[]", [
        {"length": n, "seed": s, "weight": w, "cursor": _cursor(c)}
        for n, s, w, c in zip(plan.lengths, plan.seeds, plan.weights, cursors)])
    columns = ffi.new("lx_column_t[]", max(1, len(ring.columns)))
    for c, col in enumerate(ring.columns):
        columns[c].kind = col.ring_kind
        columns[c].record_size = col.record_bytes
        if col.image_native is not None:
            columns[c].image = col.image_native
        buffers = ring.out.get(col.name)
        if buffers:
            out = ffi.new("uint8_t *[]", [ffi.cast("uint8_t *", a.__array_interface__["data"][0])
                                          for a in buffers])
            keep.append(out)
            columns[c].out, columns[c].out_count = out, len(buffers)
    parts = _parts(ring.columns, keep)
    specs = ffi.NULL
    if any(col.windows for col in ring.columns):
        k_count = len(plan.lengths)
        specs = ffi.new("lx_windows_t[]", len(ring.columns) * k_count)
        for c, col in enumerate(ring.columns):
            for k in range(k_count if col.windows else 0):
                specs[c * k_count + k] = col.spec_of(k)[0]
    out = ffi.new("lx_loader **")
    _lib.check(lib.lx_loader_open(config, sources, len(plan.lengths), columns, len(ring.columns),
                                  parts, len(parts) if ring.columns else 0, specs, out),
               None, "DataLoader")
    return out[0], keep + [parts, specs]


def _cursor(cursor: Tuple[int, int, int]) -> Dict[str, int]:
    cycle, offset, steps_left = cursor
    return {"cycle": cycle, "offset": offset, "steps_left": steps_left}


def _reset_args(base: Any) -> Tuple[Any, Any]:
    """The cursors of a reset to `base` (NULL unless a CYCLIC mixture), and
    where the new generation goes."""
    cursors = ffi.NULL
    if base.cursors is not None:
        cursors = ffi.new("lx_cursor_t[]", [_cursor(c) for c in base.cursors])
    return cursors, ffi.new("uint64_t *")


def _parts(columns: List[_pipeline.Column], keep: List[Any]) -> Any:
    """Every native part of every column and source, with its rows."""
    found = []
    for c, col in enumerate(columns):
        for k in range(len(col.streams)):
            for part in col.parts_of(k):
                found.append((part, k, c))
    parts = ffi.new("lx_loader_part_t[]", max(1, len(found)))
    for i, (part, k, c) in enumerate(found):
        keep.append(part.handle)
        parts[i].store, parts[i].first = part.handle, part.first
        if part.remote is not None:
            parts[i].replica = part.remote.rep.h
        parts[i].source, parts[i].column = k, c
        if part.rows is not None:
            rows = np.ascontiguousarray(part.rows, dtype=np.uint64)
            keep.append(rows)
            parts[i].rows, parts[i].row_count = _pointer("uint64_t *", rows), len(rows)
    return parts
