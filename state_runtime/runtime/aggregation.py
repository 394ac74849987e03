"""Running aggregations by key: count, sum, min and max over all batches so far."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql.types import StructType

from state_runtime.config import StoreConfig
from state_runtime.errors import InvalidArgument
from state_runtime.identity import DEFAULT_STORE_NAME
from state_runtime.runtime.operator import StatefulOperator
from state_runtime.schema import parse_schema
from state_runtime.store import StateStore

AggFunction = Literal["count", "sum", "min", "max"]
_ARROW_AGG = {"count": "count_all", "sum": "sum", "min": "min", "max": "max"}


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


def _combine(function: AggFunction, old: Any, new: Any) -> Any:
    if old is None:
        return new
    if new is None:
        return old
    if function in ("count", "sum"):
        return old + new
    return min(old, new) if function == "min" else max(old, new)


@dataclass(frozen=True)
class _RunningAggregate:
    """The update function: aggregate the batch with Arrow, then merge into the state."""

    key_columns: tuple[str, ...]
    aggs: tuple[Agg, ...]

    def __call__(self, store: StateStore, rows: pa.Table) -> Iterator[tuple[Any, ...]]:
        if rows.num_rows == 0:
            return
        specs: list[tuple[Any, str]] = [
            ([], "count_all") if a.function == "count" else (a.column, _ARROW_AGG[a.function])
            for a in self.aggs
        ]
        grouped = rows.group_by(list(self.key_columns), use_threads=False).aggregate(specs)
        key_cols = [grouped.column(c).to_pylist() for c in self.key_columns]
        # The aggregate columns, in the order asked, are the ones that are not keys.
        agg_names = [c for c in grouped.column_names if c not in self.key_columns]
        agg_cols = [grouped.column(c).to_pylist() for c in agg_names]
        functions = [a.function for a in self.aggs]
        for key, new in zip(zip(*key_cols, strict=True), zip(*agg_cols, strict=True), strict=True):
            old = store.get(key)
            value = (
                new
                if old is None
                else tuple(_combine(f, o, n) for f, o, n in zip(functions, old, new, strict=True))
            )
            store.put(key, value)
            yield (*key, *value)


def running_aggregation(
    operator_id: int,
    key_columns: Sequence[str],
    key_schema: str,
    aggs: Sequence[Agg],
    num_partitions: int,
    *,
    store_name: str = DEFAULT_STORE_NAME,
    config: StoreConfig | None = None,
) -> StatefulOperator:
    """An operator keeping ``aggs`` per key; each batch outputs the updated keys' totals
    (Spark's "update" output mode), with columns ``key columns + aggregate names``."""
    if not aggs:
        raise InvalidArgument("running_aggregation needs at least one aggregate")
    key_struct = parse_schema(key_schema)
    value_struct = parse_schema(", ".join(f"{a.name} {a.type}" for a in aggs))
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
    )
