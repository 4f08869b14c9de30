"""loaderx: a persistent record store with per-record zstd compression and
zero-copy batch gathering, plus an endless, resumable, sharded data loader.

The public names, re-exported here from the modules that own them::

    from loaderx.zrecord import Zrecord, DenseStore, RaggedStore, train_dict, ZrecordError
    from loaderx.zsampler import Sampler
    from loaderx.dataset import from_numpy, from_iterator, open_store, pad
    from loaderx.dataloader import DataLoader
"""
__version__ = "0.1.0"

from .dataloader import DataLoader
from .dataset import from_iterator, from_numpy, open_store, pad
from .dataset import open_dataset
from .converters import convert
from .shardset import ShardSet
from .errors import (
    BusyError,
    ClosedError,
    CorruptStoreError,
    DictionaryError,
    IdentityError,
    LockedError,
    NewerFormatError,
    NotAStoreError,
    RecordIndexError,
    StoreNotFoundError,
    ZrecordError,
)
from .zrecord import DenseStore, RaggedStore, Zrecord, train_dict
from .zsampler import Sampler

__all__ = [
    "Zrecord", "DenseStore", "RaggedStore", "train_dict", "Sampler", "DataLoader",
    "from_numpy", "from_iterator", "open_store", "pad",
    "open_dataset", "convert", "ShardSet",
    "ZrecordError", "StoreNotFoundError", "NotAStoreError", "CorruptStoreError", "NewerFormatError",
    "LockedError", "BusyError", "ClosedError", "RecordIndexError", "IdentityError", "DictionaryError",
]
