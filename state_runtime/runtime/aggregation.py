"""Running aggregations by key: count, sum, min and max over all batches so far."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType

from state_runtime.errors import InvalidArgument
from state_runtime.identity import DEFAULT_STORE_NAME
from state_runtime.runtime.operator import ColumnKind, ColumnUse, StatefulOperator
from state_runtime.store.config import StoreConfig
from state_runtime.store.disk_runs import LOCAL_DISK
from state_runtime.store.schema_evolution import SchemaChange
from state_runtime.store.state_schema import StateSchema, parse_schema
from state_runtime.store.state_store import StateStore

AggFunction = Literal["count", "sum", "min", "max"]
_ARROW_AGG = {"count": "count_all", "sum": "sum", "min": "min", "max": "max"}
_KIND: dict[str, ColumnKind] = {"sum": "numeric", "min": "orderable", "max": "orderable"}
CHUNK_ROWS = 1 << 17
"""Input rows one step of a batch aggregates, looks up and applies at most: a larger batch is
taken in chunks of whole keys, so the worker's transient memory (hash table, lookup, sorted
change run) follows the chunk, not the batch (docs/state-on-disk.md)."""
MIN_CHUNK_ROWS = 1 << 13
"""Input rows of a chunk at least, whatever the budget (a step's fixed costs stay small)."""
CHUNK_SHARE = 2
"""A chunk's input rows, at the larger of the store's row width and the batch's own bytes a
row, fill at most 1/CHUNK_SHARE of the spill threshold: each step's copies (input taken in key
order, groups, lookup, change run, output) are then a small multiple of the threshold, not of
:data:`CHUNK_ROWS`. The change run also holds an 8-byte index column a row, so at 16-byte rows
it is about 0.75 of the threshold, and two chunks' runs spill together (docs/state-on-disk.md,
"Issue 37, the first batch in smaller chunks")."""


def chunk_rows(schema: StateSchema, rows: pa.Table) -> int:
    """Input rows a step takes of ``rows`` in a store of ``schema``: :data:`CHUNK_ROWS` in
    memory mode (a large budget), fewer under a small one (see :data:`CHUNK_SHARE`). A row is
    weighed by the batch's real bytes a row when wider than ``schema.row_bytes``, which counts
    a string, binary, list or map field as 8 bytes whatever it holds."""
    width = max(schema.row_bytes, -(-int(rows.nbytes) // max(1, int(rows.num_rows))))
    fitting = LOCAL_DISK.threshold() // (CHUNK_SHARE * width)
    return min(CHUNK_ROWS, max(MIN_CHUNK_ROWS, fitting))


@dataclass(frozen=True)
class Agg:
    """One aggregate: ``Agg("n", "count")``, ``Agg("total", "sum", "amount", "bigint")``."""

    name: str
    function: AggFunction
    column: str | None = None
    type: str = "bigint"

    def __post_init__(self) -> None:
        if self.function not in _ARROW_AGG:
            raise InvalidArgument(f"unknown aggregate {self.function!r}: count, sum, min or max")
        if self.function != "count" and self.column is None:
            raise InvalidArgument(f"aggregate {self.name!r} ({self.function}) needs a column")


def _combine(function: AggFunction, old: pa.Array, new: pa.Array) -> pa.Array:
    """Running value of one aggregate per key: ``old`` (null for a new key) with ``new``."""
    if function in ("count", "sum"):
        return pc.coalesce(pc.add_checked(old, new), new, old)
    element_wise = pc.min_element_wise if function == "min" else pc.max_element_wise
    return element_wise(old, new, skip_nulls=True)


@dataclass(frozen=True)
class _RunningAggregate:
    """The update function: aggregate the batch with Arrow, then merge into the state in bulk
    (one lookup of the keys, vectorised combine, one ``apply_arrow``), in chunks of at most
    :data:`CHUNK_ROWS` rows holding whole keys (a large batch's output is then in key order)."""

    key_columns: tuple[str, ...]
    aggs: tuple[Agg, ...]

    def __call__(self, store: StateStore, rows: pa.Table) -> pa.Table | Iterator[pa.Table] | None:
        if rows.num_rows == 0:
            return None
        size = chunk_rows(store.schema, rows)
        if rows.num_rows <= size:
            return self._apply(store, rows)
        return self._chunks(store, rows, size)

    def _chunks(self, store: StateStore, rows: pa.Table, size: int) -> Iterator[pa.Table]:
        """A large batch chunk by chunk, each chunk's output yielded once it is applied: the
        task hands it to Spark before the next, so the output is held a chunk at a time."""
        keys = rows.select(list(self.key_columns))
        order = pc.sort_indices(keys, [(c, "ascending") for c in self.key_columns])
        for start, stop in _key_chunks(keys, order, size):
            yield self._apply(store, rows.take(order.slice(start, stop - start)))

    def _apply(self, store: StateStore, rows: pa.Table) -> pa.Table:
        """Aggregate ``rows`` (every row of each of their keys) into the state."""
        specs: list[tuple[Any, str]] = [
            ([], "count_all") if a.function == "count" else (a.column, _ARROW_AGG[a.function])
            for a in self.aggs
        ]
        grouped = rows.group_by(list(self.key_columns), use_threads=False).aggregate(specs)
        schema = store.schema
        key_type, value_type = schema.key_arrow, schema.value_arrow
        keys = pa.StructArray.from_arrays(
            [
                grouped.column(c).combine_chunks().cast(key_type.field(i).type)
                for i, c in enumerate(self.key_columns)
            ],
            fields=list(key_type),
        )
        old = store.lookup(keys).flatten()
        # The aggregate columns, in the order asked, are the ones that are not keys.
        agg_names = [c for c in grouped.column_names if c not in self.key_columns]
        totals = [
            _combine(a.function, old[i], grouped.column(name).combine_chunks().cast(old[i].type))
            for i, (a, name) in enumerate(zip(self.aggs, agg_names, strict=True))
        ]
        values = pa.StructArray.from_arrays(totals, fields=list(value_type))
        store.apply_arrow(pa.table({"key": keys, "value": values}))
        return pa.Table.from_arrays(
            [*keys.flatten(), *totals], names=[*key_type.names, *value_type.names]
        )


def whole_output(output: pa.Table | Iterator[pa.Table] | None) -> pa.Table | None:
    """An aggregation's output in one table (its chunks consumed: the update applied)."""
    if output is None or isinstance(output, pa.Table):
        return output
    return pa.concat_tables(list(output))


def _key_chunks(keys: pa.Table, order: pa.Array, size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges of ``order`` (``keys``' rows in key order) of about ``size``
    rows each, every range ending where the key changes."""
    ranges, start, n = [], 0, len(order)
    while start < n:
        stop = min(start + size, n)
        if stop < n:
            stop = _key_end(keys, order, stop - 1)
        ranges.append((start, stop))
        start = stop
    return ranges


def _key_end(keys: pa.Table, order: pa.Array, i: int) -> int:
    """The first position after ``i`` in key order holding another key (galloping, then
    bisecting: the rows of one key are contiguous)."""
    key, n = _key_at(keys, order, i), len(order)
    low, step = i, 1  # the key is at low; is it at low + step?
    while low + step < n and _same_key(key, _key_at(keys, order, low + step)):
        low, step = low + step, 2 * step
    high = min(low + step, n)  # another key at high (or the end)
    while high - low > 1:
        middle = (low + high) // 2
        if _same_key(key, _key_at(keys, order, middle)):
            low = middle
        else:
            high = middle
    return high


def _key_at(keys: pa.Table, order: pa.Array, i: int) -> tuple[Any, ...]:
    """The key of the ``i``-th row in key order, as Python values."""
    row = keys.take(order.slice(i, 1))
    return tuple(row.column(c)[0].as_py() for c in range(row.num_columns))


def _same_key(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Whether two keys group together (NaN with NaN, as Arrow groups them)."""
    return all(x == y or (x != x and y != y) for x, y in zip(a, b, strict=True))


def aggregate_schema(aggs: Sequence[Agg]) -> StructType:
    """The aggregates as fields, in order (``name type``)."""
    return parse_schema(", ".join(f"{a.name} {a.type}" for a in aggs))


def aggregate_reads(aggs: Sequence[Agg]) -> tuple[ColumnUse, ...]:
    """The input columns the aggregates read, for the driver's query check."""
    return tuple(
        ColumnUse(a.column, f"aggregate {a.name!r} ({a.function}) column", _KIND[a.function])
        for a in aggs
        if a.function != "count" and a.column is not None
    )


def running_aggregation(
    operator_id: int,
    key_columns: Sequence[str],
    key_schema: str | StructType,
    aggs: Sequence[Agg],
    num_partitions: int,
    *,
    store_name: str = DEFAULT_STORE_NAME,
    config: StoreConfig | None = None,
    schema_change: SchemaChange | None = None,
) -> StatefulOperator:
    """An operator keeping ``aggs`` per key; each batch outputs the updated keys' totals
    (Spark's "update" output mode), with columns ``key columns + aggregate names``.

    The state's value schema is the aggregates, in order (``name type``): an added aggregate
    is a nullable field (keys start it from their next update); a renamed one, or a dropped
    one, is declared in ``schema_change`` (``SchemaChange(renamed={"total": "amount"})``)."""
    if not aggs:
        raise InvalidArgument("running_aggregation needs at least one aggregate")
    key_struct = parse_schema(key_schema)
    value_struct = aggregate_schema(aggs)
    output = StructType([*key_struct.fields, *value_struct.fields])
    return StatefulOperator(
        operator_id=operator_id,
        key_columns=tuple(key_columns),
        key_schema=key_struct,
        value_schema=value_struct,
        output_schema=output,
        update=_RunningAggregate(tuple(key_columns), tuple(aggs)),
        num_partitions=num_partitions,
        store_name=store_name,
        config=config or StoreConfig(),
        kind="running aggregation",
        passes_on="keys",
        key_local=True,
        reads=aggregate_reads(aggs),
        schema_change=schema_change or SchemaChange(),
    )
