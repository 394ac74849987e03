"""Windowed running aggregation over event time: tumbling and sliding windows, as Spark's
``groupBy(keys, window(ts, size, slide)).agg(...)`` with a watermark.

Window assignment is Spark's: a row at time ``t`` belongs to every window
``[start, start + size)`` with ``start = offset + k * slide`` (k an integer) and
``start <= t < start + size``. A window is closed once the watermark reaches its end
(``end <= watermark``): its late rows are dropped and its state is evicted, in one bulk removal
per partition. ``update`` mode emits every window the batch changed, with its new totals;
``append`` mode emits a window once, with its final totals, when it is evicted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructField, StructType, TimestampType

from state_runtime.errors import InvalidArgument
from state_runtime.identity import DEFAULT_STORE_NAME
from state_runtime.runtime.aggregation import Agg, running_aggregation, whole_output
from state_runtime.runtime.context import current_batch
from state_runtime.runtime.operator import ColumnUse, StatefulOperator
from state_runtime.runtime.times import MICROS_PER_MS, duration_micros, event_micros, null_times
from state_runtime.runtime.watermark import is_late
from state_runtime.store.config import StoreConfig
from state_runtime.store.schema_evolution import SchemaChange
from state_runtime.store.state_schema import parse_schema
from state_runtime.store.state_store import StateStore

OutputMode = Literal["update", "append"]
WINDOW_START = "window_start"
"""The key field holding a window's start (the state key is the group keys plus this)."""
WINDOW_COLUMN = "window"
"""The output column: ``struct<start: timestamp, end: timestamp>``, as Spark's ``window``."""


@dataclass(frozen=True)
class Window:
    """``Window(timedelta(minutes=10))`` tumbling; with ``slide`` sliding; ``offset`` shifts
    the window starts (Spark's ``startTime``)."""

    size: timedelta
    slide: timedelta | None = None
    offset: timedelta = timedelta(0)

    def __post_init__(self) -> None:
        if self.size <= timedelta(0):
            raise InvalidArgument(f"window size must be positive, got {self.size}")
        if self.slide is not None and not timedelta(0) < self.slide <= self.size:
            raise InvalidArgument(f"window slide must be in (0, size], got {self.slide}")
        if not timedelta(0) <= self.offset < self.slide_or_size:
            raise InvalidArgument(f"window offset must be in [0, slide), got {self.offset}")

    @property
    def slide_or_size(self) -> timedelta:
        return self.size if self.slide is None else self.slide

    def starts(self, micros: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For event times in microseconds: (row index, window start) of every window each
        row falls in, row by row. Rows with a null time (INT64 minimum) get none."""
        size, slide, offset = (
            duration_micros(self.size),
            duration_micros(self.slide_or_size),
            duration_micros(self.offset),
        )
        valid = np.flatnonzero(~null_times(micros))
        t = micros[valid]
        last = t - np.mod(t - offset, slide)  # the latest start at or before t
        overlapping = -(-size // slide)
        rows = np.repeat(valid, overlapping)
        starts = (last[:, None] - slide * np.arange(overlapping)[None, :]).reshape(-1)
        inside = np.repeat(t, overlapping) < starts + size
        return rows[inside], starts[inside]


@dataclass(frozen=True)
class _WindowedAggregate:
    """Assign windows, drop closed windows' rows, merge the rest with the running
    aggregation's bulk update, then evict the closed windows in one removal."""

    time_column: str
    window: Window
    mode: OutputMode
    merge: Callable[[StateStore, pa.Table], pa.Table | Iterator[pa.Table] | None]
    group_columns: tuple[str, ...]

    def __call__(self, store: StateStore, rows: pa.Table) -> pa.Table | None:
        if self.time_column not in rows.column_names:
            raise InvalidArgument(
                f"event-time column {self.time_column!r} is not in the input: {rows.column_names}"
            )
        batch = current_batch()
        size = duration_micros(self.window.size)
        indices, starts = self.window.starts(
            event_micros(rows.column(self.time_column), self.time_column)
        )
        if batch.late_rows_watermark_ms is not None:
            late = is_late(starts + size, batch.late_rows_watermark_ms)
            batch.event_time.late_rows += int(np.count_nonzero(late))
            indices, starts = indices[~late], starts[~late]
        expanded = rows.take(pa.array(indices)).append_column(
            WINDOW_START, pa.array(starts, type=pa.timestamp("us", tz="UTC"))
        )
        updated = whole_output(self.merge(store, expanded)) if expanded.num_rows else None
        evicted = self._evict(store, batch.watermark_ms)
        if self.mode == "update":
            return None if updated is None else self._output(updated)
        return self._output(evicted)

    def _evict(self, store: StateStore, watermark_ms: int | None) -> pa.Table | None:
        """Remove every window whose end is at or before the watermark, in one bulk removal;
        the removed windows as rows of key fields then value fields."""
        if watermark_ms is None:
            return None
        started = time.perf_counter()
        bound = watermark_ms * MICROS_PER_MS - duration_micros(self.window.size)
        evicted = store.remove_matching(
            lambda keys, _values: pc.less_equal(
                pc.struct_field(keys, WINDOW_START).cast(pa.int64()), bound
            )
        )
        stats = current_batch().event_time
        stats.evicted += evicted.num_rows
        stats.evict_ms += (time.perf_counter() - started) * 1000
        keys = evicted.column("key").combine_chunks()
        values = evicted.column("value").combine_chunks()
        return pa.Table.from_arrays(
            [*keys.flatten(), *values.flatten()],
            names=[*(f.name for f in keys.type), *(f.name for f in values.type)],
        )

    def _output(self, table: pa.Table | None) -> pa.Table | None:
        """Rows of key fields then value fields as output rows (``window`` struct in place
        of the window start)."""
        if table is None or not table.num_rows:
            return None
        n = len(self.group_columns)
        start = table.column(n).combine_chunks()
        end = pc.add(start.cast(pa.int64()), duration_micros(self.window.size)).cast(start.type)
        window = pa.StructArray.from_arrays([start, end], names=["start", "end"])
        return pa.Table.from_arrays(
            [*table.columns[:n], window, *table.columns[n + 1 :]],
            names=[*table.column_names[:n], WINDOW_COLUMN, *table.column_names[n + 1 :]],
        )


def windowed_aggregation(
    operator_id: int,
    key_columns: Sequence[str],
    key_schema: str,
    time_column: str,
    window: Window,
    aggs: Sequence[Agg],
    num_partitions: int,
    *,
    output_mode: OutputMode = "update",
    store_name: str = DEFAULT_STORE_NAME,
    config: StoreConfig | None = None,
    schema_change: SchemaChange | None = None,
) -> StatefulOperator:
    """``aggs`` per key and event-time window of ``time_column`` (a timestamp).

    Output columns: the key columns, ``window`` (struct of ``start`` and ``end``) and the
    aggregate names. Needs a query watermark (``StatefulQuery(..., watermark=...)``) on the
    same column. The state key is the key columns plus ``window_start``. ``schema_change``
    declares renamed or dropped aggregates, as for :func:`running_aggregation`.
    """
    if output_mode not in ("update", "append"):
        raise InvalidArgument(f"output_mode must be 'update' or 'append', got {output_mode!r}")
    key_struct = parse_schema(key_schema)
    if WINDOW_START in key_struct.names or WINDOW_COLUMN in key_struct.names:
        raise InvalidArgument(
            f"key column names {WINDOW_START!r} and {WINDOW_COLUMN!r} are reserved"
        )
    state_key = StructType([*key_struct.fields, StructField(WINDOW_START, TimestampType(), True)])
    groups = tuple(key_columns)
    merge = running_aggregation(operator_id, (*groups, WINDOW_START), state_key, aggs, 1)
    window_type = StructType(
        [StructField("start", TimestampType(), True), StructField("end", TimestampType(), True)]
    )
    value_struct = merge.schema.value
    output = StructType(
        [*key_struct.fields, StructField(WINDOW_COLUMN, window_type, True), *value_struct.fields]
    )
    return StatefulOperator(
        operator_id=operator_id,
        key_columns=groups,
        key_schema=state_key,
        value_schema=value_struct,
        output_schema=output,
        update=_WindowedAggregate(time_column, window, output_mode, merge.update, groups),
        num_partitions=num_partitions,
        store_name=store_name,
        config=config or StoreConfig(),
        uses_event_time=True,
        derived_key_fields=1,
        kind="windowed aggregation",
        passes_on="keys",
        reads=(ColumnUse(time_column, "window time column", "timestamp"), *merge.reads),
        window_column=time_column,
        output_mode=output_mode,
        schema_change=schema_change or SchemaChange(),
    )
