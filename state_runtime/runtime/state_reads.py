"""The executor side of reading state and its change feed: what runs in a Python worker's task
for ``read_state``, ``read_changes`` and the ``state_runtime`` data source.

Kept apart from :mod:`~state_runtime.runtime.reader` and :mod:`~state_runtime.runtime.changes`
(the driver's plans, which read the catalog) so that a worker unpickling these functions
imports the stores alone, not the catalog's SQLAlchemy and Alembic (about 32 MiB of a worker's
resident memory; ``tests/test_import_graph.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.runtime import worker
from state_runtime.storage import Storage
from state_runtime.store.config import StoreConfig
from state_runtime.store.schema_history import SchemaHistory


def load_state(
    storage: Storage,
    operator_id: int,
    store_name: str,
    history: SchemaHistory,
    ref: tuple[int, int, str | None],
) -> Iterator[pa.RecordBatch]:
    """One partition's rows at ``(partition, version, checkpoint id)`` (runs in a task)."""
    partition, version, checkpoint_id = ref
    store_id = StoreId(operator_id, partition, store_name)
    provider = worker.provider_for(storage, store_id, history, StoreConfig())
    table = provider.get_read_store(version, checkpoint_id).to_arrow()
    ids = pa.array([partition] * table.num_rows, type=pa.int32())
    yield from pa.table(
        {"partition_id": ids, "key": table.column("key"), "value": table.column("value")}
    ).to_batches()


def load_partitions(
    storage: Storage,
    operator_id: int,
    store_name: str,
    history: SchemaHistory,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """``read_state``'s ``mapInArrow`` function: each row of ``batches`` names a partition's
    version to read."""
    for batch in batches:
        for ref in zip(*batch.to_pydict().values(), strict=True):
            yield from load_state(storage, operator_id, store_name, history, ref)


def load_changes(
    storage: Storage,
    operator_id: int,
    store_name: str,
    history: SchemaHistory,
    source: tuple[int, int, int, str | None],
) -> Iterator[pa.RecordBatch]:
    """One batch's changes to one partition: ``(batch, partition, version, checkpoint id)``
    of its delta (runs in a task)."""
    batch_id, partition, version, checkpoint_id = source
    store_id = StoreId(operator_id, partition, store_name)
    provider = worker.provider_for(storage, store_id, history, StoreConfig())
    delta = provider.read_delta(CheckpointRef(version, checkpoint_id))
    n = delta.num_rows
    removed = delta.column("value").is_null()
    yield from pa.table(
        {
            "batch_id": pa.array([batch_id] * n, type=pa.int64()),
            "change_type": pc.if_else(removed, "delete", "update"),
            "key": delta.column("key"),
            "value": delta.column("value"),
            "partition_id": pa.array([partition] * n, type=pa.int32()),
        }
    ).to_batches()


def read_deltas(
    storage: Storage,
    operator_id: int,
    store_name: str,
    history: SchemaHistory,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """``read_changes``' ``mapInArrow`` function: each row of ``batches`` names a delta to
    read."""
    for batch in batches:
        for source in zip(*batch.to_pydict().values(), strict=True):
            yield from load_changes(storage, operator_id, store_name, history, source)
