"""Dictionaries for ``zstd_dict`` stores: `train_dict` samples records and
lets zstd's trainer build a dictionary. Training is always explicit: a store
is created with ``dict_bytes=``; nothing is trained silently."""
from __future__ import annotations

from typing import Any

import numpy as np

from ._checks import path_arg
from ._lib import check, ffi, lib
from ._objstore import is_url
from ._store import U64, Store, u64_ptr
from .errors import DictionaryError, InvalidArgumentError

#: The dictionary tiers by name: the most bytes of the dictionary (``size``)
#: and of the records it trains on (``samples``). The original loaderx 1.7's
#: ``loaderx.zrecord.DICT_TIERS``, with its values.
DICT_TIERS = {
    "fast": {"size": 32 << 10, "samples": 4 << 20},
    "balanced": {"size": 128 << 10, "samples": 16 << 20},
    "max": {"size": 1 << 20, "samples": 64 << 20},
}
#: The tier `train_dict` uses when none is named.
DICT_TIER_DEFAULT = "balanced"
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


def check_dict_size(size: Any) -> int:
    """A dictionary size `train_dict` takes (bytes, 256 to 2 GiB)."""
    if not isinstance(size, (int, np.integer)) or isinstance(size, (bool, np.bool_)) \
            or not 256 <= size <= _DICT_SIZE_MAX:
        raise ValueError(f"size must be an int from 256 to {_DICT_SIZE_MAX}, got {size!r}")
    return int(size)


def train_dict(source, tier: str | None = DICT_TIER_DEFAULT, path=None, *,
               size: int | None = None) -> bytes:
    """Train a zstd dictionary for a ``zstd_dict`` store.

    `source`: an array (rows are records), an iterable of records (bytes-like or
    arrays) or a store. `tier`: ``fast`` (32 KiB dictionary from a 4 MiB
    sample), ``balanced`` (128 KiB / 16 MiB; also None) or ``max`` (1 MiB /
    64 MiB), see `DICT_TIERS`; `size` overrides the dictionary size. `path`:
    also write the dictionary to this file (as the original loaderx 1.7 did).
    Raises `DictionaryError` when zstd cannot train one (too few or too
    uniform samples).
    """
    if path is not None:
        path = path_arg(path)
        if is_url(path):
            raise InvalidArgumentError(f"{path}: train_dict writes its dictionary to a local "
                                       "file; write it here (or keep the bytes it returns) and "
                                       "upload it yourself", path=path)
    if tier is None:
        tier = DICT_TIER_DEFAULT
    if not isinstance(tier, str) or tier not in DICT_TIERS:
        raise ValueError(f"unknown tier {tier!r}; choose one of {sorted(DICT_TIERS)}")
    dict_size, budget = DICT_TIERS[tier]["size"], DICT_TIERS[tier]["samples"]
    if size is not None:
        dict_size = check_dict_size(size)
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
    trained = bytes(out[:out_len[0]])
    if path is not None:
        with open(path, "wb") as f:
            f.write(trained)
    return trained
