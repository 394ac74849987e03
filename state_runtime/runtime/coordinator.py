"""The coordinator of seed 000: which Python worker holds the current copy of each store.

After a task commits a store it records itself as the store's holder (an upsert in the
catalog's ``store_holders`` table), so operators see where each store's copy lives. Copies
are unloaded by the process's memory budget (:mod:`state_runtime.store.cache`, least recently used
first), never by how far behind they are: a copy many versions behind still rolls forward in
O(changes), far cheaper than a reload. No load or commit depends on the coordinator, and its
failures are only logged.
"""

from __future__ import annotations

import logging

from state_runtime.catalog import Catalog
from state_runtime.errors import StateStoreError
from state_runtime.identity import CheckpointRef, StoreId

log = logging.getLogger("state_runtime.runtime.coordinator")


def report(catalog: Catalog, root: str, store: StoreId, worker: str, ref: CheckpointRef) -> None:
    """Record ``worker`` as the holder of ``store`` at ``ref`` (best effort)."""
    assert ref.checkpoint_id is not None
    try:
        catalog.record_holder(root, store, worker, ref)
    except StateStoreError as e:
        log.warning("coordinator: cannot record the holder of %s: %s", store, e)
