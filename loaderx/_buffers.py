"""Output memory the library owns: a bounded pool of page-aligned blocks that
batch arrays view, each handed back to the pool when its last array is gone.

Why: a fresh ``np.empty`` batch of more than ~128 KiB is a new ``mmap`` from
glibc, freed with ``munmap``. Every batch then pays a page fault per 4 KiB (or
per 2 MiB huge page) on first touch, the kernel's zeroing of those pages, and,
after several threads wrote it, a TLB shootdown (an interrupt to every CPU
that touched it) when it is unmapped. Measured in fresh processes (see
docs/performance.md): a 64 MiB batch of 256 KiB records took ~590 faults on
an Intel Xeon, and the pool made that gather 1.8-3.7x faster. A pooled block
is faulted once, when it is made, and reused.

The memory comes from anonymous private ``mmap`` calls of Python's ``mmap``
module, never from ``malloc``, so the process's malloc state (glibc's dynamic
mmap threshold) is left alone. Blocks of 2 MiB or more start on a 2 MiB
boundary and are advised ``MADV_HUGEPAGE`` where the platform has it, whole
huge pages only, so a block never holds more resident memory than its size
rounded up to 4 KiB.

Lifetime (the safety contract): an array from :func:`empty` views its block
through a cffi buffer that keeps an owner object alive; views, slices,
``memoryview``\\ s, ``torch.from_numpy`` tensors and DLPack capsules all keep
the array (hence the owner) alive. The owner's finalizer hands the block back
when the last of them is gone, and only then can the block be handed out
again. Raw addresses taken out of the array (``arr.ctypes.data``) are not
references, exactly as for any numpy array; native code that writes into an
array asynchronously must hold the array until it is done (the loader's
prefetch ring does).

Bounds: blocks that are in use belong to their arrays, like any numpy
allocation. Idle blocks (handed back, not yet reused) are capped at
``max_idle_bytes`` (default 256 MiB) per pool: a block handed back beyond the
cap pushes the least recently returned idle blocks out, and they are unmapped
at once; so is a block left idle while 256 other arrays were handed out (the
one-off shape of an evaluation pass does not stay resident).

Requests smaller than ``min_bytes`` (default 1 MiB) are served by plain
``np.empty``: once glibc has seen one such block freed it serves them from
its heap without an ``mmap``, and the pool's ~3 us of bookkeeping per batch
would cost more than it saves (it is ~2 % of a 3 MiB gather). Above 32 MiB
glibc always maps afresh, whatever it has seen, and a process whose malloc
threshold is pinned (``MALLOC_MMAP_THRESHOLD_``, ``mallopt``) maps every
batch above it: there the pool gathered 12 KiB records 8x faster.

Thread safety: every function may be called from any thread; blocks come back
from whichever thread drops the last reference (or from the garbage
collector). After ``fork`` the child gets a fresh lock and keeps its (copied)
blocks.
"""
from __future__ import annotations

import math
import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np

from ._lib import ffi

PAGE_BYTES = mmap.PAGESIZE
HUGE_PAGE_BYTES = 2 << 20
#: Requests below this many bytes get plain ``np.empty`` (see the module doc).
MIN_BYTES_DEFAULT = 1 << 20
#: Idle bytes a pool keeps for reuse; more is unmapped as it comes back.
MAX_IDLE_BYTES_DEFAULT = 256 << 20
#: A block left idle while this many arrays were handed out is unmapped: the
#: one-off batch shape of an evaluation pass does not stay resident for good.
STALE_CHECKOUTS = 256

_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)
_MAP_FLAGS = (
    {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS}
    if hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS") else {}
)


def _round_up(n: int, unit: int) -> int:
    return (n + unit - 1) // unit * unit


class _Block:
    """One mapping and the aligned span of it that arrays view."""

    __slots__ = ("mapping", "address", "pointer", "size", "returned_at", "__weakref__")

    def __init__(self, size: int):
        assert size > 0 and size % PAGE_BYTES == 0
        # Room to slide the start to a 2 MiB boundary; the slack is never
        # touched, so it costs address space only.
        slack = HUGE_PAGE_BYTES - PAGE_BYTES if size >= HUGE_PAGE_BYTES else 0
        self.mapping = mmap.mmap(-1, size + slack, **_MAP_FLAGS)
        keep = ffi.from_buffer(self.mapping)
        base = int(ffi.cast("uintptr_t", keep))
        del keep  # release the export, or close() would refuse
        self.address = _round_up(base, HUGE_PAGE_BYTES) if slack else base
        self.pointer = ffi.cast("uint8_t *", self.address)
        self.size = size
        self.returned_at = 0  # the pool's checkout count when it last came back
        self._advise(self.address - base)

    def _advise(self, offset: int) -> None:
        huge = self.size // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
        if _MADV_HUGEPAGE is None or huge == 0:
            return
        try:
            self.mapping.madvise(_MADV_HUGEPAGE, offset, huge)
        except OSError:  # THP disabled or unsupported: small pages still work
            pass

    def close(self) -> None:
        try:
            self.mapping.close()
        except BufferError:  # an export is still open: the mmap unmaps when it goes
            pass


class BufferPool:
    """A bounded pool of output blocks; see the module docstring."""

    def __init__(self, max_idle_bytes: int = MAX_IDLE_BYTES_DEFAULT,
                 min_bytes: int = MIN_BYTES_DEFAULT):
        self._lock = threading.RLock()
        self._idle: list[_Block] = []  # oldest first
        self._idle_bytes = 0
        self._max_idle_bytes = 0
        self._min_bytes = 0
        # Blocks mapped, handed out again, handed back, and unmapped so far.
        self._created = self._reused = self._returned = self._unmapped = 0
        self.configure(max_idle_bytes=max_idle_bytes, min_bytes=min_bytes)
        _POOLS.add(self)

    @property
    def min_bytes(self) -> int:
        """Requests smaller than this get plain ``np.empty``."""
        return self._min_bytes

    @property
    def max_idle_bytes(self) -> int:
        return self._max_idle_bytes

    def configure(self, *, max_idle_bytes: int | None = None, min_bytes: int | None = None) -> None:
        """Change the cap on idle bytes (0: keep nothing, every block is
        unmapped when its arrays are gone) or the smallest pooled request.
        Idle blocks over a lowered cap are unmapped now."""
        for name, value in (("max_idle_bytes", max_idle_bytes), ("min_bytes", min_bytes)):
            bad = not isinstance(value, int) or isinstance(value, bool) or value < 0
            if value is not None and bad:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if min_bytes is not None:
            self._min_bytes = max(1, min_bytes)
        if max_idle_bytes is not None:
            with self._lock:
                self._max_idle_bytes = max_idle_bytes
                spill = self._spill()
            for block in spill:
                block.close()

    def empty(self, shape: Any, dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array like ``np.empty(shape, dtype)``,
        in pooled memory when it is at least ``min_bytes`` large."""
        dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        if type(shape) is not tuple:
            shape = tuple(shape) if isinstance(shape, list) else (shape,)
        nbytes = math.prod(shape) * dt.itemsize
        if nbytes < self._min_bytes or dt.hasobject:
            return np.empty(shape, dtype=dt)
        size = _round_up(nbytes, PAGE_BYTES)
        block = self._take(size)
        if block is None:
            block = self._create(size)
        # The owner's finalizer runs when the cffi buffer, the array over it
        # and every view of that array are gone; the block is out until then.
        owner = ffi.gc(block.pointer, _Giveback(self, block))
        return np.ndarray(shape, dt, buffer=ffi.buffer(owner, nbytes))

    def _create(self, size: int) -> _Block:
        try:
            block = _Block(size)
        except OSError as exc:  # ENOMEM from mmap
            raise MemoryError(f"cannot map {size} bytes for a batch: {exc}") from None
        with self._lock:
            self._created += 1
        return block

    def _take(self, size: int) -> _Block | None:
        """The most recently returned idle block of exactly `size` bytes."""
        with self._lock:
            idle = self._idle
            for block in reversed(idle):
                if block.size == size:
                    break
            else:
                return None
            # A finalizer that re-entered on this thread may have moved the
            # list: remove by identity, and give up if the block is gone.
            try:
                idle.remove(block)
            except ValueError:
                return None
            self._idle_bytes -= block.size
            self._reused += 1
            return block

    def _give_back(self, block: _Block) -> None:
        with self._lock:
            self._returned += 1
            if block.size > self._max_idle_bytes:
                # It could only stay by pushing out everything else: unmap it.
                self._unmapped += 1
                spill = [block]
            else:
                block.returned_at = now = self._created + self._reused
                self._idle.append(block)
                self._idle_bytes += block.size
                over = self._idle_bytes > self._max_idle_bytes
                stale = self._idle[0].returned_at <= now - STALE_CHECKOUTS
                spill = self._spill() if over or stale else []
        for old in spill:
            old.close()

    def _spill(self) -> list[_Block]:
        """Idle blocks over the cap or gone stale, oldest first, taken out of
        the pool. Caller holds the lock and unmaps them after releasing it."""
        spill = []
        stale = self._created + self._reused - STALE_CHECKOUTS
        while self._idle and (self._idle_bytes > self._max_idle_bytes
                              or self._idle[0].returned_at <= stale):
            old = self._idle.pop(0)
            self._idle_bytes -= old.size
            spill.append(old)
        self._unmapped += len(spill)
        return spill

    def trim(self) -> None:
        """Unmap every idle block now."""
        with self._lock:
            spill, self._idle, self._idle_bytes = self._idle, [], 0
            self._unmapped += len(spill)
        for block in spill:
            block.close()

    def stats(self) -> dict:
        """``{idle_bytes, idle_blocks, outstanding, created, reused,
        returned, unmapped, max_idle_bytes, min_bytes}``."""
        with self._lock:
            return {
                "created": self._created, "reused": self._reused, "returned": self._returned,
                "unmapped": self._unmapped,
                "outstanding": self._created + self._reused - self._returned,
                "idle_bytes": self._idle_bytes, "idle_blocks": len(self._idle),
                "max_idle_bytes": self._max_idle_bytes, "min_bytes": self._min_bytes,
            }

    def _after_fork(self) -> None:
        self._lock = threading.RLock()


class _Giveback:
    """The finalizer of one hand-out: returns its block exactly once."""

    __slots__ = ("pool", "block")

    def __init__(self, pool: BufferPool, block: _Block):
        self.pool: BufferPool | None = pool
        self.block: _Block | None = block

    def __call__(self, _cdata: Any) -> None:
        pool, block = self.pool, self.block
        self.pool = self.block = None
        if pool is not None and block is not None:
            pool._give_back(block)


_POOLS: "weakref.WeakSet[BufferPool]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A thread of the parent may have held a pool's lock at the fork.
    for pool in list(_POOLS):
        pool._after_fork()


#: The pool behind every store's default output arrays (and the DataLoader's).
POOL = BufferPool()


def empty(shape: Any, dtype: Any) -> np.ndarray:
    """``POOL.empty``: an uninitialised batch array in library-owned memory."""
    return POOL.empty(shape, dtype)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
