"""Store-level answers for maintenance and dashboards: snapshot candidates, health and the
estimated recovery cost of each store."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import RecoveryCost, SnapshotCandidate, StoreHealth, StoreKey
from state_runtime.catalog.schema.reading_views import read_files, read_stores
from state_runtime.catalog.sql.retention import PolicySql, Scope, needed_files
from state_runtime.catalog.sql.rows import READ_STORE_KEY_COLUMNS, key_of
from state_runtime.catalog.sql.store_facts import last_snapshots, store_facts
from state_runtime.identity import EMPTY, CheckpointRef
from state_runtime.retention import RetentionPolicy


def snapshot_candidates_query(min_deltas: int, root: str | None) -> sa.Select[Any]:
    """Stores with at least ``min_deltas`` committed deltas since their last snapshot,
    longest chains first."""
    s = read_stores.c
    snap = last_snapshots(Scope(root=root))
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
    """Each store's facts (:func:`~state_runtime.catalog.sql.store_facts.store_facts`);
    ``reclaimable_*`` are what cleanup under ``policy`` may delete at ``now``."""
    query = store_facts(PolicySql.of(policy, now), Scope(root=root))
    rows = connection.execute(query.order_by(*READ_STORE_KEY_COLUMNS)).all()
    return [_health(row, now) for row in rows]


def _health(row: Any, now: datetime) -> StoreHealth:
    latest = (
        CheckpointRef(row.latest_version, row.latest_checkpoint_id) if row.latest_version else EMPTY
    )
    return StoreHealth(
        key=key_of(row),
        latest=latest,
        last_committed_at=row.last_committed_at,
        commit_lag=None if row.last_committed_at is None else now - row.last_committed_at,
        versions_behind=row.versions_behind,
        last_snapshot_version=row.last_snapshot_version,
        last_snapshot_at=row.last_snapshot_at,
        versions_loadable=row.versions_loadable,
        deltas_since_snapshot=row.deltas_since_snapshot,
        state_rows=row.state_rows,
        live_files=row.live_files,
        live_bytes=int(row.live_bytes),
        orphan_files=int(row.orphan_files),
        orphan_bytes=int(row.orphan_bytes),
        reclaimable_files=row.reclaimable_files,
        reclaimable_bytes=int(row.reclaimable_bytes),
        last_run_id=row.last_run_id,
        last_run_kind=row.last_run_kind,
        last_run_outcome=row.last_run_outcome,
        last_run_ended_at=row.last_run_ended_at,
        created_at=row.created_at,
        open_problems=int(row.open_problems),
        first_problem=row.first_problem,
        problems_since=row.problems_since,
        last_resolved_at=row.last_resolved_at,
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
