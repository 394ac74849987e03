"""Catalog fixtures: a fresh catalog per test on SQLite and on real PostgreSQL.

PostgreSQL runs at 127.0.0.1:5432 (trust auth, user postgres). The session creates its own
database, migrates it once and drops it at the end; each test starts from empty tables.
Tests that need a pristine schema (migrations) get a fresh PostgreSQL schema of their own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
import sqlalchemy as sa

from state_runtime.catalog import Catalog, RetryPolicy
from state_runtime.catalog.connection.engine import create_catalog_engine
from state_runtime.catalog.schema.revision import upgrade
from state_runtime.catalog.schema.tables import metadata
from tests.services import service_missing

PG_HOST = os.environ.get("STATE_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("STATE_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("STATE_TEST_PG_USER", "postgres")
FAST_RETRY = RetryPolicy(attempts=3, initial_delay_s=0.01, max_delay_s=0.05)

DIALECTS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def pg_url(database: str, schema: str | None = None) -> str:
    url = f"postgresql+psycopg2://{PG_USER}@{PG_HOST}:{PG_PORT}/{database}"
    return url if schema is None else f"{url}?options=-csearch_path%3D{schema}"


def _admin() -> psycopg2.extensions.connection:
    connection = psycopg2.connect(
        host=PG_HOST, port=PG_PORT, user=PG_USER, dbname="postgres", connect_timeout=3
    )
    connection.autocommit = True
    return connection


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A database of this session's own, migrated to head; dropped at the end."""
    try:
        admin = _admin()
    except psycopg2.OperationalError as exc:
        service_missing("PostgreSQL", f"{PG_HOST}:{PG_PORT}: {str(exc).strip()}")
    name = f"state_catalog_test_{uuid.uuid4().hex[:12]}"
    with admin.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    engine = create_catalog_engine(pg_url(name))
    upgrade(engine)
    engine.dispose()
    try:
        yield name
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def pg_schema(pg_database: str) -> Iterator[str]:
    """A fresh, empty schema in the session database (for migration tests); its URL."""
    schema = f"s_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(pg_url(pg_database))
    with engine.begin() as connection:
        connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield pg_url(pg_database, schema)
    finally:
        with engine.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        engine.dispose()


def _empty_tables(url: str) -> None:
    """Delete every row (faster than TRUNCATE on tables this small), children first."""
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        for table in reversed(metadata.sorted_tables):
            connection.execute(table.delete())
    engine.dispose()


@pytest.fixture
def pg_catalog(pg_database: str) -> Iterator[Catalog]:
    """An empty catalog on PostgreSQL."""
    url = pg_url(pg_database)
    _empty_tables(url)
    catalog = Catalog.open(url, retry=FAST_RETRY)
    yield catalog
    catalog.close()


@pytest.fixture
def sqlite_catalog(tmp_path: Path) -> Iterator[Catalog]:
    catalog = Catalog.open(f"sqlite:///{tmp_path / 'catalog.db'}", upgrade=True, retry=FAST_RETRY)
    yield catalog
    catalog.close()


@pytest.fixture(params=DIALECTS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty database, once on SQLite (a new file) and once on PostgreSQL (a
    new schema), for tests that migrate it themselves."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'catalog.db'}"
    return str(request.getfixturevalue("pg_schema"))


@pytest.fixture(params=DIALECTS)
def catalog(request: pytest.FixtureRequest) -> Catalog:
    """An empty catalog, once on SQLite and once on PostgreSQL."""
    fixture = "sqlite_catalog" if request.param == "sqlite" else "pg_catalog"
    return request.getfixturevalue(fixture)
