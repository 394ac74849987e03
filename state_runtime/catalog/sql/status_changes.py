"""Recording each store's status as it changes (``store_status_changes``), so that a "since"
is the moment the status last changed (:mod:`state_runtime.status`).

One ``INSERT … SELECT``: every store in scope whose status now (the status rule over
:func:`~state_runtime.catalog.sql.store_facts.store_facts`, as the views compute it) differs
from its last recorded one gets a row. The moment of the change is the facts' estimate when it
falls after the last recorded change (a problem's detection, a restore, a chain's first
delta), else the moment of recording: a snapshot that made a degraded store healthy changed
it when its run closed, not at the store's first validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.schema.reading_views import WRITE_LOOKUPS
from state_runtime.catalog.schema.tables import UtcDateTime, store_status_changes
from state_runtime.catalog.sql.retention import PolicySql, Scope
from state_runtime.catalog.sql.status import StatusSql
from state_runtime.catalog.sql.store_facts import store_facts
from state_runtime.retention import RetentionPolicy
from state_runtime.status import RECORDED


def record_status_changes(
    connection: Connection, limits: Mapping[str, int], root: str | None, now: datetime
) -> int:
    """Record the stores (of ``root``, or all) whose status under ``limits`` differs from
    their last recorded one; how many were recorded."""
    policy = PolicySql.of(RetentionPolicy(), now)  # the status reads no reclaimable figure
    facts = store_facts(WRITE_LOOKUPS, policy, Scope(root=root)).subquery("f")
    sql_limits = {name: sa.literal(value) for name, value in limits.items()}
    status, reason, estimate = StatusSql(facts.c, sql_limits, connection.dialect.name).estimate()
    recorded_status, changed_at = (facts.c[name] for name in RECORDED)
    current = sa.select(
        facts.c.store_id,
        status.label("status"),
        reason.label("reason"),
        estimate.label("estimate"),
        recorded_status.label("recorded_status"),
        changed_at.label("changed_at"),
    ).subquery("current")
    c = current.c
    at = sa.bindparam("recorded_at", now, type_=UtcDateTime())
    later = sa.and_(
        c.estimate.is_not(None),
        c.estimate <= at,
        sa.or_(c.changed_at.is_(None), c.estimate > c.changed_at),
    )
    changes = sa.select(
        c.store_id, c.status, c.reason, sa.case((later, c.estimate), else_=at)
    ).where(sa.or_(c.recorded_status.is_(None), c.recorded_status != c.status))
    columns = ["store_id", "status", "reason", "changed_at"]
    inserted = connection.execute(sa.insert(store_status_changes).from_select(columns, changes))
    return int(inserted.rowcount)
