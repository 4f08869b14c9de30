"""How a DataLoader is put together: its options checked, its record
sequence planned (sources, sampler, track), and the native ring and the
Python stages they call for built (``DataLoader.__init__`` keeps only what
it needs afterwards)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import _abi, _state, image, streams
from ._lib import usable_cores
from ._pipeline import Plan
from ._prefetch import Prefetcher, Stager, stageable
from ._ring import Ring
from ._workers import Workers
from .mixture import Mixture
from .zsampler import Sampler

#: Bounds of the native prefetch ring (``src/Loader.zig``): threads, steps in
#: flight (prefetch + workers) and columns.
WORKERS_MAX = _abi.LOADER_THREADS_MAX
WINDOW_MAX = _abi.LOADER_WINDOW_MAX
COLUMNS_MAX = _abi.LOADER_COLUMNS_MAX


def check_int(name: str, value: Any, minimum: int) -> int:
    if not streams.is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


class Options(NamedTuple):
    """A loader's checked options (workers defaults to the usable cores)."""

    workers: int
    prefetch: int
    prefetch_bytes: Optional[int]
    stop_after: Optional[int]


def check_options(workers: Optional[int], prefetch: int, prefetch_bytes: Optional[int],
                  stop_after: Optional[int], transform: Any, ragged: str) -> Options:
    prefetch = check_int("prefetch", prefetch, 1)
    workers = usable_cores() if workers is None else check_int("workers", workers, 1)
    if workers > WORKERS_MAX:
        raise ValueError(f"workers must be <= {WORKERS_MAX}, got {workers}")
    if prefetch + workers > WINDOW_MAX:
        raise ValueError(f"prefetch + workers must be <= {WINDOW_MAX}, "
                         f"got {prefetch} + {workers}")
    if transform is not None and not callable(transform):
        raise TypeError(f"transform must be callable or None, got {transform!r}")
    if ragged not in ("list", "packed"):
        raise ValueError(f"ragged must be 'list' or 'packed', got {ragged!r}")
    if prefetch_bytes is not None:
        prefetch_bytes = check_int("prefetch_bytes", prefetch_bytes, 1)
    if stop_after is not None:
        stop_after = check_int("stop_after", stop_after, 0)
    return Options(workers, prefetch, prefetch_bytes, stop_after)


#: The original loaderx's DataLoader parameters after `streams`, in its order
#: (0.7 to 1.7: ``DataLoader(streams, num_workers=4, batch_size=256,
#: prefetch_size=4, mode=2, seed=42, transform=...)``).
LEGACY_ORDER = ("num_workers", "batch_size", "prefetch_size", "mode", "seed", "transform")


def legacy_arguments(batch_size: Any, legacy: Tuple[Any, ...], given: Dict[str, Any],
                     defaults: Dict[str, Any]) -> Dict[str, Any]:
    """The loader's keywords from the original's spellings: two or more
    positional arguments after `streams` are the original's order
    (`LEGACY_ORDER`; one is loaderx 3's ``batch_size``), ``num_workers`` is
    ``workers`` (at least 1, as the original clamped it) and
    ``prefetch_size`` is ``prefetch``. `given`: the keywords as passed;
    `defaults`: their defaults (a keyword still at its default gives way to
    a positional one; one that is not is a conflict). Returns `given`
    updated."""
    out = dict(given, batch_size=batch_size)
    if legacy:
        values = (batch_size,) + tuple(legacy)
        if len(values) > len(LEGACY_ORDER):
            raise TypeError(f"DataLoader takes at most {len(LEGACY_ORDER) + 1} positional "
                            f"arguments (streams, {', '.join(LEGACY_ORDER)}), got "
                            f"{len(values) + 1}")
        for name, value in zip(LEGACY_ORDER, values):
            if name != "batch_size" and out[name] is not defaults[name]:
                raise TypeError(f"DataLoader got {name} twice: positionally (the original "
                                "loaderx's order) and as a keyword")
            out[name] = value
    for old, new in (("num_workers", "workers"), ("prefetch_size", "prefetch")):
        value = out.pop(old)
        if value is None:
            continue
        if out[new] is not defaults[new]:
            raise TypeError(f"DataLoader got both {old}= (the original loaderx's name) and "
                            f"{new}=, which are the same option; pass {new}= only")
        if old == "num_workers":
            value = max(1, check_int(old, value, 0))
        out[new] = value
    return out


def plan_of(sources: Any, batch_size: Any, mode: Any, seed: Any, step: Any,
            shard: Any, images: Any = None) -> Tuple[Plan, Sampler, _state.Track]:
    """A loader's sources, sampler and track, checked. The sampler checks
    batch_size, mode, seed, step and shard (and says which value is wrong);
    the loader keeps its normalised values. A mixture's sources are checked
    one by one (the Track)."""
    if not isinstance(sources, Mixture):
        sources = streams.check_streams(sources)
    _state.check_step("step", step)
    lengths = Plan(sources, 0).lengths
    length = lengths[0] if len(lengths) == 1 else min(sum(lengths), 2**63)
    sampler = Sampler(length, batch_size, mode, seed, step=step, shard=shard)
    checked = Plan(sources, sampler.seed, images)
    return checked, sampler, _state.Track(checked, sampler)


def build_ring(plan: Plan, sampler: Any, options: Options, *, base: Any,
               transform: Optional[Callable[[Dict[str, Any]], Any]], out: Any,
               ragged: str) -> Ring:
    """The ring of a checked loader, with the stages its streams need."""
    workers, prefetch = options.workers, options.prefetch
    if len(plan.columns) > COLUMNS_MAX:
        raise ValueError(f"at most {COLUMNS_MAX} streams, got {len(plan.columns)}")
    window = prefetch + workers
    # (A column, not its first stream: an image column's batch is its pipeline's.)
    out_checked = check_out(out, {c.name: c for c in plan.columns}, sampler.batch_size,
                            window + 1)
    if any(c.image is not None for c in plan.columns):
        image.choose_decoder()
    rank, world = sampler.shard
    # With a thread per core, each gather runs on its own thread alone.
    lanes = 1 if workers >= usable_cores() else 0
    ring = Ring(plan, batch_size=sampler.batch_size, rank=rank, world=world, seed=sampler.seed,
                mode=int(sampler.mode), window=window, threads=workers, lanes=lanes,
                base=base, packed=ragged == "packed", out=out_checked)
    if plan.python or transform is not None:
        ring.stage = Workers(ring, transform=transform, workers=workers,
                             gather_kwargs={"threads": lanes} if lanes else {})
    if plan.prefetching:
        kind = Stager if stageable(plan) else Prefetcher
        ring.prefetcher = kind(ring, options.prefetch_bytes)
    return ring


def check_out(out: Any, streams: Mapping[str, Any], batch_size: int,
              buffer_count_min: int) -> Dict[str, List[np.ndarray]]:
    """The recycled output buffers (``out=``), checked against the dense
    streams they fill (`streams`: name -> a stream of that column)."""
    if out is None:
        return {}
    if not isinstance(out, Mapping):
        raise TypeError(f"out must be a dict of name -> list of arrays, got {type(out).__name__}")
    checked: Dict[str, List[np.ndarray]] = {}
    for name, buffers in out.items():
        if name not in streams:
            raise ValueError(f"out names stream {name!r}, which is not one of {list(streams)}")
        store = streams[name]
        if store.kind != "dense":
            raise ValueError(f"out[{name!r}]: output buffers are only for dense streams, "
                             f"stream {name!r} is {store.kind}")
        if isinstance(buffers, np.ndarray) or not isinstance(buffers, Sequence):
            raise TypeError(f"out[{name!r}] must be a list of arrays, got {type(buffers).__name__}")
        if len(buffers) < buffer_count_min:
            raise ValueError(f"out[{name!r}] has {len(buffers)} buffers; it needs at least "
                             f"prefetch + workers + 1 = {buffer_count_min}")
        shape = (batch_size,) + tuple(store.item_shape)
        dtype = np.dtype(store.dtype)
        for position, buffer in enumerate(buffers):
            _check_buffer(f"out[{name!r}][{position}]", buffer, shape, dtype)
        for position, buffer in enumerate(buffers):
            for other in buffers[position + 1:]:
                if np.shares_memory(buffer, other):
                    raise ValueError(f"out[{name!r}]: buffers must not share memory")
        checked[name] = list(buffers)
    return checked


def _check_buffer(label: str, buffer: Any, shape: Tuple[int, ...], dtype: np.dtype) -> None:
    if not isinstance(buffer, np.ndarray):
        raise TypeError(f"{label} must be a numpy array, got {type(buffer).__name__}")
    if buffer.dtype != dtype or buffer.shape != shape:
        raise ValueError(
            f"{label} is {buffer.dtype}{list(buffer.shape)}, the stream needs {dtype}{list(shape)}"
        )
    if not buffer.flags.c_contiguous or not buffer.flags.writeable:
        raise ValueError(f"{label} must be C-contiguous and writable")
