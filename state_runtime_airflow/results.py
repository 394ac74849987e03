"""Maintenance reports as Airflow shows them: a JSON-able XCom value per task (a summary line,
the run's counts and one row per store) and one log line per store, the same words in both."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from state_runtime.maintenance import (
    ChecksReport,
    CleanupReport,
    RebuildPlan,
    RepairReport,
    RestorePlan,
    SnapshotReport,
    StoreReport,
    health_rows,
    health_summary,
)

if TYPE_CHECKING:  # pyspark stays out of the DAG processor's imports
    from state_runtime.maintenance.repartition import RepartitionPlan

Result = dict[str, Any]
"""A task's XCom value: ``summary``, ``run_id``, ``counts`` and ``stores`` (rows with a
``store`` and a ``detail`` in words, plus the figures of the pass)."""


def result(
    summary: str, run_id: int | None, counts: dict[str, Any], stores: list[Result]
) -> Result:
    return {"summary": summary, "run_id": run_id, "counts": counts, "stores": stores}


def log_lines(found: Result) -> list[str]:
    """The lines a person reads in the task log: the summary, then one line per store."""
    return [found["summary"], *(f"  {row['store']}: {row['detail']}" for row in found["stores"])]


def failure(what: str, rows: list[Result]) -> str | None:
    """The message a task fails with (None when nothing failed): each failed row in its
    report's words."""
    if not rows:
        return None
    return f"{what}: {len(rows)} failed: " + "; ".join(
        f"{row['store']}: {row['detail']}" for row in rows
    )


def snapshot_result(report: SnapshotReport) -> Result:
    return result(report.summary(), report.run_id, report.counts(), report.rows())


def checks_result(report: ChecksReport) -> Result:
    found = result(report.summary(), report.run_id, report.validation.counts(), report.rows())
    found["checks"] = report.check_rows()
    return found


def cleanup_result(report: CleanupReport) -> Result:
    counts = report.counts() | {"dry_run": report.dry_run}
    return result(report.summary(), report.run_id, counts, report.rows())


def rebuild_result(plan: RebuildPlan) -> Result:
    return result(plan.summary(), None, plan.counts() | {"dry_run": True}, plan.rows())


def repair_result(report: RepairReport) -> Result:
    return result(report.summary(), report.run_id, report.counts(), report.rows())


def restore_result(plan: RestorePlan) -> Result:
    counts = plan.counts() | {"dry_run": not plan.executed}
    return result(plan.summary(), plan.run_id, counts, plan.rows())


def health_result(reports: Sequence[StoreReport]) -> Result:
    counts = Counter(r.status.status.value for r in reports)
    return result(health_summary(reports), None, dict(counts), health_rows(reports))


def repartition_result(plan: RepartitionPlan) -> Result:
    """One row per new store: the rows and bytes it receives, and its operator's skew."""
    counts = plan.counts() | {"dry_run": not plan.executed}
    return result(plan.summary(), plan.run_id, counts, plan.rows())
