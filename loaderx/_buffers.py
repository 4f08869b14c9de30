"""Batch arrays in the library's output memory: numpy arrays over buffers of
the native output pool (``src/outbuf.zig``), each freed when its last array
is gone.

Why the memory is native: a variable-size batch (ragged records, bytes) is
sized while the library reads it, and a DataLoader's prefetch ring writes
every column of a step on library threads, so those buffers must come from
native code, and must stay the library's until its threads have provably
stopped writing them. Dense gathers use the same pool, so there is one pool
of output memory with one set of bounds (the "why" in full is at the top of
``src/outbuf.zig``). This module only wraps buffers: an array's owner is a
cffi object whose destructor is the native free itself, so dropping a batch
runs no Python code (nothing to fail at interpreter exit, nothing a signal
handler can interrupt).

Why pooled: a fresh multi-MiB batch is a fresh ``mmap`` with a page fault per
4 KiB on first touch, the kernel's zeroing of each page and a TLB shootdown
at ``munmap``; a pooled block is faulted once, when it is made, and reused
(measured in CHANGELOG.md, 2026-12-01, and by ``scripts/bench_faults.py``). Blocks
are page aligned, and from 2 MiB on 2 MiB aligned and advised
``MADV_HUGEPAGE``.

Lifetime (the safety contract): an array from :func:`empty` views its buffer
through an owner object that its base keeps alive; views, slices,
``memoryview``\\ s, ``torch.from_numpy`` tensors and DLPack capsules all keep
the array (hence the owner) alive. The buffer goes back to its pool when the
last of them is gone, and only then can it be handed out again. Raw addresses
taken out of the array (``arr.ctypes.data``) are not references, exactly as
for any numpy array.

Bounds: buffers in use belong to their arrays, like any numpy allocation.
Idle blocks (handed back, not yet reused) are capped at ``max_idle_bytes``
(default 256 MiB): a block handed back beyond the cap pushes the
least recently returned idle blocks out, unmapped at once; so is a block left
idle while ``STALE_CHECKOUTS`` other blocks were handed out.
``POOL.configure(max_idle_bytes=0)`` keeps nothing. Requests smaller than
``min_bytes`` (default 1 MiB) are served by plain ``np.empty``: glibc serves
them from its heap without an ``mmap``.

Thread safety: every function may be called from any thread, and a block
comes back from whichever thread drops its last array. A forked child keeps
its copies of the idle blocks.
"""
from __future__ import annotations

import math
import mmap
from typing import Any

import numpy as np

from . import _abi
from ._lib import ffi, lib

PAGE_BYTES = mmap.PAGESIZE
HUGE_PAGE_BYTES = 2 << 20
#: Requests below this many bytes get plain ``np.empty`` (see the module doc).
MIN_BYTES_DEFAULT = _abi.OUTPUT_POOL["min_bytes"]
#: Idle bytes a pool keeps for reuse; more is unmapped as it comes back.
MAX_IDLE_BYTES_DEFAULT = _abi.OUTPUT_POOL["max_idle_bytes"]
#: A block left idle while this many blocks were handed out is unmapped.
STALE_CHECKOUTS = _abi.OUTPUT_POOL["stale_checkouts"]

_U8 = np.dtype(np.uint8)
#: The owner's destructor: a C function, so freeing runs no Python code.
_FREE_AT = lib.lx_free_buffer_at


class _Owned:
    """The base of an array over a library buffer: keeps its owner alive."""

    __slots__ = ("__array_interface__", "owner")
    __array_interface__: dict
    owner: Any


def owner() -> Any:
    """An empty owner slot (``uint8_t *[1]``) that a native call fills with a
    buffer; the buffer is freed when the slot (and every array over it) is gone."""
    return ffi.gc(ffi.new("uint8_t *[1]"), _FREE_AT)


def view(slot: Any, nbytes: int) -> np.ndarray:
    """A uint8 array over the buffer in `slot` (``nbytes`` long), keeping the
    slot alive; an empty array when the slot holds none."""
    address = int(ffi.cast("uintptr_t", slot[0]))
    if nbytes == 0 or address == 0:
        return np.zeros(0, _U8)
    keeper = _Owned()
    keeper.owner = slot
    keeper.__array_interface__ = {"data": (address, False), "shape": (nbytes,),
                                  "typestr": "|u1", "version": 3}
    return np.asarray(keeper)


def shaped(raw: np.ndarray, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """`raw` (uint8) as an array of `shape` and `dtype` (any dtype numpy can
    view bytes as, registered ones like bfloat16 included)."""
    return raw.view(dtype).reshape(shape)


def array(slot: Any, nbytes: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """The buffer in `slot` as a C-contiguous array of `shape` and `dtype`
    (``nbytes`` long), keeping the slot alive."""
    if dtype.isbuiltin != 1 or nbytes == 0:  # structured or registered: view the bytes
        return shaped(view(slot, nbytes), shape, dtype)
    keeper = _Owned()
    keeper.owner = slot
    keeper.__array_interface__ = {"data": (int(ffi.cast("uintptr_t", slot[0])), False),
                                  "shape": shape, "typestr": dtype.str, "version": 3}
    return np.asarray(keeper)


class BufferPool:
    """The library's output pool (see the module docstring); :data:`POOL` is
    the one instance. There is no pool of one's own: the library serves every
    buffer it hands out from this one, so a second pool would only split the
    idle memory and its cap (the native tests make isolated pools inside
    ``src/outbuf.zig``)."""

    def __init__(self, max_idle_bytes: int = MAX_IDLE_BYTES_DEFAULT,
                 min_bytes: int = MIN_BYTES_DEFAULT):
        _check_bounds(max_idle_bytes, min_bytes)
        self._max_idle_bytes = max_idle_bytes
        self._min_bytes = max(1, min_bytes)
        lib.lx_pool_configure(self._max_idle_bytes, self._min_bytes)

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
        _check_bounds(max_idle_bytes, min_bytes)
        if max_idle_bytes is not None:
            self._max_idle_bytes = max_idle_bytes
        if min_bytes is not None:
            self._min_bytes = max(1, min_bytes)
        lib.lx_pool_configure(self._max_idle_bytes, self._min_bytes)

    def empty(self, shape: Any, dtype: Any) -> np.ndarray:
        """An uninitialised C-contiguous array like ``np.empty(shape, dtype)``,
        in pooled memory when it is at least ``min_bytes`` large."""
        dt = dtype if isinstance(dtype, np.dtype) else np.dtype(dtype)
        if type(shape) is not tuple:
            shape = tuple(shape) if isinstance(shape, list) else (shape,)
        nbytes = math.prod(shape) * dt.itemsize
        if nbytes < self._min_bytes or dt.hasobject:
            return np.empty(shape, dtype=dt)
        slot = owner()
        rc = lib.lx_pool_alloc(nbytes, slot)
        if rc != 0:
            raise MemoryError(f"cannot allocate {nbytes} bytes for a batch")
        return array(slot, nbytes, shape, dt)

    def stats(self) -> dict:
        """``{idle_bytes, idle_blocks, outstanding, created, reused,
        returned, unmapped, max_idle_bytes, min_bytes}``."""
        out = ffi.new("lx_pool_stats_t *")
        lib.lx_pool_stats(out)
        st = {name: int(getattr(out, name)) for name in (
            "created", "reused", "returned", "unmapped", "idle_bytes", "idle_blocks",
            "max_idle_bytes", "min_bytes")}
        st["outstanding"] = st["created"] + st["reused"] - st["returned"]
        return st


def _check_bounds(max_idle_bytes: Any, min_bytes: Any) -> None:
    for name, value in (("max_idle_bytes", max_idle_bytes), ("min_bytes", min_bytes)):
        bad = not isinstance(value, int) or isinstance(value, bool) or value < 0
        if value is not None and bad:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")


#: The pool behind every store's default output arrays, variable-size reads
#: and the DataLoader's batches.
POOL = BufferPool()


def empty(shape: Any, dtype: Any) -> np.ndarray:
    """``POOL.empty``: an uninitialised batch array in library-owned memory."""
    return POOL.empty(shape, dtype)
