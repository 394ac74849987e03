"""The :class:`TaskSpec` of an operator's first batch, without a driver: for the benchmarks
and tests that run the task body (``tasks.run_partitions``) in this process, as a Spark worker
does, over empty stores whose schema history is the operator's own schema."""

from __future__ import annotations

from state_runtime.runtime import StatefulOperator
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
