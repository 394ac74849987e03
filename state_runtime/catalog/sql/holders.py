"""The coordinator's table: which Python worker holds the current copy of each store.

The driver records the holders from its tasks' reports in the batch's commit transaction
(one statement for all partitions); no task writes to the catalog.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.schema.tables import store_holders as store_holders_table
from state_runtime.catalog.schema.tables import stores
from state_runtime.catalog.sql.rows import store_id_of
from state_runtime.catalog.sql.statements import dialect_insert
from state_runtime.identity import CheckpointRef, StoreId


def record_holders(
    connection: Connection,
    ids: Mapping[StoreId, int],
    holders: Mapping[StoreId, tuple[str, CheckpointRef]],
    now: datetime,
) -> None:
    """Each store's (worker, checkpoint) holder, by the store ids ``ids`` the caller's
    transaction looked up (the batch's commit: no lookup of its own); stores not in ``ids``:
    nothing."""
    rows = [
        {
            "store_id": ids[store],
            "worker": worker,
            "version": ref.version,
            "checkpoint_id": ref.checkpoint_id,
            "updated_at": now,
        }
        for store, (worker, ref) in sorted(holders.items())
        if store in ids
    ]
    if rows:
        connection.execute(_record_statement(connection.dialect.name), rows)


@functools.cache
def _record_statement(dialect: str) -> Any:
    """:func:`record_holders`' upsert, built once a dialect."""
    insert = dialect_insert(dialect, store_holders_table)
    changed = {k: insert.excluded[k] for k in ("worker", "version", "checkpoint_id", "updated_at")}
    return insert.on_conflict_do_update(index_elements=["store_id"], set_=changed)


def store_holders(connection: Connection, root: str) -> dict[StoreId, tuple[str, CheckpointRef]]:
    """Each store's recorded holder below ``root``: (worker, checkpoint)."""
    h, s = store_holders_table.c, stores.c
    rows = connection.execute(
        sa.select(s.operator_id, s.partition_id, s.store_name, h.worker, h.version, h.checkpoint_id)
        .join(stores, s.store_id == h.store_id)
        .where(s.checkpoint_root == root)
    )
    return {store_id_of(r): (r.worker, CheckpointRef(r.version, r.checkpoint_id)) for r in rows}
