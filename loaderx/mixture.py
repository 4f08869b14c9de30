"""`Mixture`: several sources of aligned streams, mixed by weight.

``Mixture({"web": {"x": web_x, "y": web_y}, "code": {"x": code_x, "y": code_y}},
weights={"web": 0.7, "code": 0.3})`` is a stream source for ``DataLoader``.
Every source has the same stream names, with compatible types (the same
dtype and item shape for dense streams, the same dtype for ragged ones, bytes
with bytes); anything else is refused, naming the source and the stream. The
stream name ``source`` is reserved for ``batch["source"]``.

How records are drawn (the native loader does it, see ``src/mixture.zig``):

* Weights are positive and normalized, then held as exact ratios of
  integers (``Fraction(w).limit_denominator(10**6)`` of each normalized
  weight), so 0.7/0.3 or 1/3 are exact.
* Over the global stream of records (all ranks, all steps), source k's
  cumulative count after N records stays within ``ceil(log2 K)`` records of
  ``N * w_k`` (one record for two sources, two for three or four), never
  decreases, and is a pure function of N: O(number of sources) per step,
  nothing replayed, and a resumed run with another global batch continues
  every source exactly.
* Each source has its own sampler (the loader's mode), seeded from
  ``(seed, source name)``: in CYCLIC mode every source cycles through its own
  records independently (a small source starts cycles more often), and no
  batch repeats a record of a source: a step takes all its records of a
  source from one cycle of that source. As a source's count varies from step
  to step, its cycles last a fixed number of steps, the most whose records
  can never exceed its length, and drop the rest (about one step's count of
  it, plus a record or two); this keeps seeking and resuming O(1) (the loader
  state holds each source's cycle and offset; see ``src/mixture.zig``). A
  source that a single step could need more records of than it has is
  refused, naming it (use IID for such a mixture).
* The records of a step are ordered by a keyed permutation, so any slice of
  a batch (a rank's shard, a gradient-accumulation micro-batch) has close to
  the mixture's proportions. ``batch["source"]`` (int16) names each record's
  source; ``loader.sources`` maps the ids to names.
"""
from __future__ import annotations

import hashlib
import math
import numbers
from fractions import Fraction
from typing import Any, Dict, List, Mapping

import numpy as np

from .streams import check_streams

__all__ = ["Mixture"]

#: Largest sum of the integer weights the native loader takes.
_WEIGHT_TOTAL_MAX = 1 << 40
_DENOMINATOR_MAX = 10**6


def _signature(stream: Any) -> tuple:
    """What two sources' streams of one name must share (checked streams)."""
    kind = stream.kind
    dtype = np.dtype(getattr(stream, "dtype", np.uint8))
    shape: Any = getattr(stream, "item_shape", None)
    return (kind, dtype, None if kind != "dense" else tuple(shape))


def integer_weights(weights: List[float]) -> List[int]:
    """Positive weights as integers in the same exact ratios (see the module
    docs); sums above 2**40 are rounded to that scale."""
    total = Fraction(0)
    parts = []
    for w in weights:
        # Fraction takes ints, Fractions and Python floats; other reals
        # (numpy floats) go through float first.
        exact = isinstance(w, (numbers.Rational, float))
        parts.append(Fraction(w) if exact else Fraction(float(w)))
        total += parts[-1]
    ratios = [(p / total).limit_denominator(_DENOMINATOR_MAX) for p in parts]
    scale = math.lcm(*(r.denominator for r in ratios))
    numbers_ = [int(r * scale) for r in ratios]
    if any(n == 0 for n in numbers_):
        raise ValueError(f"weights {weights} are too uneven to represent (ratio below 1e-6)")
    g = math.gcd(*numbers_)
    numbers_ = [n // g for n in numbers_]
    total_int = sum(numbers_)
    if total_int > _WEIGHT_TOTAL_MAX:
        numbers_ = [max(1, n * _WEIGHT_TOTAL_MAX // (2 * total_int)) for n in numbers_]
    return numbers_


def source_seed(seed: int, name: str) -> int:
    """The seed of source `name`'s own sampler: a hash of (seed, name)."""
    digest = hashlib.blake2b(f"{seed}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class Mixture:
    """Sources (name -> {stream name -> stream}) mixed by `weights`
    (name -> positive number). See the module docs for the guarantees."""

    def __init__(self, sources: Mapping[str, Mapping[str, Any]], weights: Mapping[str, float]):
        if not isinstance(sources, Mapping) or not sources:
            raise TypeError("Mixture needs a non-empty dict of "
                            "source name -> {stream name: stream}")
        if not isinstance(weights, Mapping):
            raise TypeError("weights must be a dict of source name -> weight, "
                            f"got {type(weights).__name__}")
        names = list(sources)
        if len(names) > 256:
            raise ValueError(f"a Mixture takes at most 256 sources, got {len(names)}")
        if set(weights) != set(names):
            raise ValueError(f"weights name {sorted(map(str, weights))}, "
                             f"the sources are {sorted(map(str, names))}")
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"source names must be str, got {name!r}")
            w = weights[name]
            # An int may be too large for a float (math.isfinite), and is finite.
            if isinstance(w, bool) or not isinstance(w, numbers.Real) or w <= 0 or (
                    not isinstance(w, numbers.Integral) and not math.isfinite(w)):
                raise ValueError(f"weight of source {name!r} must be a positive number, got {w!r}")
        self._sources: Dict[str, Dict[str, Any]] = {
            name: check_streams(sources[name], source=name) for name in names}
        self._check_compatible()
        self._names = names
        self._integers = integer_weights([weights[n] for n in names])
        total = sum(self._integers)
        self._weights = {n: i / total for n, i in zip(names, self._integers)}

    def _check_compatible(self) -> None:
        first_name, first = next(iter(self._sources.items()))
        columns = list(first)
        if "source" in columns:
            raise ValueError("stream name 'source' is reserved in a Mixture: the loader adds "
                             "batch['source'] (each record's source id); rename the stream")
        for name, streams in self._sources.items():
            if sorted(streams) != sorted(columns):
                raise ValueError(f"source {name!r} has streams {sorted(streams)}, "
                                 f"source {first_name!r} has {sorted(columns)}: "
                                 "every source needs the same stream names")
            for column in columns:
                mine, theirs = _signature(first[column]), _signature(streams[column])
                if mine != theirs:
                    raise TypeError(f"stream {column!r}: source {name!r} holds "
                                    f"{_describe(theirs)}, source {first_name!r} holds "
                                    f"{_describe(mine)}")

    @property
    def names(self) -> List[str]:
        """The source names, in id order (``batch["source"]`` holds the ids)."""
        return list(self._names)

    @property
    def sources(self) -> Dict[str, Dict[str, Any]]:
        return {name: dict(streams) for name, streams in self._sources.items()}

    @property
    def weights(self) -> Dict[str, float]:
        """The normalized weights the loader uses (exact ratios, see the docs)."""
        return dict(self._weights)

    @property
    def integer_weights(self) -> List[int]:
        return list(self._integers)

    @property
    def columns(self) -> List[str]:
        return list(next(iter(self._sources.values())))

    def __repr__(self) -> str:
        parts = ", ".join(f"{n!r}: {self._weights[n]:.4g}" for n in self._names)
        return f"Mixture({{{parts}}}, streams={self.columns})"


def _describe(signature: tuple) -> str:
    kind, dtype, shape = signature
    return f"{kind} {dtype}" + (f" {list(shape)}" if shape is not None else "")
