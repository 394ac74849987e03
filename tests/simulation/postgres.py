"""Catalogs on PostgreSQL for the simulation: a database of its own, a fresh migrated schema
for every run of the machine (dropped with the database)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from state_runtime.catalog import Catalog
from tests.catalog.conftest import pg_url
from tests.services import service_missing
from tests.simulation.machine import PlatformMachine


class PostgresCatalogs:
    """Hands out the URL of a fresh, migrated catalog schema per call."""

    def __init__(self) -> None:
        self.database = f"state_simulation_{uuid.uuid4().hex[:12]}"
        self._admin = sa.create_engine(pg_url("postgres"), isolation_level="AUTOCOMMIT")
        with self._admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{self.database}"')
        self._engine = sa.create_engine(pg_url(self.database), isolation_level="AUTOCOMMIT")

    def __call__(self) -> str:
        schema = f"s_{uuid.uuid4().hex[:12]}"
        with self._engine.connect() as connection:
            connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        url = pg_url(self.database, schema)
        Catalog.open(url, upgrade=True).close()
        return url

    def close(self) -> None:
        self._engine.dispose()
        with self._admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        self._admin.dispose()


@contextmanager
def machine_on_postgresql() -> Iterator[type[PlatformMachine]]:
    """A :class:`PlatformMachine` whose every run gets a fresh migrated schema in a database
    of its own, dropped on the way out; the test fails (under ``CI``) or skips when
    PostgreSQL is not reachable."""
    try:
        catalogs = PostgresCatalogs()
    except sa.exc.OperationalError as exc:
        service_missing("PostgreSQL", str(exc).strip())

    class OnPostgres(PlatformMachine):
        pass

    OnPostgres.catalogs = catalogs
    try:
        yield OnPostgres
    finally:
        catalogs.close()
