"""What one Spark task does for one state partition of one batch (runs on executors).

The driver builds a :class:`TaskSpec` of plain data (the operator, the committed
``(version, id)`` of every partition, the catalog URL, the worker settings it read) that Spark
ships with the task. The task opens its partition's store at exactly that checkpoint, runs the
update function, commits a new delta, records the file in the catalog as written, and returns
its output rows followed by one row carrying its checkpoint info as JSON.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext

from state_runtime.cache import CACHE, set_budget
from state_runtime.errors import InvalidArgument
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.metrics import LoadSource
from state_runtime.runtime import coordinator, worker
from state_runtime.runtime.context import BatchContext, _current
from state_runtime.runtime.event_time import EventTimeSpec, event_time_report, prepare_rows
from state_runtime.runtime.operator import StatefulOperator
from state_runtime.settings import WorkerSettings
from state_runtime.storage import Storage

PARTITION_COLUMN = "__state_partition"


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs, as plain picklable data."""

    storage: Storage
    catalog_url: str
    query_id: str
    batch_id: int
    operator: StatefulOperator
    base: dict[int, tuple[int, str | None]]
    input_schema: pa.Schema
    batch_time_ms: int
    worker_settings: WorkerSettings
    event_time: EventTimeSpec | None = None


def _output_table(out: pa.Table | Iterable[tuple[Any, ...]] | None, schema: pa.Schema) -> pa.Table:
    """The update function's output as a table of the staged schema (checkpoint column null)."""
    user_fields = [schema.field(i) for i in range(len(schema) - 1)]
    if out is None:
        columns: list[pa.Array] = [pa.array([], type=f.type) for f in user_fields]
        n = 0
    elif isinstance(out, pa.Table):
        n = out.num_rows
        columns = [out.column(i).cast(f.type) for i, f in enumerate(user_fields)]
    else:
        rows = list(out)
        n = len(rows)
        transposed: list[Sequence[Any]] = (
            list(zip(*rows, strict=True)) if rows else [[] for _ in user_fields]
        )
        if len(transposed) != len(user_fields):
            raise InvalidArgument(
                f"update function returned rows of {len(transposed)} fields, the output schema "
                f"has {len(user_fields)}"
            )
        columns = [
            pa.array(col, type=f.type) for col, f in zip(transposed, user_fields, strict=True)
        ]
    columns.append(pa.nulls(n, type=pa.string()))
    return pa.Table.from_arrays(columns, schema=schema)


def run_partition(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The body of the stateful stage's task for one partition (``mapInArrow`` function)."""
    started = time.perf_counter()
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    op = spec.operator
    received = list(batches)  # timestamps arrive in the session's time zone: keep theirs
    table = pa.Table.from_batches(received) if received else spec.input_schema.empty_table()
    if table.num_rows:
        misrouted = pc.sum(pc.not_equal(table.column(PARTITION_COLUMN), partition)).as_py()
        if misrouted:
            raise InvalidArgument(
                f"{misrouted} rows reached state partition {partition} but hash to another: "
                "the stateful stage must not be repartitioned"
            )
    rows = table.drop_columns([PARTITION_COLUMN])
    store_id = StoreId(op.operator_id, partition, op.store_name)
    root, me = spec.storage.uri, worker.worker_id()
    catalog = worker.catalog_for(spec.catalog_url)
    others = {s: v for s, v in worker.held_versions(root).items() if s != store_id}
    if CACHE.budget != spec.worker_settings.cache_bytes:
        set_budget(spec.worker_settings.cache_bytes)
    lag = spec.worker_settings.unload_lag
    unloaded = worker.unload(root, coordinator.redundant(catalog, root, others, me, lag))
    provider = worker.provider_for(spec.storage, store_id, op.schema, op.config)
    version, checkpoint_id = spec.base.get(partition, (0, None))
    store = provider.get_store(version, checkpoint_id)
    batch = BatchContext(
        spec.query_id,
        spec.batch_id,
        spec.batch_time_ms,
        partition,
        None if spec.event_time is None else spec.event_time.watermarks.eviction_ms,
        None if spec.event_time is None else spec.event_time.watermarks.late_rows_ms,
    )
    rows_in = rows.num_rows
    token = _current.set(batch)
    try:
        rows, max_event = prepare_rows(spec.event_time, op, rows, batch.event_time)
        out = op.update(store, rows)
        output = _output_table(out, op.staged_arrow_schema())
        info = store.commit()
    except BaseException:
        store.abort()
        raise
    finally:
        _current.reset(token)
    catalog.record_files(root, [info])
    coordinator.report(catalog, root, store_id, me, info.ref)
    load = store.metrics.load
    report = {
        **info.to_dict(),
        "rows_in": rows_in,
        "keys_updated": store.metrics.updated_keys + store.metrics.removed_keys,
        "cache_hit": load.source in (LoadSource.CACHE, LoadSource.ROLL_FORWARD, LoadSource.EMPTY),
        "load_source": load.source.value,
        "deltas_applied": load.deltas_applied,
        "repairs": load.repairs,
        "task_ms": (time.perf_counter() - started) * 1000,
        "attempt": context.attemptNumber() if context is not None else 0,
        "worker": me,
        "unloaded": unloaded,
        **event_time_report(batch.event_time, max_event),
    }
    yield from output.to_batches()
    marker = [pa.nulls(1, type=f.type) for f in list(output.schema)[:-1]]
    yield pa.RecordBatch.from_arrays(
        [*marker, pa.array([json.dumps(report)], type=pa.string())], schema=output.schema
    )


def parse_report(raw: str) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(raw)
    return report


def base_refs(
    committed: dict[StoreId, CheckpointRef], operator: StatefulOperator
) -> dict[int, tuple[int, str | None]]:
    """Each partition's starting checkpoint for this operator: the committed one, or version 0."""
    base: dict[int, tuple[int, str | None]] = {}
    for store, ref in committed.items():
        if store.operator_id == operator.operator_id and store.store_name == operator.store_name:
            base[store.partition_id] = (ref.version, ref.checkpoint_id)
    return base
