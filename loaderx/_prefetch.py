"""The prefetch stage of a DataLoader whose streams have a ``prefetch`` hook
(see ``loaderx.streams``): one thread, ``loaderx-prefetch``, computes each
step's indices ahead (``lx_loader_indices``: a pure function of the step, so
mixtures are covered), calls the hooks with them in step order, and only then
releases the step to the gated native ring; a hook's exception fails that
step, raised by the ``next()`` of that step. It stays inside the loader's
window (``prefetch + workers`` steps ahead of the consumer) and starts again
from the consumer's step after a reset.
"""
from __future__ import annotations

import threading
from typing import List, Optional, Tuple

from ._ring import _OWN, Ring
from .errors import LoaderClosedError


class Prefetcher:
    """The thread that calls the streams' ``prefetch`` hooks for the steps of
    the window, in step order, and releases each step to the (gated) ring
    once its hooks returned (see ``loaderx.streams``)."""

    def __init__(self, ring: Ring):
        self.ring = ring
        self.cond = threading.Condition()
        self.next = ring.deliver
        self.generation = 0
        self.closed = False
        self.thread: Optional[threading.Thread] = None
        self.hooks = [(k, hook) for col in ring.plan.columns for k, hook in enumerate(col.prefetch)
                      if hook is not None]

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

    def run_hooks(self, step: int) -> None:
        indices, sources = self.ring.indices_of(step)
        many = len(self.ring.plan.lengths) > 1
        for k, hook in self.hooks:
            hook(indices[sources == k] if many else indices)

    def close(self) -> List[threading.Thread]:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        return [self.thread] if self.thread is not None else []


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
            prefetcher.run_hooks(step)
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
