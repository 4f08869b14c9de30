"""loaderx's exceptions: one base class, subclasses users catch by meaning.

Every native result code maps to exactly one class (see ``_lib.ERROR_CLASSES``).
Where a standard exception says the same thing, the class also derives from it,
so ``except FileNotFoundError`` / ``IndexError`` / ``TypeError`` work as usual.

Every exception loaderx raises on purpose is defined here and exported from the
package top level (``loaderx.CorruptStoreError``...; tests/project/test_tidy.py checks
both), so one ``except loaderx.LoaderxError`` catches them all and each can be
caught by name without knowing which module raised it.

Why the base is ``LoaderxError``, with ``ZrecordError`` the same class under its
old name: errors come from every layer (stores, dataset directories, the loader,
conversion, object storage), not only from the ``Zrecord`` byte store, and the
package is loaderx, so the base is named after the package as users expect
(``except loaderx.LoaderxError``). ``ZrecordError`` is what the original loaderx
design card and ``from loaderx.zrecord import ..., ZrecordError`` promise, so it
stays, forever, as an alias (``ZrecordError is LoaderxError``: catching either
catches the same errors, and ``isinstance`` agrees). New code should write
``LoaderxError``. The ``Zrecord*`` subclasses keep their names.
"""
from __future__ import annotations


class LoaderxError(Exception):
    """Base of every loaderx error. ``.code`` is the native result code (or
    None for errors raised in Python), ``.path`` the store's path when known."""

    def __init__(self, message: str, *, code: int | None = None, path: str | None = None):
        Exception.__init__(self, message)
        self.code = code
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


#: The base's name in the original loaderx (the design card's ``loaderx.zrecord``
#: exports it): the same class, kept for code written against it.
ZrecordError = LoaderxError


class StoreNotFoundError(LoaderxError, FileNotFoundError):
    """No store at the path (and create was not asked for)."""


class NotAStoreError(LoaderxError, ValueError):
    """The path holds something that is not a loaderx store."""


class CorruptStoreError(LoaderxError):
    """The store is damaged: truncated files, checksum mismatch, a bad record."""


class NewerFormatError(LoaderxError):
    """The store was written by a newer on-disk format; upgrade loaderx."""


class LockedError(LoaderxError):
    """Another handle (in this or another process) holds the writer lock."""


class BusyError(LockedError):
    """delete/compact need exclusive access and another handle or a gather has it;
    clearing a cache directory that live processes use."""


class ClosedError(LoaderxError, ValueError):
    """The store (or loader) has been closed."""


class LoaderClosedError(ClosedError, RuntimeError):
    """The DataLoader was closed (also a ``RuntimeError``, as the loader raised
    before it was a ``ClosedError``)."""


class RecordIndexError(LoaderxError, IndexError):
    """A record index is out of range."""


class IdentityError(LoaderxError, TypeError):
    """Data or an existing store does not match the store's dtype/shape/kind."""


class SizeMismatchError(LoaderxError, ValueError):
    """A destination buffer or a record has the wrong size."""


class DictionaryError(LoaderxError, ValueError):
    """A zstd dictionary is missing, unexpected or invalid."""


class InvalidArgumentError(LoaderxError, ValueError):
    """An argument the native core refused (codec, level, ...)."""


class ImageError(LoaderxError, ValueError):
    """A record the image stage cannot decode: not a JPEG or PNG, damaged or
    truncated, or larger than the stage decodes. The message names the
    dataset, the column and the record."""


class ArgumentTypeError(LoaderxError, TypeError):
    """An argument of the wrong type (raised in Python, no native code)."""


class ReadOnlyError(LoaderxError, PermissionError):
    """The store cannot be written."""


class NoSpaceError(LoaderxError, OSError):
    """The disk is full; nothing partial was committed."""


class ZrecordIOError(LoaderxError, OSError):
    """An operating-system I/O error."""


class HandleFailedError(ZrecordIOError):
    """An earlier I/O error (a failed fsync, a failure inside delete or
    compact) left this handle unsure of what is on disk: every later call
    fails until the store is closed and reopened; the reopen finishes or
    rolls back the interrupted operation."""


class RemoteIOError(ZrecordIOError):
    """Object storage failed for a remote dataset (unreachable, timeouts,
    errors that outlived the retries); the message names the URL."""


class RemoteNotFoundError(RemoteIOError, StoreNotFoundError):
    """No such object, key or bucket in object storage."""


class RemotePermissionError(RemoteIOError, PermissionError):
    """Object storage refused access (AccessDenied, bad or missing credentials)."""


class RemoteChangedError(RemoteIOError):
    """An object of a remote dataset changed on the server since the dataset
    was opened; reads never mix versions, so reopen it to read the new one."""


class ZrecordMemoryError(LoaderxError, MemoryError):
    """The native core ran out of memory."""


class DestinationExistsError(LoaderxError, FileExistsError):
    """A write found something at its destination and was not asked to
    append or overwrite it (``mode="append"`` / ``"overwrite"``)."""


class ConvertError(LoaderxError, ValueError):
    """A source that cannot be converted as asked; the message says why and what to do."""


class MissingDependencyError(LoaderxError, ImportError):
    """An optional dependency is not installed; the message names the extra
    to install (``pip install 'loaderx[convert]'``...)."""


class MissingRemoteDependencyError(MissingDependencyError):
    """Remote datasets need obstore: ``pip install 'loaderx[remote]'``."""
