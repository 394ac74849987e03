"""Maintenance reports as Airflow shows them: a JSON-able XCom value per task (a summary line,
the run's counts and one row per store) and one log line per store, the same words in both."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from state_runtime.catalog import FileVerdict
from state_runtime.maintenance import (
    ChecksReport,
    CleanupReport,
    RepairReport,
    RestorePlan,
    SnapshotReport,
    StoreReport,
)
from state_runtime.units import size

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


def snapshot_result(report: SnapshotReport) -> Result:
    rows = [
        {
            "store": str(o.key),
            "status": o.status.value,
            "version": o.version,
            "deltas_before": o.deltas_since_snapshot,
            "bytes": o.bytes,
            "detail": f"{o.status.value} at version {o.version} "
            f"({o.deltas_since_snapshot} deltas since the last snapshot"
            + (f", {o.bytes} bytes" if o.bytes else "")
            + ")"
            + (f": {o.error}" if o.error else ""),
        }
        for o in report.outcomes
    ]
    counts = report.counts()
    summary = (
        f"snapshot run {report.run_id}: {counts['written']} written, {counts['failed']} failed, "
        f"{counts['busy']} busy, {counts['up_to_date']} up to date"
    )
    return result(summary, report.run_id, counts, rows)


def checks_result(report: ChecksReport) -> Result:
    checks: list[Result] = [
        {
            "check": o.name.value,
            "passed": o.passed,
            "severity": o.severity.value,
            "summary": o.summary,
            "failing_stores": sorted({str(f.key) for f in o.findings}),
        }
        for o in report.outcomes
    ]
    problems: dict[str, list[str]] = defaultdict(list)
    for finding in report.validation.errors:
        problems[str(finding.key)].append(str(finding))
    rows = [
        {
            "store": str(r.key),
            "status": r.status.status.value,
            "problems": problems.get(str(r.key), []),
            "detail": str(r.status),
        }
        for r in report.health
    ]
    failed = [o.name.value for o in report.outcomes if not o.passed]
    summary = f"validation run {report.run_id}: {len(rows)} store(s); " + (
        f"failed checks: {', '.join(failed)}" if failed else "every check passed"
    )
    found = result(summary, report.run_id, report.validation.counts(), rows)
    found["checks"] = checks
    return found


def cleanup_result(report: CleanupReport) -> Result:
    by_store: dict[str, list[FileVerdict]] = defaultdict(list)
    for verdict in report.planned:
        by_store[str(verdict.file.key)].append(verdict)
    deleted: dict[str, int] = defaultdict(int)
    for verdict in report.deleted:
        deleted[str(verdict.file.key)] += 1
    held = {str(h.key): h for h in report.held}
    rows = []
    for store in sorted(set(by_store) | set(held)):
        planned = by_store.get(store, [])
        words = f"{len(planned)} file(s) deletable, {sum(v.file.size_bytes for v in planned)} bytes"
        if not report.dry_run:
            words += f"; {deleted.get(store, 0)} deleted"
        if store in held:
            words += f"; held since {held[store].since.isoformat(timespec='seconds')}: "
            words += held[store].reason
        rows.append(
            {
                "store": store,
                "planned_files": len(planned),
                "deleted_files": deleted.get(store, 0),
                "held": held[store].reason if store in held else None,
                "files": [f"{v.file.path}: {v.reason}" for v in planned[:20]],
                "detail": words,
            }
        )
    counts = report.counts()
    verb = "would delete" if report.dry_run else "deleted"
    done = counts["planned_files"] if report.dry_run else counts["deleted_files"]
    summary = (
        f"cleanup{' (dry run)' if report.dry_run else f' run {report.run_id}'}: {verb} "
        f"{done} file(s); {counts['held_stores']} store(s) held, {counts['busy_stores']} busy"
    )
    return result(summary, report.run_id, counts | {"dry_run": report.dry_run}, rows)


def damaged_result(damaged: Sequence[FileVerdict]) -> Result:
    rows = [
        {"store": str(v.file.key), "path": v.file.path, "detail": f"{v.file.path}: {v.reason}"}
        for v in damaged
    ]
    summary = f"repair (dry run): {len(rows)} damaged snapshot(s) would be rebuilt"
    return result(summary, None, {"damaged_snapshots": len(rows), "dry_run": True}, rows)


def repair_result(report: RepairReport) -> Result:
    rows = [
        {
            "store": str(o.key),
            "path": o.path,
            "status": o.status.value,
            "detail": f"{o.status.value} {o.path} (version {o.version}): {o.detail}",
        }
        for o in report.outcomes
    ]
    counts = report.counts()
    summary = (
        f"repair run {report.run_id}: {counts['repaired']} repaired, {counts['adopted']} adopted, "
        f"{len(report.failed)} failed or unrepairable"
    )
    return result(summary, report.run_id, counts, rows)


def restore_result(plan: RestorePlan) -> Result:
    lost = {str(x.key): x for x in plan.lost}
    rows = [
        {
            "store": f"{plan.root}#{store}",
            "version": ref.version,
            "detail": f"returns to version {ref.version}"
            + (
                f"; LOST, starts again from empty: {lost[f'{plan.root}#{store}'].problem}"
                if f"{plan.root}#{store}" in lost
                else ""
            ),
        }
        for store, ref in sorted(plan.targets.items(), key=lambda kv: str(kv[0]))
    ]
    what = f"restored by run {plan.run_id}" if plan.executed else "would be restored (dry run)"
    summary = (
        f"query {plan.query_id} below {plan.root}: batch {plan.last_batch} -> {plan.batch_id} "
        f"{what}; {len(plan.superseded)} later commit(s) superseded"
    )
    return result(summary, plan.run_id, plan.counts() | {"dry_run": not plan.executed}, rows)


def health_result(reports: Sequence[StoreReport]) -> Result:
    rows = [
        {"store": str(r.key), **r.status_fields(), **r.figures(), "detail": str(r.status)}
        for r in sorted(reports, key=lambda r: str(r.key))
    ]
    counts: dict[str, int] = defaultdict(int)
    for r in reports:
        counts[r.status.status.value] += 1
    summary = f"health: {len(rows)} store(s): " + (
        ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none"
    )
    return result(summary, None, dict(counts), rows)


def repartition_result(plan: RepartitionPlan) -> Result:
    """One row per new store: the rows and bytes it receives, and its operator's skew."""
    rows = []
    for figure in sorted(plan.figures, key=lambda f: (f.operator_id, f.store_name, f.partition)):
        skew = plan.skew(figure.operator_id, figure.store_name)
        rows.append(
            {
                "store": f"{plan.root}#{figure.operator_id}/{figure.partition}/{figure.store_name}",
                "rows": figure.rows,
                "bytes": figure.bytes,
                "detail": f"{figure.rows} rows, {size(figure.bytes)}"
                + ("" if skew is None else f" (operator skew {skew:.2f})"),
            }
        )
    what = f"repartitioned by run {plan.run_id}" if plan.executed else "would be repartitioned"
    summary = (
        f"query {plan.query_id} below {plan.root} at batch {plan.batch_id}: "
        f"{plan.layout_change()} {what}" + ("" if plan.executed else " (dry run)")
    )
    return result(summary, plan.run_id, plan.counts() | {"dry_run": not plan.executed}, rows)
