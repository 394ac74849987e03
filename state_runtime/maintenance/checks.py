"""The platform's checks: lineage validity, retention within policy, snapshot lag, orphan growth,
and each store's status.

:data:`CHECKS` declares them, with how each is evaluated: :func:`run_checks` and Dagster's
check specs are both built from it. :func:`run_checks` validates the stores, reads their
health and status, evaluates the fleet-wide checks and records a 'validate' run whose counts
(orphan totals among them) the next run compares with. The CLI's ``validate`` and Dagster's
asset checks both call it.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from state_runtime.catalog import RunKind, StoreKey, Verdict
from state_runtime.errors import MaintenanceRefused
from state_runtime.maintenance.cleanup import plan_pages
from state_runtime.maintenance.fleet import Fleet, format_store_key, key_set
from state_runtime.maintenance.health import (
    FleetTotals,
    HealthSpool,
    StoreReport,
    store_report_pages,
)
from state_runtime.maintenance.policy import MaintenancePolicy, format_duration
from state_runtime.maintenance.progress import SILENT, Progress
from state_runtime.maintenance.runs import recorded_run
from state_runtime.maintenance.spread import Spread
from state_runtime.maintenance.validation import (
    FINDINGS_KEPT,
    Finding,
    Severity,
    ValidationReport,
    validate_stores,
)
from state_runtime.status import StoreStatus


class CheckName(StrEnum):
    LINEAGE = "lineage_valid"
    RETENTION = "retention_within_policy"
    SNAPSHOT_LAG = "snapshot_lag"
    ORPHAN_GROWTH = "orphan_growth"
    STORE_STATUS = "store_status"
    COMMIT_LAG = "commit_lag"


@dataclass(frozen=True)
class CheckOutcome:
    """A check's verdict: passed, or failed with a severity, a summary and the findings."""

    name: CheckName
    passed: bool
    severity: Severity
    summary: str
    findings: list[Finding] = field(default_factory=list)
    figures: Mapping[str, float] = field(default_factory=dict)

    @property
    def headline(self) -> str:
        """The summary without the first finding it may quote: for a view that lists the
        findings themselves (the CLI prints each below its table)."""
        return self.summary.partition(FIRST_FINDING)[0]


FIRST_FINDING = "; first: "
"""Where a summary quotes its first finding (for a view that shows only the summary: a
Dagster description, an Airflow log line)."""


@dataclass(frozen=True)
class CheckInputs:
    """What one validation pass gathered, for every check to judge."""

    fleet: Fleet
    policy: MaintenancePolicy
    only: Collection[StoreKey] | None
    now: datetime | None
    validation: ValidationReport
    health: HealthSpool
    previous: dict[str, Any] | None


def lineage_check(validation: ValidationReport) -> CheckOutcome:
    """Fails when validation found a problem; its findings are the report's first
    :data:`~state_runtime.maintenance.validation.FINDINGS_KEPT` (the summary counts all)."""
    counts = validation.counts()
    errors = validation.errors
    summary = (
        f"{counts['stores']} stores, {counts['versions']} retained versions and "
        f"{counts['files']} files read and verified"
        + (f", {counts['files_present']} more found present" if counts["files_present"] else "")
        if validation.ok
        else f"{counts['errors']} problem(s) in {counts['stores_with_errors']} store(s)"
        f"{FIRST_FINDING}{errors[0]}"
    )
    return CheckOutcome(
        CheckName.LINEAGE, validation.ok, Severity.ERROR, summary, errors, dict(counts)
    )


def snapshot_lag_check(reports: Iterable[StoreReport], policy: MaintenancePolicy) -> CheckOutcome:
    """Fails with WARN at ``lag_warn_deltas`` deltas since the last snapshot, ERROR at
    ``lag_error_deltas``. A broken store is left out: its chain does not load as counted
    (its finding is the lineage check's, with the next command). One pass over a stream of
    any length: the findings are the :data:`FINDINGS_KEPT` longest chains (the summary and
    figures count every store over)."""
    over: list[tuple[int, str, StoreReport]] = []  # a heap: the shortest kept chain first
    worst = count = errors = 0
    for report in reports:
        if report.status.status is StoreStatus.BROKEN:
            continue
        lag = report.health.deltas_since_snapshot
        worst = max(worst, lag)
        if lag < policy.lag_warn_deltas:
            continue
        count += 1
        errors += lag >= policy.lag_error_deltas
        entry = (lag, str(report.key), report)
        if len(over) < FINDINGS_KEPT:
            heapq.heappush(over, entry)
        elif entry[:2] > over[0][:2]:
            heapq.heapreplace(over, entry)
    findings = [
        Finding(
            report.key,
            Severity.ERROR if lag >= policy.lag_error_deltas else Severity.WARNING,
            f"{lag} deltas since the last snapshot (version "
            f"{report.health.last_snapshot_version}); a cold load reads "
            f"{report.recovery.files} files, {report.recovery.bytes} bytes",
            version=report.health.latest.version,
        )
        for lag, _, report in sorted(over, key=lambda e: (-e[0], e[1]))
    ]
    severity = Severity.ERROR if errors else Severity.WARNING
    summary = (
        f"longest chain {worst} deltas (warn at {policy.lag_warn_deltas}, error at "
        f"{policy.lag_error_deltas}); {count} store(s) over"
    )
    figures = {"max_deltas_since_snapshot": worst, "stores_over_threshold": count}
    return CheckOutcome(CheckName.SNAPSHOT_LAG, not count, severity, summary, findings, figures)


def retention_check(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    only: Collection[StoreKey] | None = None,
    now: datetime | None = None,
) -> CheckOutcome:
    """The configured retention respects the safety floor, and cleanup keeps up: no file has
    been deletable for longer than ``overdue_after``. The plan is read a page of stores at a
    time; the findings are the first :data:`FINDINGS_KEPT` stores by name (the summary and
    figures count them all)."""
    try:
        policy.check_retention()
    except MaintenanceRefused as exc:
        return CheckOutcome(CheckName.RETENTION, False, Severity.ERROR, exc.reason)
    now = now or fleet.catalog.now()  # the database's clock, as cleanup's
    retention = policy.retention
    stores = 0
    kept: list[tuple[StoreKey, int, str]] = []  # the first FINDINGS_KEPT by name
    for page in plan_pages(fleet, policy, only=key_set(only), now=now):  # a store in one page
        overdue: dict[StoreKey, tuple[int, str]] = {}  # store -> (files, the first one)
        for verdict in page:
            committed = verdict.verdict is Verdict.DELETABLE_SUPERSEDED
            cutoff = (
                retention.committed_cutoff(now) if committed else retention.uncommitted_cutoff(now)
            )
            if verdict.file.facts().aged_from < cutoff - policy.overdue_after:
                files, first = overdue.get(verdict.file.key, (0, verdict.file.path))
                overdue[verdict.file.key] = (files + 1, first)
        stores += len(overdue)
        kept = heapq.nsmallest(
            FINDINGS_KEPT,
            [*kept, *((k, *found) for k, found in overdue.items())],
            key=lambda e: str(e[0]),
        )
    findings = [
        Finding(
            key,
            Severity.WARNING,
            f"{files} file(s) deletable for more than {policy.overdue_after}: cleanup is "
            "not keeping up",
            path=first,
        )
        for key, files, first in kept
    ]
    summary = (
        f"retention: last {retention.retain_versions} versions, window {retention.window}; "
        f"{stores} store(s) with overdue deletions"
    )
    figures = {"stores_with_overdue_files": stores}
    return CheckOutcome(
        CheckName.RETENTION, not stores, Severity.WARNING, summary, findings, figures
    )


def orphan_growth_check(
    totals: FleetTotals, previous: dict[str, Any] | None, policy: MaintenancePolicy
) -> CheckOutcome:
    """Warns when orphan files grew by more than ``orphan_growth_warn_files`` since the
    previous validation of the same scope."""
    before = None if previous is None else previous.get("orphan_files")
    growth = 0 if before is None else totals.orphan_files - int(before)
    passed = growth <= policy.orphan_growth_warn_files
    summary = f"{totals.orphan_files} orphan files ({totals.orphan_bytes} bytes)" + (
        "; first validation of this scope"
        if before is None
        else f", {growth:+d} since the last validation"
    )
    figures = {
        "orphan_files": totals.orphan_files,
        "orphan_bytes": totals.orphan_bytes,
        "orphan_growth": growth,
    }
    return CheckOutcome(CheckName.ORPHAN_GROWTH, passed, Severity.WARNING, summary, [], figures)


@dataclass(frozen=True)
class StoreVerdict:
    """A per-store check's verdict on one store."""

    passed: bool
    severity: Severity
    summary: str


def status_verdict(report: StoreReport, _policy: MaintenancePolicy) -> StoreVerdict:
    """ERROR for a broken store, WARN for a degraded or unknown one."""
    status = report.status.status
    severity = Severity.ERROR if status is StoreStatus.BROKEN else Severity.WARNING
    return StoreVerdict(status is StoreStatus.HEALTHY, severity, str(report.status))


def commit_lag_verdict(report: StoreReport, policy: MaintenancePolicy) -> StoreVerdict:
    """WARN when the store's last commit is older than ``commit_lag_warn`` (a freshness
    signal: the stream stopped writing, or moved elsewhere)."""
    lag, limit = report.health.commit_lag, policy.commit_lag_warn
    if lag is None:
        return StoreVerdict(True, Severity.WARNING, "nothing committed yet")
    passed = lag <= limit
    ago = format_duration(timedelta(seconds=int(lag.total_seconds())))
    summary = f"last commit {ago} ago (warn after {format_duration(limit)})"
    return StoreVerdict(
        passed, Severity.WARNING, summary + ("" if passed else ": has its stream stopped?")
    )


@dataclass(frozen=True)
class CheckInfo:
    """A check as the platform declares it: what it asserts, whether a failure must block
    what depends on it (the cleanup), and how a validation pass evaluates it: fleet-wide
    (``evaluate``) or per store (``judge``, once for each store)."""

    name: CheckName
    description: str
    evaluate: Callable[[CheckInputs], CheckOutcome] | None = None
    blocking: bool = False
    judge: Callable[[StoreReport, MaintenancePolicy], StoreVerdict] | None = None

    @property
    def per_store(self) -> bool:
        return self.judge is not None


CHECKS = (
    CheckInfo(
        CheckName.LINEAGE,
        "Every retained committed version is loadable: its files exist with the recorded "
        "sizes and checksums, its lineage is contiguous, the commit log is linear. A failure "
        "blocks the cleanup that depends on it.",
        lambda i: lineage_check(i.validation),
        blocking=True,
    ),
    CheckInfo(
        CheckName.RETENTION,
        "The retention keeps at least 2 versions and a window no shorter than the minimum, "
        "and cleanup keeps up (nothing stays deletable for long).",
        lambda i: retention_check(i.fleet, i.policy, only=i.only, now=i.now),
    ),
    CheckInfo(
        CheckName.SNAPSHOT_LAG,
        "Deltas since each store's last verified snapshot stay under the thresholds.",
        lambda i: snapshot_lag_check(i.health, i.policy),
    ),
    CheckInfo(
        CheckName.ORPHAN_GROWTH,
        "Orphan files do not pile up between validations.",
        lambda i: orphan_growth_check(i.health.totals, i.previous, i.policy),
    ),
    CheckInfo(
        CheckName.STORE_STATUS,
        "Each store's status after validation: ERROR when broken (an open problem: a missing "
        "or damaged file, a broken lineage), WARN when degraded (snapshot lag, orphans).",
        judge=status_verdict,
    ),
    CheckInfo(
        CheckName.COMMIT_LAG,
        "Each store's freshness: WARN when its last commit is older than commit_lag_warn "
        "(its stream may have stopped writing).",
        judge=commit_lag_verdict,
    ),
)
"""The one registry of checks: :func:`run_checks` evaluates each (the fleet-wide ones as
outcomes, the per-store ones on each store's health) and Dagster's check specs are built from
it. Adding a check is one entry here."""


@dataclass
class ChecksReport:
    """A validation run's checks; ``health`` the stores' reports its checks judged, kept a
    page at a time (:class:`HealthSpool`): a consumer reads them back page by page
    (``health.pages()``), holding a page, never the fleet."""

    run_id: int
    validation: ValidationReport
    health: HealthSpool
    outcomes: list[CheckOutcome]

    def summary(self) -> str:
        """The run in one line: the stores validated and the checks that failed."""
        failed = [o.name.value for o in self.outcomes if not o.passed]
        return f"validation run {self.run_id}: {self.health.stores} store(s); " + (
            f"failed checks: {', '.join(failed)}" if failed else "every check passed"
        )

    def rows(self) -> list[dict[str, Any]]:
        """One row per store: its status, its validation errors and ``detail`` in words (a
        task's result over its chunk of stores)."""
        problems: dict[str, list[str]] = {}
        for finding in self.validation.errors:
            problems.setdefault(str(finding.key), []).append(str(finding))
        return [
            {
                "store": str(r.key),
                "status": r.status.status.value,
                "problems": problems.get(str(r.key), []),
                "detail": str(r.status),
            }
            for r in self.health
        ]

    def check_rows(self) -> list[dict[str, Any]]:
        """One row per check: passed, severity, its summary and the stores that fail it."""
        return [
            {"check": o.name.value} | {k: v for k, v in outcome_record(o).items() if k != "figures"}
            for o in self.outcomes
        ]

    def outcome(self, name: CheckName) -> CheckOutcome:
        return next(o for o in self.outcomes if o.name is name)

    @property
    def ok(self) -> bool:
        """No check failed with ERROR severity."""
        return all(o.passed or o.severity is Severity.WARNING for o in self.outcomes)


def scope_of(fleet: Fleet, only: Collection[StoreKey] | None) -> str:
    """A stable description of what a run covers, so runs over the same stores compare."""
    if only is not None:
        return "stores:" + ",".join(sorted(format_store_key(k) for k in only))
    return "all" if fleet.roots is None else "roots:" + ",".join(sorted(fleet.roots))


def outcome_record(outcome: CheckOutcome) -> dict[str, Any]:
    """A check's verdict as a run's counts keep it (JSON): passed, severity, summary, figures
    and the stores that fail."""
    return {
        "passed": outcome.passed,
        "severity": outcome.severity.value,
        "summary": outcome.summary,
        "figures": dict(outcome.figures),
        "failing_stores": sorted({str(f.key) for f in outcome.findings}),
    }


def run_checks(
    fleet: Fleet,
    policy: MaintenancePolicy,
    *,
    only: Collection[StoreKey] | None = None,
    now: datetime | None = None,
    progress: Progress = SILENT,
    workers: int | None = None,
    sampler: random.Random | None = None,
    spread: Spread | None = None,
) -> ChecksReport:
    """Validate, read health, evaluate every check of :data:`CHECKS`; one recorded
    'validate' run (``sampler``, ``spread``: :func:`validate_stores`'). Its health read records the
    status changes of the stores it validated (from the facts it reads), so its close does
    not record them again."""
    scope = scope_of(fleet, only)
    parameters = policy.parameters() | {"scope": scope}
    with recorded_run(fleet.catalog, RunKind.VALIDATE, fleet.owner, parameters, None) as run:
        validation = validate_stores(
            fleet,
            policy,
            only=only,
            progress=progress,
            workers=workers,
            run_id=run.run_id,
            sampler=sampler,
            spread=spread,
        )
        health = HealthSpool.of(store_report_pages(fleet, policy, only=only, now=now))
        totals = health.totals
        previous = fleet.catalog.previous_run_counts(RunKind.VALIDATE, scope, run.run_id)
        inputs = CheckInputs(fleet, policy, only, now, validation, health, previous)
        outcomes = [check.evaluate(inputs) for check in CHECKS if check.evaluate is not None]
        run.counts = validation.counts() | {
            "orphan_files": totals.orphan_files,
            "orphan_bytes": totals.orphan_bytes,
            "failed_checks": [o.name.value for o in outcomes if not o.passed],
            # each check's verdict, for readers of the run (Dagster's catalog sensor)
            "checks": {o.name.value: outcome_record(o) for o in outcomes},
        }
    return ChecksReport(run.run_id, validation, health, outcomes)
