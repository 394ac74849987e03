"""An operator's first batch without a driver, for the benchmarks and tests that run it in
this process: its :class:`TaskSpec`, for the task body (``tasks.run_partitions``, as a Spark
worker runs it) over empty stores whose schema history is the operator's own schema; or its
store alone, for ``op.update`` on it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from state_runtime import StateStore, StateStoreProvider
from state_runtime.runtime import StatefulOperator
from state_runtime.runtime.context import BatchContext, batch_scope
from state_runtime.runtime.tasks import TaskSpec
from state_runtime.settings import WorkerSettings
from state_runtime.storage import Storage
from state_runtime.store.schema_history import SchemaHistory


def first_batch_spec(
    op: StatefulOperator, storage: Storage, worker_settings: WorkerSettings
) -> TaskSpec:
    """Batch 0 of ``op`` on ``storage``, with no committed state to start from."""
    return TaskSpec(
        storage=storage,
        query_id="first-batch",
        batch_id=0,
        run="first-batch",
        operator=op,
        schema_histories={op.store_name: SchemaHistory.of(op.schema)},
        base={},
        batch_time_ms=0,
        worker_settings=worker_settings,
    )


def operator_provider(op: StatefulOperator, storage: Storage) -> StateStoreProvider:
    """The provider of ``op``'s store in partition 0 on ``storage``, with its schema and
    configuration."""
    return StateStoreProvider(
        storage,
        0,
        0,
        op.store_name,
        key_schema=op.schema.key,
        value_schema=op.schema.value,
        config=op.config,
    )


@contextmanager
def first_batch_store(
    op: StatefulOperator, storage: Storage
) -> Iterator[tuple[StateStoreProvider, StateStore]]:
    """``op``'s empty store (version 0) on ``storage`` and its provider, in the scope of
    batch 0 (what ``op.update`` reads of its batch)."""
    provider = operator_provider(op, storage)
    store = provider.get_store(0)
    with batch_scope(BatchContext("first-batch", 0, 0, 0, stores={op.store_name: store})):
        yield provider, store
