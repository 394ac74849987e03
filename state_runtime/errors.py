"""Every error the library raises, in one flat module.

Names say what happened. Each class has a stable ``code`` (like Spark's error classes, e.g.
``STATE_CHECKPOINT_FILE_CORRUPT``): it starts every message (``[CODE] what happened``), the
CLI's ``--json`` prints it, and it never changes once released (a test pins every one), so
scripts and alerts may match on it. Each error carries the context that locates it (store,
version, checkpoint id, file) so that a message read in a log is enough to find the problem,
and never a secret: every message is masked by :func:`state_runtime.redaction.redact`.
``retryable`` says whether the same call may succeed later (a transient outage) or cannot
(bad input, a refusal, a missing database): retry only what says so.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

from state_runtime.redaction import redact


class StateStoreError(Exception):
    """Base class of every error raised by ``state_runtime``."""

    code: ClassVar[str] = "STATE_ERROR"
    retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        store: object | None = None,
        version: int | None = None,
        checkpoint_id: str | None = None,
        path: str | None = None,
    ) -> None:
        message = redact(message)
        path = None if path is None else redact(path)
        self.reason = message
        self.store = store
        self.version = version
        self.checkpoint_id = checkpoint_id
        self.path = path
        parts = [message]
        context = [
            f"{name}={value}"
            for name, value in (
                ("store", store),
                ("version", version),
                ("checkpoint_id", checkpoint_id),
                ("file", path),
            )
            if value is not None
        ]
        if context:
            parts.append("(" + ", ".join(context) + ")")
        super().__init__(f"[{self.code}] " + " ".join(parts))

    def details(self) -> dict[str, Any]:
        """The error as plain fields (what ``--json`` prints): its code, the message without
        the code and context, whether a retry may help, and the context that locates it."""
        return {
            "code": self.code,
            "message": self.reason,
            "retryable": self.retryable,
            "store": None if self.store is None else str(self.store),
            "version": self.version,
            "checkpoint_id": self.checkpoint_id,
            "file": self.path,
        }

    def _fields(self) -> dict[str, Any]:
        """The keyword arguments that rebuild this error (besides its message)."""
        return {
            "store": None if self.store is None else str(self.store),
            "version": self.version,
            "checkpoint_id": self.checkpoint_id,
            "path": self.path,
        }

    def labelled(self, label: str) -> StateStoreError:
        """The same error, its message prefixed by what the caller calls the value
        (``STATE_MAINTENANCE_WINDOW='5m': ...``), every field kept."""
        return type(self)(f"{label}: {self.reason}", **self._fields())

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep errors picklable so Spark can ship them from executors to the driver.
        return (_rebuild_error, (type(self), self.reason, self._fields()))


def _rebuild_error(cls: type[StateStoreError], reason: str, kw: dict[str, Any]) -> StateStoreError:
    return cls(reason, **kw)


class InvalidArgument(StateStoreError, ValueError):
    """A caller passed a bad value: a malformed name, a negative version, a path escape."""

    code: ClassVar[str] = "STATE_INVALID_ARGUMENT"


class QueryRefused(InvalidArgument):
    """A query that cannot run on its input, found on the driver before any Spark job: a
    column an operator, a window or the watermark names is missing or of the wrong type, or
    an output mode Spark refuses for that shape. The message names the column, the operator
    and the rule."""

    code: ClassVar[str] = "STATE_QUERY_REFUSED"


class MissingExtra(InvalidArgument):
    """A feature needs an optional part of the install that is missing; the message names the
    extra that provides it."""

    code: ClassVar[str] = "STATE_MISSING_EXTRA"

    def __init__(self, what: str, extra: str, module: str | None) -> None:
        super().__init__(f"{what} needs {extra_hint(extra, module)}")


def extra_hint(extra: str, module: str | None) -> str:
    """How to install an extra, e.g. ``the s3 extra (boto3 is not installed): pip install
    'state-runtime[s3]'``."""
    return f"the {extra} extra ({module} is not installed): pip install 'state-runtime[{extra}]'"


class SchemaMismatch(InvalidArgument):
    """Files of a store were written with a key or value schema other than the one asked for."""

    code: ClassVar[str] = "STATE_SCHEMA_MISMATCH"


class StoreClosed(StateStoreError):
    """An update or commit on a store that has already been committed or aborted."""

    code: ClassVar[str] = "STATE_STORE_CLOSED"


# --- loading -----------------------------------------------------------------------------


class CannotLoadState(StateStoreError):
    """A version of a store cannot be loaded."""

    code: ClassVar[str] = "STATE_CANNOT_LOAD"


class CheckpointFileMissing(CannotLoadState):
    """A checkpoint file the lineage needs does not exist."""

    code: ClassVar[str] = "STATE_CHECKPOINT_FILE_MISSING"


class CheckpointFileCorrupt(CannotLoadState):
    """A checkpoint file is truncated, fails its checksum or cannot be parsed."""

    code: ClassVar[str] = "STATE_CHECKPOINT_FILE_CORRUPT"


class UnexpectedVersion(CannotLoadState):
    """A file's header names another store, version, checkpoint id or kind than its name."""

    code: ClassVar[str] = "STATE_CHECKPOINT_FILE_MISLABELLED"


class LineageBroken(CannotLoadState):
    """The lineage recorded in the files does not lead back to a loadable base."""

    code: ClassVar[str] = "STATE_LINEAGE_BROKEN"


class UnknownCheckpointId(CannotLoadState):
    """No delta or snapshot exists for the requested (version, checkpoint id)."""

    code: ClassVar[str] = "STATE_UNKNOWN_CHECKPOINT_ID"


class StateLost(CannotLoadState):
    """A file the catalog recorded for a committed version is gone from storage: the state
    it held is lost until the file comes back or the query is restored."""

    code: ClassVar[str] = "STATE_LOST"


class ChangesCleanedUp(CannotLoadState):
    """A batch's changes were asked for, but maintenance has deleted its delta files."""

    code: ClassVar[str] = "STATE_CHANGES_CLEANED_UP"


# --- committing --------------------------------------------------------------------------


class CannotCommit(StateStoreError):
    """A commit failed; nothing of it became visible."""

    code: ClassVar[str] = "STATE_CANNOT_COMMIT"


# --- storage -----------------------------------------------------------------------------


class StorageError(StateStoreError):
    """The storage backend failed (I/O error, permission, network)."""

    code: ClassVar[str] = "STATE_STORAGE_FAILED"


class FileAlreadyExists(StorageError):
    """A put-if-absent found the file already there; files are never overwritten."""

    code: ClassVar[str] = "STATE_STORAGE_FILE_EXISTS"


class StorageFileNotFound(StorageError):
    """The storage has no file at the path."""

    code: ClassVar[str] = "STATE_STORAGE_FILE_NOT_FOUND"


class RootMissing(StorageError):
    """A checkpoint root the catalog records committed state below has no folder: moved,
    unmounted or deleted. Maintaining it would work on nothing and report success."""

    code: ClassVar[str] = "STATE_ROOT_MISSING"


class StorageUnavailable(StorageError):
    """The storage could not be reached after retries (transient errors exhausted)."""

    code: ClassVar[str] = "STATE_STORAGE_UNAVAILABLE"

    retryable = True


# --- catalog -----------------------------------------------------------------------------


class CatalogError(StateStoreError):
    """The SQL catalog failed or refused an operation."""

    code: ClassVar[str] = "STATE_CATALOG_FAILED"


class CatalogUnavailable(CatalogError):
    """The catalog database cannot be used now: down, unreachable, silent past its timeout,
    no free connection. Retryable: the same call succeeds once the database is back (every
    catalog call is safe to repeat). Its subclass CatalogMisconfigured is not retryable."""

    code: ClassVar[str] = "STATE_CATALOG_UNAVAILABLE"

    retryable = True


class CatalogTimeout(CatalogUnavailable):
    """The catalog did not answer within the configured time (see CatalogTimeouts)."""

    code: ClassVar[str] = "STATE_CATALOG_TIMEOUT"


class CatalogMisconfigured(CatalogUnavailable):
    """The catalog cannot be used as configured: its database or SQLite file does not exist,
    or refuses these credentials. Retrying the same call cannot help; fix the setting."""

    code: ClassVar[str] = "STATE_CATALOG_MISCONFIGURED"

    retryable = False


class InvalidCatalogUrl(CatalogMisconfigured, InvalidArgument):
    """The catalog URL is malformed or names a database or driver this library cannot use."""

    code: ClassVar[str] = "STATE_CATALOG_URL_INVALID"


class CatalogPermissionDenied(CatalogError):
    """The catalog's role lacks a right an operation needs (PostgreSQL SQLSTATE 42501): the
    message names the role, the right and the operation. Nothing was changed (the operation's
    one transaction rolled back); grant the right, or run the operation as the role meant
    for it (docs/running-for-real.md)."""

    code: ClassVar[str] = "STATE_CATALOG_PERMISSION_DENIED"


class CatalogReadOnly(CatalogError):
    """The catalog refuses writes (SQLSTATE 25006: a standby after a failover, or
    ``default_transaction_read_only``). Nothing was changed and the call was not retried;
    the same call succeeds once the database accepts writes again (every catalog call is
    safe to repeat)."""

    code: ClassVar[str] = "STATE_CATALOG_READ_ONLY"
    retryable = True


class CatalogSchemaOutdated(CatalogError):
    """The catalog database has an older schema than this code; run the migration."""

    code: ClassVar[str] = "STATE_CATALOG_SCHEMA_OUTDATED"


class CatalogSchemaTooNew(CatalogError):
    """The catalog database has a newer schema than this code knows; upgrade the code."""

    code: ClassVar[str] = "STATE_CATALOG_SCHEMA_TOO_NEW"


class CommitConflict(CatalogError):
    """A batch commit conflicts with what the catalog already holds."""

    code: ClassVar[str] = "STATE_COMMIT_CONFLICT"


class BatchOutOfOrder(CommitConflict):
    """A micro-batch asked to run out of order: older than the last committed one, or after a
    gap. Refused on the driver before any task runs, so no file is written."""

    code: ClassVar[str] = "STATE_BATCH_OUT_OF_ORDER"


class LocalDiskFull(StateStoreError):
    """Local disk cannot hold a run of a store's state that does not fit in memory: the
    task fails with the bytes needed and the free space, instead of running out of memory."""

    code: ClassVar[str] = "STATE_LOCAL_DISK_FULL"

    def __init__(self, message: str, *, needed: int = 0, free: int = 0, **context: Any) -> None:
        super().__init__(f"{message}: {needed} bytes needed, {free} bytes free", **context)
        self.reason = message
        self.needed = needed
        self.free = free

    def details(self) -> dict[str, Any]:
        """The base fields, and the bytes needed and free."""
        return super().details() | {"needed": self.needed, "free": self.free}

    def _fields(self) -> dict[str, Any]:
        return super()._fields() | {"needed": self.needed, "free": self.free}


class LocalRunDamaged(StateStoreError):
    """A run file of a store's state on the worker's local disk is missing, shorter than
    written or unreadable (deleted, truncated, a read error of the disk). Those files are a
    cache of committed state: the versions holding the file are dropped from the worker's
    cache, so a retry of the task (Spark's, or the caller's) loads the store from storage
    again. Nothing committed is lost."""

    code: ClassVar[str] = "STATE_LOCAL_RUN_DAMAGED"

    retryable = True


class AttemptSuperseded(CommitConflict):
    """A batch's commit from an attempt older than one that began after it (a zombie driver
    that another took over from): refused, so the newer attempt's commit stands. The order is
    the catalog's sequence of batch intents, never a clock."""

    code: ClassVar[str] = "STATE_ATTEMPT_SUPERSEDED"


class WorkerProcessLost(StateStoreError):
    """A maintenance pass lost one of the worker processes it dealt its stores to (killed,
    out of memory, or it exited): the pass fails, its run is recorded failed, and the stores
    that process held stay leased until their leases expire (the next run takes them up)."""

    code: ClassVar[str] = "STATE_WORKER_PROCESS_LOST"


class MaintenanceRefused(StateStoreError):
    """A maintenance request breaks a safety rule (retention below the floor, a lock held).

    A refusal of a value carries it as fields, not only in its words: ``setting`` (what was
    refused), ``value`` (what was asked) and ``limit`` (the bound it crossed); None when the
    refusal is of no value (a lease held, a problem open)."""

    code: ClassVar[str] = "STATE_MAINTENANCE_REFUSED"

    def __init__(
        self,
        message: str,
        *,
        setting: str | None = None,
        value: object = None,
        limit: object = None,
        **context: Any,
    ) -> None:
        super().__init__(message, **context)
        self.setting = setting
        self.value = value
        self.limit = limit

    def details(self) -> dict[str, Any]:
        """The base fields, and the setting, value and limit refused (durations in seconds)."""
        return super().details() | {
            "setting": self.setting,
            "value": _plain(self.value),
            "limit": _plain(self.limit),
        }

    def _fields(self) -> dict[str, Any]:
        return super()._fields() | {
            "setting": self.setting,
            "value": self.value,
            "limit": self.limit,
        }


def _plain(value: object) -> object:
    """A refused value as JSON holds it: a duration in seconds, a number or text as is."""
    return value.total_seconds() if isinstance(value, timedelta) else value
