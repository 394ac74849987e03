"""One status per store, derived from catalog facts: healthy, degraded, broken or unknown.

- **broken**: the store has an open problem (a validation, the snapshot pass or a repair found
  a missing, corrupt or mislabelled file, or a broken lineage or commit log). Reason: the
  problem (the oldest, and how many); since: when it was found. Cleanup holds the store.
- **unknown**: no validation has ever checked the store. Since: the store's registration.
- **degraded**: validated and nothing broken, but ``lag_warn_deltas`` or more deltas follow
  the last verified snapshot (since: the commit of the first of them), or
  ``orphan_growth_warn_files`` or more orphan files wait for cleanup (since: the oldest).
- **healthy**: otherwise. Since: the first validation or the last resolved problem.

The CLI (``health``, ``explain``), Dagster and the operators' SQL (``state_store_status``,
``state_store_health``) all show this status; a test checks that the SQL agrees.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from state_runtime.catalog import StoreHealth


class StoreStatus(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    BROKEN = "broken"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Status:
    """A store's status, the reason in words, and since when it holds."""

    status: StoreStatus
    reason: str
    since: datetime | None

    def __str__(self) -> str:
        since = "" if self.since is None else f" since {self.since.isoformat(timespec='seconds')}"
        return f"{self.status.value}{since}: {self.reason}"


def store_status(health: StoreHealth, *, lag_warn_deltas: int, orphan_warn_files: int) -> Status:
    """The status of the store whose catalog facts are ``health`` (see the module docstring)."""
    h = health
    if h.open_problems:
        reason = h.first_problem or "an open problem"
        if h.open_problems > 1:
            reason = f"{h.open_problems} open problems; first: {reason}"
        return Status(StoreStatus.BROKEN, reason, h.problems_since)
    if h.first_validated_at is None:
        return Status(StoreStatus.UNKNOWN, "never validated", h.created_at)
    reasons: list[str] = []
    since: list[datetime] = []
    if h.deltas_since_snapshot >= lag_warn_deltas:
        reasons.append(
            f"{h.deltas_since_snapshot} deltas since the last verified snapshot (warn at "
            f"{lag_warn_deltas})"
        )
        since += [h.chain_since] if h.chain_since else []
    if h.orphan_files >= orphan_warn_files:
        reasons.append(f"{h.orphan_files} orphan files (warn at {orphan_warn_files})")
        since += [h.oldest_orphan_at] if h.oldest_orphan_at else []
    if reasons:
        return Status(StoreStatus.DEGRADED, "; ".join(reasons), min(since, default=None))
    healthy_since = max(t for t in (h.first_validated_at, h.last_resolved_at) if t is not None)
    return Status(StoreStatus.HEALTHY, "validated, no open problems", healthy_since)
