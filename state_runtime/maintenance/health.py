"""Each store's health: its status, the catalog's figures and the estimated recovery cost.

No storage I/O: everything comes from the catalog.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import tempfile
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from state_runtime.catalog import RecoveryCost, StatusChange, StoreHealth, StoreKey
from state_runtime.errors import CatalogPermissionDenied, CatalogReadOnly
from state_runtime.maintenance.fleet import Fleet, key_set
from state_runtime.maintenance.policy import MaintenancePolicy
from state_runtime.maintenance.workers import read_ahead
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


def store_report_pages(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    only: Collection[StoreKey] | None = None,
    now: datetime | None = None,
) -> Iterator[list[StoreReport]]:
    """Health of every store in scope, a page at a time: set-based catalog reads, one page of
    stores each (:meth:`~state_runtime.catalog.Catalog.health_pages`), the next one read on
    a thread while this one is processed (:func:`read_ahead`, unless the catalog's pool serves
    one thread), so what is held is a few pages (three at the most) whatever the fleet's
    size. The stores of a page whose status differs from the one
    last recorded are recorded from the facts just read (one more transaction only when
    some changed), so that each "since" is a recorded change; a role that may not write, the
    reader, reads what was recorded last."""
    wanted = key_set(only)
    recording = True
    for root in fleet.query_roots(wanted):
        pages = fleet.catalog.health_pages(policy.retention, root=root, now=now)
        # the next page's statements run meanwhile, on a thread of their own: not on an
        # in-memory SQLite catalog, whose every thread sees its own empty database
        ahead = read_ahead(pages) if fleet.catalog.pool_capacity > 1 else pages
        for page in ahead:
            reports = [
                StoreReport(health, cost, _status(health, policy))
                for health, cost in page
                if fleet.in_scope(health.key, wanted)
            ]
            changes = [_change(r) for r in reports if not r.status.recorded]
            if recording and changes:
                try:
                    since = fleet.catalog.record_statuses(changes)
                except (CatalogPermissionDenied, CatalogReadOnly) as exc:
                    log.debug("status changes not recorded: %s", exc)
                    recording, since = False, {}
                reports = [_recorded(r, since) for r in reports]
            if reports:
                yield reports


def iter_store_reports(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    only: Collection[StoreKey] | None = None,
    now: datetime | None = None,
) -> Iterator[StoreReport]:
    """:func:`store_report_pages`, store by store."""
    for page in store_report_pages(fleet, policy, only=only, now=now):
        yield from page


class HealthSpool:
    """The store reports of one health read, kept on disk a page at a time (a temporary
    file, gone when closed or collected) for the consumers that read them after the pass
    (Dagster's events, a task's rows): each reads them back page by page, so a fleet-wide
    report holds one page in memory, not one entry per store (issue 35)."""

    def __init__(self) -> None:
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 (kept open until close())
        self._pages: list[tuple[int, int]] = []  # each page's offset and length
        self.stores = 0
        self.totals = FleetTotals.of(())

    @classmethod
    def of(cls, pages: Iterable[list[StoreReport]]) -> HealthSpool:
        """``pages`` (a health read) spooled."""
        spool = cls()
        for page in pages:
            spool.append(page)
        return spool

    def append(self, page: list[StoreReport]) -> None:
        data = pickle.dumps(page, protocol=pickle.HIGHEST_PROTOCOL)
        self._pages.append((self._file.seek(0, os.SEEK_END), len(data)))
        self._file.write(data)
        self.stores += len(page)
        for report in page:
            self.totals = self.totals.plus(report)

    def pages(self) -> Iterator[list[StoreReport]]:
        """The pages in the order they were read (any number of times, one at a time)."""
        self._file.flush()
        for offset, length in self._pages:
            yield pickle.loads(os.pread(self._file.fileno(), length, offset))

    def __iter__(self) -> Iterator[StoreReport]:
        for page in self.pages():
            yield from page

    def __len__(self) -> int:
        return self.stores

    def close(self) -> None:
        self._file.close()


def _status(health: StoreHealth, policy: MaintenancePolicy) -> Status:
    return store_status(
        health, lag_warn_deltas=policy.lag_warn_deltas, orphan_warn_files=policy.orphan_warn_files
    )


def _change(report: StoreReport) -> StatusChange:
    status = report.status
    return StatusChange(report.key, status.status.value, status.reason, status.since)


def _recorded(report: StoreReport, since: Mapping[StoreKey, datetime]) -> StoreReport:
    """``report`` with its status as recorded (since the recorded change), if it was."""
    at = since.get(report.key)
    if at is None or report.status.recorded:
        return report
    status = dataclasses.replace(report.status, since=at, recorded=True)
    return dataclasses.replace(report, status=status)


def store_reports(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    only: Collection[StoreKey] | None = None,
    now: datetime | None = None,
) -> list[StoreReport]:
    """:func:`iter_store_reports` as a list (a table sorted by any column, one store's
    report); a fleet-wide pass streams instead."""
    return list(iter_store_reports(fleet, policy, only=only, now=now))


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
    def of(cls, reports: Iterable[StoreReport]) -> FleetTotals:
        """The totals of ``reports``, in one pass (a stream of any length is fine)."""
        totals = cls(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0)
        for r in reports:
            totals = totals.plus(r)
        return totals

    def plus(self, r: StoreReport) -> FleetTotals:
        """These totals with one more store."""
        h, status = r.health, r.status.status
        lag = h.commit_lag.total_seconds() if h.commit_lag else 0.0
        return FleetTotals(
            stores=self.stores + 1,
            broken_stores=self.broken_stores + (status is StoreStatus.BROKEN),
            degraded_stores=self.degraded_stores + (status is StoreStatus.DEGRADED),
            unknown_stores=self.unknown_stores + (status is StoreStatus.UNKNOWN),
            state_rows=self.state_rows + h.state_rows,
            live_bytes=self.live_bytes + h.live_bytes,
            orphan_files=self.orphan_files + h.orphan_files,
            orphan_bytes=self.orphan_bytes + h.orphan_bytes,
            reclaimable_bytes=self.reclaimable_bytes + h.reclaimable_bytes,
            max_deltas_since_snapshot=max(self.max_deltas_since_snapshot, h.deltas_since_snapshot),
            max_recovery_bytes=max(self.max_recovery_bytes, r.recovery.bytes),
            max_commit_lag_seconds=max(self.max_commit_lag_seconds, lag),
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
