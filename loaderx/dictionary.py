"""Dictionaries for ``zstd_dict`` stores: `train_dict` samples records and
lets zstd's trainer build a dictionary. Training is always explicit: a store
is created with ``dict_bytes=``; nothing is trained silently."""
from __future__ import annotations

import numpy as np

from ._lib import check, ffi, lib
from ._store import U64, Store, u64_ptr
from .errors import DictionaryError

_TIERS = {"fast": (32 << 10, 4 << 20), "balanced": (128 << 10, 16 << 20),
          "max": (1 << 20, 64 << 20)}
_SAMPLE_MAX = 128 << 10  # zstd's trainer works on sample prefixes up to this size
#: Largest dictionary `size`: zstd never looks back further than its 2 GiB
#: maximum window, and a buffer this size is zero-filled before training.
_DICT_SIZE_MAX = 1 << 31


def _sample_records(source, budget: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    if isinstance(source, Store):
        n = len(source)
        if n == 0:
            raise DictionaryError(f"{source.path}: cannot train a dictionary on an empty store")
        order = rng.permutation(n)
        out, used = [], 0
        for start in range(0, n, 1024):
            idx = order[start:start + 1024]
            recs = source[idx]
            for r in recs:
                b = r.tobytes() if isinstance(r, np.ndarray) else bytes(r)
                b = b[:_SAMPLE_MAX]
                out.append(b)
                used += len(b)
                if used >= budget:
                    return out
        return out
    if isinstance(source, np.ndarray):
        if source.dtype.hasobject:
            raise TypeError("cannot train a dictionary on an object array")
        if source.ndim == 0 or len(source) == 0:
            raise DictionaryError("cannot train a dictionary on an empty array")
        rec = source[0].nbytes or 1
        take = min(len(source), max(1, budget // rec))
        idx = np.sort(rng.choice(len(source), size=take, replace=False))
        return [np.ascontiguousarray(source[i]).tobytes()[:_SAMPLE_MAX] for i in idx]
    out, used = [], 0
    for i, r in enumerate(source):
        if isinstance(r, np.ndarray):
            b = np.ascontiguousarray(r).tobytes()
        else:
            try:
                b = bytes(memoryview(r))
            except TypeError:
                raise TypeError(f"sample {i} is a {type(r).__name__}, "
                                "not bytes-like or an array") from None
        b = b[:_SAMPLE_MAX]
        out.append(b)
        used += len(b)
        if used >= budget:
            break
    return out


def train_dict(source, tier: str = "balanced", *, size: int | None = None) -> bytes:
    """Train a zstd dictionary for a ``zstd_dict`` store.

    `source`: an array (rows are records), an iterable of records (bytes-like or
    arrays) or a store. `tier`: ``fast`` (32 KiB dictionary from a 4 MiB
    sample), ``balanced`` (128 KiB / 16 MiB) or ``max`` (1 MiB / 64 MiB);
    `size` overrides the dictionary size. Raises `DictionaryError` when zstd
    cannot train one (too few or too uniform samples).
    """
    if not isinstance(tier, str) or tier not in _TIERS:
        raise ValueError(f"unknown tier {tier!r}; choose one of {sorted(_TIERS)}")
    dict_size, budget = _TIERS[tier]
    if size is not None:
        if not isinstance(size, (int, np.integer)) or isinstance(size, (bool, np.bool_)) \
                or not 256 <= size <= _DICT_SIZE_MAX:
            raise ValueError(f"size must be an int from 256 to {_DICT_SIZE_MAX}, got {size!r}")
        dict_size = int(size)
    samples = [s for s in _sample_records(source, budget) if s]
    if len(samples) < 8:
        raise DictionaryError("need at least 8 non-empty samples to train a dictionary, "
                              f"got {len(samples)}")
    joined = b"".join(samples)
    sizes = np.array([len(s) for s in samples], dtype=U64)
    out = bytearray(dict_size)
    out_len = ffi.new("uint64_t *")
    rc = lib.lx_train_dict(joined, u64_ptr(sizes), len(samples), ffi.from_buffer(out), dict_size,
                           out_len)
    check(rc, None, "train_dict")
    return bytes(out[:out_len[0]])
