"""The original loaderx 1.7.7's sampler, reproduced exactly, so that a run
started on 1.7.7 continues here with the same batches
(``DataLoader(..., sampler="1.7.7")``, and ``loaderx.zsampler.Sampler177``). loaderx's own sampler
(src/sampler.zig) draws other sequences from the same seed, and stays the
default: checkpoints of loaderx 3 depend on it.

What 1.7.7 computes (its src/zsampler.zig, confirmed against the installed
package by tests/compat/test_original177.py), for ``length`` L, ``batch_size`` B,
``seed`` S (default 42) and step s:

* SEQUENTIAL (0): ``(s*B + i) % L`` for i in 0..B.
* IID (1): one generator for the whole run, Zig's ``std.Random.Sfc64``
  seeded with S (a = b = c = S, counter = 1, 12 outputs discarded); each
  index is ``uintLessThan(u64, L)``: Lemire's multiply-shift on one 64-bit
  output x (``x * L >> 64``), redrawing while the low 64 bits of ``x * L``
  are below ``2**64 mod L`` (only when they are below L). Step s is the
  draws after ``s * B`` earlier ones, so seeking replays them (as 1.7.7
  did): O(s * B), about half a million draws per second here; checkpoints of the
  generator every 256 steps make going back cheap.
* CYCLIC (2): ``usable = L // B * B`` (L itself when L < B: a short batch),
  ``steps per cycle = ceil(usable / B)``; step s is cycle ``c = s // spc``
  at offset ``o = (s % spc) * B``; index i is ``permute(mix(S, c, 0), L,
  o + i)`` for i below ``min(B, usable - o)``. ``mix(seed, v, r)`` is a
  splitmix64 finalizer of ``seed ^ v*0x9E3779B97F4A7C15 ^
  r*0xD1B54A32D192ED03``; ``permute`` is a 4-round Feistel network on the
  smallest even number of bits 2h with ``2**2h >= L`` (round function
  ``mix(seed, right, round) & (2**h - 1)``), cycle-walked until the value
  is below L.

Every index comes out as 1.7.7 gave it (``uint64``).
"""
from __future__ import annotations

import threading
from typing import Any, Iterator

import numpy as np

from . import streams as _streams
from .mixture import Mixture

__all__ = ["Sampler177", "Remapped", "remap177", "SEED_177", "VIRTUAL_LENGTH"]

#: 1.7.7's default seed (its Sampler's and its DataLoader's).
SEED_177 = 42
_M = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ROUND = 0xD1B54A32D192ED03
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_ROUNDS = 4
#: IID: a generator state is kept every this many steps (and the latest).
_CHECKPOINT_STEPS = 256
_CHECKPOINTS_MAX = 256
#: The record positions a ``DataLoader(sampler="1.7.7")`` addresses (see `Remapped`).
VIRTUAL_LENGTH = 2**63 - 1  # (len() of a stream must fit a Py_ssize_t)


def _mix(seed: int, value: np.ndarray, rnd: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = np.uint64(seed) ^ (value * _GOLDEN) ^ np.uint64((rnd * _ROUND) & _M)
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _permute(seed: int, n: int, x: np.ndarray) -> np.ndarray:
    """1.7.7's bijection of [0, n), applied to every element of `x` (uint64)."""
    if n <= 1:
        return np.zeros(len(x), np.uint64)
    bits = (n - 1).bit_length()
    h = np.uint64((bits + (bits & 1)) >> 1)
    mask = np.uint64((1 << int(h)) - 1)
    y = x.copy()
    todo = np.arange(len(y))
    while len(todo):
        left, right = (y[todo] >> h) & mask, y[todo] & mask
        for r in range(_ROUNDS):
            left, right = right, left ^ (_mix(seed, right, r) & mask)
        y[todo] = (left << h) | right
        todo = todo[y[todo] >= np.uint64(n)]
    return y


class _Sfc64:
    """Zig's ``std.Random.Sfc64`` and its ``uintLessThan(u64, n)``, in Python ints."""

    __slots__ = ("a", "b", "c", "counter")

    def __init__(self, seed: int):
        self.a = self.b = self.c = seed & _M
        self.counter = 1
        self.draws(12, 0)

    def state(self) -> tuple:
        return (self.a, self.b, self.c, self.counter)

    @classmethod
    def restore(cls, state: tuple) -> "_Sfc64":
        rng = cls.__new__(cls)
        rng.a, rng.b, rng.c, rng.counter = state
        return rng

    def draws(self, count: int, n: int) -> list:
        """`count` indices below `n` (raw outputs when `n` is 0)."""
        a, b, c, counter = self.a, self.b, self.c, self.counter
        out = []
        threshold = ((1 << 64) - n) % n if n else 0
        for _ in range(count):
            while True:
                x = (a + b + counter) & _M
                counter += 1
                a = b ^ (b >> 11)
                b = (c + (c << 3)) & _M
                c = ((((c << 24) | (c >> 40)) & _M) + x) & _M
                if not n:
                    out.append(x)
                    break
                m = x * n
                if (m & _M) >= threshold:  # Lemire: redraw only below 2**64 mod n
                    out.append(m >> 64)
                    break
        self.a, self.b, self.c, self.counter = a, b, c, counter
        return out


class Sampler177:
    """1.7.7's ``loaderx.zsampler.Sampler``, exactly: ``Sampler177(length,
    batch_size, mode, seed=42)``; ``next()`` (a new ``uint64`` array),
    ``seek(step)``, iteration, and ``at(step)`` (any step, not moving;
    thread-safe). See the module docs for what each mode computes."""

    class Mode:
        SEQUENTIAL = 0
        IID = 1
        CYCLIC = 2

    def __init__(self, length: int, batch_size: int, mode: int, seed: int = SEED_177):
        if int(mode) not in (0, 1, 2):
            raise ValueError(f"mode must be 0 (SEQUENTIAL), 1 (IID) or 2 (CYCLIC), got {mode!r}")
        if not 1 <= int(length) < 2**64 or not 1 <= int(batch_size) < 2**63:
            raise ValueError(f"length and batch_size must be positive, got {length}, "
                             f"{batch_size}")
        self.length, self.batch_size = int(length), int(batch_size)
        self.mode, self.seed = int(mode), int(seed) & _M
        usable = self.length // self.batch_size * self.batch_size \
            if self.length >= self.batch_size else self.length
        self.usable = usable
        self.steps_per_cycle = -(-usable // self.batch_size)
        self.step = 0
        self._lock = threading.Lock()
        self._states = {0: _Sfc64(self.seed).state()}

    def batch_len(self, step: int) -> int:
        """How many indices step `step` has: ``batch_size``, except a CYCLIC
        sampler over fewer records than one batch (all of them)."""
        if self.mode == 2:
            offset = (step % self.steps_per_cycle) * self.batch_size
            return min(self.batch_size, self.usable - offset)
        return self.batch_size

    def at(self, step: int) -> np.ndarray:
        """The indices of step `step` (``uint64``), as 1.7.7 drew them."""
        step = int(step)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if self.mode == 0:
            first = step * self.batch_size % self.length
            if self.length + self.batch_size < 2**64:  # no uint64 overflow
                return (np.arange(self.batch_size, dtype=np.uint64) + np.uint64(first)) \
                    % np.uint64(self.length)
            return np.array([(first + i) % self.length for i in range(self.batch_size)],
                            np.uint64)
        if self.mode == 2:
            cycle, rest = divmod(step, self.steps_per_cycle)
            offset = rest * self.batch_size
            count = min(self.batch_size, self.usable - offset)
            seed = int(_mix(self.seed, np.array([cycle & _M], np.uint64), 0)[0])
            return _permute(seed, self.length, np.arange(offset, offset + count, dtype=np.uint64))
        return self._iid(step)

    def _iid(self, step: int) -> np.ndarray:
        with self._lock:
            start = max(s for s in self._states if s <= step)
            rng = _Sfc64.restore(self._states[start])
            for s in range(start, step):
                rng.draws(self.batch_size, self.length)
                if (s + 1) % _CHECKPOINT_STEPS == 0:
                    self._keep(s + 1, rng.state())
            out = np.array(rng.draws(self.batch_size, self.length), np.uint64)
            self._keep(step + 1, rng.state())
        return out

    def _keep(self, step: int, state: tuple) -> None:
        self._states[step] = state
        if len(self._states) > _CHECKPOINTS_MAX:  # keep step 0 and the latest ones
            for s in sorted(self._states)[1:len(self._states) - _CHECKPOINTS_MAX + 1]:
                del self._states[s]

    def next(self) -> np.ndarray:
        out = self.at(self.step)
        self.step += 1
        return out

    def seek(self, step: int) -> None:
        """Makes `step` the one ``next()`` returns (IID: the draws before it
        are replayed on the first read, as 1.7.7 did)."""
        self.step = int(step)

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    __next__ = next

    def __repr__(self) -> str:
        mode = ("SEQUENTIAL", "IID", "CYCLIC")[self.mode]
        return (f"Sampler177(length={self.length}, batch_size={self.batch_size}, mode={mode}, "
                f"seed={self.seed}, step={self.step})")


class Remapped:
    """A loader stream whose record positions are 1.7.7's draws: position
    ``s * B + i`` reads record ``sampler.at(s)[i]`` of `stream`. A
    ``DataLoader(sampler="1.7.7")`` runs its own ring in SEQUENTIAL mode over
    `VIRTUAL_LENGTH` positions of such streams, so step s of the loader is
    step s of 1.7.7's sampler, with every loader feature (``step=``,
    checkpoints, ``out=``, threads) unchanged."""

    def __init__(self, stream: Any, sampler: Sampler177):
        self._stream = stream
        self._sampler = sampler
        self.kind = stream.kind
        self.dtype = getattr(stream, "dtype", np.dtype(np.uint8))
        self.item_shape = getattr(stream, "item_shape", None)
        self.length = VIRTUAL_LENGTH // sampler.batch_size * sampler.batch_size
        base = getattr(stream, "fingerprint", None)
        self.fingerprint = (f"loaderx-1.7.7-sampler(mode={sampler.mode}, seed={sampler.seed}, "
                            f"length={sampler.length}):{base}")

    def __len__(self) -> int:
        return self.length

    def records(self, indices: Any) -> np.ndarray:
        """The records of `stream` at loader positions `indices`."""
        idx = np.asarray(indices, dtype=np.int64)
        b = self._sampler.batch_size
        steps, at = np.divmod(idx, b)
        out = np.empty(len(idx), np.int64)
        for s in np.unique(steps).tolist():
            pick = steps == s
            out[pick] = self._sampler.at(s)[at[pick]].astype(np.int64)
        return out

    def gather(self, indices: Any, out: Any = None, **kwargs: Any) -> Any:
        rows = self.records(indices)
        if self.kind == "dense":
            return self._stream.gather(rows, out=out, **kwargs)
        return self._stream.gather(rows, **kwargs)


def _mode_number(mode: Any) -> int:
    """A mode as 1.7.7 numbers it, from a ``Sampler.Mode``, its int or its name."""
    names = {"SEQUENTIAL": 0, "IID": 1, "CYCLIC": 2}
    if isinstance(mode, str) and mode.strip().upper() in names:
        return names[mode.strip().upper()]
    if _streams.is_int(mode) and int(mode) in (0, 1, 2):
        return int(mode)
    raise ValueError(f"mode must be 0 (SEQUENTIAL), 1 (IID) or 2 (CYCLIC), or its name; "
                     f"got {mode!r}")


def remap177(sampler: Any, streams: Any, batch_size: Any, mode: Any,
             seed: Any) -> tuple[dict, Sampler177]:
    """``DataLoader(sampler=...)``: the loader's streams remapped to 1.7.7's
    draws (`Remapped`), and the sampler that draws them."""
    if sampler != "1.7.7":
        raise ValueError(f"sampler must be None (loaderx's) or '1.7.7' (the original "
                         f"loaderx 1.7.7's sequence), got {sampler!r}")
    if isinstance(streams, Mixture):
        raise ValueError("sampler='1.7.7' reads one source (the original had no Mixture)")
    checked = _streams.check_streams(streams)
    length = len(next(iter(checked.values())))
    number = _mode_number(mode)
    batch = _streams.is_int(batch_size) and int(batch_size) >= 1
    if not batch:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    compat = Sampler177(length, int(batch_size), number, SEED_177 if seed is None else seed)
    if number == Sampler177.Mode.CYCLIC and length < compat.batch_size:
        raise ValueError(f"sampler='1.7.7', CYCLIC: {length} records are fewer than one batch "
                         f"of {compat.batch_size}; 1.7.7 served them as one short batch, which a "
                         "loaderx loader never does (use a smaller batch)")
    return {name: Remapped(s, compat) for name, s in checked.items()}, compat
