"""What checks found: file verifications, store problems, validations and snapshot repairs.

A file's ``verification`` says whether its bytes were found intact against its record since it
was written (only a verified snapshot supersedes deltas). A store's open problems are what
its last validation found wrong, plus what the snapshot pass, a repair or the runtime's loss
check found; while one is open the store is held (not cleaned) and its status is broken. A
commit that replaces the checkpoint of a problem's file closes it (:func:`close_unneeded`).
Every write locks the store's row, so a cleanup claiming files of the store waits for it and
sees the problem.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import FileVerdict, FoundProblem, Repair, StoreProblem, Validated
from state_runtime.catalog.schema.predicates import constant
from state_runtime.catalog.schema.reading_views import WRITE_LOOKUPS, ReaderViews
from state_runtime.catalog.schema.tables import (
    FileState,
    Verification,
    checkpoint_files,
    commit_log,
    file_repairs,
    store_problems,
    stores,
)
from state_runtime.catalog.sql.inventory import record_files
from state_runtime.catalog.sql.lookups import files_at, lock_stores, store_ids
from state_runtime.catalog.sql.retention import file_verdicts
from state_runtime.catalog.sql.rows import (
    AnyRow,
    is_store,
    key_of,
    store_key_columns,
)
from state_runtime.catalog.sql.scope import Scope
from state_runtime.catalog.sql.statements import among, chunks
from state_runtime.errors import CatalogError, InvalidArgument
from state_runtime.identity import FileKind, StoreId
from state_runtime.retention import RetentionPolicy
from state_runtime.store.checkpoint_info import CheckpointInfo


def _store_id(connection: Connection, root: str, store: StoreId) -> int:
    found = store_ids(connection, WRITE_LOOKUPS, root, [store])
    if store not in found:
        raise CatalogError(f"the catalog has no store {root}#{store}", store=store)
    return found[store]


def record_verifications(
    connection: Connection, root: str, results: Mapping[str, str | None], now: datetime
) -> None:
    """Record each file's verification: intact (None) or the problem found."""
    v = WRITE_LOOKUPS.files.c
    rows = files_at(connection, WRITE_LOOKUPS, root, results, v.file_id, v.store_id, v.path)
    unknown = sorted(set(results) - {row.path for row in rows})
    if unknown:
        raise CatalogError(
            f"cannot record the verification of untracked file(s) {unknown[:5]}", path=unknown[0]
        )
    lock_stores(connection, {row.store_id for row in rows})
    by_note: dict[str | None, list[int]] = {}
    for row in rows:
        by_note.setdefault(results[row.path], []).append(row.file_id)
    for note, file_ids in by_note.items():
        mark_verified(connection, file_ids, note, now)


@functools.cache
def _verification_statement(dialect: str) -> Any:
    """:func:`mark_verified`'s statement, built once a dialect."""
    f = checkpoint_files.c
    return (
        sa.update(checkpoint_files)
        .where(among(dialect, f.file_id, "files"))
        .values(
            verification=sa.bindparam("verification"),
            verified_at=sa.bindparam("now"),
            verification_note=sa.bindparam("note"),
        )
    )


def mark_verified(
    connection: Connection, file_ids: Sequence[int], note: str | None, now: datetime
) -> None:
    """Record the verification of the files ``file_ids`` (stores locked by the caller):
    intact (``note`` None) or the problem found."""
    state = Verification.VERIFIED if note is None else Verification.FAILED
    statement = _verification_statement(connection.dialect.name)
    for some in chunks(file_ids):
        connection.execute(
            statement,
            {"files": list(some), "verification": state.value, "now": now, "note": note},
        )


def unconfirmed_snapshot_verdicts(
    connection: Connection,
    views: ReaderViews,
    policy: RetentionPolicy,
    root: str | None,
    now: datetime,
) -> list[FileVerdict]:
    """The verdicts of ``root``'s (None: every root's) committed snapshots that are not
    verified (never checked, or failed), judged in the stores that have one: one indexed
    query when every snapshot is verified, instead of judging every file of the root."""
    f, s = views.files.c, views.stores.c
    ids = connection.execute(
        sa.select(f.store_id)
        .distinct()
        .join(views.stores, s.store_id == f.store_id)
        .where(
            sa.true() if root is None else s.checkpoint_root == root,
            f.kind == constant(FileKind.SNAPSHOT),
            f.state == constant(FileState.COMMITTED),
            f.verification != constant(Verification.VERIFIED),
        )
        .order_by(f.store_id)
    ).scalars()
    found: list[FileVerdict] = []
    for part in chunks(list(ids)):
        scope = Scope(root=root, store_ids=tuple(part), dialect=connection.dialect.name)
        found += file_verdicts(connection, views, policy, scope, now)
    return [v for v in found if v.file.kind is FileKind.SNAPSHOT]


def _open_rows(connection: Connection, store_ids: Collection[int]) -> dict[int, list[AnyRow]]:
    """The open problems of each store (a few statements whatever their number)."""
    p = store_problems.c
    found: dict[int, list[AnyRow]] = {}
    for part in chunks(sorted(set(store_ids))):
        for row in connection.execute(
            sa.select(p.problem_id, p.store_id, p.path, p.problem, p.detected_at).where(
                p.store_id.in_(part), p.resolved_at.is_(None)
            )
        ):
            found.setdefault(row.store_id, []).append(row)
    return found


def _new_problem_rows(
    store_id: int,
    found: Sequence[FoundProblem],
    open_rows: Sequence[AnyRow],
    run_id: int | None,
    now: datetime,
) -> list[dict[str, object]]:
    """The rows that open the problems of ``found`` not among ``open_rows`` (once each)."""
    known = {(row.path, row.problem) for row in open_rows}
    fresh = {(f.path, f.problem): f for f in found if (f.path, f.problem) not in known}
    return [
        {
            "store_id": store_id,
            "path": f.path,
            "version": f.version,
            "problem": f.problem,
            "run_id": run_id,
            "detected_at": now,
        }
        for f in fresh.values()
    ]


def add_problems(
    connection: Connection,
    root: str,
    store: StoreId,
    found: Sequence[FoundProblem],
    run_id: int | None,
    now: datetime,
) -> int:
    """Open the problems in ``found`` that are not open yet; returns how many were opened."""
    store_id = _store_id(connection, root, store)
    lock_stores(connection, [store_id])
    open_rows = _open_rows(connection, [store_id]).get(store_id, [])
    fresh = _new_problem_rows(store_id, found, open_rows, run_id, now)
    if fresh:
        connection.execute(sa.insert(store_problems), fresh)
    return len(fresh)


def _resolve(
    connection: Connection,
    problem_ids: Sequence[int],
    resolution: str,
    run_id: int | None,
    now: datetime,
) -> int:
    if not resolution:
        raise InvalidArgument("say how the problem was resolved")
    p = store_problems.c
    for some in chunks(list(problem_ids)):
        connection.execute(
            sa.update(store_problems)
            .where(p.problem_id.in_(some))
            .values(resolved_at=now, resolved_by_run=run_id, resolution=resolution)
        )
    return len(problem_ids)


def close_unneeded(
    connection: Connection, committed: Mapping[int, int], resolution: str, now: datetime
) -> int:
    """Resolve the open problems of the stores in ``committed`` (store id: the version a
    commit just committed) about a file at that version whose checkpoint no commit of the
    store at or above its version holds any more (a replay replaced it, or another attempt
    wrote it): no retained version reads that file, so its loss or damage breaks nothing.
    Sets only ``resolved_at`` and ``resolution``, all the runtime role may set (and only
    this transition: ``grants.GUARD_SQL`` holds it to the same rule). Returns how many."""
    p, f, c = store_problems.c, checkpoint_files.c, commit_log.c
    held = sa.exists().where(
        c.store_id == f.store_id, c.version >= f.version, c.checkpoint_id == f.checkpoint_id
    )
    stale: list[int] = []
    for part in chunks(sorted(committed)):
        rows = connection.execute(
            sa.select(p.problem_id, p.store_id, f.version)
            .join(checkpoint_files, sa.and_(f.store_id == p.store_id, f.path == p.path))
            .where(p.store_id.in_(part), p.resolved_at.is_(None), ~held)
        )
        stale += [r.problem_id for r in rows if committed[r.store_id] == r.version]
    for some in chunks(stale):
        connection.execute(
            sa.update(store_problems)
            .where(p.problem_id.in_(some))
            .values(resolved_at=now, resolution=resolution)
        )
    return len(stale)


def record_validations(
    connection: Connection,
    root: str,
    validated: Sequence[Validated],
    run_id: int | None,
    now: datetime,
) -> None:
    """Record the validations of several stores of ``root``, in a few statements whatever
    their number: each checked file's verification, and each store's open problems become
    its ``found``: problems open when its validation started (``open_before``) that it no
    longer finds are resolved by this run (a store with none left is no longer held); a problem
    recorded meanwhile (by a snapshot pass) stays open for the next validation to judge."""
    ids = store_ids(connection, WRITE_LOOKUPS, root, [v.key.store for v in validated])
    unknown = [v.key.store for v in validated if v.key.store not in ids]
    if unknown:
        raise CatalogError(f"the catalog has no store {root}#{unknown[0]}", store=unknown[0])
    lock_stores(connection, ids.values())
    checked = {path: note for v in validated for path, note in v.checked.items()}
    if checked:
        record_verifications(connection, root, checked, now)
    open_rows = _open_rows(connection, ids.values())
    gone: list[int] = []
    fresh: list[dict[str, object]] = []
    for v in validated:
        store_id = ids[v.key.store]
        rows = open_rows.get(store_id, [])
        wanted = {(f.path, f.problem) for f in v.found}
        gone += [
            row.problem_id
            for row in rows
            if (row.path, row.problem) not in wanted
            and (v.open_before is None or row.problem_id in v.open_before)
        ]
        fresh += _new_problem_rows(store_id, v.found, rows, run_id, now)
    if gone:
        by = "a validation" if run_id is None else f"validation run {run_id}"
        _resolve(connection, gone, f"no longer found by {by}", run_id, now)
    if fresh:
        connection.execute(sa.insert(store_problems), fresh)
    s = stores.c
    for part in chunks(sorted(set(ids.values()))):
        connection.execute(
            sa.update(stores)
            .where(s.store_id.in_(part))
            .values(
                last_validated_at=now,
                first_validated_at=sa.func.coalesce(s.first_validated_at, now),
            )
        )


def resolve_problems(
    connection: Connection,
    root: str,
    store: StoreId,
    resolution: str,
    run_id: int | None,
    now: datetime,
    *,
    path: str | None = None,
) -> int:
    """Resolve the store's open problems (only those about ``path``, if given)."""
    if not resolution:
        raise InvalidArgument("say how the problems were resolved")
    store_id = _store_id(connection, root, store)
    lock_stores(connection, [store_id])
    ids = [
        row.problem_id
        for row in _open_rows(connection, [store_id]).get(store_id, [])
        if path is None or row.path == path
    ]
    return _resolve(connection, ids, resolution, run_id, now) if ids else 0


def problem_census(connection: Connection, views: ReaderViews) -> tuple[int, int]:
    """How many problems are open, and how many were ever recorded (0, 0 when none): a
    problem found adds to the second, one resolved takes from the first, so any change moves
    the pair, whatever order concurrent transactions commit their ids in; read without
    listing them."""
    p = views.problems.c
    still_open = sa.func.coalesce(sa.func.sum(sa.case((p.resolved_at.is_(None), 1), else_=0)), 0)
    count, recorded = connection.execute(sa.select(still_open, sa.func.count())).one()
    return int(count), int(recorded)


def problems(
    connection: Connection,
    views: ReaderViews,
    root: str | None,
    store: StoreId | None,
    *,
    only_open: bool = True,
) -> list[StoreProblem]:
    """Store problems (open ones by default), oldest first."""
    s, p = views.stores.c, views.problems.c
    query = (
        sa.select(
            *store_key_columns(views.stores),
            p.problem_id,
            p.problem,
            p.path,
            p.version,
            p.run_id,
            p.detected_at,
            p.resolved_at,
            p.resolution,
        )
        .join(views.stores, s.store_id == p.store_id)
        .order_by(p.detected_at, p.problem_id)
    )
    if only_open:
        query = query.where(p.resolved_at.is_(None))
    if root is not None:
        query = query.where(s.checkpoint_root == root)
    if store is not None:
        query = query.where(is_store(store, views.stores))
    return [
        StoreProblem(
            problem_id=row.problem_id,
            key=key_of(row),
            problem=row.problem,
            path=row.path,
            version=row.version,
            run_id=row.run_id,
            detected_at=row.detected_at,
            resolved_at=row.resolved_at,
            resolution=row.resolution,
        )
        for row in connection.execute(query)
    ]


def begin_repair(
    connection: Connection,
    run_id: int,
    root: str,
    path: str,
    problem: str,
    damaged: bytes | None,
    now: datetime,
) -> int:
    """Record a damaged snapshot about to be replaced (its size and SHA-256 as found, None if
    it is gone, and the record it had) before anything is removed; returns the repair id. An
    unfinished repair of the same file (a run that stopped) is resumed, keeping what it
    recorded about the damaged copy."""
    v = WRITE_LOOKUPS.files.c
    rows = files_at(
        connection, WRITE_LOOKUPS, root, [path], v.file_id, v.store_id, v.checksum, v.size_bytes
    )
    if not rows:
        raise CatalogError(f"cannot repair untracked file {path}", path=path)
    (row,) = rows
    lock_stores(connection, [row.store_id])
    r = file_repairs.c
    unfinished = connection.execute(
        sa.select(r.repair_id).where(r.file_id == row.file_id, r.finished_at.is_(None))
    ).scalar()
    if unfinished is not None:  # an interrupted repair of this file: resume it
        return int(unfinished)
    inserted = connection.execute(
        sa.insert(file_repairs)
        .values(
            file_id=row.file_id,
            run_id=run_id,
            problem=problem,
            damaged_size=None if damaged is None else len(damaged),
            damaged_sha256=None if damaged is None else hashlib.sha256(damaged).hexdigest(),
            old_checksum=row.checksum,
            old_size=row.size_bytes,
            started_at=now,
        )
        .returning(file_repairs.c.repair_id)
    )
    return int(inserted.scalar_one())


def repair_removed(connection: Connection, repair_id: int, now: datetime) -> None:
    """Note that the damaged copy is gone from storage."""
    connection.execute(
        sa.update(file_repairs).where(file_repairs.c.repair_id == repair_id).values(removed_at=now)
    )


def finish_repair(
    connection: Connection, repair_id: int, root: str, info: CheckpointInfo, now: datetime
) -> None:
    """The rebuilt snapshot is on storage and verified: its record takes the new file's size,
    checksum and time, it counts as verified, and the problems about it are resolved."""
    r = file_repairs.c
    repair = connection.execute(
        sa.select(r.file_id, r.run_id).where(r.repair_id == repair_id)
    ).one()
    f = checkpoint_files.c
    store_id = connection.execute(
        sa.select(f.store_id).where(f.file_id == repair.file_id)
    ).scalar_one()
    lock_stores(connection, [store_id])
    connection.execute(
        sa.update(checkpoint_files)
        .where(f.file_id == repair.file_id)
        .values(
            size_bytes=info.bytes_written,
            checksum=info.checksum,
            rows=info.rows,
            file_rows=info.file_rows,
            created_at=info.created_at,
            recorded_at=now,  # new bytes: their age starts again, as for a new file
            verification=Verification.VERIFIED.value,
            verified_at=now,
            verification_note=None,
        )
    )
    connection.execute(
        sa.update(file_repairs).where(r.repair_id == repair_id).values(finished_at=now)
    )
    p = store_problems.c
    open_ids = [
        row.problem_id
        for row in connection.execute(
            sa.select(p.problem_id).where(
                p.store_id == store_id, p.path == info.path, p.resolved_at.is_(None)
            )
        )
    ]
    if open_ids:
        _resolve(
            connection,
            open_ids,
            f"repaired by run {repair.run_id}: rebuilt from its deltas and verified",
            repair.run_id,
            now,
        )


def repairs(connection: Connection, views: ReaderViews, root: str | None) -> list[Repair]:
    """Every repair, newest first."""
    s, f, r = views.stores.c, views.files.c, views.repairs.c
    query = (
        sa.select(
            *store_key_columns(views.stores),
            f.path,
            r.run_id,
            r.problem,
            r.damaged_size,
            r.damaged_sha256,
            r.old_checksum,
            r.old_size,
            r.started_at,
            r.removed_at,
            r.finished_at,
        )
        .join(views.files, f.file_id == r.file_id)
        .join(views.stores, s.store_id == f.store_id)
        .order_by(r.repair_id.desc())
    )
    if root is not None:
        query = query.where(s.checkpoint_root == root)
    return [
        Repair(
            key=key_of(row),
            path=row.path,
            run_id=row.run_id,
            problem=row.problem,
            damaged_size=row.damaged_size,
            damaged_sha256=row.damaged_sha256,
            old_checksum=row.old_checksum,
            old_size=row.old_size,
            started_at=row.started_at,
            removed_at=row.removed_at,
            finished_at=row.finished_at,
        )
        for row in connection.execute(query)
    ]


def record_snapshots(
    connection: Connection,
    root: str,
    checked: Sequence[tuple[CheckpointInfo, str | None]],
    run_id: int | None,
    verified: bool,
    now: datetime,
) -> list[str | None]:
    """Record snapshots maintenance wrote (of distinct paths) and what verifying each found:
    verified, or the problem (a snapshot whose record says other bytes is damaged, its record
    kept). A few statements for all of them (the files looked up, recorded and their
    verifications written together). Returns the problem recorded for each, in order."""
    v = WRITE_LOOKUPS.files.c
    paths = [info.path for info, _ in checked]
    recorded = {
        row.located_path: row
        for row in files_at(
            connection, WRITE_LOOKUPS, root, paths, v.checksum, v.size_bytes, v.state
        )
    }
    found: list[str | None] = []
    fresh: list[CheckpointInfo] = []
    for info, problem in checked:
        row = recorded.get(info.path)
        if (
            row is not None
            and row.state != FileState.DELETED.value
            and (row.checksum, row.size_bytes) != (info.checksum, info.bytes_written)
        ):
            problem = problem or (
                f"the file ({info.bytes_written} bytes) differs from its record "
                f"({row.size_bytes} bytes, another checksum)"
            )
        else:
            fresh.append(info)  # a deleted file's record is replaced: written there anew
        found.append(problem)
    if fresh:
        record_files(connection, root, fresh, now, run_id=run_id, rewritten=True)
    results = {
        info.path: problem
        for (info, _), problem in zip(checked, found, strict=True)
        if verified or problem is not None
    }
    if results:
        record_verifications(connection, root, results, now)
    for (info, _), problem in zip(checked, found, strict=True):
        if problem is not None:
            add_problems(
                connection,
                root,
                info.store,
                [FoundProblem(problem, info.path, info.version)],
                run_id,
                now,
            )
    return found
