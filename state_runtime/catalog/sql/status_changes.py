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

import functools
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


@functools.cache
def _record_statement(dialect: str, limits: tuple[str, ...], by_root: bool) -> sa.Insert:
    """:func:`record_status_changes`' statement, built once per shape: the limits
    (``limit_<name>``), the cutoffs, the moment of recording (``recorded_at``) and the root are
    bind parameters."""
    policy = PolicySql.bound(WRITE_LOOKUPS, RetentionPolicy().retain_versions)
    scope = Scope.of_root(WRITE_LOOKUPS, by_root)
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


def record_status_changes(
    connection: Connection, limits: Mapping[str, int], root: str | None, now: datetime
) -> int:
    """Record the stores (of ``root``, or all) whose status under ``limits`` differs from
    their last recorded one; how many were recorded."""
    statement = _record_statement(connection.dialect.name, tuple(sorted(limits)), root is not None)
    values = {
        # the status reads no reclaimable figure: the default policy's cutoffs will do
        **PolicySql.cutoffs(RetentionPolicy(), now),
        **{f"limit_{name}": value for name, value in limits.items()},
        "recorded_at": now,
        **({} if root is None else {"root": root}),
    }
    return int(connection.execute(statement, values).rowcount)
