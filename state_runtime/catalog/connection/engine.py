"""Engines and transactions: URLs, dialect set-up, deadlines, bounded retries, clear errors.

Every catalog operation runs as one function inside one transaction. A transient failure
(connection refused, reset or cut by its deadline, serialization failure, deadlock, lock
timeout, SQLite busy) rolls the whole transaction back and runs it again after a backoff, a
bounded number of times; nothing is ever half-written. Because a COMMIT whose answer was lost
is retried too, every operation is written to be safe to run twice (see docs/catalog.md).
Nothing waits unboundedly: ``CatalogTimeouts`` bounds connecting, each statement, each lock
wait, each attempt (a watchdog cuts a silent connection) and the wait for a pooled connection.
"""

from __future__ import annotations

import logging
import random
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from state_runtime.catalog.connection.settings import CatalogTimeouts
from state_runtime.catalog.connection.statement_cache import COMPILED
from state_runtime.catalog.connection.watchdog import WATCHDOG, Alarm
from state_runtime.catalog.sql.roots import anchor_roots
from state_runtime.errors import (
    CatalogError,
    CatalogMisconfigured,
    CatalogPermissionDenied,
    CatalogReadOnly,
    CatalogTimeout,
    CatalogUnavailable,
    InvalidArgument,
    InvalidCatalogUrl,
    extra_hint,
)
from state_runtime.redaction import get_logger, redact, register_secret

log = get_logger(__name__)
T = TypeVar("T")

# SQLSTATEs worth a retry: serialization failure, deadlock, lock timeout, statement timeout,
# server shutting down or starting up, too many connections, and the whole
# connection-exception class (08xxx). The timeouts among them end as CatalogTimeout.
_RETRY_SQLSTATES = frozenset(
    {"40001", "40P01", "55P03", "57014", "57P01", "57P02", "57P03", "53300"}
)
_TIMEOUT_SQLSTATES = frozenset({"55P03", "57014"})
_OUT_OF_RANGE = "22003"
_INSUFFICIENT_PRIVILEGE = "42501"
_READ_ONLY = "25006"
_WRITES = re.compile(r"\b(INSERT|UPDATE|DELETE|TRUNCATE)\b")
_SQLITE_BUSY = ("database is locked", "database is busy", "database table is locked")
# Connection failures that no retry can fix: the URL names a database, role or password the
# server refuses, or TLS settings that cannot work (libpq reports them without a SQLSTATE).
_PERMANENT_CONNECT = re.compile(
    r"does not exist|authentication failed|no pg_hba\.conf entry|no password supplied|"
    r"permission denied|unable to open database file|invalid (?:dsn|connection option)|"
    r"does not support SSL|root certificate file|certificate verify failed|invalid sslmode",
    re.IGNORECASE,
)
ATTEMPT_TIMEOUT_OPTION = "state_runtime_attempt_timeout"
POOL_SIZE = 5
POOL_OVERFLOW = 10
"""A catalog engine's pool: ``POOL_SIZE`` connections kept, up to ``POOL_OVERFLOW`` more
opened under load (SQLAlchemy's defaults, stated so that :func:`pool_capacity` is true)."""
DRIVER_HINT = "postgresql+psycopg2://user@host:5432/database or sqlite:///path/to/catalog.db"
URL_HELP = "STATE_CATALOG_URL or --catalog-url"


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently transient errors are retried (exponential backoff, jitter)."""

    attempts: int = 5
    initial_delay_s: float = 0.05
    max_delay_s: float = 2.0

    def delay(self, attempt: int) -> float:
        base = min(self.max_delay_s, self.initial_delay_s * 2.0 ** (attempt - 1))
        return float(base * (0.5 + random.random() / 2))


def display_url(url: URL) -> str:
    """The URL as text with its password and any secret parameter masked."""
    return redact(url.render_as_string(hide_password=True))


def _reach_hint(url: URL) -> str:
    """The next step when the catalog's database cannot be reached."""
    check = f"`pg_isready -h {url.host or 'localhost'} -p {url.port or 5432}`"
    return (
        f"Check that the database is up and reachable ({check}), then run the same command "
        "again: every catalog call is safe to repeat"
    )


def parse_url(url: str) -> URL:
    """Parse and check a catalog URL: InvalidCatalogUrl, never echoing a secret, for
    anything but ``postgresql+psycopg2://...`` or ``sqlite:///...``."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidCatalogUrl(f"catalog URL is empty; set {URL_HELP}")
    url = url.strip()
    _scheme, sep, rest = url.partition("://")
    authority = rest.split("/", 1)[0]
    if sep and authority.count("@") > 1:
        raise InvalidCatalogUrl(
            f"catalog URL {redact(url)!r}: its password holds an unescaped '@'; "
            "percent-encode it as %40"
        )
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise InvalidCatalogUrl(
            f"catalog URL {redact(url)!r} is not a valid SQLAlchemy URL; use {DRIVER_HINT}"
        ) from None
    except ValueError:
        raise InvalidCatalogUrl(
            f"catalog URL {redact(url)!r}: the port must be a number; use {DRIVER_HINT}"
        ) from None
    register_secret(parsed.password if isinstance(parsed.password, str) else None)
    for name, value in parsed.query.items():
        if "password" in name.lower():
            for one in (value,) if isinstance(value, str) else value:
                register_secret(one)
    backend, _, driver = parsed.drivername.partition("+")  # no plugin loaded to find out
    shown = display_url(parsed)
    if backend in {"postgres", "postgresql"} and not driver:
        raise InvalidCatalogUrl(
            f"catalog URL {shown!r} names no driver: use postgresql+psycopg2://... "
            "(the driver this library bounds with timeouts)"
        )
    if backend == "postgresql" and driver != "psycopg2":
        raise InvalidCatalogUrl(
            f"catalog URL {shown!r} cannot be used: driver {driver!r} is not supported; use "
            "postgresql+psycopg2://..."
        )
    if backend == "sqlite" and driver not in {"", "pysqlite"}:
        raise InvalidCatalogUrl(f"catalog URL {shown!r}: use sqlite:///path/to/catalog.db")
    if backend not in {"sqlite", "postgresql"}:
        raise InvalidCatalogUrl(
            f"catalog URL {shown!r}: unsupported database {backend!r}; use {DRIVER_HINT}"
        )
    return parsed


def sqlite_file(url: URL) -> Path | None:
    """The SQLite database file of ``url``; None for other databases and in-memory ones."""
    database = url.database or ""
    if url.get_backend_name() != "sqlite" or database in {"", ":memory:"}:
        return None
    if database.startswith("file:"):
        return None
    return Path(database)


def create_catalog_engine(
    url: str, timeouts: CatalogTimeouts | None = None, connections: int | None = None
) -> Engine:
    """An engine for ``url`` whose every wait is bounded by ``timeouts`` (default: from the
    environment, see CatalogTimeouts), and whose pool opens at most ``connections`` at once
    (default ``POOL_SIZE + POOL_OVERFLOW``; a Spark task's catalog opens fewer).

    SQLite runs in WAL mode with foreign keys and ``BEGIN IMMEDIATE`` (a write transaction
    holds the database lock from its first statement). PostgreSQL goes through psycopg2 with
    connect, statement, lock and idle-in-transaction timeouts, TCP keepalives and
    ``tcp_user_timeout``, JIT off, a bounded pool, and the watchdog on every attempt. Every
    engine compiles into the process's one cache (:mod:`.statement_cache`), so a catalog
    opened later runs the statements an earlier one compiled without compiling them again.
    Creating an engine opens no connection and creates no file.
    """
    parsed = parse_url(url)
    limits = timeouts or CatalogTimeouts.from_env()
    size, overflow = _pool_bounds(connections)
    pool: dict[str, Any] = {
        "pool_size": size,
        "max_overflow": overflow,
        "pool_timeout": limits.pool.total_seconds(),
    }
    try:
        if parsed.get_backend_name() == "sqlite":
            return _sqlite_engine(parsed, limits, pool)
        return _postgres_engine(parsed, limits, pool)
    except ModuleNotFoundError as exc:  # the driver: psycopg2 comes with the postgres extra
        raise InvalidCatalogUrl(
            f"catalog URL {display_url(parsed)!r} needs {extra_hint('postgres', exc.name)}"
        ) from None
    except (NoSuchModuleError, ArgumentError, ImportError) as exc:
        raise InvalidCatalogUrl(
            f"catalog URL {display_url(parsed)!r} cannot be used: {exc}"
        ) from None


def _ms(value: timedelta) -> int:
    return int(value.total_seconds() * 1000)


def _postgres_engine(url: URL, limits: CatalogTimeouts, pool: dict[str, Any]) -> Engine:
    # Server-side limits travel in the startup packet (no extra round trip, no statement
    # outside the watchdog); the URL's own ``options`` come last and so win.
    server = (
        f"-c jit=off -c statement_timeout={_ms(limits.statement)} "
        f"-c lock_timeout={_ms(limits.lock)} "
        f"-c idle_in_transaction_session_timeout={_ms(limits.attempt)}"
    )
    given = url.query.get("options") or ()
    options = " ".join([server, *((given,) if isinstance(given, str) else given)])
    keepalive = max(1, int(limits.keepalive.total_seconds()))
    # No pool pre-ping: it would query a pooled connection before the attempt watches its
    # socket. A connection that went stale fails its attempt's first statement instead, and
    # the attempt is retried on a fresh one.
    engine = sa.create_engine(
        url,
        **pool,
        execution_options={
            ATTEMPT_TIMEOUT_OPTION: limits.attempt.total_seconds(),
            "compiled_cache": COMPILED,
        },
        connect_args={
            "connect_timeout": max(2, int(limits.connect.total_seconds())),
            "application_name": "state_runtime.catalog",
            "options": options,
            "keepalives": 1,
            "keepalives_idle": keepalive,
            "keepalives_interval": keepalive,
            "keepalives_count": 3,
            "tcp_user_timeout": _ms(limits.attempt),
        },
    )
    # A new connection's socket joins the attempt's deadline before SQLAlchemy's own first
    # queries on it (dialect initialisation), so those are bounded too.
    for name in ("first_connect", "connect"):
        event.listen(engine, name, _watch_new_connection, insert=True)
    return engine


def _watch_new_connection(dbapi_connection: Any, _record: Any) -> None:
    WATCHDOG.watch(dbapi_connection.fileno())


def _sqlite_engine(url: URL, limits: CatalogTimeouts, pool: dict[str, Any]) -> Engine:
    pooled = pool if sqlite_file(url) else {}
    engine = sa.create_engine(
        url,
        connect_args={"timeout": limits.lock.total_seconds(), "check_same_thread": False},
        execution_options={"compiled_cache": COMPILED},
        **pooled,
    )

    database = sqlite_file(url)
    if database is not None:
        anchor_roots(engine, database)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        # Take over transaction control from the sqlite3 module so BEGIN IMMEDIATE is ours.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    # SQLite's own BEGIN, where SQLAlchemy begins (its errors are wrapped as any statement's):
    # a "begin" event would run it through the whole statement machinery and make every
    # statement of the engine dispatch the engine's events (docs/catalog.md, Performance).
    engine.dialect.do_begin = _begin_immediate  # type: ignore[method-assign]
    return engine


def _begin_immediate(dbapi_connection: Any) -> None:
    """Begin a SQLite transaction holding the write lock (``BEGIN IMMEDIATE``)."""
    dbapi_connection.driver_connection.execute("BEGIN IMMEDIATE")


def _pool_bounds(connections: int | None) -> tuple[int, int]:
    """The pool size and overflow of an engine that opens at most ``connections`` at once."""
    size = min(POOL_SIZE, connections or POOL_SIZE)
    return size, POOL_OVERFLOW if connections is None else max(0, connections - size)


def pool_capacity(engine: Engine, connections: int | None = None) -> int:
    """How many connections ``engine``, made by :func:`create_catalog_engine` with
    ``connections``, opens at once: a bounded pool's size and overflow; one for any other
    pool (an in-memory SQLite database is one connection per thread, each its own empty
    database, so it is worked on by one thread)."""
    if isinstance(engine.pool, sa.pool.QueuePool):
        return sum(_pool_bounds(connections))
    return 1


def create_sqlite_folder(engine: Engine) -> None:
    """Create the folder of a SQLite catalog (only when creating the catalog: a read-only
    command never leaves an empty database behind)."""
    path = sqlite_file(engine.url)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CatalogMisconfigured(
            f"cannot create the folder of the SQLite catalog {str(path)!r}: {exc.strerror}"
        ) from None


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


def _reason(exc: BaseException) -> str:
    """The driver's message, first line, with secrets masked."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return redact(text[0] if text else type(exc).__name__)


def _fileno(connection: Connection) -> int | None:
    """The socket of a PostgreSQL connection (None for SQLite: nothing to cut)."""
    dbapi = connection.connection.dbapi_connection
    fileno = getattr(dbapi, "fileno", None)
    return int(fileno()) if callable(fileno) else None


def run_transaction(
    engine: Engine,
    work: Callable[[Connection], T],
    *,
    retry: RetryPolicy,
    what: str,
    translate: Callable[[DBAPIError], Exception | None] | None = None,
) -> T:
    """Run ``work(connection)`` in one transaction, retrying transient errors.

    ``work`` must be safe to run again after a COMMIT whose answer was lost (it may have
    committed). ``translate`` may turn a non-transient database error (an integrity error,
    say) into a library error; other database errors become CatalogError, values beyond the
    database's integer range InvalidArgument. After the last attempt a connection problem is
    CatalogUnavailable (CatalogTimeout for silence); a database or credentials the server
    refuses is CatalogMisconfigured at once.
    """
    url = engine.url
    seconds = float(engine.get_execution_options().get(ATTEMPT_TIMEOUT_OPTION, 0))
    attempt = 0
    while True:
        attempt += 1
        with WATCHDOG.attempt(seconds) as alarm:
            try:
                return _attempt(engine, work, alarm)
            except _ConnectFailed as exc:
                failure, connecting = exc.error, True
            except DBAPIError as exc:
                failure, connecting = exc, False
            except sa.exc.TimeoutError:
                if attempt >= retry.attempts:
                    raise CatalogUnavailable(
                        f"no free connection to the catalog at {display_url(url)} within the "
                        f"pool timeout, {attempt} times ({what}): too many concurrent calls"
                    ) from None
                _sleep(retry, attempt, what, "no free pooled connection")
                continue
            except OverflowError as exc:  # SQLite: a Python int beyond 64 bits
                raise _out_of_range(what, str(exc)) from None
        timed_out = alarm is not None and alarm.fired
        if connecting and not timed_out:
            if _PERMANENT_CONNECT.search(str(failure.orig)):
                raise CatalogMisconfigured(
                    f"cannot use the catalog at {display_url(url)} ({what}): {_reason(failure)}"
                ) from None
            if attempt >= retry.attempts:
                raise CatalogUnavailable(
                    f"cannot connect to the catalog at {display_url(url)} after {attempt} "
                    f"attempts ({what}): {_reason(failure)}. {_reach_hint(url)}"
                ) from None
            _sleep(retry, attempt, what, _reason(failure))
            continue
        if timed_out or is_transient(failure):
            reason = (
                f"no answer within {seconds:g}s (attempt timeout); the connection was cut"
                if timed_out
                else _reason(failure)
            )
            if attempt >= retry.attempts:
                raise _exhausted_error(failure, timed_out)(
                    f"catalog {what} failed after {attempt} attempts at {display_url(url)}: "
                    f"{reason}"
                ) from None
            _sleep(retry, attempt, what, reason)
            continue
        code = getattr(failure.orig, "pgcode", None)
        if code == _OUT_OF_RANGE:
            raise _out_of_range(what, _reason(failure)) from None
        if code == _INSUFFICIENT_PRIVILEGE:
            raise _permission_denied(url, what, failure) from None
        if code == _READ_ONLY:
            raise CatalogReadOnly(
                f"the catalog at {display_url(url)} refuses writes ({what}): {_reason(failure)}; "
                "nothing was changed (a standby, or default_transaction_read_only); the same "
                "call succeeds once it accepts writes again"
            ) from None
        translated = translate(failure) if translate is not None else None
        if translated is not None:
            raise translated from failure
        raise CatalogError(f"catalog {what} failed: {_reason(failure)}") from failure


class _ConnectFailed(Exception):
    """Opening the attempt's connection failed (classified apart from the transaction's)."""

    def __init__(self, error: DBAPIError) -> None:
        super().__init__(str(error))
        self.error = error


def _attempt(engine: Engine, work: Callable[[Connection], T], alarm: Alarm | None) -> T:
    """One attempt: a connection, one transaction, the alarm disarmed before the connection
    goes back to the pool."""
    try:
        connection = engine.connect()
    except DBAPIError as exc:
        raise _ConnectFailed(exc) from None
    try:
        fd = _fileno(connection)
        if fd is not None:
            WATCHDOG.watch(fd)
        with connection.begin():
            return work(connection)
    finally:
        WATCHDOG.disarm(alarm)
        connection.close()


def _exhausted_error(exc: DBAPIError, timed_out: bool) -> type[CatalogUnavailable]:
    """What a transient error still failing after the last attempt is: CatalogTimeout when
    time ran out (the watchdog, a lock or statement timeout, SQLite busy), else
    CatalogUnavailable. Both are retryable."""
    busy = isinstance(exc.orig, sqlite3.OperationalError)
    if timed_out or busy or getattr(exc.orig, "pgcode", None) in _TIMEOUT_SQLSTATES:
        return CatalogTimeout
    return CatalogUnavailable


def _permission_denied(url: URL, what: str, failure: DBAPIError) -> CatalogPermissionDenied:
    """The typed refusal of a right the role lacks: which role, which right, what for."""
    statement = str(failure.statement or "").strip()
    words = statement.split(None, 1)
    right = words[0].upper() if words else "the right"
    if right in {"SELECT", "WITH"}:  # a write inside a CTE, or a row lock, needs the write
        written = _WRITES.search(statement.upper())
        right = written.group(1) if written else right
        if right in {"SELECT", "WITH"} and "FOR UPDATE" in statement.upper():
            right = "UPDATE (for SELECT ... FOR UPDATE)"
    role = url.username or "the connecting role"
    return CatalogPermissionDenied(
        f"role {role!r} lacks {right} for the catalog {what} at {display_url(url)} "
        f"({_reason(failure)}); nothing was changed. Run it as the role meant for it, or "
        "grant the right: python -m state_runtime.catalog grants (docs/running-for-real.md)"
    )


def _out_of_range(what: str, detail: str) -> InvalidArgument:
    return InvalidArgument(
        f"catalog {what}: a number is beyond the catalog's integer range ({detail}); ids and "
        "versions must fit in 63 bits, operator and partition ids in 31"
    )


def _sleep(retry: RetryPolicy, attempt: int, what: str, reason: str) -> None:
    """Wait before the next attempt. The first retry of a call is a warning (the catalog is
    struggling: a terminal shows it at once), the next ones are info: a call that still
    fails ends in one error naming its attempts and the cause, not the same line five times."""
    delay = retry.delay(attempt)
    log.log(
        logging.WARNING if attempt == 1 else logging.INFO,
        "catalog %s: transient error (attempt %d of %d), retrying in %.2fs: %s",
        what,
        attempt,
        retry.attempts,
        delay,
        reason,
    )
    time.sleep(delay)
