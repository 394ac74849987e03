"""Which stores a catalog question covers (:class:`Scope`): the retention, health and status
statements all filter their stores through it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, overload

import sqlalchemy as sa
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import BindParameter, ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal

from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.schema.tables import RunKind
from state_runtime.catalog.sql.statements import among


@dataclass(frozen=True, init=False)
class Scope:
    """Which stores a question covers: all, one root, or given store ids (a page of
    :mod:`state_runtime.catalog.api.pages` is its store ids, so that every part of a page's
    statement reads the page's stores by key, whatever the catalog's size). Each is a value,
    or a bind parameter of a statement built once (store ids: the parameter's name, matched
    by :func:`~state_runtime.catalog.sql.statements.among` for ``dialect``). Store ids given
    as a tuple or a parameter's name require the dialect (``connection.dialect.name``): on
    PostgreSQL they are one array parameter, so the statement's text is the same whatever
    their number."""

    root: str | BindParameter[str] | None
    store_ids: tuple[int, ...] | str | sa.Select[Any] | None
    dialect: str

    @overload
    def __init__(
        self,
        *,
        root: str | BindParameter[str] | None = None,
        store_ids: sa.Select[Any] | None = None,
        dialect: str = "",
    ) -> None: ...

    @overload
    def __init__(
        self,
        *,
        root: str | BindParameter[str] | None = None,
        store_ids: tuple[int, ...] | str,
        dialect: str,
    ) -> None: ...

    def __init__(
        self,
        *,
        root: str | BindParameter[str] | None = None,
        store_ids: tuple[int, ...] | str | sa.Select[Any] | None = None,
        dialect: str = "",
    ) -> None:
        object.__setattr__(self, "root", root)
        object.__setattr__(self, "store_ids", store_ids)
        object.__setattr__(self, "dialect", dialect)

    def filter(self, views: ReaderViews, store_id: ColumnElement[int]) -> ColumnElement[bool]:
        conditions: list[ColumnElement[bool]] = []
        if isinstance(self.store_ids, sa.Select):
            conditions.append(store_id.in_(self.store_ids))
        elif self.store_ids is not None:
            conditions.append(among(self.dialect, store_id, self.store_ids))
        if self.root is not None:
            s = views.stores.c
            conditions.append(
                AmongFound(store_id, sa.select(s.store_id).where(s.checkpoint_root == self.root))
            )
        return sa.and_(sa.true(), *conditions)

    @staticmethod
    def of_run(views: ReaderViews) -> Scope:
        """The stores of the run given as the bind parameter ``run_id``: those whose last
        maintenance run it is (it leased them, recorded a file of them, or deleted from them)
        and, for a validation run, those validated since it started."""
        s, r = views.stores.c, views.runs.c
        run = sa.bindparam("run_id", type_=sa.BigInteger())
        started = (
            sa.select(r.started_at)
            .where(r.run_id == run, r.kind == RunKind.VALIDATE.value)
            .scalar_subquery()
        )
        ids = sa.select(s.store_id).where(
            sa.or_(s.last_run_id == run, s.last_validated_at >= started)
        )
        return Scope(store_ids=ids)


class AmongFound(ColumnElement[bool]):
    """``column`` is one of the values ``found`` selects (a root's store ids, the roots of a
    page's stores). On PostgreSQL ``column = ANY(ARRAY(found))``: ``found`` runs once (an
    InitPlan) and each part of the statement searches its own index by the array, as for a
    page's ids; as ``IN (found)`` the planner joined it to whole tables (a root's health at
    20,000 stores hash-joined all of the commit log and the files for the root's 200: 0.8 s,
    now 0.06 s; docs/maintenance.md, *Plans at fleet size*). Elsewhere (SQLite)
    ``IN (found)``, which it searches by index."""

    type = sa.Boolean()
    inherit_cache = True
    _is_implicitly_boolean = True  # a comparison: no ``= 1`` appended where booleans are ints
    _traverse_internals = [  # noqa: RUF012  (SQLAlchemy's list) in the cache key, binds found
        ("column", InternalTraversal.dp_clauseelement),
        ("found", InternalTraversal.dp_clauseelement),
    ]

    def __init__(self, column: ColumnElement[Any], found: sa.Select[Any]) -> None:
        self.column, self.found = column, found

    @property
    def _from_objects(self) -> list[Any]:
        return self.column._from_objects


@compiles(AmongFound)
def _in_found(element: AmongFound, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.column.in_(element.found), **kw)


@compiles(AmongFound, "postgresql")
def _any_of_found(element: AmongFound, compiler: SQLCompiler, **kw: Any) -> str:
    column = compiler.process(element.column, **kw)
    return f"{column} = ANY(ARRAY({compiler.process(element.found, asfrom=False, **kw)}))"
