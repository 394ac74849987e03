"""Lookups every concern of the catalog stands on: store ids (registering missing stores),
store locks, files by path, committed ids at versions, the stores' last maintenance run.

Every write that touches a store's files or commit entries first locks the store's row
(``SELECT ... FOR UPDATE`` on PostgreSQL, in store-id order so two writers never deadlock;
on SQLite ``BEGIN IMMEDIATE`` already holds the whole database). Commits, cleanup claims and
file records therefore see each other's effects whole, never interleaved. The modules of the
concerns (commits, inventory, deletions, findings, holders, ...) call down to these; nothing
here calls back up.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from state_runtime.catalog.schema.reading_views import WRITE_LOOKUPS, ReaderViews
from state_runtime.catalog.schema.tables import checkpoint_files, commit_log, stores
from state_runtime.catalog.sql.rows import AnyRow, store_id_of
from state_runtime.catalog.sql.statements import among, chunks, insert_ignoring
from state_runtime.errors import InvalidArgument
from state_runtime.identity import StoreId, parse_file_name
from state_runtime.storage.root_rule import parse_root


@functools.cache
def _committed_ids_query(dialect: str) -> sa.Select[Any]:
    """:func:`committed_ids_at`'s statement, built once a dialect."""
    c = commit_log.c
    return sa.select(c.store_id, c.version, c.checkpoint_id).where(
        among(dialect, c.store_id, "store_id"), among(dialect, c.version, "version")
    )


def committed_ids_at(
    connection: Connection, pairs: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], str]:
    """The committed checkpoint id of each (store id, version) pair that has one.

    Asks for ``store_id IN (...) AND version IN (...)`` (the commit log's unique index serves
    it; a batch's stores mostly share one version) and keeps the exact pairs.
    """
    wanted = set(pairs)
    found: dict[tuple[int, int], str] = {}
    for part in chunks(sorted(wanted)):
        rows = connection.execute(
            _committed_ids_query(connection.dialect.name),
            {
                "store_id": sorted({sid for sid, _ in part}),
                "version": sorted({v for _, v in part}),
            },
        )
        found.update(
            {
                (r.store_id, r.version): r.checkpoint_id
                for r in rows
                if (r.store_id, r.version) in wanted
            }
        )
    return found


@functools.cache
def _store_ids_query(views: ReaderViews, dialect: str) -> sa.Select[Any]:
    """:func:`store_ids`' statement, built once a dialect (its values are bind parameters)."""
    s = views.stores.c
    # Per-column IN lists let the identity index serve; exact pairs are kept by the caller.
    return sa.select(s.store_id, s.operator_id, s.partition_id, s.store_name).where(
        s.checkpoint_root == sa.bindparam("root", type_=s.checkpoint_root.type),
        *(
            among(dialect, column, column.name)
            for column in (s.operator_id, s.partition_id, s.store_name)
        ),
    )


def store_ids(
    connection: Connection, views: ReaderViews, root: str, wanted: Iterable[StoreId]
) -> dict[StoreId, int]:
    """The ids of the stores in ``wanted`` that the catalog knows (no insert)."""
    wanted = set(wanted)
    found: dict[StoreId, int] = {}
    for part in chunks(sorted(wanted)):
        rows = connection.execute(
            _store_ids_query(views, connection.dialect.name),
            {
                "root": root,
                "operator_id": sorted({x.operator_id for x in part}),
                "partition_id": sorted({x.partition_id for x in part}),
                "store_name": sorted({x.store_name for x in part}),
            },
        )
        for row in rows:
            store = store_id_of(row)
            if store in wanted:
                found[store] = row.store_id
    return found


def ensure_stores(
    connection: Connection,
    root: str,
    wanted: Iterable[StoreId],
    now: datetime,
    schemas: Mapping[StoreId, tuple[Any, Any]] | None = None,
) -> dict[StoreId, int]:
    """Insert the stores the catalog does not know yet (in a fixed order), return all ids."""
    ordered = sorted(set(wanted))
    found = store_ids(connection, WRITE_LOOKUPS, root, ordered)
    missing = [x for x in ordered if x not in found]
    if not missing:
        return found
    parse_root(root)  # storage's own rule: the catalog records no root storage refuses
    schemas = schemas or {}
    # ON CONFLICT: a concurrent transaction may be creating the same store right now.
    connection.execute(
        insert_ignoring(connection, stores),
        [
            {
                "checkpoint_root": root,
                "operator_id": x.operator_id,
                "partition_id": x.partition_id,
                "store_name": x.store_name,
                "key_schema": schemas.get(x, (None, None))[0],
                "value_schema": schemas.get(x, (None, None))[1],
                "created_at": now,
                "latest_version": 0,
            }
            for x in missing
        ],
    )
    return found | store_ids(connection, WRITE_LOOKUPS, root, missing)


def lock_stores(connection: Connection, ids: Iterable[int]) -> None:
    """Lock the stores' rows until the transaction ends (PostgreSQL; SQLite holds the database
    lock from ``BEGIN IMMEDIATE``). Locks are taken in id order, so writers never deadlock."""
    if connection.dialect.name != "postgresql":
        return
    ordered = sorted(set(ids))
    for part in chunks(ordered):
        connection.execute(
            sa.select(stores.c.store_id)
            .where(among("postgresql", stores.c.store_id, part))
            .order_by(stores.c.store_id)
            .with_for_update()
        ).all()


def _located(path: str, folders: dict[str, StoreId | None]) -> tuple[StoreId, int] | None:
    """The store and version of a checkpoint file path,
    ``state/<op>/<partition>/<name>/<version>_<id>.<kind>``; None for anything else.
    ``folders`` keeps each store folder's parse: a call's paths are a few stores' files."""
    folder, _, name = path.rpartition("/")
    if folder in folders:
        found = folders[folder]
    else:
        found = folders[folder] = _store_of(folder)
    if found is None:
        return None
    parsed = parse_file_name(name)
    return None if parsed is None else (found, parsed.version)


def _store_of(folder: str) -> StoreId | None:
    """The store of a store folder, ``state/<op>/<partition>/<name>``; None for another."""
    parts = folder.split("/")
    if len(parts) != 4 or parts[0] != "state" or not (parts[1].isdigit() and parts[2].isdigit()):
        return None
    try:
        return StoreId(int(parts[1]), int(parts[2]), parts[3])
    except InvalidArgument:
        return None


def files_at(
    connection: Connection, views: ReaderViews, root: str, paths: Iterable[str], *columns: Any
) -> list[AnyRow]:
    """``columns`` of ``views.files`` at ``paths`` below ``root`` (paths the catalog does not
    know are left out). Looks files up through the index, never
    by scanning paths, so that a cleanup recording 100,000 deletions costs index probes, not
    table scans."""
    folders: dict[str, StoreId | None] = {}
    located = {path: where for path in set(paths) if (where := _located(path, folders)) is not None}
    ids = store_ids(connection, views, root, {store for store, _ in located.values()})
    wanted = {
        (ids[store], version, path) for path, (store, version) in located.items() if store in ids
    }
    return [row for _, row in rows_at(connection, wanted, columns, views.files)]


def recorded_paths(
    connection: Connection, views: ReaderViews, root: str, paths: Iterable[str]
) -> set[str]:
    """Those of ``paths`` below ``root`` that the catalog has a record of (a dry run as the
    reader asks it too)."""
    return {row[0] for row in files_at(connection, views, root, paths)}


@functools.cache
def _rows_at_query(columns: tuple[Any, ...], files: sa.TableClause, dialect: str) -> sa.Select[Any]:
    """:func:`rows_at`'s statement for these columns of ``files``, built once a dialect."""
    f = files.c
    return sa.select(f.path.label("located_path"), f.store_id.label("located_in"), *columns).where(
        among(dialect, f.store_id, "store_id"), among(dialect, f.path, "path")
    )


def rows_at(
    connection: Connection,
    wanted: set[tuple[int, int, str]],
    columns: Sequence[Any],
    files: sa.TableClause = checkpoint_files,
) -> list[tuple[str, AnyRow]]:
    """(path, row) for the files at the given (store id, version, path) triples. Per-column
    IN lists on (store_id, path) let the unique path index serve with exact probes (IN lists
    on (store_id, version) read every file of a version: a store with a million orphans at
    one version read them all per chunk); exact pairs are kept."""
    statement = _rows_at_query(tuple(columns), files, connection.dialect.name)
    found: list[tuple[str, AnyRow]] = []
    for part in chunks(sorted(wanted)):
        # Match each chunk against its own files only: a file of another chunk may fall in
        # this chunk's IN lists, and must not be returned twice.
        pairs = {(sid, path) for sid, _, path in part}
        rows = connection.execute(
            statement,
            {
                "store_id": sorted({sid for sid, _, _ in part}),
                "path": sorted({path for _, _, path in part}),
            },
        )
        found += [(row[0], row) for row in rows if (row[1], row[0]) in pairs]
    return found


def mark_maintained(connection: Connection, ids: Iterable[int], run_id: int) -> None:
    """Note ``run_id`` as the stores' last maintenance run (the rows it already names are
    left alone: a run's leases and its claims both note it, and on PostgreSQL a rewrite of
    an unchanged row still costs a new row version and its index entries)."""
    for part in chunks(sorted(set(ids))):
        statement = _mark_maintained_query(connection.dialect.name)
        connection.execute(statement, {"ids": part, "run_id": run_id})


@functools.cache
def _mark_maintained_query(dialect: str) -> sa.Update:
    """:func:`mark_maintained`'s statement, built once a dialect."""
    run = sa.bindparam("run_id", type_=stores.c.last_run_id.type)
    last = stores.c.last_run_id
    return (
        sa.update(stores)
        .where(among(dialect, stores.c.store_id, "ids"), sa.or_(last.is_(None), last != run))
        .values(last_run_id=run)
    )


def restored_expiry(version: int) -> ColumnElement[int]:
    """``stores.expired_through`` once a store's latest version is set back to ``version``
    (a restore's target, checked to load; a repartition's new snapshot): below it."""
    return expired_below(sa.literal(max(version - 1, 0), sa.BigInteger()))


def expired_below(below: ColumnElement[int]) -> ColumnElement[int]:
    """``stores.expired_through`` lowered to ``below`` where it is above (a literal, or a bind
    parameter of a statement built once)."""
    expired = stores.c.expired_through
    return sa.case((expired > below, below), else_=expired)
