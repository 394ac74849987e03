"""Alembic environment: run migrations on the connection we are given, or on the catalog URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from state_runtime.catalog.connection_settings import catalog_url
from state_runtime.catalog.engine import create_catalog_engine


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    given = context.config.attributes.get("connection")
    if given is not None:
        _run(given)
        return
    engine = create_catalog_engine(
        context.config.get_main_option("sqlalchemy.url") or catalog_url()
    )
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
