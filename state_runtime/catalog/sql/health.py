"""Store-level answers for maintenance and dashboards: snapshot candidates, health and the
estimated recovery cost of each store."""

from __future__ import annotations

import dataclasses
import functools
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import RecoveryCost, SnapshotCandidate, StoreHealth, StoreKey
from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.sql.retention import PolicySql, needed_files, offsets
from state_runtime.catalog.sql.rows import key_of, store_key_columns
from state_runtime.catalog.sql.scope import Scope
from state_runtime.catalog.sql.store_facts import last_snapshots, store_facts
from state_runtime.errors import InvalidArgument
from state_runtime.identity import EMPTY, CheckpointRef
from state_runtime.retention import RetentionPolicy


def snapshot_candidates_query(views: ReaderViews, min_deltas: int, scope: Scope) -> sa.Select[Any]:
    """Stores in ``scope`` with at least ``min_deltas`` committed deltas since their last
    snapshot, longest chains first."""
    s = views.stores.c
    snap = last_snapshots(views, scope)
    since = sa.func.coalesce(snap.c.snapshot_version, 0)
    deltas = (s.latest_version - since).label("deltas")
    return (
        sa.select(
            *store_key_columns(views.stores),
            s.latest_version,
            s.latest_checkpoint_id,
            since.label("snapshot_version"),
            deltas,
        )
        .outerjoin(snap, snap.c.store_id == s.store_id)
        .where(s.latest_version > 0, s.latest_version - since >= min_deltas)
        .where(scope.filter(views, s.store_id))
        .order_by(deltas.desc(), s.store_id)
    )


def snapshot_candidates(
    connection: Connection, views: ReaderViews, min_deltas: int, scope: Scope
) -> list[SnapshotCandidate]:
    return [
        SnapshotCandidate(
            key=key_of(r),
            latest=CheckpointRef(r.latest_version, r.latest_checkpoint_id),
            last_snapshot_version=r.snapshot_version,
            deltas_since_snapshot=r.deltas,
        )
        for r in connection.execute(snapshot_candidates_query(views, min_deltas, scope))
    ]


def _bound_scope(views: ReaderViews, dialect: str, by_root: bool, paged: bool) -> Scope:
    """Every store, or those of the root given as the bind parameter ``root``; if ``paged``,
    only those of the page, the store ids given as the parameter ``store_ids`` (on
    PostgreSQL one array: :func:`~state_runtime.catalog.sql.statements.among`)."""
    root = sa.bindparam("root", type_=views.stores.c.checkpoint_root.type) if by_root else None
    return Scope(root=root, store_ids="store_ids" if paged else None, dialect=dialect)


def _scope_values(scope: Scope) -> tuple[bool, bool, dict[str, Any]]:
    """Whether ``scope`` (of values) names a root and a page, and the values of
    :func:`_bound_scope`'s bind parameters: the shape and the values of a cached statement."""
    if scope.store_ids is not None and not isinstance(scope.store_ids, tuple):
        raise InvalidArgument("health reads a root or a page of store ids, not a query's")
    values: dict[str, Any] = {}
    if scope.root is not None:
        values["root"] = scope.root
    if scope.store_ids is not None:
        values["store_ids"] = list(scope.store_ids)
    return scope.root is not None, scope.store_ids is not None, values


@functools.cache
def _store_health_query(
    views: ReaderViews, dialect: str, retain_versions: int, by_root: bool, paged: bool
) -> sa.Select[Any]:
    """:func:`store_health`'s statement, built once per dialect and shape: the cutoffs, the
    root and the page are parameters (``committed_cutoff``, ``uncommitted_cutoff``, ``root``,
    ``store_ids``)."""
    at = views.files.c.created_at.type
    policy = PolicySql(
        offsets(retain_versions),
        sa.bindparam("committed_cutoff", type_=at),
        sa.bindparam("uncommitted_cutoff", type_=at),
    )
    query = store_facts(views, policy, _bound_scope(views, dialect, by_root, paged))
    return query.order_by(*store_key_columns(views.stores))


def store_health(
    connection: Connection,
    views: ReaderViews,
    policy: RetentionPolicy,
    scope: Scope,
    now: datetime,
) -> list[StoreHealth]:
    """Each store's facts (:func:`~state_runtime.catalog.sql.store_facts.store_facts`);
    ``reclaimable_*`` are what cleanup under ``policy`` may delete at ``now``."""
    by_root, paged, values = _scope_values(scope)
    query = _store_health_query(
        views, connection.dialect.name, policy.retain_versions, by_root, paged
    )
    values |= {
        "committed_cutoff": policy.committed_cutoff(now),
        "uncommitted_cutoff": policy.uncommitted_cutoff(now),
    }
    return [_health(row, now) for row in connection.execute(query, values).all()]


_DERIVED = ("key", "latest", "commit_lag")
_FACTS = tuple(f.name for f in dataclasses.fields(StoreHealth) if f.name not in _DERIVED)
"""The fields of StoreHealth that are columns of ``store_facts`` under the same name."""


def _health(row: Any, now: datetime) -> StoreHealth:
    latest = (
        CheckpointRef(row.latest_version, row.latest_checkpoint_id) if row.latest_version else EMPTY
    )
    facts: dict[str, Any] = {name: _value(getattr(row, name)) for name in _FACTS}
    return StoreHealth(
        key=key_of(row),
        latest=latest,
        commit_lag=None if row.last_committed_at is None else now - row.last_committed_at,
        **facts,
    )


def _value(value: Any) -> Any:
    """PostgreSQL sums bigints as numeric: a byte count comes back as a Decimal."""
    return int(value) if isinstance(value, Decimal) else value


@functools.cache
def _recovery_query(views: ReaderViews, dialect: str, by_root: bool, paged: bool) -> sa.Select[Any]:
    """:func:`recovery_costs`' statement, built once per dialect and shape (``root``,
    ``store_ids``: parameters)."""
    nf = needed_files(views, 1, _bound_scope(views, dialect, by_root, paged)).subquery("nf")
    f, key = views.files.c, store_key_columns(views.stores)
    return (
        sa.select(
            *key,
            sa.func.count().label("files"),
            sa.func.sum(f.size_bytes).label("bytes"),
        )
        .select_from(nf)
        .join(views.files, f.file_id == nf.c.file_id)
        .join(views.stores, views.stores.c.store_id == nf.c.store_id)
        .group_by(*key)
    )


def recovery_costs(
    connection: Connection, views: ReaderViews, scope: Scope
) -> dict[StoreKey, RecoveryCost]:
    """Per store in ``scope``, the files and bytes loading its latest committed version
    reads: the "files needed by the retained versions" walk, newest version only."""
    by_root, paged, values = _scope_values(scope)
    rows = connection.execute(
        _recovery_query(views, connection.dialect.name, by_root, paged), values
    )
    return {key_of(r): RecoveryCost(int(r.files), int(r.bytes)) for r in rows}


def health_with_costs(
    connection: Connection,
    views: ReaderViews,
    policy: RetentionPolicy,
    scope: Scope,
    now: datetime,
) -> list[tuple[StoreHealth, RecoveryCost]]:
    """:func:`store_health` of the stores in ``scope``, each with its recovery cost."""
    costs = recovery_costs(connection, views, scope)
    return [
        (h, costs.get(h.key, RecoveryCost(0, 0)))
        for h in store_health(connection, views, policy, scope, now)
    ]
