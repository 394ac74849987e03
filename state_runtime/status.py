"""One status per store, derived from catalog facts: healthy, degraded, broken or unknown.

- **broken**: the store has an open problem (a validation, the snapshot pass or a repair found
  a missing, corrupt or mislabelled file, or a broken lineage or commit log). Reason: the
  problem (the oldest, and how many); since: when it was found. Cleanup holds the store.
- **unknown**: no validation has ever checked the store (since: its registration), or a
  restore resolved its problems and no validation has checked it since (since: the restore): a
  restore is not a validation.
- **degraded**: validated and nothing broken, but ``lag_warn_deltas`` or more deltas follow
  the last verified snapshot (since: the commit of the first of them), or
  ``orphan_warn_files`` or more orphan files wait for cleanup (since: the oldest); never
  since before the store was validated or its last problem resolved.
- **healthy**: otherwise. Since: the first validation or the last resolved problem.

"Since" is when the status last changed: the catalog records each store's status as it
changes (``store_status_changes``: every maintenance run as it closes, for the stores it
maintained, and ``health``, ``explain``, Dagster and Airflow as they read), and a store whose
last recorded status is its status now reads since that change. A store never recorded (or
whose status changed since its last record) shows the estimate above, from the facts, marked
``(not recorded)``: a store that was degraded before its last snapshot would read healthy
since its first validation.

This module is the one home of the rule; it holds no SQL. :data:`RULES` is the order above as
data: the first rule one of whose conditions holds gives the status, the reason joins the
texts of its conditions that hold, and since is the earliest of theirs (each condition's own
since is the latest of its facts), never before the rule's ``not_before`` facts.
:func:`store_status` applies it in Python; the catalog
renders the same table as SQL for both dialects (``state_runtime/catalog/sql/status.py``:
the views ``state_store_health``, ``state_store_facts`` and, on PostgreSQL, the functions
``state_store_status`` and ``state_store_health_at``). ``tests/catalog/test_views.py`` checks
on random catalogs that the SQL gives what :func:`store_status` gives.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from state_runtime.settings import MAINTENANCE, default_of


class StoreStatus(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    BROKEN = "broken"
    UNKNOWN = "unknown"


class StoreFacts(Protocol):
    """The catalog facts a status is derived from (the catalog's ``StoreHealth`` has them; the
    views read them from ``state_store_facts``)."""

    @property
    def created_at(self) -> datetime: ...
    @property
    def open_problems(self) -> int: ...
    @property
    def first_problem(self) -> str | None: ...
    @property
    def problems_since(self) -> datetime | None: ...
    @property
    def last_resolved_at(self) -> datetime | None: ...
    @property
    def last_restored_at(self) -> datetime | None: ...
    @property
    def first_validated_at(self) -> datetime | None: ...
    @property
    def last_validated_at(self) -> datetime | None: ...
    @property
    def deltas_since_snapshot(self) -> int: ...
    @property
    def chain_since(self) -> datetime | None: ...
    @property
    def orphan_files(self) -> int: ...
    @property
    def oldest_orphan_at(self) -> datetime | None: ...
    @property
    def recorded_status(self) -> str | None: ...
    @property
    def status_changed_at(self) -> datetime | None: ...


class Test(StrEnum):
    """How a condition compares its fact."""

    AT_LEAST = "at_least"  # fact >= bound (a limit's name, or a number)
    MISSING = "missing"  # fact is null
    LATER = "later"  # fact is set and later than the fact named by bound (or that one is null)
    ALWAYS = "always"  # holds whatever the facts


@dataclass(frozen=True)
class Condition:
    """One reason for a status: when it holds, what it says, and since when.

    ``text`` is a template over the facts and the limits (``{deltas_since_snapshot}``,
    ``{lag_warn_deltas}``); ``since`` names the facts whose latest (non-null) value says
    since when the condition holds.
    """

    test: Test
    fact: str | None
    bound: str | int | None
    text: str
    since: tuple[str, ...]


@dataclass(frozen=True)
class Rule:
    """A status, the conditions any one of which gives it, and the facts its since is never
    before (the status cannot have started before them)."""

    status: StoreStatus
    conditions: tuple[Condition, ...]
    not_before: tuple[str, ...] = ()


SEPARATOR = "; "
"""Between the texts of a rule's conditions that hold, in the order they are declared."""

FACT_DEFAULTS: Mapping[str, str] = {"first_problem": "an open problem"}
"""What a text says for a fact that is missing (an open problem whose text is missing)."""

RULES: tuple[Rule, ...] = (
    Rule(
        StoreStatus.BROKEN,
        (
            Condition(
                Test.AT_LEAST,
                "open_problems",
                2,
                "{open_problems} open problems; first: {first_problem}",
                ("problems_since",),
            ),
        ),
    ),
    Rule(
        StoreStatus.BROKEN,
        (Condition(Test.AT_LEAST, "open_problems", 1, "{first_problem}", ("problems_since",)),),
    ),
    Rule(
        StoreStatus.UNKNOWN,
        (Condition(Test.MISSING, "first_validated_at", None, "never validated", ("created_at",)),),
    ),
    Rule(
        StoreStatus.UNKNOWN,
        (
            Condition(
                Test.LATER,
                "last_restored_at",
                "last_validated_at",
                "restored; not validated since",
                ("last_restored_at",),
            ),
        ),
    ),
    Rule(
        StoreStatus.DEGRADED,
        (
            Condition(
                Test.AT_LEAST,
                "deltas_since_snapshot",
                "lag_warn_deltas",
                "{deltas_since_snapshot} deltas since the last verified snapshot "
                "(warn at {lag_warn_deltas})",
                ("chain_since",),
            ),
            Condition(
                Test.AT_LEAST,
                "orphan_files",
                "orphan_warn_files",
                "{orphan_files} orphan files (warn at {orphan_warn_files})",
                ("oldest_orphan_at",),
            ),
        ),
        not_before=("first_validated_at", "last_resolved_at"),
    ),
    Rule(
        StoreStatus.HEALTHY,
        (
            Condition(
                Test.ALWAYS,
                None,
                None,
                "validated, no open problems",
                ("first_validated_at", "last_resolved_at"),
            ),
        ),
    ),
)
"""The status order: the first rule with a condition that holds gives the store's status."""

LIMITS: tuple[str, ...] = tuple(
    dict.fromkeys(
        c.bound
        for rule in RULES
        for c in rule.conditions
        if c.test is Test.AT_LEAST and isinstance(c.bound, str)
    )
)
"""The limits the rules compare with, each a maintenance setting of the same name."""

DEFAULT_LIMITS: Mapping[str, int] = {name: default_of(MAINTENANCE, name, int) for name in LIMITS}
"""Each limit as the maintenance settings declare it (the ``state_store_health`` view's)."""


def template_parts(template: str) -> list[tuple[str, str | None]]:
    """A condition's text as (literal, field) pairs: what the SQL renderings concatenate."""
    return [(literal, field) for literal, field, _, _ in string.Formatter().parse(template)]


FACT_NAMES_IN_TEXTS: tuple[str, ...] = tuple(
    dict.fromkeys(
        name
        for rule in RULES
        for c in rule.conditions
        for _, name in template_parts(c.text)
        if name is not None and name not in LIMITS
    )
)
"""The facts the texts show."""


RECORDED = ("recorded_status", "status_changed_at")
"""The facts that hold a store's last recorded status change: its status, and since when."""
NOT_RECORDED = "(not recorded)"
"""What follows a since that is the facts' estimate, not a recorded change."""


@dataclass(frozen=True)
class Status:
    """A store's status, the reason in words, and since when it holds: recorded (the last
    recorded change is to this status) or else the facts' estimate."""

    status: StoreStatus
    reason: str
    since: datetime | None
    recorded: bool

    def since_text(self, fmt: str) -> str:
        """Since when in ``fmt`` (strftime), marked when it is not recorded; ``-`` if unknown."""
        if self.since is None:
            return "-"
        when = self.since.strftime(fmt)
        return when if self.recorded else f"{when} {NOT_RECORDED}"

    def __str__(self) -> str:
        if self.since is None:
            return f"{self.status.value}: {self.reason}"
        since = self.since.isoformat(timespec="seconds")
        marked = since if self.recorded else f"{since} {NOT_RECORDED}"
        return f"{self.status.value} since {marked}: {self.reason}"


def _holds(condition: Condition, facts: StoreFacts, limits: Mapping[str, int]) -> bool:
    if condition.test is Test.ALWAYS or condition.fact is None:
        return True
    value = getattr(facts, condition.fact)
    if condition.test is Test.MISSING:
        return value is None
    if condition.test is Test.LATER:
        other = getattr(facts, str(condition.bound))
        return value is not None and (other is None or value > other)
    bound = limits[condition.bound] if isinstance(condition.bound, str) else condition.bound
    return bool(value >= bound)


def _text(condition: Condition, facts: StoreFacts, limits: Mapping[str, int]) -> str:
    values = {name: getattr(facts, name) for name in FACT_NAMES_IN_TEXTS}
    values |= {k: FACT_DEFAULTS[k] for k, v in values.items() if v is None and k in FACT_DEFAULTS}
    return condition.text.format(**values, **limits)


def _since(condition: Condition, facts: StoreFacts) -> datetime | None:
    found = [t for t in (getattr(facts, name) for name in condition.since) if t is not None]
    return max(found, default=None)


def store_status(health: StoreFacts, *, lag_warn_deltas: int, orphan_warn_files: int) -> Status:
    """The status of the store whose catalog facts are ``health``: :data:`RULES` applied,
    since its recorded change to it, or else since the facts' estimate."""
    limits = {"lag_warn_deltas": lag_warn_deltas, "orphan_warn_files": orphan_warn_files}
    for rule in RULES:
        held = [c for c in rule.conditions if _holds(c, health, limits)]
        if held:
            reason = SEPARATOR.join(_text(c, health, limits) for c in held)
            since = [t for t in (_since(c, health) for c in held) if t is not None]
            floor = [getattr(health, name) for name in rule.not_before]
            started = [t for t in (min(since, default=None), *floor) if t is not None]
            if health.recorded_status == rule.status.value:
                return Status(rule.status, reason, health.status_changed_at, recorded=True)
            return Status(rule.status, reason, max(started, default=None), recorded=False)
    raise AssertionError("the last of RULES must always hold")
