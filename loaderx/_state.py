"""Where a DataLoader is in its record sequence, and its checkpoints.

A `Base` says where a step starts: the ``step``, the global ``position`` of
its first record and, for a CYCLIC mixture, each source's cursor (its cycle,
the offset of its next record in that cycle, and the steps the cycle still
lasts; see ``src/mixture.zig``). A `Track` holds what the sequence depends on
besides the step (mode, source lengths and weights, global batch) and checks
that CYCLIC can serve it without repeating a record in a step.
``track.start(step)`` is a fresh run's base at ``step``; ``base.at(step)``
the base of any later step of the same run, O(1) in the step (a native call
over the sources for a CYCLIC mixture). The native ring computes every
step's indices from the base it was given, the same way.

Positions. SEQUENTIAL and IID steps hold ``G = batch_size * world`` positions
each, from step 0 at position 0. A one-source CYCLIC run reads position ``p``
as offset ``p % length`` of cycle ``p // length``, and a cycle serves
``length // G`` whole steps from offset 0 (``src/sampler.zig``): the state's
position says in which cycle, and where in it, the next batch starts. A
mixture's position is its mixed stream's (``G`` per step in every mode); its
CYCLIC sources each carry a cursor.

The state dict (version 3) holds plain values, pickles and round-trips
through JSON::

    {"version": 3, "seed": 0, "mode": "CYCLIC", "step": 1234, "position": 315904,
     "batch_size": 256, "shard": [rank, world], "lengths": {"x": 50000},
     "sources": None, "cursors": None, "fingerprints": {"x": None}}

``lengths`` and ``fingerprints`` map stream names (for a mixture: source
names, then stream names) to each stream's length and ``fingerprint``
attribute (None where a stream has none); ``sources`` is a mixture's names
and integer weights; ``cursors`` a CYCLIC mixture's ``{source: [cycle,
offset, steps_left]}``. Restoring checks every field that defines the record
sequence and refuses a mismatch with a ``ValueError`` naming the field and
both values. With the saved global batch the run continues exactly; with
another (an elastic resume) a CYCLIC run continues inside the same cycle from
the same offset, serves as many whole new batches as the cycle's rest holds,
drops the remainder and goes on with whole cycles: no record repeats within
the cycle. States of versions 1 and 2 come from a loaderx whose CYCLIC
cycles ran back to back (a batch could straddle two cycles and repeat a
record): they are refused, since no position of the new sequence matches
theirs.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ._lib import check, ffi, lib
from ._checks import is_int

#: Version of the dict written by ``DataLoader.state_dict()``.
STATE_VERSION = 3

_STATE_KEYS = {
    3: ("version", "seed", "mode", "step", "position", "batch_size", "shard", "lengths",
        "sources", "cursors", "fingerprints"),
}
#: Versions written by earlier loaderx releases, refused with the reason.
_OLD_VERSIONS = (1, 2)

#: Steps are int64 (JSON- and checkpoint-friendly), with room for the window.
STEP_MAX = 2**63 - 2**20
#: A base's global position (and a cursor's cycle) stays below this, so every
#: later position of a realistic run, and every state_dict(), fits 64 bits.
POSITION_MAX = 2**63

_CYCLIC = "CYCLIC"
#: A subset fingerprint of loaderx 3.0.0 (it named the dataset's path;
#: loaderx.subset keeps it as a fingerprint alias where the dataset did not move).
_PLACE_FINGERPRINT = re.compile(r"subset of .+: [\d,]+ of [\d,]+ records, blake2b:[0-9a-f]+$")
Cursor = Tuple[int, int, int]


def check_step(field: str, step: Any) -> None:
    """The upper bound of a step (the sampler refuses negative ones)."""
    if is_int(step) and step > STEP_MAX:
        raise ValueError(f"{field} must be in [0, {STEP_MAX}], got {step}")


class Track:
    """What a loader's record sequence depends on besides the step. Refuses a
    CYCLIC configuration in which a step would have to repeat a record."""

    def __init__(self, plan: Any, sampler: Any) -> None:
        self.mode = sampler.mode.name
        self.lengths: List[int] = list(plan.lengths)
        self.weights: List[int] = list(plan.weights)
        self.names: List[str] = list(plan.source_names)
        self.global_batch: int = sampler.global_batch_size
        #: One source: the sampler's positions (the Sampler refuses a CYCLIC
        #: global batch above its length). Several: a mixed stream, and in
        #: CYCLIC mode a cursor per source.
        self.cursored = self.mode == _CYCLIC and len(self.lengths) > 1
        if self.cursored:
            self._check_sources()

    def _check_sources(self) -> None:
        """Every source must hold the most records one step can take of it."""
        sources = self._native_sources(None)
        most = ffi.new("uint64_t[]", len(self.lengths))
        check(lib.lx_mixture_step_max(sources, len(self.lengths), self.global_batch, most),
              None, "Mixture")
        total = sum(self.weights)
        for k, (name, length) in enumerate(zip(self.names, self.lengths)):
            if most[k] > length:
                raise ValueError(
                    f"CYCLIC mixture: source {name!r} has {length} records, but one step of "
                    f"{self.global_batch} records can take up to {most[k]} of them (weight "
                    f"{self.weights[k] / total:.4g}), so its records would repeat within a "
                    "batch. Use a smaller global batch (batch_size * world), a larger source or "
                    "a smaller weight, or mode IID")

    def _native_sources(self, cursors: Optional[Sequence[Cursor]]) -> Any:
        sources = ffi.new("lx_source_t[]", len(self.lengths))
        for k, (length, weight) in enumerate(zip(self.lengths, self.weights)):
            sources[k].length = length
            sources[k].weight = weight
            if cursors is not None:
                cycle, offset, steps_left = cursors[k]
                sources[k].cursor = {"cycle": cycle, "offset": offset, "steps_left": steps_left}
        return sources

    def position_at(self, base_step: int, base_position: int, step: int) -> int:
        """The global position of `step`'s first record in the run whose step
        `base_step` starts at `base_position` (src/sampler.zig, positionAt)."""
        steps = step - base_step
        g = self.global_batch
        if self.mode != _CYCLIC or len(self.lengths) != 1:
            return base_position + steps * g
        length = self.lengths[0]
        cycle, offset = divmod(base_position, length)
        left = (length - offset) // g  # whole batches in the rest of the base's cycle
        if steps < left:
            return base_position + steps * g
        later = steps - left
        per_cycle = length // g
        return (cycle + 1 + later // per_cycle) * length + (later % per_cycle) * g

    def cursors_at(self, step: int, position: int, cursors: Sequence[Cursor],
                   at: int) -> Tuple[Cursor, ...]:
        """The sources' cursors at step `at`, from their `cursors` at `step`
        (mixed position `position`; a cursor's steps_left may be 0: see
        src/mixture.zig). ValueError for cursors that do not fit."""
        out = ffi.new("lx_cursor_t[]", len(self.lengths))
        rc = lib.lx_mixture_cursors(self._native_sources(cursors), len(self.lengths),
                                    self.global_batch, step, position, at, out)
        if rc != 0:
            detail = ffi.string(lib.lx_last_error()).decode("utf-8", "replace")
            raise ValueError(f"state cursors do not fit this loader's sources {self.names}: "
                             f"{detail}")
        return tuple((c.cycle, c.offset, c.steps_left) for c in out)

    def start(self, step: int) -> "Base":
        """The base of a fresh run (step 0 at position 0) at `step`."""
        if self.cursored:
            fresh = [(0, 0, 0)] * len(self.lengths)
            base = Base(self, step, step * self.global_batch, self.cursors_at(0, 0, fresh, step))
        else:
            base = Base(self, step, self.position_at(0, 0, step), None)
        if base.position > POSITION_MAX:
            raise ValueError(
                f"the first record's global position (step {step}, batch_size * world = "
                f"{self.global_batch}) must be <= 2**63, got {base.position}")
        return base


class Base:
    """Where step `step` starts: its first record's global `position` and, for
    a CYCLIC mixture, every source's cursor (steps_left >= 1)."""

    __slots__ = ("track", "step", "position", "cursors")

    def __init__(self, track: Track, step: int, position: int,
                 cursors: Optional[Tuple[Cursor, ...]]) -> None:
        self.track = track
        self.step = step
        self.position = position
        self.cursors = cursors

    def at(self, step: int) -> "Base":
        """The base of `step` (>= this one's) in the same run."""
        track = self.track
        if step == self.step:
            return self
        position = self.position_of(step)
        cursors = None
        if self.cursors is not None:
            cursors = track.cursors_at(self.step, self.position, self.cursors, step)
        return Base(track, step, position, cursors)

    def position_of(self, step: int) -> int:
        """The global position of `step`'s (>= this one's) first record."""
        if step < self.step:
            raise ValueError(f"step {step} is before this run's first step {self.step}")
        return self.track.position_at(self.step, self.position, step)

    def last_step(self) -> int:
        """The largest step of this run whose state `load_state` accepts (step
        <= STEP_MAX, global position <= POSITION_MAX): a loader takes only the
        steps before it, so every state_dict() it gives loads again. Positions
        grow with the step, so a bisection finds it."""
        low, high = self.step, STEP_MAX
        if self.position_of(high) <= POSITION_MAX:
            return high
        while high - low > 1:  # position_of(low) fits, position_of(high) does not
            mid = (low + high) // 2
            if self.position_of(mid) <= POSITION_MAX:
                low = mid
            else:
                high = mid
        return low

    def __repr__(self) -> str:
        return f"Base(step={self.step}, position={self.position}, cursors={self.cursors})"


# ---------------------------------------------------------------- the state dict


def state_dict(plan: Any, sampler: Any, base: Base) -> Dict[str, Any]:
    """The version-3 state of a loader whose next undelivered step starts at `base`."""
    rank, world = sampler.shard
    cursors = None
    if base.cursors is not None:
        cursors = {name: list(c) for name, c in zip(plan.source_names, base.cursors)}
    return {
        "version": STATE_VERSION,
        "seed": sampler.seed,
        "mode": sampler.mode.name,
        "step": base.step,
        "position": base.position,
        "batch_size": sampler.batch_size,
        "shard": [rank, world],
        "lengths": _lengths_state(plan),
        "sources": _sources_state(plan),
        "cursors": cursors,
        "fingerprints": _fingerprints_state(plan),
    }


def load_state(state: Any, plan: Any, sampler: Any, track: Track) -> Base:
    """The base `state` resumes at; ValueError (TypeError for a wrongly typed
    field) when it does not describe this loader's record sequence."""
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    version = state.get("version")
    if is_int(version) and version in _OLD_VERSIONS:
        raise ValueError(
            f"DataLoader state version {version} comes from an older loaderx, whose CYCLIC "
            "order ran cycles back to back (a batch could straddle two cycles and repeat a "
            f"record); version {STATE_VERSION} serves each cycle in whole batches and drops "
            "its rest, so no position of the new order continues the old one, and old states "
            "carry no stream fingerprints. It cannot be resumed exactly: start a new run, or "
            "pass DataLoader(..., step=state['step']) to keep the step count (for SEQUENTIAL "
            "and IID with the same global batch, that is the same record sequence)")
    if not is_int(version) or version not in _STATE_KEYS:
        raise ValueError(f"unsupported DataLoader state version {version!r}; "
                         f"this loaderx reads versions {sorted(_STATE_KEYS)}")
    keys = _STATE_KEYS[version]
    missing = [key for key in keys if key not in state]
    if missing:
        raise ValueError(f"DataLoader state is missing {missing}")
    unknown = sorted(str(key) for key in state if key not in keys)
    if unknown:
        raise ValueError(f"DataLoader state has unknown keys {unknown}")
    _check_state_types(state)
    step = int(state["step"])
    check_step("state step", step)
    position = _check_position(state["position"])
    _check_equal("mode", state["mode"], sampler.mode.name)
    _check_equal("seed", state["seed"], sampler.seed)
    _check_lengths(state["lengths"], _lengths_state(plan))
    _check_equal("sources", state["sources"], _sources_state(plan))
    _check_fingerprints(state["fingerprints"], _fingerprints_state(plan), _aliases_state(plan))
    saved = _check_cursors(state, plan, track)
    if saved is None:
        return Base(track, step, position, None)
    # steps_left counts steps of the saved global batch: kept with the same
    # one (the run continues exactly), found again for another.
    if int(state["batch_size"]) * int(state["shard"][1]) != track.global_batch:
        saved = [(cycle, offset, 0) for cycle, offset, _ in saved]
    return Base(track, step, position, track.cursors_at(step, position, saved, step))


def _lengths_state(plan: Any) -> Dict[str, Any]:
    if plan.mixture is None:
        return {c.name: plan.lengths[0] for c in plan.columns}
    return {name: {c.name: n for c in plan.columns}
            for name, n in zip(plan.source_names, plan.lengths)}


def _sources_state(plan: Any) -> Optional[Dict[str, Any]]:
    if plan.mixture is None:
        return None
    return {"names": list(plan.source_names), "weights": list(plan.weights)}


def _fingerprint(stream: Any) -> Optional[str]:
    """A stream's ``fingerprint`` (see loaderx.streams): what record set it
    holds; None when it has none."""
    value = getattr(stream, "fingerprint", None)
    return None if value is None else str(value)


def _aliases(stream: Any) -> Tuple[str, ...]:
    """Older spellings of a stream's fingerprint that a state may hold for
    the same records (``fingerprint_aliases``, see loaderx.streams)."""
    return tuple(str(a) for a in getattr(stream, "fingerprint_aliases", ()) or ())


def _fingerprints_state(plan: Any) -> Dict[str, Any]:
    return _per_stream(plan, _fingerprint)


def _aliases_state(plan: Any) -> Dict[str, Any]:
    return _per_stream(plan, _aliases)


def _per_stream(plan: Any, of: Any) -> Dict[str, Any]:
    """``{stream: of(stream)}``; for a mixture ``{source: {stream: ...}}``."""
    if plan.mixture is None:
        return {c.name: of(c.streams[0]) for c in plan.columns}
    return {name: {c.name: of(c.streams[k]) for c in plan.columns}
            for k, name in enumerate(plan.source_names)}


def _check_state_types(state: Mapping[str, Any]) -> None:
    step = state["step"]
    if not is_int(step) or step < 0:
        raise TypeError(f"state step must be an int >= 0, got {step!r}")
    for key in ("seed", "batch_size"):
        if not is_int(state[key]):
            raise TypeError(f"state {key} must be an int, got {state[key]!r}")
    if state["batch_size"] < 1:
        raise ValueError(f"state batch_size must be >= 1, got {state['batch_size']!r}")
    if not isinstance(state["mode"], str):
        raise TypeError(f"state mode must be a str, got {state['mode']!r}")
    shard = state["shard"]
    if (isinstance(shard, (str, bytes)) or not isinstance(shard, Sequence) or len(shard) != 2
            or not all(is_int(value) for value in shard) or not 0 <= shard[0] < shard[1]):
        raise TypeError(f"state shard must be [rank, world], got {shard!r}")
    for key in ("lengths", "fingerprints"):
        value = state[key]
        if not isinstance(value, Mapping) or not all(isinstance(name, str) for name in value):
            raise TypeError(f"state {key} must be a dict keyed by stream names, got {value!r}")


def _check_position(position: Any) -> int:
    if not is_int(position) or position < 0:
        raise TypeError(f"state position must be an int >= 0, got {position!r}")
    if position > POSITION_MAX:
        raise ValueError(f"state position must be <= 2**63, got {position}")
    return int(position)


def _check_equal(field: str, state_value: Any, own_value: Any) -> None:
    if state_value != own_value:
        raise ValueError(f"state {field} is {state_value!r} but this loader has {own_value!r}")


def _check_lengths(lengths: Mapping[str, Any], own: Mapping[str, Any]) -> None:
    if sorted(lengths) != sorted(own):
        raise ValueError(f"state streams {sorted(lengths)} differ from "
                         f"this loader's {sorted(own)}")
    for name, length in own.items():
        _check_equal(f"lengths[{name!r}]", lengths[name], length)


def _check_fingerprints(fingerprints: Mapping[str, Any], own: Mapping[str, Any],
                        aliases: Mapping[str, Any]) -> None:
    """Each stream's record set must be the one the state was saved with
    (its fingerprint, or an older spelling of it: `_aliases`)."""
    if sorted(fingerprints) != sorted(own):
        raise ValueError(f"state fingerprints name {sorted(fingerprints)}, "
                         f"this loader's streams are {sorted(own)}")
    for name, value in own.items():
        if isinstance(value, dict):
            inner = fingerprints[name]
            if not isinstance(inner, Mapping) or sorted(inner) != sorted(value):
                _check_equal(f"fingerprints[{name!r}]", inner, value)
            for column, fingerprint in value.items():
                _check_fingerprint(f"fingerprints[{name!r}][{column!r}]", inner[column],
                                   fingerprint, aliases[name][column])
        else:
            _check_fingerprint(f"fingerprints[{name!r}]", fingerprints[name], value,
                               aliases[name])


def _check_fingerprint(field: str, saved: Any, own: Optional[str],
                       aliases: Tuple[str, ...]) -> None:
    if saved == own or (saved is not None and saved in aliases):
        return
    if saved is None or own is None:
        _check_equal(field, saved, own)
    if isinstance(saved, str) and _PLACE_FINGERPRINT.search(saved):
        why = ("a subset fingerprint of loaderx 3.0.0, which named the dataset's path: it "
               "resumes only on the dataset at that path. Resume there")
    else:
        why = ("they hold other records (another dataset, or another subset of it). Resume on "
               "the data the checkpoint was taken on (any copy of it resumes, local or remote: "
               "a fingerprint names the records, not where they are)")
    raise ValueError(f"state {field} is {saved!r} but this loader has {own!r}: {why}, or start "
                     "a new run (DataLoader(..., step=state['step']) keeps the step count)")


def _check_cursors(state: Mapping[str, Any], plan: Any,
                   track: Track) -> Optional[List[Cursor]]:
    """A CYCLIC mixture's cursors, one [cycle, offset, steps_left] per source
    (None for every other loader, whose state must hold None)."""
    cursors = state["cursors"]
    if not track.cursored:
        if cursors is not None:
            raise ValueError(f"state cursors must be None for this loader (only a CYCLIC "
                             f"mixture has them), got {cursors!r}")
        return None
    names = list(plan.source_names)
    if not isinstance(cursors, Mapping) or sorted(map(str, cursors)) != sorted(names):
        raise TypeError(f"state cursors must be a dict of source name -> [cycle, offset, "
                        f"steps_left] for sources {names}, got {cursors!r}")
    out = []
    for name in names:
        cursor = cursors[name]
        if (isinstance(cursor, (str, bytes)) or not isinstance(cursor, Sequence)
                or len(cursor) != 3 or not all(is_int(v) and v >= 0 for v in cursor)):
            raise TypeError(f"state cursors[{name!r}] must be [cycle, offset, steps_left] "
                            f"(ints >= 0), got {cursor!r}")
        cycle, offset, steps_left = (int(v) for v in cursor)
        if cycle > POSITION_MAX or offset >= 2**64 or steps_left >= 2**64:
            raise ValueError(f"state cursors[{name!r}] is out of range: {cursor!r}")
        out.append((cycle, offset, steps_left))
    return out
