"""An interrupt storm over a DataLoader's ``next()``: the one loop of the
interrupt-safety tests (in-process and in a subprocess with the unmapping
pool).

A thread sends SIGUSR1 every `period_s`; the handler raises `Interrupted`
once per armed ``next()`` call, wherever the main thread is then. A call it
interrupts must deliver nothing (the next call returns the same step), with
one exception no library can prevent: the interrupt landing in this
module's own frame right after ``next()`` returned, before the batch was
stored. The handler records the frame it ran in, so those steps are told
apart from a batch the loader lost.
"""
from __future__ import annotations

import os
import signal
import threading
import time


class Interrupted(BaseException):
    pass


def storm_next(loader, count, take, *, period_s, deadline_s, unarm_after_interrupt=False):
    """``next(loader)`` under the storm until `count` steps were delivered.
    Returns ``(got, after_return, interrupts)``: ``(step, take(batch))``
    pairs, the steps the caller lost right after ``next()`` returned, and
    how many calls were interrupted. With `unarm_after_interrupt`, the call
    after an interrupted one runs unarmed (a rebuilt step that takes longer
    than the storm's period could otherwise never finish)."""
    inside = [False]
    landed = [None]

    def handler(signum, frame):
        if inside[0]:
            inside[0] = False
            landed[0] = frame.f_code.co_filename if frame is not None else None
            raise Interrupted

    previous = signal.signal(signal.SIGUSR1, handler)
    done = threading.Event()

    def storm():
        while not done.wait(period_s):
            os.kill(os.getpid(), signal.SIGUSR1)

    kicker = threading.Thread(target=storm, daemon=True)
    got, after_return, interrupts, armed = [], [], 0, True
    try:
        kicker.start()
        deadline = time.monotonic() + deadline_s
        while len(got) + len(after_return) < count and time.monotonic() < deadline:
            step = loader.step
            try:
                inside[0], armed = armed, True
                batch = next(loader)
                inside[0] = False
                got.append((step, take(batch)))
            except Interrupted:
                inside[0], armed = False, not unarm_after_interrupt
                interrupts += 1
                assert loader.step in (step, step + 1)
                if loader.step == step + 1:
                    # Delivered: only the caller (this frame) may have lost it.
                    assert landed[0] == __file__, f"step {step} lost in {landed[0]}"
                    after_return.append(step)
    finally:
        inside[0] = False
        done.set()
        kicker.join()
        signal.signal(signal.SIGUSR1, previous)
    return got, after_return, interrupts
