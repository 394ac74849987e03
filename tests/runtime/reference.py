"""Plain-Python reference computations and lineage checks for the runtime tests."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from state_runtime.catalog import Catalog
from state_runtime.identity import FileKind
from state_runtime.provider import StateStoreProvider
from state_runtime.storage import Storage


def running_totals(events: Iterable[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    """user -> (count, sum of amounts): what a running count/sum aggregation must hold."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for user, amount in events:
        totals[user][0] += 1
        totals[user][1] += amount
    return {u: (c, s) for u, (c, s) in totals.items()}


def assert_lineage_linear(catalog: Catalog, storage: Storage) -> int:
    """Every store's committed versions form one chain: each committed delta's parent is the
    previously committed checkpoint, and every committed version is loadable. Returns the
    number of commits checked."""
    root = storage.uri
    checked = 0
    for record in catalog.stores(root):
        store = record.key.store
        history = sorted(
            catalog.commit_history(root, store=store, limit=100_000), key=lambda e: e.ref.version
        )
        provider = StateStoreProvider(
            storage,
            store.operator_id,
            store.partition_id,
            store.store_name,
            key_schema=record.key_schema,
            value_schema=record.value_schema,
        )
        versions = [e.ref.version for e in history]
        assert versions == list(range(1, len(history) + 1)), (store, versions)
        previous = None
        for entry in history:
            header = provider.read_header(entry.ref, FileKind.DELTA)
            parent = header.lineage[0] if header.lineage else None
            assert parent == previous, (store, entry.ref, parent, previous)
            previous = entry.ref
            checked += 1
        if history:
            provider.get_read_store(history[-1].ref.version, history[-1].ref.checkpoint_id)
    return checked
