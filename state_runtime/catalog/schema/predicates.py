"""The conditions on a checkpoint file that every query, view and partial index shares.

Each is declared once, over any ``checkpoint_files``-shaped columns (the table's, a reading
view's, an alias's): the partial indexes of :mod:`~state_runtime.catalog.schema.tables` take their
WHERE clauses from them, the retention and status queries filter with them, and the
operators' views render them as SQL (:func:`render`). Change what "live" or "verified
snapshot" means here, and the indexes' migration with it. "Verified snapshot" has two
declared forms, each named for what decides it: the file's row, or the commit log (their
docstrings say why both exist).

Their values are written into the SQL (:func:`constant`), not bound: SQLite uses a partial
index for a bound value too, but then prepares the statement again at every new binding, that
is at every execution, so each query over these conditions would be compiled anew each time it
runs. :func:`constant` takes only the enums these conditions name, so no other text reaches
the SQL.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql.elements import ColumnElement

from state_runtime.catalog.schema.runs import RunOutcome
from state_runtime.identity import FileKind
from state_runtime.retention import LIVE_STATES, FileState, Verification


def constant(member: FileState | FileKind | Verification | RunOutcome) -> ColumnElement[str]:
    """``member``'s value as an SQL string literal in the statement's text (the same text
    ``literal_binds`` renders), so that the planner sees it (sqlite.org/partialindex.html:
    "the terms in the WHERE clause of the query must be ... identical" to the index's). Only
    these enums are accepted, so no user text reaches the statement's text."""
    value = member.value
    return sa.literal_column("'" + value.replace("'", "''") + "'", sa.String())


def is_live(f: Any) -> ColumnElement[bool]:
    """The file is in storage and may still matter: written, committed or orphan (not claimed
    by cleanup, not deleted)."""
    live: ColumnElement[bool] = f.state.in_([constant(state) for state in LIVE_STATES])
    return live


def is_orphan(f: Any) -> ColumnElement[bool]:
    """The file is known never to be committed."""
    orphan: ColumnElement[bool] = f.state == constant(FileState.ORPHAN)
    return orphan


def is_verified_snapshot_by_row(f: Any) -> ColumnElement[bool]:
    """A verified snapshot whose own row says committed: a condition on the row alone, so a
    partial index can hold it. What the status facts (the last snapshot, the versions that
    still load, snapshot candidates) and the lineage view count over every store.

    "Verified snapshot" has this meaning and :func:`is_verified_snapshot_by_commit_log`'s,
    because an index cannot follow the commit log while retention must: they agree whenever
    the protocol holds (a file's state follows the commit log; the runtime's guard trigger
    refuses anything else), and where a row disagrees (an owner's or maintenance's UPDATE)
    the status may be off, but retention still keeps what a retained version loads.
    """
    return sa.and_(
        f.kind == constant(FileKind.SNAPSHOT),
        f.state == constant(FileState.COMMITTED),
        f.verification == constant(Verification.VERIFIED),
    )


def is_verified_snapshot_by_commit_log(f: Any, commits: Any) -> ColumnElement[bool]:
    """A live, verified snapshot of a committed version: the commit log (``commits``: the
    table, its reading view or an alias) names it by store, version and checkpoint id,
    whatever the file row's state says. What a retained version loads from (the retention
    rule): the commit log, not a row, decides what cleanup keeps. Its indexable part is
    :func:`is_verified_snapshot_by_row`'s index (see there why both exist)."""
    return sa.and_(
        f.kind == constant(FileKind.SNAPSHOT),
        is_live(f),
        f.verification == constant(Verification.VERIFIED),
        sa.exists().where(
            commits.c.store_id == f.store_id,
            commits.c.version == f.version,
            commits.c.checkpoint_id == f.checkpoint_id,
        ),
    )


FILE_COLUMNS = ("state", "kind", "verification")


def render(predicate: Any, alias: str = "") -> str:
    """``predicate`` as SQL text over the columns of ``alias`` (bare names when empty), values
    inlined: what a hand-written view or an index's WHERE clause embeds."""
    columns: Any = (
        sa.table(alias, *(sa.column(name) for name in FILE_COLUMNS)).c
        if alias
        else SimpleNamespace(**{name: sa.column(name) for name in FILE_COLUMNS})
    )
    compiled = predicate(columns).compile(
        dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}
    )
    return str(compiled)
