"""The Spark side of a repartition: read an operator's stores, route every key to its new
partition, write one snapshot per new partition (DataFrames and ``mapInArrow``: classic and
Spark Connect alike).

Routing is the runtime's rule for new rows, computed by Spark itself: ``pmod(hash(key
columns), n)`` over the key's leading fields cast to the types the key columns had in the
query's input (recorded in the operator's layout when the query started), so that a key's new
rows land where its state now is. A window's start and any other field the operator derives
takes no part, as in the runtime. Every new partition gets a snapshot, empty ones included (one
heartbeat row per partition, as in the runtime's batches); checkpoint ids are fixed by the
driver per partition, so a retried or speculative task writes the same file (put-if-absent)
rather than a second one. Each task reads its snapshots back and verifies them before it
reports.

``write_partitions_locally`` does the same in this process, without Spark: the same reads, the
same writer and verification, with the keys routed by :mod:`~state_runtime.maintenance.spark_hash`
(Spark's hash in Python) for small stores, and the library-level simulation.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from state_runtime.errors import InvalidArgument
from state_runtime.identity import CheckpointRef, FileKind, StoreId
from state_runtime.maintenance.spark_hash import spark_partition
from state_runtime.runtime.spark_kind import default_parallelism
from state_runtime.runtime.state_reads import load_state
from state_runtime.storage import Storage
from state_runtime.store.checkpoint_info import CheckpointInfo
from state_runtime.store.config import StoreConfig
from state_runtime.store.file_verification import expected_of, verify_file
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.writer import CheckpointTarget, write_checkpoint

PARTITION = "__new_partition"
HEARTBEAT = "__heartbeat"
ROW_BYTES = "__row_bytes"

_SOURCES = StructType(
    [
        StructField("partition_id", IntegerType(), False),
        StructField("version", LongType(), False),
        StructField("checkpoint_id", StringType(), True),
    ]
)
_WRITTEN = pa.schema([("partition", pa.int32()), ("info", pa.string()), ("problem", pa.string())])


@dataclass(frozen=True)
class Rerouting:
    """One operator store's move: everything its tasks need, as plain picklable data."""

    storage: Storage
    operator_id: int
    store_name: str
    history: SchemaHistory
    sources: Mapping[int, CheckpointRef]
    routing: Sequence[Mapping[str, Any]]
    num_partitions: int
    version: int
    checkpoint_ids: Mapping[int, str]


@dataclass(frozen=True)
class Written:
    """What a task wrote for one new partition, and what verifying it found."""

    info: CheckpointInfo
    problem: str | None


def routed(spark: SparkSession, move: Rerouting, tasks: int | None = None) -> DataFrame:
    """Every row of the operator store's old partitions with its new partition
    (:data:`PARTITION`), its ``key`` and ``value`` structs and its size in Arrow
    (:data:`ROW_BYTES`)."""
    schema = move.history.newest.schema
    out = StructType(
        [
            StructField("partition_id", IntegerType(), False),
            StructField("key", schema.key, True),
            StructField("value", schema.value, True),
            StructField(ROW_BYTES, LongType(), False),
        ]
    )
    rows = [(p, ref.version, ref.checkpoint_id) for p, ref in sorted(move.sources.items())]
    count = max(1, min(len(rows), tasks or default_parallelism(spark)))
    read = (
        spark.createDataFrame(rows, _SOURCES)
        .repartition(count)
        .mapInArrow(partial(_read, move), out)
    )
    return read.select(_route(move, schema.key).alias(PARTITION), "key", "value", ROW_BYTES)


def _route(move: Rerouting, key: StructType) -> Column:
    """The runtime's rule (``query._routed``) on the key's leading fields."""
    columns = [
        F.col("key").getField(field.name).cast(str(spec["type"]))
        for field, spec in zip(key.fields, move.routing, strict=False)
    ]
    return F.pmod(F.hash(*columns), F.lit(move.num_partitions))


def _read(move: Rerouting, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for ref in zip(*batch.to_pydict().values(), strict=True):
            for part in load_state(
                move.storage, move.operator_id, move.store_name, move.history, ref
            ):
                yield part.append_column(ROW_BYTES, _row_bytes(part))


def _row_bytes(batch: pa.RecordBatch) -> pa.Array:
    """Each row's size in Arrow: fixed widths, plus the length of strings and binaries."""
    total = pa.array([0] * batch.num_rows, type=pa.int64())
    for column in (batch.column("key"), batch.column("value")):
        for leaf in _leaves(column):
            if _is_text(leaf.type):
                size = pc.fill_null(pc.binary_length(leaf), 0).cast(pa.int64())
            else:
                width = max(1, leaf.type.bit_width // 8)
                size = pa.array([width] * len(leaf), type=pa.int64())
            total = pc.add(total, size)
    return total


def _is_text(t: pa.DataType) -> bool:
    return any(
        check(t) for check in (pa.types.is_string, pa.types.is_binary, pa.types.is_large_string)
    ) or pa.types.is_large_binary(t)


def _leaves(array: pa.Array) -> list[pa.Array]:
    """The leaf columns of a struct; a list or map counted by its text (rare in state)."""
    if pa.types.is_struct(array.type):
        return [leaf for child in array.flatten() for leaf in _leaves(child)]
    if _is_text(array.type):
        return [array]
    try:
        array.type.bit_width  # noqa: B018 - raises for nested types
    except ValueError:
        text = [None if v is None else str(v) for v in array.to_pylist()]
        return [pa.array(text, type=pa.string())]
    return [array]


def figures(frame: DataFrame) -> dict[int, tuple[int, int]]:
    """Rows and bytes per new partition (a dry run's figures)."""
    rows = frame.groupBy(PARTITION).agg(F.count("*"), F.sum(ROW_BYTES)).collect()
    return {int(r[0]): (int(r[1]), int(r[2] or 0)) for r in rows}


def write_partitions(
    spark: SparkSession, move: Rerouting, tasks: int | None = None
) -> dict[int, Written]:
    """Route the store's rows and write one verified snapshot per new partition."""
    frame = routed(spark, move, tasks)
    count = max(1, min(move.num_partitions, tasks or default_parallelism(spark)))
    beats = spark.range(0, move.num_partitions, 1, 1).selectExpr(
        f"CAST(id AS INT) AS {PARTITION}", f"true AS {HEARTBEAT}"
    )
    data = frame.select(PARTITION, "key", "value", F.lit(False).alias(HEARTBEAT))
    shuffled = data.unionByName(beats, allowMissingColumns=True).repartitionById(count, PARTITION)
    out = StructType(
        [
            StructField("partition", IntegerType(), False),
            StructField("info", StringType(), False),
            StructField("problem", StringType(), True),
        ]
    )
    reports = shuffled.mapInArrow(partial(_write, move), out).collect()
    return _written(row.asDict() for row in reports)


def _written(reports: Iterable[Mapping[str, Any]]) -> dict[int, Written]:
    written: dict[int, Written] = {}
    for row in reports:
        info = CheckpointInfo.from_dict(json.loads(row["info"]))
        written.setdefault(int(row["partition"]), Written(info, row["problem"]))
    return written


_ROUTING_TYPES = {
    "string": pa.string(),
    "binary": pa.binary(),
    "boolean": pa.bool_(),
    "tinyint": pa.int8(),
    "smallint": pa.int16(),
    "int": pa.int32(),
    "bigint": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp_ntz": pa.timestamp("us"),
}
"""The routing types :mod:`~state_runtime.maintenance.spark_hash` hashes as Spark does, as
Arrow types (a key field is cast to its column's type in the query's input, as in Spark)."""


def write_partitions_locally(move: Rerouting) -> dict[int, Written]:
    """:func:`write_partitions` in this process, without Spark: every old partition's rows
    routed by Spark's hash in Python, one verified snapshot per new partition (empty ones
    too). Raises InvalidArgument for a routing type it does not hash (Spark's job does)."""
    schema = move.history.newest.schema
    keys, values, routes = [], [], []
    for partition, ref in sorted(move.sources.items()):
        reference = (partition, ref.version, ref.checkpoint_id)
        for part in load_state(
            move.storage, move.operator_id, move.store_name, move.history, reference
        ):
            key = part.column("key").cast(schema.key_arrow)
            keys.append(key)
            values.append(part.column("value").cast(schema.value_arrow))
            routes.append(spark_partition(_routing_columns(move, key), move.num_partitions))
    beats = list(range(move.num_partitions))
    data = pa.table(
        {
            PARTITION: pa.array([*(p for r in routes for p in r.tolist()), *beats], pa.int32()),
            "key": pa.concat_arrays([*keys, pa.nulls(len(beats), schema.key_arrow)]),
            "value": pa.concat_arrays([*values, pa.nulls(len(beats), schema.value_arrow)]),
            HEARTBEAT: [False] * sum(len(k) for k in keys) + [True] * len(beats),
        }
    )
    return _written(
        row for batch in _write(move, iter(data.to_batches())) for row in batch.to_pylist()
    )


def _routing_columns(move: Rerouting, key: pa.StructArray) -> list[pa.Array]:
    """The key's leading fields cast to the routing's types (``_route``, in Arrow)."""
    columns = []
    for index, spec in enumerate(move.routing):
        wanted = _ROUTING_TYPES.get(str(spec["type"]))
        if wanted is None:
            raise InvalidArgument(
                f"operator {move.operator_id} (store {move.store_name}) routes by "
                f"{spec['column']} of type {spec['type']}, which only Spark's own hash routes: "
                "repartition it with a Spark session"
            )
        columns.append(key.field(index).cast(wanted))
    return columns


def _write(move: Rerouting, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    received = list(batches)
    if not received:
        return
    table = pa.Table.from_batches(received)
    route = table.column(PARTITION)
    data = table.filter(pc.invert(pc.fill_null(table.column(HEARTBEAT), False)))
    schema = move.history.newest.schema
    reports = []
    for partition in sorted(pc.unique(route).to_pylist()):
        mine = data.filter(pc.equal(data.column(PARTITION), partition))
        keys = _struct(mine.column("key"), schema.key_arrow)
        values = _struct(mine.column("value"), schema.value_arrow)
        store = StoreId(move.operator_id, int(partition), move.store_name)
        target = CheckpointTarget(move.storage, store, move.history, StoreConfig())
        ref = CheckpointRef(move.version, move.checkpoint_ids[int(partition)])
        info = write_checkpoint(
            target,
            FileKind.SNAPSHOT,
            ref,
            (),
            keys,
            values,
            len(keys),
            in_key_order=False,
            exists_ok=True,
        )
        info = dataclasses.replace(info, bytes_written=move.storage.size(info.path))
        problem, _ = verify_file(move.storage, expected_of(info))
        reports.append(
            {"partition": int(partition), "info": json.dumps(info.to_dict()), "problem": problem}
        )
    yield pa.RecordBatch.from_pylist(reports, schema=_WRITTEN)


def _struct(column: pa.ChunkedArray, type_: pa.StructType) -> pa.StructArray:
    combined = column.combine_chunks() if column.num_chunks else pa.array([], type=type_)
    if not isinstance(combined, pa.StructArray):
        combined = pa.array([], type=type_)
    return combined.cast(type_)
