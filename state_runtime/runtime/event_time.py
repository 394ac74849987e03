"""The runtime's event-time plumbing: the driver fixes each batch's watermark, tasks apply it.

The driver (:class:`EventTimeClock`) takes batch ``b``'s watermark from the catalog if ``b``
already ran (a replay or restart), else derives it from batch ``b - 1``'s record and records
it before any task starts; batch ``b - 1``'s watermark judges late rows. Each task of the
first operator reports the largest event time of its input; the driver records the batch's
maximum before the batch commits. Tasks drop late rows (:func:`prepare_rows`) and report what
they dropped and evicted (:func:`event_time_report`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from state_runtime.errors import InvalidArgument
from state_runtime.runtime.operator import StatefulOperator
from state_runtime.runtime.query_check import marked_columns
from state_runtime.runtime.watermark import (
    BatchWatermarks,
    EventTimeStats,
    Watermark,
    drop_late,
    max_event_ms,
)

if TYPE_CHECKING:  # the driver's side alone: tasks never import the catalog (SQLAlchemy)
    from state_runtime.catalog import Catalog


class EventTimeFigures(Protocol):
    """What a task reports about event time (the fields of ``event_time_report``)."""

    @property
    def late_rows(self) -> int: ...
    @property
    def evicted(self) -> int: ...
    @property
    def evict_ms(self) -> float: ...
    @property
    def max_event_ms(self) -> int | None: ...


@dataclass(frozen=True)
class EventTimeSpec:
    """What a task needs: the batch's watermarks, the column whose maximum it reports (set
    for the first operator only: the watermark follows the query's input) and the column
    whose late rows it drops."""

    watermarks: BatchWatermarks
    track_column: str | None
    late_column: str | None


def prepare_rows(
    spec: EventTimeSpec | None, rows: pa.Table, stats: EventTimeStats
) -> tuple[pa.Table, int | None]:
    """The rows ``op.update`` gets (late ones dropped) and the largest event time seen."""
    if spec is None:
        return rows, None
    seen = None if spec.track_column is None else max_event_ms(rows, spec.track_column)
    if spec.late_column is not None:
        rows, late = drop_late(rows, spec.late_column, spec.watermarks.late_rows_ms)
        stats.late_rows += late  # a key-local operator's input comes in pieces
    return rows, seen


def event_time_report(stats: EventTimeStats, seen: int | None) -> dict[str, Any]:
    return {
        "late_rows": stats.late_rows,
        "evicted": stats.evicted,
        "evict_ms": stats.evict_ms,
        "max_event_ms": seen,
    }


def event_time_metrics(
    reports: Sequence[EventTimeFigures], watermarks: BatchWatermarks | None
) -> dict[str, Any]:
    """The batch's event-time figures, for ``BatchMetrics.extra``."""
    if watermarks is None:
        return {}
    return {
        "watermark_ms": watermarks.eviction_ms,
        "late_rows_watermark_ms": watermarks.late_rows_ms,
        "late_rows": sum(r.late_rows for r in reports),
        "evicted": sum(r.evicted for r in reports),
        "evict_ms": sum(r.evict_ms for r in reports),
        "max_evict_ms": max((r.evict_ms for r in reports), default=0.0),
    }


def late_columns(
    operators: Sequence[StatefulOperator], watermark: Watermark | None
) -> tuple[str | None, ...]:
    """Each operator's column of late rows: its ``late_column``, else, for an operator
    ``late_on_watermark``, the watermark's column where the watermark still marks it in the
    operator's input (Spark's late filter on the input's watermarked attribute)."""
    return tuple(
        op.late_column
        or (
            watermark.column
            if watermark and op.late_on_watermark and watermark.column in marked
            else None
        )
        for op, marked in zip(operators, marked_columns(operators, watermark), strict=True)
    )


@dataclass(frozen=True)
class EventTimeClock:
    """A query's watermark across batches (driver side), and each operator's column of late
    rows (:func:`late_columns`)."""

    watermark: Watermark | None
    late_columns: tuple[str | None, ...]

    @classmethod
    def of(
        cls, watermark: Watermark | None, operators: Sequence[StatefulOperator]
    ) -> EventTimeClock:
        if watermark is None:
            needing = [op.operator_id for op in operators if op.needs_watermark]
            if needing:
                raise InvalidArgument(
                    f"operators {needing} use event time: the query needs a watermark "
                    "(StatefulQuery(..., watermark=Watermark(column, delay)))"
                )
        return cls(watermark, late_columns(operators, watermark))

    def spec(self, watermarks: BatchWatermarks | None, index: int) -> EventTimeSpec | None:
        """What the task of the query's operator number ``index`` needs."""
        if self.watermark is None or watermarks is None:
            return None
        track = self.watermark.column if index == 0 else None
        return EventTimeSpec(watermarks, track, self.late_columns[index])

    def watermark_for(
        self, catalog: Catalog, root: str, query_id: str, batch_id: int
    ) -> BatchWatermarks | None:
        """Batch ``batch_id``'s watermark (recorded if it ran before, else derived from batch
        ``batch_id - 1``'s record and recorded) and batch ``batch_id - 1``'s."""
        if self.watermark is None:
            return None
        previous = catalog.batch_watermark(root, query_id, batch_id - 1) if batch_id else None
        late_rows_ms = 0 if previous is None else previous.watermark_ms
        recorded = catalog.batch_watermark(root, query_id, batch_id)
        if recorded is None:
            derived = (
                0
                if previous is None
                else self.watermark.advance(previous.watermark_ms, previous.max_event_ms)
            )
            recorded = catalog.fix_watermark(root, query_id, batch_id, derived)
        return BatchWatermarks(recorded.watermark_ms, late_rows_ms)

    def record(
        self,
        catalog: Catalog,
        root: str,
        query_id: str,
        batch_id: int,
        reports: Sequence[EventTimeFigures],
    ) -> None:
        """Record the largest event time the first operator's tasks saw in this batch."""
        if self.watermark is None:
            return
        seen = [r.max_event_ms for r in reports if r.max_event_ms is not None]
        catalog.record_max_event_time(root, query_id, batch_id, max(seen, default=None))
