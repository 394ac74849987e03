"""Statement helpers every concern's SQL shares: IN lists in chunks, a list of ids bound as
one parameter, and the dialect's upserts."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal

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


class IdList(sa.types.TypeDecorator[Sequence[int]]):
    """A list of integer ids as one bound value: a JSON array on SQLite, an array on
    PostgreSQL."""

    impl = sa.String
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.ARRAY(sa.BigInteger()))
        return dialect.type_descriptor(sa.String())

    def process_bind_param(self, value: Sequence[int] | None, dialect: Dialect) -> Any:
        if value is None or dialect.name == "postgresql":
            return value
        return json.dumps(list(value))


class AmongIds(ColumnElement[bool]):
    """``column`` is one of the ids bound as the one parameter ``name`` (:class:`IdList`):
    ``column IN (SELECT value FROM json_each(:name))`` on SQLite, ``column = ANY(:name)`` on
    PostgreSQL. Unlike an expanding ``IN`` (whose statement text SQLAlchemy renders again
    for every list at every execution, as many placeholders as ids), the statement's text
    is the same for every list: SQLAlchemy and SQLite each prepare it once."""

    __visit_name__ = "among_ids"
    inherit_cache = True
    type = sa.Boolean()
    _traverse_internals = [  # noqa: RUF012 (SQLAlchemy declares it a list)
        ("column", InternalTraversal.dp_clauseelement),
        ("ids", InternalTraversal.dp_clauseelement),
    ]

    def __init__(self, column: ColumnElement[Any], name: str) -> None:
        self.column = column
        self.ids = sa.bindparam(name, type_=IdList())


@compiles(AmongIds)
def _among_ids(element: AmongIds, compiler: SQLCompiler, **kw: Any) -> str:
    column, ids = compiler.process(element.column, **kw), compiler.process(element.ids, **kw)
    return f"{column} = ANY(CAST({ids} AS BIGINT[]))"


@compiles(AmongIds, "sqlite")
def _among_ids_sqlite(element: AmongIds, compiler: SQLCompiler, **kw: Any) -> str:
    column, ids = compiler.process(element.column, **kw), compiler.process(element.ids, **kw)
    return f"{column} IN (SELECT value FROM json_each({ids}))"
