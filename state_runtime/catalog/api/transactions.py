"""What every group of catalog calls stands on: the engine, the retry policy, one retried
transaction per call."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Literal, Self, TypeVar

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from state_runtime.catalog.connection.clock import DatabaseClock
from state_runtime.catalog.connection.engine import (
    RetryPolicy,
    create_catalog_engine,
    display_url,
    pool_capacity,
    run_transaction,
)
from state_runtime.catalog.connection.settings import CatalogTimeouts, catalog_url
from state_runtime.catalog.schema import revision
from state_runtime.catalog.schema.reading_views import READER_VIEWS, ReaderViews
from state_runtime.errors import CommitConflict

T = TypeVar("T")


def conflict(exc: DBAPIError) -> Exception | None:
    """A unique or foreign-key violation during a commit means a concurrent writer won."""
    if isinstance(exc, IntegrityError):
        return CommitConflict(f"the catalog refused the commit: {str(exc.orig).splitlines()[0]}")
    return None


class CatalogBase:
    """One catalog database: its engine and retry policy; each call is one transaction."""

    def __init__(
        self, engine: Engine, *, retry: RetryPolicy | None = None, connections: int | None = None
    ) -> None:
        """``connections``: what the engine was created with (its pool's bound)."""
        self.engine = engine
        self.connections = connections
        self.retry = retry or RetryPolicy()
        self.clock = DatabaseClock(engine, self.retry)

    def now(self) -> datetime:
        """The time by the database's clock (:mod:`state_runtime.catalog.connection.clock`):
        what leases, run records, file records and the retention window go by."""
        return self.clock.now()

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        upgrade: bool | Literal["sqlite"] = False,
        retry: RetryPolicy | None = None,
        timeouts: CatalogTimeouts | None = None,
        connections: int | None = None,
    ) -> Self:
        """Connect to the catalog at ``url`` (default: ``catalog_url()``) and check its schema.

        With ``upgrade`` the schema is first migrated to the head revision (what the embedded
        demo wants; a SQLite file and its folder are created); with ``upgrade="sqlite"`` only
        a SQLite catalog is (a single-user file: the streaming job's default), never
        PostgreSQL's, whose DDL only its owner runs; otherwise nothing is created,
        and a missing SQLite file or an older schema raises CatalogSchemaOutdated naming the
        command that upgrades it. A schema newer than this code raises CatalogSchemaTooNew;
        a malformed URL InvalidCatalogUrl; an unreachable database CatalogUnavailable.
        ``timeouts`` default to ``CatalogTimeouts.from_env()``; ``connections`` bounds the
        pool (default: :data:`~state_runtime.catalog.connection.engine.POOL_SIZE` plus its
        overflow).
        """
        engine = create_catalog_engine(url or catalog_url(), timeouts, connections)
        policy = retry or RetryPolicy()
        try:
            at_head = False  # an upgrade that found a SQLite catalog at head: checked
            if upgrade is True or (upgrade == "sqlite" and engine.dialect.name == "sqlite"):
                at_head = revision.upgrade(engine, retry=policy)
            if not at_head:
                revision.check_schema(engine, retry=policy)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine, retry=policy, connections=connections)

    @property
    def url(self) -> str:
        """The database URL with the password masked."""
        return display_url(self.engine.url)

    @property
    def pool_capacity(self) -> int:
        """Connections this catalog opens at once: what bounds the threads that call it."""
        return pool_capacity(self.engine, self.connections)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(
        self,
        what: str,
        work: Callable[[Connection], T],
        translate: Callable[[DBAPIError], Exception | None] | None = None,
    ) -> T:
        self.clock.sync()  # measured (when due) before the transaction, never inside it
        return run_transaction(self.engine, work, retry=self.retry, what=what, translate=translate)

    def _read(self, what: str, work: Callable[[Connection, ReaderViews], T]) -> T:
        """One retried read: ``work`` receives the reading views, the only relations it selects
        from (so the reader role, which holds SELECT on the views alone, may run it)."""
        return self._run(what, lambda connection: work(connection, READER_VIEWS))
