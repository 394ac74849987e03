"""Statement helpers every concern's SQL shares: IN lists in chunks (one array parameter on
PostgreSQL), and the dialect's upserts."""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterator, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

CHUNK = 400  # rows per IN list: far below SQLite's bound-parameter limit
T = TypeVar("T")


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def dialect_insert(dialect: str, table: sa.Table) -> postgresql.Insert | sqlite.Insert:
    """The dialect's ``INSERT`` that takes ``ON CONFLICT`` clauses (``dialect``:
    ``connection.dialect.name``)."""
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


def upsert(connection: Connection, table: sa.Table) -> Any:
    """The connection's dialect's ``INSERT`` that takes ``ON CONFLICT`` clauses."""
    return dialect_insert(connection.dialect.name, table)


def insert_ignoring(connection: Connection, table: sa.Table) -> Any:
    """``INSERT ... ON CONFLICT DO NOTHING`` for the connection's dialect (one statement per
    dialect and table, its values given at execution)."""
    return _insert_ignoring(connection.dialect.name, table)


@functools.cache
def _insert_ignoring(dialect: str, table: sa.Table) -> Any:
    return dialect_insert(dialect, table).on_conflict_do_nothing()


def among(
    dialect: str, column: ColumnElement[Any], values: Collection[Any] | str
) -> ColumnElement[bool]:
    """``column`` is one of ``values``: a list, or the name of a parameter given the list at
    execution (a statement built once for ``dialect``, ``connection.dialect.name``). On
    PostgreSQL one array parameter, ``column = ANY(:p::type[])``: the statement's text is the
    same for every list (no parameter a value to name, render and bind); elsewhere (SQLite)
    an IN list."""
    if dialect != "postgresql":
        if isinstance(values, str):
            return column.in_(sa.bindparam(values, expanding=True, type_=column.type))
        return column.in_(list(values))
    array = postgresql.ARRAY(column.type)
    if isinstance(values, str):
        param = sa.bindparam(values, type_=array)
    else:
        param = sa.bindparam(column.key, list(values), type_=array, unique=True)
    return column == sa.any_(param)  # the dialect renders the parameter's cast: ``::type[]``
