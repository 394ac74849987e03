"""State as a Spark data source (pyspark's Python Data Source API), read like Spark's own
``statestore`` and ``state-metadata`` sources, on a classic or a Spark Connect session::

    register_state_sources(spark)
    spark.read.format("state_runtime").option("operatorId", 0).load(root)          # latest
    spark.read.format("state_runtime").options(batchId=4, queryId="q").load(root)  # at a batch
    spark.read.format("state_runtime").options(readChangeFeed=True, changeStartBatchId=2,
                                               changeEndBatchId=5).load(root)     # changes
    spark.read.format("state_runtime_metadata").load(root)                         # the stores
    spark.sql("SELECT * FROM state_runtime.`/path/to/root`")  # needs a path, as for files

Options (Spark's names): ``path`` (the checkpoint root: a path or URI), ``operatorId``
(default 0), ``storeName`` (default ``default``), ``batchId`` (with ``queryId``: the state
that batch committed), ``version``, ``readChangeFeed`` with ``changeStartBatchId`` and
``changeEndBatchId`` (inclusive), ``queryId`` and ``catalogUrl`` (default
``$STATE_CATALOG_URL``). On a ``transform_with_state`` operator ``stateVarName`` reads one
state variable and ``readRegisteredTimers=true`` its pending timers (each a store of the
operator, state or change feed, as ``read_state(state_variable=, timers=)``); each of
``storeName``, ``stateVarName`` and ``readRegisteredTimers`` picks the store, so at most one.
The format's name differs from Spark's ``statestore`` so both can be used.
The source's ``schema`` and ``partitions`` run where Spark plans Python data sources (a Python
worker of the driver, or of the Connect server), which must reach the catalog; the reads run
in the executors, which must reach the checkpoint root. The plans' modules (the catalog's
SQLAlchemy and Alembic) are imported where they run, so an executor unpickling a reader of
state imports the stores alone (``tests/test_import_graph.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from state_runtime.errors import InvalidArgument
from state_runtime.runtime.state_reads import load_changes, load_state
from state_runtime.storage import open_storage
from state_runtime.store.schema_history import SchemaHistory

STATE_FORMAT = "state_runtime"
METADATA_FORMAT = "state_runtime_metadata"


def _int(options: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    text = options.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise InvalidArgument(f"option {name}={text!r}: expected a whole number") from None


def _bool(options: Mapping[str, str], name: str) -> bool:
    text = options.get(name, "false").lower()
    if text not in ("true", "false"):
        raise InvalidArgument(f"option {name}={text!r}: expected true or false")
    return text == "true"


def _store(options: Mapping[str, str]) -> str:
    """The store the options pick: ``storeName``, or a ``transform_with_state`` operator's
    ``stateVarName`` or ``readRegisteredTimers`` (Spark's names), through ``store_of``."""
    timers = _bool(options, "readRegisteredTimers")
    given = [n for n in ("storeName", "stateVarName") if options.get(n) is not None]
    given += ["readRegisteredTimers"] * timers
    if len(given) > 1:
        raise InvalidArgument(f"options {' and '.join(given)}: each picks the store, give one")
    from state_runtime.runtime.reader import store_of

    return store_of(options.get("storeName", "default"), options.get("stateVarName"), timers)


def _root(options: Mapping[str, str]) -> str:
    root = options.get("path")
    if not root:
        raise InvalidArgument("the checkpoint root is required: .load(root) or option path")
    return root


@dataclass(frozen=True)
class _Part(InputPartition):
    """One partition's state at a checkpoint, or one batch's delta of one partition."""

    source: tuple[Any, ...]


class _StateReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        from state_runtime.runtime.changes import changes_plan
        from state_runtime.runtime.reader import state_plan

        self.storage = open_storage(_root(options))
        self.operator_id = _int(options, "operatorId", 0) or 0
        self.store_name = _store(options)
        self.changes = _bool(options, "readChangeFeed")
        query_id, url = options.get("queryId"), options.get("catalogUrl")
        self.history: SchemaHistory
        self.sources: Sequence[tuple[Any, ...]]
        if self.changes:
            start, end = _int(options, "changeStartBatchId"), _int(options, "changeEndBatchId")
            if start is None or end is None:
                raise InvalidArgument(
                    "readChangeFeed needs changeStartBatchId and changeEndBatchId"
                )
            self.history, self.sources, self.out = changes_plan(
                self.storage,
                self.operator_id,
                start,
                end,
                store_name=self.store_name,
                query_id=query_id,
                catalog_url=url,
            )
        else:
            self.history, self.sources, self.out = state_plan(
                self.storage,
                self.operator_id,
                self.store_name,
                batch_id=_int(options, "batchId"),
                query_id=query_id,
                version=_int(options, "version"),
                catalog_url=url,
            )

    def partitions(self) -> Sequence[InputPartition]:
        return [_Part(tuple(s)) for s in self.sources]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Part)
        load = load_changes if self.changes else load_state
        # Spark checks the batches' nullability flags against the declared schema.
        schema = to_arrow_schema(self.out, timezone="UTC")
        for batch in load(
            self.storage, self.operator_id, self.store_name, self.history, partition.source
        ):
            yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)


class StateDataSource(DataSource):
    """``spark.read.format("state_runtime")``: a store's state or its change feed."""

    @classmethod
    def name(cls) -> str:
        return STATE_FORMAT

    def schema(self) -> StructType:
        return _StateReader(self.options).out

    def reader(self, schema: StructType) -> DataSourceReader:
        return _StateReader(self.options)


class _MetadataReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.root = open_storage(_root(options)).uri
        self.url = options.get("catalogUrl")

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        from state_runtime.runtime.reader import metadata_rows

        yield from metadata_rows(self.root, self.url)


class StateMetadataDataSource(DataSource):
    """``spark.read.format("state_runtime_metadata")``: every store below a checkpoint root
    with its latest committed version (as ``read_state_metadata``)."""

    @classmethod
    def name(cls) -> str:
        return METADATA_FORMAT

    def schema(self) -> str:
        from state_runtime.runtime.reader import METADATA_SCHEMA

        return METADATA_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _MetadataReader(self.options)


def register_state_sources(spark: SparkSession) -> None:
    """Make ``state_runtime`` and ``state_runtime_metadata`` readable in this session."""
    spark.dataSource.register(StateDataSource)
    spark.dataSource.register(StateMetadataDataSource)
