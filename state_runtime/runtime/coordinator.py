"""The coordinator of seed 000: which Python worker holds the current copy of each store.

After a task commits a store it records itself as the store's holder (an upsert in the
catalog's ``store_holders`` table). Before a task loads a store, its worker asks the catalog
about the other stores it keeps in memory: a copy that another worker now holds and that has
fallen ``unload_lag`` or more versions behind is unloaded. A copy only a few versions behind
is kept, since rolling it forward costs O(changes) when the partition comes back. This is an
optimisation for memory; no load or commit depends on it, and its failures are only logged.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from state_runtime.catalog import Catalog
from state_runtime.catalog.engine import run_transaction
from state_runtime.catalog.tables import store_holders, stores
from state_runtime.errors import StateStoreError
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.settings import WORKER, default_of

log = logging.getLogger("state_runtime.runtime.coordinator")


def _store_pk(connection: Connection, root: str, store: StoreId) -> int | None:
    pk: int | None = connection.execute(
        sa.select(stores.c.store_id).where(
            stores.c.checkpoint_root == root,
            stores.c.operator_id == store.operator_id,
            stores.c.partition_id == store.partition_id,
            stores.c.store_name == store.store_name,
        )
    ).scalar_one_or_none()
    return pk


def report(catalog: Catalog, root: str, store: StoreId, worker: str, ref: CheckpointRef) -> None:
    """Record ``worker`` as the holder of ``store`` at ``ref`` (best effort)."""
    assert ref.checkpoint_id is not None

    def work(connection: Connection) -> None:
        pk = _store_pk(connection, root, store)
        if pk is None:
            return
        values = {
            "store_id": pk,
            "worker": worker,
            "version": ref.version,
            "checkpoint_id": ref.checkpoint_id,
            "updated_at": datetime.now(UTC),
        }
        insert = (postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert)(
            store_holders
        ).values(**values)
        changed = {
            k: insert.excluded[k] for k in ("worker", "version", "checkpoint_id", "updated_at")
        }
        connection.execute(insert.on_conflict_do_update(index_elements=["store_id"], set_=changed))

    try:
        run_transaction(catalog.engine, work, retry=catalog.retry, what="record store holder")
    except StateStoreError as e:
        log.warning("coordinator: cannot record the holder of %s: %s", store, e)


def redundant(
    catalog: Catalog,
    root: str,
    held: dict[StoreId, int],
    worker: str,
    lag: int = default_of(WORKER, "unload_lag", int),
) -> set[StoreId]:
    """Of the stores this worker ``held`` (store -> cached version), those another worker now
    holds at least ``lag`` versions ahead: copies worth unloading."""
    if not held:
        return set()

    def work(connection: Connection) -> set[StoreId]:
        query = (
            sa.select(
                stores.c.operator_id,
                stores.c.partition_id,
                stores.c.store_name,
                store_holders.c.worker,
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
        for op, part, name, _holder, version in connection.execute(query):
            store = StoreId(op, part, name)
            if store in held and version - held[store] >= lag:
                found.add(store)
        return found

    try:
        return run_transaction(catalog.engine, work, retry=catalog.retry, what="read store holders")
    except StateStoreError as e:
        log.warning("coordinator: cannot read store holders: %s", e)
        return set()
