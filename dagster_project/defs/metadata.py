"""Maintenance reports as Dagster metadata: numbers to plot, tables and markdown to read."""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeAlias

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

from state_runtime.catalog import Layout
from state_runtime.maintenance import (
    CheckOutcome,
    CleanupReport,
    Finding,
    FleetTotals,
    RebuildPlan,
    ReconcileReport,
    RepairReport,
    SchemaChangeRow,
    SnapshotReport,
    StoreNames,
    StoreReport,
)
from state_runtime.units import age, size

if TYPE_CHECKING:
    from state_runtime.maintenance.repartition import RepartitionPlan

Meta: TypeAlias = MetadataValue[Any]
MetadataMap: TypeAlias = dict[str, Meta]

TABLE_ROWS = 500  # rows of a metadata table; the rest are counted, not shown
MD_ROWS = 50

STORE_COLUMNS = (
    "status",
    "latest_version",
    "commit_lag",
    "deltas_since_snapshot",
    "recovery_files",
    "recovery_size",
    "state_rows",
    "live_files",
    "live_size",
    "orphan_files",
    "reclaimable_size",
)
TEXT_COLUMNS = {"status", "commit_lag", "recovery_size", "live_size", "reclaimable_size"}


def _cells(values: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in values]
    return "\n".join(lines)


def _more(total: int, shown: int) -> str:
    return f"\n\n... and {total - shown} more" if total > shown else ""


def longest_chains(reports: Sequence[StoreReport]) -> list[StoreReport]:
    """The stores a table shows: the longest delta chains first, at most ``TABLE_ROWS``."""
    return heapq.nsmallest(
        TABLE_ROWS, reports, key=lambda r: (-r.health.deltas_since_snapshot, str(r.key))
    )


def store_table(reports: Sequence[StoreReport], names: StoreNames) -> Meta:
    """The stores with the longest delta chains first, as a table (sizes and lags in units)."""
    ordered = longest_chains(reports)
    schema = TableSchema(
        columns=[TableColumn("store", "string"), TableColumn("root", "string")]
        + [TableColumn(name, "string" if name in TEXT_COLUMNS else "int") for name in STORE_COLUMNS]
    )
    records = [
        TableRecord(
            {"store": names.name(r.key), "root": r.key.root}
            | {k: v for k, v in _shown(r).items() if k in STORE_COLUMNS}
        )
        for r in ordered
    ]
    return MetadataValue.table(records, schema)


def _shown(report: StoreReport) -> dict[str, str | int]:
    """A store's figures as the table shows them: counts as numbers, sizes and the lag in
    units (``live_bytes`` as ``live_size``, ``commit_lag_seconds`` as ``commit_lag``)."""
    shown: dict[str, str | int] = {"status": report.status.status.value}
    for name, value in report.figures().items():
        if name.endswith("_bytes"):
            shown[name.removesuffix("_bytes") + "_size"] = size(value)
        elif name.endswith("_seconds"):
            shown[name.removesuffix("_seconds")] = _lag(value)
        else:
            shown[name] = int(value)
    return shown


def _lag(seconds: float) -> str:
    return "never" if seconds < 0 else age(timedelta(seconds=seconds))


def totals_metadata(totals: FleetTotals) -> MetadataMap:
    """Fleet figures (plotted over time on the asset's page: numbers, with the unit in the
    name), and the sizes and lag in units to read."""
    return {
        "stores": MetadataValue.int(totals.stores),
        "broken_stores": MetadataValue.int(totals.broken_stores),
        "degraded_stores": MetadataValue.int(totals.degraded_stores),
        "unknown_stores": MetadataValue.int(totals.unknown_stores),
        "state_rows": MetadataValue.int(totals.state_rows),
        "live_bytes": MetadataValue.int(totals.live_bytes),
        "live_size": MetadataValue.text(size(totals.live_bytes)),
        "orphan_files": MetadataValue.int(totals.orphan_files),
        "orphan_bytes": MetadataValue.int(totals.orphan_bytes),
        "reclaimable_bytes": MetadataValue.int(totals.reclaimable_bytes),
        "reclaimable_size": MetadataValue.text(size(totals.reclaimable_bytes)),
        "max_deltas_since_snapshot": MetadataValue.int(totals.max_deltas_since_snapshot),
        "max_recovery_bytes": MetadataValue.int(totals.max_recovery_bytes),
        "max_recovery_size": MetadataValue.text(size(totals.max_recovery_bytes)),
        "max_commit_lag_seconds": MetadataValue.float(round(totals.max_commit_lag_seconds, 1)),
        "max_commit_lag": MetadataValue.text(_lag(totals.max_commit_lag_seconds)),
    }


def store_figures(report: StoreReport, names: StoreNames) -> MetadataMap:
    """A store's status and figures (the metadata of its partition's materialization): each
    figure as a number (plotted across the stores) and the sizes also in units."""
    figures: MetadataMap = {}
    for name, value in report.figures().items():
        if isinstance(value, float):
            figures[name] = MetadataValue.float(round(value, 1))
        else:
            figures[name] = MetadataValue.int(value)
        if name.endswith("_bytes"):
            figures[name.removesuffix("_bytes") + "_size"] = MetadataValue.text(size(value))
    return status_metadata(report, names) | figures


def status_metadata(report: StoreReport, names: StoreNames) -> MetadataMap:
    """The store (its name, its root), its status, why and since when (as ``statestore
    health`` and SQL show it; ``status_since_recorded`` false: the facts' estimate, the
    change not recorded), and its commit lag."""
    metadata: MetadataMap = {
        "store": MetadataValue.text(names.name(report.key)),
        "root": MetadataValue.path(report.key.root),
        "status": MetadataValue.text(report.status.status.value),
        "status_reason": MetadataValue.text(report.status.reason),
    }
    if report.status.since is not None:
        metadata["status_since"] = MetadataValue.timestamp(report.status.since)
        metadata["status_since_recorded"] = MetadataValue.bool(report.status.recorded)
    lag = float(report.figures()["commit_lag_seconds"])
    metadata["commit_lag_seconds"] = MetadataValue.float(round(lag, 1))
    metadata["commit_lag"] = MetadataValue.text(_lag(lag))
    return metadata


def rows_md(rows: Sequence[Mapping[str, Any]], names: StoreNames, *columns: str) -> Meta:
    """A report's ``rows()`` as a table: the store by its name here, the named figures and the
    row's ``detail`` (the report's own words)."""
    cells = [
        (names.name(names.key(r["store"])), *(r[c] for c in columns), r["detail"])
        for r in rows[:MD_ROWS]
    ]
    return MetadataValue.md(
        _cells(cells, ("store", *columns, "detail")) + _more(len(rows), MD_ROWS)
    )


def snapshot_metadata(report: SnapshotReport, names: StoreNames) -> MetadataMap:
    return {
        "summary": MetadataValue.text(report.summary()),
        **{name: MetadataValue.int(n) for name, n in report.counts().items()},
        "catalog_run_id": MetadataValue.int(report.run_id),
        "outcomes": rows_md(report.rows(), names, "status"),
    }


def _files_md(rows: Sequence[Mapping[str, Any]]) -> Meta:
    columns = ("file", "bytes", "verdict", "reason")
    cells = [tuple(r[c] for c in columns) for r in rows[:MD_ROWS]]
    return MetadataValue.md(_cells(cells, columns) + _more(len(rows), MD_ROWS))


def cleanup_metadata(
    report: CleanupReport, parameters: Mapping[str, object], names: StoreNames
) -> MetadataMap:
    counts = report.counts()
    return {
        "summary": MetadataValue.text(report.summary()),
        "held": rows_md([r for r in report.rows() if r["held"] is not None], names),
        "dry_run": MetadataValue.bool(report.dry_run),
        **{name: MetadataValue.int(n) for name, n in counts.items()},
        "policy": MetadataValue.json(dict(parameters)),
        "catalog_run_id": MetadataValue.int(report.run_id or 0),
        ("would_delete" if report.dry_run else "deleted"): _files_md(report.file_rows()),
    }


def findings_md(findings: Sequence[Finding], names: StoreNames) -> Meta:
    rows = [(names.name(f.key), f.severity.value, f.path or "", f.said) for f in findings[:MD_ROWS]]
    return MetadataValue.md(
        _cells(rows, ("store", "severity", "file", "problem")) + _more(len(findings), MD_ROWS)
    )


def check_metadata(outcome: CheckOutcome, names: StoreNames) -> MetadataMap:
    metadata: MetadataMap = {
        name: MetadataValue.float(float(value)) for name, value in outcome.figures.items()
    }
    if outcome.findings:
        failing = sorted({names.name(f.key) for f in outcome.findings})
        metadata["failing_stores"] = MetadataValue.json(failing)
        metadata["findings"] = findings_md(outcome.findings, names)
        first = next((f.path for f in outcome.findings if f.path), None)
        if first is not None:
            metadata["first_file"] = MetadataValue.path(first)
    return metadata


def reconcile_metadata(report: ReconcileReport) -> MetadataMap:
    rows = report.rows()
    cells = [(r["path"], r["recorded_as"]) for r in rows[:MD_ROWS]]
    return {
        "summary": MetadataValue.text(report.summary()),
        "dry_run": MetadataValue.bool(report.dry_run),
        **{name: MetadataValue.int(n) for name, n in report.counts().items()},
        "files": MetadataValue.md(
            _cells(cells, ("file", "recorded as")) + _more(len(rows), MD_ROWS)
        ),
    }


def repair_metadata(report: RepairReport, names: StoreNames) -> MetadataMap:
    return {
        "summary": MetadataValue.text(report.summary()),
        **{name: MetadataValue.int(n) for name, n in report.counts().items()},
        "catalog_run_id": MetadataValue.int(report.run_id),
        "outcomes": rows_md(report.rows(), names, "status"),
    }


def rebuild_metadata(plan: RebuildPlan, names: StoreNames) -> MetadataMap:
    return {
        "summary": MetadataValue.text(plan.summary()),
        "dry_run": MetadataValue.bool(True),
        **{name: MetadataValue.int(n) for name, n in plan.counts().items()},
        "would_repair": rows_md(plan.rows(), names, "path"),
    }


def schema_metadata(changes: Sequence[SchemaChangeRow]) -> MetadataMap:
    """A store's schema history (its operator's): each schema with the batch it applies from
    and what changed, as ``statestore history --schemas`` shows it."""
    rows = [(c.from_batch, c.schema_id[:12], c.value_schema, "; ".join(c.actions)) for c in changes]
    return {
        "schema_versions": MetadataValue.int(len(changes)),
        "schema_history": MetadataValue.md(
            _cells(rows, ("from batch", "schema id", "value schema", "change"))
        ),
    }


def repartition_metadata(plan: RepartitionPlan) -> MetadataMap:
    """A repartition's plan or outcome: rows and bytes per new partition, the skew."""
    rows = [
        [f"{f.operator_id} ({f.store_name})", f.partition, f.rows, f.bytes] for f in plan.figures
    ]
    metadata: MetadataMap = {
        "summary": MetadataValue.text(plan.summary()),
        "query": MetadataValue.text(f"{plan.root} {plan.query_id}"),
        "batch": MetadataValue.int(plan.batch_id),
        "partitions": MetadataValue.int(plan.num_partitions),
        "executed": MetadataValue.bool(plan.executed),
        "new_partitions": MetadataValue.md(
            _cells(rows, ["operator", "partition", "rows", "bytes"])
        ),
    }
    for move in plan.moves:
        skew = plan.skew(move.operator_id, move.store_name)
        if skew is not None:
            metadata[f"skew_operator_{move.operator_id}_{move.store_name}"] = MetadataValue.float(
                skew
            )
    if plan.run_id is not None:
        metadata["run_id"] = MetadataValue.int(plan.run_id)
    return metadata


def layout_metadata(layouts: Sequence[Layout]) -> MetadataMap:
    """An operator store's layout and its repartitions (the store view's ``layout``)."""
    if not layouts:
        return {}
    steps = [
        f"{x.num_partitions} partitions from batch {x.from_batch}"
        + ("" if x.run_id is None else f" (repartition run {x.run_id})")
        for x in layouts
    ]
    return {
        "layout": MetadataValue.text("; ".join(steps)),
        "num_partitions": MetadataValue.int(layouts[-1].num_partitions),
    }
