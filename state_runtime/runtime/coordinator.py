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

from state_runtime.catalog import Catalog
from state_runtime.errors import StateStoreError
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.settings import WORKER, default_of

log = logging.getLogger("state_runtime.runtime.coordinator")


def report(catalog: Catalog, root: str, store: StoreId, worker: str, ref: CheckpointRef) -> None:
    """Record ``worker`` as the holder of ``store`` at ``ref`` (best effort)."""
    assert ref.checkpoint_id is not None
    try:
        catalog.record_holder(root, store, worker, ref)
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
    try:
        return catalog.holders_ahead(root, held, worker, lag)
    except StateStoreError as e:
        log.warning("coordinator: cannot read store holders: %s", e)
        return set()
