"""The coordinator's table: which Python worker holds the current copy of each store."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from state_runtime.catalog.inventory import store_ids, upsert
from state_runtime.catalog.rows import store_id_of
from state_runtime.catalog.tables import store_holders, stores
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


def holders_ahead(
    connection: Connection, root: str, held: dict[StoreId, int], worker: str, lag: int
) -> set[StoreId]:
    """Of the stores ``held`` (store -> version), those another worker holds at least ``lag``
    versions ahead."""
    query = (
        sa.select(
            stores.c.operator_id,
            stores.c.partition_id,
            stores.c.store_name,
            store_holders.c.version,
        )
        .select_from(stores.join(store_holders, stores.c.store_id == store_holders.c.store_id))
        .where(
            stores.c.checkpoint_root == root,
            stores.c.operator_id.in_(sorted({s.operator_id for s in held})),
            store_holders.c.worker != worker,
        )
    )
    found = set()
    for row in connection.execute(query):
        store = store_id_of(row)
        if store in held and row.version - held[store] >= lag:
            found.add(store)
    return found
