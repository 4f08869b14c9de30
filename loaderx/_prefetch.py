"""The prefetch stage of a DataLoader whose streams have a ``prefetch`` hook
(see ``loaderx.streams``): one thread, ``loaderx-prefetch``, computes each
step's indices ahead (``lx_loader_indices``: a pure function of the step, so
mixtures are covered), calls the hooks with them in step order, and only then
releases the step to the gated native ring; a hook's exception fails that
step, raised by the ``next()`` of that step. It stays inside the loader's
window (``prefetch + workers`` steps ahead of the consumer) and starts again
from the consumer's step after a reset.

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
from ._ring import _OWN, Ring
from .errors import LoaderClosedError

Sizer = Callable[[np.ndarray], int]


class Prefetcher:
    """The thread that calls the streams' ``prefetch`` hooks for the steps of
    the window, in step order, and releases each step to the (gated) ring
    once its hooks returned (see ``loaderx.streams``)."""

    def __init__(self, ring: Ring, budget: Optional[int] = None):
        self.ring = ring
        self.cond = threading.Condition()
        self.next = ring.deliver
        self.generation = 0
        self.closed = False
        self.thread: Optional[threading.Thread] = None
        #: (source, hook, sizer) of every hooked stream.
        self.hooks: List[Tuple[int, Callable[[np.ndarray], None], Optional[Sizer]]] = [
            (k, hook, _sizer(col, k) if budget is not None else None)
            for col in ring.plan.columns for k, hook in enumerate(col.prefetch)
            if hook is not None]
        self.budget = budget
        #: Estimated bytes of the steps prefetched and not yet delivered.
        self.held: Dict[int, int] = {}

    def start(self) -> None:
        """Start the thread (once; see Workers.start for a start cut short)."""
        with self.cond:
            if self.closed or self.thread is not None:
                return
            self.thread = threading.Thread(target=_prefetch_main, args=(self,),
                                           name="loaderx-prefetch", daemon=True)
            self.thread.start()

    def wake(self) -> None:
        with self.cond:
            self.cond.notify()

    def restart(self, step: int, generation: int) -> None:
        """After a reset: prefetch from `step`, of `generation`. Caller holds ``cond``."""
        self.next, self.generation = step, generation
        self.held.clear()
        self.cond.notify()

    def claim(self) -> Optional[Tuple[int, int]]:
        """The next step to prefetch once it is inside the window; None once closed."""
        ring = self.ring
        with self.cond:
            while not self.closed and self.next >= ring.deliver + ring.window:
                self.cond.wait()
            if self.closed:
                return None
            step, self.next = self.next, self.next + 1
            return step, self.generation

    def reserve(self, step: int, generation: int, size: int) -> bool:
        """Waits until `size` more bytes fit the budget (or nothing is held)
        and counts them for `step`; False once closed or reset meanwhile."""
        with self.cond:
            while not self.closed and generation == self.generation:
                for done in [s for s in self.held if s < self.ring.deliver]:
                    del self.held[done]
                if self.budget is None or not self.held \
                        or sum(self.held.values()) + size <= self.budget:
                    self.held[step] = size
                    return True
                self.cond.wait()
            return False

    def run_hooks(self, step: int, generation: int) -> bool:
        """Calls the hooks of `step`; False when the step was dropped meanwhile."""
        indices, sources = self.ring.indices_of(step)
        many = len(self.ring.plan.lengths) > 1
        mine = [(hook, indices[sources == k] if many else indices, sizer)
                for k, hook, sizer in self.hooks]
        size = sum(_size_of(sizer, idx) for _, idx, sizer in mine if sizer is not None)
        if not self.reserve(step, generation, size):
            return False
        for hook, idx, _ in mine:
            hook(idx)
        return True

    def close(self) -> List[threading.Thread]:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
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
    ring = prefetcher.ring
    _OWN.ring = ring
    while True:
        claimed = prefetcher.claim()
        if claimed is None:
            return
        step, generation = claimed
        failure = None
        try:
            if not prefetcher.run_hooks(step, generation):
                continue
        except LoaderClosedError:
            return
        except BaseException as exc:  # noqa: B036 - raised at its step by next()
            failure = exc
            if hasattr(exc, "add_note"):
                exc.add_note(f"(loaderx: raised by a stream's prefetch hook for step {step})")
        with prefetcher.cond:
            if prefetcher.closed or generation != prefetcher.generation:
                continue
            if failure is not None:
                ring.failures[step] = failure
            try:
                ring.submit(step, generation, None if failure is None else
                            f"the prefetch of step {step} failed: {failure!r}")
            except LoaderClosedError:
                return
