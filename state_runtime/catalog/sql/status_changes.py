"""Recording each store's status as it changes (``store_status_changes``), so that a "since"
is the moment the status last changed (:mod:`state_runtime.status`).

Two ways, one rule. :func:`record_run_status_changes` is one ``INSERT … SELECT``: every store
of a maintenance run whose status now (the status rule over
:func:`~state_runtime.catalog.sql.store_facts.store_facts`, as the views compute it) differs
from its last recorded one gets a row. :func:`record_statuses` records the changes a health
read already derived from the facts it read (so the facts are not read twice). The moment of
the change is the facts' estimate when it falls after the last recorded change (a problem's
detection, a restore, a chain's first delta), else the moment of recording: a snapshot that
made a degraded store healthy changed it when its run closed, not at the store's first
validation.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import StatusChange, StoreKey
from state_runtime.catalog.schema.reading_views import WRITE_LOOKUPS
from state_runtime.catalog.schema.tables import UtcDateTime, store_status_changes
from state_runtime.catalog.sql.lookups import lock_stores, store_ids
from state_runtime.catalog.sql.retention import PolicySql
from state_runtime.catalog.sql.scope import Scope
from state_runtime.catalog.sql.statements import chunks
from state_runtime.catalog.sql.status import StatusSql
from state_runtime.catalog.sql.store_facts import last_status_changes, store_facts
from state_runtime.retention import RetentionPolicy
from state_runtime.status import RECORDED


@functools.cache
def _record_statement(dialect: str, limits: tuple[str, ...]) -> sa.Insert:
    """:func:`record_run_status_changes`' statement, built once per shape: the limits
    (``limit_<name>``), the cutoffs, the moment of recording (``recorded_at``) and the run
    (``run_id``) are bind parameters."""
    policy = PolicySql.bound(WRITE_LOOKUPS, RetentionPolicy().retain_versions)
    scope = Scope.of_run(WRITE_LOOKUPS)
    facts = store_facts(WRITE_LOOKUPS, policy, scope, figures=False)
    facts_sq = facts.subquery("f")
    sql_limits = {name: sa.bindparam(f"limit_{name}", type_=sa.BigInteger()) for name in limits}
    status, reason, estimate = StatusSql(facts_sq.c, sql_limits, dialect).estimate()
    recorded_status, changed_at = (facts_sq.c[name] for name in RECORDED)
    current = sa.select(
        facts_sq.c.store_id,
        status.label("status"),
        reason.label("reason"),
        estimate.label("estimate"),
        recorded_status.label("recorded_status"),
        changed_at.label("changed_at"),
    ).subquery("current")
    c = current.c
    at = sa.bindparam("recorded_at", type_=UtcDateTime())
    later = sa.and_(
        c.estimate.is_not(None),
        c.estimate <= at,
        sa.or_(c.changed_at.is_(None), c.estimate > c.changed_at),
    )
    changes = sa.select(
        c.store_id, c.status, c.reason, sa.case((later, c.estimate), else_=at)
    ).where(sa.or_(c.recorded_status.is_(None), c.recorded_status != c.status))
    columns = ["store_id", "status", "reason", "changed_at"]
    return sa.insert(store_status_changes).from_select(columns, changes)


def record_run_status_changes(
    connection: Connection, limits: Mapping[str, int], run_id: int, now: datetime
) -> int:
    """Record the stores of the run ``run_id`` (those it maintained; for a validation, those
    validated since it started) whose status under ``limits`` differs from their last recorded
    one; how many were recorded."""
    statement = _record_statement(connection.dialect.name, tuple(sorted(limits)))
    values = {
        # the status reads no reclaimable figure: the default policy's cutoffs will do
        **PolicySql.cutoffs(RetentionPolicy(), now),
        **{f"limit_{name}": value for name, value in limits.items()},
        "recorded_at": now,
        "run_id": run_id,
    }
    return int(connection.execute(statement, values).rowcount)


def record_statuses(
    connection: Connection, changes: Sequence[StatusChange], now: datetime
) -> dict[StoreKey, datetime]:
    """Record ``changes`` whose status still differs from the last one recorded (the stores
    are locked first: a concurrent reader may have recorded it since they were read); since
    when each store's recorded status now holds."""
    ids: dict[StoreKey, int] = {}
    for root in sorted({c.key.root for c in changes}):
        stores = [c.key.store for c in changes if c.key.root == root]
        known = store_ids(connection, WRITE_LOOKUPS, root, stores)
        ids |= {StoreKey(root, store): store_id for store, store_id in known.items()}
    lock_stores(connection, ids.values())
    last: dict[int, tuple[str, datetime]] = {}
    for part in chunks(sorted(ids.values())):
        newest = last_status_changes(
            WRITE_LOOKUPS, Scope(store_ids=tuple(part), dialect=connection.dialect.name)
        )
        for row in connection.execute(sa.select(newest)):
            last[row.store_id] = (row.status, row.changed_at)
    rows: list[dict[str, object]] = []
    since: dict[StoreKey, datetime] = {}
    for change in changes:
        store_id = ids.get(change.key)
        if store_id is None:
            continue
        found = last.get(store_id)
        if found is not None and found[0] == change.status:
            since[change.key] = found[1]
            continue
        at, estimate = now, change.estimate
        if estimate is not None and estimate <= now and (found is None or estimate > found[1]):
            at = estimate
        rows.append(
            {
                "store_id": store_id,
                "status": change.status,
                "reason": change.reason,
                "changed_at": at,
            }
        )
        since[change.key] = at
    if rows:
        connection.execute(sa.insert(store_status_changes), rows)
    return since
