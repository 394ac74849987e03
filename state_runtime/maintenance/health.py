"""Each store's health: its status, the catalog's figures and the estimated recovery cost.

No storage I/O: everything comes from the catalog.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from state_runtime.catalog import RecoveryCost, StoreHealth, StoreKey
from state_runtime.errors import CatalogPermissionDenied, CatalogReadOnly
from state_runtime.maintenance.fleet import Fleet
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.redaction import get_logger
from state_runtime.status import Status, StoreStatus, store_status

log = get_logger(__name__)


@dataclass(frozen=True)
class StoreReport:
    """One store's status and figures for tables, plots and checks."""

    health: StoreHealth
    recovery: RecoveryCost
    status: Status

    @property
    def key(self) -> StoreKey:
        return self.health.key

    def figures(self) -> dict[str, int | float]:
        """Numeric figures by name (Dagster metadata, JSON output)."""
        h = self.health
        return {
            "latest_version": h.latest.version,
            "commit_lag_seconds": -1.0 if h.commit_lag is None else h.commit_lag.total_seconds(),
            "versions_behind": h.versions_behind,
            "deltas_since_snapshot": h.deltas_since_snapshot,
            "versions_retained": h.versions_loadable,
            "recovery_files": self.recovery.files,
            "recovery_bytes": self.recovery.bytes,
            "state_rows": h.state_rows,
            "live_files": h.live_files,
            "live_bytes": h.live_bytes,
            "orphan_files": h.orphan_files,
            "orphan_bytes": h.orphan_bytes,
            "reclaimable_files": h.reclaimable_files,
            "reclaimable_bytes": h.reclaimable_bytes,
            "open_problems": h.open_problems,
        }

    def status_fields(self) -> dict[str, str | bool | None]:
        """The status as fields (JSON output), as SQL shows them."""
        since = self.status.since
        return {
            "status": self.status.status.value,
            "status_reason": self.status.reason,
            "status_since": None if since is None else since.isoformat(),
            "status_recorded": self.status.recorded,
        }


def store_reports(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    only: Collection[StoreKey] | None = None,
    now: datetime | None = None,
) -> list[StoreReport]:
    """Health of every store in scope, one catalog query pair per root, after recording the
    stores whose status changed (so that each "since" is a recorded change; a role that may
    not write, the reader, reads what was recorded last)."""
    reports: list[StoreReport] = []
    for root in fleet.query_roots(only):
        try:
            fleet.catalog.record_status_changes(policy.status_limits(), root=root)
        except (CatalogPermissionDenied, CatalogReadOnly) as exc:
            log.debug("status changes not recorded: %s", exc)
        costs = fleet.catalog.recovery_costs(root)
        for health in fleet.catalog.store_health(policy.retention, root=root, now=now):
            if fleet.in_scope(health.key, only):
                status = store_status(
                    health,
                    lag_warn_deltas=policy.lag_warn_deltas,
                    orphan_warn_files=policy.orphan_warn_files,
                )
                cost = costs.get(health.key, RecoveryCost(0, 0))
                reports.append(StoreReport(health, cost, status))
    return reports


@dataclass(frozen=True)
class FleetTotals:
    """Sums and worst cases over stores: the figures a fleet-wide plot shows."""

    stores: int
    broken_stores: int
    degraded_stores: int
    unknown_stores: int
    state_rows: int
    live_bytes: int
    orphan_files: int
    orphan_bytes: int
    reclaimable_bytes: int
    max_deltas_since_snapshot: int
    max_recovery_bytes: int
    max_commit_lag_seconds: float

    @classmethod
    def of(cls, reports: Collection[StoreReport]) -> FleetTotals:
        lags = [r.health.commit_lag.total_seconds() for r in reports if r.health.commit_lag]
        statuses = [r.status.status for r in reports]
        return cls(
            stores=len(reports),
            broken_stores=statuses.count(StoreStatus.BROKEN),
            degraded_stores=statuses.count(StoreStatus.DEGRADED),
            unknown_stores=statuses.count(StoreStatus.UNKNOWN),
            state_rows=sum(r.health.state_rows for r in reports),
            live_bytes=sum(r.health.live_bytes for r in reports),
            orphan_files=sum(r.health.orphan_files for r in reports),
            orphan_bytes=sum(r.health.orphan_bytes for r in reports),
            reclaimable_bytes=sum(r.health.reclaimable_bytes for r in reports),
            max_deltas_since_snapshot=max(
                (r.health.deltas_since_snapshot for r in reports), default=0
            ),
            max_recovery_bytes=max((r.recovery.bytes for r in reports), default=0),
            max_commit_lag_seconds=max(lags, default=0.0),
        )


def health_summary(reports: Sequence[StoreReport]) -> str:
    """The stores' health in one line: how many of each status."""
    counts = Counter(r.status.status.value for r in reports)
    return f"health: {len(reports)} store(s): " + (
        ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none"
    )


def health_rows(reports: Sequence[StoreReport]) -> list[dict[str, Any]]:
    """One row per store (by name): its status fields, its figures and ``detail`` in words."""
    return [
        {"store": str(r.key), **r.status_fields(), **r.figures(), "detail": str(r.status)}
        for r in sorted(reports, key=lambda r: str(r.key))
    ]
