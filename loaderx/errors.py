"""loaderx's exceptions: one base class, subclasses users catch by meaning.

Every native result code maps to exactly one class (see ``_lib.ERROR_CLASSES``).
Where a standard exception says the same thing, the class also derives from it,
so ``except FileNotFoundError`` / ``IndexError`` / ``TypeError`` work as usual.
"""
from __future__ import annotations


class ZrecordError(Exception):
    """Base of every loaderx error. ``.code`` is the native result code (or
    None for errors raised in Python), ``.path`` the store's path when known."""

    def __init__(self, message: str, *, code: int | None = None, path: str | None = None):
        Exception.__init__(self, message)
        self.code = code
        self.path = path

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StoreNotFoundError(ZrecordError, FileNotFoundError):
    """No store at the path (and create was not asked for)."""


class NotAStoreError(ZrecordError, ValueError):
    """The path holds something that is not a loaderx store."""


class CorruptStoreError(ZrecordError):
    """The store is damaged: truncated files, checksum mismatch, a bad record."""


class DestinationExistsError(ZrecordError, FileExistsError):
    """A writer in ``mode="create"`` found data at its destination (or
    ``mode="overwrite"`` found something that is not loaderx's)."""


class NewerFormatError(ZrecordError):
    """The store was written by a newer on-disk format; upgrade loaderx."""


class LockedError(ZrecordError):
    """Another handle (in this or another process) holds the writer lock."""


class BusyError(LockedError):
    """delete/compact need exclusive access and another handle or a gather has it."""


class ClosedError(ZrecordError, ValueError):
    """The store (or loader) has been closed."""


class LoaderClosedError(ClosedError, RuntimeError):
    """The DataLoader was closed (also a ``RuntimeError``, as the loader raised
    before it was a ``ClosedError``)."""


class RecordIndexError(ZrecordError, IndexError):
    """A record index is out of range."""


class IdentityError(ZrecordError, TypeError):
    """Data or an existing store does not match the store's dtype/shape/kind."""


class SizeMismatchError(ZrecordError, ValueError):
    """A destination buffer or a record has the wrong size."""


class DictionaryError(ZrecordError, ValueError):
    """A zstd dictionary is missing, unexpected or invalid."""


class InvalidArgumentError(ZrecordError, ValueError):
    """An argument the native core refused (codec, level, ...)."""


class ArgumentTypeError(ZrecordError, TypeError):
    """An argument of the wrong type (raised in Python, no native code)."""


class ReadOnlyError(ZrecordError, PermissionError):
    """The store cannot be written."""


class NoSpaceError(ZrecordError, OSError):
    """The disk is full; nothing partial was committed."""


class ZrecordIOError(ZrecordError, OSError):
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


class ZrecordMemoryError(ZrecordError, MemoryError):
    """The native core ran out of memory."""
