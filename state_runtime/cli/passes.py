"""The maintenance passes, ``maintain`` (snapshots, then cleanup) and ``validate``, with
their printers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from state_runtime.cli.group import (
    RETENTION,
    Settings,
    emit,
    emit_part,
    exit_after,
    json_option,
    open_fleet,
    policy_of,
    policy_options,
    spark_options,
    spread_of,
    store_option,
    stores_of,
)
from state_runtime.cli.printing import SHOWN, print_leftovers, print_rows, show
from state_runtime.maintenance import (
    ChecksReport,
    CleanupReport,
    DueStore,
    SnapshotReport,
    cleanup_pass,
    due_for_snapshot,
    run_checks,
    snapshot_pass,
)


@click.command()
@click.option("--dry-run/--execute", default=True, help="Only show what cleanup would delete.")
@click.option("--snapshots/--no-snapshots", default=True, help="Write due snapshots.")
@click.option("--cleanup/--no-cleanup", default=True, help="Delete what retention allows.")
@json_option
@store_option
@policy_options(
    "snapshot_min_deltas", "snapshots_per_run", *RETENTION, "min_window", "workers", "processes"
)
@spark_options
@click.pass_obj
def maintain(settings: Settings, /, **kw: Any) -> None:
    """Write due snapshots, then clean up (a dry run unless --execute).

    The per-store work runs in worker processes, one per CPU, when the catalog is
    PostgreSQL and the pass is large (--processes N for another count, 1 for threads
    here; SQLite's file has one writer: threads). With --on-spark the
    snapshots and the deletions run as Spark tasks (a dry run reads only the catalog: it
    runs here)."""
    policy = policy_of(settings, kw)
    done: dict[str, Any] = {}
    failed = False
    with open_fleet(settings, storage=True) as fleet:
        only = stores_of(fleet, kw["stores"])
        if kw["cleanup"]:
            policy.check_retention()  # refuse before doing anything
        spread = None if kw["dry_run"] else spread_of(settings, kw, "maintain")
        if kw["snapshots"] and not kw["dry_run"]:
            snaps = snapshot_pass(
                fleet, policy, only=only, progress=settings.progress, spread=spread
            )
            done["snapshots"] = snaps
            emit_part(snaps, print_snapshots)
            failed |= bool(snaps.failed)
        elif kw["snapshots"]:
            due = due_for_snapshot(fleet, policy, only)
            done["due_snapshots"] = due
            emit_part(due, print_due_snapshots)
        if kw["cleanup"]:
            report = cleanup_pass(
                fleet,
                policy,
                dry_run=kw["dry_run"],
                only=only,
                progress=settings.progress,
                spread=spread,
            )
            done["cleanup"] = report
            emit_part(report, print_cleanup)
            failed |= bool(report.failed)
    done["failed_roots"] = fleet.failed_roots
    emit({"policy": policy.parameters(), "dry_run": kw["dry_run"]} | done, None)
    exit_after(fleet, failed)


@click.command()
@click.option("--full", is_flag=True, help="Read every file (as --verify-sample-percent 100).")
@json_option
@store_option
@policy_options(*RETENTION, "min_window", "verify_sample_percent", "workers", "processes")
@spark_options
@click.pass_obj
def validate(settings: Settings, /, **kw: Any) -> None:
    """Check that every retained version loads: files, sizes, checksums, lineage, commit log.

    Reads the files new or not intact since the last run and a sample of the others
    (--verify-sample-percent); the rest are checked present. --full reads every file.
    The stores are validated in worker processes, one per CPU, when the catalog is
    PostgreSQL and the fleet is large (--processes N for another count, 1 for threads
    here), else in threads; with --on-spark in Spark tasks."""
    if kw["full"]:
        kw["verify_sample_percent"] = 100
    policy = policy_of(settings, kw)
    with open_fleet(settings, storage=True) as fleet:
        only = stores_of(fleet, kw["stores"])
        spread = spread_of(settings, kw, "validate")
        report = run_checks(fleet, policy, only=only, progress=settings.progress, spread=spread)
    emit(report, print_checks, as_json=checks_json)
    exit_after(fleet, not report.ok)


def print_due_snapshots(console: Console, due: Sequence[DueStore]) -> None:
    console.print(f"snapshots (dry run): {len(due)} store(s) due")
    for store in due[:SHOWN]:
        console.print(
            f"  {store.record.key}: {store.deltas_since_snapshot} deltas since the last snapshot"
        )
    if len(due) > SHOWN:
        console.print(f"  ... and {len(due) - SHOWN} more")


def print_snapshots(console: Console, report: SnapshotReport) -> None:
    """The report's summary, then the stores whose snapshot failed."""
    console.print(report.summary(), markup=False)
    print_rows(console, [r for r in report.rows() if r["status"] == "failed"])


def print_cleanup(console: Console, report: CleanupReport) -> None:
    """The report's summary, then its stores with their files; the unfinished writes."""
    console.print(report.summary(), markup=False)
    print_rows(console, report.rows(), listed="files")
    for path, error in list(report.failed.items())[:SHOWN]:
        console.print(f"  [red]failed[/red] {path}: {error}")
    print_leftovers(console, report.leftovers)
    if report.dry_run and (report.planned or report.leftovers.removed):
        console.print("Run with --execute to delete them.")


def print_checks(console: Console, report: ChecksReport) -> None:
    table = Table(title=report.summary())
    for name in ("check", "result", "summary"):
        table.add_column(name)
    for o in report.outcomes:
        result = (
            "[green]passed[/green]"
            if o.passed
            else ("[red]ERROR[/red]" if o.severity.value == "error" else "[yellow]WARN[/yellow]")
        )
        table.add_row(o.name.value, result, o.headline if o.findings else o.summary)
    show(console, table)
    for o in report.outcomes:
        for finding in o.findings[:SHOWN]:
            console.print(f"  {finding.severity.value}: {finding}", soft_wrap=True)
        if len(o.findings) > SHOWN:
            console.print(f"  ... and {len(o.findings) - SHOWN} more ({o.name.value})")


def checks_json(report: ChecksReport) -> dict[str, Any]:
    return {
        "run_id": report.run_id,
        "ok": report.ok,
        "checks": [
            {
                "name": o.name.value,
                "passed": o.passed,
                "severity": o.severity.value,
                "summary": o.summary,
                "figures": dict(o.figures),
                "findings": [
                    {
                        "store": str(f.key),
                        "severity": f.severity.value,
                        "problem": f.problem,
                        "path": f.path,
                        "version": f.version,
                        "fate": None if f.damage is None else f.damage.fate.value,
                        "command": None if f.damage is None else f.damage.command,
                    }
                    for f in o.findings
                ],
            }
            for o in report.outcomes
        ],
    }
