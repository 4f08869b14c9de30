"""loaderx: a persistent record store with per-record zstd compression and
zero-copy batch gathering, plus an endless, resumable, sharded data loader.

The public names, re-exported here from the modules that own them::

    from loaderx.zrecord import Zrecord, DenseStore, RaggedStore, train_dict, ZrecordError
    from loaderx.shardset import ShardSet
    from loaderx.mixture import Mixture
    from loaderx.tokens import TokenWindows
    from loaderx.zsampler import Sampler
    from loaderx.dataset import from_numpy, from_iterator, open_store, open_dataset, labels, pad
    from loaderx.converters import convert
    from loaderx.subset import select, View
    from loaderx.columns import Column
    from loaderx.dataloader import DataLoader
    from loaderx.streams import Stream, NativePart, ArrayStream
    from loaderx.errors import LoaderxError, CorruptStoreError, ...  # every exception

The original loaderx's spellings stay where it had them, silently
(docs/migrating.md): ``loaderx.utils.train_dict``, ``loaderx.converter``,
``loaderx.Dataset`` and ``loaderx.write_dataset`` (0.7), ``loaderx.dataset.
Dataset`` / ``DenseDataset`` / ``RaggedDataset`` (0.9, ``loaderx.legacy``).
"""
__version__ = "3.0.0"

from .converters import convert
from .dataloader import DataLoader
from .dataset import from_iterator, from_numpy, labels, open_dataset, open_store, pad
from .dataset import write_dataset  # the original 0.7's spelling of from_numpy
from .legacy import Dataset  # the original 0.7's loaderx.Dataset (see loaderx.legacy)
from .errors import (
    ArgumentTypeError,
    BusyError,
    ClosedError,
    ConvertError,
    CorruptStoreError,
    DestinationExistsError,
    DictionaryError,
    HandleFailedError,
    IdentityError,
    ImageError,
    InvalidArgumentError,
    LoaderClosedError,
    LoaderxError,
    LockedError,
    MissingDependencyError,
    MissingRemoteDependencyError,
    NewerFormatError,
    NoSpaceError,
    NotAStoreError,
    ReadOnlyError,
    RecordIndexError,
    RemoteChangedError,
    RemoteIOError,
    RemoteNotFoundError,
    RemotePermissionError,
    SizeMismatchError,
    StoreNotFoundError,
    ZrecordError,
    ZrecordIOError,
    ZrecordMemoryError,
)
from .columns import Column
from .mixture import Mixture
from .subset import View, select
from .shardset import ShardSet
from .streams import ArrayStream, NativePart, Stream
from .tokens import TokenWindows
from .zrecord import DenseStore, RaggedStore, Zrecord, train_dict
from .zsampler import Sampler
from . import remote  # noqa: E402,F401  (registers the opener of URLs: loaderx._openers)

__all__ = [
    "Zrecord", "DenseStore", "RaggedStore", "ShardSet", "Mixture", "TokenWindows", "train_dict",
    "Sampler", "DataLoader", "Stream", "NativePart", "ArrayStream",
    "from_numpy", "from_iterator", "open_store", "open_dataset", "labels", "convert", "pad",
    "select", "View", "Column",
    # every exception loaderx raises (loaderx.errors; ZrecordError is LoaderxError)
    "LoaderxError", "ZrecordError", "StoreNotFoundError", "NotAStoreError", "CorruptStoreError",
    "NewerFormatError", "LockedError", "BusyError", "ClosedError", "LoaderClosedError",
    "RecordIndexError", "IdentityError", "SizeMismatchError", "DictionaryError",
    "InvalidArgumentError", "ImageError", "ArgumentTypeError", "ReadOnlyError", "NoSpaceError",
    "ZrecordIOError", "HandleFailedError", "ZrecordMemoryError", "DestinationExistsError",
    "ConvertError", "MissingDependencyError", "MissingRemoteDependencyError",
    "RemoteIOError", "RemoteNotFoundError", "RemotePermissionError", "RemoteChangedError",
]
