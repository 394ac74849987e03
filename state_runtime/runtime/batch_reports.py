"""What the driver makes of a batch's task reports: this call's reports, one per store chosen
for the commit (the others are duplicate attempts), the message naming the partitions still
missing, and the batch's metrics and per-store figures."""

from __future__ import annotations

from collections.abc import Sequence

from state_runtime.catalog import BatchMetrics, StoreKey
from state_runtime.identity import StoreId
from state_runtime.runtime.operator import StatefulOperator
from state_runtime.runtime.tasks import TaskReport
from state_runtime.runtime.telemetry import StoreFigures


def duplicates_of(reports: list[TaskReport], chosen: list[TaskReport]) -> list[TaskReport]:
    """The reports the commit does not take: other attempts at the batch's stores."""
    taken = {r.info.path for r in chosen}
    return [r for r in reports if r.info.path not in taken]


def mine(run: str, notes: Sequence[str]) -> list[TaskReport]:
    """This ``run_batch`` call's reports among the report column's values."""
    reports = [TaskReport.from_json(n) for n in notes]
    return [r for r in reports if r.run == run]


def choose(
    operators: Sequence[StatefulOperator], reports: list[TaskReport]
) -> list[TaskReport] | None:
    """One report per store (the first; the others are duplicate attempts or
    recomputations, whose files stay uncommitted), or None while a partition of an
    operator has none."""
    first: dict[StoreId, TaskReport] = {}
    for report in reports:
        first.setdefault(report.info.store, report)
    expected = [
        StoreId(op.operator_id, p, store.name)
        for op in operators
        for p in range(op.num_partitions)
        for store in op.stores
    ]
    if set(first) != set(expected):
        return None
    return [first[s] for s in expected]


def incomplete(
    query_id: str, operators: Sequence[StatefulOperator], reports: list[TaskReport]
) -> str:
    """Which operators' partitions returned no checkpoint, for the CommitConflict."""
    got = {r.info.store for r in reports}
    lines = []
    for op in operators:
        for store in op.stores:
            partitions = sorted(
                s.partition_id
                for s in got
                if (s.operator_id, s.store_name) == (op.operator_id, store.name)
            )
            if partitions != list(range(op.num_partitions)):
                named = "" if store.name == op.store_name else f" (store {store.name})"
                lines.append(
                    f"operator {op.operator_id}{named} returned checkpoints for partitions "
                    f"{partitions}, expected exactly 0..{op.num_partitions - 1}"
                )
    return f"query {query_id}: " + "; ".join(lines)


def store_figures(root: str, reports: list[TaskReport]) -> list[StoreFigures]:
    """Each committed store's figures, for telemetry."""
    return [
        StoreFigures(
            StoreKey(root, r.info.store),
            r.info.rows,
            r.keys_updated,
            r.info.bytes_written,
            r.load_ms,
        )
        for r in reports
    ]


def batch_metrics(
    reports: list[TaskReport], duplicates: int, commit_ms: float, batch_s: float
) -> BatchMetrics:
    """The batch's metrics from the chosen reports (what the catalog records)."""
    hits = sum(1 for r in reports if r.cache_hit)
    return BatchMetrics(
        rows_in=sum(r.rows_in for r in reports),
        keys_updated=sum(r.keys_updated for r in reports),
        state_rows=sum(r.info.rows for r in reports),
        bytes_written=sum(r.info.bytes_written for r in reports),
        commit_ms=commit_ms,
        cache_hits=hits,
        cache_misses=len(reports) - hits,
        resident_bytes=sum(r.resident_bytes for r in reports),
        local_disk_bytes=sum(r.local_disk_bytes for r in reports),
        block_cache_hits=sum(r.block_cache_hits for r in reports),
        block_cache_misses=sum(r.block_cache_misses for r in reports),
        compaction_bytes=sum(r.compaction_bytes for r in reports),
        extra={
            "batch_ms": batch_s * 1000,
            "cache_hit_rate": hits / len(reports),
            "load_sources": {
                s: sum(1 for r in reports if r.load_source == s)
                for s in sorted({r.load_source for r in reports})
            },
            "max_task_ms": max(r.task_ms for r in reports),
            "max_load_ms": max(r.load_ms for r in reports),
            "deltas_applied": sum(r.deltas_applied for r in reports),
            "local_bytes_written": sum(r.local_bytes_written for r in reports),
            "duplicate_attempts": duplicates,
            "repairs": [x for r in reports for x in r.repairs],
        },
    )
