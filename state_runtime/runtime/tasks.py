"""What one Spark task does for the state partitions of one batch (runs on executors).

The driver builds a :class:`TaskSpec` of plain data (the operator, the committed
``(version, id)`` of every partition, the worker settings it read) that Spark ships with the
task. Every input row carries its state
partition in :data:`PARTITION_COLUMN`, and the driver adds one heartbeat row per state
partition, so every partition is processed in every batch, whatever the input (empty,
filtered to nothing, one key) and however Spark coalesced the shuffle. For each state
partition among its rows the task opens the store at exactly the shipped checkpoint, runs the
update function, commits a new delta, and emits a :class:`TaskReport` as one row of its
output (:data:`REPORT_COLUMN`, JSON; null on the
operator's own rows). Reports of earlier operators in a chain pass through the later ones'
tasks untouched, so the last stage's output carries every report of the batch: the driver
reads them from an observation of that output, or, when the observation is lost, from the
data itself (see ``query.py``), and records files, holders and commit in one transaction: a
task opens no catalog connection. Nothing needs ``sparkContext``: the same on Connect.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext

from state_runtime.errors import InvalidArgument
from state_runtime.identity import CheckpointRef, StoreId
from state_runtime.runtime import worker
from state_runtime.runtime.context import BatchContext, batch_scope
from state_runtime.runtime.event_time import EventTimeSpec, event_time_report, prepare_rows
from state_runtime.runtime.operator import ExtraStore, StatefulOperator, UpdateOutput
from state_runtime.runtime.partition_input import PartitionInput
from state_runtime.runtime.watermark import EventTimeStats
from state_runtime.settings import WorkerSettings
from state_runtime.storage import Storage
from state_runtime.store.cache import CACHE, set_budget
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.store_metrics import LoadSource

PARTITION_COLUMN = "__state_partition"
"""The state partition of a row: ``pmod(hash(keys), n)``, or the heartbeat's own partition."""
HEARTBEAT_COLUMN = "__state_heartbeat"
"""True on the one row per state partition that makes every partition run every batch."""
REPORT_COLUMN = "__state_report"
"""A task's report (JSON) on a row of its own; null on the operator's output rows."""


@dataclass(frozen=True)
class TaskSpec:
    """Everything a task needs, as plain picklable data. ``run`` names one ``run_batch``
    call, so that reports of an earlier call (a late speculative attempt) are told apart."""

    storage: Storage
    query_id: str
    batch_id: int
    run: str
    operator: StatefulOperator
    schema_histories: dict[str, SchemaHistory]
    """Each of the operator's stores' schema history from the catalog, newest last (the
    operator's schema), by store name."""
    base: dict[str, dict[int, tuple[int, str | None]]]
    """Each store's committed ``(version, id)`` per partition, by store name."""
    batch_time_ms: int
    worker_settings: WorkerSettings
    event_time: EventTimeSpec | None = None
    time_zone: str = "UTC"
    """The driver's ``spark.sql.session.timeZone``, for naive datetimes."""


@dataclass(frozen=True)
class TaskReport:
    """What one state partition's task attempt did: its checkpoint and what it cost."""

    run: str
    info: CheckpointInfo
    rows_in: int
    keys_updated: int
    load_source: str
    deltas_applied: int
    load_ms: float
    task_ms: float
    attempt: int
    worker: str
    repairs: list[str] = field(default_factory=list)
    late_rows: int = 0
    evicted: int = 0
    evict_ms: float = 0.0
    max_event_ms: int | None = None
    resident_bytes: int = 0
    """Bytes the store's committed version holds in memory (docs/state-on-disk.md)."""
    local_disk_bytes: int = 0
    """Bytes of the store's runs on the worker's local disk."""
    block_cache_hits: int = 0
    """The task's block reads served by the worker's block cache (the first store's report
    alone carries the task's counters, as it alone counts the rows in)."""
    block_cache_misses: int = 0
    compaction_bytes: int = 0
    """Bytes the task's merges wrote to local disk."""
    local_bytes_written: int = 0
    """Bytes the task wrote to local disk for the partition: run files and its spilled
    input (:class:`PartitionInput`)."""

    @property
    def cache_hit(self) -> bool:
        """The version came from this worker's memory (exact, rolled forward, or empty)."""
        return self.load_source != LoadSource.FILES.value

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict: the fields as they are (scalars and ``repairs``, a list of
        strings, copied), ``info`` by its own ``to_dict`` (``dataclasses.asdict`` would copy
        the checkpoint's nested dataclasses deeply first, only for them to be replaced: a
        fifth of a task's report cost)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**d, "info": self.info.to_dict(), "repairs": list(self.repairs)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskReport:
        return cls(**{**d, "info": CheckpointInfo.from_dict(d["info"])})

    def to_json(self) -> str:
        """What travels in the report column."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> TaskReport:
        return cls.from_dict(json.loads(text))


def stage_arrow_schema(operator: StatefulOperator) -> pa.Schema:
    """A stateful stage's output: the operator's output columns and the report column."""
    return operator.output_arrow_schema().append(pa.field(REPORT_COLUMN, pa.string()))


TUPLE_ROWS = 1 << 16
"""Tuples an update function yields that the task gathers into one table for Spark."""


def _report_rows(reports: pa.Array, schema: pa.Schema) -> pa.RecordBatch:
    """Report rows, output columns null."""
    n = len(reports)
    return pa.record_batch(
        [pa.nulls(n, f.type) for f in schema if f.name != REPORT_COLUMN] + [reports],
        schema=schema,
    )


def _output_batches(out: UpdateOutput, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The update function's output as batches of the operator's output schema, as it comes:
    each table or record batch of an iterable when it is yielded, tuples in groups of
    :data:`TUPLE_ROWS`."""
    if out is None:
        return
    if isinstance(out, pa.Table):
        yield from _cast(out, schema).to_batches()
        return
    rows: list[Any] = []
    for item in out:
        if isinstance(item, pa.Table | pa.RecordBatch):
            yield from _tuples(rows, schema)
            yield from _cast(pa.table(item), schema).to_batches()
            rows = []
            continue
        rows.append(item)
        if len(rows) >= TUPLE_ROWS:
            yield from _tuples(rows, schema)
            rows = []
    yield from _tuples(rows, schema)


def _cast(table: pa.Table, schema: pa.Schema) -> pa.Table:
    columns = [table.column(i).cast(f.type) for i, f in enumerate(schema)]
    return pa.Table.from_arrays(columns, schema=schema)


def _tuples(rows: Sequence[Sequence[Any]], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Tuple rows as one batch (none for no rows)."""
    if not rows:
        return
    transposed = list(zip(*rows, strict=True))
    if len(transposed) != len(schema):
        raise InvalidArgument(
            f"update function returned rows of {len(transposed)} fields, the output schema "
            f"has {len(schema)}"
        )
    yield pa.RecordBatch.from_arrays(
        [pa.array(col, type=f.type) for col, f in zip(transposed, schema, strict=True)],
        schema=schema,
    )


def run_partitions(spec: TaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The stateful stage's ``mapInArrow`` function: every state partition among the rows,
    each followed by its report row; earlier operators' report rows pass through first.

    The input is taken batch by batch as Spark sends it: each batch's data rows are copied
    out by state partition without the heartbeat and routing columns, so the task holds its
    input once, in its own columns only (a key-local operator's large input: on local disk,
    :class:`PartitionInput`); a partition's input is let go once it has run, and its output
    goes to Spark as the update gives it."""
    op = spec.operator
    schema = stage_arrow_schema(op)
    internal = {PARTITION_COLUMN, HEARTBEAT_COLUMN, REPORT_COLUMN}
    key_type = op.schema.key_arrow if op.key_local else None
    inputs: dict[int, PartitionInput] = {}
    carried: list[pa.Array] = []
    try:
        for batch in batches:
            if REPORT_COLUMN in batch.schema.names:  # a later operator in a chain
                notes = batch.column(REPORT_COLUMN)
                carried.append(notes.filter(pc.is_valid(notes)))
                batch = batch.filter(pc.is_null(notes))
            route = batch.column(PARTITION_COLUMN)
            data = pc.invert(pc.fill_null(batch.column(HEARTBEAT_COLUMN), False))
            rows = batch.select([n for n in batch.schema.names if n not in internal])
            for partition in pc.unique(route).to_pylist():
                kept = pc.and_(data, pc.equal(route, partition))
                mine = inputs.get(partition)
                if mine is None:
                    store = StoreId(op.operator_id, int(partition), op.store_name)
                    mine = inputs[partition] = PartitionInput(op.key_columns, key_type, store)
                mine.add(rows.filter(kept))
            del batch, rows, route, data  # the batch as Spark sent it goes now
        if carried:
            yield _report_rows(pa.concat_arrays(carried), schema)
        for partition in sorted(inputs):
            reports = yield from _run_partition(spec, int(partition), inputs[partition], schema)
            del inputs[partition]
            yield _report_rows(pa.array([r.to_json() for r in reports], type=pa.string()), schema)
    finally:
        for left in inputs.values():
            left.discard()
    worker.settle()


def _run_partition(
    spec: TaskSpec, partition: int, rows: PartitionInput, schema: pa.Schema
) -> Generator[pa.RecordBatch, None, list[TaskReport]]:
    """One state partition: open every store of the operator at its shipped checkpoint, run
    the update function (once, or once a piece of the input for a key-local operator), its
    output yielded as it comes (rows of the stage's ``schema``, report null), commit each
    store; returns one report per store (the main one first, which alone counts the rows
    in)."""
    started = time.perf_counter()
    context = TaskContext.get()
    op = spec.operator
    me = worker.worker_id()
    if CACHE.budget != spec.worker_settings.cache_bytes:
        set_budget(spec.worker_settings.cache_bytes)
    disk_at_start = LOCAL_DISK.snapshot()
    spilled_before = rows.spilled_bytes  # input spilled before this window, as Spark sent it
    stores = {}
    for name in (s.name for s in op.stores):
        store_id = StoreId(op.operator_id, partition, name)
        provider = worker.provider_for(
            spec.storage, store_id, spec.schema_histories[name], op.config
        )
        version, checkpoint_id = spec.base.get(name, {}).get(partition, (0, None))
        stores[name] = provider.get_store(version, checkpoint_id)
    batch = BatchContext(
        spec.query_id,
        spec.batch_id,
        spec.batch_time_ms,
        partition,
        None if spec.event_time is None else spec.event_time.watermarks.eviction_ms,
        None if spec.event_time is None else spec.event_time.watermarks.late_rows_ms,
        spec.time_zone,
        stores=stores,
    )
    max_event: int | None = None
    report = schema.field(REPORT_COLUMN)
    try:
        with batch_scope(batch):
            for piece in rows.pieces():
                piece, seen = prepare_rows(spec.event_time, piece, batch.event_time)
                if seen is not None:
                    max_event = seen if max_event is None else max(max_event, seen)
                output = op.update(stores[op.store_name], piece)
                del piece  # the update holds its input as long as it needs it
                for out in _output_batches(output, op.output_arrow_schema()):
                    yield out.append_column(report, pa.nulls(out.num_rows, pa.string()))
                del output
                worker.release_unused()  # what the update freed, before the commit's peak
            infos = [store.commit() for store in stores.values()]
    except BaseException:
        for store in stores.values():
            if not store.has_committed:
                store.abort()
        raise
    task_ms = (time.perf_counter() - started) * 1000
    activity = LOCAL_DISK.activity_since(disk_at_start)
    written = spilled_before + LOCAL_DISK.snapshot().bytes_written - disk_at_start.bytes_written
    reports = []
    for i, (store, info) in enumerate(zip(stores.values(), infos, strict=True)):
        load = store.metrics.load
        disk = store.metrics.disk
        reports.append(
            TaskReport(
                run=spec.run,
                info=info,
                rows_in=rows.num_rows if i == 0 else 0,
                keys_updated=store.metrics.updated_keys + store.metrics.removed_keys,
                load_source=load.source.value,
                deltas_applied=load.deltas_applied,
                load_ms=load.load_ms,
                task_ms=task_ms,
                attempt=context.attemptNumber() if context is not None else 0,
                worker=me,
                repairs=list(load.repairs),
                **event_time_report(
                    batch.event_time if i == 0 else EventTimeStats(), max_event if i == 0 else None
                ),
                resident_bytes=disk.resident_bytes,
                local_disk_bytes=disk.local_disk_bytes,
                block_cache_hits=activity.block_cache_hits if i == 0 else 0,
                block_cache_misses=activity.block_cache_misses if i == 0 else 0,
                compaction_bytes=activity.compaction_bytes if i == 0 else 0,
                local_bytes_written=written if i == 0 else 0,
            )
        )
    return reports


def base_refs(
    committed: dict[StoreId, CheckpointRef], operator: StatefulOperator
) -> dict[str, dict[int, tuple[int, str | None]]]:
    """Each of the operator's stores' starting checkpoint per partition, by store name: the
    committed one (a partition missing starts at version 0)."""
    base: dict[str, dict[int, tuple[int, str | None]]] = {s.name: {} for s in operator.stores}
    for store, ref in committed.items():
        if store.operator_id == operator.operator_id and store.store_name in base:
            base[store.store_name][store.partition_id] = (ref.version, ref.checkpoint_id)
    return base


def with_skipped(
    committed: dict[StoreId, CheckpointRef],
    stores: Iterable[tuple[StatefulOperator, ExtraStore]],
    before: Callable[[], dict[StoreId, CheckpointRef]],
) -> dict[StoreId, CheckpointRef]:
    """``committed`` (the previous batch's ids) plus, for each of the query's further
    ``stores`` (never an operator's main one) that the previous batch did not open (a
    ``transform_with_state`` variable deleted or declared again after runs without it), its
    newest commit ``before`` this batch: its next version follows its last one, not version
    1, and a replay of this batch builds on what came before it, not on its own commit.
    ``before`` is read only then."""
    wanted = {(op.operator_id, x.name) for op, x in stores if x.name != op.store_name}
    skipped = wanted - {(s.operator_id, s.store_name) for s in committed}
    if not committed or not skipped:
        return committed
    found = {s: r for s, r in before().items() if (s.operator_id, s.store_name) in skipped}
    return {**committed, **found}
