"""Where the catalog lives and how long it may take: ``STATE_CATALOG_URL`` and the timeouts."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from pathlib import Path

from state_runtime.durations import format_duration, parse_duration
from state_runtime.errors import InvalidArgument

URL_ENV = "STATE_CATALOG_URL"
TIMEOUT_ENV_PREFIX = "STATE_CATALOG_"
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
    Each is read from ``STATE_CATALOG_<NAME>_TIMEOUT`` (``keepalive``:
    ``STATE_CATALOG_KEEPALIVE``) by :meth:`from_env`, as ``30s``, ``2m``, ...
    """

    connect: timedelta = timedelta(seconds=5)
    statement: timedelta = timedelta(seconds=30)
    lock: timedelta = timedelta(seconds=10)
    attempt: timedelta = timedelta(seconds=60)
    pool: timedelta = timedelta(seconds=10)
    keepalive: timedelta = timedelta(seconds=10)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, timedelta) or value < timedelta(seconds=1):
                raise InvalidArgument(
                    f"catalog {f.name} timeout must be at least 1s, got {_text(value)}"
                )
        if self.attempt < max(self.statement, self.lock):
            raise InvalidArgument(
                f"catalog attempt timeout ({_text(self.attempt)}) must not be shorter than the "
                f"statement ({_text(self.statement)}) and lock ({_text(self.lock)}) timeouts"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CatalogTimeouts:
        """The defaults with ``STATE_CATALOG_*_TIMEOUT`` overrides; InvalidArgument naming the
        variable for a value that does not parse."""
        env = os.environ if environ is None else environ
        values: dict[str, timedelta] = {}
        for f in fields(cls):
            variable = env_name(f.name)
            raw = env.get(variable, "").strip()
            if raw:
                try:
                    values[f.name] = parse_duration(raw)
                except InvalidArgument as exc:
                    raise InvalidArgument(f"{variable}={raw!r}: {exc.reason}") from None
        try:
            return replace(cls(), **values)
        except InvalidArgument as exc:
            names = ", ".join(env_name(name) for name in values) or "the defaults"
            raise InvalidArgument(f"{names}: {exc.reason}") from None

    @staticmethod
    def seconds(value: timedelta) -> float:
        return value.total_seconds()


def env_name(field_name: str) -> str:
    """The environment variable of a CatalogTimeouts field."""
    suffix = "" if field_name == "keepalive" else "_TIMEOUT"
    return f"{TIMEOUT_ENV_PREFIX}{field_name.upper()}{suffix}"


def _text(value: object) -> str:
    return format_duration(value) if isinstance(value, timedelta) else repr(value)
