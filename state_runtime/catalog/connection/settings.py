"""Where the catalog lives and how long it may take: ``STATE_CATALOG_URL`` and the timeouts."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa

from state_runtime.durations import format_duration
from state_runtime.errors import InvalidArgument
from state_runtime.settings import CATALOG_TIMEOUTS, default_of

URL_ENV = "STATE_CATALOG_URL"
DEFAULT_DIR = "demo-output"
DEFAULT_FILE = "catalog.db"


def catalog_url(base_dir: str | os.PathLike[str] | None = None) -> str:
    """The catalog's SQLAlchemy URL.

    ``STATE_CATALOG_URL`` when set (for example
    ``postgresql+psycopg2://user@host:5432/state``); otherwise an embedded SQLite file,
    ``<base_dir>/catalog.db``, where ``base_dir`` defaults to ``./demo-output`` resolved
    against the current directory (the Makefile runs the demo, the CLI and Dagster from the
    repository root, so they all find the same file).
    """
    configured = os.environ.get(URL_ENV, "").strip()
    if configured:
        return configured
    directory = Path(base_dir) if base_dir is not None else Path.cwd() / DEFAULT_DIR
    return f"sqlite:///{(directory / DEFAULT_FILE).resolve()}"


def catalog_url_of(
    drivername: str,
    *,
    database: str | None,
    host: str | None = None,
    port: int | None = None,
    username: str | None = None,
    password: str | None = None,
    query: Mapping[str, str] | None = None,
) -> str:
    """The catalog's URL from its parts, each quoted as needed (how an orchestrator's
    connection record, with its login and password in separate fields, becomes one)."""
    if not database:
        raise InvalidArgument(f"a {drivername} catalog needs a database (or file) name")
    url = sa.URL.create(
        drivername,
        username=username or None,
        password=password or None,
        host=host or None,
        port=port,
        database=database,
        query=dict(query or {}),
    )
    return url.render_as_string(hide_password=False)


@dataclass(frozen=True)
class CatalogTimeouts:
    """How long any catalog call may wait, so that none ever hangs (see docs/catalog.md).

    - ``connect``: to open a connection (TCP, TLS, authentication).
    - ``statement``: one SQL statement on the server (PostgreSQL ``statement_timeout``).
    - ``lock``: waiting for a row or table lock (PostgreSQL ``lock_timeout``; SQLite's busy
      timeout, for the database lock).
    - ``attempt``: one attempt of a call, from its first statement to its COMMIT's answer,
      measured by the client: past it the connection is cut (a silent server, a network that
      drops packets) and the call is retried. The server also ends a session idle in a
      transaction this long (``idle_in_transaction_session_timeout``), so locks held by a
      vanished client are freed, and TCP gives up on unacknowledged data after it
      (``tcp_user_timeout``); keepalives probe idle connections every ``keepalive``.
    - ``pool``: waiting for a free pooled connection.

    A call ends within about ``attempts x (pool + connect + attempt)`` plus the retry
    backoff (``RetryPolicy``), then raises CatalogUnavailable (CatalogTimeout for silence).
    Each is declared (default, floor of 1s, variable) in
    :data:`state_runtime.settings.CATALOG_TIMEOUTS` and read from
    ``STATE_CATALOG_<NAME>_TIMEOUT`` (``keepalive``: ``STATE_CATALOG_KEEPALIVE``) by
    :meth:`from_env`, as ``30s``, ``2m``, ...
    """

    connect: timedelta = default_of(CATALOG_TIMEOUTS, "connect", timedelta)
    statement: timedelta = default_of(CATALOG_TIMEOUTS, "statement", timedelta)
    lock: timedelta = default_of(CATALOG_TIMEOUTS, "lock", timedelta)
    attempt: timedelta = default_of(CATALOG_TIMEOUTS, "attempt", timedelta)
    pool: timedelta = default_of(CATALOG_TIMEOUTS, "pool", timedelta)
    keepalive: timedelta = default_of(CATALOG_TIMEOUTS, "keepalive", timedelta)

    def __post_init__(self) -> None:
        for setting in CATALOG_TIMEOUTS:
            try:
                setting.check(getattr(self, setting.name))
            except InvalidArgument:
                raise InvalidArgument(
                    f"catalog {setting.name} timeout must be at least "
                    f"{setting.text(setting.floor)}, got {_text(getattr(self, setting.name))}"
                ) from None
        if self.attempt < max(self.statement, self.lock):
            raise InvalidArgument(
                f"catalog attempt timeout ({_text(self.attempt)}) must not be shorter than the "
                f"statement ({_text(self.statement)}) and lock ({_text(self.lock)}) timeouts"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CatalogTimeouts:
        """The defaults with ``STATE_CATALOG_*_TIMEOUT`` overrides, read now; InvalidArgument
        naming the variable for a value that does not parse."""
        values, labels = CATALOG_TIMEOUTS.read_env(environ)
        try:
            return replace(cls(), **values)  # type: ignore[arg-type]
        except InvalidArgument as exc:
            names = ", ".join(CATALOG_TIMEOUTS[name].env for name in labels) or "the defaults"
            raise InvalidArgument(f"{names}: {exc.reason}") from None

    @staticmethod
    def seconds(value: timedelta) -> float:
        return value.total_seconds()


def _text(value: object) -> str:
    return format_duration(value) if isinstance(value, timedelta) else repr(value)
