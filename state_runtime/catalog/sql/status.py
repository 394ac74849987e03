"""The status rule of :mod:`state_runtime.status` translated to SQL, for both dialects.

The rule (the order, the conditions, their limits, texts and since-facts) is
:data:`state_runtime.status.RULES`; this module only says how a condition, a text and a
"since" read in SQL over a row of store facts (``store_facts.store_facts``), so that the
views (:mod:`~state_runtime.catalog.schema.operator_views`) show the status Python computes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from state_runtime import status as rule
from state_runtime.status import Condition, Test


def _text(value: Any) -> ColumnElement[str]:
    return sa.cast(value, sa.Text())


def _concat(parts: Sequence[ColumnElement[str]]) -> ColumnElement[str]:
    return functools.reduce(lambda a, b: a.concat(b), parts)


def _earliest(dialect: str, items: list[Any], latest: bool = False) -> Any:
    """The smallest (or with ``latest`` the largest) non-null of ``items``: PostgreSQL's
    least/greatest skip nulls; SQLite's min/max do not, so each argument is a coalesce
    starting at another item."""
    if len(items) == 1:
        return items[0]
    if dialect == "postgresql":
        return (sa.func.greatest if latest else sa.func.least)(*items)
    rotations = [sa.func.coalesce(*items[i:], *items[:i]) for i in range(len(items))]
    return (sa.func.max if latest else sa.func.min)(*rotations)


class StatusSql:
    """:data:`state_runtime.status.RULES` over the facts ``f`` (columns by name) with the
    limits as SQL (literals for a view, a function's parameters)."""

    def __init__(self, f: Any, limits: Mapping[str, Any], dialect: str) -> None:
        self.f, self.limits, self.dialect = f, limits, dialect

    def holds(self, condition: Condition) -> ColumnElement[bool]:
        if condition.test is Test.ALWAYS or condition.fact is None:
            return sa.true()
        value = self.f[condition.fact]
        if condition.test is Test.MISSING:
            missing: ColumnElement[bool] = value.is_(None)
            return missing
        if condition.test is Test.LATER:
            other = self.f[str(condition.bound)]
            return sa.and_(value.is_not(None), sa.or_(other.is_(None), value > other))
        bound = condition.bound
        reached: ColumnElement[bool] = value >= (
            self.limits[bound] if isinstance(bound, str) else bound
        )
        return reached

    def text(self, condition: Condition) -> ColumnElement[str]:
        """The condition's text: its literal parts and each field's value as text."""
        parts: list[ColumnElement[str]] = []
        for literal, field in rule.template_parts(condition.text):
            if literal:
                parts.append(sa.literal(literal, sa.Text()))
            if field is None:
                continue
            if field in self.limits:
                parts.append(_text(self.limits[field]))
            else:
                default = rule.FACT_DEFAULTS.get(field)
                value = self.f[field]
                parts.append(_text(value if default is None else sa.func.coalesce(value, default)))
        return _concat(parts) if parts else sa.literal("", sa.Text())

    def since(self, condition: Condition) -> Any:
        return _earliest(self.dialect, [self.f[name] for name in condition.since], latest=True)

    def rule_holds(self, r: rule.Rule) -> ColumnElement[bool]:
        return sa.or_(*(self.holds(c) for c in r.conditions))

    def reason(self, r: rule.Rule) -> Any:
        """The texts of the rule's conditions that hold, joined."""
        if len(r.conditions) == 1:
            return self.text(r.conditions[0])
        separator = sa.literal(rule.SEPARATOR, sa.Text())
        joined = _concat(
            [
                sa.func.coalesce(separator.concat(sa.case((self.holds(c), self.text(c)))), "")
                for c in r.conditions
            ]
        )
        return sa.func.substr(joined, len(rule.SEPARATOR) + 1)

    def rule_since(self, r: rule.Rule) -> Any:
        """The earliest since of the rule's conditions that hold, never before the rule's
        ``not_before`` facts."""
        if len(r.conditions) == 1:
            since = self.since(r.conditions[0])
        else:
            since = _earliest(
                self.dialect, [sa.case((self.holds(c), self.since(c))) for c in r.conditions]
            )
        floor = [self.f[name] for name in r.not_before]
        return _earliest(self.dialect, [since, *floor], latest=True) if floor else since

    def estimate(self) -> tuple[Any, Any, Any]:
        """The status, its reason and the facts' estimate of since when: the first rule that
        holds."""
        whens = [(self.rule_holds(r), r) for r in rule.RULES]
        status = sa.case(*((c, sa.literal(r.status.value, sa.Text())) for c, r in whens))
        reason = sa.case(*((c, self.reason(r)) for c, r in whens))
        since = sa.case(*((c, self.rule_since(r)) for c, r in whens))
        return status, reason, since

    def columns(self) -> tuple[Any, Any, Any, Any]:
        """``status``, ``status_reason``, ``status_since`` (the recorded change to the status,
        or else the estimate) and ``status_recorded`` (which of the two)."""
        status, reason, estimate = self.estimate()
        recorded_status, changed_at = (self.f[name] for name in rule.RECORDED)
        recorded = sa.and_(recorded_status.is_not(None), recorded_status == status)
        since = sa.case((recorded, changed_at), else_=estimate)
        return (
            status.label("status"),
            reason.label("status_reason"),
            since.label("status_since"),
            recorded.label("status_recorded"),
        )


COMMIT_LAG: Mapping[str, str] = {
    "postgresql": "now() - f.last_committed_at AS commit_lag",
    "sqlite": "(julianday('now') - julianday(f.last_committed_at)) * 86400.0 AS commit_lag_seconds",
}
"""The time since a store's last commit, as each dialect's view shows it."""


def status_of(facts: sa.FromClause, limits: Mapping[str, Any], dialect: str) -> sa.Select[Any]:
    """(store_id, status, status_reason, status_since, status_recorded) of each row of
    ``facts``."""
    status = StatusSql(facts.c, limits, dialect).columns()
    return sa.select(facts.c.store_id, *status).select_from(facts)


def health_of(facts: sa.FromClause, limits: Mapping[str, Any], dialect: str) -> sa.Select[Any]:
    """Each row of ``facts`` (aliased ``f``) with its status under ``limits`` and its commit
    lag: the rows of ``state_store_health``."""
    keys = ("store_id", "checkpoint_root", "operator_id", "partition_id", "store_name")
    status = StatusSql(facts.c, limits, dialect).columns()
    rest = [c for c in facts.c if c.name not in keys]
    return sa.select(
        *(facts.c[k] for k in keys), *status, *rest, sa.literal_column(COMMIT_LAG[dialect])
    ).select_from(facts)
