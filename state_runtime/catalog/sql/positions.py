"""An exact reader's cursor over rows that writers commit out of id order (batch metrics,
maintenance runs): the rows a reader has not seen, each exactly once.

PostgreSQL hands out a row's id at its ``INSERT`` and shows the row at its ``COMMIT``, so a
transaction holding a lower id can commit after a reader has read past a higher one: a cursor
on ids alone skips that row for good. Each such row therefore records the transaction that
wrote it (``xact_id``: ``pg_current_xact_id()``, 64 bits, never wraps), and a read returns
the rows after a :class:`~state_runtime.catalog.records.Position` (transaction, then id)
whose transaction lies below its snapshot's ``xmin``: every transaction below it has ended,
so no row can ever appear there again, and any later row sorts after what was read. A row is
reported once its transaction and every older writing transaction of the server have ended
(a delay of the oldest open write, never a loss). On SQLite one writer at a time commits, so
ids become visible in order: ``xact_id`` is 0 and the position is the id.

On PostgreSQL ``xact_id`` defaults to the writing transaction too (:class:`WritingTransaction`):
code from before the column (a rolling upgrade) inserts rows without it, and they must still
sort after every cursor that read past older rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from state_runtime.catalog.records import Position, Unsettled


def _xid(value: ColumnElement[object]) -> ColumnElement[int]:
    """A PostgreSQL ``xid8`` as a BIGINT (through text: xid8 has no cast to numbers)."""
    return sa.cast(sa.cast(value, sa.Text()), sa.BigInteger())


class WritingTransaction(FunctionElement[int]):
    """What a new row records as ``xact_id``: its transaction's id on PostgreSQL, 0 on SQLite;
    the column's server default too (what migration 0020 sets)."""

    type = sa.BigInteger()
    inherit_cache = True
    name = "writing_transaction"


@compiles(WritingTransaction)
def _no_transaction(element: WritingTransaction, compiler: SQLCompiler, **kw: object) -> str:
    return "0"


@compiles(WritingTransaction, "postgresql")
def _current_transaction(element: WritingTransaction, compiler: SQLCompiler, **kw: object) -> str:
    return "(pg_current_xact_id()::text)::bigint"


def settled_after(
    connection: Connection, xact: ColumnElement[int], row: ColumnElement[int], after: Position
) -> ColumnElement[bool]:
    """The rows after ``after`` (by ``xact``, then ``row``) whose transaction, and every older
    one, has ended: the statement's own snapshot's ``xmin`` (``pg_current_snapshot``, the
    snapshot the rows are read with)."""
    later = later_than(xact, row, after)
    if connection.dialect.name != "postgresql":
        return later
    return sa.and_(later, xact < _horizon())


def later_than(
    xact: ColumnElement[int], row: ColumnElement[int], after: Position
) -> ColumnElement[bool]:
    """The rows after ``after`` (by ``xact``, then ``row``), visible now whatever transaction
    is still open below them: what happened since, not a cursor's next rows."""
    return sa.tuple_(xact, row) > sa.tuple_(
        sa.literal(after.xact, sa.BigInteger()), sa.literal(after.row, sa.BigInteger())
    )


def _horizon() -> ColumnElement[int]:
    """The statement's snapshot's ``xmin``: every transaction below it has ended."""
    return _xid(sa.func.pg_snapshot_xmin(sa.func.pg_current_snapshot()))


OLDEST_WRITE = sa.text(
    "SELECT clock_timestamp() - min(began) FROM (SELECT xact_start AS began"
    " FROM pg_stat_activity WHERE backend_xid IS NOT NULL"
    " UNION ALL SELECT prepared FROM pg_prepared_xacts) AS open_writes"
)
"""How long the oldest open writing transaction of the server (or prepared one: a forgotten
``PREPARE TRANSACTION`` holds ``xmin`` too) has been open, among those the role may see."""


def unsettled(
    connection: Connection,
    reads: Sequence[tuple[ColumnElement[int], ColumnElement[int], Position]],
) -> Unsettled:
    """The rows after each read's position (its ``xact_id`` and id columns, then the
    position) that :func:`settled_after` holds back, and the age of the oldest open writing
    transaction when there are some: why a reader waits (one statement, a second when rows
    wait; none on SQLite)."""
    if connection.dialect.name != "postgresql":
        return Unsettled()
    counts = [
        sa.select(sa.func.count()).where(later_than(xact, row, after), xact >= _horizon())
        for xact, row, after in reads
    ]
    rows = sum(connection.execute(sa.select(*(c.scalar_subquery() for c in counts))).one())
    return Unsettled(rows, connection.execute(OLDEST_WRITE).scalar() if rows else None)
