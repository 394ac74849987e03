"""A fresh PostgreSQL database for a benchmark's catalog (or Dagster's storage): created
empty, dropped at the end however the benchmark ends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2
from sqlalchemy.engine import make_url


@contextmanager
def fresh_database(server: str, name: str) -> Iterator[str]:
    """The URL of database ``name`` on ``server`` (a URL without a database), dropped first if
    a past run left it, and dropped (its sessions ended) when the block ends."""
    url = make_url(server)
    admin = psycopg2.connect(
        host=url.host,
        port=url.port or 5432,
        user=url.username,
        password=url.password,
        dbname="postgres",
    )
    admin.autocommit = True
    try:
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cursor.execute(f'CREATE DATABASE "{name}"')
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
