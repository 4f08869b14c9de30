"""Record stores: the raw byte store `Zrecord` and the typed NumPy stores
`DenseStore` (fixed dtype and item shape) and `RaggedStore` (one dtype, any
shape per record), all on the native engine (``src/Store.zig``), and
`train_dict` for ``zstd_dict`` stores. This module is their public home;
each lives in its own module (``bytestore``, ``dense``, ``ragged``,
``dictionary``, with the shared machinery in ``_store``).

Common contract
---------------
* A store is a directory. Records are addressed by a dense index space
  ``0..len``; negative indices wrap; out of range raises `IndexError`.
* Reads decode straight into NumPy memory in one native call per batch, with
  the GIL released, across the cores the process may use.
* ``append`` is atomic per call: after a crash a store holds a prefix of what
  was appended. ``sync()`` makes it survive a power loss; ``close()`` syncs.
* Many handles may have a store open, in one process or many. The first
  mutation through a handle takes the store's writer lock; another handle's
  mutation then raises `LockedError`. ``delete``/``compact`` need every other
  handle closed (`BusyError` otherwise). Reads and appends are thread-safe,
  and ``close()`` may race any of them (later calls raise `ClosedError`).
* ``delete(key)`` follows the original swap-last rule and returns its moves.
* The type identity (kind, dtype, item shape) is stored inside the store as a
  versioned native struct (src/format.zig; msgpack in format-2 stores, still
  read) and checked at every open; `open_store` (here, also exported as
  ``loaderx.dataset.open_store`` and ``loaderx.open_store``) reopens the
  right class from it.
* A store pickles as a reference (class and path); unpickling reopens it
  read-only, so torch worker processes and ``multiprocessing`` spawn work.
"""
from __future__ import annotations

from . import _objstore, _openers, _original
from ._store import Store, stored_kind
from .bytestore import Zrecord
from .dense import DenseStore
from .dictionary import DICT_TIER_DEFAULT, DICT_TIERS, train_dict
from .errors import (
    BusyError,
    ClosedError,
    CorruptStoreError,
    DictionaryError,
    IdentityError,
    LoaderxError,
    LockedError,
    NotAStoreError,
    RecordIndexError,
    SizeMismatchError,
    StoreNotFoundError,
    ZrecordError,
)
from .ragged import RaggedStore

__all__ = [
    "Zrecord", "DenseStore", "RaggedStore", "open_store", "train_dict", "DICT_TIERS",
    "DICT_TIER_DEFAULT",
    "LoaderxError", "ZrecordError",
    "StoreNotFoundError", "NotAStoreError", "CorruptStoreError", "LockedError",
    "BusyError", "ClosedError", "RecordIndexError", "IdentityError",
    "SizeMismatchError", "DictionaryError",
]


def open_store(path, *, cache_dir=None, cache_limit=None, storage_options=None) -> Store:
    """Open an existing store as the class its persisted identity names
    (DenseStore, RaggedStore or Zrecord). O(1) in the record count. A store
    written by the original loaderx 1.7 opens in place, read-only, as an
    `OriginalDenseStore` / `OriginalRaggedStore` (docs/migrating.md).

    `path` may be a URL (``s3://``, ``gs://``, ``az://``, ``https://``): the
    store is read through the node-local cache in `cache_dir`, bounded by
    `cache_limit`, with `storage_options` for the object store (see
    docs/remote.md); they are ignored for a local path."""
    if _objstore.is_url(path):
        opener = _openers.remote(path)
        with opener.settings(cache_dir, cache_limit, storage_options):
            with opener.opening(opener.bind(path)):  # bound once: the probe and the store
                return _open_store(path)
    return _open_store(path)


def _open_store(path) -> Store:
    if _original.is_store177(path):  # the original loaderx 1.7's: read-only, in place
        return RaggedStore(path) if _original.kind177(path) == "ragged" else DenseStore(path)
    kind = stored_kind(path)
    if kind == "dense":
        return DenseStore(path)
    if kind == "ragged":
        return RaggedStore(path)
    return Zrecord(path)
