"""Each store's history, like Delta's DESCRIBE HISTORY: committed versions, newest first,
with the batch that committed them and what became of their files (snapshots, deletions)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import HistoryFile, NamesMark, VersionHistory
from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.sql.rows import key_of, store_key_columns
from state_runtime.catalog.sql.statements import chunks
from state_runtime.identity import CheckpointRef, FileKind, StoreId


def version_history(
    connection: Connection,
    views: ReaderViews,
    root: str,
    only: Sequence[StoreId] | None,
    query_id: str | None,
    limit: int,
) -> list[VersionHistory]:
    """The ``limit`` newest committed versions below ``root`` (of the stores in ``only``, of
    the query ``query_id``), newest commit first; each with the files of its checkpoint id."""
    s, c = views.stores.c, views.commits.c
    query = (
        sa.select(
            c.store_id,
            *store_key_columns(views.stores),
            c.version,
            c.checkpoint_id,
            c.query_id,
            c.batch_id,
            c.committed_at,
        )
        .join(views.stores, s.store_id == c.store_id)
        .where(s.checkpoint_root == root)
        .order_by(c.committed_at.desc(), c.batch_id.desc(), s.operator_id, s.partition_id)
        .limit(limit)
    )
    if query_id is not None:
        query = query.where(c.query_id == query_id)
    if only is not None:  # exactly these stores, in SQL, so that the limit counts only theirs
        query = query.where(
            sa.or_(
                sa.false(),
                *(
                    sa.and_(
                        s.operator_id == x.operator_id,
                        s.partition_id == x.partition_id,
                        s.store_name == x.store_name,
                    )
                    for x in set(only)
                ),
            )
        )
    commits = list(connection.execute(query))
    files = _files(connection, views, [(r.store_id, r.version, r.checkpoint_id) for r in commits])
    history: list[VersionHistory] = []
    for r in commits:
        own = files.get((r.store_id, r.version, r.checkpoint_id), [])
        # a version that changed nothing has no file: its rows are its parent's checkpoint's
        found = own or _older(files, r.store_id, r.version, r.checkpoint_id)
        history.append(
            VersionHistory(
                key=key_of(r),
                ref=CheckpointRef(r.version, r.checkpoint_id),
                query_id=r.query_id,
                batch_id=r.batch_id,
                committed_at=r.committed_at,
                rows=found[0][0] if found else 0,
                files=tuple(f for _, f in own),
            )
        )
    return history


def _older(
    files: dict[tuple[int, int, str], list[tuple[int, HistoryFile]]],
    store_id: int,
    version: int,
    checkpoint_id: str,
) -> list[tuple[int, HistoryFile]]:
    """The files of the newest lower version with the same checkpoint id: the one a version
    that changed nothing shares its state with."""
    below = [k for k in files if k[0] == store_id and k[2] == checkpoint_id and k[1] < version]
    return files[max(below)] if below else []


def _files(
    connection: Connection, views: ReaderViews, wanted: Sequence[tuple[int, int, str]]
) -> dict[tuple[int, int, str], list[tuple[int, HistoryFile]]]:
    """The files of each (store id, checkpoint id) pair's versions, with the state rows at
    each version (every file of a version records them): the wanted versions' own, and the
    lower versions' a version that changed nothing shares its checkpoint with."""
    f, d = views.files.c, views.deletions.c
    keys = set(wanted)
    found: dict[tuple[int, int, str], list[tuple[int, HistoryFile]]] = defaultdict(list)
    for part in chunks(sorted(keys)):
        rows = connection.execute(
            sa.select(
                f.store_id,
                f.version,
                f.checkpoint_id,
                f.path,
                f.kind,
                f.size_bytes,
                f.rows,
                f.file_rows,
                f.state,
                f.verification,
                f.created_at,
                d.deleted_at,
                d.run_id,
                d.reason,
            )
            .outerjoin(views.deletions, d.file_id == f.file_id)
            .where(
                f.store_id.in_({k[0] for k in part}),
                f.checkpoint_id.in_({k[2] for k in part}),
            )
            .order_by(f.kind, f.created_at)
        )
        pairs = {(k[0], k[2]) for k in part}
        for r in rows:
            key = (r.store_id, r.version, r.checkpoint_id)
            if (r.store_id, r.checkpoint_id) in pairs:
                found[key].append(
                    (
                        r.rows,
                        HistoryFile(
                            path=r.path,
                            kind=FileKind(r.kind),
                            size_bytes=r.size_bytes,
                            file_rows=r.file_rows,
                            state=r.state,
                            verification=r.verification,
                            created_at=r.created_at,
                            deleted_at=r.deleted_at,
                            deletion_run=r.run_id,
                            deletion_reason=r.reason,
                        ),
                    )
                )
    return found


def root_queries(connection: Connection, views: ReaderViews) -> dict[str, list[str]]:
    """Every root the catalog knows with the queries that committed below it (none yet: an
    empty list): the roots by the stores' index (:func:`distinct_values`), their (root, query)
    pairs from ``root_queries`` (migration 0021), the pairs the commit log has ever held, one
    source with :func:`names_mark` (the commit log's scan took 1.6 to 2.0 s at 100,000 stores).
    No statement deletes a pair, nor does one empty it from the commit log (a rewind keeps
    batch 0, a layout switch the query's other stores), so both sources hold the same pairs."""
    p = views.root_queries.c
    roots = distinct_values(connection, views.stores.c.checkpoint_root)
    found: dict[str, list[str]] = {root: [] for root in roots}
    pairs = sa.select(p.checkpoint_root, p.query_id).order_by(p.checkpoint_root, p.query_id)
    for root, query_id in connection.execute(pairs):
        if root in found:
            found[root].append(query_id)
    return found


def _distinct(column: sa.ColumnElement[str]) -> sa.Select[Any]:
    """The distinct values of an indexed ``column`` in order, by a loose index scan (a
    recursive ``min(column) > previous``: one index probe a value, where ``DISTINCT`` reads
    every row: the commit log's millions)."""
    first = sa.select(sa.func.min(column).label("value")).cte("seen", recursive=True)
    later = sa.select(
        sa.select(sa.func.min(column)).where(column > first.c.value).scalar_subquery()
    ).where(first.c.value.is_not(None))
    seen = first.union_all(later)
    return sa.select(seen.c.value).where(seen.c.value.is_not(None))


def distinct_values(connection: Connection, column: sa.ColumnElement[str]) -> list[str]:
    """The distinct values of an indexed ``column`` in order (:func:`_distinct`)."""
    return list(connection.execute(_distinct(column)).scalars())


def names_mark(connection: Connection, views: ReaderViews) -> NamesMark:
    """What the stores' names follow (``StoreNames``): the stores' count and newest id (a
    store added or removed), the roots (one relocated), and the count and newest id of the
    (root, query) pairs the commit log has ever held (a query new, renamed, or committing
    below another root: it moved to a new checkpoint location, whatever its batch numbers),
    each by an index or a table of one row a pair (migration 0021)."""
    s, p = views.stores.c, views.root_queries.c
    count, newest = connection.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.max(s.store_id), 0))
    ).one()
    roots = distinct_values(connection, s.checkpoint_root)
    pairs, newest_pair = connection.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.max(p.pair_id), 0))
    ).one()
    return NamesMark(int(count), int(newest), tuple(roots), int(pairs), int(newest_pair))


def query_ids(connection: Connection, views: ReaderViews, root: str) -> list[str]:
    """The queries that committed below ``root``."""
    s, c = views.stores.c, views.commits.c
    query = (
        sa.select(c.query_id)
        .distinct()
        .join(views.stores, s.store_id == c.store_id)
        .where(s.checkpoint_root == root)
        .order_by(c.query_id)
    )
    return list(connection.execute(query).scalars())
