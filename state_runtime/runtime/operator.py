"""The description of one stateful operator: what the driver ships to every task."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeAlias

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructField, StructType

from state_runtime.errors import InvalidArgument
from state_runtime.identity import DEFAULT_STORE_NAME, validate_name, validate_non_negative
from state_runtime.store.config import StoreConfig
from state_runtime.store.schema_evolution import SchemaChange
from state_runtime.store.schema_history import SchemaHistory
from state_runtime.store.state_schema import StateSchema, parse_schema
from state_runtime.store.state_store import StateStore

UpdateOutput: TypeAlias = "pa.Table | Iterable[pa.Table | pa.RecordBatch | tuple[Any, ...]] | None"
UpdateFunction = Callable[[StateStore, pa.Table], UpdateOutput]
"""``update(store, rows)``: apply one partition's rows of a batch to its store, return output.

``rows`` is an Arrow table of the partition's input rows. The output is an Arrow table, or an
iterable (a generator, typically) of tables, record batches and tuples matching the
operator's output schema, or None for no output. The task consumes an iterable as it goes,
handing each table (and each group of tuples) to Spark before asking for the next, and
commits once it is exhausted: an update that yields its output chunk by chunk holds one
chunk of it, not the whole. Whoever calls an update function outside a task consumes its
output before the commit.
"""

ColumnKind = Literal["timestamp", "numeric", "orderable", "string"]


@dataclass(frozen=True)
class ColumnUse:
    """An input column an operator reads beyond its keys, for the driver's query check:
    ``ColumnUse("amount", "aggregate 'total' (sum)", "numeric")``."""

    column: str
    role: str
    kind: ColumnKind

    @classmethod
    def event_time(cls, column: str | None) -> tuple[ColumnUse, ...]:
        """The optional ``event_time_column`` argument's use (none when not given)."""
        return () if column is None else (cls(column, "event_time_column", "timestamp"),)


@dataclass(frozen=True)
class ExtraStore:
    """A further store of an operator, beside its main one (``store_name``): each of a
    ``transform_with_state`` processor's state variables is one, with its own schemas and
    schema history, opened, committed and recorded like the main store."""

    name: str
    key_schema: str | StructType
    value_schema: str | StructType
    schema_change: SchemaChange = field(default_factory=SchemaChange)
    label: str | None = None
    """What the store holds, for errors (``value state variable 'count'``); else its name."""
    drops_missing: bool = False
    """A value field of the recorded schema that this one lacks is dropped, undeclared (a
    ``transform_with_state`` variable: Spark's Avro schema evolution reads older values
    without the fields its new schema lacks)."""
    deleted: bool = False
    """A store the operator no longer declares but deletes (a ``transform_with_state``
    variable given to ``deleteIfExists``): its schemas here are placeholders; the query opens
    it with the schema the catalog recorded (:meth:`resolved`), so that the update function
    can empty it, or leaves it out when the catalog has none (nothing to delete)."""

    @property
    def schema(self) -> StateSchema:
        return StateSchema.of(self.key_schema, self.value_schema)

    def change_from(self, recorded: StateSchema) -> SchemaChange:
        """The change declared from ``recorded`` to this store's schema: ``schema_change``,
        with ``drops_missing`` plus a drop of each value field no longer there."""
        change = self.schema_change
        if not self.drops_missing:
            return change
        kept = {*self.schema.value.names, *change.renamed, *change.dropped}
        gone = tuple(name for name in recorded.value.names if name not in kept)
        return replace(change, dropped=(*change.dropped, *gone)) if gone else change

    def resolved(self, recorded: SchemaHistory | None) -> ExtraStore | None:
        """This store as the query opens it: a deleted store with the catalog's newest
        schema (None when the catalog has no history of it), any other as it is."""
        if not self.deleted:
            return self
        if recorded is None:
            return None
        newest = recorded.newest.schema
        return replace(self, key_schema=newest.key, value_schema=newest.value)

    def describe(self, op: StatefulOperator) -> str:
        """The store in an error: ``operator 0 (store default)``, or its label."""
        if self.label is None:
            return f"operator {op.operator_id} (store {self.name})"
        return f"{op.name}, {self.label} (store {self.name})"


@dataclass(frozen=True)
class StatefulOperator:
    """One stateful operator: keys, schemas, the update function and the partition count.

    ``num_partitions`` is fixed for the life of a query: rows are routed to state partitions
    by Spark's Murmur3 hash of the key columns modulo this number, the same in every batch
    and every run.
    """

    operator_id: int
    key_columns: Sequence[str]
    key_schema: str | StructType
    value_schema: str | StructType
    output_schema: str | StructType
    update: UpdateFunction
    num_partitions: int
    store_name: str = DEFAULT_STORE_NAME
    config: StoreConfig = field(default_factory=StoreConfig)
    late_column: str | None = None
    """A timestamp column of the input: rows at or before the watermark are dropped before
    ``update`` (set by operators that use event time; windows judge lateness themselves)."""
    uses_event_time: bool = False
    """The update function reads the watermark (event-time windows or timeouts)."""
    late_on_watermark: bool = False
    """Without a ``late_column``, rows late on the query's watermark column are dropped
    before ``update`` wherever that column reaches the operator's input with the watermark
    (Spark's event-time timeouts and timers filter on their input's watermarked column)."""
    derived_key_fields: int = 0
    """Trailing key fields the update function derives from the rows (a window's start),
    beyond the key columns that route rows to partitions."""
    kind: str = "custom operator"
    """What the operator is, for error messages (``windowed aggregation``, ...)."""
    reads: tuple[ColumnUse, ...] = ()
    """Input columns read beyond the keys, checked on the driver before any job."""
    window_column: str | None = None
    """The event-time column of the operator's windows: in append mode it must be the
    watermark's, as Spark (nothing else can finalize a window)."""
    output_mode: Literal["update", "append"] = "update"
    passes_on: Literal["rows", "keys", "nothing"] = "nothing"
    """Which input columns the output carries on as they were (a deduplication its rows, an
    aggregation its key columns, a function's output nothing): as in Spark, the query's
    watermark still marks such a column for a later operator, and no other."""
    schema_change: SchemaChange = field(default_factory=SchemaChange)
    """Renames, drops and defaults that turn the state schema the catalog recorded last into
    this operator's (checked by the driver before the first batch; see
    :mod:`state_runtime.store.schema_evolution`). Ignored while the schema is unchanged."""
    extra_stores: tuple[ExtraStore, ...] = ()
    """Stores beside the main one, opened and committed with it in every task; the update
    function reaches them with ``current_batch().stores``."""
    key_local: bool = False
    """The update function may be called several times a batch on a partition, each call
    with every row of its keys (keys in index order, no key in two calls), and the calls
    equal one call with all rows: a task then takes a large input in pieces spilled to local
    disk (:mod:`state_runtime.runtime.partition_input`), not whole. Needs no derived key
    fields (the rows' key columns are the whole key)."""

    def __post_init__(self) -> None:
        validate_non_negative(self.operator_id, "operator id")
        validate_name(self.store_name, "store name")
        if not self.key_columns:
            raise InvalidArgument("a stateful operator needs at least one key column")
        if isinstance(self.num_partitions, bool) or not 1 <= self.num_partitions <= 100_000:
            raise InvalidArgument(f"num_partitions={self.num_partitions}: expected 1..100000")
        if len(self.key_columns) + self.derived_key_fields != len(self.schema.key.fields):
            raise InvalidArgument(
                f"key columns {list(self.key_columns)} do not match the key schema "
                f"<{self.schema.key.simpleString()}>"
            )
        if self.key_local and self.derived_key_fields:
            raise InvalidArgument("a key-local operator's key columns must be its whole key")
        names = [self.store_name, *(x.name for x in self.extra_stores)]
        for name in names:
            validate_name(name, "store name")
        if len(set(names)) != len(names):
            raise InvalidArgument(f"{self.name} has duplicate store names: {names}")
        object.__setattr__(self, "key_columns", tuple(self.key_columns))
        object.__setattr__(self, "output_schema", parse_schema(self.output_schema))

    @property
    def name(self) -> str:
        return f"{self.kind} (operator {self.operator_id})"

    @property
    def needs_watermark(self) -> bool:
        """Whether the query must define a watermark to run this operator."""
        return self.uses_event_time or self.late_column is not None

    @property
    def schema(self) -> StateSchema:
        return StateSchema.of(self.key_schema, self.value_schema)

    @property
    def stores(self) -> tuple[ExtraStore, ...]:
        """Every store of the operator, the main one first."""
        main = ExtraStore(self.store_name, self.key_schema, self.value_schema, self.schema_change)
        return (main, *self.extra_stores)

    def opened(self, recorded: Mapping[tuple[int, str], SchemaHistory]) -> StatefulOperator:
        """The operator as a query opens its stores: each deleted store resolved against the
        catalog's schema histories ``recorded`` (:meth:`ExtraStore.resolved`)."""
        if not any(x.deleted for x in self.extra_stores):
            return self
        stores = (x.resolved(recorded.get((self.operator_id, x.name))) for x in self.extra_stores)
        return replace(self, extra_stores=tuple(x for x in stores if x is not None))

    @property
    def output_struct(self) -> StructType:
        out = self.output_schema
        assert isinstance(out, StructType)
        return out

    def output_arrow_schema(self) -> pa.Schema:
        """The output as the tasks emit it (every column nullable, as Spark reads it)."""
        return to_arrow_schema(self.output_nullable(), timezone="UTC")

    def output_nullable(self) -> StructType:
        fields = self.output_struct.fields
        return StructType([StructField(f.name, f.dataType, True) for f in fields])
