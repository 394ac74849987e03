"""Which delta file each batch committed per store: the change feed's sources."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.records import CommittedDelta
from state_runtime.catalog.schema.reading_views import ReaderViews
from state_runtime.catalog.sql.roots import validate_root
from state_runtime.identity import CheckpointRef, StoreId, validate_name, validate_non_negative


def committed_deltas(
    connection: Connection,
    views: ReaderViews,
    root: str,
    operator_id: int,
    store_name: str,
    start_batch_id: int,
    end_batch_id: int,
    query_id: str | None,
) -> list[CommittedDelta]:
    """The committed delta of every partition of a store for batches in ``[start, end]``,
    in batch then partition order (without a path where a batch changed nothing)."""
    validate_root(root)
    validate_non_negative(operator_id, "operator id")
    validate_name(store_name, "store name")
    validate_non_negative(start_batch_id, "start batch id")
    validate_non_negative(end_batch_id, "end batch id")
    c, s, f = views.commits.c, views.stores.c, views.files.c
    query = (
        sa.select(
            s.partition_id, c.query_id, c.batch_id, c.version, c.checkpoint_id, f.path, f.state
        )
        .join(views.stores, s.store_id == c.store_id)
        .outerjoin(views.files, f.file_id == c.file_id)  # none: the batch changed nothing
        .where(
            s.checkpoint_root == root,
            s.operator_id == operator_id,
            s.store_name == store_name,
            c.batch_id.between(start_batch_id, end_batch_id),
        )
        .order_by(c.batch_id, s.partition_id)
    )
    if query_id is not None:
        query = query.where(c.query_id == validate_name(query_id, "query id"))
    return [
        CommittedDelta(
            StoreId(operator_id, r.partition_id, store_name),
            r.query_id,
            r.batch_id,
            CheckpointRef(r.version, r.checkpoint_id),
            r.path,
            r.state,
        )
        for r in connection.execute(query)
    ]
