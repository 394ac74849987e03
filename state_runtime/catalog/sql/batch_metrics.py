"""Per-batch runtime metrics, recorded by the Spark driver after each committed batch."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import (
    DISK_FIGURES,
    BatchMetrics,
    Position,
    RecordedBatchMetrics,
)
from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.schema.tables import batch_metrics
from state_runtime.catalog.sql.positions import WritingTransaction, settled_after
from state_runtime.catalog.sql.roots import validate_root
from state_runtime.catalog.sql.statements import upsert
from state_runtime.errors import InvalidArgument
from state_runtime.identity import validate_name, validate_non_negative


def record_batch_metrics(
    connection: Connection,
    root: str,
    query_id: str,
    batch_id: int,
    metrics: BatchMetrics,
    now: datetime,
) -> None:
    """Store a batch's metrics; a replayed batch's figures replace the earlier ones."""
    validate_root(root)
    validate_name(query_id, "query id")
    validate_non_negative(batch_id, "batch id")
    counts = (
        metrics.rows_in,
        metrics.keys_updated,
        metrics.state_rows,
        metrics.bytes_written,
        metrics.cache_hits,
        metrics.cache_misses,
        *(getattr(metrics, name) for name in DISK_FIGURES),
    )
    if min(counts) < 0 or metrics.commit_ms < 0:
        raise InvalidArgument(f"negative figure in batch metrics {metrics}")
    figures = {
        "rows_in": metrics.rows_in,
        "keys_updated": metrics.keys_updated,
        "state_rows": metrics.state_rows,
        "bytes_written": metrics.bytes_written,
        "commit_ms": float(metrics.commit_ms),
        "cache_hits": metrics.cache_hits,
        "cache_misses": metrics.cache_misses,
        "extra": dict(metrics.extra),
        "recorded_at": now,
        **{name: getattr(metrics, name) for name in DISK_FIGURES},
    }
    # An upsert, not delete-then-insert: the runtime's role has no DELETE. A replayed batch
    # keeps its id and position (``positions.py``): a reader that reported it does not again.
    insert = upsert(connection, batch_metrics).values(
        checkpoint_root=root,
        query_id=query_id,
        batch_id=batch_id,
        xact_id=WritingTransaction(),
        **figures,
    )
    connection.execute(
        insert.on_conflict_do_update(
            index_elements=["checkpoint_root", "query_id", "batch_id"], set_=figures
        )
    )


def batch_metrics_history(
    connection: Connection, views: ReaderViews, root: str, query_id: str, limit: int
) -> list[RecordedBatchMetrics]:
    """A query's recorded batch metrics, newest batch first."""
    m = views.batch_metrics.c
    rows = connection.execute(
        sa.select(views.batch_metrics)
        .where(m.checkpoint_root == root, m.query_id == query_id)
        .order_by(m.batch_id.desc())
        .limit(limit)
    )
    return [_recorded(r) for r in rows]


def metrics_after(
    connection: Connection, views: ReaderViews, after: Position, limit: int
) -> list[tuple[Position, RecordedBatchMetrics]]:
    """Up to ``limit`` batches recorded after ``after`` whose transactions ended (any root
    and query), in position order, each with its position: an exact reader's cursor
    (``positions.py``)."""
    validate_non_negative(limit, "limit")
    m = views.batch_metrics.c
    rows = connection.execute(
        sa.select(views.batch_metrics)
        .where(settled_after(connection, m.xact_id, m.metrics_id, after))
        .order_by(m.xact_id, m.metrics_id)
        .limit(limit)
    )
    return [(Position(r.xact_id, r.metrics_id), _recorded(r)) for r in rows]


def _recorded(r: sa.Row[Any]) -> RecordedBatchMetrics:
    return RecordedBatchMetrics(
        root=r.checkpoint_root,
        query_id=r.query_id,
        batch_id=r.batch_id,
        metrics=BatchMetrics(
            rows_in=r.rows_in,
            keys_updated=r.keys_updated,
            state_rows=r.state_rows,
            bytes_written=r.bytes_written,
            commit_ms=r.commit_ms,
            cache_hits=r.cache_hits,
            cache_misses=r.cache_misses,
            extra=r.extra,
            **{name: getattr(r, name) for name in DISK_FIGURES},
        ),
        recorded_at=r.recorded_at,
    )
