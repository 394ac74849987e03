"""Store-level answers for maintenance and dashboards: snapshot candidates, health and the
estimated recovery cost of each store."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import (
    RecoveryCost,
    SnapshotCandidate,
    StoreHealth,
    StoreKey,
    problem_text,
)
from state_runtime.catalog.schema.reading_views import (
    read_commits,
    read_files,
    read_problems,
    read_runs,
    read_stores,
)
from state_runtime.catalog.schema.tables import FileState, RunKind, Verification
from state_runtime.catalog.sql.retention import Scope, needed_files, verdicts
from state_runtime.catalog.sql.rows import READ_STORE_KEY_COLUMNS, key_of
from state_runtime.catalog.sql.statements import chunks
from state_runtime.identity import EMPTY, CheckpointRef, FileKind
from state_runtime.retention import RetentionPolicy


def _last_snapshots(scope: Scope) -> sa.Subquery:
    """Per store, the newest verified committed snapshot's version (an unverified snapshot
    replaces nothing yet).

    A snapshot is committed when the commit log names its (version, id); each store's
    committed versions form one linear chain, so that snapshot lies on the latest version's
    lineage.
    """
    f = read_files.c
    return (
        sa.select(
            f.store_id,
            sa.func.max(f.version).label("snapshot_version"),
            sa.func.max(f.created_at).label("snapshot_at"),
        )
        .where(
            f.kind == FileKind.SNAPSHOT.value,
            f.state == FileState.COMMITTED.value,
            f.verification == Verification.VERIFIED.value,
            scope.filter(f.store_id),
        )
        .group_by(f.store_id)
        .subquery("last_snapshot")
    )


def _loadable_versions(scope: Scope) -> sa.Subquery:
    """Per store, how many committed versions still load from the files kept: version ``v``
    loads when no committed delta at or below it is gone, or a verified committed snapshot
    lies between the newest gone one and ``v`` (the loader's walk, counted in SQL)."""
    c, f = read_commits.c, read_files.c
    live = [state.value for state in (FileState.WRITTEN, FileState.COMMITTED, FileState.ORPHAN)]
    gone = sa.case((f.state.not_in(live), c.version), else_=0)
    steps = (
        sa.select(
            c.store_id,
            c.version,
            sa.func.max(gone)
            .over(partition_by=c.store_id, order_by=c.version, rows=(None, 0))
            .label("gone_below"),
        )
        .outerjoin(read_files, f.file_id == c.file_id)  # none: changed nothing, loads as its parent
        .where(scope.filter(c.store_id))
        .subquery("steps")
    )
    snap = read_files.alias("base")
    bridged = (
        sa.select(snap.c.file_id)
        .where(
            snap.c.store_id == steps.c.store_id,
            snap.c.version >= steps.c.gone_below,
            snap.c.version <= steps.c.version,
            snap.c.kind == FileKind.SNAPSHOT.value,
            snap.c.state == FileState.COMMITTED.value,
            snap.c.verification == Verification.VERIFIED.value,
        )
        .exists()
    )
    return (
        sa.select(steps.c.store_id, sa.func.count().label("versions"))
        .where(sa.or_(steps.c.gone_below == 0, bridged))
        .group_by(steps.c.store_id)
        .subquery("loadable")
    )


def snapshot_candidates_query(min_deltas: int, root: str | None) -> sa.Select[Any]:
    """Stores with at least ``min_deltas`` committed deltas since their last snapshot,
    longest chains first."""
    s = read_stores.c
    snap = _last_snapshots(Scope(root=root))
    since = sa.func.coalesce(snap.c.snapshot_version, 0)
    deltas = (s.latest_version - since).label("deltas")
    query = (
        sa.select(
            s.checkpoint_root,
            s.operator_id,
            s.partition_id,
            s.store_name,
            s.latest_version,
            s.latest_checkpoint_id,
            since.label("snapshot_version"),
            deltas,
        )
        .outerjoin(snap, snap.c.store_id == s.store_id)
        .where(s.latest_version > 0, s.latest_version - since >= min_deltas)
        .order_by(deltas.desc(), s.store_id)
    )
    return query if root is None else query.where(s.checkpoint_root == root)


def snapshot_candidates(
    connection: Connection, min_deltas: int, root: str | None
) -> list[SnapshotCandidate]:
    return [
        SnapshotCandidate(
            key=key_of(r),
            latest=CheckpointRef(r.latest_version, r.latest_checkpoint_id),
            last_snapshot_version=r.snapshot_version,
            deltas_since_snapshot=r.deltas,
        )
        for r in connection.execute(snapshot_candidates_query(min_deltas, root))
    ]


def store_health(
    connection: Connection, policy: RetentionPolicy, root: str | None, now: datetime
) -> list[StoreHealth]:
    """Each store's figures; ``reclaimable_*`` are what cleanup under ``policy`` frees now."""
    s, f, c, r = read_stores.c, read_files.c, read_commits.c, read_runs.c
    scope = Scope(root=root)
    live = [state.value for state in (FileState.WRITTEN, FileState.COMMITTED, FileState.ORPHAN)]
    files = (
        sa.select(
            f.store_id,
            sa.func.count().label("live_files"),
            sa.func.sum(f.size_bytes).label("live_bytes"),
            sa.func.sum(sa.case((f.state == FileState.ORPHAN.value, 1), else_=0)).label(
                "orphan_files"
            ),
            sa.func.sum(sa.case((f.state == FileState.ORPHAN.value, f.size_bytes), else_=0)).label(
                "orphan_bytes"
            ),
            sa.func.min(
                sa.case((f.state == FileState.ORPHAN.value, f.state_changed_at), else_=None)
            ).label("oldest_orphan_at"),
        )
        .where(f.state.in_(live), scope.filter(f.store_id))
        .group_by(f.store_id)
        .subquery("files")
    )
    deletable = verdicts(policy, scope, now, only_deletable=True).subquery("deletable")
    reclaim = (
        sa.select(
            deletable.c.store_id,
            sa.func.count().label("files"),
            sa.func.sum(deletable.c.size_bytes).label("bytes"),
        )
        .group_by(deletable.c.store_id)
        .subquery("reclaim")
    )
    snap = _last_snapshots(scope)
    loadable = _loadable_versions(scope)
    newest = (
        sa.select(s.checkpoint_root, sa.func.max(s.latest_version).label("newest"))
        .group_by(s.checkpoint_root)
        .subquery("newest")
    )
    latest_file = read_files.alias("latest_file")
    chain = read_commits.alias("chain")
    problems = _problems(scope)
    query = (
        sa.select(
            s.store_id,
            s.checkpoint_root,
            s.operator_id,
            s.partition_id,
            s.store_name,
            s.latest_version,
            s.latest_checkpoint_id,
            s.last_committed_at,
            newest.c.newest,
            sa.func.coalesce(snap.c.snapshot_version, 0).label("snapshot_version"),
            snap.c.snapshot_at,
            sa.func.coalesce(loadable.c.versions, 0).label("versions_loadable"),
            sa.func.coalesce(latest_file.c.rows, 0).label("state_rows"),
            sa.func.coalesce(files.c.live_files, 0).label("live_files"),
            sa.func.coalesce(files.c.live_bytes, 0).label("live_bytes"),
            sa.func.coalesce(files.c.orphan_files, 0).label("orphan_files"),
            sa.func.coalesce(files.c.orphan_bytes, 0).label("orphan_bytes"),
            sa.func.coalesce(reclaim.c.files, 0).label("reclaimable_files"),
            sa.func.coalesce(reclaim.c.bytes, 0).label("reclaimable_bytes"),
            s.last_run_id,
            r.kind.label("run_kind"),
            r.outcome.label("run_outcome"),
            r.ended_at.label("run_ended_at"),
            s.created_at,
            sa.func.coalesce(problems.c.open_problems, 0).label("open_problems"),
            problems.c.problems_since,
            problems.c.last_resolved_at,
            problems.c.last_restored_at,
            s.first_validated_at,
            s.last_validated_at,
            chain.c.committed_at.label("chain_since"),
            files.c.oldest_orphan_at,
        )
        .select_from(read_stores)
        .join(newest, newest.c.checkpoint_root == s.checkpoint_root)
        .outerjoin(snap, snap.c.store_id == s.store_id)
        .outerjoin(loadable, loadable.c.store_id == s.store_id)
        .outerjoin(read_commits, sa.and_(c.store_id == s.store_id, c.version == s.latest_version))
        .outerjoin(latest_file, latest_file.c.file_id == c.file_id)
        .outerjoin(files, files.c.store_id == s.store_id)
        .outerjoin(reclaim, reclaim.c.store_id == s.store_id)
        .outerjoin(read_runs, r.run_id == s.last_run_id)
        .outerjoin(
            chain,
            sa.and_(
                chain.c.store_id == s.store_id,
                chain.c.version == sa.func.coalesce(snap.c.snapshot_version, 0) + 1,
            ),
        )
        .outerjoin(problems, problems.c.store_id == s.store_id)
        .where(scope.filter(s.store_id))
        .order_by(*READ_STORE_KEY_COLUMNS)
    )
    rows = connection.execute(query).all()
    first = _first_problems(connection, [row.store_id for row in rows if row.open_problems])
    return [_health(row, now, first.get(row.store_id)) for row in rows]


def _problems(scope: Scope) -> sa.Subquery:
    """Per store: open problems, since when, and when a problem was last resolved (by anything,
    and by a restore: a restore is not a validation)."""
    p = read_problems.c
    is_open = p.resolved_at.is_(None)
    restores = sa.select(read_runs.c.run_id).where(read_runs.c.kind == RunKind.RESTORE.value)
    by_restore = p.resolved_by_run.in_(restores.scalar_subquery())
    return (
        sa.select(
            p.store_id,
            sa.func.sum(sa.case((is_open, 1), else_=0)).label("open_problems"),
            sa.func.min(sa.case((is_open, p.detected_at), else_=None)).label("problems_since"),
            sa.func.max(p.resolved_at).label("last_resolved_at"),
            sa.func.max(sa.case((by_restore, p.resolved_at), else_=None)).label("last_restored_at"),
        )
        .where(scope.filter(p.store_id))
        .group_by(p.store_id)
        .subquery("problems")
    )


def _first_problems(connection: Connection, ids: list[int]) -> dict[int, str]:
    """The oldest open problem of each store in ``ids``, naming its file."""
    p = read_problems.c
    first: dict[int, str] = {}
    for part in chunks(sorted(ids)):
        rows = connection.execute(
            sa.select(p.store_id, p.problem, p.path)
            .where(p.store_id.in_(part), p.resolved_at.is_(None))
            .order_by(p.store_id, p.detected_at, p.problem_id)
        )
        for row in rows:
            first.setdefault(row.store_id, problem_text(row.problem, row.path))
    return first


def _health(row: Any, now: datetime, first_problem: str | None) -> StoreHealth:
    latest = (
        CheckpointRef(row.latest_version, row.latest_checkpoint_id) if row.latest_version else EMPTY
    )
    return StoreHealth(
        key=key_of(row),
        latest=latest,
        last_committed_at=row.last_committed_at,
        commit_lag=None if row.last_committed_at is None else now - row.last_committed_at,
        versions_behind=row.newest - row.latest_version,
        last_snapshot_version=row.snapshot_version,
        last_snapshot_at=row.snapshot_at,
        versions_loadable=row.versions_loadable,
        deltas_since_snapshot=row.latest_version - row.snapshot_version,
        state_rows=row.state_rows,
        live_files=row.live_files,
        live_bytes=int(row.live_bytes),
        orphan_files=int(row.orphan_files),
        orphan_bytes=int(row.orphan_bytes),
        reclaimable_files=row.reclaimable_files,
        reclaimable_bytes=int(row.reclaimable_bytes),
        last_run_id=row.last_run_id,
        last_run_kind=row.run_kind,
        last_run_outcome=row.run_outcome,
        last_run_ended_at=row.run_ended_at,
        created_at=row.created_at,
        open_problems=int(row.open_problems),
        first_problem=first_problem,
        problems_since=row.problems_since,
        last_resolved_at=row.last_resolved_at,
        last_restored_at=row.last_restored_at,
        first_validated_at=row.first_validated_at,
        last_validated_at=row.last_validated_at,
        chain_since=row.chain_since,
        oldest_orphan_at=row.oldest_orphan_at,
    )


def recovery_costs(connection: Connection, root: str | None) -> dict[StoreKey, RecoveryCost]:
    """Per store (of ``root``, or all), the files and bytes loading its latest committed
    version reads: the "files needed by the retained versions" walk, newest version only."""
    nf = needed_files(1, Scope(root=root)).subquery("nf")
    f = read_files.c
    query = (
        sa.select(
            *READ_STORE_KEY_COLUMNS,
            sa.func.count().label("files"),
            sa.func.sum(f.size_bytes).label("bytes"),
        )
        .select_from(nf)
        .join(read_files, f.file_id == nf.c.file_id)
        .join(read_stores, read_stores.c.store_id == nf.c.store_id)
        .group_by(*READ_STORE_KEY_COLUMNS)
    )
    return {key_of(r): RecoveryCost(int(r.files), int(r.bytes)) for r in connection.execute(query)}
