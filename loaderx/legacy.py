"""Reading spellings of the original loaderx's earlier releases (0.7 to 0.9),
kept so that the Quick Start of each of its READMEs runs unchanged. Where
two releases gave one name two meanings, each import path keeps the meaning
of the last release that spelled it that way (docs/migrating.md):

* ``loaderx.Dataset(path)`` (0.7): the store, opened (`open_store`): a dense
  store's batches are ``(B, *item_shape)`` arrays, as they were.
* ``loaderx.dataset.Dataset(path)`` (0.9.1): `PackedDataset`, a read view
  whose batches (``ds[idx]``, and in a DataLoader) are ``(values,
  row_splits)``, every record ``(rows, *trailing)``: a dense store's record
  is its one row.
* ``loaderx.dataset.DenseDataset`` / ``RaggedDataset`` (0.9.4): `DenseStore`
  and `RaggedStore` (a ragged batch is a list of arrays, as in 0.9.4; 0.7's
  ``RaggedDataset`` gave the packed form, which 0.9.4 replaced).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ._store import Store
from .dense import DenseStore
from .ragged import RaggedStore
from .zrecord import open_store

__all__ = ["Dataset", "PackedDataset", "DenseDataset", "RaggedDataset"]

#: 0.9.4's names of the typed stores.
DenseDataset = DenseStore
RaggedDataset = RaggedStore


def Dataset(path: Any) -> Store:
    """0.7's ``loaderx.Dataset(path)``: the store at `path`, opened (`open_store`)."""
    return open_store(path)


class PackedDataset:
    """0.9.1's ``loaderx.dataset.Dataset(path)``: the store at `path` read as
    ``(values, row_splits)`` batches (see the module docs). A loader stream:
    the DataLoader gives each batch in that form too."""

    kind = "ragged"
    item_shape = None

    def __init__(self, path: Any):
        self.store = open_store(path)
        if self.store.kind == "bytes":
            self.dtype = np.dtype(np.uint8)
        else:
            self.dtype = self.store.dtype

    def __len__(self) -> int:
        return len(self.store)

    def gather(self, indices: Any, out: Any = None) -> tuple[np.ndarray, np.ndarray]:
        if self.store.kind != "dense":
            return self.store.gather(indices, packed=True)
        values = self.store.gather(indices)
        return values, np.arange(len(values) + 1, dtype=np.int64)

    def __getitem__(self, key: Any) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(key, (int, np.integer)):
            key = [key]
        return self.gather(key)

    __getitems__ = gather

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> "PackedDataset":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PackedDataset({self.store!r})"
