"""The changes an operator's state went through between two batches, as Spark 4's state data
source reads them with ``readChangeFeed``: one row per key each batch put or removed, read from
the delta files the catalog recorded for those batches (never by diffing whole versions)."""

from __future__ import annotations

from functools import partial

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from state_runtime.catalog import Catalog, CommittedDelta
from state_runtime.catalog import catalog_url as default_catalog_url
from state_runtime.errors import ChangesCleanedUp, InvalidArgument
from state_runtime.retention import LIVE_STATES
from state_runtime.runtime.reader import store_history, store_of
from state_runtime.runtime.spark_kind import default_parallelism
from state_runtime.runtime.state_reads import read_deltas
from state_runtime.storage import Storage, open_storage
from state_runtime.store.schema_history import SchemaHistory

_SOURCES = StructType(
    [
        StructField("batch_id", LongType(), False),
        StructField("partition_id", IntegerType(), False),
        StructField("version", LongType(), False),
        StructField("checkpoint_id", StringType(), False),
    ]
)


def _check(deltas: list[CommittedDelta], start: int, end: int, operator_id: int) -> None:
    gone = [d for d in deltas if d.state is not None and d.state not in LIVE_STATES]
    if gone:
        first = gone[0]
        raise ChangesCleanedUp(
            f"the changes of batch {first.batch_id} of operator {operator_id} are no longer "
            f"available: maintenance cleaned up its delta ({len(gone)} delta files of batches "
            f"{start}..{end} gone); read from a later batch",
            store=first.store,
            version=first.ref.version,
            checkpoint_id=first.ref.checkpoint_id,
            path=first.path,
        )
    missing = sorted(set(range(start, end + 1)) - {d.batch_id for d in deltas})
    if missing:
        raise InvalidArgument(
            f"batches {missing} of operator {operator_id} are not committed in the catalog"
        )


def changes_plan(
    storage: Storage,
    operator_id: int,
    start_batch_id: int,
    end_batch_id: int,
    *,
    store_name: str,
    query_id: str | None,
    catalog_url: str | None,
) -> tuple[SchemaHistory, list[tuple[int, int, int, str | None]], StructType]:
    """What reading the change feed needs (read on the driver): the store's schema history,
    every committed delta of the range as ``(batch, partition, version, checkpoint id)`` and
    the rows' schema."""
    if end_batch_id < start_batch_id:
        raise InvalidArgument(f"end batch {end_batch_id} is before start batch {start_batch_id}")
    root = storage.uri
    with Catalog.open(catalog_url or default_catalog_url()) as catalog:
        history = store_history(catalog, root, operator_id, store_name)
        deltas = catalog.committed_deltas(
            root, operator_id, store_name, start_batch_id, end_batch_id, query_id=query_id
        )
        _check(deltas, start_batch_id, end_batch_id, operator_id)
    schema = history.newest.schema
    rows = [
        (d.batch_id, d.store.partition_id, d.ref.version, d.ref.checkpoint_id)
        for d in deltas
        if d.path is not None  # a batch that changed nothing in a store has no changes to read
    ]
    out = StructType(
        [
            StructField("batch_id", LongType(), False),
            StructField("change_type", StringType(), False),
            StructField("key", schema.key, True),
            StructField("value", schema.value, True),
            StructField("partition_id", IntegerType(), False),
        ]
    )
    return history, rows, out


def read_state_changes(
    spark: SparkSession,
    checkpoint_root: str | Storage,
    operator_id: int,
    start_batch_id: int,
    end_batch_id: int,
    *,
    store_name: str = "default",
    query_id: str | None = None,
    catalog_url: str | None = None,
    state_variable: str | None = None,
    timers: bool = False,
) -> DataFrame:
    """Every change batches ``start_batch_id..end_batch_id`` (inclusive) made to an
    operator's state: ``batch_id``, ``change_type`` ('update' or 'delete'), ``key``,
    ``value`` (null for a delete) and ``partition_id``. For a ``transform_with_state``
    operator, ``state_variable="name"`` reads one state variable's changes and
    ``timers=True`` its timers' (as :func:`read_state`).

    Raises ChangesCleanedUp when maintenance has deleted a requested batch's deltas, and
    InvalidArgument when the operator has no such store (naming its stores) or a batch in
    the range is not committed.
    """
    store_name = store_of(store_name, state_variable, timers)
    storage = (
        checkpoint_root if isinstance(checkpoint_root, Storage) else open_storage(checkpoint_root)
    )
    history, rows, out = changes_plan(
        storage,
        operator_id,
        start_batch_id,
        end_batch_id,
        store_name=store_name,
        query_id=query_id,
        catalog_url=catalog_url,
    )
    return (
        spark.createDataFrame(rows, _SOURCES)
        .repartition(min(len(rows), default_parallelism(spark)))
        .mapInArrow(partial(read_deltas, storage, operator_id, store_name, history), out)
    )
