"""The runtime tests share the catalog tests' PostgreSQL fixtures (a database, fresh schemas)."""

from tests.catalog.conftest import pg_database, pg_schema

__all__ = ["pg_database", "pg_schema"]
