"""Stores and the file inventory: registering stores, recording files as written, listing
what the catalog knows below a root, moving a root. Files are recorded under the store locks
of :mod:`state_runtime.catalog.sql.lookups`, by the driver's batch commit and by maintenance."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import StoreKey, StoreRecord
from state_runtime.catalog.schema.predicates import constant
from state_runtime.catalog.schema.reading_views import WRITE_LOOKUPS, ReaderViews
from state_runtime.catalog.schema.tables import (
    FileState,
    Verification,
    batch_metrics,
    batch_watermarks,
    checkpoint_files,
    deletion_ledger,
    operator_schemas,
    root_queries,
    stores,
)
from state_runtime.catalog.sql.lookups import (
    committed_ids_at,
    ensure_stores,
    lock_stores,
    mark_maintained,
    rows_at,
)
from state_runtime.catalog.sql.roots import validate_root
from state_runtime.catalog.sql.rows import AnyRow, key_of, store_key_columns
from state_runtime.catalog.sql.scope import Scope
from state_runtime.catalog.sql.statements import chunks
from state_runtime.errors import CatalogError, InvalidArgument
from state_runtime.identity import (
    EMPTY,
    CheckpointRef,
    FileKind,
    StoreId,
    validate_checkpoint_id,
    validate_non_negative,
)
from state_runtime.store.checkpoint_info import CheckpointInfo

_CHECKSUM_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class RecordedFile:
    file_id: int
    store_id: int
    state: str
    claimed_by_run: int | None


def check_info(info: CheckpointInfo) -> None:
    """Refuse an info whose fields contradict each other or its path (typed, naming it)."""
    expected = info.store.file_path(info.version, info.checkpoint_id, info.kind)
    if info.path != expected:
        raise InvalidArgument(
            f"checkpoint info path {info.path!r} does not match its identity (expected "
            f"{expected!r})",
            store=info.store,
            version=info.version,
            checkpoint_id=info.checkpoint_id,
        )
    if info.version < 1:
        raise InvalidArgument("checkpoint files start at version 1", store=info.store)
    validate_non_negative(info.version, "version")
    for count, what in ((info.rows, "rows"), (info.file_rows, "file rows")):
        validate_non_negative(count, what)
    validate_non_negative(info.bytes_written, "size")
    validate_checkpoint_id(info.checkpoint_id)
    if info.base_checkpoint_id is not None:
        validate_checkpoint_id(info.base_checkpoint_id)
    if info.kind is FileKind.DELTA and (info.version == 1) != (info.base_checkpoint_id is None):
        raise InvalidArgument(
            "a delta has a base checkpoint id exactly when its version is above 1",
            store=info.store,
            version=info.version,
            checkpoint_id=info.checkpoint_id,
        )
    if info.lineage and (
        info.lineage[0].version != info.version - 1
        or info.lineage[0].checkpoint_id != info.base_checkpoint_id
    ):
        raise InvalidArgument(
            f"lineage starts at {info.lineage[0]}, not at the base "
            f"{info.version - 1}_{info.base_checkpoint_id}",
            store=info.store,
            version=info.version,
            checkpoint_id=info.checkpoint_id,
        )
    if not _CHECKSUM_RE.match(info.checksum):
        raise InvalidArgument(f"checksum {info.checksum!r} is not sha256 hex", path=info.path)
    if min(info.bytes_written, info.rows, info.file_rows) < 0:
        raise InvalidArgument("negative size or row count", path=info.path)


def record_files(
    connection: Connection,
    root: str,
    infos: Sequence[CheckpointInfo],
    now: datetime,
    *,
    run_id: int | None = None,
    rewritten: bool = False,
) -> dict[str, RecordedFile]:
    """Record files as written, idempotently, and return each path's row.

    A new file's state follows the commit log: committed if its (version, id) is committed,
    orphan if another id holds that version, else written. Recording a path again with the
    same content is a no-op; with other content it is an error (files are immutable). A
    version that changed nothing has no file (``CheckpointInfo.has_file``): nothing is
    recorded for it, and the catalog never holds a path that never existed. ``rewritten``:
    see :func:`record_locked`.
    """
    validate_root(root)
    for info in infos:
        check_info(info)
    ids = ensure_stores(connection, root, (i.store for i in infos), now)
    lock_stores(connection, ids.values())
    return record_locked(connection, ids, infos, now, run_id=run_id, rewritten=rewritten)


def record_locked(
    connection: Connection,
    ids: dict[StoreId, int],
    infos: Sequence[CheckpointInfo],
    now: datetime,
    *,
    run_id: int | None = None,
    rewritten: bool = False,
) -> dict[str, RecordedFile]:
    """:func:`record_files` for checked infos whose stores (``ids``) this transaction has
    ensured and locked.

    With ``rewritten`` (the caller has just written or found each file), a path whose record
    says deleted holds a new file: its record is replaced in place, and its deletion's ledger
    entry goes (the ledger names files that are gone; one entry per record). Only a version
    without a file of its own sees its path again: an idle version keeps its parent's id, so
    after a restore the replayed batch commits the same (version, id), and a snapshot of it
    is written where cleanup deleted the first one.
    """
    infos = [i for i in infos if i.has_file]
    wanted = {(ids[i.store], i.version, i.path) for i in infos}
    existing = _files_by_path(connection, wanted)
    deleted = {
        path: row.file_id
        for path, row in existing.items()
        if rewritten and row.state == FileState.DELETED.value
    }
    new = [i for i in infos if i.path not in existing or i.path in deleted]
    committed = committed_ids_at(connection, {(ids[i.store], i.version) for i in new})
    rows = []
    for info in new:
        store_id = ids[info.store]
        holder = committed.get((store_id, info.version))
        if holder == info.checkpoint_id:
            state, reason = FileState.COMMITTED, None
        elif holder is not None:
            state = FileState.ORPHAN
            reason = f"version {info.version} is committed with checkpoint id {holder}"
        else:
            state, reason = FileState.WRITTEN, None
        rows.append(
            {
                "store_id": store_id,
                "path": info.path,
                "kind": info.kind.value,
                "version": info.version,
                "checkpoint_id": info.checkpoint_id,
                "base_checkpoint_id": info.base_checkpoint_id,
                "lineage": [[ref.version, ref.checkpoint_id] for ref in info.lineage],
                "size_bytes": info.bytes_written,
                "rows": info.rows,
                "file_rows": info.file_rows,
                "checksum": info.checksum,
                "created_at": info.created_at,
                "recorded_at": now,
                "state": state.value,
                "state_changed_at": now,
                "state_reason": reason,
            }
        )
    inserted = [values for values in rows if values["path"] not in deleted]
    if inserted:
        # A plain INSERT (batched by the driver): the store locks make ``existing`` exact.
        connection.execute(sa.insert(checkpoint_files), inserted)
    if deleted:  # one ledger entry per record: the file it named is there again
        gone = deletion_ledger.c.file_id.in_(list(deleted.values()))
        connection.execute(sa.delete(deletion_ledger).where(gone))
    for values in rows:
        if values["path"] in deleted:
            connection.execute(
                sa.update(checkpoint_files)
                .where(checkpoint_files.c.file_id == deleted[values["path"]])
                .values(
                    **values,
                    claimed_by_run=None,
                    verification=Verification.UNVERIFIED.value,
                    verified_at=None,
                    verification_note=None,
                )
            )
    if rows:
        existing |= _files_by_path(connection, {(ids[i.store], i.version, i.path) for i in new})
    recorded = existing
    for info in infos:
        row = recorded[info.path]
        if (
            row.checksum != info.checksum
            or row.size_bytes != info.bytes_written
            or row.checkpoint_id != info.checkpoint_id
        ):
            raise CatalogError(
                "file already recorded with other content (checksum or size differ); "
                "checkpoint files are immutable",
                store=info.store,
                version=info.version,
                checkpoint_id=info.checkpoint_id,
                path=info.path,
            )
    if run_id is not None:
        mark_maintained(connection, ids.values(), run_id)
    return {
        path: RecordedFile(row.file_id, row.store_id, row.state, row.claimed_by_run)
        for path, row in recorded.items()
    }


def _files_by_path(connection: Connection, wanted: set[tuple[int, int, str]]) -> dict[str, AnyRow]:
    f = checkpoint_files.c
    columns = (f.file_id, f.store_id, f.checkpoint_id, f.checksum, f.size_bytes, f.state)
    return dict(rows_at(connection, wanted, (*columns, f.claimed_by_run)))


def claimed_stores(connection: Connection, views: ReaderViews, root: str | None) -> set[StoreKey]:
    """Stores with files claimed for deletion but not yet recorded deleted."""
    s, f = views.stores.c, views.files.c
    query = (
        sa.select(*store_key_columns(views.stores))
        .distinct()
        .join(views.files, f.store_id == s.store_id)
        .where(f.state == constant(FileState.DELETING))
    )
    if root is not None:
        query = query.where(s.checkpoint_root == root)
    return {key_of(r) for r in connection.execute(query)}


def known_paths(connection: Connection, views: ReaderViews, root: str) -> dict[str, str]:
    """Every path the catalog has a record of below ``root``, with its state."""
    s, f = views.stores.c, views.files.c
    rows = connection.execute(
        sa.select(f.path, f.state)
        .join(views.stores, s.store_id == f.store_id)
        .where(s.checkpoint_root == root)
    )
    return {r.path: r.state for r in rows}


def register_stores(
    connection: Connection,
    root: str,
    wanted: Sequence[StoreId],
    key_schema: Any,
    value_schema: Any,
    now: datetime,
) -> None:
    """Record stores (those new) sharing key and value schemas, and set those schemas: a
    few set-based statements per 400 stores, whatever their number."""
    schemas = {store: (key_schema, value_schema) for store in wanted}
    ids = ensure_stores(connection, root, wanted, now, schemas)
    for part in chunks(sorted(ids.values())):
        connection.execute(
            stores.update()
            .where(stores.c.store_id.in_(part))
            .values(key_schema=key_schema, value_schema=value_schema)
        )


def roots(connection: Connection, views: ReaderViews) -> list[str]:
    """Every checkpoint root below which the catalog knows a store."""
    query = sa.select(views.stores.c.checkpoint_root).distinct()
    return sorted(connection.execute(query).scalars())


def relocate_root(connection: Connection, old: str, new: str) -> int:
    """Point every record below root ``old`` at ``new``; the number of stores moved."""
    known = set(roots(connection, WRITE_LOOKUPS))
    if old not in known:
        raise InvalidArgument(f"the catalog records no store below {old}")
    if new in known:
        raise InvalidArgument(f"the catalog already records stores below {new}")
    moved = connection.execute(
        stores.update().where(stores.c.checkpoint_root == old).values(checkpoint_root=new)
    ).rowcount
    # A commit in flight on PostgreSQL (its trigger read the stores under its snapshot, the
    # root still ``old``) can add its (old, query) pair after this moved the pairs: the new
    # root then lacks that query until its next commit adds (new, query), and the stale pair
    # names no store (the names skip roots no store has). Locking ``commit_log`` here would
    # close it at the price of a deadlock with a commit that updated a store first.
    for table in (batch_metrics, batch_watermarks, operator_schemas, root_queries):
        connection.execute(
            table.update().where(table.c.checkpoint_root == old).values(checkpoint_root=new)
        )
    return int(moved)


def store_census(
    connection: Connection, views: ReaderViews, roots: Collection[str] | None = None
) -> tuple[int, int]:
    """How many stores the catalog knows and the newest store id (0, 0 when none), below
    ``roots`` if given: changes whenever a store is added or removed, read without listing
    them."""
    s = views.stores.c
    query = sa.select(sa.func.count(), sa.func.coalesce(sa.func.max(s.store_id), 0))
    if roots is None:
        count, newest = connection.execute(query).one()
        return int(count), int(newest)
    count, newest = 0, 0
    for part in chunks(sorted(roots)):
        found, top = connection.execute(query.where(s.checkpoint_root.in_(part))).one()
        count, newest = count + int(found), max(newest, int(top))
    return count, newest


def store_records(
    connection: Connection, views: ReaderViews, root: str | None
) -> list[StoreRecord]:
    """Every store the catalog knows (below ``root``, if given)."""
    return store_records_in(connection, views, Scope(root=root))


def store_records_in(connection: Connection, views: ReaderViews, scope: Scope) -> list[StoreRecord]:
    """The stores in ``scope`` (a root, a page of store ids), by key."""
    query = (
        views.stores.select()
        .where(scope.filter(views, views.stores.c.store_id))
        .order_by(*store_key_columns(views.stores))
    )
    return [
        StoreRecord(
            key=key_of(r),
            key_schema=r.key_schema,
            value_schema=r.value_schema,
            created_at=r.created_at,
            latest=CheckpointRef(r.latest_version, r.latest_checkpoint_id)
            if r.latest_version
            else EMPTY,
            last_committed_at=r.last_committed_at,
            expired_through=r.expired_through,
        )
        for r in connection.execute(query)
    ]
