"""Each batch's event-time watermark: fixed once before the batch runs, never changed after.

The first driver to run batch ``b`` inserts its watermark; a replay finds the row and uses it.
The largest event time the batch saw is written after its tasks finish (a replay recomputes
the same input and writes the same value), for the next batch's watermark.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import BatchWatermark
from state_runtime.catalog.schema.reading_views import WRITE_LOOKUPS, ReaderViews
from state_runtime.catalog.schema.tables import batch_watermarks
from state_runtime.catalog.sql.roots import validate_root
from state_runtime.identity import validate_name, validate_non_negative


def _where(
    root: str, query_id: str, batch_id: int, table: sa.TableClause = batch_watermarks
) -> sa.ColumnElement[bool]:
    validate_root(root)
    validate_name(query_id, "query id")
    validate_non_negative(batch_id, "batch id")
    w = table.c
    return sa.and_(w.checkpoint_root == root, w.query_id == query_id, w.batch_id == batch_id)


def batch_watermark(
    connection: Connection, views: ReaderViews, root: str, query_id: str, batch_id: int
) -> BatchWatermark | None:
    """The recorded watermark of a batch, or None if the batch never started with one."""
    w = views.watermarks.c
    row = connection.execute(
        sa.select(w.watermark_ms, w.max_event_ms).where(
            _where(root, query_id, batch_id, views.watermarks)
        )
    ).first()
    return None if row is None else BatchWatermark(batch_id, row.watermark_ms, row.max_event_ms)


def fix_watermark(
    connection: Connection,
    root: str,
    query_id: str,
    batch_id: int,
    watermark_ms: int,
    now: datetime,
) -> BatchWatermark:
    """Record ``watermark_ms`` for a batch unless it has one; return the one that holds."""
    found = batch_watermark(connection, WRITE_LOOKUPS, root, query_id, batch_id)
    if found is not None:
        return found
    connection.execute(
        sa.insert(batch_watermarks).values(
            checkpoint_root=root,
            query_id=query_id,
            batch_id=batch_id,
            watermark_ms=watermark_ms,
            max_event_ms=None,
            recorded_at=now,
        )
    )
    return BatchWatermark(batch_id, watermark_ms, None)


def record_max_event_time(
    connection: Connection, root: str, query_id: str, batch_id: int, max_event_ms: int | None
) -> None:
    """The largest event time seen up to and including this batch (None: none yet)."""
    connection.execute(
        sa.update(batch_watermarks)
        .where(_where(root, query_id, batch_id))
        .values(max_event_ms=max_event_ms)
    )
