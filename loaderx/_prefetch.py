"""The prefetch stage of a DataLoader whose streams have a ``prefetch`` hook
(see ``loaderx.streams``), in one of two forms.

`Stager`, when every hooked stream is the library's own remote store, view
or ShardSet (``ring_stages_prefetch``) read natively: the ring stages its
own steps (src/loader/Stage.zig, a ring opened with ``gated`` 2). A ring
worker maps each step's indices through the parts (a view's rows too) to
each replica's records, and builds the step at once when they are in the
node-local cache; otherwise the step waits for the stager. Its thread,
``loaderx-stage``, sits in ``lx_loader_stage`` and comes back to Python
only with a fetch plan: it fetches the plan's byte ranges (obstore), lands
them and calls again. A warm step costs no Python and no call, a cold one
a call and a landing. ``prefetch_bytes`` bounds the stored bytes of the
steps not yet handed over, natively.

`Prefetcher`, for any other hook: one thread, ``loaderx-prefetch``, computes each
step's indices ahead (``lx_loader_indices``: a pure function of the step, so
mixtures are covered), calls the hooks with them in step order, and only then
releases the step to the gated native ring; a hook's exception fails that
step, raised by the ``next()`` of that step. It stays inside the loader's
window (``prefetch + workers`` steps ahead of the consumer) and starts again
from the consumer's step after a reset. It works in runs: it wakes once half
the window is free and prefetches up to the window's end (a thread woken,
and the GIL taken, per step cost a warm remote loader a quarter of its
rate); a stream with ``prefetch_warm`` is asked once whether the whole run
is ready (then nothing more is called for it), and prefetched per step
otherwise.

With ``prefetch_bytes``, it also stays within that many bytes of steps
prefetched and not yet delivered: each hooked stream's share of a step is
its ``prefetch_size(indices)`` when it has one, else (dense streams) record
size times records. A step larger than the whole budget is prefetched alone,
once every earlier one was delivered (so the loader never stalls).
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import streams
from ._lib import RESULTS, error_for, ffi, lib
from ._ring import _OWN, Kick, Ring
from .errors import LoaderClosedError

Sizer = Callable[[np.ndarray], int]


class Prefetcher:
    """The thread that calls the streams' ``prefetch`` hooks for the steps of
    the window, in step order, and releases each step to the (gated) ring
    once its hooks returned (see ``loaderx.streams``)."""

    def __init__(self, ring: Ring, budget: Optional[int] = None):
        self.ring = ring
        # State under ``lock``; the consumer, a reset and close() wake the
        # thread through ``kick`` (see _ring.Kick: nothing an interrupt can
        # leave held).
        self.lock = threading.Lock()
        self.kick = Kick()
        self.next = ring.deliver
        self.run_length = max(1, ring.window // 2)
        self.generation = 0
        self.closed = False
        self.thread: Optional[threading.Thread] = None
        #: (source, hook, sizer, warm) of every hooked stream; `warm`: its
        #: ``prefetch_warm``, or None.
        self.hooks: List[Tuple[int, Callable[[np.ndarray], None], Optional[Sizer],
                               Optional[Callable[[np.ndarray], Any]]]] = [
            (k, hook, _sizer(col, k) if budget is not None else None,
             streams.warm_prefetcher(col.streams[k]))
            for col in ring.plan.columns for k, hook in enumerate(col.prefetch)
            if hook is not None]
        self.budget = budget
        #: Estimated bytes of the steps prefetched and not yet delivered.
        self.held: Dict[int, int] = {}

    def start(self) -> None:
        """Start the thread (once; see Workers.start for a start cut short)."""
        with self.lock:
            if self.closed or self.thread is not None:
                return
            self.thread = threading.Thread(target=_prefetch_main, args=(self,),
                                           name="loaderx-prefetch", daemon=True)
            self.thread.start()

    def wake(self) -> None:
        self.kick.wake()

    def restart(self, step: int, generation: int) -> None:
        """After a reset: prefetch from `step`, of `generation`. Caller holds
        ``lock``, and wakes the thread after releasing it."""
        self.next, self.generation = step, generation
        self.held.clear()

    def claim(self) -> Optional[Tuple[int, int, int]]:
        """The next run of steps to prefetch, ``(first, count, generation)``,
        once enough of the window is free (see `due`); None once closed."""
        ring = self.ring
        while True:
            with self.lock:
                if self.closed:
                    return None
                if self.due(ring.deliver):
                    first = self.next
                    self.next = ring.deliver + ring.window
                    return first, self.next - first, self.generation
            self.kick.sleep()

    def due(self, deliver: int) -> bool:
        """Whether a run is due with the consumer at `deliver`: once half the
        window (at least one step) is free. Runs of several steps keep this
        thread from waking, and taking the GIL, for every step."""
        return deliver + self.ring.window - self.next >= self.run_length

    def reserve(self, step: int, generation: int, size: int) -> bool:
        """Waits until `size` more bytes fit the budget (or nothing is held)
        and counts them for `step`; False once closed or reset meanwhile."""
        while True:
            with self.lock:
                if self.closed or generation != self.generation:
                    return False
                for done in [s for s in self.held if s < self.ring.deliver]:
                    del self.held[done]
                if self.budget is None or not self.held \
                        or sum(self.held.values()) + size <= self.budget:
                    self.held[step] = size
                    return True
            self.kick.sleep()

    def run(self, first: int, count: int, generation: int) -> bool:
        """Prefetches steps `first` .. `first + count - 1` and releases each
        in order once its hooks returned; False once the loader is closed.
        Without a budget, a stream with ``prefetch_warm`` is first asked
        whether the whole run is ready (one call instead of one per step);
        only if not (False, or it raised) is it prefetched per step, so a
        cold step waits for its own fetch alone and a failure fails the step
        it belongs to."""
        try:
            indices, sources = self.ring.indices_of(first, count)
        except LoaderClosedError:
            return False
        except BaseException as exc:  # noqa: B036 - (not seen) fails the run's steps
            return self.release(first, generation, exc, count)
        many = len(self.ring.plan.lengths) > 1

        def share(k: int, indices: np.ndarray, sources: np.ndarray) -> np.ndarray:
            return indices[sources == k] if many else indices
        called = set()  # the streams whose whole run is ready
        if self.budget is None and count > 1:
            for h, (k, _, _, warm) in enumerate(self.hooks):
                if warm is not None:
                    try:
                        ready = warm(share(k, indices.reshape(-1), sources.reshape(-1)))
                    except LoaderClosedError:
                        return False
                    except BaseException:  # noqa: B036 - prefetched per step below
                        continue
                    if ready is True:
                        called.add(h)
            if len(called) == len(self.hooks):  # every stream's run is ready
                return self.release(first, generation, None, count)
        for i in range(count):
            step, step_indices, step_sources = first + i, indices[i], sources[i]
            failure = None
            try:
                mine = [(hook, share(k, step_indices, step_sources), sizer)
                        for h, (k, hook, sizer, _) in enumerate(self.hooks) if h not in called]
                size = sum(_size_of(sizer, idx) for _, idx, sizer in mine if sizer is not None)
                if not self.reserve(step, generation, size):
                    continue  # dropped by a reset
                for hook, idx, _ in mine:
                    hook(idx)
            except LoaderClosedError:
                return False
            except BaseException as exc:  # noqa: B036 - raised at its step by next()
                failure = exc
                if hasattr(exc, "add_note"):
                    exc.add_note(f"(loaderx: raised by a stream's prefetch hook for step {step})")
            if not self.release(step, generation, failure):
                return False
        return True

    def release(self, step: int, generation: int, failure: Optional[BaseException],
                count: int = 1) -> bool:
        """Releases steps `step` .. `step + count - 1` to the ring (failed,
        with `failure`); False once the loader is closed."""
        with self.lock:
            if self.closed or generation != self.generation:
                return True
            if failure is not None:
                self.ring.failures.update(dict.fromkeys(range(step, step + count), failure))
            try:
                self.ring.submit(step, generation, None if failure is None else
                                 f"the prefetch of step {step} failed: {failure!r}", count)
            except LoaderClosedError:
                return False
        return True

    def close(self) -> List[threading.Thread]:
        with self.lock:
            self.closed = True
        self.kick.wake()
        return [self.thread] if self.thread is not None else []


def _size_of(sizer: Sizer, indices: np.ndarray) -> int:
    size = sizer(indices)
    if not streams.is_int(size) or size < 0:
        raise ValueError(f"prefetch_size() must return a byte count (an int >= 0), got {size!r}")
    return int(size)


def _sizer(col: Any, source: int) -> Sizer:
    """How many bytes a hooked stream's prefetch of some indices fetches."""
    stream = col.streams[source]
    size = streams.prefetch_sizer(stream)
    if size is None:
        raise ValueError(f"prefetch_bytes: stream {col.name!r} has a prefetch hook but no "
                         f"size: give it prefetch_size(indices) -> bytes (a {col.kind} "
                         f"stream's records have no fixed size)")
    return size


def _prefetch_main(prefetcher: Prefetcher) -> None:
    _OWN.ring = prefetcher.ring
    while True:
        claimed = prefetcher.claim()
        if claimed is None:
            return
        try:
            if not prefetcher.run(*claimed):
                return
        except LoaderClosedError:  # (computing a step's indices)
            return


def stageable(plan: Any) -> bool:
    """Whether the ring can stage every hooked stream of `plan` itself: each
    is the library's remote store, view or ShardSet (``ring_stages_prefetch``),
    read natively as records (not token windows) from remote parts."""
    hooked = [(col, k) for col in plan.columns for k, hook in enumerate(col.prefetch)
              if hook is not None]
    return bool(hooked) and all(
        col.native and not col.windows
        and getattr(col.streams[k], "ring_stages_prefetch", False) is True
        and all(part.remote is not None for part in col.parts_of(k))
        for col, k in hooked)


class _Still:
    """A Kick that nothing needs: the native stager wakes itself."""

    def wake(self) -> None:
        pass


class Stager:
    """The thread that drives a staged ring (``lx_loader_stage``; see the
    module docs): it fetches the byte ranges of the plans the ring hands
    back and lands them. Same interface to the Ring as `Prefetcher`."""

    staged = True
    #: (The Ring's wake test: a staged ring's budget is the native side's.)
    budget = None

    def __init__(self, ring: Ring, budget: Optional[int] = None):
        self.ring = ring
        self.bytes = budget or 0
        self.lock = threading.Lock()
        self.kick = _Still()
        self.generation = 0
        self.closed = False
        self.thread: Optional[threading.Thread] = None

    def bindings(self) -> Dict[int, Any]:
        """Replica address -> the remote binding of every part the ring reads."""
        found = {}
        for col in self.ring.columns:
            for k in range(len(col.streams)):
                for part in col.parts_of(k):
                    if part.remote is not None:
                        found[int(ffi.cast("uintptr_t", part.remote.rep.h))] = part.remote
        return found

    def start(self) -> None:
        with self.lock:
            if self.closed or self.thread is not None:
                return
            self.thread = threading.Thread(target=_stage_main, args=(self, self.bindings()),
                                           name="loaderx-stage", daemon=True)
            self.thread.start()

    def wake(self) -> None:
        pass

    def due(self, deliver: int) -> bool:
        return False

    def restart(self, step: int, generation: int) -> None:
        """After a reset (the native stager moved itself): steps of older
        generations no longer fail. Caller holds ``lock``."""
        self.generation = generation

    def fail(self, step: int, generation: int, exc: BaseException) -> Any:
        """Step `step`'s fetch failed with `exc`: raised by its ``next()``;
        the message that fails it natively."""
        if hasattr(exc, "add_note"):
            exc.add_note(f"(loaderx: raised fetching step {step} into the node-local cache)")
        with self.lock:
            if generation == self.generation:
                self.ring.failures[step] = exc
        return ffi.new("char[]", f"the prefetch of step {step} failed: {exc!r}".encode(
            "utf-8", "replace"))

    def close(self) -> List[threading.Thread]:
        with self.lock:
            self.closed = True
        return [self.thread] if self.thread is not None else []


def _stage_main(stager: Stager, bindings: Dict[int, Any]) -> None:
    ring = stager.ring
    _OWN.ring = ring
    f = ffi.new("lx_fetch_t *")
    out = ffi.new("lx_stage_t *")
    failure: Any = ffi.NULL
    while True:
        try:
            with ring.entered("DataLoader is closed"):
                rc = lib.lx_loader_stage(ring.handle, failure, f, out)
        except LoaderClosedError:
            return
        failure = ffi.NULL
        if rc == RESULTS["closed"]:
            return
        if out.replica == ffi.NULL:
            # Not a step's error (the call misused: cannot happen by
            # construction). The ring's workers would wait for their
            # fetches for ever: stop the ring, so next() raises instead.
            warnings.warn(f"DataLoader: staging stopped: "
                          f"{error_for(rc, None, 'DataLoader staging')}", RuntimeWarning)
            ring.shutdown()
            return
        step, generation = int(out.step), int(out.generation)
        try:
            binding = bindings[int(ffi.cast("uintptr_t", out.replica))]
            binding._landing(rc, f)  # (a start's error)
            binding._fetch(f)
        except BaseException as exc:  # noqa: B036 - raised by next() of its step
            if not rc:
                lib.lx_fetch_failed(f, 0)  # (releases what is still reserved)
            failure = stager.fail(step, generation, exc)
