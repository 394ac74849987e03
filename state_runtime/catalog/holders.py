"""The coordinator's table: which Python worker holds the current copy of each store."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.engine import Connection

from state_runtime.catalog.inventory import store_ids
from state_runtime.catalog.statements import upsert
from state_runtime.catalog.tables import store_holders
from state_runtime.identity import CheckpointRef, StoreId


def record_holder(
    connection: Connection,
    root: str,
    store: StoreId,
    worker: str,
    ref: CheckpointRef,
    now: datetime,
) -> None:
    """``worker`` holds ``store`` at ``ref`` (a store the catalog does not know: nothing)."""
    found = store_ids(connection, root, [store])
    if store not in found:
        return
    values = {
        "store_id": found[store],
        "worker": worker,
        "version": ref.version,
        "checkpoint_id": ref.checkpoint_id,
        "updated_at": now,
    }
    insert = upsert(connection, store_holders).values(**values)
    changed = {k: insert.excluded[k] for k in ("worker", "version", "checkpoint_id", "updated_at")}
    connection.execute(insert.on_conflict_do_update(index_elements=["store_id"], set_=changed))
