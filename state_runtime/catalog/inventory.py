"""Stores and the file inventory: registering stores, locking them, recording files as written.

Every write that touches a store's files or commit entries first locks the store's row
(``SELECT ... FOR UPDATE`` on PostgreSQL, in store-id order so two writers never deadlock;
on SQLite ``BEGIN IMMEDIATE`` already holds the whole database). Commits, cleanup claims and
file records therefore see each other's effects whole, never interleaved.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.reading import read_stores
from state_runtime.catalog.records import StoreKey, StoreRecord
from state_runtime.catalog.roots import validate_root
from state_runtime.catalog.rows import (
    READ_STORE_KEY_COLUMNS,
    STORE_KEY_COLUMNS,
    AnyRow,
    is_store,
    key_of,
    store_id_of,
)
from state_runtime.catalog.statements import chunks, insert_ignoring
from state_runtime.catalog.tables import (
    FileState,
    batch_metrics,
    batch_watermarks,
    checkpoint_files,
    commit_log,
    operator_schemas,
    stores,
)
from state_runtime.errors import CatalogError, InvalidArgument
from state_runtime.identity import (
    EMPTY,
    CheckpointRef,
    FileKind,
    StoreId,
    parse_file_name,
    validate_checkpoint_id,
    validate_non_negative,
)
from state_runtime.storage.root_rule import parse_root
from state_runtime.store.checkpoint_info import CheckpointInfo

_CHECKSUM_RE = re.compile(r"^[0-9a-f]{64}$")


def committed_ids_at(
    connection: Connection, pairs: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], str]:
    """The committed checkpoint id of each (store id, version) pair that has one.

    Asks for ``store_id IN (...) AND version IN (...)`` (the commit log's unique index serves
    it; a batch's stores mostly share one version) and keeps the exact pairs.
    """
    wanted = set(pairs)
    c = commit_log.c
    found: dict[tuple[int, int], str] = {}
    for part in chunks(sorted(wanted)):
        rows = connection.execute(
            sa.select(c.store_id, c.version, c.checkpoint_id).where(
                c.store_id.in_({sid for sid, _ in part}), c.version.in_({v for _, v in part})
            )
        )
        found.update(
            {
                (r.store_id, r.version): r.checkpoint_id
                for r in rows
                if (r.store_id, r.version) in wanted
            }
        )
    return found


def store_ids(connection: Connection, root: str, wanted: Iterable[StoreId]) -> dict[StoreId, int]:
    """The ids of the stores in ``wanted`` that the catalog knows (no insert)."""
    s = read_stores.c
    wanted = set(wanted)
    found: dict[StoreId, int] = {}
    for part in chunks(sorted(wanted)):
        # Per-column IN lists let the identity index serve; exact pairs are kept below.
        rows = connection.execute(
            sa.select(s.store_id, s.operator_id, s.partition_id, s.store_name).where(
                s.checkpoint_root == root,
                s.operator_id.in_({x.operator_id for x in part}),
                s.partition_id.in_({x.partition_id for x in part}),
                s.store_name.in_({x.store_name for x in part}),
            )
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
    found = store_ids(connection, root, ordered)
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
    return found | store_ids(connection, root, missing)


def lock_stores(connection: Connection, ids: Iterable[int]) -> None:
    """Lock the stores' rows until the transaction ends (PostgreSQL; SQLite holds the database
    lock from ``BEGIN IMMEDIATE``). Locks are taken in id order, so writers never deadlock."""
    if connection.dialect.name != "postgresql":
        return
    ordered = sorted(set(ids))
    for part in chunks(ordered):
        connection.execute(
            sa.select(stores.c.store_id)
            .where(stores.c.store_id.in_(part))
            .order_by(stores.c.store_id)
            .with_for_update()
        ).all()


def _located(path: str) -> tuple[StoreId, int] | None:
    """The store and version of a checkpoint file path,
    ``state/<op>/<partition>/<name>/<version>_<id>.<kind>``; None for anything else."""
    parts = path.split("/")
    if len(parts) != 5 or parts[0] != "state" or not (parts[1].isdigit() and parts[2].isdigit()):
        return None
    parsed = parse_file_name(parts[4])
    if parsed is None:
        return None
    try:
        return StoreId(int(parts[1]), int(parts[2]), parts[3]), parsed.version
    except InvalidArgument:
        return None


def files_at(
    connection: Connection,
    root: str,
    paths: Iterable[str],
    *columns: Any,
    files: sa.TableClause = checkpoint_files,
) -> list[AnyRow]:
    """``columns`` of ``files`` (the table, or its reading view) at ``paths`` below ``root``
    (paths the catalog does not know are left out). Looks files up through the index, never
    by scanning paths, so that a cleanup recording 100,000 deletions costs index probes, not
    table scans."""
    located = {path: where for path in set(paths) if (where := _located(path)) is not None}
    ids = store_ids(connection, root, {store for store, _ in located.values()})
    wanted = {
        (ids[store], version, path) for path, (store, version) in located.items() if store in ids
    }
    return [row for _, row in _rows_at(connection, wanted, columns, files)]


def _rows_at(
    connection: Connection,
    wanted: set[tuple[int, int, str]],
    columns: Sequence[Any],
    files: sa.TableClause = checkpoint_files,
) -> list[tuple[str, AnyRow]]:
    """(path, row) for the files at the given (store id, version, path) triples. Per-column
    IN lists on (store_id, version) let the checkpoint index serve; exact paths are kept."""
    f = files.c
    found: list[tuple[str, AnyRow]] = []
    for part in chunks(sorted(wanted)):
        # Match each chunk against its own files only: a file of another chunk may fall in
        # this chunk's IN lists, and must not be returned twice.
        pairs = {(sid, path) for sid, _, path in part}
        rows = connection.execute(
            sa.select(f.path.label("located_path"), f.store_id.label("located_in"), *columns).where(
                f.store_id.in_({sid for sid, _, _ in part}),
                f.version.in_({version for _, version, _ in part}),
            )
        )
        found += [(row[0], row) for row in rows if (row[1], row[0]) in pairs]
    return found


@dataclass(frozen=True)
class RecordedFile:
    file_id: int
    store_id: int
    state: str
    claimed_by_run: int | None


def _check_info(info: CheckpointInfo) -> None:
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
) -> dict[str, RecordedFile]:
    """Record files as written, idempotently, and return each path's row.

    A new file's state follows the commit log: committed if its (version, id) is committed,
    orphan if another id holds that version, else written. Recording a path again with the
    same content is a no-op; with other content it is an error (files are immutable).
    """
    validate_root(root)
    for info in infos:
        _check_info(info)
    ids = ensure_stores(connection, root, (i.store for i in infos), now)
    lock_stores(connection, ids.values())
    wanted = {(ids[i.store], i.version, i.path) for i in infos}
    existing = _files_by_path(connection, wanted)
    new = [i for i in infos if i.path not in existing]
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
    if rows:
        # A plain INSERT (batched by the driver): the store locks make ``existing`` exact.
        connection.execute(sa.insert(checkpoint_files), rows)
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


def mark_maintained(connection: Connection, ids: Iterable[int], run_id: int) -> None:
    """Note ``run_id`` as the stores' last maintenance run."""
    for part in chunks(sorted(set(ids))):
        connection.execute(
            sa.update(stores).where(stores.c.store_id.in_(part)).values(last_run_id=run_id)
        )


def _files_by_path(connection: Connection, wanted: set[tuple[int, int, str]]) -> dict[str, AnyRow]:
    f = checkpoint_files.c
    columns = (f.file_id, f.store_id, f.checkpoint_id, f.checksum, f.size_bytes, f.state)
    return dict(_rows_at(connection, wanted, (*columns, f.claimed_by_run)))


def claimed_stores(connection: Connection, root: str | None) -> set[StoreKey]:
    """Stores with files claimed for deletion but not yet recorded deleted."""
    s, f = stores.c, checkpoint_files.c
    query = (
        sa.select(*STORE_KEY_COLUMNS)
        .distinct()
        .join(checkpoint_files, f.store_id == s.store_id)
        .where(f.state == FileState.DELETING.value)
    )
    if root is not None:
        query = query.where(s.checkpoint_root == root)
    return {key_of(r) for r in connection.execute(query)}


def known_paths(connection: Connection, root: str) -> dict[str, str]:
    """Every path the catalog has a record of below ``root``, with its state."""
    s, f = stores.c, checkpoint_files.c
    rows = connection.execute(
        sa.select(f.path, f.state)
        .join(stores, s.store_id == f.store_id)
        .where(s.checkpoint_root == root)
    )
    return {r.path: r.state for r in rows}


def register_store(
    connection: Connection,
    root: str,
    store: StoreId,
    key_schema: Any,
    value_schema: Any,
    now: datetime,
) -> None:
    """Record a store (if new) and its key and value schemas."""
    ensure_stores(connection, root, [store], now)
    s = stores.c
    connection.execute(
        stores.update()
        .where(
            s.checkpoint_root == root,
            is_store(store),
        )
        .values(key_schema=key_schema, value_schema=value_schema)
    )


def roots(connection: Connection) -> list[str]:
    """Every checkpoint root below which the catalog knows a store."""
    query = sa.select(read_stores.c.checkpoint_root).distinct()
    return sorted(connection.execute(query).scalars())


def relocate_root(connection: Connection, old: str, new: str) -> int:
    """Point every record below root ``old`` at ``new``; the number of stores moved."""
    known = set(roots(connection))
    if old not in known:
        raise InvalidArgument(f"the catalog records no store below {old}")
    if new in known:
        raise InvalidArgument(f"the catalog already records stores below {new}")
    moved = connection.execute(
        stores.update().where(stores.c.checkpoint_root == old).values(checkpoint_root=new)
    ).rowcount
    for table in (batch_metrics, batch_watermarks, operator_schemas):
        connection.execute(
            table.update().where(table.c.checkpoint_root == old).values(checkpoint_root=new)
        )
    return int(moved)


def store_records(connection: Connection, root: str | None) -> list[StoreRecord]:
    """Every store the catalog knows (below ``root``, if given)."""
    query = read_stores.select().order_by(*READ_STORE_KEY_COLUMNS)
    if root is not None:
        query = query.where(read_stores.c.checkpoint_root == root)
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
        )
        for r in connection.execute(query)
    ]
