"""One status per store, derived from catalog facts: healthy, degraded, broken or unknown.

- **broken**: the store has an open problem (a validation, the snapshot pass or a repair found
  a missing, corrupt or mislabelled file, or a broken lineage or commit log). Reason: the
  problem (the oldest, and how many); since: when it was found. Cleanup holds the store.
- **unknown**: no validation has ever checked the store (since: its registration), or a
  restore resolved its problems and no validation has checked it since (since: the restore): a
  restore is not a validation.
- **degraded**: validated and nothing broken, but ``lag_warn_deltas`` or more deltas follow
  the last verified snapshot (since: the commit of the first of them), or
  ``orphan_growth_warn_files`` or more orphan files wait for cleanup (since: the oldest); never
  since before the store was validated or its last problem resolved.
- **healthy**: otherwise. Since: the first validation or the last resolved problem.

"Since" is when the status last changed, as far as the facts tell: a store that was degraded
before its last snapshot reads healthy since its first validation or last resolved problem
(the catalog keeps no history of statuses).

The rule is declared here once (the order above, :data:`WARNINGS` with their limits, the
texts); :func:`store_status` applies it in Python and the catalog's views render it as SQL
(``state_store_status``, ``state_store_health``;
``state_runtime/catalog/schema/operator_views.py``). The CLI
(``health``, ``explain``), Dagster and the operators' SQL all show this status; a test checks
that the SQL agrees.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Threshold:
    """A figure that degrades a validated store once it reaches its limit."""

    fact: str  # the StoreFacts field compared with the limit
    limit: str  # the limit's name (a keyword of store_status, a parameter of the SQL)
    text: str  # the reason, with {value} and {limit}
    since: str  # the StoreFacts field saying since when it holds


WARNINGS = (
    Threshold(
        "deltas_since_snapshot",
        "lag_warn_deltas",
        "{value} deltas since the last verified snapshot (warn at {limit})",
        "chain_since",
    ),
    Threshold(
        "orphan_files",
        "orphan_warn_files",
        "{value} orphan files (warn at {limit})",
        "oldest_orphan_at",
    ),
)
"""The warnings, in the order their reasons are joined (with :data:`WARNING_SEPARATOR`)."""

DEFAULT_LIMITS: Mapping[str, int] = {
    "lag_warn_deltas": default_of(MAINTENANCE, "lag_warn_deltas", int),
    "orphan_warn_files": default_of(MAINTENANCE, "orphan_growth_warn_files", int),
}
"""Each warning's limit as the maintenance settings declare it (the ``state_store_health``
view's thresholds)."""

WARNING_SEPARATOR = "; "
ONE_PROBLEM = "{first_problem}"
SOME_PROBLEMS = "{open_problems} open problems; first: {first_problem}"
NO_PROBLEM_TEXT = "an open problem"  # an open problem whose text is missing
NEVER_VALIDATED = "never validated"
RESTORED = "restored; not validated since"
VALIDATED = "validated, no open problems"


@dataclass(frozen=True)
class Status:
    """A store's status, the reason in words, and since when it holds."""

    status: StoreStatus
    reason: str
    since: datetime | None

    def __str__(self) -> str:
        since = "" if self.since is None else f" since {self.since.isoformat(timespec='seconds')}"
        return f"{self.status.value}{since}: {self.reason}"


def store_status(health: StoreFacts, *, lag_warn_deltas: int, orphan_warn_files: int) -> Status:
    """The status of the store whose catalog facts are ``health`` (see the module docstring)."""
    h = health
    if h.open_problems:
        template = ONE_PROBLEM if h.open_problems == 1 else SOME_PROBLEMS
        reason = template.format(
            first_problem=h.first_problem or NO_PROBLEM_TEXT, open_problems=h.open_problems
        )
        return Status(StoreStatus.BROKEN, reason, h.problems_since)
    if h.first_validated_at is None:
        return Status(StoreStatus.UNKNOWN, NEVER_VALIDATED, h.created_at)
    if h.last_restored_at is not None and (
        h.last_validated_at is None or h.last_restored_at > h.last_validated_at
    ):
        return Status(StoreStatus.UNKNOWN, RESTORED, h.last_restored_at)
    limits = {"lag_warn_deltas": lag_warn_deltas, "orphan_warn_files": orphan_warn_files}
    validated = max(t for t in (h.first_validated_at, h.last_resolved_at) if t is not None)
    reasons: list[str] = []
    since: list[datetime] = []
    for warning in WARNINGS:
        value, limit = getattr(h, warning.fact), limits[warning.limit]
        if value >= limit:
            reasons.append(warning.text.format(value=value, limit=limit))
            started = getattr(h, warning.since)
            since += [started] if started else []
    if reasons:
        degraded = max(min(since, default=validated), validated)
        return Status(StoreStatus.DEGRADED, WARNING_SEPARATOR.join(reasons), degraded)
    return Status(StoreStatus.HEALTHY, VALIDATED, validated)
