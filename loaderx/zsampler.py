"""Step-based batch sampler: which record indices form the batch at each step.

A :class:`Sampler` is endless and stateless underneath: the batch at step ``s``
is a pure function of ``(length, batch_size, mode, seed, s, shard)``, computed
by the native library (``src/sampler.zig``). ``next()`` walks the steps in
order, ``at(s)`` reads any step without moving, and ``seek(s)`` jumps in O(1),
so checkpointing a sampler means saving one integer.

Modes (:class:`Sampler.Mode`):

* ``SEQUENTIAL``: ``0, 1, 2, ...`` around a circular window; a batch that
  crosses the end wraps to the start, so the tail never truncates.
* ``IID``: uniform with replacement, unbiased (Lemire's method with rejection)
  from a counter-based generator keyed by ``(seed, position)``.
* ``CYCLIC`` (default): without replacement, and no batch ever repeats an
  index. Each cycle is a fresh permutation of ``range(length)`` keyed by
  ``(seed, cycle)``; a cycle serves ``length // global_batch_size`` whole
  global batches from the start of its permutation and drops the rest of it
  (fewer than one global batch; a different rest each cycle, as the
  permutation changes). So within a cycle every index appears at most once,
  every batch is full size, and no batch straddles two cycles. A global batch
  larger than ``length`` would have to repeat an index: it is refused (use
  ``IID``, or ``SEQUENTIAL``, which wraps around). O(1) memory for any length.

Sharding: ``shard=(rank, world)`` makes step ``s`` of rank ``r`` the slice
``[r*B, (r+1)*B)`` of the global batch ``s`` of size ``world*B``. The ranks'
batches are disjoint (in CYCLIC mode, and in SEQUENTIAL mode while the
global batch is at most ``length``), equal-size, and together equal what one
unsharded process with ``batch_size=world*B`` sees at the same step.

`Sampler177` is the original loaderx 1.7.7's sampler, reproduced exactly
(``loaderx._sampler177``; ``DataLoader(sampler="1.7.7")`` uses it): the
same seed gives other sequences here, and a run started on 1.7.7 continues
with it.

Indices are returned as ``int64`` arrays, so ``length`` is at most ``2**63``.
A ``Sampler`` object is not meant to be shared between threads while one of
them calls ``next()`` or ``seek()``; ``at()`` is pure and may be called from
any thread.
"""
from __future__ import annotations

import enum
import operator
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from loaderx import _abi
from loaderx._lib import check, ffi, lib
from loaderx._sampler177 import Sampler177

__all__ = ["Sampler", "Sampler177"]

_U64_MAX = 2**64 - 1
# Indices leave as int64: the largest index, length - 1, must fit.
_LENGTH_MAX = 2**63
# numpy cannot allocate more elements than an intp holds.
_BATCH_SIZE_MAX = 2**63 - 1
# Consecutive batches are computed this many indices at a time (one native
# call per block instead of one per batch); see Sampler.next.
_BLOCK_INDICES = 4096

_fill = lib.lx_sampler_fill
_from_buffer = ffi.from_buffer
_U64_ARRAY = ffi.typeof("uint64_t[]")
_NO_STEP = -1  # A block bound no step can fall in (steps are >= 0).


def _integer(name: str, value: Any) -> int:
    """`value` as a Python int; TypeError (naming it) for anything not an integer."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, "
                        f"got {type(value).__name__} {value!r}") from None


def _mode(value: Any) -> "Sampler.Mode":
    Mode = Sampler.Mode
    if isinstance(value, Mode):
        return value
    if isinstance(value, str):
        try:
            return Mode(value)  # type: ignore[arg-type]  # Mode._missing_ maps a name
        except ValueError:
            raise ValueError("mode must be one of 'sequential', 'iid', 'cyclic' (any case), "
                             f"got {value!r}") from None
    number = _integer("mode", value)
    try:
        return Mode(number)
    except ValueError:
        raise ValueError("mode must be 0 (SEQUENTIAL), 1 (IID) or 2 (CYCLIC), "
                         f"got {value!r}") from None


def _step(value: Any) -> int:
    step = _integer("step", value)
    if not 0 <= step <= _U64_MAX:
        raise ValueError(f"step must be in [0, 2**64), got {step}")
    return step


def _shard(value: Any) -> Tuple[int, int]:
    if value is None:
        return (0, 1)
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"shard must be a (rank, world) pair, got {value!r}")
    rank = _integer("shard rank", value[0])
    world = _integer("shard world", value[1])
    if not 1 <= world <= _U64_MAX:
        raise ValueError(f"shard world must be in [1, 2**64), got shard={value!r}")
    if not 0 <= rank < world:
        raise ValueError(f"shard rank must be in [0, world), got shard={value!r}")
    return (rank, world)


class Sampler:
    """An endless, step-indexed source of index batches over ``range(length)``.

    Args:
        length: number of records to draw from, in ``[1, 2**63]``.
        batch_size: indices per batch (per rank when sharded), ``>= 1``.
        mode: a :class:`Sampler.Mode`, its int value, or its name in any case.
        seed: in ``[0, 2**64)``; the same seed gives the same sequence
            everywhere (any machine, thread count or process).
        step: the step ``next()`` returns first, in ``[0, 2**64)``.
        shard: ``(rank, world)`` with ``0 <= rank < world``; ``None`` is ``(0, 1)``.

    Raises:
        TypeError: an argument that must be an integer is not one.
        ValueError: an argument is out of range; the message shows the value.
            Also a CYCLIC sampler whose global batch (``batch_size * world``)
            exceeds ``length``: no batch could avoid repeating an index.
    """

    class Mode(enum.IntEnum):
        """How indices are drawn: ``SEQUENTIAL`` (0), ``IID`` (1), ``CYCLIC`` (2).

        Also constructible from a name in any case: ``Sampler.Mode("cyclic")``.
        """

        SEQUENTIAL = _abi.SAMPLER_MODES["sequential"]
        IID = _abi.SAMPLER_MODES["iid"]
        CYCLIC = _abi.SAMPLER_MODES["cyclic"]

        @classmethod
        def _missing_(cls, value: object) -> Optional["Sampler.Mode"]:
            if isinstance(value, str):
                return cls.__members__.get(value.strip().upper())
            return None

    __slots__ = (
        "_length", "_batch_size", "_mode", "_mode_value", "_seed", "_step",
        "_rank", "_world", "_block_steps", "_block", "_block_first", "_block_end",
    )

    def __init__(
        self,
        length: int,
        batch_size: int,
        mode: Any = Mode.CYCLIC,
        seed: int = 0,
        *,
        step: int = 0,
        shard: Optional[Sequence[int]] = None,
    ) -> None:
        length = _integer("length", length)
        if not 1 <= length <= _LENGTH_MAX:
            raise ValueError(f"length must be in [1, 2**63], got {length}")
        batch_size = _integer("batch_size", batch_size)
        if not 1 <= batch_size <= _BATCH_SIZE_MAX:
            raise ValueError(f"batch_size must be in [1, 2**63), got {batch_size}")
        seed = _integer("seed", seed)
        if not 0 <= seed <= _U64_MAX:
            raise ValueError(f"seed must be in [0, 2**64), got {seed}")
        self._length = length
        self._batch_size = batch_size
        self._mode = _mode(mode)
        self._mode_value = int(self._mode)
        self._seed = seed
        self._step = _step(step)
        self._rank, self._world = _shard(shard)
        if self._mode == Sampler.Mode.CYCLIC and batch_size * self._world > length:
            raise ValueError(
                f"CYCLIC needs a global batch of at most length records: batch_size * world "
                f"= {batch_size} * {self._world} = {batch_size * self._world} > length "
                f"{length}, so every batch would repeat an index. Use a smaller batch, or "
                "mode IID (with replacement) or SEQUENTIAL (wraps around)")
        # Steps [q*K, (q+1)*K) come from one native call of K steps.
        self._block_steps = _BLOCK_INDICES // batch_size
        self._drop_block()

    # -- the read-only description ------------------------------------------------

    @property
    def length(self) -> int:
        """The number of records indices are drawn from: every index is in ``[0, length)``."""
        return self._length

    @property
    def batch_size(self) -> int:
        """Indices per batch on this rank."""
        return self._batch_size

    @property
    def mode(self) -> "Sampler.Mode":
        """The :class:`Sampler.Mode`."""
        return self._mode

    @property
    def seed(self) -> int:
        """The seed, in ``[0, 2**64)``."""
        return self._seed

    @property
    def shard(self) -> Tuple[int, int]:
        """``(rank, world)``; ``(0, 1)`` when not sharded."""
        return (self._rank, self._world)

    @property
    def global_batch_size(self) -> int:
        """Indices per step over all ranks: ``batch_size * world``."""
        return self._batch_size * self._world

    @property
    def step(self) -> int:
        """The step that ``next()`` returns next."""
        return self._step

    # -- reading batches ----------------------------------------------------------

    def at(self, step: int) -> np.ndarray:
        """The batch at ``step`` as a new ``int64`` array of ``batch_size``; does not move.

        A pure function of the sampler's parameters and ``step``: any thread,
        any order, always the same answer.
        """
        if type(step) is not int or not 0 <= step <= _U64_MAX:
            step = _step(step)
        out = np.empty(self._batch_size, np.int64)
        self._call(1, step, out)
        return out

    def next(self) -> np.ndarray:
        """The batch at ``step`` as a new ``int64`` array of ``batch_size``; then ``step += 1``.

        Equal to ``at(step)``. No later call writes to a returned array. Small
        batches are computed a block of about 4096 indices at a time and handed
        out as disjoint views of that block, which amortizes the native call.
        """
        step = self._step
        if self._block_first <= step < self._block_end:
            self._step = step + 1
            return self._block[step - self._block_first]
        batch = self._compute(step)
        self._step = step + 1
        return batch

    __next__ = next

    def __iter__(self) -> Iterator[np.ndarray]:
        """Endless: yields ``next()`` forever."""
        return self

    def seek(self, step: int) -> None:
        """Make ``step`` the next step ``next()`` returns. O(1)."""
        self._step = _step(step)
        # A batch already handed out is never handed out again (the caller may
        # have written to it), so seeking drops the block.
        self._drop_block()

    # -- internals ----------------------------------------------------------------

    def _drop_block(self) -> None:
        self._block: List[np.ndarray] = []
        self._block_first = _NO_STEP
        self._block_end = _NO_STEP

    def __reduce__(self) -> Tuple[Any, ...]:
        # Copies and pickles carry the parameters and the step, not the block.
        return (_restore, (self._length, self._batch_size, self._mode_value, self._seed,
                           self._step, self.shard))

    def _compute(self, step: int) -> np.ndarray:
        if step > _U64_MAX:
            raise OverflowError(f"step {step} is past the last step, 2**64 - 1")
        steps = self._block_steps
        if steps <= 1:
            out = np.empty(self._batch_size, np.int64)
            self._call(1, step, out)
            return out
        first = step - step % steps
        # Steps past 2**64 - 1 do not exist; keep them out of the block.
        end = min(first + steps, _U64_MAX + 1)
        block = np.empty((end - first, self._batch_size), np.int64)
        self._call(end - first, first, block)
        self._block = list(block)
        self._block_first = first
        self._block_end = end
        return self._block[step - first]

    def _call(self, steps: int, step: int, out: np.ndarray) -> None:
        rc = _fill(self._length, self._batch_size, steps, self._mode_value, self._seed, step,
                   self._rank, self._world, _from_buffer(_U64_ARRAY, out, require_writable=True))
        if rc != 0:  # every argument was validated at construction: a bug
            check(rc, None, f"lx_sampler_fill for {self!r} at step {step}")

    def __repr__(self) -> str:
        return (
            f"Sampler(length={self._length}, batch_size={self._batch_size}, "
            f"mode=Sampler.Mode.{self._mode.name}, seed={self._seed}, step={self._step}, "
            f"shard={self.shard})"
        )


def _restore(length: int, batch_size: int, mode: int, seed: int, step: int,
             shard: Tuple[int, int]) -> Sampler:
    return Sampler(length, batch_size, mode, seed, step=step, shard=shard)
