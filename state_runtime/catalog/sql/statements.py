"""Statement helpers every concern's SQL shares: IN lists in chunks, and the dialect's upserts."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

CHUNK = 400  # rows per IN list: far below SQLite's bound-parameter limit
T = TypeVar("T")


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def upsert(connection: Connection, table: sa.Table) -> Any:
    """The connection's dialect's ``INSERT`` that takes ``ON CONFLICT`` clauses."""
    return (postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert)(table)


def insert_ignoring(connection: Connection, table: sa.Table) -> Any:
    """``INSERT ... ON CONFLICT DO NOTHING`` for the connection's dialect (one statement per
    dialect and table, its values given at execution)."""
    return _insert_ignoring(connection.dialect.name == "postgresql", table)


@functools.cache
def _insert_ignoring(postgres: bool, table: sa.Table) -> Any:
    return (postgresql.insert if postgres else sqlite.insert)(table).on_conflict_do_nothing()
