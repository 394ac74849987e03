"""Engines and transactions: dialect set-up, bounded retries of transient errors, clear errors.

Every catalog operation runs as one function inside one transaction. A transient failure
(connection reset, serialization failure, deadlock, SQLite busy) rolls the whole transaction
back and runs it again after a backoff, a bounded number of times; nothing is ever half-written.
"""

from __future__ import annotations

import logging
import random
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from state_runtime.errors import CatalogError, CatalogUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

# SQLSTATEs worth a retry: serialization failure, deadlock, lock timeout, server shutting
# down or starting up, and the whole connection-exception class (08xxx).
_RETRY_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57P01", "57P02", "57P03"})
_SQLITE_BUSY = ("database is locked", "database is busy", "database table is locked")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently transient errors are retried (exponential backoff, jitter)."""

    attempts: int = 5
    initial_delay_s: float = 0.05
    max_delay_s: float = 2.0

    def delay(self, attempt: int) -> float:
        base = min(self.max_delay_s, self.initial_delay_s * 2.0 ** (attempt - 1))
        return float(base * (0.5 + random.random() / 2))


def parse_url(url: str) -> URL:
    """Parse a catalog URL, refusing what is not one with CatalogUnavailable."""
    try:
        return make_url(url)
    except ArgumentError as exc:
        raise CatalogUnavailable(
            f"catalog URL is not a valid SQLAlchemy URL (set STATE_CATALOG_URL): {exc}"
        ) from None


def redact(url: URL) -> str:
    """The URL as text with any password masked, for messages and logs."""
    return url.render_as_string(hide_password=True)


def create_catalog_engine(url: str) -> Engine:
    """An engine for ``url``: SQLite in WAL mode with foreign keys and ``BEGIN IMMEDIATE``
    (so a write transaction holds the database lock from its first statement); PostgreSQL
    through psycopg2 with a connect timeout, pre-ping and JIT off."""
    parsed = parse_url(url)
    backend = parsed.get_backend_name()
    if backend not in {"sqlite", "postgresql"}:
        raise CatalogUnavailable(
            f"catalog URL {redact(parsed)!r}: unsupported database {backend!r}; "
            "use postgresql+psycopg2://... or sqlite:///path"
        )
    try:
        if backend == "sqlite":
            return _sqlite_engine(parsed)
        engine = sa.create_engine(
            parsed,
            pool_pre_ping=True,
            connect_args={"connect_timeout": 5, "application_name": "state_runtime.catalog"},
        )
        event.listen(engine, "connect", _postgres_session)
        return engine
    except (NoSuchModuleError, ArgumentError, ImportError) as exc:
        raise CatalogUnavailable(f"catalog URL {redact(parsed)!r} cannot be used: {exc}") from None


def _postgres_session(dbapi_connection: Any, _record: Any) -> None:
    """Turn JIT compilation off: the catalog's queries are index lookups and joins over the
    live inventory, for which compiling costs more than it saves (about a second on the
    benchmark's all-stores question)."""
    cursor = dbapi_connection.cursor()
    cursor.execute("SET jit = off")
    cursor.close()
    dbapi_connection.commit()


def _sqlite_engine(url: URL) -> Engine:
    database = url.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        try:
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CatalogUnavailable(
                f"cannot create the folder of the SQLite catalog {database!r}: {exc}"
            ) from None
    engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        # Take over transaction control from the sqlite3 module so BEGIN IMMEDIATE is ours.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def is_transient(exc: DBAPIError) -> bool:
    """Whether a retry of the whole transaction may succeed."""
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    code = getattr(orig, "pgcode", None)
    if isinstance(code, str) and (code in _RETRY_SQLSTATES or code.startswith("08")):
        return True
    if isinstance(orig, sqlite3.OperationalError):
        return any(text in str(orig) for text in _SQLITE_BUSY)
    return False


def _reason(exc: BaseException, url: URL) -> str:
    """The driver's message, first line, with the password (if any) scrubbed."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    message = text[0] if text else type(exc).__name__
    if url.password:
        message = message.replace(str(url.password), "***")
    return message


def run_transaction(
    engine: Engine,
    work: Callable[[Connection], T],
    *,
    retry: RetryPolicy,
    what: str,
    translate: Callable[[DBAPIError], Exception | None] | None = None,
) -> T:
    """Run ``work(connection)`` in one transaction, retrying transient errors.

    ``translate`` may turn a non-transient database error (an integrity error, say) into a
    library error; other database errors become CatalogError. After the last attempt a
    connection problem is CatalogUnavailable; anything else CatalogError.
    """
    url = engine.url
    attempt = 0
    while True:
        attempt += 1
        try:
            connection = engine.connect()
        except DBAPIError as exc:
            if attempt >= retry.attempts:
                raise CatalogUnavailable(
                    f"cannot connect to the catalog at {redact(url)} after {attempt} attempts "
                    f"({what}): {_reason(exc, url)}"
                ) from None
            _sleep(retry, attempt, what, exc, url)
            continue
        try:
            with connection, connection.begin():
                return work(connection)
        except DBAPIError as exc:
            if is_transient(exc):
                if attempt >= retry.attempts:
                    error_type = CatalogUnavailable if _is_disconnect(exc) else CatalogError
                    raise error_type(
                        f"catalog {what} failed after {attempt} attempts at {redact(url)}: "
                        f"{_reason(exc, url)}"
                    ) from None
                _sleep(retry, attempt, what, exc, url)
                continue
            translated = translate(exc) if translate is not None else None
            if translated is not None:
                raise translated from exc
            raise CatalogError(f"catalog {what} failed: {_reason(exc, url)}") from exc


def _is_disconnect(exc: DBAPIError) -> bool:
    code = getattr(exc.orig, "pgcode", None)
    return exc.connection_invalidated or (isinstance(code, str) and code.startswith(("08", "57")))


def _sleep(retry: RetryPolicy, attempt: int, what: str, exc: DBAPIError, url: URL) -> None:
    delay = retry.delay(attempt)
    log.warning(
        "catalog %s: transient error (attempt %d of %d), retrying in %.2fs: %s",
        what,
        attempt,
        retry.attempts,
        delay,
        _reason(exc, url),
    )
    time.sleep(delay)
