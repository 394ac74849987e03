"""The claims-and-deletion ledger: cleanup claims the deletable files, records each deletion
(or loss) with its reason, and the ledger answers what went when and why."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import DeletableCount, Deletion, FileVerdict
from state_runtime.catalog.schema.predicates import constant, is_verified_snapshot_by_commit_log
from state_runtime.catalog.schema.reading_views import WRITE_LOOKUPS, ReaderViews
from state_runtime.catalog.schema.tables import (
    FileState,
    checkpoint_files,
    deletion_ledger,
    stores,
)
from state_runtime.catalog.sql.lookups import files_at, lock_stores, mark_maintained, store_ids
from state_runtime.catalog.sql.retention import verdict_query, verdict_rows
from state_runtime.catalog.sql.rows import FILE_COLUMNS, AnyRow, file_record, key_of
from state_runtime.catalog.sql.scope import Scope
from state_runtime.catalog.sql.statements import CHUNK, among, chunks
from state_runtime.errors import CatalogError, InvalidArgument
from state_runtime.identity import FileKind, StoreId
from state_runtime.retention import RetentionPolicy, Verdict


def claim_deletions(
    connection: Connection,
    run_id: int,
    policy: RetentionPolicy,
    root: str,
    wanted: Sequence[StoreId] | None,
    now: datetime,
    limit: int | None = None,
    from_version: int | None = None,
) -> list[FileVerdict]:
    """Lock the stores and claim for ``run_id`` their files: first (at most ``limit``; every
    one when None) the files another run had claimed and not recorded as deleted (an
    interrupted run's), which come back with the verdict ``deleting``; then, with their own
    room of ``limit``, deletable ones, oldest versions first, marked 'deleting'. The limit is
    the SQL's (``LIMIT``), so a store with millions of deletable files is worked through in
    bounded claims: claim, delete, record, again until fewer than ``limit`` new files (a
    deletable verdict) come back. A file this run already claimed is never claimed again by
    it: one that storage refused to delete waits for the next run, and never takes the room
    of new ones (files that can never be deleted would otherwise stop the store's cleanup).
    ``from_version`` pages claims by keyset: the new files come from that version up (the
    last version the previous claim took: the live files below it were all claimed), so a
    claim reads the live index from there, not again from the store's oldest version.

    Once claimed a file is never needed again, because a commit refuses to name a claimed
    file. The caller deletes the files from storage, then calls ``record_deletions``. A
    commit waiting on the same store lock sees the claims, so cleanup never deletes a file a
    concurrent commit references; a validation that opens a problem on the store waits too,
    so a held store is never claimed.
    """
    s, f = stores.c, checkpoint_files.c
    dialect = connection.dialect.name
    if wanted is None:
        ids = sorted(
            connection.execute(sa.select(s.store_id).where(s.checkpoint_root == root)).scalars()
        )
    else:
        ids = sorted(store_ids(connection, WRITE_LOOKUPS, root, wanted).values())
    if from_version is not None and len(ids) > CHUNK:
        # the stores are claimed a chunk at a time: one version cannot say where each stands
        raise InvalidArgument(f"a claim from a version is of at most {CHUNK} stores")
    claimed: list[FileVerdict] = []
    resumed_room = fresh_room = limit
    for part in chunks(ids):
        if resumed_room == 0 and fresh_room == 0:
            break
        lock_stores(connection, part)
        mark_maintained(connection, part, run_id)
        earlier = (
            sa.select(*FILE_COLUMNS)
            .join(stores, s.store_id == f.store_id)
            .where(
                f.state == constant(FileState.DELETING),
                f.claimed_by_run != run_id,
                among(dialect, f.store_id, part),
            )
            .order_by(f.store_id, f.version, f.file_id)
            .limit(resumed_room)
        )
        resumed = connection.execute(earlier).all() if resumed_room != 0 else []
        for some in chunks([row.file_id for row in resumed]):
            connection.execute(
                sa.update(checkpoint_files)
                .where(among(dialect, f.file_id, some))
                .values(claimed_by_run=run_id)
            )
        claimed += [
            FileVerdict(
                file_record(row), Verdict.DELETING, str(row.state_reason), None, row.file_id
            )
            for row in resumed
        ]
        if resumed_room is not None:
            resumed_room -= len(resumed)
        if fresh_room == 0:
            continue
        scope = Scope(store_ids=tuple(part), dialect=connection.dialect.name)
        fresh = verdict_rows(
            connection,
            WRITE_LOOKUPS,
            policy,
            scope,
            now,
            only_deletable=True,
            limit=fresh_room,
            from_version=from_version,
        )
        if fresh_room is not None:
            fresh_room -= len(fresh)
        _expire(connection, fresh)
        by_reason: dict[str, list[int]] = {}
        for fid, verdict in fresh:
            by_reason.setdefault(verdict.reason, []).append(fid)
        for why, file_ids in by_reason.items():
            for some in chunks(file_ids):
                connection.execute(
                    sa.update(checkpoint_files)
                    .where(among(dialect, f.file_id, some))
                    .values(
                        state=FileState.DELETING.value,
                        state_changed_at=now,
                        state_reason=why,
                        claimed_by_run=run_id,
                    )
                )
        claimed += [v for _, v in fresh]
    return claimed


def deletable_counts(
    connection: Connection,
    views: ReaderViews,
    policy: RetentionPolicy,
    scope: Scope,
    now: datetime,
) -> list[DeletableCount]:
    """The deletable files of each store in ``scope``, counted and summed by verdict in SQL:
    the plan's figures with a row per store and verdict, not per file."""
    query, values = verdict_query(
        views, policy, scope, now, dialect=connection.dialect.name, only_deletable=True
    )
    v = query.order_by(None).subquery("deletable")
    keys = (v.c.checkpoint_root, v.c.operator_id, v.c.partition_id, v.c.store_name)
    rows = connection.execute(
        sa.select(
            *keys,
            v.c.verdict,
            sa.func.count().label("files"),
            sa.func.sum(v.c.size_bytes).label("size_bytes"),
        )
        .group_by(v.c.store_id, *keys, v.c.verdict)
        .order_by(v.c.store_id, v.c.verdict),
        values,
    )
    return [
        DeletableCount(key_of(row), Verdict(row.verdict), int(row.files), int(row.size_bytes))
        for row in rows
    ]


def _expire(connection: Connection, claims: Sequence[tuple[int, FileVerdict]]) -> None:
    """The versions that loaded through a committed file claimed here (no retained version
    needs it) expire, and with them every older one, so that the expired versions stay a
    prefix (``stores.expired_through``): none counts as retained again
    (state_runtime/retention.py). A delta at ``d`` loads the versions from ``d`` up to the
    next verified snapshot at or above it (none, when a snapshot at ``d`` replaced it); a
    snapshot, those up to the next one above it. A later snapshot always exists: without one,
    the latest version, always retained, would load through the file."""
    committed = {fid: v.file for fid, v in claims if v.file.state == FileState.COMMITTED}
    if not committed:  # orphans only: no version loaded through them
        return
    f, s = checkpoint_files.c, stores.c
    store_of: dict[int, int] = {}
    for some in chunks(sorted(committed)):
        found = sa.select(f.file_id, f.store_id).where(
            among(connection.dialect.name, f.file_id, some)
        )
        rows = connection.execute(found)
        store_of.update({int(fid): int(store_id) for fid, store_id in rows})
    snapshots = verified_snapshot_versions(
        connection, WRITE_LOOKUPS, sorted(set(store_of.values()))
    )
    through: dict[int, int] = {}
    for fid, record in committed.items():
        store_id = store_of[fid]
        first = record.version + (record.kind is FileKind.SNAPSHOT)
        above = [v for v in snapshots.get(store_id, []) if v >= first]
        if above and above[0] > record.version:
            through[store_id] = max(through.get(store_id, 0), above[0] - 1)
    if through:  # one statement for the claim's stores
        version = sa.case(through, value=s.store_id)
        connection.execute(
            sa.update(stores)
            .where(s.store_id.in_(sorted(through)), s.expired_through < version)
            .values(expired_through=version)
        )


def record_deletions(
    connection: Connection, run_id: int, root: str, paths: Sequence[str], now: datetime
) -> int:
    """Mark claimed files deleted and write their ledger entries (reason: the claim's).

    Paths already recorded as deleted are skipped, so a resumed run may report them again.
    Returns the number of files newly recorded. A path that is not claimed for deletion is
    an error: only claimed files may be deleted.
    """
    v = WRITE_LOOKUPS.files.c
    rows = files_at(connection, WRITE_LOOKUPS, root, paths, v.file_id, v.store_id, v.path, v.state)
    unknown = sorted(set(paths) - {row.path for row in rows})
    if unknown:
        raise CatalogError(
            f"cannot record deletion of untracked file(s) {unknown[:5]}", path=unknown[0]
        )
    return _record(connection, run_id, rows, now)


def record_deletions_by_id(
    connection: Connection, run_id: int, root: str, file_ids: Sequence[int], now: datetime
) -> int:
    """:func:`record_deletions` of the files a claim returned, named by their catalog ids
    (``FileVerdict.file_id``): one indexed read of the ids, not a lookup of each path's store
    and version. An id that is not a file of ``root`` is an error, as an untracked path is."""
    f, s = checkpoint_files.c, stores.c
    rows: list[AnyRow] = []
    for some in chunks(sorted(set(file_ids))):
        rows += connection.execute(
            sa.select(f.file_id, f.store_id, f.path, f.state)
            .join(stores, s.store_id == f.store_id)
            .where(among(connection.dialect.name, f.file_id, some), s.checkpoint_root == root)
        ).all()
    unknown = sorted(set(file_ids) - {row.file_id for row in rows})
    if unknown:
        raise CatalogError(f"cannot record deletion of file id(s) {unknown[:5]}: not of {root}")
    return _record(connection, run_id, rows, now)


def _record(connection: Connection, run_id: int, rows: Sequence[AnyRow], now: datetime) -> int:
    """Record the files of ``rows`` (file_id, store_id, path, state) deleted by ``run_id``:
    those still 'deleting', each once; one neither deleting nor deleted is an error."""
    pending = [row for row in rows if row.state != FileState.DELETED.value]
    wrong = [row.path for row in pending if row.state != FileState.DELETING.value]
    if wrong:
        raise CatalogError(
            f"file(s) {wrong[:5]} are not claimed for deletion; claim them with "
            "claim_deletions first",
            path=wrong[0],
        )
    if not pending:
        return 0
    lock_stores(connection, {row.store_id for row in pending})
    return sum(
        _record_chunk(connection, run_id, some, now)
        for some in chunks([row.file_id for row in pending])
    )


def _record_chunk(
    connection: Connection, run_id: int, file_ids: Sequence[int], now: datetime
) -> int:
    """Mark the files of ``file_ids`` still 'deleting' under the lock (another recorder, whose
    lease expired under it, may have recorded some since they were read) deleted, and write
    their ledger rows with the claim's reason; the number recorded. On PostgreSQL one
    statement: the ledger is filled from the rows the update returns (``WITH ... UPDATE ...
    RETURNING``), each file row read and written once; on SQLite an ``INSERT ... SELECT``,
    then the update."""
    f = checkpoint_files.c
    at = sa.literal(now, deletion_ledger.c.deleted_at.type)
    run = sa.literal(run_id, sa.BigInteger())
    columns = ["file_id", "run_id", "reason", "deleted_at"]
    still = sa.and_(
        among(connection.dialect.name, f.file_id, file_ids),
        f.state == constant(FileState.DELETING),
    )
    update = (
        sa.update(checkpoint_files)
        .where(still)
        .values(state=FileState.DELETED.value, state_changed_at=now)
    )
    if connection.dialect.name == "postgresql":
        done = update.returning(f.file_id, f.state_reason).cte("done")
        ledger = sa.select(done.c.file_id, run, done.c.state_reason, at)
        return connection.execute(sa.insert(deletion_ledger).from_select(columns, ledger)).rowcount
    ledger = sa.select(f.file_id, run, f.state_reason, at).where(still)
    connection.execute(sa.insert(deletion_ledger).from_select(columns, ledger))
    return connection.execute(update).rowcount


def record_lost(
    connection: Connection,
    run_id: int,
    root: str,
    paths: Sequence[str],
    reason: str,
    now: datetime,
) -> int:
    """Record tracked files that validation found missing or corrupt in storage as deleted,
    with ledger reason ``lost: <reason>``. The catalog then stops counting on them: a version
    whose snapshot is lost is loaded from the older snapshot and deltas again (seed 001,
    example 3), and cleanup keeps those. Returns the number of files newly recorded."""
    if not reason:
        raise InvalidArgument("say why the files are lost (missing, checksum mismatch, ...)")
    f, v = checkpoint_files.c, WRITE_LOOKUPS.files.c
    rows = files_at(connection, WRITE_LOOKUPS, root, paths, v.file_id, v.store_id, v.path, v.state)
    unknown = sorted(set(paths) - {row.path for row in rows})
    if unknown:
        raise CatalogError(
            f"cannot record untracked file(s) {unknown[:5]} as lost", path=unknown[0]
        )
    pending = [row for row in rows if row.state != FileState.DELETED.value]
    if not pending:
        return 0
    touched = {row.store_id for row in pending}
    lock_stores(connection, touched)
    mark_maintained(connection, touched, run_id)
    connection.execute(
        sa.insert(deletion_ledger),
        [
            {
                "file_id": row.file_id,
                "run_id": run_id,
                "reason": f"lost: {reason}",
                "deleted_at": now,
            }
            for row in pending
        ],
    )
    for some in chunks([row.file_id for row in pending]):
        connection.execute(
            sa.update(checkpoint_files)
            .where(f.file_id.in_(some))
            .values(
                state=FileState.DELETED.value, state_changed_at=now, state_reason=f"lost: {reason}"
            )
        )
    return len(pending)


def deletion_history(
    connection: Connection, views: ReaderViews, root: str | None, since: datetime | None, limit: int
) -> list[Deletion]:
    """Ledger entries, newest first."""
    s, f, d = views.stores.c, views.files.c, views.deletions.c
    query = (
        sa.select(
            s.checkpoint_root,
            s.operator_id,
            s.partition_id,
            s.store_name,
            f.path,
            f.size_bytes,
            d.run_id,
            d.reason,
            d.deleted_at,
        )
        .select_from(views.deletions)
        .join(views.files, f.file_id == d.file_id)
        .join(views.stores, s.store_id == f.store_id)
        .order_by(d.deleted_at.desc(), d.deletion_id.desc())
        .limit(limit)
    )
    if root is not None:
        query = query.where(s.checkpoint_root == root)
    if since is not None:
        query = query.where(d.deleted_at >= since)
    return [_deletion(row) for row in connection.execute(query)]


def _deletion(row: AnyRow) -> Deletion:
    return Deletion(
        key=key_of(row),
        path=row.path,
        size_bytes=row.size_bytes,
        run_id=row.run_id,
        reason=row.reason,
        deleted_at=row.deleted_at,
    )


def verified_snapshot_versions(
    connection: Connection, views: ReaderViews, store_ids: Sequence[int]
) -> dict[int, list[int]]:
    """Each store's versions with a snapshot a retained version may load from (the commit
    log names it), ascending."""
    f = views.files.c
    rows = connection.execute(
        sa.select(f.store_id, f.version)
        .where(
            among(connection.dialect.name, f.store_id, store_ids),
            is_verified_snapshot_by_commit_log(f, views.commits.alias("naming")),
        )
        .order_by(f.store_id, f.version)
    )
    versions: dict[int, list[int]] = {}
    for store_id, version in rows:
        versions.setdefault(int(store_id), []).append(int(version))
    return versions
