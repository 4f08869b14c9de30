"""The prefetch stage of a DataLoader whose streams have a ``prefetch`` hook
(see ``loaderx.streams``): one thread, ``loaderx-prefetch``, computes each
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
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from . import streams
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
