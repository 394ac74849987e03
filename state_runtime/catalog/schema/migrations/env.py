"""Alembic environment: run migrations on the connection we are given, or on the catalog URL.

Migrations hold tables only. The views and functions
(:mod:`state_runtime.catalog.schema.operator_views`, rendered from the rules) are dropped
before any migration runs and created again once the schema is at head, in the same
transaction: every upgrade leaves exactly the rendered views, like Flyway's repeatable
migrations. On PostgreSQL the grants ``grants --apply`` recorded are then applied again
(:func:`~state_runtime.catalog.schema.grants.reapply_grants`): the tables a migration added and
the views just created carry the roles' rights when the upgrade commits.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from state_runtime.catalog.connection.engine import create_catalog_engine
from state_runtime.catalog.connection.settings import catalog_url
from state_runtime.catalog.schema import grants
from state_runtime.catalog.schema import operator_views as views

# One upgrade at a time per PostgreSQL database: concurrent ones would drop each other's views.
_UPGRADE_LOCK = 0x5157A7E


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_UPGRADE_LOCK})")
        views.drop(connection)
        context.run_migrations()
        if context.get_context().get_current_revision() == context.script.get_current_head():
            views.create(connection)
            grants.reapply_grants(connection)


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
